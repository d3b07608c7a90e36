// tensor/cuda/conv.cu — conv2d forward and backward on the GPU through cuDNN's convolution API
// (cudnnConvolutionForward / BackwardData / BackwardFilter), in NCHW or NHWC, with algorithms
// chosen once per shape and cached; the bias and its gradient are two small kernels here.
// The plan is Note [conv2d on cuDNN]; the CPU twin is tensor/cpu/conv.cpp.

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/copy.h"
#include "tensor/cuda/conv.h"
#include "tensor/cuda/handles.h"
#include "tensor/view.h"

namespace loom::cuda {

// Note [conv2d on cuDNN]
//   Legend: N batch, C in channels, O out channels, kh x kw kernel, Ho x Wo output.
//   Layout: a contiguous x runs as NCHW; a channels-last x (suggest_memory_format, Note
//   [Memory formats]) runs as NHWC, except in float64, where cuDNN has few NHWC kernels.
//   The weight, and dout in the backward, are brought to the same layout (for NHWC the weight
//   is KRSC: [O, kh, kw, C/g] in memory), copied only when they are not already. The output and
//   dx come back in x's format, as PyTorch does, even where the call ran NCHW for a
//   channels-last x (float64, or a shape without NHWC algorithms: one extra copy). dweight takes
//   the weight's format: a channels-last weight (autocast's cast of a weight for a channels-last
//   x) gets cuDNN's KRSC gradient as written, a contiguous one gets it copied out of KRSC (a
//   1x1 kernel's two orders are the same bytes: no copy). dbias is contiguous. An operand that
//   is not 16-byte aligned (a view at an odd offset) is copied too.
//   Algorithms: per key (device, direction, dtype, layout, math, chunk shape, options) cuDNN's
//   heuristics (cudnnGet*Algorithm_v7) rank the algorithms once; the usable ones (status
//   success, exact workspace known, no tensor-op math for float32 when TF32 is off) are cached
//   in a mutex-protected map, deterministic ones first. So backward data and backward filter
//   give the same bits on every run; a non-deterministic algorithm runs only when no
//   deterministic one exists for the shape or none's workspace can be allocated. With
//   set_cudnn_deterministic(false) the heuristics' ranking stands as it is (PyTorch's default),
//   cached under its own key. At each call
//   the first candidate whose workspace the caching allocator can give runs (a candidate that
//   cuDNN refuses at run time passes to the next). Either kind of failure moves the candidate to
//   the end of its key's list, so a shape pays for it once, not on every call.
//   Math: float16 and bfloat16 on tensor cores, accumulating in float32; float32 through TF32
//   when cudnn_allow_tf32() (the default, as PyTorch), else FMA math only; float64 in double.
//   Sizes: cuDNN's descriptors take int and its kernels index tensors with int32, so the batch
//   runs in chunks whose tensors hold fewer than 2^31 elements each; dweight accumulates over
//   the chunks (beta = 1 after the first), in order, on one stream.
//   Bias: out += bias[o] by a kernel after the convolution. dbias: one block per channel sums
//   dout over (n, h, w) with a fixed tree, the same bits on every run.
//   Degenerate shapes cuDNN refuses (no input channels, an empty input plane inside padding)
//   give out = bias (or zeros) and zero gradients without calling cuDNN.

namespace {

enum class Layout : int { kNCHW, kNHWC };
enum class Direction : int { kForward, kBackwardData, kBackwardFilter };

const char* direction_name(Direction direction) {
  switch (direction) {
    case Direction::kForward:
      return "cudnnConvolutionForward";
    case Direction::kBackwardData:
      return "cudnnConvolutionBackwardData";
    case Direction::kBackwardFilter:
      return "cudnnConvolutionBackwardFilter";
  }
  return "?";
}

// ---------------------------------------------------------------- layouts

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data()) % 16 == 0; }

MemoryFormat format_of(Layout layout) {
  return layout == Layout::kNHWC ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
}

