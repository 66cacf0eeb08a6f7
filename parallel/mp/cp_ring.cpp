// Ring attention: K/V blocks circulate over the CP ring; online softmax forward, flash-attention
// style backward with dK/dV accumulators that travel with their block and return to its owner.
//
// Block at step s on rank r belongs to owner (r - s) mod cp. Forward: cp - 1 hops of K/V (tag
// kKvForward). Backward: cp - 1 hops of K/V (kKvBackward) and cp hops of dK/dV (kDkv), the last
// one bringing each accumulator home. Every rank issues the same sends and receives whatever it
// skips, so the pattern is identical on all ranks. On Meta tensors (meta.hpp) the same schedule
// runs with null blocks and no kernels.
#include "parallel/mp/cp_ring.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "parallel/costs.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::parallel::detail {
namespace {

constexpr int kKvForward = kRingKvForwardTag;
constexpr int kKvBackward = kRingKvBackwardTag;
constexpr int kDkv = kRingDkvTag;

// A run of consecutive global rows inside one of the layout's chunks (seq_len / (2 cp) rows;
// costs::ring_block_pairs): global [begin, end), local index of `begin`. Adjacent chunks stay
// apart, so every rank's blocks are alike at each step (TokenLayout's balance).
struct Segment {
  int64_t begin = 0, end = 0, local = 0;
};

std::vector<Segment> segments_of(const std::vector<int64_t>& rows, int64_t chunk) {
  std::vector<Segment> out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!out.empty() && out.back().end == rows[i] && rows[i] % chunk != 0) {
      ++out.back().end;
    } else {
      out.push_back({rows[i], rows[i] + 1, static_cast<int64_t>(i)});
    }
  }
  return out;
}

// The sizes the ring's schedule and its compute reports read (numeric or timing-only).
struct RingShape {
  int heads, kv_heads;
  int64_t d, n;
  int64_t chunk;  // rows of one of the layout's chunks
  template <class T>
  explicit RingShape(const CpAttentionCache<T>& cache)
      : heads(cache.shape.heads),
        kv_heads(cache.shape.kv_heads),
        d(cache.head_dim),
        n(cache.seq_len / static_cast<int64_t>(cache.chunks.size())),
        chunk(costs::ring_chunk(cache.seq_len, static_cast<int>(cache.chunks.size()))) {}
};

// Everything the block kernels share.
template <class T>
struct Ctx : RingShape {
  const CpAttentionCache<T>& c;
  int group;
  T scale;
  ref::AttentionDropoutMask mask;
  std::vector<Segment> own;  // this rank's query segments

  Ctx(const CpAttentionCache<T>& cache, int rank)
      : RingShape(cache),
        c(cache),
        group(cache.shape.heads / cache.shape.kv_heads),
        scale(T{1} / std::sqrt(static_cast<T>(cache.head_dim))),
        mask(cache.dropout,
             cache.dropout.total_heads > 0 ? cache.dropout.total_heads : cache.shape.heads,
             cache.seq_len),
        own(segments_of(cache.rows[static_cast<std::size_t>(rank)], chunk)) {}

  T drop(int h, int64_t i, int64_t j) const {
    return static_cast<T>(mask.scale(c.dropout.head_offset + h, i, j));
  }
  bool visible(int64_t i, int64_t j, bool unmasked) const {
    if (unmasked) return true;
    return j <= i &&
           c.doc_ids[static_cast<std::size_t>(i)] == c.doc_ids[static_cast<std::size_t>(j)];
  }
  // Query segment qs against key segment ks: nothing visible when every key is after every query.
  bool skipped(const Segment& qs, const Segment& ks, bool unmasked) const {
    return !unmasked && ks.begin > qs.end - 1;
  }
};

// The planted bug: a rank's own block (step 0) without the causal/document mask.
template <class T>
bool diagonal_unmasked(const CpAttentionCache<T>& cache, int step) {
  return step == 0 && cache.planted == testing::Mutation::kRingDiagonalUnmasked;
}

