// tests/dist/ddp_fixtures.h — what the data-parallel tests share: a small network with every kind
// of layer the reducer meets, each step's global batch (a function of the step alone), a rank's
// share of it, and the comparison of two models' parameters.
#pragma once

#include <memory>
#include <utility>

#include "loom.h"
#include "test_util.h"

namespace loom::test {

struct SmallNetOptions {
  int64_t channels = 4;  // the convolution's output channels
  int64_t hidden = 6;    // the first linear layer's outputs
  DType dtype = kFloat64;
  bool batch_norm = false;
};

// conv 2 -> channels (3x3), [batch norm], ReLU, flatten, linear -> hidden, ReLU, linear -> 3;
// initialised from `seed`. Takes [N, 2, 5, 5].
inline std::shared_ptr<nn::Sequential> small_net(uint64_t seed, const SmallNetOptions& o = {}) {
  manual_seed(seed);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(nn::make<nn::Conv2d>(2, o.channels, 3));
  if (o.batch_norm) net->push_back(nn::make<nn::BatchNorm2d>(o.channels));
  net->push_back(nn::make<nn::ReLU>());
  net->push_back(nn::make<nn::Flatten>());
  net->push_back(nn::make<nn::Linear>(o.channels * 3 * 3, o.hidden));
  net->push_back(nn::make<nn::ReLU>());
  net->push_back(nn::make<nn::Linear>(o.hidden, 3));
  net->to(o.dtype);
  return net;
}

// The global batch of step s: 8 samples and their labels in [0, 3), drawn from a generator of
// their own (the default generator is left as it was).
inline std::pair<Tensor, Tensor> global_batch(int step, DType dtype = kFloat64) {
  Generator g(100 + static_cast<uint64_t>(step));
  const Generator::State saved = default_generator().state();
  default_generator().set_state(g.state());
  Tensor x = randn({8, 2, 5, 5}, dtype);
  Tensor y = randint(0, 3, {8});
  default_generator().set_state(saved);
  return {x, y};
}

// Rank r of W takes samples [r n, (r + 1) n), n = 8 / W.
inline std::pair<Tensor, Tensor> share(const std::pair<Tensor, Tensor>& batch, int rank,
                                       int world) {
  const int64_t n = batch.first.size(0) / world;
  return {batch.first.narrow(0, rank * n, n).contiguous(),
          batch.second.narrow(0, rank * n, n).contiguous()};
}

inline void expect_same_parameters(nn::Module& a, nn::Module& b, double tol) {
  const NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(tensors_close(pa[i].second.to(kCPU), pb[i].second.to(kCPU), tol, tol))
        << pa[i].first;
}

}  // namespace loom::test
