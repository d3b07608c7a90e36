// tests/tensor/memory_limit_test.cpp — a device's memory cap (Note [Device memory cap] in
// tensor/memory_limit.h) on the CPU: the sizes LOOM_MAX_MEMORY and --max-memory are written in,
// an allocation over the cap raising OutOfMemoryError with the facts and allocating nothing, no
// cap changing nothing, the labels of Note [Allocation labels], the explainer's lines, the cap
// holding for threads allocating at once, and the CUDA caching allocator's cap through a fake
// raw allocator.

#include "tensor/memory_limit.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <latch>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom.h"
#include "optim/sgd.h"
#include "tensor/caching_allocator.h"
#include "tensor/cpu/host_cache.h"
#include "tensor/storage.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr int64_t kKiB = 1024, kMiB = 1024 * 1024;

// The CPU capped at `headroom` bytes above what it holds now, for the test's length.
class CpuCap {
 public:
  explicit CpuCap(int64_t headroom) : previous_(memory_limit(kCPU)) {
    set_memory_limit(kCPU, memory_stats(kCPU).current_bytes + headroom);
  }
  ~CpuCap() { set_memory_limit(kCPU, previous_); }

 private:
  int64_t previous_;
};

// An explainer for the test's length.
class Explainer {
 public:
  explicit Explainer(OutOfMemoryExplainer e) : previous_(set_out_of_memory_explainer(e)) {}
  ~Explainer() { set_out_of_memory_explainer(previous_); }

 private:
  OutOfMemoryExplainer previous_;
};