// Online-softmax update of (m, l, acc) with one K/V block.
template <class T>
void forward_block(const Ctx<T>& x, const ref::Tensor<T>& q, const std::vector<T>& kv,
                   const std::vector<Segment>& keys, bool unmasked, std::vector<T>& m,
                   std::vector<T>& l, ref::Tensor<T>& acc) {
  const int64_t kvw = x.kv_heads * x.d;
  const T* kb = kv.data();
  const T* vb = kv.data() + x.n * kvw;
  std::vector<T> sc;
  for (const Segment& qs : x.own) {
    for (const Segment& ks : keys) {
      if (x.skipped(qs, ks, unmasked)) continue;
      const int64_t klen = ks.end - ks.begin;
      sc.assign(static_cast<std::size_t>(klen), T{0});
      for (int h = 0; h < x.heads; ++h) {
        const int64_t g = h / x.group;
        for (int64_t gi = qs.begin; gi < qs.end; ++gi) {
          const int64_t i = qs.local + gi - qs.begin;
          T bm = -std::numeric_limits<T>::infinity();
          for (int64_t t = 0; t < klen; ++t) {
            if (!x.visible(gi, ks.begin + t, unmasked)) continue;
            const T* kr = kb + (ks.local + t) * kvw + g * x.d;
            T dot = 0;
            for (int64_t c = 0; c < x.d; ++c) dot += q.at(i, h * x.d + c) * kr[c];
            sc[static_cast<std::size_t>(t)] = dot * x.scale;
            bm = std::max(bm, sc[static_cast<std::size_t>(t)]);
          }
          if (bm == -std::numeric_limits<T>::infinity()) continue;  // nothing visible here
          T& mi = m[static_cast<std::size_t>(h * x.n + i)];
          T& li = l[static_cast<std::size_t>(h * x.n + i)];
          const T mnew = std::max(mi, bm);
          const T corr = std::exp(mi - mnew);  // 0 while mi is -inf
          li *= corr;
          T* ar = &acc.at(i, h * x.d);
          for (int64_t c = 0; c < x.d; ++c) ar[c] *= corr;
          mi = mnew;
          for (int64_t t = 0; t < klen; ++t) {
            const int64_t gj = ks.begin + t;
            if (!x.visible(gi, gj, unmasked)) continue;
            const T p = std::exp(sc[static_cast<std::size_t>(t)] - mnew);
            li += p;  // the normaliser ignores dropout
            const T w = p * x.drop(h, gi, gj);
            if (w == T{0}) continue;
            const T* vr = vb + (ks.local + t) * kvw + g * x.d;
            for (int64_t c = 0; c < x.d; ++c) ar[c] += w * vr[c];
          }
        }
      }
    }
  }
}

// Gradient contributions of one K/V block: dq (local) and the block's dK/dV accumulator.
template <class T>
void backward_block(const Ctx<T>& x, const ref::Tensor<T>& dout, const std::vector<T>& dsum,
                    const std::vector<T>& kv, const std::vector<Segment>& keys, bool unmasked,
                    ref::Tensor<T>& dq, std::vector<T>& dkv) {
  const ref::Tensor<T>& q = x.c.q;
  const int64_t kvw = x.kv_heads * x.d;
  const T* kb = kv.data();
  const T* vb = kv.data() + x.n * kvw;
  T* dkb = dkv.data();
  T* dvb = dkv.data() + x.n * kvw;
  for (const Segment& qs : x.own) {
    for (const Segment& ks : keys) {
      if (x.skipped(qs, ks, unmasked)) continue;
      const int64_t klen = ks.end - ks.begin;
      for (int h = 0; h < x.heads; ++h) {
        const int64_t g = h / x.group;
        for (int64_t gi = qs.begin; gi < qs.end; ++gi) {
          const int64_t i = qs.local + gi - qs.begin;
          const T lse = x.c.lse[static_cast<std::size_t>(h * x.n + i)];
          const T di = dsum[static_cast<std::size_t>(h * x.n + i)];
          const T* qr = &q.at(i, h * x.d);
          const T* dor = &dout.at(i, h * x.d);
          T* dqr = &dq.at(i, h * x.d);
          for (int64_t t = 0; t < klen; ++t) {
            const int64_t gj = ks.begin + t;
            if (!x.visible(gi, gj, unmasked)) continue;
            const int64_t off = (ks.local + t) * kvw + g * x.d;
            const T* kr = kb + off;
            const T* vr = vb + off;
            T dot = 0, dpd = 0;
            for (int64_t c = 0; c < x.d; ++c) {
              dot += qr[c] * kr[c];
              dpd += dor[c] * vr[c];
            }
            const T p = std::exp(dot * x.scale - lse);
            const T dm = x.drop(h, gi, gj);
            const T pm = p * dm;
            const T ds = p * (dpd * dm - di) * x.scale;
            for (int64_t c = 0; c < x.d; ++c) {
              dvb[off + c] += pm * dor[c];
              dqr[c] += ds * kr[c];
              dkb[off + c] += ds * qr[c];
            }
          }
        }
      }
    }
  }
}

