// AdamW, schedule and clipping in plain loops; arithmetic in T (the master-weight type) with the
// scalar coefficients computed in f64 first, as the formulas in optim.hpp say.
#include "reference/optim.hpp"

#include <cmath>
#include <numbers>

namespace shardcheck::ref {

double lr_at(const OptimizerConfig& opt, int step, int total_steps) {
  if (opt.warmup > 0 && step <= opt.warmup)
    return opt.lr * static_cast<double>(step) / static_cast<double>(opt.warmup);
  const int decay_steps = total_steps - opt.warmup;
  if (decay_steps <= 0) return opt.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - opt.warmup) / static_cast<double>(decay_steps));
  return opt.min_lr + (opt.lr - opt.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

template <class T>
double global_grad_norm(const ParamMap<T>& grads) {
  double sq = 0.0;
  for (const auto& e : grads)
    for (const T g : e.value.vec()) sq += static_cast<double>(g) * static_cast<double>(g);
  return std::sqrt(sq);
}

double clip_factor(double norm, double max_norm) {
  // Deliberately skips at norm <= max_norm (PyTorch would still scale by max / (norm + 1e-6) when
  // norm > max - 1e-6): the pinned rule, documented in optim.hpp and README.md.
  if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

template <class T>
double clip_grad_norm(ParamMap<T>& grads, double norm, double max_norm) {
  const double factor = clip_factor(norm, max_norm);
  if (factor == 1.0) return 1.0;
  for (auto& e : grads)
    for (T& g : e.value.vec()) g = static_cast<T>(g * factor);
  return factor;
}

template <class T>
AdamW<T>::AdamW(const OptimizerConfig& opt, const ParamMap<T>& params)
    : opt_(opt), m_(params.zeros_like()), v_(params.zeros_like()) {}

template <class T>
void AdamW<T>::step(ParamMap<T>& params, const ParamMap<T>& grads, double lr) {
  ++t_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, t_);
  const double bc2 = 1.0 - std::pow(opt_.beta2, t_);
  const auto b1 = static_cast<T>(opt_.beta1), b2 = static_cast<T>(opt_.beta2);
  const auto eps = static_cast<T>(opt_.eps);
  for (auto& e : params) {
    Tensor<T>& p = e.value;
    const Tensor<T>& g = grads[e.name];
    Tensor<T>& m = m_[e.name];
    Tensor<T>& v = v_[e.name];
    const auto decay = static_cast<T>(p.rank() == 2 ? 1.0 - lr * opt_.weight_decay : 1.0);
    for (int64_t i = 0; i < p.numel(); ++i) {
      p[i] *= decay;
      m[i] = b1 * m[i] + (T{1} - b1) * g[i];
      v[i] = b2 * v[i] + (T{1} - b2) * g[i] * g[i];
      const T mhat = m[i] / static_cast<T>(bc1);
      const T vhat = v[i] / static_cast<T>(bc2);
      p[i] -= static_cast<T>(lr) * mhat / (std::sqrt(vhat) + eps);
    }
  }
}

template <class T>
void AdamW<T>::restore(ParamMap<T> exp_avg, ParamMap<T> exp_avg_sq, int steps_taken) {
  for (const auto& e : m_) {
    REF_CHECK(exp_avg.contains(e.name) && exp_avg[e.name].shape() == e.value.shape(),
              "optimizer state does not match parameter " + e.name);
    REF_CHECK(exp_avg_sq.contains(e.name) && exp_avg_sq[e.name].shape() == e.value.shape(),
              "optimizer state does not match parameter " + e.name);
  }
  m_ = std::move(exp_avg);
  v_ = std::move(exp_avg_sq);
  t_ = steps_taken;
}

template double global_grad_norm(const ParamMap<double>&);
template double global_grad_norm(const ParamMap<float>&);
template double clip_grad_norm(ParamMap<double>&, double, double);
template double clip_grad_norm(ParamMap<float>&, double, double);
template class AdamW<double>;
template class AdamW<float>;

}  // namespace shardcheck::ref
