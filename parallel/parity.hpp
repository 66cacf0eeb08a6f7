// The parity measure of DESIGN.md's parity rule, shared by the harness runner and the tests:
// relative error of a scalar (the loss) and of a tensor (max |got - want| / max |want|, since an
// element-wise relative error is meaningless for entries that pass through zero), and a tensor's
// model's norm-wise relative error. NaN -> infinity.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

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

// Norm-wise relative error over a whole model, ||got - want||_2 / ||want||_2 over every tensor of
// `want` (a tensor missing from `got` or of another shape: infinite): one element off by an ulp
// barely moves it, a systematic error in many elements does. `most_in` (may be null) receives the
// tensor with the largest share.
inline double model_norm_err(const ref::ParamMap<double>& got, const ref::ParamMap<double>& want,
                             std::string* most_in = nullptr) {
  double dd = 0.0, ww = 0.0, largest = -1.0;
  for (const auto& e : want) {
    const ref::Tensor<double>* t = got.find(e.name);
    double d2 = 0.0;
    if (t == nullptr || t->shape() != e.value.shape()) {
      d2 = INFINITY;
    } else {
      for (int64_t i = 0; i < e.value.numel(); ++i) {
        const double d = (*t)[i] - e.value[i];
        d2 += d == d ? d * d : INFINITY;
        ww += e.value[i] * e.value[i];
      }
    }
    dd += d2;
    if (!(d2 <= largest)) {
      largest = d2;
      if (most_in != nullptr) *most_in = e.name;
    }
  }
  const double err = ww > 0.0 ? std::sqrt(dd / ww) : std::sqrt(dd);
  return err == err ? err : INFINITY;
}

}  // namespace shardcheck::parallel