// A K/V block on the move (k then v), or its dK/dV accumulator: its elements, or (Meta) their
// count.
template <class T>
struct KvBlock {
  std::vector<T> v;
  explicit KvBlock(std::size_t n) : v(n, T{0}) {}
  KvBlock(const ref::Tensor<T>& k, const ref::Tensor<T>& val) : v(k.vec()) {
    v.insert(v.end(), val.vec().begin(), val.vec().end());
  }
  std::size_t size() const { return v.size(); }
  comm::Buffer buf() { return comm::view(std::span<T>(v)); }
  comm::ConstBuffer cbuf() const { return comm::cview(std::span<const T>(v)); }
};
template <class U>
struct KvBlock<Meta<U>> {
  std::size_t count = 0;
  explicit KvBlock(std::size_t n) : count(n) {}
  KvBlock(const ref::Tensor<Meta<U>>& k, const ref::Tensor<Meta<U>>& val)
      : count(static_cast<std::size_t>(k.numel() + val.numel())) {}
  std::size_t size() const { return count; }
  comm::Buffer buf() const { return {nullptr, count, kElemDType<U>, {}}; }
  comm::ConstBuffer cbuf() const { return buf(); }
};

// The forward's online softmax over the blocks: per (head, row) the running max and normaliser,
// and the weighted values; nothing for a timing-only run.
template <class T>
struct ForwardState {
  Ctx<T> x;
  std::vector<T> m, l;
  ref::Tensor<T> acc;
  ForwardState(const CpAttentionCache<T>& cache, int rank)
      : x(cache, rank),
        m(static_cast<std::size_t>(x.heads * x.n), -std::numeric_limits<T>::infinity()),
        l(m.size(), T{0}),
        acc({x.n, x.heads * x.d}) {}
  void block(const ref::Tensor<T>& q, const KvBlock<T>& kv, int owner, bool unmasked) {
    forward_block(x, q, kv.v, segments_of(x.c.rows[static_cast<std::size_t>(owner)], x.chunk),
                  unmasked, m, l, acc);
  }
  // o, and the log-sum-exp of each (head, row) into the cache.
  ref::Tensor<T> finish(CpAttentionCache<T>& cache) {
    cache.lse.assign(m.size(), T{0});
    for (int h = 0; h < x.heads; ++h) {
      for (int64_t i = 0; i < x.n; ++i) {
        const auto hi = static_cast<std::size_t>(h * x.n + i);
        const T inv = T{1} / l[hi];
        for (int64_t c = 0; c < x.d; ++c) acc.at(i, h * x.d + c) *= inv;
        cache.lse[hi] = m[hi] + std::log(l[hi]);
      }
    }
    return acc;
  }
};
template <class U>
struct ForwardState<Meta<U>> {
  RingShape x;
  ForwardState(const CpAttentionCache<Meta<U>>& cache, int /*rank*/) : x(cache) {}
  void block(const ref::Tensor<Meta<U>>& /*q*/, const KvBlock<Meta<U>>& /*kv*/, int /*owner*/,
             bool /*unmasked*/) {}
  ref::Tensor<Meta<U>> finish(CpAttentionCache<Meta<U>>& /*cache*/) {
    return ref::Tensor<Meta<U>>({x.n, x.heads * x.d});
  }
};