Layout choose_layout(const Tensor& x) {
  if (x.dtype() != kFloat64 && suggest_memory_format(x) == MemoryFormat::kChannelsLast)
    return Layout::kNHWC;
  return Layout::kNCHW;
}

// A new [d0, d1, d2, d3] tensor stored in `layout` (NHWC: channels-last strides).
Tensor empty_in(const Shape& shape, DType dtype, Device device, Layout layout) {
  return empty(shape, dtype, device, format_of(layout));
}

// t itself when it is dense in `layout` and 16-byte aligned, else such a copy.
Tensor in_layout(const Tensor& t, Layout layout) {
  if (t.is_contiguous(format_of(layout)) && aligned16(t)) return t;
  Tensor out = empty_in(t.sizes(), t.dtype(), t.device(), layout);
  kernels::copy_(out, t);
  return out;
}

// Address of sample n of a tensor dense in either layout (N is outermost in both).
void* sample(const Tensor& t, int64_t n) {
  return static_cast<char*>(t.data()) +
         n * (t.numel() / t.size(0)) * static_cast<int64_t>(t.itemsize());
}

void zero(const Tensor& t) {
  if (t.defined() && t.numel() > 0)
    LOOM_CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.nbytes(), stream_of(t)), t.device().index);
}

// ---------------------------------------------------------------- types

// DTypeError for the dtypes conv2d does not take on CUDA.
cudnnDataType_t data_type(DType dtype, const char* op = "conv2d") {
  switch (dtype) {
    case DType::Float32:
      return CUDNN_DATA_FLOAT;
    case DType::Float64:
      return CUDNN_DATA_DOUBLE;
    case DType::Float16:
      return CUDNN_DATA_HALF;
    case DType::BFloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw DTypeError(detail::str(
          op, ": expected a float32, float64, float16 or bfloat16 tensor; got ", dtype));
  }
}

cudnnDataType_t compute_type(DType dtype) {
  return dtype == kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
}

