// Plain-loop implementations of ops.hpp, instantiated for double and float. No blocking, no SIMD:
// the reference must be easy to read against the formulas in reference/README.md.
#include "reference/ops.hpp"

#include <cmath>
#include <numbers>

#include "reference/compute.hpp"

namespace shardcheck::ref {

template <class T>
Tensor<T> embedding_forward(const Tensor<T>& table, std::span<const int32_t> tokens) {
  const int64_t v = table.dim(0), h = table.dim(1);
  Tensor<T> y({static_cast<int64_t>(tokens.size()), h});
  for (size_t t = 0; t < tokens.size(); ++t) {
    REF_CHECK(tokens[t] >= 0 && tokens[t] < v, "token out of vocabulary");
    for (int64_t c = 0; c < h; ++c) y.at(static_cast<int64_t>(t), c) = table.at(tokens[t], c);
  }
  return y;
}

template <class T>
void embedding_backward(const Tensor<T>& dy, std::span<const int32_t> tokens, Tensor<T>& dtable) {
  const int64_t h = dtable.dim(1);
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int64_t c = 0; c < h; ++c) dtable.at(tokens[t], c) += dy.at(static_cast<int64_t>(t), c);
}

template <class T>
Tensor<T> rmsnorm_forward(const Tensor<T>& x, const Tensor<T>& w,
                          std::type_identity_t<std::vector<T>>* rstd) {
  const int64_t n = x.dim(0), h = x.dim(1);
  REF_CHECK(w.numel() == h);
  Tensor<T> y(x.shape());
  if (rstd) rstd->assign(static_cast<size_t>(n), T{0});
  if (on_device<T>([&](ComputeOps<T>& dev) { return dev.rmsnorm_forward(x, w, y, rstd); }))
    return y;
  for (int64_t r = 0; r < n; ++r) {
    T ss = 0;
    for (int64_t c = 0; c < h; ++c) ss += x.at(r, c) * x.at(r, c);
    const T inv = T{1} / std::sqrt(ss / static_cast<T>(h) + static_cast<T>(kRmsNormEps));
    for (int64_t c = 0; c < h; ++c) y.at(r, c) = x.at(r, c) * inv * w[c];
    if (rstd) (*rstd)[static_cast<size_t>(r)] = inv;
  }
  return y;
}

template <class T>
Tensor<T> rmsnorm_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,
                           const std::vector<T>& rstd, Tensor<T>& dw) {
  const int64_t n = x.dim(0), h = x.dim(1);
  Tensor<T> dx(x.shape());
  if (on_device<T>(
          [&](ComputeOps<T>& dev) { return dev.rmsnorm_backward(dy, x, w, rstd, dx, dw); }))
    return dx;
  for (int64_t r = 0; r < n; ++r) {
    const T inv = rstd[static_cast<size_t>(r)];
    T dot = 0;  // sum_c dy_c w_c x_c
    for (int64_t c = 0; c < h; ++c) {
      dot += dy.at(r, c) * w[c] * x.at(r, c);
      dw[c] += dy.at(r, c) * x.at(r, c) * inv;
    }
    const T k = inv * inv * inv * dot / static_cast<T>(h);
    for (int64_t c = 0; c < h; ++c) dx.at(r, c) = dy.at(r, c) * w[c] * inv - x.at(r, c) * k;
  }
  return dx;
}

template <class T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& w) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(1);
  REF_CHECK(w.dim(0) == in, "linear: x columns != W rows");
  Tensor<T> y({n, out});
  if (on_device<T>([&](ComputeOps<T>& dev) { return dev.linear_forward(x, w, y); })) return y;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < in; ++i) {
      const T xv = x.at(r, i);
      for (int64_t o = 0; o < out; ++o) y.at(r, o) += xv * w.at(i, o);
    }
  return y;
}

template <class T>
Tensor<T> linear_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,
                          Tensor<T>& dw) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(1);
  Tensor<T> dx({n, in});
  if (on_device<T>([&](ComputeOps<T>& dev) { return dev.linear_backward(dy, x, w, dx, dw); }))
    return dx;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < in; ++i) {
      T acc = 0;
      for (int64_t o = 0; o < out; ++o) {
        acc += dy.at(r, o) * w.at(i, o);
        dw.at(i, o) += x.at(r, i) * dy.at(r, o);
      }
      dx.at(r, i) = acc;
    }
  return dx;
}