// The backward's gradient contributions of each block: dq (local) and the block's accumulator;
// nothing for a timing-only run.
template <class T>
struct BackwardState {
  Ctx<T> x;
  const ref::Tensor<T>& dout;
  std::vector<T> dsum;  // D_i = dout_i . o_i per (head, row): the row sum of p * dp
  BackwardState(const CpAttentionCache<T>& cache, int rank, const ref::Tensor<T>& d)
      : x(cache, rank), dout(d), dsum(static_cast<std::size_t>(x.heads * x.n), T{0}) {
    for (int h = 0; h < x.heads; ++h) {
      for (int64_t i = 0; i < x.n; ++i) {
        T s = 0;
        for (int64_t c = 0; c < x.d; ++c) s += dout.at(i, h * x.d + c) * cache.o.at(i, h * x.d + c);
        dsum[static_cast<std::size_t>(h * x.n + i)] = s;
      }
    }
  }
  void block(const KvBlock<T>& kv, int owner, bool unmasked, ref::Tensor<T>& dq, KvBlock<T>& dkv) {
    backward_block(x, dout, dsum, kv.v,
                   segments_of(x.c.rows[static_cast<std::size_t>(owner)], x.chunk), unmasked, dq,
                   dkv.v);
  }
  // dk and dv out of the accumulator that came home.
  void finish(const CpAttentionCache<T>& cache, const KvBlock<T>& dkv, ref::Tensor<T>& dk,
              ref::Tensor<T>& dv) const {
    const auto half = static_cast<std::ptrdiff_t>(cache.k.numel());
    dk = ref::Tensor<T>(cache.k.shape(), std::vector<T>(dkv.v.begin(), dkv.v.begin() + half));
    dv = ref::Tensor<T>(cache.v.shape(), std::vector<T>(dkv.v.begin() + half, dkv.v.end()));
  }
};
template <class U>
struct BackwardState<Meta<U>> {
  RingShape x;
  BackwardState(const CpAttentionCache<Meta<U>>& cache, int /*rank*/,
                const ref::Tensor<Meta<U>>& /*dout*/)
      : x(cache) {}
  void block(const KvBlock<Meta<U>>& /*kv*/, int /*owner*/, bool /*unmasked*/,
             ref::Tensor<Meta<U>>& /*dq*/, KvBlock<Meta<U>>& /*dkv*/) {}
  void finish(const CpAttentionCache<Meta<U>>& cache, const KvBlock<Meta<U>>& /*dkv*/,
              ref::Tensor<Meta<U>>& dk, ref::Tensor<Meta<U>>& dv) const {
    dk = ref::Tensor<Meta<U>>(cache.k.shape());
    dv = ref::Tensor<Meta<U>>(cache.v.shape());
  }
};

int next_of(const comm::Communicator& cp) {
  return (cp.rank() + 1) % cp.size();
}
int prev_of(const comm::Communicator& cp) {
  return (cp.rank() + cp.size() - 1) % cp.size();
}
int owner_at(const comm::Communicator& cp, int step) {
  return (cp.rank() - step + cp.size()) % cp.size();
}

// The query-key pairs of rank `own`'s rows against the block of rank `owner`'s
// (costs::ring_run_pairs over their chunks).
template <class T>
double block_pairs(const CpAttentionCache<T>& cache, int own, int owner, bool unmasked) {
  return costs::ring_run_pairs(cache.chunks[static_cast<std::size_t>(own)],
                               cache.chunks[static_cast<std::size_t>(owner)], unmasked);
}

}  // namespace

