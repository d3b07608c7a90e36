// tests/cuda/upload_cuda_test.cpp — cuda::Uploader (Note [Uploading batches]): batches reach the
// GPU whole and in order through a ring of pinned buffers, whatever their sizes and layouts, and
// a CPU "upload" is the tensor itself. The GPU tests skip without one.

#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/copy.h"
#include "tensor/cuda/upload.h"
#include "tensor/view.h"

namespace loom::test {
namespace {

TEST(Uploader, OnTheCpuItIsTheTensorItself) {
  cuda::Uploader upload;
  const Tensor t = randn({3, 4});
  EXPECT_TRUE(upload(t, kCPU).is_same(t));
  EXPECT_LOOM_ERROR(cuda::Uploader(0), ValueError, {"Uploader", "0"});
}

TEST(Uploader, BatchesArriveWholeAndInOrder) {
  LOOM_SKIP_WITHOUT_GPU();
  cuda::Uploader upload(2);  // a short ring: slots are reused every other upload
  std::vector<Tensor> sources, uploaded;
  for (int i = 0; i < 9; ++i) {
    // Growing and shrinking sizes, float32 images and int64 labels, like a loader's batches.
    const int64_t n = 1 + (i * 37) % 200;
    sources.push_back(i % 2 ? randint(0, 10, {n}) : randn({n, 3, 8, 8}));
    uploaded.push_back(upload(sources.back(), kCuda0));
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    ASSERT_TRUE(uploaded[i].is_cuda());
    EXPECT_TRUE(cuda_matches_cpu(uploaded[i], sources[i], 0, 0)) << i;
  }
}

TEST(Uploader, TheSourceCanChangeAtOnceAndLayoutsAreKept) {
  LOOM_SKIP_WITHOUT_GPU();
  cuda::Uploader upload;
  const Tensor source = randn({64, 32});
  const Tensor expected = source.clone();
  const Tensor on_gpu = upload(source, kCuda0);
  kernels::fill_(source, 0.0);  // the bytes were taken before upload returned
  EXPECT_TRUE(cuda_matches_cpu(on_gpu, expected, 0, 0));

  const Tensor transposed = kernels::transpose(expected, 0, 1);
  EXPECT_TRUE(cuda_matches_cpu(upload(transposed, kCuda0), transposed.contiguous(), 0, 0));
  EXPECT_TRUE(cuda_matches_cpu(upload(zeros({0, 5}), kCuda0), zeros({0, 5}), 0, 0));
  EXPECT_LOOM_ERROR(upload(on_gpu, kCuda0), DeviceError, {"Uploader", "[64, 32]"});
}

// A batch asked for channels-last arrives channels-last with the same values; on the CPU the
// Uploader only reorders.
TEST(Uploader, ChannelsLastBatches) {
  const Tensor images = randn({8, 3, 5, 6});
  cuda::Uploader upload;
  const Tensor on_cpu = upload(images, kCPU, MemoryFormat::kChannelsLast);
  EXPECT_EQ(suggest_memory_format(on_cpu), MemoryFormat::kChannelsLast);
  EXPECT_TRUE(tensors_close(on_cpu, images, 0, 0));
  LOOM_SKIP_WITHOUT_GPU();
  for (const Tensor& source : {images, images.contiguous(MemoryFormat::kChannelsLast)}) {
    const Tensor on_gpu = upload(source, kCuda0, MemoryFormat::kChannelsLast);
    EXPECT_EQ(suggest_memory_format(on_gpu), MemoryFormat::kChannelsLast);
    EXPECT_TRUE(cuda_matches_cpu(on_gpu, images, 0, 0));
  }
}

}  // namespace
}  // namespace loom::test
