// RoPE and causal, document-masked, grouped-query attention with optional dropout on the attention
// probabilities, forward and backward. The Q/K/V and output projections are in blocks.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "reference/config.hpp"
#include "reference/rng.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref {

// Rotates pair j of every head of x [s, heads*d] by angle positions[t] * rope.frequencies(d)[j],
// the pair being channels (2j, 2j+1) (interleaved) or (j, j + d/2) (half) of the head. inverse =
// true rotates by the negative angle, which is the backward of the forward rotation.
template <class T>
void rope_apply(Tensor<T>& x, std::span<const int32_t> positions, int heads, bool inverse,
                const RopeConfig& rope);

// Dropout on attention probabilities: element (head, i, j) of sequence `sequence` (its index in the
// global batch) is kept iff uniform >= rate, drawn from stream "dropout/layers.<layer>" at `step`
// with index ((sequence * heads + head) * s + i) * s + j. Kept values are scaled by 1/(1 - rate).
// A head-sharded (TP) caller sets head_offset (global index of its first head) and total_heads
// (the model's query heads; 0 means the local heads are all of them) so its masks match.
struct AttentionDropout {
  double rate = 0.0;
  uint64_t seed = 0;
  int layer = 0;
  uint32_t step = 0;
  int64_t sequence = 0;
  int head_offset = 0;
  int total_heads = 0;
};

// The dropout multipliers of one (layer, step, sequence), with the RNG stream (a hash of
// "dropout/layers.<layer>") built once: use this in loops. scale(head, i, j) is the multiplier of
// probability (global head, i, j) in a sequence of length s: 0 if dropped, 1 / (1 - rate) if kept,
// 1 when rate == 0. total_heads is the model's query head count.
class AttentionDropoutMask {
 public:
  AttentionDropoutMask(const AttentionDropout& dropout, int total_heads, int64_t s);
  double scale(int64_t head, int64_t i, int64_t j) const;

 private:
  AttentionDropout cfg_;
  RngStream rng_;
  int total_heads_;
  int64_t s_;
};

// One element's multiplier, as AttentionDropoutMask(dropout, total_heads, s).scale(head, i, j).
// It rebuilds the stream on every call: fine for a spot check, not for a loop over elements.
double attention_dropout_scale(const AttentionDropout& dropout, int total_heads, int64_t s,
                               int64_t head, int64_t i, int64_t j);

struct AttentionShape {
  int heads = 1;
  int kv_heads = 1;
};

// q [s, heads*d], k and v [s, kv_heads*d] (RoPE already applied). Key j is visible to query i iff
// j <= i and doc_ids[j] == doc_ids[i]. probs (if given) receives the pre-dropout probabilities
// [heads, s, s]. Returns o [s, heads*d].
template <class T>
Tensor<T> attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                            std::span<const int32_t> doc_ids, AttentionShape shape,
                            const AttentionDropout& dropout,
                            std::type_identity_t<Tensor<T>>* probs = nullptr);

template <class T>
void attention_backward(const Tensor<T>& dout, const Tensor<T>& q, const Tensor<T>& k,
                        const Tensor<T>& v, AttentionShape shape, const AttentionDropout& dropout,
                        const Tensor<T>& probs, Tensor<T>& dq, Tensor<T>& dk, Tensor<T>& dv);

}  // namespace shardcheck::ref
