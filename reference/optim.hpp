// AdamW with bias correction and decoupled weight decay (2-D weights only), the warmup + cosine
// learning-rate schedule, and clipping by the global L2 norm. Optimizer state is per parameter
// name, so ZeRO/FSDP can hold any slice of it; this file knows nothing about sharding.
#pragma once

#include <cstdint>

#include "reference/config.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref {

// step is 1-based. step <= warmup: lr * step / warmup. After: min_lr + (lr - min_lr) *
// 0.5 * (1 + cos(pi * (step - warmup) / (total_steps - warmup))), so the last step uses min_lr.
double lr_at(const OptimizerConfig& opt, int step, int total_steps);

// sqrt(sum of squares of every gradient element), accumulated in f64 in parameter order.
template <class T>
double global_grad_norm(const ParamMap<T>& grads);

// The clipping rule: max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1.
double clip_factor(double norm, double max_norm);

// If max_norm > 0 and norm > max_norm, scales every gradient by max_norm / (norm + 1e-6), the
// factor computed in f64 and each g replaced by T(double(g) * factor). Returns the factor applied
// (1 when not clipped). Not exactly PyTorch's clip_grad_norm_, which always multiplies by
// min(1, max_norm / (norm + 1e-6)): the two differ only for max_norm - 1e-6 < norm <= max_norm,
// where PyTorch scales by a factor in (1 - 1e-6 / max_norm, 1) and this leaves the gradients alone
// (see README "Optimizer and schedule").
template <class T>
double clip_grad_norm(ParamMap<T>& grads, double norm, double max_norm);

template <class T>
class AdamW {
 public:
  AdamW(const OptimizerConfig& opt, const ParamMap<T>& params);

  // One update with learning rate lr: p *= (1 - lr * wd) [rank 2 only]; m = b1 m + (1 - b1) g;
  // v = b2 v + (1 - b2) g^2; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
  void step(ParamMap<T>& params, const ParamMap<T>& grads, double lr);

  int steps_taken() const { return t_; }
  // Replaces the moments and the update count (checkpoint restore); names and shapes must match.
  void restore(ParamMap<T> exp_avg, ParamMap<T> exp_avg_sq, int steps_taken);
  const ParamMap<T>& exp_avg() const { return m_; }
  const ParamMap<T>& exp_avg_sq() const { return v_; }

 private:
  OptimizerConfig opt_;
  ParamMap<T> m_;
  ParamMap<T> v_;
  int t_ = 0;
};

}  // namespace shardcheck::ref
