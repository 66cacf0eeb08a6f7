// Context-parallel attention: shape checks, the dispatch to ring (cp_ring.cpp) and Ulysses.
#include "parallel/mp/cp_attention.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "parallel/costs.hpp"
#include "parallel/mp/cp_ring.hpp"

namespace shardcheck::parallel {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

template <class T>
void check_shapes(const comm::Communicator& cp, CpAlgo algo, const TokenLayout& layout,
                  const ref::Tensor<T>& q, const ref::Tensor<T>& k, const ref::Tensor<T>& v,
                  std::span<const int32_t> doc_ids, ref::AttentionShape shape) {
  const auto who = [algo] { return "cp attention (" + std::string(name_of(algo)) + "): "; };
  if (layout.cp() != cp.size()) {
    throw LayoutError(who() + "layout cp " + str(layout.cp()) + " != CP group size " +
                      str(cp.size()));
  }
  if (shape.heads < 1 || shape.kv_heads < 1 || shape.heads % shape.kv_heads != 0) {
    throw LayoutError(who() + "heads " + str(shape.heads) +
                      " must be a positive multiple of kv_heads " + str(shape.kv_heads));
  }
  const int64_t n = layout.cp_row_count();
  if (q.rank() != 2 || q.dim(0) != n || q.dim(1) % shape.heads != 0) {
    throw LayoutError(who() + "q must be [" + str(n) + ", heads " + str(shape.heads) + " * d]");
  }
  const int64_t d = q.dim(1) / shape.heads;
  const ref::Shape kv_shape{n, shape.kv_heads * d};
  if (k.shape() != kv_shape || v.shape() != kv_shape) {
    throw LayoutError(who() + "k and v must be [" + str(n) + ", kv_heads " + str(shape.kv_heads) +
                      " * d " + str(d) + "]");
  }
  if (static_cast<int64_t>(doc_ids.size()) != layout.seq_len()) {
    throw LayoutError(who() + "doc_ids has " + str(static_cast<int64_t>(doc_ids.size())) +
                      " entries, the sequence " + str(layout.seq_len()));
  }
  if (algo == CpAlgo::ulysses &&
      (shape.heads % cp.size() != 0 || shape.kv_heads % cp.size() != 0)) {
    throw LayoutError(who() + "heads " + str(shape.heads) + " and kv_heads " + str(shape.kv_heads) +
                      " must both be divisible by cp " + str(cp.size()));
  }
}

// Ulysses all_to_all, rows -> heads: local [n, w * cp] (w = this rank's share of columns per
// rank) becomes [S, w] in global row order, the columns [r*w, (r+1)*w) of every rank.
template <class T>
ref::Tensor<T> rows_to_heads(comm::Communicator& cp, const CpAttentionCache<T>& c,
                             const ref::Tensor<T>& local) {
  const int p = cp.size();
  const int64_t n = local.dim(0), w = local.dim(1) / p;
  ref::Tensor<T> send({n, w * p}), recv({n, w * p}), full({c.seq_len, w});
  if constexpr (!kIsMeta<T>) {
    for (int j = 0; j < p; ++j)
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(&local.at(i, j * w), w, send.data() + (j * n + i) * w);
  }
  if (p > 1)
    cp.all_to_all(cbuffer_of(send), buffer_of(recv))->wait();
  else
    recv = send;
  if constexpr (!kIsMeta<T>) {
    for (int j = 0; j < p; ++j) {
      const auto& rows = c.rows[static_cast<std::size_t>(j)];
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(recv.data() + (j * n + i) * w, w,
                    &full.at(rows[static_cast<std::size_t>(i)], 0));
    }
  }
  return full;
}

// The inverse: full [S, w] of this rank's head shard -> local rows [n, w * cp] of every shard.
template <class T>
ref::Tensor<T> heads_to_rows(comm::Communicator& cp, const CpAttentionCache<T>& c,
                             const ref::Tensor<T>& full) {
  const int p = cp.size();
  const int64_t w = full.dim(1);
  const int64_t n = c.seq_len / p;
  ref::Tensor<T> send({n * p, w}), recv({n * p, w}), local({n, w * p});
  if constexpr (!kIsMeta<T>) {
    for (int j = 0; j < p; ++j) {
      const auto& rows = c.rows[static_cast<std::size_t>(j)];
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(&full.at(rows[static_cast<std::size_t>(i)], 0), w,
                    send.data() + (j * n + i) * w);
    }
  }
  if (p > 1)
    cp.all_to_all(cbuffer_of(send), buffer_of(recv))->wait();
  else
    recv = send;
  if constexpr (!kIsMeta<T>) {
    for (int j = 0; j < p; ++j)
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(recv.data() + (j * n + i) * w, w, &local.at(i, j * w));
  }
  return local;
}

// Causal attention of `heads` heads over s rows: about half of the s*s score matrix.
template <class T>
costs::UlyssesShape ulysses_shape(const CpAttentionCache<T>& c) {
  return {c.seq_len, c.sub_shape.heads, c.sub_shape.kv_heads, c.head_dim};
}

}  // namespace

