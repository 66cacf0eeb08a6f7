// Timing-only element types for the model-parallel pieces (tp_block, cp_attention, cp_ring,
// ep_moe, vocab_parallel, tokens): Meta<T> stands for T, and ref::Tensor<Meta<T>> is a shape
// without storage. Instantiated with Meta<T>, each piece issues the same collectives (null buffers
// of the same counts and T's dtype) and the same compute reports (T's bytes) in the same order
// as with T, and computes nothing: the planner times the engine's own block this way
// (mesh_timing.cpp). Where a piece's traffic depends on its data (MoE routing), the
// timing-only run follows a stated assumption (ep_moe.hpp's MoeRouting). The ref ops a block calls
// have shape-only overloads here, more specialised than the numeric templates; code that reads or
// writes elements does not compile for Meta and sits behind `if constexpr (kIsMeta<T>)`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/buffer.hpp"
#include "comm/dtype.hpp"
#include "reference/attention.hpp"
#include "reference/ops.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

template <class T>
struct Meta {};

template <class T>
inline constexpr bool kIsMeta = false;
template <class T>
inline constexpr bool kIsMeta<Meta<T>> = true;

template <class T>
struct NumericOf {
  using type = T;
};
template <class T>
struct NumericOf<Meta<T>> {
  using type = T;
};
// The numeric type an element type stands for (itself when numeric).
template <class T>
using numeric_of_t = typename NumericOf<T>::type;
// Bytes and communication dtype of one element as the numeric run holds it.
template <class T>
inline constexpr double kElemBytes = static_cast<double>(sizeof(numeric_of_t<T>));
template <class T>
inline constexpr comm::DType kElemDType = comm::dtype_v<numeric_of_t<T>>;

// A tensor's elements for a collective: a view of them, or (Meta) a null buffer of as many.
template <class T>
comm::Buffer buffer_of(ref::Tensor<T>& t) {
  if constexpr (kIsMeta<T>)
    return comm::Buffer{nullptr, static_cast<std::size_t>(t.numel()), kElemDType<T>, {}};
  else
    return comm::view(t.span());
}
template <class T>
comm::ConstBuffer cbuffer_of(const ref::Tensor<T>& t) {
  if constexpr (kIsMeta<T>)
    return comm::ConstBuffer{nullptr, static_cast<std::size_t>(t.numel()), kElemDType<T>, {}};
  else
    return comm::cview(t.span());
}

// The same for a vector of elements.
template <class T>
comm::Buffer buffer_of(std::vector<T>& v) {
  if constexpr (kIsMeta<T>)
    return comm::Buffer{nullptr, v.size(), kElemDType<T>, {}};
  else
    return comm::view(std::span<T>(v));
}

}  // namespace shardcheck::parallel

namespace shardcheck::ref {

// A shape and no elements.
template <class U>
class Tensor<parallel::Meta<U>> {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape) : shape_(std::move(shape)), numel_(numel_of(shape_)) {}
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(static_cast<std::size_t>(i)); }
  int64_t numel() const { return numel_; }

 private:
  Shape shape_;
  int64_t numel_ = 0;
};

template <class U>
using MetaTensor = Tensor<parallel::Meta<U>>;
template <class U>
using MetaVec = std::vector<parallel::Meta<U>>;

// The shapes of ops.hpp's and attention.hpp's results.
template <class U>
MetaTensor<U> rmsnorm_forward(const MetaTensor<U>& x, const MetaTensor<U>& /*w*/,
                              MetaVec<U>* /*rstd*/ = nullptr) {
  return MetaTensor<U>(x.shape());
}
template <class U>
MetaTensor<U> rmsnorm_backward(const MetaTensor<U>& dy, const MetaTensor<U>& /*x*/,
                               const MetaTensor<U>& /*w*/, const MetaVec<U>& /*rstd*/,
                               MetaTensor<U>& /*dw*/) {
  return MetaTensor<U>(dy.shape());
}
template <class U>
MetaTensor<U> linear_forward(const MetaTensor<U>& x, const MetaTensor<U>& w) {
  return MetaTensor<U>({x.dim(0), w.dim(1)});
}
template <class U>
MetaTensor<U> linear_backward(const MetaTensor<U>& /*dy*/, const MetaTensor<U>& x,
                              const MetaTensor<U>& /*w*/, MetaTensor<U>& /*dw*/) {
  return MetaTensor<U>(x.shape());
}
template <class U>
MetaTensor<U> linear_t_forward(const MetaTensor<U>& x, const MetaTensor<U>& w) {
  return MetaTensor<U>({x.dim(0), w.dim(0)});
}
template <class U>
MetaTensor<U> linear_t_backward(const MetaTensor<U>& dy, const MetaTensor<U>& x,
                                const MetaTensor<U>& w, MetaTensor<U>& dw) {
  return linear_backward(dy, x, w, dw);  // the same shapes: dx like x
}
template <class U>
MetaTensor<U> mlp_forward(const MetaTensor<U>& x, const MetaTensor<U>* w_gate,
                          const MetaTensor<U>& w_up, const MetaTensor<U>& w_down,
                          MlpCache<parallel::Meta<U>>* cache = nullptr) {
  if (cache != nullptr) {
    cache->up = MetaTensor<U>({x.dim(0), w_up.dim(1)});
    if (w_gate != nullptr) cache->gate = cache->up;
    cache->act = cache->up;
  }
  return MetaTensor<U>({x.dim(0), w_down.dim(1)});
}
template <class U>
MetaTensor<U> mlp_backward(const MetaTensor<U>& /*dy*/, const MetaTensor<U>& x,
                           const MetaTensor<U>* /*w_gate*/, const MetaTensor<U>& /*w_up*/,
                           const MetaTensor<U>& /*w_down*/,
                           const MlpCache<parallel::Meta<U>>& /*cache*/, MetaTensor<U>* /*dw_gate*/,
                           MetaTensor<U>& /*dw_up*/, MetaTensor<U>& /*dw_down*/) {
  return MetaTensor<U>(x.shape());
}
template <class U>
void add_inplace(MetaTensor<U>& a, const MetaTensor<U>& b) {
  REF_CHECK(a.numel() == b.numel());
}
template <class U>
void rope_apply(MetaTensor<U>& /*x*/, std::span<const int32_t> /*positions*/, int /*heads*/,
                bool /*inverse*/, const RopeConfig& /*rope*/) {}
// q [s, heads*d]: the output is q's shape, the probabilities [heads, s, s].
template <class U>
MetaTensor<U> attention_forward(const MetaTensor<U>& q, const MetaTensor<U>& /*k*/,
                                const MetaTensor<U>& /*v*/, std::span<const int32_t> /*doc_ids*/,
                                AttentionShape shape, const AttentionDropout& /*dropout*/,
                                MetaTensor<U>* probs = nullptr) {
  if (probs != nullptr) *probs = MetaTensor<U>({shape.heads, q.dim(0), q.dim(0)});
  return MetaTensor<U>(q.shape());
}
template <class U>
void attention_backward(const MetaTensor<U>& /*dout*/, const MetaTensor<U>& q,
                        const MetaTensor<U>& k, const MetaTensor<U>& v, AttentionShape /*shape*/,
                        const AttentionDropout& /*dropout*/, const MetaTensor<U>& /*probs*/,
                        MetaTensor<U>& dq, MetaTensor<U>& dk, MetaTensor<U>& dv) {
  dq = MetaTensor<U>(q.shape());
  dk = MetaTensor<U>(k.shape());
  dv = MetaTensor<U>(v.shape());
}

}  // namespace shardcheck::ref
