// Mixture-of-experts layer for one routing group (one sequence): softmax router, top-k with ties to
// the lower expert, renormalised gates, per-expert capacity with first-choices-first assignment,
// drops over capacity, and the Switch load-balancing aux loss. Not expert parallelism
// (parallel/ep).
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "reference/ops.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref {

struct MoeSpec {
  int experts = 1;
  int top_k = 1;
  double capacity_factor = 1.0;
  double aux_coef = 0.0;  // alpha
};

// C = ceil(capacity_factor * s * top_k / experts), s = the sequence length including padding.
// Computed as std::ceil(x - 1e-9) in f64 so an exact product is not pushed up by rounding.
int64_t moe_capacity(const MoeSpec& spec, int64_t s);

// Routing decisions of one sequence; enough to rebuild dispatch/combine in expert parallelism.
struct MoeRouting {
  std::vector<int32_t> choice;  // [s * k], expert of token t's c-th choice (-1: token not routed)
  std::vector<uint8_t> kept;    // [s * k], 1 if the assignment fit within capacity
  std::vector<double> f;        // [E], fraction of routed choices per expert (before capacity)
  int64_t routed_tokens = 0;    // tokens with doc_id >= 0
  int64_t dropped = 0;          // assignments over capacity
};

// Expert load of one MoE layer over some sequences: per expert, the assignments routed to it (top-k
// choices of non-padding tokens, before capacity) and those kept within capacity.
struct MoeLoad {
  int layer = 0;
  std::vector<int64_t> routed;  // [E]
  std::vector<int64_t> kept;    // [E]
  int64_t dropped() const;      // sum(routed) - sum(kept)
  void add(const MoeRouting& r);
  // Adds another count of the same layer and expert count (throws std::invalid_argument otherwise).
  void merge(const MoeLoad& other);
  bool operator==(const MoeLoad&) const = default;
};
// Adds `from` into `into` layer by layer (both in layer order; an empty `into` takes `from`).
void merge_loads(std::vector<MoeLoad>& into, const std::vector<MoeLoad>& from);

template <class T>
struct MoeCache {
  Tensor<T> probs;      // [s, E] router softmax
  std::vector<T> gate;  // [s * k] renormalised gates
  MoeRouting routing;
  std::vector<std::vector<int64_t>> rows;  // per expert: tokens assigned, in assignment order
  std::vector<Tensor<T>> in;               // per expert: gathered inputs [n_e, h]
  std::vector<Tensor<T>> out;              // per expert: outputs [n_e, h]
  std::vector<MlpCache<T>> mlp;
};

// x [s, h]; tokens with doc_ids[t] < 0 (padding) are not routed and output zero. Returns y [s, h]
// and writes the sequence's aux loss alpha * E * sum_e f_e * P_e into *aux. w_gate (dw_gate) is
// empty for GELU experts, one per expert for SwiGLU ones.
template <class T>
Tensor<T> moe_forward(const Tensor<T>& x, std::span<const int32_t> doc_ids, const Tensor<T>& router,
                      const std::vector<const Tensor<T>*>& w_gate,
                      const std::vector<const Tensor<T>*>& w_up,
                      const std::vector<const Tensor<T>*>& w_down, const MoeSpec& spec,
                      std::type_identity_t<MoeCache<T>>* cache, double* aux);

// aux_weight scales the aux loss's gradient (the trainer passes 1 / global sequence count).
template <class T>
Tensor<T> moe_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& router,
                       const std::vector<const Tensor<T>*>& w_gate,
                       const std::vector<const Tensor<T>*>& w_up,
                       const std::vector<const Tensor<T>*>& w_down, const MoeSpec& spec,
                       const MoeCache<T>& cache, double aux_weight, Tensor<T>& drouter,
                       const std::vector<Tensor<T>*>& dw_gate, const std::vector<Tensor<T>*>& dw_up,
                       const std::vector<Tensor<T>*>& dw_down);

}  // namespace shardcheck::ref
