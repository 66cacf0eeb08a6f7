// Where the reference ops run. By default on the CPU: the plain loops of ops.cpp and attention.cpp.
// A thread may install another implementation of the heavy ops (gpu/'s DeviceCompute: cuBLAS GEMMs
// and CUDA kernels; a test's fake); every ref:: op that thread calls then runs there, whoever calls
// it: the reference model, or one rank of a parallel/ strategy (each simulator rank is a thread;
// an NCCL rank is a process under mpirun, a thread in the one-process mode). So the same strategy
// code computes on a GPU without knowing it, and parity against the CPU reference still holds
// within the precision's tolerance (a device sums in another order: equal within rounding, not
// bitwise).
//
// Each op returns true when it computed the result, false to let the CPU loops run (a type, size
// or op the implementation does not cover). Outputs arrive allocated with their final shape and
// zero-filled; backward ops ADD into parameter gradients (dw) exactly as the CPU ops do. Ops not
// listed here (embedding, RoPE, MoE routing, the SwiGLU activation, the optimizer) always run on
// the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "reference/attention.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref {

template <class T>
class ComputeOps {
 public:
  virtual ~ComputeOps() = default;
  // y = x . w, w [in, out]
  virtual bool linear_forward(const Tensor<T>& /*x*/, const Tensor<T>& /*w*/, Tensor<T>& /*y*/) {
    return false;
  }
  // dx = dy . w^T; dw += x^T . dy
  virtual bool linear_backward(const Tensor<T>& /*dy*/, const Tensor<T>& /*x*/,
                               const Tensor<T>& /*w*/, Tensor<T>& /*dx*/, Tensor<T>& /*dw*/) {
    return false;
  }
  // y = x . w^T, w [out, in]
  virtual bool linear_t_forward(const Tensor<T>& /*x*/, const Tensor<T>& /*w*/, Tensor<T>& /*y*/) {
    return false;
  }
  // dx = dy . w; dw += dy^T . x
  virtual bool linear_t_backward(const Tensor<T>& /*dy*/, const Tensor<T>& /*x*/,
                                 const Tensor<T>& /*w*/, Tensor<T>& /*dx*/, Tensor<T>& /*dw*/) {
    return false;
  }
  // y = rmsnorm(x) * w; rstd (may be null) receives 1/sqrt(mean(x^2) + eps) per row.
  virtual bool rmsnorm_forward(const Tensor<T>& /*x*/, const Tensor<T>& /*w*/, Tensor<T>& /*y*/,
                               std::vector<T>* /*rstd*/) {
    return false;
  }
  virtual bool rmsnorm_backward(const Tensor<T>& /*dy*/, const Tensor<T>& /*x*/,
                                const Tensor<T>& /*w*/, const std::vector<T>& /*rstd*/,
                                Tensor<T>& /*dx*/, Tensor<T>& /*dw*/) {
    return false;
  }
  virtual bool gelu_forward(const Tensor<T>& /*x*/, Tensor<T>& /*y*/) { return false; }
  virtual bool gelu_backward(const Tensor<T>& /*dy*/, const Tensor<T>& /*x*/, Tensor<T>& /*dx*/) {
    return false;
  }
  // loss[r] = logsumexp(logits[r]) - logits[r][target[r]], 0 where mask[r] == 0 (loss sized rows).
  virtual bool cross_entropy_forward(const Tensor<T>& /*logits*/,
                                     std::span<const int32_t> /*targets*/,
                                     std::span<const int32_t> /*mask*/,
                                     std::vector<double>& /*loss*/) {
    return false;
  }
  virtual bool cross_entropy_backward(const Tensor<T>& /*logits*/,
                                      std::span<const int32_t> /*targets*/,
                                      std::span<const double> /*weight*/, Tensor<T>& /*dlogits*/) {
    return false;
  }
  // As ref::attention_forward: o [s, heads*d]; probs (may be null) [heads, s, s] pre-dropout.
  virtual bool attention_forward(const Tensor<T>& /*q*/, const Tensor<T>& /*k*/,
                                 const Tensor<T>& /*v*/, std::span<const int32_t> /*doc_ids*/,
                                 AttentionShape /*shape*/, const AttentionDropout& /*dropout*/,
                                 Tensor<T>& /*o*/, Tensor<T>* /*probs*/) {
    return false;
  }
  // As ref::attention_backward: overwrites dq, dk, dv.
  virtual bool attention_backward(const Tensor<T>& /*dout*/, const Tensor<T>& /*q*/,
                                  const Tensor<T>& /*k*/, const Tensor<T>& /*v*/,
                                  AttentionShape /*shape*/, const AttentionDropout& /*dropout*/,
                                  const Tensor<T>& /*probs*/, Tensor<T>& /*dq*/, Tensor<T>& /*dk*/,
                                  Tensor<T>& /*dv*/) {
    return false;
  }
};

// One implementation for both precisions the reference computes in (f64, and f32 which the bf16
// recipe also uses).
class Compute : public ComputeOps<double>, public ComputeOps<float> {
 public:
  ~Compute() override = default;
  virtual std::string name() const = 0;
  template <class T>
  ComputeOps<T>& ops() {
    return *this;
  }
  // Ops this implementation computed, and ops it handed back to the CPU loops (counted by the
  // ops' hooks, so a run can show it really computed here).
  int64_t ops_run() const { return run_; }
  int64_t ops_declined() const { return declined_; }

 private:
  template <class T, class F>
  friend bool on_device(F&& op);
  int64_t run_ = 0;
  int64_t declined_ = 0;
};

// The calling thread's implementation; nullptr: the CPU loops.
Compute* thread_compute();

// Installs `compute` (may be null: the CPU) on the calling thread for the scope's lifetime and
// restores the previous one after. Not owning.
class ComputeScope {
 public:
  explicit ComputeScope(Compute* compute);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  Compute* previous_;
};

// For the ops: calls op(ComputeOps<T>&) on the thread's implementation, if any; true when it
// computed the result (the op then returns it), false when the CPU loops must run.
template <class T, class F>
bool on_device(F&& op) {
  Compute* c = thread_compute();
  if (c == nullptr) return false;
  const bool done = op(c->template ops<T>());
  ++(done ? c->run_ : c->declined_);
  return done;
}

}  // namespace shardcheck::ref