// The math the descriptor asks for; heuristics then say which each algorithm uses.
cudnnMathType_t requested_math(DType dtype) {
  if (dtype == kFloat16 || dtype == kBFloat16) return CUDNN_TENSOR_OP_MATH;
  if (dtype == kFloat32 && !cudnn_allow_tf32()) return CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

// alpha and beta: double for double data, float otherwise (host memory).
const void* scalar(DType dtype, int value) {
  static const float kFloat[2] = {0.0f, 1.0f};
  static const double kDouble[2] = {0.0, 1.0};
  return dtype == kFloat64 ? static_cast<const void*>(&kDouble[value]) : &kFloat[value];
}

int to_int(int64_t v) {
  LOOM_ASSERT(v >= 0 && v <= INT_MAX, "conv2d: ", v, " does not fit cuDNN's int");
  return static_cast<int>(v);
}

// ---------------------------------------------------------------- descriptors

struct ConvGeometry {
  int64_t n, c, h, w, o, cg, kh, kw, ho, wo;
  kernels::Conv2dOptions options;
  int64_t in_sample() const { return c * h * w; }
  int64_t out_sample() const { return o * ho * wo; }
};

ConvGeometry geometry(const Tensor& x, const Tensor& weight, const Shape& out_shape,
                      const kernels::Conv2dOptions& options) {
  return {x.size(0),      x.size(1),      x.size(2),      x.size(3),
          weight.size(0), weight.size(1), weight.size(2), weight.size(3),
          out_shape[2],   out_shape[3],   options};
}

// Samples per cuDNN call: every tensor of a chunk below 2^31 elements.
int64_t chunk_size(const ConvGeometry& g, const char* op) {
  const int64_t per_sample = std::max(g.in_sample(), g.out_sample());
  LOOM_CHECK(
      per_sample <= INT_MAX && g.o * g.cg * g.kh * g.kw <= INT_MAX, NotImplementedError, op,
      ": a sample or the weight holds 2^31 elements or more, more than cuDNN indexes; got x=[", g.n,
      ", ", g.c, ", ", g.h, ", ", g.w, "] weight=[", g.o, ", ", g.cg, ", ", g.kh, ", ", g.kw, "]");
  return std::clamp<int64_t>(INT_MAX / std::max<int64_t>(per_sample, 1), 1, g.n);
}

// The four cuDNN descriptors of one chunk of `n` samples.
class ConvDescriptors {
 public:
  ConvDescriptors(int device, const ConvGeometry& g, int64_t n, DType dtype, Layout layout,
                  cudnnMathType_t math)
      : device_(device) {
    try {
      set(g, n, dtype, layout, math);
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~ConvDescriptors() { destroy(); }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;

  void set_math(cudnnMathType_t math) {
    check(cudnnSetConvolutionMathType(conv_, math), "cudnnSetConvolutionMathType");
  }
  cudnnTensorDescriptor_t x() const { return x_; }
  cudnnTensorDescriptor_t y() const { return y_; }  // out in the forward, dout in the backward
  cudnnFilterDescriptor_t w() const { return w_; }
  cudnnConvolutionDescriptor_t conv() const { return conv_; }

 private:
  void set(const ConvGeometry& g, int64_t n, DType dtype, Layout layout, cudnnMathType_t math) {
    check(cudnnCreateTensorDescriptor(&x_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateTensorDescriptor(&y_), "cudnnCreateTensorDescriptor");
    check(cudnnCreateFilterDescriptor(&w_), "cudnnCreateFilterDescriptor");
    check(cudnnCreateConvolutionDescriptor(&conv_), "cudnnCreateConvolutionDescriptor");
    const cudnnTensorFormat_t format =
        layout == Layout::kNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    const cudnnDataType_t type = data_type(dtype);
    check(cudnnSetTensor4dDescriptor(x_, format, type, to_int(n), to_int(g.c), to_int(g.h),
                                     to_int(g.w)),
          "cudnnSetTensor4dDescriptor(x)");
    check(cudnnSetTensor4dDescriptor(y_, format, type, to_int(n), to_int(g.o), to_int(g.ho),
                                     to_int(g.wo)),
          "cudnnSetTensor4dDescriptor(out)");
    check(cudnnSetFilter4dDescriptor(w_, type, format, to_int(g.o), to_int(g.cg), to_int(g.kh),
                                     to_int(g.kw)),
          "cudnnSetFilter4dDescriptor");
    const kernels::Conv2dOptions& opt = g.options;
    check(cudnnSetConvolution2dDescriptor(conv_, to_int(opt.padding[0]), to_int(opt.padding[1]),
                                          to_int(opt.stride[0]), to_int(opt.stride[1]),
                                          to_int(opt.dilation[0]), to_int(opt.dilation[1]),
                                          CUDNN_CROSS_CORRELATION, compute_type(dtype)),
          "cudnnSetConvolution2dDescriptor");
    check(cudnnSetConvolutionGroupCount(conv_, to_int(opt.groups)),
          "cudnnSetConvolutionGroupCount");
    set_math(math);
    int on = 0, oc = 0, oh = 0, ow = 0;  // cuDNN's output shape must be loom's
    check(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &on, &oc, &oh, &ow),
          "cudnnGetConvolution2dForwardOutputDim");
    LOOM_ASSERT(on == n && oc == g.o && oh == g.ho && ow == g.wo, "conv2d: cuDNN output [", on,
                ", ", oc, ", ", oh, ", ", ow, "] differs from [", n, ", ", g.o, ", ", g.ho, ", ",
                g.wo, "]");
  }
  void destroy() {
    if (conv_) cudnnDestroyConvolutionDescriptor(conv_);
    if (w_) cudnnDestroyFilterDescriptor(w_);
    if (y_) cudnnDestroyTensorDescriptor(y_);
    if (x_) cudnnDestroyTensorDescriptor(x_);
    conv_ = nullptr, w_ = nullptr, y_ = nullptr, x_ = nullptr;
  }
  void check(cudnnStatus_t status, const char* call) const { check_cudnn(status, device_, call); }
  int device_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
};

// ---------------------------------------------------------------- algorithm choice

struct Candidate {
  int algo;          // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  size_t workspace;  // bytes
  cudnnMathType_t math;
};

using AlgoKey = std::array<int64_t, 15>;

AlgoKey algo_key(int device, Direction direction, DType dtype, Layout layout, cudnnMathType_t math,
                 bool deterministic, const ConvGeometry& g, int64_t n) {
  const auto [sh, sw] = g.options.stride;
  const auto [ph, pw] = g.options.padding;
  const auto [dh, dw] = g.options.dilation;
  // The deterministic preference, device, direction, dtype, layout and math fit one word.
  const int64_t kind = int64_t{deterministic} << 40 | int64_t{device} << 32 |
                       static_cast<int64_t>(direction) << 24 | static_cast<int64_t>(dtype) << 16 |
                       static_cast<int64_t>(layout) << 8 | static_cast<int64_t>(math);
  return {kind, n, g.c, g.h, g.w, g.o, g.kh, g.kw, sh, sw, ph, pw, dh, dw, g.options.groups};
}

std::mutex& cache_mutex() {
  static std::mutex* mutex = new std::mutex();
  return *mutex;
}
std::map<AlgoKey, std::vector<Candidate>>& algo_cache() {
  static auto* cache = new std::map<AlgoKey, std::vector<Candidate>>();
  return *cache;
}

// The heuristics' answer, filtered and ordered: with `deterministic`, deterministic algorithms
// first, each keeping cuDNN's ranking; without, cuDNN's ranking alone.
// workspace_size(algo, &bytes) asks for the exact workspace (with the descriptor's math set to the
// candidate's).
template <typename Perf, typename WorkspaceSize>
std::vector<Candidate> usable(const std::vector<Perf>& perf, int count, bool fma_only,
                              bool deterministic, ConvDescriptors& d,
                              WorkspaceSize&& workspace_size) {
  std::vector<Candidate> first, others;
  for (int i = 0; i < count; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (fma_only &&
        (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    // Without TF32 the math is pinned to FMA: a candidate reported with CUDNN_DEFAULT_MATH would
    // otherwise let cuDNN use TF32 on Ampere and Hopper.
    const cudnnMathType_t math = fma_only ? CUDNN_FMA_MATH : p.mathType;
    d.set_math(math);
    size_t bytes = 0;
    if (workspace_size(p.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    const Candidate c{static_cast<int>(p.algo), std::max(bytes, p.memory), math};
    const bool keep_first = p.determinism == CUDNN_DETERMINISTIC || !deterministic;
    (keep_first ? first : others).push_back(c);
  }
  first.insert(first.end(), others.begin(), others.end());
  return first;
}

std::vector<Candidate> rank_algorithms(Direction direction, cudnnHandle_t handle,
                                       ConvDescriptors& d, bool fma_only, bool deterministic,
                                       int device) {
  int max_count = 0, count = 0;
  std::vector<Candidate> result;
  switch (direction) {
    case Direction::kForward: {
      check_cudnn(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count), device,
                  "cudnnGetConvolutionForwardAlgorithmMaxCount");
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(std::max(max_count, 1));
      check_cudnn(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x(), d.w(), d.conv(), d.y(),
                                                         max_count, &count, perf.data()),
                  device, "cudnnGetConvolutionForwardAlgorithm_v7");
      result = usable(perf, count, fma_only, deterministic, d,
                      [&](cudnnConvolutionFwdAlgo_t algo, size_t* bytes) {
                        return cudnnGetConvolutionForwardWorkspaceSize(
                            handle, d.x(), d.w(), d.conv(), d.y(), algo, bytes);
                      });
      break;
    }
    case Direction::kBackwardData: {
      check_cudnn(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count), device,
                  "cudnnGetConvolutionBackwardDataAlgorithmMaxCount");
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(std::max(max_count, 1));
      check_cudnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.w(), d.y(), d.conv(), d.x(),
                                                              max_count, &count, perf.data()),
                  device, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
      result = usable(perf, count, fma_only, deterministic, d,
                      [&](cudnnConvolutionBwdDataAlgo_t algo, size_t* bytes) {
                        return cudnnGetConvolutionBackwardDataWorkspaceSize(
                            handle, d.w(), d.y(), d.conv(), d.x(), algo, bytes);
                      });
      break;
    }
    case Direction::kBackwardFilter: {
      check_cudnn(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count), device,
                  "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount");
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(std::max(max_count, 1));
      check_cudnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                      handle, d.x(), d.y(), d.conv(), d.w(), max_count, &count, perf.data()),
                  device, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
      result = usable(perf, count, fma_only, deterministic, d,
                      [&](cudnnConvolutionBwdFilterAlgo_t algo, size_t* bytes) {
                        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                            handle, d.x(), d.y(), d.conv(), d.w(), algo, bytes);
                      });
      break;
    }
  }
  return result;
}

