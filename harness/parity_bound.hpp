// Parity's bounds, derived from the noise rather than one constant per precision (harness/README.md
// "Parity bounds"). A configuration computes the reference's sums in another order, so each of its
// results may round to a neighbour of the reference's; the scenario's training then amplifies that.
// The noise probe measures both at once: the reference trained again with every op's result moved
// by one ulp (ref::RoundingNoise). Each measure of each step is judged against kNoiseMargin times
// the probe's error of that measure up to that step (never below a floor: one unit of the compute
// dtype; every copy against its owner is exact, bound 0).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "reference/config.hpp"

namespace shardcheck::harness {

// What parity compares; each measure has its own bound.
enum class Measure : int {
  scalars,      // loss, grad norm before clipping, clip factor, LR (relative, every rank)
  master_max,   // parameters (the master in bf16), max |got - want| / max |want| per tensor
  master_norm,  // the whole model norm-wise: ||got - want|| / ||want|| over every parameter
  // Every copy a rank computes with (TP, kv, tied and DP replicas, ZeRO-3 / FSDP gathers; bf16:
  // the working weights) against the configuration's own owner master it derives from (bf16:
  // rounded as the forward reads it), by checksum after every step and element by element after
  // the last. Exact by construction: the bound is 0, so a replica that stops updating fails in
  // every precision, with no bf16 rounding noise in the way (its owner master is judged against
  // the reference by the two measures above).
  replicas,
};
inline constexpr int kMeasures = 4;
const char* measure_name(Measure m);
const char* measure_key(Measure m);  // its report.json key ("scalars", "master_max", ...)

// The bound over the probe's error. Clean configurations sit within a few times the probe (they
// reorder fewer sums than "every result"); 100 keeps them at least 10x under their bounds.
inline constexpr double kNoiseMargin = 100;
// A configuration whose ranks computed on a device (ref::Compute, e.g. a GPU) sums every op in
// another order with more terms than one rounding (a GEMM's tiles): its bounds are this much wider.
inline constexpr double kDeviceFactor = 10;
// A bound of the step scalars or the norm-wise parameters above this cannot tell a strategy bug
// from the scenario's own noise: the scenario is refused as too chaotic to check (exit 2), never
// reported as a strategy failure. (Max-abs is left out: one element's sign-like first Adam update
// may flip in a calm scenario.)
inline constexpr double kChaosCeiling = 1e-2;

// The errors of one step, per measure: the largest, and where it was.
struct StepErrors {
  std::array<double, kMeasures> err{};
  std::array<std::string, kMeasures> where;
  void note(Measure m, double e, const std::string& what);
};

// A scenario's noise floor: the probe's error per step and measure.
struct NoiseFloor {
  double unit = 0;  // one ulp relative of the dtype the ranks compute in (2^-52 f64, 2^-23 f32)
  // The least error each measure is allowed, whatever the probe: `unit` (replicas: 0); for the
  // step scalars
  // also 2^-52 x sqrt(N) for a model of N parameters: the gradient norm is a sum of N squares
  // (in f64 in every precision) that a configuration adds in another order, which the probe
  // does not reorder, and a sum of N terms in another order differs by about sqrt(N) roundings.
  std::array<double, kMeasures> floor{};
  std::vector<std::array<double, kMeasures>> probe;  // per step (index step - 1)
  // The bound of measure m at `step` (1-based): kNoiseMargin x the probe's largest error of m up
  // to that step, at least kNoiseMargin x floor[m]; x kDeviceFactor with `device`.
  double bound(int step, Measure m, bool device = false) const;
  // Empty, or why the scenario is too chaotic to check: a bound above kChaosCeiling (with
  // `device`, the bound a device run is judged against).
  std::string chaos(bool device = false) const;
};

// The floors of a scenario in precision p with n_params parameters (NoiseFloor::floor).
std::array<double, kMeasures> noise_floors(ref::Precision p, double n_params);

}  // namespace shardcheck::harness
