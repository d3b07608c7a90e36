// tensor/cpu/random.cpp — the CPU loops of the random fills (tensor/cpu/random.h): the Philox
// draws of Note [Philox streams], element i from its own counter, so that a fill's values do not
// depend on the thread count.

#include "tensor/cpu/random.h"

#include <cmath>

#include "tensor/dispatch.h"
#include "tensor/parallel.h"
#include "tensor/random.h"

namespace loom::cpu {

// Uniform [0, 1): element i takes lane i%4 of counter first + i/4.
void fill_uniform_(const Tensor& t, uint64_t seed, uint64_t first) {
  const int64_t n = t.numel();
  dispatch_floating(t.dtype(), "rand", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    parallel_for(0, (n + 3) / 4, 4096, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        auto r = philox4x32(seed, first + c);
        for (int64_t k = 0; k < 4 && c * 4 + k < n; ++k)
          p[c * 4 + k] = static_cast<T>(uniform_float(r[k]));
      }
    });
  });
}

// Standard normal by Box-Muller: element i uses lanes (0,1) or (2,3) of counter first + i/2.
void fill_normal_(const Tensor& t, uint64_t seed, uint64_t first) {
  const int64_t n = t.numel();
  dispatch_floating(t.dtype(), "randn", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    parallel_for(0, n, 8192, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        auto r = philox4x32(seed, first + i / 2);
        const int lane = static_cast<int>(i % 2) * 2;
        const double u1 = (static_cast<double>(r[lane]) + 1.0) * (1.0 / 4294967296.0);  // (0, 1]
        const double u2 = static_cast<double>(r[lane + 1]) * (1.0 / 4294967296.0);      // [0, 1)
        p[i] = static_cast<T>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
      }
    });
  });
}

void fill_randint_(const Tensor& t, uint64_t seed, uint64_t first, int64_t low, int64_t high) {
  const int64_t n = t.numel();
  const uint64_t range = static_cast<uint64_t>(high - low);
  dispatch_numeric(t.dtype(), "randint", [&]<typename T>() {
    T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      auto r = philox4x32(seed, first + i / 2);
      const int lane = static_cast<int>(i % 2) * 2;
      const uint64_t bits = (static_cast<uint64_t>(r[lane]) << 32) | r[lane + 1];
      p[i] = static_cast<T>(low + static_cast<int64_t>(bits % range));
    }
  });
}

}  // namespace loom::cpu