// The cached candidates of a key, ranked on first use. Two threads meeting an unknown key may
// both rank it; the answers are the same.
std::vector<Candidate> candidates(const AlgoKey& key, Direction direction, cudnnHandle_t handle,
                                  ConvDescriptors& d, bool fma_only, bool deterministic,
                                  int device) {
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = algo_cache().find(key);
    if (it != algo_cache().end()) return it->second;
  }
  std::vector<Candidate> ranked =
      rank_algorithms(direction, handle, d, fma_only, deterministic, device);
  std::lock_guard<std::mutex> lock(cache_mutex());
  return algo_cache().emplace(key, std::move(ranked)).first->second;
}

// Moves a candidate to the end of its key's list: one whose workspace could not be had (later
// calls try the leaner ones first instead of emptying the allocator's cache again on every
// call), or one that cuDNN refused when run (later calls do not pay for the refusal first).
// The others keep their order, so the choice among them is what it was.
void demote(const AlgoKey& key, const Candidate& c) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = algo_cache().find(key);
  if (it == algo_cache().end()) return;
  std::stable_partition(it->second.begin(), it->second.end(), [&](const Candidate& other) {
    return other.algo != c.algo || other.math != c.math;
  });
}

// One direction of the convolution over the batch, chunk by chunk (Note [conv2d on cuDNN]).
// launch(descriptors, n0, algo, workspace, bytes, first_chunk) queues the cuDNN call of the
// chunk that starts at sample n0 and returns its status.
class ConvRunner {
 public:
  ConvRunner(const ConvGeometry& g, DType dtype, Layout layout, int device, const char* op)
      : g_(g),
        dtype_(dtype),
        layout_(layout),
        device_(device),
        op_(op),
        math_(requested_math(dtype)),
        fma_only_(math_ == CUDNN_FMA_MATH),
        deterministic_(cudnn_deterministic()),
        chunk_(chunk_size(g, op)),
        handle_(cudnn_handle(device)) {}

