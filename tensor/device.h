// tensor/device.h — where a tensor lives: the CPU or one CUDA device (cuda:N).
#pragma once

#include <ostream>
#include <string>

namespace loom {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // the CUDA ordinal; always 0 on the CPU

  Device() = default;
  Device(DeviceType type, int index = 0) : type(type), index(index) {}  // NOLINT
  // "cpu", "cuda", "cuda:1"; anything else raises ValueError.
  explicit Device(const std::string& spec);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& other) const = default;
};

inline const Device kCPU{DeviceType::CPU, 0};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

}  // namespace loom
