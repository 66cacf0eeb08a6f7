// Attention as three plain loops per head (scores, softmax, weighted sum), with the dropout mask
// redrawn from the counter-based RNG in backward instead of stored (so recompute reproduces it).
#include "reference/attention.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "reference/compute.hpp"
#include "reference/testing.hpp"

namespace shardcheck::ref {

template <class T>
void rope_apply(Tensor<T>& x, std::span<const int32_t> positions, int heads, bool inverse,
                const RopeConfig& rope) {
  const int64_t s = x.dim(0);
  const int64_t d = x.dim(1) / heads;
  REF_CHECK(d % 2 == 0, "RoPE needs an even head dimension");
  const int shift = testing::mutated(testing::Mutation::kRopeOffByOne) ? 1 : 0;
  const std::vector<double> freqs = rope.frequencies(static_cast<int>(d));
  const bool half = rope.layout == RopeLayout::kHalf;
  for (int64_t t = 0; t < s; ++t) {
    const double pos = positions[static_cast<size_t>(t)] + shift;
    for (int64_t j = 0; j < d / 2; ++j) {
      const double angle = (inverse ? -pos : pos) * freqs[static_cast<size_t>(j)];
      const auto c = static_cast<T>(std::cos(angle)), sn = static_cast<T>(std::sin(angle));
      const int64_t c0 = half ? j : 2 * j, c1 = half ? j + d / 2 : 2 * j + 1;
      for (int h = 0; h < heads; ++h) {
        T& x0 = x.at(t, h * d + c0);
        T& x1 = x.at(t, h * d + c1);
        const T a = x0, b = x1;
        x0 = a * c - b * sn;
        x1 = a * sn + b * c;
      }
    }
  }
}

namespace {
bool visible(std::span<const int32_t> doc_ids, int64_t i, int64_t j) {
  if (j > i) return false;
  if (testing::mutated(testing::Mutation::kNoDocumentMask)) return true;
  return doc_ids[static_cast<size_t>(i)] == doc_ids[static_cast<size_t>(j)];
}

// The mask of the local heads (local head h is global head head_offset + h).
struct DropMask {
  int head_offset;
  AttentionDropoutMask mask;
  DropMask(const AttentionDropout& c, int local_heads, int64_t len)
      : head_offset(c.head_offset), mask(c, c.total_heads > 0 ? c.total_heads : local_heads, len) {}
  double operator()(int h, int64_t i, int64_t j) const { return mask.scale(head_offset + h, i, j); }
};
}  // namespace

AttentionDropoutMask::AttentionDropoutMask(const AttentionDropout& dropout, int total_heads,
                                           int64_t s)
    : cfg_(dropout),
      rng_(RngStream::of(dropout.seed, "dropout/layers." + std::to_string(dropout.layer),
                         dropout.step)),
      total_heads_(total_heads),
      s_(s) {
  REF_CHECK(total_heads > 0 && s >= 0, "dropout mask needs total_heads > 0 and s >= 0");
}

double AttentionDropoutMask::scale(int64_t head, int64_t i, int64_t j) const {
  if (cfg_.rate <= 0.0) return 1.0;
  const auto idx = static_cast<uint64_t>(((cfg_.sequence * total_heads_ + head) * s_ + i) * s_ + j);
  return rng_.uniform(idx) >= cfg_.rate ? 1.0 / (1.0 - cfg_.rate) : 0.0;
}

double attention_dropout_scale(const AttentionDropout& dropout, int total_heads, int64_t s,
                               int64_t head, int64_t i, int64_t j) {
  return AttentionDropoutMask(dropout, total_heads, s).scale(head, i, j);
}

template <class T>
Tensor<T> attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                            std::span<const int32_t> doc_ids, AttentionShape shape,
                            const AttentionDropout& dropout,
                            std::type_identity_t<Tensor<T>>* probs) {
  const int64_t s = q.dim(0);
  const int a = shape.heads, kv = shape.kv_heads;
  REF_CHECK(a % kv == 0, "heads must be a multiple of kv_heads");
  const int64_t d = q.dim(1) / a;
  REF_CHECK(k.dim(1) == kv * d && v.dim(1) == kv * d, "k/v width != kv_heads * head_dim");
  Tensor<T> o({s, a * d});
  if (probs) *probs = Tensor<T>({a, s, s});
  if (on_device<T>([&](ComputeOps<T>& dev) {
        return dev.attention_forward(q, k, v, doc_ids, shape, dropout, o, probs);
      }))
    return o;
  const T scale = T{1} / std::sqrt(static_cast<T>(d));
  const DropMask mask(dropout, a, s);
  std::vector<T> p(static_cast<size_t>(s));
  for (int h = 0; h < a; ++h) {
    const int64_t g = h / (a / kv);
    for (int64_t i = 0; i < s; ++i) {
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < s; ++j) {
        if (!visible(doc_ids, i, j)) continue;
        T dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q.at(i, h * d + c) * k.at(j, g * d + c);
        p[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      T sum = 0;
      for (int64_t j = 0; j < s; ++j) {
        T& pj = p[static_cast<size_t>(j)];
        pj = visible(doc_ids, i, j) ? std::exp(pj - mx) : T{0};
        sum += pj;
      }
      for (int64_t j = 0; j < s; ++j) {
        T& pj = p[static_cast<size_t>(j)];
        pj /= sum;
        if (probs) (*probs)[(h * s + i) * s + j] = pj;
        const T w = pj * static_cast<T>(mask(h, i, j));
        if (w == T{0}) continue;
        for (int64_t c = 0; c < d; ++c) o.at(i, h * d + c) += w * v.at(j, g * d + c);
      }
    }
  }
  return o;
}

template <class T>
void attention_backward(const Tensor<T>& dout, const Tensor<T>& q, const Tensor<T>& k,
                        const Tensor<T>& v, AttentionShape shape, const AttentionDropout& dropout,
                        const Tensor<T>& probs, Tensor<T>& dq, Tensor<T>& dk, Tensor<T>& dv) {
  const int64_t s = q.dim(0);
  const int a = shape.heads, kv = shape.kv_heads;
  const int64_t d = q.dim(1) / a;
  dq = Tensor<T>(q.shape());
  dk = Tensor<T>(k.shape());
  dv = Tensor<T>(v.shape());
  if (on_device<T>([&](ComputeOps<T>& dev) {
        return dev.attention_backward(dout, q, k, v, shape, dropout, probs, dq, dk, dv);
      }))
    return;
  const T scale = T{1} / std::sqrt(static_cast<T>(d));
  const DropMask mask(dropout, a, s);
  std::vector<T> dp(static_cast<size_t>(s));
  for (int h = 0; h < a; ++h) {
    const int64_t g = h / (a / kv);
    for (int64_t i = 0; i < s; ++i) {
      T dot_pdp = 0;
      for (int64_t j = 0; j < s; ++j) {
        const T pj = probs[(h * s + i) * s + j];
        const auto m = static_cast<T>(mask(h, i, j));
        T dpd = 0;  // d loss / d (dropped probability)
        for (int64_t c = 0; c < d; ++c) {
          dpd += dout.at(i, h * d + c) * v.at(j, g * d + c);
          dv.at(j, g * d + c) += pj * m * dout.at(i, h * d + c);
        }
        dp[static_cast<size_t>(j)] = dpd * m;
        dot_pdp += pj * dp[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < s; ++j) {
        const T pj = probs[(h * s + i) * s + j];
        if (pj == T{0}) continue;
        const T ds = pj * (dp[static_cast<size_t>(j)] - dot_pdp) * scale;
        for (int64_t c = 0; c < d; ++c) {
          dq.at(i, h * d + c) += ds * k.at(j, g * d + c);
          dk.at(j, g * d + c) += ds * q.at(i, h * d + c);
        }
      }
    }
  }
}

#define REF_INSTANTIATE(T)                                                                      \
  template void rope_apply(Tensor<T>&, std::span<const int32_t>, int, bool, const RopeConfig&); \
  template Tensor<T> attention_forward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,    \
                                       std::span<const int32_t>, AttentionShape,                \
                                       const AttentionDropout&, Tensor<T>*);                    \
  template void attention_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,        \
                                   const Tensor<T>&, AttentionShape, const AttentionDropout&,   \
                                   const Tensor<T>&, Tensor<T>&, Tensor<T>&, Tensor<T>&);
REF_INSTANTIATE(double)
REF_INSTANTIATE(float)
#undef REF_INSTANTIATE

}  // namespace shardcheck::ref