// The message of the OutOfMemoryError `fn` raises ("" and a failure if it raises none).
template <typename Fn>
std::string out_of_memory_message(Fn fn) {
  try {
    fn();
  } catch (const OutOfMemoryError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no OutOfMemoryError";
  return "";
}

TEST(ParseMemorySize, UnitsOfTwoAndTenAndPlainBytes) {
  EXPECT_EQ(parse_memory_size("2GiB", "X"), 2LL << 30);
  EXPECT_EQ(parse_memory_size("512MiB", "X"), 512LL << 20);
  EXPECT_EQ(parse_memory_size("1.5GB", "X"), 1500000000LL);
  EXPECT_EQ(parse_memory_size("1000000", "X"), 1000000);
  EXPECT_EQ(parse_memory_size(" 2 gib ", "X"), 2LL << 30);  // spaces and case do not matter
  EXPECT_EQ(parse_memory_size("0.5GiB", "X"), 512LL << 20);
  EXPECT_EQ(parse_memory_size("0.3GB", "X"), 300000000LL);  // exact: no float rounding
  EXPECT_EQ(parse_memory_size("3K", "X"), 3 * kKiB);
  EXPECT_EQ(parse_memory_size("1kB", "X"), 1000);
  EXPECT_EQ(parse_memory_size("7B", "X"), 7);
  EXPECT_EQ(parse_memory_size("1.5", "X"), 1);  // a fraction of a byte rounds down
  EXPECT_EQ(parse_memory_size("4TiB", "X"), 4LL << 40);
  EXPECT_EQ(parse_memory_size("0", "X"), 0);
  EXPECT_EQ(parse_memory_size("9223372036854775807", "X"), INT64_MAX);
}

TEST(ParseMemorySize, BadSizesNameTheSourceAndTheText) {
  const char* const cases[][2] = {
      {"", "expected a number"},       {"abc", "expected a number"},
      {"GiB", "expected a number"},    {".", "expected a number"},
      {"2XB", "unknown unit 'XB'"},    {"1e3", "unknown unit 'e3'"},
      {"-1GiB", "cannot be negative"}, {"2 GiB extra", "unknown unit 'GiB extra'"},
      {"9999999TiB", "too large"},     {"9223372036854775808", "too large"},
  };
  for (const auto& [text, why] : cases) {
    SCOPED_TRACE(text);
    EXPECT_LOOM_ERROR(parse_memory_size(text, "--max-memory"), ValueError,
                      {"--max-memory='" + std::string(text) + "'", why, "2GiB, 512MiB, 1.5GB"});
  }
}

// The variable is read as it is now (the allocator reads it once per device).
TEST(ParseMemorySize, TheEnvironmentVariable) {
  const char* saved = std::getenv(kMaxMemoryVariable);
  const std::optional<std::string> previous =
      saved ? std::optional<std::string>(saved) : std::nullopt;
  ::unsetenv(kMaxMemoryVariable);
  EXPECT_EQ(memory_limit_from_environment(), 0);
  ::setenv(kMaxMemoryVariable, "", 1);
  EXPECT_EQ(memory_limit_from_environment(), 0);
  ::setenv(kMaxMemoryVariable, "512MiB", 1);
  EXPECT_EQ(memory_limit_from_environment(), 512 * kMiB);
  ::setenv(kMaxMemoryVariable, "lots", 1);
  EXPECT_LOOM_ERROR(memory_limit_from_environment(), ValueError,
                    {"LOOM_MAX_MEMORY='lots'", "expected a number"});
  if (previous)
    ::setenv(kMaxMemoryVariable, previous->c_str(), 1);
  else
    ::unsetenv(kMaxMemoryVariable);
}

TEST(FormatBytes, PowersOf1024) {
  EXPECT_EQ(format_bytes(100), "100 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(512 * kMiB), "512.00 MiB");
  EXPECT_EQ(format_bytes(2LL << 30), "2.00 GiB");
}

TEST(MemoryLimit, SetAndRemoved) {
  const int64_t previous = memory_limit(kCPU);
  set_memory_limit(kCPU, 3 * kMiB);
  EXPECT_EQ(memory_limit(kCPU), 3 * kMiB);
  set_memory_limit(kCPU, 0);
  EXPECT_EQ(memory_limit(kCPU), 0);
  EXPECT_LOOM_ERROR(set_memory_limit(kCPU, -1), ValueError,
                    {"set_memory_limit", "cpu", "negative", "-1"});
  set_memory_limit(kCPU, previous);
}

TEST(MemoryLimit, OverTheCapRaisesWithTheFactsAndAllocatesNothing) {
  const CpuCap cap(1 * kMiB);
  const int64_t limit = memory_limit(kCPU);
  const Tensor fits = empty({256, 256}, kFloat32);  // 256 KiB
  const MemoryStats before = memory_stats(kCPU);
  const cpu::HostCacheStats cache_before = cpu::host_cache_stats();
  const std::string message = out_of_memory_message([] { return empty({1024, 1024}, kFloat32); });
  for (const std::string& fragment :
       {std::string("out of memory on cpu: allocating 4.00 MiB (4194304 bytes, float32 "
                    "[1024, 1024])"),
        "would take loom's tensors on cpu to " + format_bytes(before.current_bytes + 4 * kMiB),
        "over the cap of " + format_bytes(limit) + " (set_memory_limit)",
        "they hold " + format_bytes(before.current_bytes) + " (" +
            std::to_string(before.current_bytes) + " bytes; peak",
        std::string("Nothing was allocated.")})
    EXPECT_NE(message.find(fragment), std::string::npos) << fragment << "\n" << message;
  // Nothing allocated: the count, its peak and the host allocator are as they were.
  const MemoryStats after = memory_stats(kCPU);
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.peak_bytes, before.peak_bytes);
  const cpu::HostCacheStats cache_after = cpu::host_cache_stats();
  EXPECT_EQ(cache_after.hits + cache_after.misses, cache_before.hits + cache_before.misses);
  // An OutOfMemoryError is a loom::Error, and a storage without a tensor names its bytes only.
  EXPECT_LOOM_ERROR(allocate_storage(2 * kMiB, kCPU), Error,
                    {"allocating 2.00 MiB (2097152 bytes)"});
  // What fits still does.
  EXPECT_EQ(empty({64, 64}, kFloat32).numel(), 64 * 64);
}

TEST(MemoryLimit, UpToTheCapExactlyFitsAndOneByteMoreDoesNot) {
  const CpuCap cap(10 * kKiB);
  const Tensor exactly = empty({10 * kKiB}, kUInt8);
  EXPECT_EQ(memory_stats(kCPU).current_bytes, memory_limit(kCPU));
  EXPECT_THROW(empty({1}, kUInt8), OutOfMemoryError);
  EXPECT_EQ(empty({0}, kFloat32).numel(), 0);  // nothing asked, nothing refused
}

TEST(MemoryLimit, NoCapChangesNothing) {
  const int64_t previous = memory_limit(kCPU);
  set_memory_limit(kCPU, 0);
  const MemoryStats before = memory_stats(kCPU);
  {
    const Tensor big = empty({4 * kMiB}, kFloat32);  // 16 MiB: more than any cap above
    EXPECT_EQ(memory_stats(kCPU).current_bytes, before.current_bytes + 16 * kMiB);
    EXPECT_GE(memory_stats(kCPU).peak_bytes, before.current_bytes + 16 * kMiB);
  }
  EXPECT_EQ(memory_stats(kCPU).current_bytes, before.current_bytes);
  set_memory_limit(kCPU, previous);
}

// A freed tensor gives its bytes back to the cap: the same allocation fits again.
TEST(MemoryLimit, FreedBytesCountNoMore) {
  const CpuCap cap(1 * kMiB);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(empty({768 * kKiB}, kUInt8).numel(), 768 * kKiB);
  Tensor held = empty({768 * kKiB}, kUInt8);
  EXPECT_THROW(empty({768 * kKiB}, kUInt8), OutOfMemoryError);
  held = Tensor();
  EXPECT_EQ(empty({768 * kKiB}, kUInt8).numel(), 768 * kKiB);
}

// Four threads allocating at once, each keeping what it got until all are done: exactly the
// blocks that fit the cap are granted, and the count never passes it.
TEST(MemoryLimit, HoldsForThreadsAllocatingAtOnce) {
  const CpuCap cap(4 * kMiB);
  reset_peak_memory(kCPU);
  std::atomic<int> refused{0}, granted{0};
  std::latch all_done(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      std::vector<Tensor> kept;
      for (int i = 0; i < 50; ++i) {
        try {
          kept.push_back(empty({64 * kKiB}, kUInt8));
          ++granted;
        } catch (const OutOfMemoryError&) {
          ++refused;
        }
      }
      all_done.arrive_and_wait();
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(granted.load(), 64);  // 4 MiB of 64 KiB blocks
  EXPECT_EQ(refused.load(), 4 * 50 - 64);
  EXPECT_LE(memory_stats(kCPU).peak_bytes, memory_limit(kCPU));
}

struct Allocating : nn::Module {
  Allocating() : nn::Module("Allocating") {}
  Tensor forward(const Tensor& x) override { return x + empty({1024, 1024}, kFloat32).sum(); }
};

TEST(MemoryLimit, LabelsSayWhatWasRunning) {
  EXPECT_EQ(AllocationLabel::current(), "");
  {
    const AllocationLabel outer("in the forward of ", "Outer");
    {
      const AllocationLabel inner("in the backward of ", "matmul");
      EXPECT_EQ(AllocationLabel::current(), "in the backward of matmul");
    }
    EXPECT_EQ(AllocationLabel::current(), "in the forward of Outer");
  }
  EXPECT_EQ(AllocationLabel::current(), "");

  // A module's call.
  Allocating module;
  const Tensor x = zeros({1});
  {
    const CpuCap cap(1 * kMiB);
    EXPECT_LOOM_ERROR(module(x), OutOfMemoryError,
                      {"float32 [1024, 1024]) in the forward of Allocating would take"});
  }
  // A backward node: the gradient of the product is the size of x.
  Tensor w = ones({512, 512}).requires_grad_(true);
  const Tensor loss = (w * 2.0).sum();
  {
    const CpuCap cap(64 * kKiB);
    EXPECT_LOOM_ERROR(loss.backward(), OutOfMemoryError,
                      {"float32 [512, 512]) in the backward of "});
  }
  // An optimizer's state, made at its first step.
  w.set_grad(ones({512, 512}));
  optim::SGD sgd({w}, {.lr = 0.1, .momentum = 0.9});
  {
    const CpuCap cap(64 * kKiB);
    EXPECT_LOOM_ERROR(sgd.step(), OutOfMemoryError,
                      {"float32 [512, 512]) for the optimizer state of SGD would take"});
  }
  EXPECT_EQ(AllocationLabel::current(), "");  // the errors left no label behind
}

TEST(MemoryLimit, TheExplainersLinesFollowTheFirst) {
  const CpuCap cap(64 * kKiB);
  {
    const Explainer explainer([](Device d) { return "weights 3.00 GiB on " + d.str(); });
    const std::string message = out_of_memory_message([] { return empty({1024, 1024}, kFloat64); });
    EXPECT_NE(message.find("Nothing was allocated.\nweights 3.00 GiB on cpu"), std::string::npos)
        << message;
  }
  {
    const Explainer explainer([](Device) -> std::string { throw ValueError("no model"); });
    EXPECT_LOOM_ERROR(empty({1024, 1024}, kFloat32), OutOfMemoryError,
                      {"(the out-of-memory explainer failed: no model)"});
  }
  {
    // An explainer that allocates over the cap itself: its own error is not explained again.
    const Explainer explainer([](Device) { return std::to_string(zeros({1 << 20}).numel()); });
    EXPECT_LOOM_ERROR(
        empty({1024, 1024}, kFloat32), OutOfMemoryError,
        {"float32 [1024, 1024]", "explainer failed: out of memory on cpu", "float32 [1048576]"});
  }
  // Without an explainer the message is the first line alone.
  const std::string message = out_of_memory_message([] { return empty({1024, 1024}, kFloat64); });
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// ---------------------------------------------------------------- the CUDA caching allocator

// A fake device of unbounded memory: the allocator's cap alone limits it.
struct FakeRaw {
  std::map<uintptr_t, size_t> live;
  uintptr_t next = uintptr_t(1) << 40;
  int64_t cap = 0;
  cuda::RawAllocator raw() {
    return cuda::RawAllocator{[this](size_t n, int) {
                                const uintptr_t address = next;
                                next += n + (uintptr_t(1) << 30);
                                live[address] = n;
                                return reinterpret_cast<void*>(address);
                              },
                              [this](void* p, int) { live.erase(reinterpret_cast<uintptr_t>(p)); },
                              "fakeMalloc", [this](int) { return cap; }};
  }
};

TEST(CachingAllocatorCap, ReservedSegmentsStayUnderTheCapAfterTheCacheGoesBack) {
  FakeRaw fake;
  fake.cap = 6 * kMiB;
  cuda::CachingAllocator allocator(fake.raw());
  void* a = allocator.allocate(2 * kMiB, 0, 0);  // a 2 MiB segment
  void* b = allocator.allocate(3 * kMiB, 0, 0);  // a 4 MiB segment: 6 MiB reserved
  allocator.free(a);                             // cached
  const cuda::AllocatorStats before = allocator.stats(0);
  EXPECT_EQ(before.reserved_bytes, 6 * kMiB);
  // 4 MiB more: over the cap even once the cached 2 MiB go back.
  EXPECT_LOOM_ERROR(allocator.allocate(3 * kMiB, 0, 0), OutOfMemoryError,
                    {"caching allocator of cuda:0 would reserve a segment of 4.00 MiB",
                     "beside the 4.00 MiB it holds", "over the cap of 6.00 MiB (6291456 bytes)"});
  const cuda::AllocatorStats after = allocator.stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, 4 * kMiB);  // the cache went back to the driver
  EXPECT_EQ(fake.live.size(), 1u);
  // With a cap of 8 MiB the same request fits once the cache went back.
  void* c = allocator.allocate(1 * kMiB + 512 * kKiB, 0, 0);  // a 2 MiB segment
  EXPECT_EQ(allocator.stats(0).reserved_bytes, 6 * kMiB);
  fake.cap = 8 * kMiB;
  allocator.free(c);  // cached again
  void* d = allocator.allocate(3 * kMiB, 0, 0);
  EXPECT_EQ(allocator.stats(0).reserved_bytes, 8 * kMiB);
  // No cap: nothing refused.
  fake.cap = 0;
  void* e = allocator.allocate(64 * kMiB, 0, 0);
  EXPECT_NE(e, nullptr);
  for (void* p : {b, d, e}) allocator.free(p);
}

}  // namespace
}  // namespace loom
