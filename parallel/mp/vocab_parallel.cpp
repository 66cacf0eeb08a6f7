#include "parallel/mp/vocab_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "parallel/costs.hpp"
#include "parallel/testing.hpp"
#include "reference/config.hpp"
#include "reference/ops.hpp"

namespace shardcheck::parallel {

namespace {

std::string shape_str(const ref::Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void check_tp(int tp, int rank) {
  if (tp < 1 || rank < 0 || rank >= tp) {
    throw LayoutError("tp rank " + std::to_string(rank) + " outside tp = " + std::to_string(tp));
  }
}

// Vocab size of the local head weight and a shape check against y [n, h].
template <class T>
int64_t local_vocab(const ref::Tensor<T>& y, const ref::Tensor<T>& w, bool tied) {
  if (y.rank() != 2 || w.rank() != 2) throw LayoutError("vocab head: y and weight must be 2-D");
  const int64_t h = y.dim(1);
  if ((tied ? w.dim(1) : w.dim(0)) != h) {
    throw LayoutError("vocab head: weight " + shape_str(w.shape()) + " does not match y " +
                      shape_str(y.shape()) +
                      (tied ? " (tied: [Vp/tp, h])" : " (untied: [h, Vp/tp])"));
  }
  return tied ? w.dim(0) : w.dim(1);
}

}  // namespace

VocabShard vocab_shard(int64_t vocab, int tp, int rank, int pad_multiple) {
  check_tp(tp, rank);
  if (pad_multiple < 1) {
    throw LayoutError("vocab parallel: pad multiple " + std::to_string(pad_multiple) + " < 1");
  }
  const int64_t size = ref::padded_vocab(vocab, int64_t{tp} * pad_multiple) / tp;
  const int64_t offset = size * rank;
  return {.offset = offset, .size = size, .real = std::clamp<int64_t>(vocab - offset, 0, size)};
}

template <class T>
ref::Tensor<T> vocab_embed_forward(const ref::Tensor<T>& table_local, const VocabShard& shard,
                                   std::span<const int32_t> tokens) {
  const int64_t vl = std::min(table_local.dim(0), shard.real), h = table_local.dim(1);
  ref::Tensor<T> y({static_cast<int64_t>(tokens.size()), h});
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const int64_t local = int64_t{tokens[t]} - shard.offset;
    if (local < 0 || local >= vl) continue;
    std::copy_n(table_local.data() + local * h, h, y.data() + static_cast<int64_t>(t) * h);
  }
  return y;
}

template <class T>
void vocab_embed_backward(const ref::Tensor<T>& dy, const VocabShard& shard,
                          std::span<const int32_t> tokens, ref::Tensor<T>& dtable_local) {
  const int64_t vl = std::min(dtable_local.dim(0), shard.real), h = dtable_local.dim(1);
  if (dy.rank() != 2 || dy.dim(0) != static_cast<int64_t>(tokens.size()) || dy.dim(1) != h) {
    throw LayoutError("vocab_embed_backward: dy " + shape_str(dy.shape()) + " for " +
                      std::to_string(tokens.size()) + " tokens and table shard " +
                      shape_str(dtable_local.shape()));
  }
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const int64_t local = int64_t{tokens[t]} - shard.offset;
    if (local < 0 || local >= vl) continue;
    for (int64_t c = 0; c < h; ++c) dtable_local.at(local, c) += dy.at(static_cast<int64_t>(t), c);
  }
}

