// Device and NCCL probing through the CUDA runtime; never throws, so callers can skip cleanly.
#include "gpu/device.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace shardcheck::gpu {

DeviceInfo probe() {
  DeviceInfo info;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.why_none = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    count = 0;
    (void)cudaGetLastError();  // the failed probe must not surface as a later call's error
  } else if (count == 0) {
    info.why_none = "no CUDA device is visible";
  }
  info.count = count;
  if (count > 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      info.name0 = prop.name;
    else
      (void)cudaGetLastError();
  }
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess) info.nccl_version = v;
  return info;
}

}  // namespace shardcheck::gpu
