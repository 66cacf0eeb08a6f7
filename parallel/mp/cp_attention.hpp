// Context-parallel attention: causal, document-masked GQA attention over a sequence whose rows are
// spread over the CP ranks with causal load balancing (TokenLayout::cp_rows), in two algorithms.
//
// ring:    K/V blocks (with their global row ids, known to every rank from the layout) travel
//          around the CP ring in cp-1 send/recv hops; each rank accumulates its queries' output
//          with an online softmax (running max, sum and weighted values; dropout scales the value
//          accumulator, not the normaliser). Query/key chunk pairs that the causal mask hides
//          entirely are skipped, but every rank keeps the same communication pattern. Backward is
//          flash-attention style: the saved log-sum-exp gives the probabilities back, D_i =
//          dout_i . o_i replaces the row sum of p * dp (exact with dropout too), and K/V circulate
//          again together with dK/dV accumulators that take one more hop home to their owner.
// ulysses: all_to_all turns [local rows, all local heads] into [all S rows, heads / cp] (q) and
//          [S, kv_heads / cp] (k, v), the reference attention runs on the full sequence for those
//          heads, and a second all_to_all brings the output back; backward likewise.
//
// Both reproduce ref::attention_forward / attention_backward on the full sequence, restricted to
// this CP rank's rows, with the reference's dropout mask (keyed by the global head and rows). On a
// CP group of one either is the reference's attention itself, bit for bit (and keeps its
// probabilities for backward).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/mp/meta.hpp"
#include "parallel/mp/tokens.hpp"
#include "parallel/testing.hpp"
#include "reference/attention.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// CpAlgo and its names: parallel/config.hpp.

// The attention kernel without CP, or with Ulysses: the engine's own, which keeps the s x s
// probabilities, or flash (costs.hpp's flash_forward: the scores computed again inside the
// backward). Only a timing-only (Meta, meta.hpp) run takes flash: the numeric one refuses it.
enum class AttentionKernel : std::uint8_t { engine, flash };

// The ring's message tags (cp_ring.cpp): K/V blocks in the forward and in the backward, and the
// dK/dV accumulators that travel with them.
inline constexpr int kRingKvForwardTag = 71;
inline constexpr int kRingKvBackwardTag = 72;
inline constexpr int kRingDkvTag = 73;

// What cp_attention_backward needs from the forward of the same rank.
template <class T>
struct CpAttentionCache {
  CpAlgo algo = CpAlgo::ring;
  AttentionKernel kernel = AttentionKernel::engine;
  testing::Mutation planted = testing::Mutation::kNone;  // tests: kRingDiagonalUnmasked
  ref::AttentionShape shape;      // local (TP) head counts, as passed to forward
  ref::AttentionDropout dropout;  // as passed to forward
  int64_t seq_len = 0;
  int64_t head_dim = 0;
  // chunks[r] = layout.cp_chunks(r), every CP rank; rows[r] = layout.cp_rows(r) (a numeric run's:
  // its kernels and copies read them).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> chunks;
  std::vector<std::vector<int64_t>> rows;
  std::vector<int32_t> doc_ids;  // [S]
  // ring: this rank's q [n, heads*d], k, v [n, kv_heads*d], o [n, heads*d] and the log-sum-exp of
  // each (local head, local row), [heads * n].
  // ulysses: the full-sequence q, k, v of this rank's head shard (global row order).
  ref::Tensor<T> q, k, v, o;
  std::vector<T> lse;
  // ulysses: the head shard's shape and dropout, and its pre-dropout probabilities [h/cp, S, S].
  ref::AttentionShape sub_shape;
  ref::AttentionDropout sub_dropout;
  ref::Tensor<T> probs;
};

// q [n, heads*d], k and v [n, kv_heads*d]: this CP rank's rows (n = layout.cp_row_count(), rows =
// layout.cp_rows(cp.rank()); layout.sp() is ignored), RoPE applied. shape: the local head counts.
// doc_ids: the whole sequence's [S]. dropout: head_offset / total_heads as set by a TP caller.
// Returns o [n, heads*d] = those rows of ref::attention_forward on the full sequence. Collective
// over cp. Throws LayoutError when layout.cp() != cp.size(), when the shapes do not match the
// layout, or (ulysses) when heads or kv_heads is not divisible by cp; std::invalid_argument when
// a numeric run is asked for the flash kernel.
template <class T>
ref::Tensor<T> cp_attention_forward(comm::Communicator& cp, CpAlgo algo, const TokenLayout& layout,
                                    const ref::Tensor<T>& q, const ref::Tensor<T>& k,
                                    const ref::Tensor<T>& v, std::span<const int32_t> doc_ids,
                                    ref::AttentionShape shape, const ref::AttentionDropout& dropout,
                                    CpAttentionCache<T>& cache,
                                    testing::Mutation planted = testing::Mutation::kNone,
                                    AttentionKernel kernel = AttentionKernel::engine);

// dout [n, heads*d] for the local rows; writes dq [n, heads*d], dk, dv [n, kv_heads*d]: the local
// rows of the reference's full-sequence gradients (dK/dV contributions of other ranks' queries are
// sent back to the owner). Collective over cp, the same group as the forward. Throws LayoutError
// when dout is not [n, heads*d] or the group's size differs from the forward's.
template <class T>
void cp_attention_backward(comm::Communicator& cp, const ref::Tensor<T>& dout,
                           const CpAttentionCache<T>& cache, ref::Tensor<T>& dq, ref::Tensor<T>& dk,
                           ref::Tensor<T>& dv);

}  // namespace shardcheck::parallel
