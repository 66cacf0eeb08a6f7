// The model in stages, for one sequence: embedding, one transformer block, and the head (final
// norm, LM head, masked cross-entropy), each forward and backward. model.cpp composes them; a
// pipeline stage or an FSDP unit can run the same functions on its own layers and get the same
// bits.
#pragma once

#include <cstdint>
#include <vector>

#include "reference/batch.hpp"
#include "reference/config.hpp"
#include "reference/moe.hpp"
#include "reference/ops.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref {

struct StepContext {
  uint64_t seed = 0;  // with step, keys the dropout masks
  uint32_t step = 1;
  Recompute recompute = Recompute::kNone;
  // Gradients computed are those of
  //   token_weight * sum(masked token losses) + sequence_weight * sum(sequence aux losses).
  // The trainer passes 1 / (global mask count) and 1 / (global sequence count), so the gradient is
  // that of the global loss; a parallel implementation needs both global counts before backward.
  double token_weight = 1.0;
  double sequence_weight = 1.0;
};

struct SequenceLoss {
  std::vector<double> token_loss;  // [seq_len], 0 where loss_mask == 0
  double loss_sum = 0.0;
  int64_t tokens = 0;  // mask count
  double aux = 0.0;    // sum over MoE layers of alpha * E * sum_e f_e P_e
  int64_t moe_dropped = 0;
  std::vector<MoeLoad> moe_load;  // one per MoE layer, in layer order
};

// Everything a block's backward reads. Under selective recompute probs is dropped (block_backward
// recomputes it from q, k, v); under full recompute only x_in is kept and the rest is recomputed
// by calling block_forward again (keep_for_backward).
template <class T>
struct BlockCache {
  Tensor<T> x_in;
  std::vector<T> rstd1;
  Tensor<T> a, q, k, v, probs, o;  // q, k after RoPE; probs before dropout
  Tensor<T> x_mid;                 // x_in + attention output
  std::vector<T> rstd2;
  Tensor<T> b;  // RMSNorm(x_mid)
  MlpCache<T> mlp;
  MoeCache<T> moe;
};

template <class T>
struct HeadCache {
  Tensor<T> x;  // head input (last block's output)
  std::vector<T> rstd;
  Tensor<T> y;  // final-normed
  Tensor<T> logits;
};

// Checks that every field of the sequence has the same length.
void check_sequence(const Sequence& seq);

template <class T>
Tensor<T> embed_forward(const ParamMap<T>& params, const Sequence& seq);
template <class T>
void embed_backward(const Tensor<T>& dx, const Sequence& seq, ParamMap<T>& grads);

// x_out = x + Attn(RMSNorm(x)); x_out += MLP or MoE(RMSNorm(x_out)), for layer `layer`.
// Adds the layer's aux loss and dropped assignments into *loss (loss may be null: recompute).
template <class T>
Tensor<T> block_forward(const ModelConfig& cfg, const ParamMap<T>& params, int layer,
                        const Sequence& seq, const StepContext& ctx, const Tensor<T>& x,
                        BlockCache<T>& cache, SequenceLoss* loss);
// Drops from a forward's cache what `mode` recomputes: selective the attention probabilities,
// full everything but x_in.
template <class T>
void keep_for_backward(BlockCache<T>& cache, Recompute mode);

// dy: gradient w.r.t. the block output; returns the gradient w.r.t. its input. An empty
// cache.probs (selective recompute) is recomputed from cache.q, k, v first.
template <class T>
Tensor<T> block_backward(const ModelConfig& cfg, const ParamMap<T>& params, int layer,
                         const Sequence& seq, const StepContext& ctx, const BlockCache<T>& cache,
                         const Tensor<T>& dy, ParamMap<T>& grads);

// Final norm, LM head (tied: x . embed^T; untied: x . lm_head), per-token losses into *loss
// (required: a null loss throws std::logic_error).
template <class T>
void head_forward(const ModelConfig& cfg, const ParamMap<T>& params, const Sequence& seq,
                  const Tensor<T>& x, HeadCache<T>& cache, SequenceLoss* loss);
// Returns the gradient w.r.t. the head input; token weights from ctx (see StepContext). With a
// tied embedding and `tied`, the head's use of it adds into *tied instead of grads["embed.weight"].
template <class T>
Tensor<T> head_backward(const ModelConfig& cfg, const ParamMap<T>& params, const Sequence& seq,
                        const StepContext& ctx, const HeadCache<T>& cache, ParamMap<T>& grads,
                        Tensor<T>* tied = nullptr);

}  // namespace shardcheck::ref