template <class T>
Tensor<T> linear_t_forward(const Tensor<T>& x, const Tensor<T>& w) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  REF_CHECK(w.dim(1) == in, "linear_t: x columns != W columns");
  Tensor<T> y({n, out});
  if (on_device<T>([&](ComputeOps<T>& dev) { return dev.linear_t_forward(x, w, y); })) return y;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      T acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += x.at(r, i) * w.at(o, i);
      y.at(r, o) = acc;
    }
  return y;
}

template <class T>
Tensor<T> linear_t_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& w,
                            Tensor<T>& dw) {
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  Tensor<T> dx({n, in});
  if (on_device<T>([&](ComputeOps<T>& dev) { return dev.linear_t_backward(dy, x, w, dx, dw); }))
    return dx;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const T g = dy.at(r, o);
      for (int64_t i = 0; i < in; ++i) {
        dx.at(r, i) += g * w.at(o, i);
        dw.at(o, i) += g * x.at(r, i);
      }
    }
  return dx;
}

namespace {
template <class T>
constexpr T kGeluC = static_cast<T>(0.7978845608028654);  // sqrt(2/pi)
}

template <class T>
Tensor<T> gelu_forward(const Tensor<T>& x) {
  Tensor<T> y(x.shape());
  if (on_device<T>([&](ComputeOps<T>& dev) { return dev.gelu_forward(x, y); })) return y;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const T v = x[i];
    y[i] = T{0.5} * v * (T{1} + std::tanh(kGeluC<T> * (v + T{0.044715} * v * v * v)));
  }
  return y;
}

template <class T>
Tensor<T> gelu_backward(const Tensor<T>& dy, const Tensor<T>& x) {
  Tensor<T> dx(x.shape());
  if (on_device<T>([&](ComputeOps<T>& dev) { return dev.gelu_backward(dy, x, dx); })) return dx;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const T v = x[i];
    const T th = std::tanh(kGeluC<T> * (v + T{0.044715} * v * v * v));
    const T dinner = kGeluC<T> * (T{1} + T{3} * T{0.044715} * v * v);
    dx[i] = dy[i] * (T{0.5} * (T{1} + th) + T{0.5} * v * (T{1} - th * th) * dinner);
  }
  return dx;
}

template <class T>
Tensor<T> swiglu_forward(const Tensor<T>& gate, const Tensor<T>& up) {
  REF_CHECK(gate.numel() == up.numel());
  Tensor<T> y(gate.shape());
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const T g = gate[i];
    y[i] = g / (T{1} + std::exp(-g)) * up[i];
  }
  return y;
}

template <class T>
void swiglu_backward(const Tensor<T>& dact, const Tensor<T>& gate, const Tensor<T>& up,
                     Tensor<T>& dgate, Tensor<T>& dup) {
  dgate = Tensor<T>(gate.shape());
  dup = Tensor<T>(up.shape());
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const T g = gate[i];
    const T sig = T{1} / (T{1} + std::exp(-g));
    dup[i] = dact[i] * g * sig;                                    // d/d(up): silu(g)
    dgate[i] = dact[i] * up[i] * sig * (T{1} + g * (T{1} - sig));  // silu'(g) = s (1 + g (1 - s))
  }
}

template <class T>
Tensor<T> mlp_forward(const Tensor<T>& x, const std::type_identity_t<Tensor<T>>* w_gate,
                      const Tensor<T>& w_up, const Tensor<T>& w_down,
                      std::type_identity_t<MlpCache<T>>* cache) {
  Tensor<T> gate = w_gate ? linear_forward(x, *w_gate) : Tensor<T>{};
  Tensor<T> up = linear_forward(x, w_up);
  Tensor<T> act = w_gate ? swiglu_forward(gate, up) : gelu_forward(up);
  Tensor<T> y = linear_forward(act, w_down);
  if (cache) {
    cache->gate = std::move(gate);
    cache->up = std::move(up);
    cache->act = std::move(act);
  }
  return y;
}

template <class T>
Tensor<T> mlp_backward(const Tensor<T>& dy, const Tensor<T>& x,
                       const std::type_identity_t<Tensor<T>>* w_gate, const Tensor<T>& w_up,
                       const Tensor<T>& w_down, const MlpCache<T>& cache,
                       std::type_identity_t<Tensor<T>>* dw_gate, Tensor<T>& dw_up,
                       Tensor<T>& dw_down) {
  REF_CHECK((w_gate == nullptr) == (dw_gate == nullptr), "mlp_backward: gate and its gradient");
  Tensor<T> dact = linear_backward(dy, cache.act, w_down, dw_down);
  if (!w_gate) return linear_backward(gelu_backward(dact, cache.up), x, w_up, dw_up);
  Tensor<T> dgate, dup;
  swiglu_backward(dact, cache.gate, cache.up, dgate, dup);
  Tensor<T> dx = linear_backward(dgate, x, *w_gate, *dw_gate);
  add_inplace(dx, linear_backward(dup, x, w_up, dw_up));
  return dx;
}

