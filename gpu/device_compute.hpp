// DeviceCompute: the reference's heavy ops (reference/compute.hpp) on one CUDA device, through
// gpu/ops (cuBLAS GEMMs, kernels for the rest). Install it on a thread with
//   gpu::DeviceCompute dc(0); ref::ComputeScope scope(&dc);
// and every ref:: linear / rmsnorm / gelu / cross-entropy / attention that thread calls (the
// reference model, one simulator rank of a parallel/ strategy) runs on the device.
//
// Each op copies its host tensors to device scratch (grow-only buffers owned by the object, on the
// ops::Context's stream), runs the gpu::ops kernel, copies the outputs back and synchronises: a
// correctness path (f32/f64 parity with the CPU within rounding), not a fast one. Backward ops
// that add into dw upload dw first and download the sum.
//
// An op returns false (the CPU loops run) where the device op has a limit: any dimension 0 (an
// empty shard, an expert with no tokens), a GEMM dimension over INT_MAX, an attention row over
// the kernels' shared memory (see kMaxAttentionRowBytes) and shapes the CPU op would reject.
// CUDA and cuBLAS errors throw std::runtime_error naming the op and the error.
//
// One object per thread at a time (it owns one stream and one cuBLAS handle); it may move between
// threads: every op first binds its device (cudaSetDevice) on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "reference/compute.hpp"

namespace shardcheck::gpu {

// The attention kernels keep one probability row in dynamic shared memory next to 32 elements of
// static shared memory; both must fit the default 48 KiB per block.
inline constexpr std::size_t kMaxAttentionRowBytes = 48 * 1024 - 32 * sizeof(double);

#define SC_DEVICE_COMPUTE_OPS(T)                                                                   \
  bool linear_forward(const ref::Tensor<T>& x, const ref::Tensor<T>& w, ref::Tensor<T>& y)         \
      override;                                                                                    \
  bool linear_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x, const ref::Tensor<T>& w, \
                       ref::Tensor<T>& dx, ref::Tensor<T>& dw) override;                           \
  bool linear_t_forward(const ref::Tensor<T>& x, const ref::Tensor<T>& w, ref::Tensor<T>& y)       \
      override;                                                                                    \
  bool linear_t_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x,                        \
                         const ref::Tensor<T>& w, ref::Tensor<T>& dx, ref::Tensor<T>& dw)          \
      override;                                                                                    \
  bool rmsnorm_forward(const ref::Tensor<T>& x, const ref::Tensor<T>& w, ref::Tensor<T>& y,        \
                       std::vector<T>* rstd) override;                                             \
  bool rmsnorm_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x,                         \
                        const ref::Tensor<T>& w, const std::vector<T>& rstd, ref::Tensor<T>& dx,   \
                        ref::Tensor<T>& dw) override;                                              \
  bool gelu_forward(const ref::Tensor<T>& x, ref::Tensor<T>& y) override;                          \
  bool gelu_backward(const ref::Tensor<T>& dy, const ref::Tensor<T>& x, ref::Tensor<T>& dx)        \
      override;                                                                                    \
  bool cross_entropy_forward(const ref::Tensor<T>& logits, std::span<const int32_t> targets,       \
                             std::span<const int32_t> mask, std::vector<double>& loss) override;   \
  bool cross_entropy_backward(const ref::Tensor<T>& logits, std::span<const int32_t> targets,      \
                              std::span<const double> weight, ref::Tensor<T>& dlogits) override;   \
  bool attention_forward(const ref::Tensor<T>& q, const ref::Tensor<T>& k,                         \
                         const ref::Tensor<T>& v, std::span<const int32_t> doc_ids,                \
                         ref::AttentionShape shape, const ref::AttentionDropout& dropout,          \
                         ref::Tensor<T>& o, ref::Tensor<T>* probs) override;                       \
  bool attention_backward(const ref::Tensor<T>& dout, const ref::Tensor<T>& q,                     \
                          const ref::Tensor<T>& k, const ref::Tensor<T>& v,                        \
                          ref::AttentionShape shape, const ref::AttentionDropout& dropout,         \
                          const ref::Tensor<T>& probs, ref::Tensor<T>& dq, ref::Tensor<T>& dk,     \
                          ref::Tensor<T>& dv) override;

class DeviceCompute final : public ref::Compute {
 public:
  // Binds `device` on the calling thread and creates the stream and cuBLAS handle there; throws
  // std::runtime_error when the device cannot be used.
  explicit DeviceCompute(int device = 0);
  ~DeviceCompute() override;
  DeviceCompute(const DeviceCompute&) = delete;
  DeviceCompute& operator=(const DeviceCompute&) = delete;

  std::string name() const override;  // "cuda:<device> (<device name>)"
  int device() const { return device_; }

  SC_DEVICE_COMPUTE_OPS(double)
  SC_DEVICE_COMPUTE_OPS(float)

  struct Impl;  // the ops::Context and the scratch buffers (device_compute.cpp)

 private:
  int device_;
  std::string name_;
  std::unique_ptr<Impl> impl_;
};

#undef SC_DEVICE_COMPUTE_OPS

}  // namespace shardcheck::gpu
