// tests/dist/job_test.cpp — the LOCAL_RANK -> GPU map of a machine's ranks, and its refusal of
// two nccl ranks on one GPU (no GPU is needed: the map is arithmetic on the visible count).

#include "dist/job.h"

#include <gtest/gtest.h>

#include <string>

#include "tensor/error.h"

namespace {

using loom::dist::local_rank_devices;

TEST(LocalRankDevices, EachLocalRankTakesTheNextVisibleGpu) {
  EXPECT_EQ(local_rank_devices(4, 4, "nccl"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(local_rank_devices(2, 8, "nccl"), (std::vector<int>{0, 1}));
  // gloo stages through host memory: ranks may share a GPU.
  EXPECT_EQ(local_rank_devices(4, 2, "gloo"), (std::vector<int>{0, 1, 0, 1}));
}

TEST(LocalRankDevices, TwoNcclRanksOnOneGpuAreRefusedWithTheMap) {
  try {
    local_rank_devices(2, 1, "nccl");
    FAIL() << "two nccl ranks on one GPU were accepted";
  } catch (const loom::ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("LOCAL_RANK 0 -> cuda:0, LOCAL_RANK 1 -> cuda:0"), std::string::npos)
        << what;
    EXPECT_NE(what.find("--backend gloo"), std::string::npos) << what;
    EXPECT_NE(what.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << what;
  }
  EXPECT_THROW(local_rank_devices(0, 1, "nccl"), loom::ValueError);
}

}  // namespace
