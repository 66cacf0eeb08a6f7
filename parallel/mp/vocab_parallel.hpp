// Tensor parallelism (Megatron-style) over the vocabulary: the embedding table and the LM head are
// split by vocab rows/columns, and the cross-entropy is computed from the local logit shards with
// three reductions per row (max, sum of exponentials, target logit), never gathering the full
// [n, V] logits. Also the TP parameter slicing helpers the mesh engine uses for every TP weight.
//
// Layout (Megatron's): the vocabulary is padded to Vp = round_up(V, tp * pad_multiple)
// (ModelConfig::padded_vocab) and TP rank t holds vocab rows [t*Vp/tp, (t+1)*Vp/tp) of the padded
// embed.weight [Vp, h] and, when untied, the same columns of lm_head.weight [h, Vp]. Ids >= V are
// padding: zero rows that no token reads, logits masked out of the softmax (so their gradient is
// zero and they stay zero). A rank may hold padding only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/mp/tokens.hpp"
#include "parallel/testing.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// This TP rank's padded vocab range [offset, offset + size), of which the first `real` ids are
// < V (the rest padding). Throws LayoutError when tp < 1, rank is outside [0, tp) or
// pad_multiple < 1.
struct VocabShard {
  int64_t offset = 0;
  int64_t size = 0;
  int64_t real = 0;
};
VocabShard vocab_shard(int64_t vocab, int tp, int rank, int pad_multiple = 1);

// ---- Embedding ------------------------------------------------------------------------------

// table_local: this rank's rows of embed.weight [Vp/tp, h], the first being vocab id
// shard.offset. Returns [n, h]: the table row for tokens in this rank's real range, zero rows
// otherwise (a PARTIAL sum: the caller reduces it over tp with all_reduce, or reduce-scatters rows
// under SP).
template <class T>
ref::Tensor<T> vocab_embed_forward(const ref::Tensor<T>& table_local, const VocabShard& shard,
                                   std::span<const int32_t> tokens);
// dy [n, h]: the gradient of the (reduced) embedding output for these tokens; ADDS into
// dtable_local [Vp/tp, h] the rows of the tokens in this rank's real range.
template <class T>
void vocab_embed_backward(const ref::Tensor<T>& dy, const VocabShard& shard,
                          std::span<const int32_t> tokens, ref::Tensor<T>& dtable_local);

// ---- LM head + parallel cross-entropy -------------------------------------------------------

// What backward needs from forward. The max and sum are over the FULL vocabulary (already reduced
// over tp), for every row (masked or not), so backward accepts any row weights.
template <class T>
struct VocabHeadCache {
  ref::Tensor<T> logits;         // [n, Vp/tp] this rank's logit columns, padding included
  std::vector<T> row_max;        // [n] max over the full (real) vocabulary
  std::vector<T> sum_exp;        // [n] sum over the full vocabulary of exp(logit - row_max)
  std::vector<int32_t> targets;  // [n] global vocab ids
  VocabShard shard;              // this rank's columns
  int64_t softmax_columns = 0;   // local columns in the softmax: shard.real (planted: all)
};

// y [n, h] (the final-normed hidden, identical on every TP rank). weight_local: tied -> the
// embedding shard [Vp/tp, h] (logits = y . W^T); untied -> lm_head columns [h, Vp/tp]
// (logits = y . W); padded columns are left out of the max, the sum and the target. Collective over
// tp: all_reduce(max) of the row max, then one all_reduce(sum) of [sum exp | target logit] (only
// the owner of a row's target contributes its logit). Returns the per-row loss logsumexp -
// logit[target] where mask == 1, 0 elsewhere, identical on every TP rank, equal to
// ref::cross_entropy_forward on the full logits. Targets of masked-out rows are not read (they may
// be out of range). planted (tests): kVocabTargetNotReduced leaves the target logit unsummed over
// TP; kVocabPadNotMasked lets the padded columns into the softmax.
template <class T>
std::vector<double> vocab_head_forward(comm::Communicator& tp, const ref::Tensor<T>& y,
                                       const ref::Tensor<T>& weight_local, bool tied,
                                       const VocabShard& shard, std::span<const int32_t> targets,
                                       std::span<const int32_t> mask, VocabHeadCache<T>& cache,
                                       testing::Mutation planted = testing::Mutation::kNone);

// row_weight[t]: the loss weight of row t (token_weight for mask == 1 rows, 0 otherwise), as
// ref::cross_entropy_backward's weight. ADDS into dweight_local (same shape as weight_local) this
// shard's gradient; returns dy [n, h] summed over tp (one all_reduce), equal to the reference's
// gradient w.r.t. y. Collective over tp.
template <class T>
ref::Tensor<T> vocab_head_backward(comm::Communicator& tp, const ref::Tensor<T>& y,
                                   const ref::Tensor<T>& weight_local, bool tied,
                                   const VocabHeadCache<T>& cache,
                                   std::span<const double> row_weight,
                                   ref::Tensor<T>& dweight_local);

// ---- TP parameter slicing -------------------------------------------------------------------

// rows: split dim 0 (also of a 1-D tensor); columns: split dim 1 of a 2-D [in, out] weight.
// Column slices of the attention projections follow heads: wq's columns of heads
// [rank*a/tp, (rank+1)*a/tp) are contiguous, so TpSplit::columns is enough when a % tp == 0 and
// kv % tp == 0.
enum class TpSplit : std::uint8_t { replicated, rows, columns };

// The TP rank's slice of a full tensor (replicated: a copy). Throws LayoutError naming the
// dimension and tp when the split dimension is not divisible by tp.
template <class T>
ref::Tensor<T> tp_slice(const ref::Tensor<T>& full, TpSplit split, int tp, int rank);
// The inverse: writes the TP rank's slice `local` into its place in `full` (replicated: copies
// all of it). Throws LayoutError when the shapes do not match the split.
template <class T>
void tp_unslice(const ref::Tensor<T>& local, TpSplit split, int tp, int rank, ref::Tensor<T>& full);

}  // namespace shardcheck::parallel