template <class T>
ref::Tensor<T> ring_attention_forward(comm::Communicator& cp, const ref::Tensor<T>& q,
                                      const ref::Tensor<T>& k, const ref::Tensor<T>& v,
                                      CpAttentionCache<T>& cache) {
  cache.q = q;
  cache.k = k;
  cache.v = v;
  ForwardState<T> st(cache, cp.rank());
  const RingShape& x = st.x;
  const int p = cp.size();
  KvBlock<T> cur(k, v), nxt(cur.size());
  for (int s = 0; s < p; ++s) {
    comm::WorkPtr ws, wr;
    if (s < p - 1) {
      ws = cp.send(cur.cbuf(), next_of(cp), {.tag = kKvForward});
      wr = cp.recv(nxt.buf(), prev_of(cp), {.tag = kKvForward});
    }
    st.block(q, cur, owner_at(cp, s), diagonal_unmasked(cache, s));
    cp.compute(costs::ring_forward(
        block_pairs(cache, cp.rank(), owner_at(cp, s), diagonal_unmasked(cache, s)),
        static_cast<double>(x.n), x.heads, x.kv_heads, static_cast<double>(x.d), kElemBytes<T>));
    if (s < p - 1) {
      ws->wait();
      wr->wait();
      std::swap(cur, nxt);
    }
  }
  cache.o = st.finish(cache);
  return cache.o;
}

template <class T>
void ring_attention_backward(comm::Communicator& cp, const ref::Tensor<T>& dout,
                             const CpAttentionCache<T>& cache, ref::Tensor<T>& dq,
                             ref::Tensor<T>& dk, ref::Tensor<T>& dv) {
  BackwardState<T> st(cache, cp.rank(), dout);
  const RingShape& x = st.x;
  const int p = cp.size();
  dq = ref::Tensor<T>(cache.q.shape());
  KvBlock<T> cur(cache.k, cache.v), nxt(cur.size());
  KvBlock<T> dcur(cur.size()), dnxt(cur.size());
  for (int s = 0; s < p; ++s) {
    comm::WorkPtr ws, wr;
    if (s < p - 1) {
      ws = cp.send(cur.cbuf(), next_of(cp), {.tag = kKvBackward});
      wr = cp.recv(nxt.buf(), prev_of(cp), {.tag = kKvBackward});
    }
    st.block(cur, owner_at(cp, s), diagonal_unmasked(cache, s), dq, dcur);
    cp.compute(costs::ring_backward(
        block_pairs(cache, cp.rank(), owner_at(cp, s), diagonal_unmasked(cache, s)),
        static_cast<double>(x.n), x.heads, x.kv_heads, static_cast<double>(x.d), kElemBytes<T>));
    if (s < p - 1) {
      ws->wait();
      wr->wait();
      std::swap(cur, nxt);
    }
    if (p > 1) {  // the accumulator follows its block; after step p-1 it is back at its owner
      auto dws = cp.send(dcur.cbuf(), next_of(cp), {.tag = kDkv});
      auto dwr = cp.recv(dnxt.buf(), prev_of(cp), {.tag = kDkv});
      dws->wait();
      dwr->wait();
      std::swap(dcur, dnxt);
    }
  }
  st.finish(cache, dcur, dk, dv);
}

#define SHARDCHECK_CP_RING(T)                                                                  \
  template ref::Tensor<T> ring_attention_forward(comm::Communicator&, const ref::Tensor<T>&,   \
                                                 const ref::Tensor<T>&, const ref::Tensor<T>&, \
                                                 CpAttentionCache<T>&);                        \
  template void ring_attention_backward(comm::Communicator&, const ref::Tensor<T>&,            \
                                        const CpAttentionCache<T>&, ref::Tensor<T>&,           \
                                        ref::Tensor<T>&, ref::Tensor<T>&);
SHARDCHECK_CP_RING(double)
SHARDCHECK_CP_RING(float)
SHARDCHECK_CP_RING(Meta<double>)
SHARDCHECK_CP_RING(Meta<float>)
#undef SHARDCHECK_CP_RING

}  // namespace shardcheck::parallel::detail