template <class T>
std::vector<double> vocab_head_forward(comm::Communicator& tp, const ref::Tensor<T>& y,
                                       const ref::Tensor<T>& weight_local, bool tied,
                                       const VocabShard& shard, std::span<const int32_t> targets,
                                       std::span<const int32_t> mask, VocabHeadCache<T>& cache,
                                       testing::Mutation planted) {
  const int64_t vl = local_vocab(y, weight_local, tied);
  // The columns in the softmax: the real ones (padding masked out).
  const int64_t real = planted == testing::Mutation::kVocabPadNotMasked
                           ? vl
                           : std::clamp<int64_t>(shard.real, 0, vl);
  const int64_t n = y.dim(0), h = y.dim(1);
  const auto un = static_cast<std::size_t>(n);
  if (!kIsMeta<T> && (targets.size() != un || mask.size() != un)) {  // a timing-only run has none
    throw LayoutError("vocab_head_forward: " + std::to_string(n) + " rows but " +
                      std::to_string(targets.size()) + " targets and " +
                      std::to_string(mask.size()) + " mask entries");
  }
  // Local logits: the reference's op (its CPU loops, or the thread's ref::Compute), so each
  // column is the full logits' column computed the same way.
  cache.logits =
      tied ? ref::linear_t_forward(y, weight_local) : ref::linear_forward(y, weight_local);
  tp.compute(costs::vocab_head_forward(static_cast<double>(n), static_cast<double>(h),
                                       static_cast<double>(vl), kElemBytes<T>));
  cache.targets.assign(targets.begin(), targets.end());
  cache.shard = shard;
  cache.softmax_columns = real;

  // 1. Row max over the full vocabulary; a rank holding padding only offers -inf.
  cache.row_max.assign(un, T{});
  if constexpr (!kIsMeta<T>) {
    const auto none = static_cast<T>(-std::numeric_limits<float>::infinity());
    for (int64_t r = 0; r < n; ++r) {
      const T* row = cache.logits.data() + r * vl;
      cache.row_max[static_cast<std::size_t>(r)] =
          real > 0 ? *std::max_element(row, row + real) : none;
    }
  }
  const bool reduce = tp.size() > 1 && n > 0;
  if (reduce) tp.all_reduce(buffer_of(cache.row_max), {.op = comm::ReduceOp::max})->wait();

  // 2. [sum exp | target logit]: one sum all_reduce. The target's owner alone contributes it.
  std::vector<T> sums(2 * un, T{});
  if constexpr (!kIsMeta<T>) {
    for (int64_t r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const T mx = cache.row_max[ur];
      T s = 0;
      for (int64_t c = 0; c < real; ++c) s += std::exp(cache.logits.at(r, c) - mx);
      sums[ur] = s;
      if (!mask[ur]) continue;
      const int64_t local = int64_t{targets[ur]} - shard.offset;
      if (local >= 0 && local < real) sums[un + ur] = cache.logits.at(r, local);
    }
  }
  const std::vector<T> local_sums = sums;
  if (reduce) tp.all_reduce(buffer_of(sums))->wait();
  std::vector<double> loss(un, 0.0);
  if constexpr (!kIsMeta<T>) {
    if (planted == testing::Mutation::kVocabTargetNotReduced) {
      std::copy(local_sums.begin() + static_cast<std::ptrdiff_t>(un), local_sums.end(),
                sums.begin() + static_cast<std::ptrdiff_t>(un));
    }
    cache.sum_exp.assign(sums.begin(), sums.begin() + static_cast<std::ptrdiff_t>(un));
    for (std::size_t r = 0; r < un; ++r) {
      if (!mask[r]) continue;
      loss[r] = static_cast<double>(cache.row_max[r] + std::log(cache.sum_exp[r]) - sums[un + r]);
    }
  }
  return loss;
}

template <class T>
ref::Tensor<T> vocab_head_backward(comm::Communicator& tp, const ref::Tensor<T>& y,
                                   const ref::Tensor<T>& weight_local, bool tied,
                                   const VocabHeadCache<T>& cache,
                                   std::span<const double> row_weight,
                                   ref::Tensor<T>& dweight_local) {
  const int64_t vl = local_vocab(y, weight_local, tied);
  const int64_t n = y.dim(0), h = y.dim(1);
  if (cache.logits.shape() != ref::Shape{n, vl} ||
      (!kIsMeta<T> && row_weight.size() != static_cast<size_t>(n)) ||
      dweight_local.shape() != weight_local.shape()) {
    throw LayoutError("vocab_head_backward: cache logits " + shape_str(cache.logits.shape()) +
                      ", " + std::to_string(row_weight.size()) + " row weights, dweight " +
                      shape_str(dweight_local.shape()) + " for y " + shape_str(y.shape()) +
                      " and weight " + shape_str(weight_local.shape()));
  }
  // dlogits = w * (softmax - onehot(target)) on this rank's columns, as the reference computes.
  ref::Tensor<T> dlogits({n, vl});
  if constexpr (!kIsMeta<T>) {
    for (int64_t r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto wt = static_cast<T>(row_weight[ur]);
      if (wt == T{0}) continue;
      const T mx = cache.row_max[ur], sum = cache.sum_exp[ur];
      const int64_t real = std::min(cache.softmax_columns, vl);  // padded columns stay 0
      for (int64_t c = 0; c < real; ++c)
        dlogits.at(r, c) = wt * std::exp(cache.logits.at(r, c) - mx) / sum;
      const int64_t local = int64_t{cache.targets[ur]} - cache.shard.offset;
      if (local >= 0 && local < real) dlogits.at(r, local) -= wt;
    }
  }
  ref::Tensor<T> dy = tied ? ref::linear_t_backward(dlogits, y, weight_local, dweight_local)
                           : ref::linear_backward(dlogits, y, weight_local, dweight_local);
  tp.compute(costs::vocab_head_backward(static_cast<double>(n), static_cast<double>(h),
                                        static_cast<double>(vl), kElemBytes<T>));
  all_reduce_sum(tp, dy);
  return dy;
}

