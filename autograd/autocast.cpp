// autograd/autocast.cpp — the region state (one per thread, as grad mode) and the cast cache
// of Note [The cast cache].

#include "autograd/autocast.h"

#include <map>
#include <tuple>
#include <utility>

#include "autograd/graph.h"
#include "autograd/ops/view.h"

namespace loom::autocast {

namespace {

struct CachedCast {
  Tensor source;  // holds the parameter, so its address cannot be reused while cached
  uint64_t version = 0;
  Tensor cast;
};

struct State {
  bool enabled = false;
  DType dtype = kBFloat16;
  int depth = 0;  // guards alive, enabled or not
  std::map<std::tuple<const void*, DType, MemoryFormat>, CachedCast> cache;
};

thread_local State state;

bool is_low_candidate(const Tensor& t) {
  return t.defined() &&
         (t.dtype() == kFloat32 || (is_16bit_float(t.dtype()) && t.dtype() != state.dtype));
}

}  // namespace

Guard::Guard(DType dtype, bool enabled)
    : previous_enabled_(state.enabled), previous_dtype_(state.dtype) {
  LOOM_CHECK(is_16bit_float(dtype), ValueError,
             "autocast: the region's dtype must be float16 or bfloat16; got ", dtype);
  state.enabled = enabled;
  state.dtype = dtype;
  ++state.depth;
}

Guard::~Guard() {
  state.enabled = previous_enabled_;
  state.dtype = previous_dtype_;
  if (--state.depth == 0) state.cache.clear();
}

bool is_enabled() { return state.enabled; }
DType dtype() { return state.dtype; }
size_t cached_casts() { return state.cache.size(); }

bool needs_low(std::initializer_list<Tensor> operands) {
  if (!state.enabled) return false;
  for (const Tensor& t : operands)
    if (is_low_candidate(t)) return true;
  return false;
}

Tensor to_low(const Tensor& x) { return x.defined() ? to_low(x, suggest_memory_format(x)) : x; }

Tensor to_low(const Tensor& x, MemoryFormat format) {
  if (!state.enabled || !is_low_candidate(x)) return x;
  const bool cacheable = x.is_leaf() && x.requires_grad() && autograd::grad_enabled();
  if (!cacheable) return loom::to(x, state.dtype, format);
  CachedCast& entry = state.cache[{x.unsafe_impl(), state.dtype, format}];
  if (!entry.cast.defined() || entry.version != x.version()) {
    entry = {x, x.version(), loom::to(x, state.dtype, format)};
  }
  return entry.cast;
}

bool needs_float32(std::initializer_list<Tensor> operands) {
  if (!state.enabled) return false;
  for (const Tensor& t : operands)
    if (t.defined() && is_16bit_float(t.dtype())) return true;
  return false;
}

bool widens_on_cpu(std::initializer_list<Tensor> operands) {
  if (!state.enabled) return false;
  for (const Tensor& t : operands)
    if (t.defined() && is_16bit_float(t.dtype()) && t.device().is_cpu()) return true;
  return false;
}

Tensor to_float32(const Tensor& x) {
  if (!state.enabled || !x.defined() || !is_16bit_float(x.dtype())) return x;
  return loom::to(x, kFloat32);
}

}  // namespace loom::autocast
