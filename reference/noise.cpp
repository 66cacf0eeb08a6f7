// RoundingNoise (noise.hpp): each op runs the CPU loops (the thread's Compute is set to none for
// the call), then its results move by one ulp each.
#include "reference/noise.hpp"

#include <cmath>
#include <limits>

#include "reference/attention.hpp"
#include "reference/ops.hpp"

namespace shardcheck::ref {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <class T>
T step(T v, bool up) {
  return std::nextafter(
      v, up ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity());
}

}  // namespace

bool RoundingNoise::coin(std::size_t i) const {
  return (mix(seed_ ^ mix(call_ * 0x100000001b3ULL + i)) & 1U) != 0;
}

// Exact zeros stay: a masked or unused element is zero in every summation order.
template <class T>
void RoundingNoise::jitter(Tensor<T>& t) {
  ++call_;
  for (std::size_t i = 0; i < t.vec().size(); ++i)
    if (t.vec()[i] != T{0}) t.vec()[i] = step(t.vec()[i], coin(i));
}

// The accumulated value moves by one of its own ulps (a reordered accumulation differs by ulp of
// the sum, not of the increment: before + step(increment) would round back to the same sum).
template <class T>
void RoundingNoise::jitter_increment(Tensor<T>& t, const Tensor<T>& before) {
  ++call_;
  for (std::size_t i = 0; i < t.vec().size(); ++i)
    if (t.vec()[i] != before.vec()[i] && t.vec()[i] != T{0}) t.vec()[i] = step(t.vec()[i], coin(i));
}

#define SHARDCHECK_NOISE_DEFS(T)                                                                   \
  bool RoundingNoise::linear_forward(const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y) {       \
    const ComputeScope cpu(nullptr);                                                               \
    y = ref::linear_forward(x, w);                                                                 \
    jitter(y);                                                                                     \
    return true;                                                                                   \
  }                                                                                                \
  bool RoundingNoise::linear_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w, \
                                      Tensor<T>& dx, Tensor<T>& dw) {                              \
    const ComputeScope cpu(nullptr);                                                               \
    const Tensor<T> before = dw;                                                                   \
    dx = ref::linear_backward(dy, x, w, dw);                                                       \
    jitter(dx);                                                                                    \
    jitter_increment(dw, before);                                                                  \
    return true;                                                                                   \
  }                                                                                                \
  bool RoundingNoise::linear_t_forward(const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y) {     \
    const ComputeScope cpu(nullptr);                                                               \
    y = ref::linear_t_forward(x, w);                                                               \
    jitter(y);                                                                                     \
    return true;                                                                                   \
  }                                                                                                \
  bool RoundingNoise::linear_t_backward(const Tensor<T>& dy, const Tensor<T>& x,                   \
                                        const Tensor<T>& w, Tensor<T>& dx, Tensor<T>& dw) {        \
    const ComputeScope cpu(nullptr);                                                               \
    const Tensor<T> before = dw;                                                                   \
    dx = ref::linear_t_backward(dy, x, w, dw);                                                     \
    jitter(dx);                                                                                    \
    jitter_increment(dw, before);                                                                  \
    return true;                                                                                   \
  }                                                                                                \
  bool RoundingNoise::rmsnorm_forward(const Tensor<T>& x, const Tensor<T>& w, Tensor<T>& y,        \
                                      std::vector<T>* rstd) {                                      \
    const ComputeScope cpu(nullptr);                                                               \
    y = ref::rmsnorm_forward(x, w, rstd);                                                          \
    jitter(y);                                                                                     \
    return true;                                                                                   \
  }                                                                                                \
  bool RoundingNoise::rmsnorm_backward(const Tensor<T>& dy, const Tensor<T>& x,                    \
                                       const Tensor<T>& w, const std::vector<T>& rstd,             \
                                       Tensor<T>& dx, Tensor<T>& dw) {                             \
    const ComputeScope cpu(nullptr);                                                               \
    const Tensor<T> before = dw;                                                                   \
    dx = ref::rmsnorm_backward(dy, x, w, rstd, dw);                                                \
    jitter(dx);                                                                                    \
    jitter_increment(dw, before);                                                                  \
    return true;                                                                                   \
  }                                                                                                \
  bool RoundingNoise::attention_forward(const Tensor<T>& q, const Tensor<T>& k,                    \
                                        const Tensor<T>& v, std::span<const int32_t> doc_ids,      \
                                        AttentionShape shape, const AttentionDropout& dropout,     \
                                        Tensor<T>& o, Tensor<T>* probs) {                          \
    const ComputeScope cpu(nullptr);                                                               \
    o = ref::attention_forward(q, k, v, doc_ids, shape, dropout, probs);                           \
    jitter(o);                                                                                     \
    return true;                                                                                   \
  }                                                                                                \
  bool RoundingNoise::attention_backward(                                                          \
      const Tensor<T>& dout, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,           \
      AttentionShape shape, const AttentionDropout& dropout, const Tensor<T>& probs,               \
      Tensor<T>& dq, Tensor<T>& dk, Tensor<T>& dv) {                                               \
    const ComputeScope cpu(nullptr);                                                               \
    ref::attention_backward(dout, q, k, v, shape, dropout, probs, dq, dk, dv);                     \
    jitter(dq);                                                                                    \
    jitter(dk);                                                                                    \
    jitter(dv);                                                                                    \
    return true;                                                                                   \
  }
SHARDCHECK_NOISE_DEFS(double)
SHARDCHECK_NOISE_DEFS(float)
#undef SHARDCHECK_NOISE_DEFS

}  // namespace shardcheck::ref
