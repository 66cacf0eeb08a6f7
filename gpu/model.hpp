// The reference model's dense forward + backward for one sequence on one GPU, op for op as
// reference/blocks.cpp (embedding, blocks with RMSNorm, Q/K/V, RoPE, attention with dropout, the
// MLP, final norm, tied or untied head, masked cross-entropy), built from gpu/ops.hpp. Parameters
// are uploaded once; gradients accumulate on the device as ref::forward_backward adds into its
// grads. MoE layers are not on the GPU yet (the constructor throws std::invalid_argument).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu/ops.hpp"
#include "reference/blocks.hpp"
#include "reference/config.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::gpu {

template <class T>
class GpuModel {
 public:
  GpuModel(const ref::ModelConfig& cfg, const ref::ParamMap<T>& params, int device = 0);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  // Forward (and backward when `backward`, adding into the device gradients with ctx's token
  // weight) of one sequence. Returns its losses like ref::SequenceLoss (token_loss, loss_sum,
  // tokens).
  ref::SequenceLoss step(const ref::Sequence& seq, const ref::StepContext& ctx, bool backward);
  // The accumulated gradients, same names and shapes as the parameters.
  ref::ParamMap<T> grads() const;
  void zero_grads();
  // The bf16 recipe's per-microbatch step (reference/trainer.cpp): every accumulated gradient
  // rounded to bf16 in place (ops::round_to_bf16). GpuModel<float> only (else
  // std::invalid_argument); the weights given to the constructor are the caller's to round.
  void round_grads_to_bf16();
  ops::Context& context() { return *ctx_; }

 private:
  T* param(const std::string& name) const;
  T* grad(const std::string& name) const;
  T* alloc(std::size_t n);

  ref::ModelConfig cfg_;
  ref::ParamMap<T> shapes_;  // names and shapes only (zeros)
  std::unique_ptr<ops::Context> ctx_;
  std::map<std::string, T*> params_, grads_;
  std::vector<void*> allocations_;
};

}  // namespace shardcheck::gpu
