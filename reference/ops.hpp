// The model's pointwise and matrix ops on [rows, features] tensors, forward and backward side by
// side. Backward functions return the input gradient and ADD into parameter gradients (so gradients
// accumulate over sequences and microbatches). Attention and MoE live in attention.hpp and moe.hpp.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "reference/tensor.hpp"

namespace shardcheck::ref {

inline constexpr double kRmsNormEps = 1e-5;

// y[t] = table[tokens[t]]; table [V, h].
template <class T>
Tensor<T> embedding_forward(const Tensor<T>& table, std::span<const int32_t> tokens);
template <class T>
void embedding_backward(const Tensor<T>& dy, std::span<const int32_t> tokens, Tensor<T>& dtable);

// y = x / sqrt(mean(x^2) + 1e-5) * w, per row. rstd receives 1/sqrt(mean(x^2) + eps) per row.
template <class T>
Tensor<T> rmsnorm_forward(const Tensor<T>& x, const Tensor<T>& w,
                          std::type_identity_t<std::vector<T>>* rstd = nullptr);
template <class T>
Tensor<T> rmsnorm_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,
                           const std::vector<T>& rstd, Tensor<T>& dw);

// y = x . W with W [in, out].
template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& w);
template <class T>
Tensor<T> linear_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,
                          Tensor<T>& dw);

// y = x . W^T with W [out, in]: the tied LM head reads the embedding table [V, h] this way.
template <class T>
Tensor<T> linear_t_forward(const Tensor<T>& x, const Tensor<T>& w);
template <class T>
Tensor<T> linear_t_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,
                            Tensor<T>& dw);

// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class T>
Tensor<T> gelu_forward(const Tensor<T>& x);
template <class T>
Tensor<T> gelu_backward(const Tensor<T>& dy, const Tensor<T>& x);

// silu(x) = x * sigmoid(x). SwiGLU's activation: act = silu(gate) * up (elementwise); the
// backward returns d(gate) and d(up) for d(act). Always on the CPU (no device hook).
template <class T>
Tensor<T> swiglu_forward(const Tensor<T>& gate, const Tensor<T>& up);
template <class T>
void swiglu_backward(const Tensor<T>& dact, const Tensor<T>& gate, const Tensor<T>& up,
                     Tensor<T>& dgate, Tensor<T>& dup);

// MLP: w_down(gelu(x . w_up)) when w_gate is null, else SwiGLU w_down(silu(x . w_gate) * (x .
// w_up)) (ModelConfig::mlp). The cache keeps the pre-activations (gate empty for GELU) and the
// activation.
template <class T>
struct MlpCache {
  Tensor<T> gate;
  Tensor<T> up;
  Tensor<T> act;
};
template <class T>
Tensor<T> mlp_forward(const Tensor<T>& x, const std::type_identity_t<Tensor<T>>* w_gate,
                      const Tensor<T>& w_up, const Tensor<T>& w_down,
                      std::type_identity_t<MlpCache<T>>* cache = nullptr);
// dw_gate must be non-null exactly when w_gate is.
template <class T>
Tensor<T> mlp_backward(const Tensor<T>& dy, const Tensor<T>& x,
                       const std::type_identity_t<Tensor<T>>* w_gate, const Tensor<T>& w_up,
                       const Tensor<T>& w_down, const MlpCache<T>& cache,
                       std::type_identity_t<Tensor<T>>* dw_gate, Tensor<T>& dw_up,
                       Tensor<T>& dw_down);

// Per-row cross-entropy logsumexp(logits) - logits[target], 0 where mask == 0 (returned in f64).
template <class T>
std::vector<double> cross_entropy_forward(const Tensor<T>& logits, std::span<const int32_t> targets,
                                          std::span<const int32_t> mask);
// dlogits = weight[t] * (softmax(logits[t]) - onehot(target[t])); weight 0 rows get zero gradient.
template <class T>
Tensor<T> cross_entropy_backward(const Tensor<T>& logits, std::span<const int32_t> targets,
                                 std::span<const double> weight);

template <class T>
void add_inplace(Tensor<T>& a, const Tensor<T>& b) {
  REF_CHECK(a.numel() == b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) a[i] += b[i];
}

}  // namespace shardcheck::ref
