// GPU probing: NCCL is linked and reports 2.x; device tests skip with the reason when none exists.
#include <gtest/gtest.h>

#include "gpu/device.hpp"

namespace shardcheck::gpu {
namespace {

TEST(Gpu, NcclIsLinkedAndReportsItsVersion) {
  const DeviceInfo d = probe();
  EXPECT_GE(d.nccl_version, 20000) << "NCCL version code " << d.nccl_version;
}

TEST(Gpu, DeviceIsUsableWhenPresent) {
  const DeviceInfo d = probe();
  if (d.count == 0)
    GTEST_SKIP() << "no GPU here (" << d.why_none << "); GPU checks run where a device is lent";
  EXPECT_FALSE(d.name0.empty());
}

}  // namespace
}  // namespace shardcheck::gpu