template <class T>
ref::Tensor<T> tp_slice(const ref::Tensor<T>& full, TpSplit split, int tp, int rank) {
  check_tp(tp, rank);
  if (split == TpSplit::replicated) return full;
  const int dim = split == TpSplit::rows ? 0 : 1;
  if (full.rank() < dim + 1 || (split == TpSplit::columns && full.rank() != 2)) {
    throw LayoutError("tp_slice: cannot split " + shape_str(full.shape()) +
                      (dim == 0 ? " by rows" : " by columns (needs a 2-D tensor)"));
  }
  const int64_t d = full.dim(dim);
  if (d % tp != 0) {
    throw LayoutError("tp_slice: dim " + std::to_string(dim) + " of " + shape_str(full.shape()) +
                      " = " + std::to_string(d) +
                      " is not divisible by tp = " + std::to_string(tp));
  }
  ref::Shape shape = full.shape();
  shape[static_cast<std::size_t>(dim)] = d / tp;
  ref::Tensor<T> out(shape);
  if (split == TpSplit::rows) {
    const int64_t per = out.numel();
    std::copy_n(full.data() + per * rank, per, out.data());
  } else {
    const int64_t rows = full.dim(0), w = d / tp;
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(full.data() + r * d + w * rank, w, out.data() + r * w);
    }
  }
  return out;
}

template <class T>
void tp_unslice(const ref::Tensor<T>& local, TpSplit split, int tp, int rank,
                ref::Tensor<T>& full) {
  check_tp(tp, rank);
  ref::Shape want = full.shape();
  const int dim = split == TpSplit::columns ? 1 : 0;
  if (split != TpSplit::replicated) {
    if (full.rank() < dim + 1 || (split == TpSplit::columns && full.rank() != 2) ||
        full.dim(dim) % tp != 0) {
      throw LayoutError("tp_unslice: cannot split " + shape_str(full.shape()) +
                        " over tp = " + std::to_string(tp));
    }
    want[static_cast<std::size_t>(dim)] /= tp;
  }
  if (local.shape() != want) {
    throw LayoutError("tp_unslice: slice " + shape_str(local.shape()) + " of " +
                      shape_str(full.shape()) + " should be " + shape_str(want));
  }
  if (split == TpSplit::replicated) {
    full = local;
  } else if (split == TpSplit::rows) {
    std::copy_n(local.data(), local.numel(), full.data() + local.numel() * rank);
  } else {
    const int64_t rows = full.dim(0), d = full.dim(1), w = d / tp;
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(local.data() + r * w, w, full.data() + r * d + w * rank);
    }
  }
}

#define SHARDCHECK_VOCAB_HEAD(T)                                                                  \
  template std::vector<double> vocab_head_forward(                                                \
      comm::Communicator&, const ref::Tensor<T>&, const ref::Tensor<T>&, bool, const VocabShard&, \
      std::span<const int32_t>, std::span<const int32_t>, VocabHeadCache<T>&, testing::Mutation); \
  template ref::Tensor<T> vocab_head_backward(                                                    \
      comm::Communicator&, const ref::Tensor<T>&, const ref::Tensor<T>&, bool,                    \
      const VocabHeadCache<T>&, std::span<const double>, ref::Tensor<T>&);
SHARDCHECK_VOCAB_HEAD(double)
SHARDCHECK_VOCAB_HEAD(float)
SHARDCHECK_VOCAB_HEAD(Meta<double>)
SHARDCHECK_VOCAB_HEAD(Meta<float>)
#undef SHARDCHECK_VOCAB_HEAD
#define SHARDCHECK_VOCAB(T)                                                             \
  template ref::Tensor<T> vocab_embed_forward(const ref::Tensor<T>&, const VocabShard&, \
                                              std::span<const int32_t>);                \
  template void vocab_embed_backward(const ref::Tensor<T>&, const VocabShard&,          \
                                     std::span<const int32_t>, ref::Tensor<T>&);        \
  template ref::Tensor<T> tp_slice(const ref::Tensor<T>&, TpSplit, int, int);           \
  template void tp_unslice(const ref::Tensor<T>&, TpSplit, int, int, ref::Tensor<T>&);
SHARDCHECK_VOCAB(double)
SHARDCHECK_VOCAB(float)
#undef SHARDCHECK_VOCAB

}  // namespace shardcheck::parallel
