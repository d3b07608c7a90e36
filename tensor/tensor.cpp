// tensor/tensor.cpp — dtypes, devices, the structural half of Tensor, shape helpers, printing.

#include "tensor/tensor.h"

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "tensor/copy.h"
#include "tensor/dispatch.h"

namespace loom {

// ---------------------------------------------------------------- dtypes

size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64:
      return 8;
    case DType::Float32:
    case DType::Int32:
      return 4;
    case DType::Float16:
    case DType::BFloat16:
      return 2;
    case DType::UInt8:
    case DType::Bool:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
    case DType::Float16:
      return "float16";
    case DType::BFloat16:
      return "bfloat16";
    case DType::Int64:
      return "int64";
    case DType::Int32:
      return "int32";
    case DType::UInt8:
      return "uint8";
    case DType::Bool:
      return "bool";
  }
  return "?";
}

bool is_floating(DType d) {
  return d == kFloat32 || d == kFloat64 || d == kFloat16 || d == kBFloat16;
}
bool is_integral(DType d) { return d == kInt64 || d == kInt32 || d == kUInt8; }
bool is_16bit_float(DType d) { return d == kFloat16 || d == kBFloat16; }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  // Rank within a category; a float always wins over an integer, as in PyTorch.
  auto float_rank = [](DType d) {
    switch (d) {
      case DType::Float16:
        return 1;
      case DType::BFloat16:
        return 2;
      case DType::Float32:
        return 3;
      case DType::Float64:
        return 4;
      default:
        return 0;
    }
  };
  auto int_rank = [](DType d) {
    switch (d) {
      case DType::Bool:
        return 1;
      case DType::UInt8:
        return 2;
      case DType::Int32:
        return 3;
      case DType::Int64:
        return 4;
      default:
        return 0;
    }
  };
  int fa = float_rank(a), fb = float_rank(b);
  if (fa || fb) {
    if ((a == kFloat16 && b == kBFloat16) || (a == kBFloat16 && b == kFloat16)) return kFloat32;
    return fa >= fb ? a : b;
  }
  return int_rank(a) >= int_rank(b) ? a : b;
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
Half::Half(float value) {
  uint32_t f;
  std::memcpy(&f, &value, 4);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t abs = f & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    bits = static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (abs >= 0x477ff000u) {  // rounds to a value beyond 65504: overflow to inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (abs < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    // Add 0.5 so the float adder rounds the mantissa to the half's subnormal grid (2^-24).
    float magnitude;
    std::memcpy(&magnitude, &abs, 4);
    float shifted = magnitude + 0.5f;
    uint32_t s;
    std::memcpy(&s, &shifted, 4);
    bits = static_cast<uint16_t>(sign | (s - 0x3f000000u));
    return;
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  uint32_t mant_odd = (abs >> 13) & 1u;
  uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // -(112 << 23) + 0xfff
  bits = static_cast<uint16_t>(sign | (rounded >> 13));
}

Half::operator float() const {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  uint32_t f;
  if (exp == 0x1f) {
    f = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    // zero or subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    std::memcpy(&f, &v, 4);
    f |= sign;
  } else {
    f = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &f, 4);
  return out;
}

// ---------------------------------------------------------------- devices

Device::Device(const std::string& spec) {
  if (spec == "cpu") {
    type = DeviceType::CPU;
    index = 0;
    return;
  }
  if (spec.rfind("cuda", 0) == 0) {
    type = DeviceType::CUDA;
    index = 0;
    if (spec.size() == 4) return;
    if (spec[4] == ':' && spec.size() > 5) {
      try {
        size_t used = 0;
        index = std::stoi(spec.substr(5), &used);
        if (used == spec.size() - 5 && index >= 0) return;
      } catch (const std::exception&) {
      }
    }
  }
  throw ValueError(
      detail::str("device: expected \"cpu\", \"cuda\" or \"cuda:N\"; got \"", spec, "\""));
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

// ---------------------------------------------------------------- shapes

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// Note [Memory formats]
// A memory format is an order of the dims in memory, outermost first: kContiguous is
// (N, C, H, W), kChannelsLast is (N, H, W, C). The logical shape stays [N, C, H, W] in both, so
// every op reads a channels-last tensor correctly through its strides; the format only decides
// speed, and which format an op's result takes:
//  - elementwise ops (arithmetic, activations, their backwards, dtype conversions) give their
//    result the format of their first operand of the result's shape (result_format), so a
//    channels-last activation stays channels-last through ReLU, residual adds and autocast;
//  - batch norm, the pools and the convolutions keep their input's format, and their input
//    gradients take it too (cuDNN runs NHWC for a channels-last input);
//  - to(device) and copies between devices keep the format (dense bytes in dst's format);
//  - everything else (reductions, views, clone(), contiguous(), the factories) gives
//    kContiguous unless told otherwise.
// The loops under the elementwise ops (cpu::plan_loop) visit dims in the output's memory
// order, so a channels-last map is one flat pass as a contiguous one is. A choice made here:
// empty_like gives kContiguous (PyTorch's preserves), because loom's kernels allocate with it
// and read the result as row-major; empty_like_format asks for the input's format.

Shape format_strides(const Shape& shape, MemoryFormat format) {
  if (format == MemoryFormat::kContiguous) return contiguous_strides(shape);
  LOOM_CHECK(shape.size() == 4, ShapeError,
             "channels_last: expected a 4-D shape [N, C, H, W]; got shape=", shape);
  const auto extent = [&](size_t d) { return std::max<int64_t>(shape[d], 1); };
  const int64_t c = extent(1), w = extent(3);
  return {c * extent(2) * w, 1, w * c, c};
}

MemoryFormat suggest_memory_format(const Tensor& t) {
  if (t.dim() != 4 || !t.is_contiguous(MemoryFormat::kChannelsLast))
    return MemoryFormat::kContiguous;
  if (!t.is_contiguous()) return MemoryFormat::kChannelsLast;
  // Dense in both orders (C = 1, or H = W = 1): only the strides of the size-1 dims can tell,
  // and they read as channels-last when they are exactly what format_strides gives it.
  const Shape& st = t.strides();
  return st == format_strides(t.sizes(), MemoryFormat::kChannelsLast) &&
                 st != contiguous_strides(t.sizes())
             ? MemoryFormat::kChannelsLast
             : MemoryFormat::kContiguous;
}

bool has_memory_format(const Tensor& t, MemoryFormat format) {
  return format == MemoryFormat::kContiguous ? t.is_contiguous()
                                             : suggest_memory_format(t) == format;
}

MemoryFormat result_format(const Shape& shape, std::initializer_list<Tensor> operands) {
  for (const Tensor& t : operands)
    if (t.defined() && t.sizes() == shape) return suggest_memory_format(t);
  return MemoryFormat::kContiguous;
}

std::ostream& operator<<(std::ostream& os, MemoryFormat format) {
  return os << (format == MemoryFormat::kChannelsLast ? "channels_last" : "contiguous");
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  LOOM_CHECK(dim >= lo && dim <= hi, IndexError, op, ": dim ", dim,
             " out of range for a tensor of ", ndim, " dims (expected [", lo, ", ", hi, "])");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    LOOM_CHECK(da == db || da == 1 || db == 1, ShapeError, op,
               ": shapes cannot be broadcast together; got a=", a, " b=", b);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---------------------------------------------------------------- Tensor structure

int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return shape_numel(sizes()); }

void Tensor::set_data(const Tensor& src) const {
  LOOM_CHECK(src.defined(), ValueError, "set_data: the source tensor is undefined");
  LOOM_CHECK(defined(), ValueError, "set_data: the target tensor is undefined");
  TensorImpl& dst = *impl_;
  const TensorImpl& from = *src.impl_;
  dst.storage = from.storage;
  dst.sizes = from.sizes;
  dst.strides = from.strides;
  dst.offset = from.offset;
  dst.dtype = from.dtype;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sizes()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= sizes()[i];
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::kContiguous) return is_contiguous();
  if (dim() != 4) return false;
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {  // innermost first: C, W, H, N
    if (sizes()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= sizes()[d];
  }
  return true;
}

void* Tensor::data() const {
  const Storage& s = storage();
  LOOM_CHECK(!is_released(*s), ValueError, "tensor of shape ", sizes(),
             ": its memory is released (Note [Released storage]): a FullyShardedDataParallel "
             "unit's parameters exist only around its forward and backward; read them inside "
             "summon_full_params()");
  return static_cast<char*>(s->data) + offset() * static_cast<int64_t>(itemsize());
}

template <typename T>
T Tensor::item() const {
  LOOM_CHECK(numel() == 1, ValueError,
             "item: expected a tensor with one element; got shape=", sizes());
  if (!is_cpu())
    return kernels::to_device(*this, kCPU)
        .item<T>();  // waits for the device, as PyTorch's item() does
  return dispatch_all(dtype(), "item", [&]<typename S>() {
    return static_cast<T>(static_cast<double>(*static_cast<const S*>(data())));
  });
}

// Visits every element in row-major order with its address (strided; any layout).
template <typename S, typename F>
static void for_each_element(const Tensor& t, F&& f) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const S* base = static_cast<const S*>(t.data());
  std::vector<int64_t> index(t.dim(), 0);
  int64_t off = 0;
  for (int64_t k = 0; k < n; ++k) {
    f(base[off]);
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      if (++index[d] < t.sizes()[d]) {
        off += t.strides()[d];
        break;
      }
      off -= (t.sizes()[d] - 1) * t.strides()[d];
      index[d] = 0;
    }
  }
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  if (!is_cpu()) return kernels::to_device(*this, kCPU).to_vector<T>();
  std::vector<T> out;
  out.reserve(numel());
  dispatch_all(dtype(), "to_vector", [&]<typename S>() {
    for_each_element<S>(*this,
                        [&](const S& v) { out.push_back(static_cast<T>(static_cast<double>(v))); });
  });
  return out;
}

