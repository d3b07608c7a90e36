// tests/apps/checkpoint_updates.h — what an optimizer step did, read from the checkpoints of
// short app runs: the model's parameters of a checkpoint, the update between two checkpoints,
// and norms and relative differences of updates over all parameters together.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "loom.h"

namespace loom::test {

using Parameters = std::map<std::string, std::vector<double>>;

// The model's parameters in the checkpoint at `path`: not the optimizer's state (optimizer.*),
// not batch norm's running statistics.
inline Parameters checkpoint_parameters(const std::string& path) {
  Parameters out;
  for (const auto& [name, t] : load_safetensors(path).tensors) {
    if (name.rfind("optimizer.", 0) == 0 || name.find("running_") != std::string::npos ||
        name.find("num_batches_tracked") != std::string::npos)
      continue;
    out[name] = t.to_vector<double>();
  }
  return out;
}

// after - before, parameter by parameter (the same names in both).
inline Parameters update(const Parameters& before, const Parameters& after) {
  Parameters out;
  for (const auto& [name, b] : before) {
    std::vector<double> d = after.at(name);
    for (size_t i = 0; i < d.size(); ++i) d[i] -= b[i];
    out[name] = std::move(d);
  }
  return out;
}

// The 2-norm of all of `u` together.
inline double norm(const Parameters& u) {
  double sum = 0;
  for (const auto& [name, v] : u)
    for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

// |a - scale * b| / |scale * b| over all parameters together.
inline double relative_difference(const Parameters& a, const Parameters& b, double scale = 1) {
  double diff = 0, ref = 0;
  for (const auto& [name, v] : b) {
    const std::vector<double>& w = a.at(name);
    for (size_t i = 0; i < v.size(); ++i) {
      diff += (w[i] - scale * v[i]) * (w[i] - scale * v[i]);
      ref += scale * v[i] * scale * v[i];
    }
  }
  return std::sqrt(diff / ref);
}

}  // namespace loom::test