  // Whether cuDNN offers any algorithm for `direction` (checked on the first chunk's shape). A
  // heuristics call that fails for this layout counts as none: the caller then runs NCHW.
  bool supported(Direction direction) {
    try {
      ConvDescriptors d(device_, g_, chunk_, dtype_, layout_, math_);
      return !candidates(key(direction, chunk_), direction, handle_, d, fma_only_, deterministic_,
                         device_)
                  .empty();
    } catch (const DeviceError&) {
      return false;
    }
  }

  template <typename Launch>
  void run(Direction direction, Launch&& launch) {
    for (int64_t n0 = 0; n0 < g_.n; n0 += chunk_) {
      const int64_t count = std::min(chunk_, g_.n - n0);
      ConvDescriptors d(device_, g_, count, dtype_, layout_, math_);
      const std::vector<Candidate> list = candidates(key(direction, count), direction, handle_, d,
                                                     fma_only_, deterministic_, device_);
      LOOM_CHECK(!list.empty(), DeviceError, op_, ": cuDNN has no algorithm for ",
                 direction_name(direction), " on x=[", g_.n, ", ", g_.c, ", ", g_.h, ", ", g_.w,
                 "] weight=[", g_.o, ", ", g_.cg, ", ", g_.kh, ", ", g_.kw, "] (", dtype_, ", ",
                 layout_ == Layout::kNHWC ? "NHWC" : "NCHW", ") on cuda:", device_);
      std::string failed;  // the candidates that did not run, for the error
      for (size_t i = 0; i < list.size(); ++i) {
        const bool last = i + 1 == list.size();
        const Candidate& c = list[i];
        std::unique_ptr<Scratch> workspace;
        try {
          workspace = std::make_unique<Scratch>(c.workspace, device_);
        } catch (const DeviceError&) {  // out of memory: a leaner algorithm may fit
          if (last) throw;
          demote(key(direction, count), c);
          continue;
        }
        d.set_math(c.math);
        const cudnnStatus_t status = launch(d, n0, c.algo, workspace->get(), c.workspace, n0 == 0);
        // A failure moves on to the next candidate, as PyTorch's algorithm loop does: cuDNN 9
        // reports "not supported" as a category of detailed codes (_SHAPE, _LAYOUT, ...), and
        // some algorithms refuse a shape only when run. Any failure may, except in a
        // backward-filter chunk after the first: that one adds into dweight (beta 1), which a
        // failed run may have touched.
        const bool retry = CUDNN_STATUS_CATEGORY(status) == CUDNN_STATUS_NOT_SUPPORTED || n0 == 0 ||
                           direction != Direction::kBackwardFilter;
        if (status != CUDNN_STATUS_SUCCESS && !last && retry) {
          cudaGetLastError();  // a launch error left inside cuDNN is this candidate's, not the
                               // next's
          failed += detail::str(" algo ", c.algo, ": ", cudnnGetErrorString(status), ";");
          demote(key(direction, count), c);  // later calls try it last, not again first
          continue;
        }
        check_cudnn(status, device_, op_, ": ", direction_name(direction), "(algo ", c.algo,
                    ", workspace ", c.workspace, " bytes, ", dtype_, ")",
                    failed.empty() ? "" : "; before it,", failed);
        break;
      }
    }
  }