template <class T>
ref::Tensor<T> cp_attention_forward(comm::Communicator& cp, CpAlgo algo, const TokenLayout& layout,
                                    const ref::Tensor<T>& q, const ref::Tensor<T>& k,
                                    const ref::Tensor<T>& v, std::span<const int32_t> doc_ids,
                                    ref::AttentionShape shape, const ref::AttentionDropout& dropout,
                                    CpAttentionCache<T>& cache, testing::Mutation planted,
                                    AttentionKernel kernel) {
  check_shapes(cp, algo, layout, q, k, v, doc_ids, shape);
  if (!kIsMeta<T> && kernel != AttentionKernel::engine)
    throw std::invalid_argument(
        "cp attention: the numeric engine computes attention with its "
        "own kernel; flash is for timing-only runs");
  cache = CpAttentionCache<T>{};
  cache.kernel = kernel;
  // One CP rank: the reference's attention itself (the ring's online softmax would round
  // differently), so a mesh without CP computes attention exactly as the single device does.
  cache.algo = cp.size() > 1 ? algo : CpAlgo::ulysses;
  cache.planted = planted;
  cache.shape = shape;
  cache.dropout = dropout;
  cache.seq_len = layout.seq_len();
  cache.head_dim = q.dim(1) / shape.heads;
  if constexpr (!kIsMeta<T>) cache.doc_ids.assign(doc_ids.begin(), doc_ids.end());
  for (int r = 0; r < cp.size(); ++r) {
    cache.chunks.push_back(layout.cp_chunks(r));
    if constexpr (!kIsMeta<T>) cache.rows.push_back(layout.cp_rows(r));
  }
  if (cache.algo == CpAlgo::ring) return detail::ring_attention_forward(cp, q, k, v, cache);

  const int p = cp.size();
  cache.sub_shape = {.heads = shape.heads / p, .kv_heads = shape.kv_heads / p};
  cache.sub_dropout = dropout;
  cache.sub_dropout.total_heads = dropout.total_heads > 0 ? dropout.total_heads : shape.heads;
  cache.sub_dropout.head_offset = dropout.head_offset + cp.rank() * cache.sub_shape.heads;
  cache.q = rows_to_heads(cp, cache, q);
  cache.k = rows_to_heads(cp, cache, k);
  cache.v = rows_to_heads(cp, cache, v);
  const ref::Tensor<T> o = ref::attention_forward(cache.q, cache.k, cache.v, doc_ids,
                                                  cache.sub_shape, cache.sub_dropout, &cache.probs);
  cp.compute(cache.kernel == AttentionKernel::flash
                 ? costs::flash_forward(ulysses_shape(cache), kElemBytes<T>)
                 : costs::ulysses_forward(ulysses_shape(cache), kElemBytes<T>));
  return heads_to_rows(cp, cache, o);
}

template <class T>
void cp_attention_backward(comm::Communicator& cp, const ref::Tensor<T>& dout,
                           const CpAttentionCache<T>& cache, ref::Tensor<T>& dq, ref::Tensor<T>& dk,
                           ref::Tensor<T>& dv) {
  const int64_t n = cache.seq_len / cp.size();
  const ref::Shape want{n, cache.shape.heads * cache.head_dim};
  if (cache.chunks.size() != static_cast<std::size_t>(cp.size()) || dout.shape() != want) {
    throw LayoutError("cp attention backward: dout must be [" + str(n) + ", " + str(want[1]) +
                      "] on a CP group of the forward's size " +
                      str(static_cast<int64_t>(cache.chunks.size())));
  }
  if (cache.algo == CpAlgo::ring) {
    detail::ring_attention_backward(cp, dout, cache, dq, dk, dv);
    return;
  }
  const ref::Tensor<T> dfull = rows_to_heads(cp, cache, dout);
  ref::Tensor<T> dqf, dkf, dvf;
  if (cache.kernel == AttentionKernel::flash) {  // the scores again inside, whatever the recompute
    ref::attention_backward(dfull, cache.q, cache.k, cache.v, cache.sub_shape, cache.sub_dropout,
                            cache.probs, dqf, dkf, dvf);
    cp.compute(costs::flash_backward(ulysses_shape(cache), kElemBytes<T>));
  } else {
    // Selective recomputation dropped the probabilities: the attention core again, the same bits.
    ref::Tensor<T> recomputed;
    if (cache.probs.numel() == 0) {
      ref::attention_forward(cache.q, cache.k, cache.v, cache.doc_ids, cache.sub_shape,
                             cache.sub_dropout, &recomputed);
      cp.compute(costs::ulysses_recompute(ulysses_shape(cache), kElemBytes<T>));
    }
    const ref::Tensor<T>& probs = cache.probs.numel() == 0 ? recomputed : cache.probs;
    ref::attention_backward(dfull, cache.q, cache.k, cache.v, cache.sub_shape, cache.sub_dropout,
                            probs, dqf, dkf, dvf);
    cp.compute(
        costs::ulysses_backward(ulysses_shape(cache), cache.probs.numel() > 0, kElemBytes<T>));
  }
  dq = heads_to_rows(cp, cache, dqf);
  dk = heads_to_rows(cp, cache, dkf);
  dv = heads_to_rows(cp, cache, dvf);
}

#define SHARDCHECK_CP_ATTENTION(T)                                                                 \
  template ref::Tensor<T> cp_attention_forward(                                                    \
      comm::Communicator&, CpAlgo, const TokenLayout&, const ref::Tensor<T>&,                      \
      const ref::Tensor<T>&, const ref::Tensor<T>&, std::span<const int32_t>, ref::AttentionShape, \
      const ref::AttentionDropout&, CpAttentionCache<T>&, testing::Mutation, AttentionKernel);     \
  template void cp_attention_backward(comm::Communicator&, const ref::Tensor<T>&,                  \
                                      const CpAttentionCache<T>&, ref::Tensor<T>&,                 \
                                      ref::Tensor<T>&, ref::Tensor<T>&);
SHARDCHECK_CP_ATTENTION(double)
SHARDCHECK_CP_ATTENTION(float)
SHARDCHECK_CP_ATTENTION(Meta<double>)
SHARDCHECK_CP_ATTENTION(Meta<float>)
#undef SHARDCHECK_CP_ATTENTION

}  // namespace shardcheck::parallel
