// The parity measure of DESIGN.md's parity rule, shared by the harness runner and the tests:
// relative error of a scalar (the loss) and of a tensor (max |got - want| / max |want|, since an
// element-wise relative error is meaningless for entries that pass through zero), and a tensor's
// norm-wise relative error. NaN -> infinity.
#pragma once

#include <algorithm>
#include <cmath>

#include "reference/tensor.hpp"

namespace shardcheck::parallel {

inline double rel_err(double got, double want) {
  const double d = std::abs(got - want);
  if (!(d == d)) return INFINITY;
  return want != 0.0 ? d / std::abs(want) : d;
}

inline double tensor_rel_err(const ref::Tensor<double>& got, const ref::Tensor<double>& want) {
  if (got.shape() != want.shape()) return INFINITY;
  double diff = 0.0, scale = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    if (!(d == d)) return INFINITY;
    diff = std::max(diff, d);
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// Norm-wise relative error ||got - want||_2 / ||want||_2: one element off by an ulp barely moves
// it, a systematic error in many elements does (a bf16 rounding that flips moves the max-abs error
// by a whole bf16 ulp).
inline double tensor_norm_err(const ref::Tensor<double>& got, const ref::Tensor<double>& want) {
  if (got.shape() != want.shape()) return INFINITY;
  double dd = 0.0, ww = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = got[i] - want[i];
    if (!(d == d)) return INFINITY;
    dd += d * d;
    ww += want[i] * want[i];
  }
  return ww > 0.0 ? std::sqrt(dd / ww) : std::sqrt(dd);
}

}  // namespace shardcheck::parallel