  cudnnHandle_t handle() const { return handle_; }

 private:
  AlgoKey key(Direction direction, int64_t n) const {
    return algo_key(device_, direction, dtype_, layout_, math_, deterministic_, g_, n);
  }

  const ConvGeometry& g_;
  DType dtype_;
  Layout layout_;
  int device_;
  const char* op_;
  cudnnMathType_t math_;
  bool fma_only_;
  bool deterministic_;  // read once per call: both directions of a call rank alike
  int64_t chunk_;
  cudnnHandle_t handle_;
};

// NHWC when x asks for it and cuDNN has algorithms for every direction needed, else NCHW.
Layout usable_layout(const Tensor& x, const ConvGeometry& g, int device, const char* op,
                     const std::vector<Direction>& directions) {
  const Layout layout = choose_layout(x);
  if (layout == Layout::kNCHW) return layout;
  ConvRunner runner(g, x.dtype(), layout, device, op);
  for (const Direction direction : directions)
    if (!runner.supported(direction)) return Layout::kNCHW;
  return layout;
}

// ---------------------------------------------------------------- bias kernels

// out[i] = (assign ? 0 : out[i]) + bias[channel of i], with channel = (i / inner) % channels
// (inner = Ho Wo in NCHW, 1 in NHWC). One thread per element, grid-stride, over out's dense
// storage.
template <typename T>
__global__ void add_bias_kernel(T* out, const T* bias, int64_t bias_stride, int64_t channels,
                                int64_t inner, int64_t n, bool assign) {
  using Acc = acc_t<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Acc b = static_cast<Acc>(bias[((i / inner) % channels) * bias_stride]);
    out[i] = T((assign ? Acc(0) : static_cast<Acc>(out[i])) + b);
  }
}

void add_bias(const Tensor& out, const Tensor& bias, Layout layout, bool assign) {
  const int64_t n = out.numel();
  const int64_t inner = layout == Layout::kNCHW ? out.size(2) * out.size(3) : 1;
  dispatch_cuda_floating(out.dtype(), "conv2d", [&]<typename T>() {
    add_bias_kernel<T><<<blocks_for(n), kThreads, 0, stream_of(out)>>>(
        static_cast<T*>(out.data()), static_cast<const T*>(bias.data()), bias.stride(0),
        out.size(1), inner, n, assign);
    check_launch("add_bias_kernel", out.device().index);
  });
}

