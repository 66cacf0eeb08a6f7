// The bf16 mixed-precision recipe under every data-parallel strategy, against the reference's
// kBf16 Trainer on the same global batches (loss within DESIGN.md's 2e-2, parameters within the
// stated master bound) and against the f64 reference (the f32-master drift bound).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "reference/model.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

// Measured ≤ 1e-6 on the loss and ≤ 1e-5 on parameters: each microbatch's gradient is rounded to
// bf16 exactly as in the reference (a DP rank's microbatches are the reference's microbatches),
// and accumulation and reduction run in f32, so only f32 summation order differs, until it flips
// a bf16 rounding of a working weight. The bounds leave room for such flips.
constexpr double kBf16Loss = 2e-2;
constexpr double kBf16Params = 1e-3;
// ‖p − p_f64‖₂ / ‖p_f64 − p_init‖₂ (reference/README.md "Precision recipes").
constexpr double kBf16Drift = 0.25;

const Trace& bf16_reference(const Scenario& s) {
  static std::map<std::string, Trace> cache;
  const std::string key = s.name + "/" + ref::to_string(s.train.precision);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, reference_run(s)).first;
  return it->second;
}

double drift(const ref::ParamMap<double>& p, const ref::ParamMap<double>& f64,
             const ref::ParamMap<double>& init) {
  double num = 0.0, den = 0.0;
  for (const auto& e : f64) {
    const auto& a = p[e.name].vec();
    const auto& b = e.value.vec();
    const auto& c = init[e.name].vec();
    for (std::size_t i = 0; i < b.size(); ++i) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += (b[i] - c[i]) * (b[i] - c[i]);
    }
  }
  return std::sqrt(num / den);
}

using Param = StrategyParam;
class Bf16Recipe : public ::testing::TestWithParam<Param> {};

TEST_P(Bf16Recipe, MatchesBf16ReferenceWithinBounds) {
  const auto& [name, strategy, world] = GetParam();
  Scenario s = name == "moe" ? moe_setup() : dense_setup();
  const Trace& f64 = bf16_reference(s);
  s.train.precision = ref::Precision::kBf16;
  const Trace& want = bf16_reference(s);
  DataParallelOptions o{.strategy = strategy, .bucket_elems = 500};
  o.fsdp.prefetch = 1;
  const DpRun got = dp_run(s, world, o);
  const Parity p = compare(want, got);
  const auto init = ref::init_params<double>(s.model, s.seed);
  const double dr = drift(got.ranks[0].params.back(), f64.params.back(), init);
  std::printf("parity bf16 %s %s dp%d: loss %.2e params %.2e drift vs f64 %.3f\n", name.c_str(),
              std::string(name_of(strategy)).c_str(), world, p.loss, p.params, dr);
  EXPECT_LE(p.loss, kBf16Loss) << p.worst;
  EXPECT_LE(p.params, kBf16Params) << p.worst;
  EXPECT_LE(dr, kBf16Drift);
  for (std::size_t r = 1; r < got.ranks.size(); ++r)
    for (const auto& e : got.ranks[0].params.back())
      ASSERT_EQ(got.ranks[r].params.back()[e.name].vec(), e.value.vec()) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Strategies, Bf16Recipe,
                         ::testing::Combine(::testing::Values("dense", "moe"),
                                            ::testing::Values(Strategy::ddp, Strategy::zero1,
                                                              Strategy::zero2, Strategy::zero3,
                                                              Strategy::fsdp),
                                            ::testing::Values(1, 2, 4)),
                         strategy_param_name);

}  // namespace
}  // namespace shardcheck::parallel::test
