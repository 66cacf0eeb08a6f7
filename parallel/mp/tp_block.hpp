// One transformer block, the embedding and the head for one sequence on one rank of a TP x CP x EP
// sub-mesh (Megatron-Core layout): column-parallel wq/wk/wv and w_up, row-parallel wo and w_down,
// so each sublayer needs one reduction (all_reduce over TP, or with sequence parallelism an
// all_gather before and a reduce_scatter after, on the row axis); attention heads split over TP
// (heads % tp == 0 and kv_heads % tp == 0: rank t holds query heads [t*a/tp, (t+1)*a/tp) and kv
// heads [t*kv/tp, (t+1)*kv/tp), which is exactly the kv heads its query heads use); attention over
// the CP rank's rows by cp_attention (ring or Ulysses); MoE layers by ep_moe (experts not split
// over TP); vocab-parallel embedding and LM head with a parallel cross-entropy.
//
// Parameters are looked up by their global names in a map of LOCAL slices (see mesh_params.hpp).
// Activations are this rank's rows: layout.rows(cp rank, tp rank) ([n, h]).
//
// Instantiated for double and float (the numeric engine) and for Meta<double> and Meta<float>
// (meta.hpp: the planner's timing-only run, the same collectives and compute reports on shapes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/mp/cp_attention.hpp"
#include "parallel/mp/ep_moe.hpp"
#include "parallel/mp/tokens.hpp"
#include "parallel/mp/vocab_parallel.hpp"
#include "parallel/testing.hpp"
#include "reference/batch.hpp"
#include "reference/blocks.hpp"
#include "reference/config.hpp"
#include "reference/ops.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// What one rank needs to run its part of a block: groups (size-1 groups where an axis is off),
// the token layout and the model split.
struct BlockEnv {
  const ref::ModelConfig* model = nullptr;
  comm::Communicator* tp = nullptr;
  comm::Communicator* cp = nullptr;
  comm::Communicator* ep = nullptr;
  const TokenLayout* layout = nullptr;
  CpAlgo cp_algo = CpAlgo::ring;
  // A timing-only run's (Meta, meta.hpp) attention kernel and MoE routing assumption; a numeric
  // run refuses flash and routes its data.
  AttentionKernel attention = AttentionKernel::engine;
  MoeRouting moe_routing = MoeRouting::uniform;
  // Internal use (tests): a known bug planted in the block (parallel/testing.hpp).
  testing::Mutation planted = testing::Mutation::kNone;
  // ep_moe_backward's part_of_source (empty: one part). With parts, mp_block_backward adds the
  // expert gradients into its expert_parts maps, one per part, instead of grads.
  std::vector<int> ep_part_of_source;

  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
  bool sp() const { return layout->sp() && tp->size() > 1; }
  int local_heads() const { return model->heads / tp_size(); }
  // kv_heads % tp == 0: a 1/tp share; tp > kv_heads: the one kv head this rank's query heads read.
  int local_kv_heads() const { return std::max(1, model->kv_heads / tp_size()); }
  std::vector<int64_t> rows() const { return layout->rows(cp->rank(), tp->rank()); }
  std::vector<int64_t> cp_rows() const { return layout->cp_rows(cp->rank()); }
};

template <class T>
struct MpBlockCache {
  ref::Tensor<T> x_in;
  std::vector<T> rstd1;
  ref::Tensor<T> a, a_full, q, k, v, o;  // a_full: the CP rank's rows (SP: gathered)
  CpAttentionCache<T> attn;
  ref::Tensor<T> x_mid;
  std::vector<T> rstd2;
  ref::Tensor<T> b, b_full;
  ref::MlpCache<T> mlp;
  EpMoeCache<T> moe;
};

template <class T>
struct MpHeadCache {
  ref::Tensor<T> x;
  std::vector<T> rstd;
  ref::Tensor<T> y_full;  // final-normed, the CP rank's rows
  VocabHeadCache<T> vocab;
};

// Per-sequence loss pieces a rank counts (the mesh engine sums them over the world once).
struct MpSequenceLoss {
  double loss_sum = 0.0;  // over this rank's CP rows (identical on every TP rank)
  double aux = 0.0;       // the sequence's aux over this rank's MoE layers (identical on the
                          // ranks holding the sequence)
  int64_t dropped = 0;
};

// x_out for this rank's rows. loss may be null.
template <class T>
ref::Tensor<T> mp_embed_forward(const BlockEnv& env, const ref::ParamMap<T>& params,
                                const ref::Sequence& seq);
template <class T>
void mp_embed_backward(const BlockEnv& env, const ref::Sequence& seq, const ref::Tensor<T>& dx,
                       ref::ParamMap<T>& grads);

template <class T>
ref::Tensor<T> mp_block_forward(const BlockEnv& env, const ref::ParamMap<T>& params, int layer,
                                const ref::Sequence& seq, const ref::StepContext& ctx,
                                const ref::Tensor<T>& x, MpBlockCache<T>& cache,
                                MpSequenceLoss* loss);
template <class T>
ref::Tensor<T> mp_block_backward(const BlockEnv& env, const ref::ParamMap<T>& params, int layer,
                                 const ref::Sequence& seq, const ref::StepContext& ctx,
                                 const MpBlockCache<T>& cache, const ref::Tensor<T>& dy,
                                 ref::ParamMap<T>& grads,
                                 std::vector<ref::ParamMap<T>>* expert_parts = nullptr);

template <class T>
void mp_head_forward(const BlockEnv& env, const ref::ParamMap<T>& params, const ref::Sequence& seq,
                     const ref::Tensor<T>& x, MpHeadCache<T>& cache, MpSequenceLoss* loss);
// token_weight: StepContext::token_weight (global 1 / mask count).
template <class T>
ref::Tensor<T> mp_head_backward(const BlockEnv& env, const ref::ParamMap<T>& params,
                                const ref::Sequence& seq, double token_weight,
                                const MpHeadCache<T>& cache, ref::ParamMap<T>& grads);

// Selective recompute keeps no attention probabilities for the backward, which computes them
// again (cp_attention_backward).
template <class T>
void drop_selective(MpBlockCache<T>& c, ref::Recompute recompute) {
  if (recompute == ref::Recompute::kSelective) c.attn.probs = ref::Tensor<T>{};
}

// The RoPE positions of the CP rank's rows: seq.positions at each global row (planted bug
// kCpRopeChunkOffset: the row's offset from the start of its CP chunk).
std::vector<int32_t> cp_positions(const BlockEnv& env, const ref::Sequence& seq);

}  // namespace shardcheck::parallel
