// bench/stats.h — the one statistic the benchmarks report: the median of repeated timings (the
// machines are shared, and a median ignores the repetitions another process slowed down); and
// the timer they take them with.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace loom::bench {

// The median (the mean of the middle two for an even count); 0 for no values.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Milliseconds f() took, by the steady clock.
template <typename F>
double timed_ms(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace loom::bench
