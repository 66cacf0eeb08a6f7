// What the GPU side of this machine offers: CUDA devices and the NCCL version. Lets tests and the
// CLI decide to run or skip with a clear message. The NCCL communicator itself builds on this.
#pragma once

#include <string>

namespace shardcheck::gpu {

struct DeviceInfo {
  int count = 0;         // visible CUDA devices (0 when the driver or a device is missing)
  std::string why_none;  // when count == 0: the CUDA error, for the skip message
  std::string name0;     // name of device 0
  int nccl_version = 0;  // e.g. 22803 for 2.28.3
};

DeviceInfo probe();

}  // namespace shardcheck::gpu