template <class T>
std::vector<double> cross_entropy_forward(const Tensor<T>& logits, std::span<const int32_t> targets,
                                          std::span<const int32_t> mask) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  std::vector<double> loss(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < n; ++r)
    if (mask[static_cast<size_t>(r)]) {
      const int32_t tgt = targets[static_cast<size_t>(r)];
      REF_CHECK(tgt >= 0 && tgt < v, "target out of vocabulary");
    }
  if (on_device<T>([&](ComputeOps<T>& dev) {
        return dev.cross_entropy_forward(logits, targets, mask, loss);
      }))
    return loss;
  for (int64_t r = 0; r < n; ++r) {
    if (!mask[static_cast<size_t>(r)]) continue;
    const int32_t tgt = targets[static_cast<size_t>(r)];
    T mx = logits.at(r, 0);
    for (int64_t c = 1; c < v; ++c) mx = std::max(mx, logits.at(r, c));
    T sum = 0;
    for (int64_t c = 0; c < v; ++c) sum += std::exp(logits.at(r, c) - mx);
    loss[static_cast<size_t>(r)] = static_cast<double>(mx + std::log(sum) - logits.at(r, tgt));
  }
  return loss;
}

template <class T>
Tensor<T> cross_entropy_backward(const Tensor<T>& logits, std::span<const int32_t> targets,
                                 std::span<const double> weight) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  Tensor<T> d(logits.shape());
  if (on_device<T>([&](ComputeOps<T>& dev) {
        return dev.cross_entropy_backward(logits, targets, weight, d);
      }))
    return d;
  for (int64_t r = 0; r < n; ++r) {
    const auto wt = static_cast<T>(weight[static_cast<size_t>(r)]);
    if (wt == T{0}) continue;
    T mx = logits.at(r, 0);
    for (int64_t c = 1; c < v; ++c) mx = std::max(mx, logits.at(r, c));
    T sum = 0;
    for (int64_t c = 0; c < v; ++c) sum += std::exp(logits.at(r, c) - mx);
    for (int64_t c = 0; c < v; ++c) d.at(r, c) = wt * std::exp(logits.at(r, c) - mx) / sum;
    d.at(r, targets[static_cast<size_t>(r)]) -= wt;
  }
  return d;
}

#define REF_INSTANTIATE(T)                                                                        \
  template Tensor<T> embedding_forward(const Tensor<T>&, std::span<const int32_t>);               \
  template void embedding_backward(const Tensor<T>&, std::span<const int32_t>, Tensor<T>&);       \
  template Tensor<T> rmsnorm_forward(const Tensor<T>&, const Tensor<T>&, std::vector<T>*);        \
  template Tensor<T> rmsnorm_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,       \
                                      const std::vector<T>&, Tensor<T>&);                         \
  template Tensor<T> linear_forward(const Tensor<T>&, const Tensor<T>&);                          \
  template Tensor<T> linear_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,        \
                                     Tensor<T>&);                                                 \
  template Tensor<T> linear_t_forward(const Tensor<T>&, const Tensor<T>&);                        \
  template Tensor<T> linear_t_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,      \
                                       Tensor<T>&);                                               \
  template Tensor<T> gelu_forward(const Tensor<T>&);                                              \
  template Tensor<T> gelu_backward(const Tensor<T>&, const Tensor<T>&);                           \
  template Tensor<T> swiglu_forward(const Tensor<T>&, const Tensor<T>&);                          \
  template void swiglu_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, Tensor<T>&, \
                                Tensor<T>&);                                                      \
  template Tensor<T> mlp_forward(const Tensor<T>&, const Tensor<T>*, const Tensor<T>&,            \
                                 const Tensor<T>&, MlpCache<T>*);                                 \
  template Tensor<T> mlp_backward(const Tensor<T>&, const Tensor<T>&, const Tensor<T>*,           \
                                  const Tensor<T>&, const Tensor<T>&, const MlpCache<T>&,         \
                                  Tensor<T>*, Tensor<T>&, Tensor<T>&);                            \
  template std::vector<double> cross_entropy_forward(const Tensor<T>&, std::span<const int32_t>,  \
                                                     std::span<const int32_t>);                   \
  template Tensor<T> cross_entropy_backward(const Tensor<T>&, std::span<const int32_t>,           \
                                            std::span<const double>);

REF_INSTANTIATE(double)
REF_INSTANTIATE(float)
#undef REF_INSTANTIATE

}  // namespace shardcheck::ref