constexpr int kBiasGradThreads = 256;

// dbias[o] = sum over n, h, w of dout[n, o, h, w], any strides. Block o takes channel o: thread
// t sums elements t, t + 256, ... in (n, h, w) order, then a fixed tree in shared memory adds
// the 256 partial sums: the same bits on every run.
template <typename T>
__global__ void bias_grad_kernel(const T* dout, int64_t stride_n, int64_t stride_c,
                                 int64_t stride_h, int64_t stride_w, int64_t batch, int64_t ho,
                                 int64_t wo, T* dbias) {
  using Acc = acc_t<T>;
  __shared__ Acc partial[kBiasGradThreads];
  const int64_t o = blockIdx.x, plane = ho * wo, total = batch * plane;
  const T* channel = dout + o * stride_c;
  Acc sum = 0;
  for (int64_t e = threadIdx.x; e < total; e += kBiasGradThreads) {
    const int64_t n = e / plane, p = e % plane;
    sum += static_cast<Acc>(channel[n * stride_n + (p / wo) * stride_h + (p % wo) * stride_w]);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int width = kBiasGradThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) dbias[o] = T(partial[0]);
}

void bias_grad(const Tensor& dout, const Tensor& dbias) {
  dispatch_cuda_floating(dout.dtype(), "conv2d_backward", [&]<typename T>() {
    bias_grad_kernel<T>
        <<<static_cast<unsigned>(dout.size(1)), kBiasGradThreads, 0, stream_of(dout)>>>(
            static_cast<const T*>(dout.data()), dout.stride(0), dout.stride(1), dout.stride(2),
            dout.stride(3), dout.size(0), dout.size(2), dout.size(3),
            static_cast<T*>(dbias.data()));
    check_launch("bias_grad_kernel", dout.device().index);
  });
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const kernels::Conv2dOptions& options) {
  const Shape out_shape = kernels::conv2d_output_shape(x, weight, bias, options);
  data_type(x.dtype(), "conv2d");
  const int device = x.device().index;
  DeviceGuard guard(device);
  const ConvGeometry g = geometry(x, weight, out_shape, options);
  const bool degenerate = x.numel() == 0 || weight.numel() == 0;
  if (shape_numel(out_shape) == 0 || degenerate) {
    Tensor out = empty_in(out_shape, x.dtype(), x.device(), choose_layout(x));
    // Every tap is padding (or there are no input channels): out = bias.
    if (bias.defined() && out.numel() > 0)
      add_bias(out, bias, choose_layout(x), /*assign=*/true);
    else
      zero(out);
    return kernels::contiguous(out, suggest_memory_format(x));  // float64 ran NCHW
  }
  const Layout layout = usable_layout(x, g, device, "conv2d", {Direction::kForward});
  Tensor out = empty_in(out_shape, x.dtype(), x.device(), layout);
  const Tensor xin = in_layout(x, layout), w = in_layout(weight, layout);
  const DType dtype = x.dtype();
  ConvRunner runner(g, dtype, layout, device, "conv2d");
  runner.run(Direction::kForward, [&](ConvDescriptors& d, int64_t n0, int algo, void* workspace,
                                      size_t bytes, bool) {
    return cudnnConvolutionForward(runner.handle(), scalar(dtype, 1), d.x(), sample(xin, n0), d.w(),
                                   w.data(), d.conv(), static_cast<cudnnConvolutionFwdAlgo_t>(algo),
                                   workspace, bytes, scalar(dtype, 0), d.y(), sample(out, n0));
  });
  // In 16 bits the product is rounded before the bias is added (in float32) and rounded again;
  // the CPU rounds once. The two differ by at most one 16-bit ulp.
  if (bias.defined()) add_bias(out, bias, layout, /*assign=*/false);
  // Ran NCHW for a channels-last x (float64, or no NHWC algorithm for this shape): the result
  // still takes x's format, so the layers after this one stay channels-last.
  return kernels::contiguous(out, suggest_memory_format(x));
}

