// tests/test_util.h — assertions shared by loom's tests: tensors close to a reference, errors
// of the right type whose message names the op and the shapes, gradcheck as a gtest check.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "loom.h"

namespace loom::test {

// Milliseconds since `t`: how long a wait or a failure took to surface.
inline double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Every element of `actual` within atol + rtol * |expected| of `expected`, same shape.
inline ::testing::AssertionResult tensors_close(const Tensor& actual, const Tensor& expected,
                                                double rtol = 1e-5, double atol = 1e-6) {
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shapes differ: " << detail::str(actual.sizes())
                                         << " vs " << detail::str(expected.sizes());
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    if (!both_nan && !(std::fabs(a[i] - e[i]) <= atol + rtol * std::fabs(e[i])))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs expected " << e[i];
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult values_are(const Tensor& actual, const std::vector<double>& v,
                                             double tol = 1e-6) {
  const std::vector<double> a = actual.to_vector<double>();
  if (a.size() != v.size())
    return ::testing::AssertionFailure() << a.size() << " elements, expected " << v.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - v[i]) <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << v[i];
  return ::testing::AssertionSuccess();
}

// A float64 tensor of the given shape with values from randn, that requires grad.
inline Tensor dparam(const Shape& shape) { return randn(shape, kFloat64).requires_grad_(); }

}  // namespace loom::test

// EXPECT_LOOM_ERROR(stmt, ShapeError, {"matmul", "[2, 3]", "[4, 5]"}): the statement throws
// loom::ShapeError and every fragment appears in its message.
#define EXPECT_LOOM_ERROR(stmt, ErrorType, ...)                                        \
  do {                                                                                 \
    try {                                                                              \
      stmt;                                                                            \
      ADD_FAILURE() << "expected " #ErrorType " from: " #stmt;                         \
    } catch (const ::loom::ErrorType& e) {                                             \
      const std::string message = e.what();                                            \
      for (const std::string& fragment : std::vector<std::string> __VA_ARGS__)         \
        EXPECT_NE(message.find(fragment), std::string::npos)                           \
            << "message \"" << message << "\" lacks \"" << fragment << "\"";           \
    } catch (const std::exception& e) {                                                \
      ADD_FAILURE() << "expected " #ErrorType ", got another exception: " << e.what(); \
    }                                                                                  \
  } while (0)

#define EXPECT_GRADCHECK(f, ...)                      \
  do {                                                \
    auto result_ = ::loom::gradcheck(f, __VA_ARGS__); \
    EXPECT_TRUE(result_.ok) << result_.message;       \
  } while (0)
