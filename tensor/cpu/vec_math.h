// tensor/cpu/vec_math.h — float32 exp, sigmoid and GELU without a branch or a library call, so
// that a loop over a row of them vectorises (glibc's expf and tanhf are a call per element: the
// tanh GELU's forward and backward took a third of a small GPT's training step through them).
// float64 keeps the C library's functions: its loops are for tests and reference, not speed.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace loom::cpu {

// exp(x) for x <= 0 (a softmax's score less its running maximum), to about 2 ulp. Cody-Waite:
// x = n ln2 + r with |r| <= ln2/2, exp(r) by its Taylor series to r^7 (error below 2e-9 relative
// on that range), 2^n put into the exponent bits. Below -87 the result would be near or under
// the smallest normal float: it is 0 there, as it is for -inf.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = hi + lo, hi with few mantissa bits: n hi exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  // n = round(x log2 e) by adding and taking away 1.5 * 2^23: the sum's last bits are n (GCC 12
  // kept a loop calling std::floor scalar with -march=native on a Zen 4, tuned as znver3).
  constexpr float kRound = 12582912.0f;
  const float clamped = std::max(x, -87.0f);
  const float shifted = clamped * kLog2e + kRound;
  const float n = shifted - kRound;
  const float r = (clamped - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n_bits = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  const float two_n = std::bit_cast<float>((n_bits + 127) << 23);
  return x < -87.0f ? 0.0f : p * two_n;
}
inline double exp_nonpositive(double x) { return std::exp(x); }

// 1 / (1 + exp(-x)) for any x, to a few ulp: exp of -|x| (never overflows), then the two halves
// of the curve from it. Infinite x gives 0 or 1; NaN gives NaN.
inline float sigmoid_float(float x) {
  const float e = exp_nonpositive(-std::fabs(x));  // in (0, 1]
  const float upper = 1.0f / (1.0f + e);           // sigmoid(|x|)
  return x >= 0.0f ? upper : (x != x ? x : e * upper);
}

// GELU's tanh approximation, 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), written
// as x sigmoid(2u) (1 + tanh(u) = 2 sigmoid(2u)): no tanh, and no cancellation in 1 + tanh(u)
// where u is very negative, so it is closer to the exact value than the tanh form rounded in
// float32 (which PyTorch computes).
inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
inline constexpr double kGeluCubic = 0.044715;
inline constexpr float kGeluTanhScale = static_cast<float>(kSqrt2OverPi);
inline constexpr float kGeluTanhCubic = static_cast<float>(kGeluCubic);

inline float gelu_tanh_float(float x) {
  const float u = kGeluTanhScale * (x + kGeluTanhCubic * x * x * x);
  return x * sigmoid_float(2.0f * u);
}

// d/dx of x s(2u): s + 2 x s (1 - s) u' with s = sigmoid(2u) and u' = sqrt(2/pi) (1 + 3 c x^2)
// (the same derivative as 0.5 (1 + t) + 0.5 x (1 - t^2) u', t = tanh(u) = 2s - 1). With
// e = exp(-|2u|) and d = 1 / (1 + e), s (1 - s) = e d^2 on both sides of 0: 1 - s computed from
// a rounded s near 1 would lose its digits.
inline float gelu_tanh_backward_float(float grad, float x) {
  const float x2 = x * x;
  const float z = 2.0f * kGeluTanhScale * (x + kGeluTanhCubic * x2 * x);
  const float du = kGeluTanhScale * (1.0f + 3.0f * kGeluTanhCubic * x2);
  const float e = exp_nonpositive(-std::fabs(z));
  const float d = 1.0f / (1.0f + e);
  const float s = z >= 0.0f ? d : e * d;
  return grad * (s + 2.0f * x * (e * d * d) * du);
}

}  // namespace loom::cpu
