// dist/powersgd.cpp — the PowerSGD communication hook (Note [PowerSGD], powersgd.h).

#include "dist/powersgd.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "autograd/graph.h"
#include "tensor/copy.h"
#include "tensor/elementwise.h"
#include "tensor/linalg.h"
#include "tensor/random.h"

namespace loom::dist {

namespace k = kernels;

Tensor powersgd_initial_q(uint64_t seed, uint64_t draw, int64_t m, int64_t r) {
  LOOM_CHECK(m > 0 && r > 0, ShapeError, "powersgd_initial_q: expected a positive size; got ", m,
             " x ", r);
  Tensor q = empty({m, r}, kFloat64);
  double* v = q.data_ptr<double>();
  for (int64_t i = 0; i < m * r; ++i) {  // Box-Muller on two 53-bit uniforms
    const auto bits = philox4x32(seed, static_cast<uint64_t>(i), draw);
    const double u1 = uniform_double(bits[0], bits[1]), u2 = uniform_double(bits[2], bits[3]);
    v[i] = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  orthonormalize_columns(q);
  return q;
}

void orthonormalize_columns(const Tensor& matrix, double epsilon) {
  LOOM_CHECK(matrix.dim() == 2, ShapeError, "orthonormalize_columns: expected a matrix; got sizes ",
             matrix.sizes());
  const int64_t n = matrix.size(0), r = matrix.size(1);
  Tensor a = k::to_dtype(k::to_device(matrix, kCPU), kFloat64);
  if (a.is_alias_of(matrix) || !a.is_contiguous()) a = k::clone(a);
  double* v = a.data_ptr<double>();
  for (int64_t i = 0; i < r; ++i) {
    double norm = 0;
    for (int64_t row = 0; row < n; ++row) norm += v[row * r + i] * v[row * r + i];
    norm = std::sqrt(norm) + epsilon;
    const double scale = norm > 0 ? 1.0 / norm : 0.0;
    for (int64_t row = 0; row < n; ++row) v[row * r + i] *= scale;
    for (int64_t j = i + 1; j < r; ++j) {
      double dot = 0;
      for (int64_t row = 0; row < n; ++row) dot += v[row * r + i] * v[row * r + j];
      for (int64_t row = 0; row < n; ++row) v[row * r + j] -= dot * v[row * r + i];
    }
  }
  k::copy_(matrix, a);
}

PowerSGDHook::PowerSGDHook(PowerSGDOptions options) : options_(options) {
  LOOM_CHECK(options_.matrix_approximation_rank >= 1, ValueError,
             "powersgd_hook: matrix_approximation_rank must be at least 1; got ",
             options_.matrix_approximation_rank);
  LOOM_CHECK(options_.min_compression_rate > 0 && options_.orthogonalization_epsilon >= 0,
             ValueError, "powersgd_hook: min_compression_rate must be positive and ",
             "orthogonalization_epsilon non-negative; got ", options_.min_compression_rate, " and ",
             options_.orthogonalization_epsilon);
  LOOM_CHECK(
      options_.start_powersgd_iter >= 2 || !(options_.use_error_feedback || options_.warm_start),
      ValueError, "powersgd_hook: with error feedback or warm start, start_powersgd_iter ",
      "must be 2 or more (the buckets are rebuilt after the first iteration); got ",
      options_.start_powersgd_iter);
}

std::string PowerSGDHook::name() const {
  return "powersgd(rank " + std::to_string(options_.matrix_approximation_rank) + ")";
}

namespace {

// One gradient of a bucket as PowerSGD sees it: its span of the buffer, as an n x m matrix
// when it is compressed, and where its factors lie in the flat P and Q.
struct Piece {
  int64_t offset = 0, numel = 0, n = 0, m = 0, r = 0;
  int64_t p_at = 0, q_at = 0;  // compressed
  int64_t u_at = 0;            // uncompressed: where in the flat uncompressed buffer
  bool compressed = false;
};

}  // namespace

PendingReduction PowerSGDHook::start(ProcessGroup& group, GradBucket& bucket) {
  NoGradGuard no_grad;
  const Tensor buffer = bucket.buffer;
  const bool compress = iterations_ >= options_.start_powersgd_iter;
  // The step's counts, published at its last bucket.
  auto count = [this, &bucket, &buffer](int64_t sent) {
    sending_ += sent;
    counting_ += buffer.numel();
    if (!bucket.is_last()) return;
    ++iterations_;
    sent_ = sending_;
    total_ = counting_;
    sending_ = counting_ = 0;
  };
  if (!compress) {
    count(buffer.numel());
    return {group.allreduce(buffer, ReduceOp::Sum), nullptr, nullptr, false};
  }

  BucketState& state = state_[bucket.index];
  if (options_.use_error_feedback) {
    if (state.error.defined())
      k::add_(buffer, state.error);
    else
      state.error = zeros(buffer.sizes(), buffer.dtype(), buffer.device());
  }
  const Tensor input = options_.use_error_feedback ? k::clone(buffer) : Tensor();

  // Which gradients are compressed, and where everything goes.
  std::vector<Piece> pieces;
  int64_t p_size = 0, q_size = 0, u_size = 0;
  for (size_t i = 0; i < bucket.gradients.size(); ++i) {
    const Tensor& g = bucket.gradients[i];
    Piece piece;
    piece.offset = bucket.offsets[i];
    piece.numel = g.numel();
    if (g.dim() > 1 && g.numel() > 0) {
      piece.n = g.size(0);
      piece.m = g.numel() / piece.n;
      piece.r = std::min<int64_t>({piece.n, piece.m, options_.matrix_approximation_rank});
      piece.compressed =
          static_cast<double>(piece.n) * static_cast<double>(piece.m) >=
          options_.min_compression_rate * static_cast<double>((piece.n + piece.m) * piece.r);
    }
    if (piece.compressed) {
      piece.p_at = p_size;
      piece.q_at = q_size;
      p_size += piece.n * piece.r;
      q_size += piece.m * piece.r;
    } else {
      piece.u_at = u_size;
      u_size += piece.numel;
    }
    pieces.push_back(piece);
  }
  count(p_size + q_size + u_size);

  auto matrix = [buffer](const Piece& p) {
    return buffer.narrow(0, p.offset, p.numel).view({p.n, p.m});
  };
  auto factor = [](const Tensor& flat, int64_t at, int64_t rows, int64_t r) {
    return flat.narrow(0, at, rows * r).view({rows, r});
  };

  // The Qs: the last step's with warm start, else fresh (the same draws on every rank).
  const bool fresh = !options_.warm_start || !state.q.defined() || state.q.numel() != q_size;
  if (fresh) state.q = empty({q_size}, buffer.dtype(), buffer.device());
  const Tensor q = state.q;
  if (fresh)
    for (const Piece& p : pieces)
      if (p.compressed)
        k::copy_(factor(q, p.q_at, p.m, p.r),
                 powersgd_initial_q(options_.random_seed, draws_++, p.m, p.r));

  Tensor uncompressed = empty({u_size}, buffer.dtype(), buffer.device());
  Tensor p_flat = empty({p_size}, buffer.dtype(), buffer.device());
  for (const Piece& p : pieces)
    if (p.compressed)
      k::mm_out(factor(p_flat, p.p_at, p.n, p.r), matrix(p), factor(q, p.q_at, p.m, p.r));
    else
      k::copy_(uncompressed.narrow(0, p.u_at, p.numel), buffer.narrow(0, p.offset, p.numel));
  auto u_work = group.allreduce(uncompressed, ReduceOp::Sum);
  auto p_work = group.allreduce(p_flat, ReduceOp::Sum);

  const double epsilon = options_.orthogonalization_epsilon;
  const bool error_feedback = options_.use_error_feedback;
  Tensor error = state.error;
  const int ranks = group.size();
  // After the two allreduces: orthonormalise the Ps, form and allreduce the Qs. After that:
  // the approximations and the uncompressed averages into the buffer, and the new error.
  auto second = [&group, pieces, matrix, factor, buffer, input, error, uncompressed, u_work, p_flat,
                 q, epsilon, error_feedback, ranks] {
    u_work->wait();
    for (const Piece& p : pieces)
      if (p.compressed) {
        const Tensor pm = factor(p_flat, p.p_at, p.n, p.r);
        orthonormalize_columns(pm, epsilon);
        k::mm_out(factor(q, p.q_at, p.m, p.r), matrix(p).t(), pm);
      }
    PendingReduction last{group.allreduce(q, ReduceOp::Sum), nullptr, nullptr, true};
    last.finish = [pieces, matrix, factor, buffer, input, error, uncompressed, p_flat, q,
                   error_feedback, ranks] {
      for (const Piece& p : pieces)
        if (p.compressed)
          k::mm_out(matrix(p), factor(p_flat, p.p_at, p.n, p.r), factor(q, p.q_at, p.m, p.r).t(),
                    1.0 / ranks);
        else
          k::copy_(buffer.narrow(0, p.offset, p.numel), uncompressed.narrow(0, p.u_at, p.numel));
      // The uncompressed gradients: the sum, then the average, in place in the buffer.
      for (const Piece& p : pieces)
        if (!p.compressed) k::mul_scalar_(buffer.narrow(0, p.offset, p.numel), 1.0 / ranks);
      if (error_feedback) {
        k::copy_(error, input);
        k::sub_(error, buffer);
      }
    };
    return last;
  };
  return {std::move(p_work), nullptr, std::move(second), false};
}

std::shared_ptr<PowerSGDHook> powersgd_hook(PowerSGDOptions options) {
  return std::make_shared<PowerSGDHook>(options);
}

}  // namespace loom::dist
