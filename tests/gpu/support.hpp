// Helpers for the GPU tests: skip without a device, world sizes to try, device vectors.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/bootstrap.hpp"
#include "gpu/device.hpp"

namespace shardcheck::gpu::testing {

// GTEST_SKIP() from the calling test when no CUDA device is visible.
#define SC_REQUIRE_GPU()                                                                \
  do {                                                                                  \
    const ::shardcheck::gpu::DeviceInfo sc_info_ = ::shardcheck::gpu::probe();          \
    if (sc_info_.count == 0)                                                            \
      GTEST_SKIP() << "no GPU here (" << sc_info_.why_none                              \
                   << "); GPU tests run where a device is present (scripts/gpu-check)"; \
  } while (false)

// World sizes to test: 1 .. visible devices (at most 8).
inline std::vector<int> world_sizes() {
  std::vector<int> s;
  const int n = std::min(visible_devices(), 8);
  for (int i = 1; i <= n; ++i) s.push_back(i);
  return s;
}

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device array of T on the current device, filled from / read back to host vectors.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(std::size_t n) : n_(n) {
    void* raw = nullptr;
    cuda_ok(cudaMalloc(&raw, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
    p_ = static_cast<T*>(raw);
  }
  explicit DeviceVec(const std::vector<T>& h) : DeviceVec(h.size()) { upload(h); }
  ~DeviceVec() { cudaFree(p_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;

  // cudaMemcpy/cudaMemset run on the legacy default stream, which the communicators' and ops'
  // non-blocking streams do not wait for (and a pageable upload may return before its DMA ends):
  // synchronise, so the data is in place before any other stream reads it.
  void upload(const std::vector<T>& h) {
    cuda_ok(cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    cuda_ok(cudaDeviceSynchronize(), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    cuda_ok(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  // Every byte 0xFF: NaN for floats, -1 for integers. Catches elements an op never wrote.
  void poison() {
    cuda_ok(cudaMemset(p_, 0xFF, n_ * sizeof(T)), "cudaMemset");
    cuda_ok(cudaDeviceSynchronize(), "poison");
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  std::size_t size() const { return n_; }
  comm::Buffer buf(int device) {
    return {p_, n_, comm::dtype_v<T>, {comm::DeviceKind::cuda, device}};
  }
  comm::ConstBuffer cbuf(int device) const {
    return {p_, n_, comm::dtype_v<T>, {comm::DeviceKind::cuda, device}};
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace shardcheck::gpu::testing