kernels::Conv2dGrads conv2d_backward(const Tensor& dout, const Tensor& x, const Tensor& weight,
                                     const kernels::Conv2dOptions& options,
                                     std::array<bool, 3> needs) {
  data_type(x.dtype(), "conv2d_backward");
  const int device = x.device().index;
  DeviceGuard guard(device);
  const DType dtype = x.dtype();
  // dout has conv2d's output shape (kernels::conv2d_backward checked it).
  const ConvGeometry g = geometry(x, weight, dout.sizes(), options);
  const bool degenerate = x.numel() == 0 || weight.numel() == 0;
  std::vector<Direction> directions;
  if (needs[0]) directions.push_back(Direction::kBackwardData);
  if (needs[1]) directions.push_back(Direction::kBackwardFilter);
  const Layout layout = dout.numel() > 0 && !degenerate
                            ? usable_layout(x, g, device, "conv2d_backward", directions)
                            : choose_layout(x);

  kernels::Conv2dGrads grads;
  // dx takes x's format, also where the layout differs (float64 runs a channels-last x NCHW).
  const auto in_x_format = [&]() -> kernels::Conv2dGrads {
    if (grads.dx.defined()) grads.dx = kernels::contiguous(grads.dx, suggest_memory_format(x));
    return grads;
  };
  if (needs[0]) grads.dx = empty_in(x.sizes(), dtype, x.device(), layout);
  if (needs[1])
    grads.dweight = empty(weight.sizes(), dtype, x.device(), suggest_memory_format(weight));
  if (needs[2]) grads.dbias = empty({weight.size(0)}, dtype, x.device());
  if (dout.numel() == 0) {  // an empty batch: zero gradients, as the CPU
    zero(grads.dx);
    zero(grads.dweight);
    zero(grads.dbias);
    return in_x_format();
  }
  if (needs[2]) bias_grad(dout, grads.dbias);
  if (degenerate) {  // x and the weight meet only in padding: no gradient flows to them
    zero(grads.dx);
    zero(grads.dweight);
    return in_x_format();
  }
  if (!needs[0] && !needs[1]) return grads;

  const Tensor dy = in_layout(dout, layout);
  ConvRunner runner(g, dtype, layout, device, "conv2d_backward");
  if (needs[0]) {  // dx = the adjoint of the forward applied to dout
    const Tensor w = in_layout(weight, layout);
    Tensor& dx = grads.dx;
    runner.run(Direction::kBackwardData,
               [&](ConvDescriptors& d, int64_t n0, int algo, void* workspace, size_t bytes, bool) {
                 return cudnnConvolutionBackwardData(
                     runner.handle(), scalar(dtype, 1), d.w(), w.data(), d.y(), sample(dy, n0),
                     d.conv(), static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), workspace, bytes,
                     scalar(dtype, 0), d.x(), sample(dx, n0));
               });
  }
  if (needs[1]) {  // dweight = sum over the batch of dout correlated with x
    const Tensor xin = in_layout(x, layout);
    // cuDNN writes the filter gradient in the layout's filter format (KRSC for NHWC).
    Tensor dw = grads.dweight.is_contiguous(format_of(layout))
                    ? grads.dweight
                    : empty_in(weight.sizes(), dtype, x.device(), layout);
    runner.run(Direction::kBackwardFilter, [&](ConvDescriptors& d, int64_t n0, int algo,
                                               void* workspace, size_t bytes, bool first) {
      return cudnnConvolutionBackwardFilter(
          runner.handle(), scalar(dtype, 1), d.x(), sample(xin, n0), d.y(), sample(dy, n0),
          d.conv(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), workspace, bytes,
          scalar(dtype, first ? 0 : 1), d.w(), dw.data());
    });
    if (!dw.is_same(grads.dweight)) kernels::copy_(grads.dweight, dw);
  }
  return in_x_format();
}

}  // namespace loom::cuda
