// The bootstraps' rules that need no GPU (device selection per node-local rank, two processes on
// one GPU, argument checks before NCCL), and on a device: run_all_gpus leaves the caller's device
// as it found it and a single-rank init_rank works.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/errors.hpp"
#include "gpu/bootstrap.hpp"
#include "tests/gpu/support.hpp"

namespace shardcheck::gpu {
namespace {

std::string what_of(int local_rank, int visible) {
  try {
    device_for_local_rank(local_rank, visible);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(GpuBootstrap, EveryProcessSeesAllGpusDeviceIsLocalRank) {
  for (int r = 0; r < 8; ++r) EXPECT_EQ(device_for_local_rank(r, 8), r);
}

TEST(GpuBootstrap, OneVisibleGpuPerProcessIsDeviceZero) {
  // srun --gpus-per-task=1, or a wrapper setting CUDA_VISIBLE_DEVICES per process.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(device_for_local_rank(r, 1), 0);
}

TEST(GpuBootstrap, SeveralVisibleGpusPerProcessWrapAround) {
  // Two GPUs per task: local ranks 0..3 take 0, 1, 0, 1 of their own sets.
  EXPECT_EQ(device_for_local_rank(0, 2), 0);
  EXPECT_EQ(device_for_local_rank(1, 2), 1);
  EXPECT_EQ(device_for_local_rank(2, 2), 0);
  EXPECT_EQ(device_for_local_rank(3, 2), 1);
  // More processes than GPUs where each sees them all maps two ranks to one GPU (shared_device
  // catches it): the rule itself does not refuse.
  EXPECT_EQ(device_for_local_rank(5, 4), 1);
}

TEST(GpuBootstrap, NoVisibleDeviceNamesBothNumbers) {
  const std::string w = what_of(3, 0);
  EXPECT_NE(w.find("local rank 3"), std::string::npos) << w;
  EXPECT_NE(w.find("sees 0 CUDA devices"), std::string::npos) << w;
  EXPECT_FALSE(what_of(-1, 4).empty());
  EXPECT_FALSE(what_of(0, -1).empty());
}

TEST(GpuBootstrap, SharedDeviceFindsTheFirstPair) {
  using P = std::pair<int, int>;
  EXPECT_EQ(shared_device({}), P(-1, -1));
  EXPECT_EQ(shared_device({"0000:3b:00.0"}), P(-1, -1));
  EXPECT_EQ(shared_device({"0000:3b:00.0", "0000:5d:00.0", "0000:86:00.0"}), P(-1, -1));
  EXPECT_EQ(shared_device({"0000:3b:00.0", "0000:5d:00.0", "0000:3b:00.0", "0000:5d:00.0"}),
            P(0, 2));
  EXPECT_EQ(shared_device({"a", "b", "c", "b", "a"}), P(1, 3));
  // Unknown ids (a process that failed to read its own) never match.
  EXPECT_EQ(shared_device({"", "", "x"}), P(-1, -1));
}

TEST(GpuBootstrap, BusIdOfANonexistentDeviceThrows) {
  EXPECT_THROW(device_bus_id(-1), std::runtime_error);
}

TEST(GpuBootstrap, InitRankChecksArgumentsBeforeNccl) {
  const std::vector<char> id(NCCL_UNIQUE_ID_BYTES, '\0');
  EXPECT_THROW(init_rank(std::vector<char>(5), 1, 0, 0), comm::InvalidArgument);
  EXPECT_THROW(init_rank(id, 0, 0, 0), comm::InvalidArgument);
  EXPECT_THROW(init_rank(id, 2, 2, 0), comm::InvalidArgument);
  EXPECT_THROW(init_rank(id, 2, -1, 0), comm::InvalidArgument);
  EXPECT_THROW(init_rank(id, 1, 0, -1), comm::InvalidArgument);
}

TEST(GpuBootstrap, RunAllGpusRefusesMoreRanksThanDevices) {
  const int have = visible_devices();
  EXPECT_THROW(run_all_gpus(have + 1, [](NcclCommunicator&) {}, {}), std::runtime_error);
}

TEST(GpuBootstrap, RunAllGpusRestoresTheCallersDevice) {
  SC_REQUIRE_GPU();
  const int n = visible_devices();
  const int mine = n - 1 > 0 ? n - 2 : 0;  // not the last device, which the init loop ends on
  ASSERT_EQ(cudaSetDevice(mine), cudaSuccess);
  std::atomic<int> wrong{0};
  NcclOptions o;
  o.timeout = std::chrono::seconds(60);
  run_all_gpus(
      n,
      [&](NcclCommunicator& c) {
        int d = -1;
        // Each rank's thread is bound to its own device.
        if (cudaGetDevice(&d) != cudaSuccess || d != c.device() || d != c.rank()) ++wrong;
      },
      o);
  EXPECT_EQ(wrong.load(), 0);
  int now = -1;
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, mine);
}

TEST(GpuBootstrap, SingleRankInitRank) {
  SC_REQUIRE_GPU();
  NcclOptions o;
  o.timeout = std::chrono::seconds(60);
  const auto comm = init_rank(new_unique_id(), 1, 0, 0, o);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->device(), 0);
}

}  // namespace
}  // namespace shardcheck::gpu