#define LOOM_INSTANTIATE_ITEM(T)      \
  template T Tensor::item<T>() const; \
  template std::vector<T> Tensor::to_vector<T>() const;
LOOM_INSTANTIATE_ITEM(float)
LOOM_INSTANTIATE_ITEM(double)
LOOM_INSTANTIATE_ITEM(int64_t)
LOOM_INSTANTIATE_ITEM(int32_t)
LOOM_INSTANTIATE_ITEM(uint8_t)
LOOM_INSTANTIATE_ITEM(bool)
#undef LOOM_INSTANTIATE_ITEM

// ---------------------------------------------------------------- printing
//
// Like PyTorch: tensor([[ 1.0000, -2.5000],
//                       [ 3.0000,  4.0000]], dtype=float64, requires_grad=True)
// Floats use 4 decimals (scientific notation when the range calls for it), every column the
// same width; long dims are summarised with "..." (3 elements each side) past 1000 elements.

namespace {

struct Formatter {
  bool boolean = false;
  bool floating = false;
  bool scientific = false;
  bool all_whole = false;
  int width = 1;

  std::string format(double v) const {
    std::ostringstream os;
    if (boolean) {
      os << (v != 0 ? "True" : "False");
    } else if (!floating) {
      os << static_cast<int64_t>(v);
    } else if (std::isnan(v)) {
      os << "nan";
    } else if (std::isinf(v)) {
      os << (v < 0 ? "-inf" : "inf");
    } else if (scientific) {
      os << std::scientific << std::setprecision(4) << v;
    } else if (all_whole) {
      os << std::fixed << std::setprecision(0) << v << '.';
    } else {
      os << std::fixed << std::setprecision(4) << v;
    }
    return os.str();
  }
};

void print_dims(std::ostringstream& os, const std::vector<double>& values, const Shape& shape,
                size_t dim, int64_t& offset, const Formatter& fmt, int indent, bool summarise,
                const std::vector<int64_t>& row_strides) {
  const int64_t n = shape[dim];
  const bool cut = summarise && n > 6;
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (cut && i == 3) {
      os << (dim + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - 3;
    }
    int64_t elem = offset + i * row_strides[dim];
    if (dim + 1 == shape.size()) {
      std::string s = fmt.format(values[elem]);
      os << std::string(std::max<int>(0, fmt.width - static_cast<int>(s.size())), ' ') << s;
      if (i + 1 < n) os << ", ";
    } else {
      int64_t sub = elem;
      print_dims(os, values, shape, dim + 1, sub, fmt, indent + 1, summarise, row_strides);
      if (i + 1 < n)
        os << ',' << std::string(shape.size() - dim - 1, '\n') << std::string(indent + 1, ' ');
    }
  }
  os << ']';
}

}  // namespace

