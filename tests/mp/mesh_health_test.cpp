// The mesh engine's non-finite-gradient health check (parallel/step.hpp), as the data-parallel
// engine's: a NaN planted through the gradient hook on one world rank makes every rank skip the
// same step (parameters unchanged, named rank), or stop with the same typed error; without the
// check the same NaN reaches the parameters (so the planted fault is real and the check can fail).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <string>

#include "tests/mp/mesh_support.hpp"

namespace shardcheck::parallel {
namespace {

using namespace mesh_test;  // NOLINT

// A NaN into world rank `bad`'s local gradient of `param` at step `step`, microbatch 0.
GradHook plant_nan(int rank, int bad, int step, std::string param) {
  return [=](int s, int microbatch, const std::string& p, comm::Buffer g) {
    if (rank != bad || s != step || microbatch != 0 || p != param || g.count == 0) return;
    if (g.dtype == comm::DType::f64) static_cast<double*>(g.data)[0] = std::nan("");
    if (g.dtype == comm::DType::f32) static_cast<float*>(g.data)[0] = std::nanf("");
  };
}

struct HealthRun {
  std::vector<std::vector<StepHealth>> health;             // [rank][step]
  std::vector<std::vector<ref::ParamMap<double>>> params;  // [rank][step], after each step
  std::vector<int> skipped;
};

HealthRun run_with_nan(const Scenario& s, MeshOptions o, int bad, const std::string& param) {
  const ref::Dataset ds = test::dataset_of(s);
  const int world = o.shape.world_size();
  HealthRun out;
  out.health.resize(static_cast<std::size_t>(world));
  out.params.resize(static_cast<std::size_t>(world));
  out.skipped.resize(static_cast<std::size_t>(world));
  sim::SimWorld(world).run([&](comm::Communicator& c) {
    MeshOptions mine = o;
    mine.grad_hook = plant_nan(c.rank(), bad, 2, param);
    MeshEngine e(c, s.model, s.train, s.seed, mine);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    const auto r = static_cast<std::size_t>(c.rank());
    for (int n = 1; n <= s.train.steps; ++n) {
      e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
      out.health[r].push_back(e.last_step_health());
      out.params[r].push_back(e.full_params());
    }
    out.skipped[r] = e.skipped_steps();
  });
  return out;
}

bool all_finite(const ref::ParamMap<double>& m) {
  for (const auto& e : m)
    for (const double x : e.value.vec())
      if (!std::isfinite(x)) return false;
  return true;
}

struct HealthCase {
  const char* name;
  MeshOptions options;
  ref::Precision precision;
  int bad;  // world rank that holds the parameter
  const char* param;
};

std::vector<HealthCase> health_cases() {
  MeshOptions tp_pp = mesh({.tp = 2, .pp = 2});
  MeshOptions zero1 = zero(mesh({.dp = 2, .tp = 2, .pp = 2}), 1);
  MeshOptions cp_sp = mesh({.tp = 2, .cp = 2});
  cp_sp.sequence_parallel = true;
  MeshOptions interleaved = mesh({.pp = 2});
  interleaved.schedule = PipeSchedule::interleaved;
  interleaved.virtual_stages = 2;
  // Order tp-cp-ep-dp-pp: rank = tp + tp*cp*dp-index ... ; pp is the slowest axis.
  return {
      {"tp2-pp2 f64", tp_pp, ref::Precision::kF64, 1, "layers.0.attn.wq"},
      {"dp2-tp2-pp2-zero1 f32 (last stage)", zero1, ref::Precision::kF32, 6, "final_norm.weight"},
      {"tp2-cp2-sp bf16", cp_sp, ref::Precision::kBf16, 3, "layers.1.mlp.w_up"},
      {"pp2 interleaved f64 (second chunk)", interleaved, ref::Precision::kF64, 0,
       "layers.2.mlp.w_down"}};
}

TEST(MeshHealth, SkipStepOnEveryRankNamingTheRank) {
  for (const HealthCase& k : health_cases()) {
    Scenario s = mesh_dense();
    s.train.steps = 3;
    s.train.precision = k.precision;
    MeshOptions o = k.options;
    o.health = {.check = true, .policy = NonFinitePolicy::skip_step};
    const HealthRun r = run_with_nan(s, o, k.bad, k.param);
    for (std::size_t rank = 0; rank < r.health.size(); ++rank) {
      SCOPED_TRACE(std::string(k.name) + ", rank " + std::to_string(rank));
      EXPECT_FALSE(r.health[rank][0].skipped);
      EXPECT_TRUE(r.health[rank][1].skipped);
      EXPECT_EQ(r.health[rank][1].nonfinite_ranks, std::vector<int>{k.bad});
      EXPECT_FALSE(r.health[rank][2].skipped);
      EXPECT_EQ(r.skipped[rank], 1);
      for (const auto& p : r.params[rank][0])  // step 2 applied no update
        EXPECT_EQ(r.params[rank][1][p.name].vec(), p.value.vec()) << p.name;
      EXPECT_TRUE(all_finite(r.params[rank][2]));
    }
  }
}

// The planted NaN is real: without the check it reaches the parameters after step 2.
TEST(MeshHealth, WithoutTheCheckTheNanReachesTheParameters) {
  for (const HealthCase& k : health_cases()) {
    Scenario s = mesh_dense();
    s.train.steps = 2;
    s.train.precision = k.precision;
    const HealthRun r = run_with_nan(s, k.options, k.bad, k.param);
    for (std::size_t rank = 0; rank < r.params.size(); ++rank) {
      EXPECT_TRUE(r.health[rank][1].nonfinite_ranks.empty()) << k.name;
      EXPECT_FALSE(all_finite(r.params[rank][1])) << k.name << ", rank " << rank;
    }
  }
}

TEST(MeshHealth, StopThrowsTheSameTypedErrorOnEveryRank) {
  Scenario s = mesh_dense();
  s.train.steps = 3;
  const ref::Dataset ds = test::dataset_of(s);
  std::mutex mu;
  std::vector<std::string> messages;
  MeshOptions o = mesh({.tp = 2, .pp = 2});
  o.health = {.check = true, .policy = NonFinitePolicy::stop};
  sim::SimWorld(4).run([&](comm::Communicator& c) {
    MeshOptions mine = o;
    mine.grad_hook = plant_nan(c.rank(), 1, 2, "layers.0.attn.wq");
    MeshEngine e(c, s.model, s.train, s.seed, mine);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
    try {
      e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
      ADD_FAILURE() << "step 2 did not stop on rank " << c.rank();
    } catch (const NonFiniteGradientError& err) {
      EXPECT_EQ(err.step(), 2);
      EXPECT_EQ(err.ranks(), std::vector<int>{1});
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(err.what());
    }
  });
  ASSERT_EQ(messages.size(), 4u);
  for (const std::string& m : messages) EXPECT_EQ(m, "non-finite gradient at step 2 on rank(s) 1");
}

}  // namespace
}  // namespace shardcheck::parallel
