// Parity's bounds from the noise probe (parity_bound.hpp).
#include "harness/parity_bound.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace shardcheck::harness {

const char* measure_name(Measure m) {
  switch (m) {
    case Measure::scalars:
      return "step scalars";
    case Measure::master_max:
      return "parameters, max-abs";
    case Measure::master_norm:
      return "parameters, norm-wise";
    case Measure::replicas:
      return "every copy against its owner";
  }
  return "?";
}

const char* measure_key(Measure m) {
  switch (m) {
    case Measure::scalars:
      return "scalars";
    case Measure::master_max:
      return "master_max";
    case Measure::master_norm:
      return "master_norm";
    case Measure::replicas:
      return "replicas";
  }
  return "?";
}

void StepErrors::note(Measure m, double e, const std::string& what) {
  const auto i = static_cast<std::size_t>(m);
  if (where[i].empty() || !(e <= err[i])) {  // the first comparison counts, also when exact
    err[i] = e;
    where[i] = what;
  }
}

std::array<double, kMeasures> noise_floors(ref::Precision p, double n_params) {
  const double eps64 = std::numeric_limits<double>::epsilon();
  const double unit = p == ref::Precision::kF64
                          ? eps64
                          : static_cast<double>(std::numeric_limits<float>::epsilon());
  std::array<double, kMeasures> f{};
  f.fill(unit);
  f[static_cast<std::size_t>(Measure::scalars)] = std::max(unit, eps64 * std::sqrt(n_params));
  f[static_cast<std::size_t>(Measure::replicas)] = 0;
  return f;
}

double NoiseFloor::bound(int step, Measure m, bool device) const {
  double e = floor[static_cast<std::size_t>(m)];
  const auto upto = [&](const std::vector<std::array<double, kMeasures>>& errors) {
    const auto last = std::min(static_cast<std::size_t>(std::max(step, 1)), errors.size());
    for (std::size_t k = 0; k < last; ++k) {
      const double pk = errors[k][static_cast<std::size_t>(m)];
      e = pk == pk ? std::max(e, pk) : INFINITY;
    }
  };
  upto(probe);
  return kNoiseMargin * e * (device ? kDeviceFactor : 1.0);
}

std::string NoiseFloor::chaos(bool device) const {
  for (std::size_t k = 0; k < probe.size(); ++k)
    for (int m = 0; m < kMeasures; ++m) {
      const auto measure = static_cast<Measure>(m);
      // Max-abs is one element's: Adam's sign-like first update of a near-zero gradient whose
      // rounding flips moves that element by 2 lr, in a calm scenario too; the bulk of the
      // parameters (norm-wise) and the scalars say whether training amplifies noise.
      if (measure == Measure::master_max) continue;
      const double b = bound(static_cast<int>(k) + 1, measure, device);
      if (!(b <= kChaosCeiling)) {
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "too chaotic to check: the reference trained again with every op's result "
                      "moved by one ulp differs from itself by %.2e (%s) at step %zu, %.1e times "
                      "the rounding it was given; a bound of %.1e could not tell a strategy bug "
                      "from that",
                      probe[k][static_cast<std::size_t>(m)], measure_name(measure), k + 1,
                      probe[k][static_cast<std::size_t>(m)] / unit, b);
        return buf;
      }
    }
  return "";
}

}  // namespace shardcheck::harness