namespace detail {

std::string tensor_repr(const Tensor& t, const std::string& grad_note) {
  if (!t.defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  const std::vector<double> values =
      t.is_cpu() ? t.to_vector<double>() : std::vector<double>{};  // device tensors: metadata only
  Formatter fmt;
  fmt.boolean = t.dtype() == kBool;
  fmt.floating = is_floating(t.dtype());
  double max_abs = 0, min_abs = INFINITY;
  bool whole = true;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    max_abs = std::max(max_abs, std::fabs(v));
    if (v != 0) min_abs = std::min(min_abs, std::fabs(v));
    whole = whole && v == std::floor(v);
  }
  fmt.all_whole = whole;
  fmt.scientific = fmt.floating && !whole &&
                   (max_abs >= 1e8 || (min_abs < 1e-4 && max_abs > 0) ||
                    (max_abs / min_abs > 1000 && max_abs > 1e3));
  for (double v : values) fmt.width = std::max<int>(fmt.width, fmt.format(v).size());
  if (!t.is_cpu()) {
    os << "<on " << t.device() << ">";
  } else if (t.dim() == 0) {
    os << fmt.format(values[0]);
  } else {
    int64_t offset0 = 0;
    print_dims(os, values, t.sizes(), 0, offset0, fmt, 7, t.numel() > 1000,
               contiguous_strides(t.sizes()));
  }
  if (t.dtype() != kFloat32 && t.dtype() != kInt64 && t.dtype() != kBool)
    os << ", dtype=" << t.dtype();
  if (t.dtype() == kBool && t.numel() == 0) os << ", dtype=bool";
  if (!t.is_cpu()) os << ", device='" << t.device() << "'";
  if (t.numel() == 0 && t.dim() != 1) os << ", size=" << detail::str(t.sizes());
  os << grad_note << ')';
  return os.str();
}

}  // namespace detail

}  // namespace loom
