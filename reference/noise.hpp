// The rounding noise of a reordered reduction, put everywhere at once: a Compute that runs the CPU
// loops of the reductions (matmuls forward and backward, RMSNorm, attention) and then moves every
// nonzero element of every result, and every gradient they accumulate into, by one unit in the
// last place, up or down by a seeded coin per element (GELU, cross-entropy and the ops that never
// go through a Compute are left as they are). A distributed configuration computes the
// reference's sums in another order (partial sums over TP, CP, DP or microbatches), so each of its
// results may round to a neighbour of the reference's; this Compute makes every result do so. The
// reference trained under it shows how far the scenario's training amplifies one rounding per
// result, which is what parity's bounds are scaled by (harness/README.md "Parity bounds").
#pragma once

#include <cstdint>
#include <string>

#include "reference/compute.hpp"

namespace shardcheck::ref {

// One per thread and run: the coins follow the order of the calls (not synchronised).
class RoundingNoise final : public Compute {
 public:
  explicit RoundingNoise(uint64_t seed) : seed_(seed) {}
  std::string name() const override { return "rounding-noise"; }

#define SHARDCHECK_NOISE_OPS(T)                                                                    \
  bool linear_forward(const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y) override;              \
  bool linear_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& dx, \
                       Tensor<T>& dw) override;                                                    \
  bool linear_t_forward(const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y) override;            \
  bool linear_t_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,              \
                         Tensor<T>& dx, Tensor<T>& dw) override;                                   \
  bool rmsnorm_forward(const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y, std::vector<T>* rstd) \
      override;                                                                                    \
  bool rmsnorm_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,               \
                        const std::vector<T>& rstd, Tensor<T>& dx, Tensor<T>& dw) override;        \
  bool attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,               \
                         std::span<const int32_t> doc_ids, AttentionShape shape,                   \
                         const AttentionDropout& dropout, Tensor<T>& o, Tensor<T>* probs)          \
      override;                                                                                    \
  bool attention_backward(const Tensor<T>& dout, const Tensor<T>& q, const Tensor<T>& k,           \
                          const Tensor<T>& v, AttentionShape shape,                                \
                          const AttentionDropout& dropout, const Tensor<T>& probs, Tensor<T>& dq,  \
                          Tensor<T>& dk, Tensor<T>& dv) override;
  SHARDCHECK_NOISE_OPS(double)
  SHARDCHECK_NOISE_OPS(float)
#undef SHARDCHECK_NOISE_OPS

  // Moves each nonzero element of t one ulp up or down (the coin of this call and element index).
  template <class T>
  void jitter(Tensor<T>& t);
  // The same for each element the op accumulated into (t != before): the sum moves one ulp.
  template <class T>
  void jitter_increment(Tensor<T>& t, const Tensor<T>& before);

 private:
  bool coin(std::size_t i) const;
  uint64_t seed_;
  uint64_t call_ = 0;
};

}  // namespace shardcheck::ref
