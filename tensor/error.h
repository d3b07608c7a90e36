// tensor/error.h — loom's exception hierarchy and the two checking macros.
// LOOM_CHECK is for what a user can get wrong (bad shapes, dtypes, files); it throws a typed
// error whose message names the op and shows the inputs. LOOM_ASSERT is for what only a bug in
// loom can break; it throws InternalError. Library code never calls exit() or abort().
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ShapeError : public Error {
  using Error::Error;
};
class DTypeError : public Error {
  using Error::Error;
};
class DeviceError : public Error {
  using Error::Error;
};
class ValueError : public Error {
  using Error::Error;
};
class IndexError : public ValueError {  // an index or dim out of range
  using ValueError::ValueError;
};
class IOError : public Error {
  using Error::Error;
};
class DistError : public Error {
  using Error::Error;
};
class NotImplementedError : public Error {
  using Error::Error;
};
class OutOfMemoryError : public Error {  // a device's memory cap or its memory exhausted
  using Error::Error;                    // (Note [Device memory cap], tensor/memory_limit.h)
};
class AutogradError : public Error {  // freed graph, in-place change of a saved tensor, ...
  using Error::Error;
};
class InternalError : public Error {  // a broken invariant: a bug in loom
  using Error::Error;
};

namespace detail {

// Shapes print as [2, 3]; everything else through operator<<.
inline void append(std::ostringstream& os, const std::vector<int64_t>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
template <typename T>
void append(std::ostringstream& os, const T& value) {
  os << value;
}

template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (append(os, args), ...);
  return os.str();
}

}  // namespace detail
}  // namespace loom

// LOOM_CHECK(cond, ShapeError, "conv2d: expected 4-D input; got x=", x.shape())
#define LOOM_CHECK(cond, ErrorType, ...)                                    \
  do {                                                                      \
    if (!(cond)) throw ::loom::ErrorType(::loom::detail::str(__VA_ARGS__)); \
  } while (0)

// LOOM_ASSERT(cond, "what broke") — an internal invariant.
#define LOOM_ASSERT(cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      throw ::loom::InternalError(::loom::detail::str("internal error at ", __FILE__, ":",         \
                                                      __LINE__, ": ", #cond, " ", ##__VA_ARGS__)); \
  } while (0)
