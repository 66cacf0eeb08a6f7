// AdamW over a flat range of parameters, element by element the reference's arithmetic
// (ref::AdamW::step): p *= 1 - lr * wd where decay[i] is set (2-D weights), bias-corrected
// moments at update count t, p -= lr * mhat / (sqrt(vhat) + eps). Shared by the data-parallel
// engine and the mesh engine, which hold their optimizer state as flat shards.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "reference/config.hpp"

namespace shardcheck::parallel {

template <class T>
void adamw_range(const ref::OptimizerConfig& o, int t, double lr, std::span<T> p,
                 std::span<const T> g, std::span<T> m, std::span<T> v,
                 std::span<const std::uint8_t> decay) {
  const double bc1 = 1.0 - std::pow(o.beta1, t);
  const double bc2 = 1.0 - std::pow(o.beta2, t);
  const auto b1 = static_cast<T>(o.beta1), b2 = static_cast<T>(o.beta2);
  const auto eps = static_cast<T>(o.eps);
  const auto decay_on = static_cast<T>(1.0 - lr * o.weight_decay);
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] *= decay[i] != 0 ? decay_on : T{1};
    m[i] = b1 * m[i] + (T{1} - b1) * g[i];
    v[i] = b2 * v[i] + (T{1} - b2) * g[i] * g[i];
    const T mhat = m[i] / static_cast<T>(bc1);
    const T vhat = v[i] / static_cast<T>(bc2);
    p[i] -= static_cast<T>(lr) * mhat / (std::sqrt(vhat) + eps);
  }
}

}  // namespace shardcheck::parallel
