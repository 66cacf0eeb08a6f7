// The conformance check of conformance.hpp.
#include "harness/conformance.hpp"

#include "harness/driver.hpp"
#include "harness/plan_skeleton.hpp"
#include "harness/sim_options.hpp"
#include "reference/data.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

namespace {

Scenario calm(const Scenario& s) {
  Scenario c = s;
  c.faults.clear();
  return c;
}

}  // namespace

std::vector<comm::OpLog> engine_op_logs(const Scenario& scenario, const ParallelSpec& p,
                                        parallel::testing::Mutation planted) {
  const Scenario s = calm(scenario);
  const int n = p.mesh.world_size();
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  sim::SimOptions o = sim_options(s, n);
  o.record_timeline = false;
  sim::SimWorld world(n, o);
  std::vector<comm::OpLog> logs(static_cast<std::size_t>(n));
  world.run([&](comm::Communicator& c) {
    comm::RecordingCommunicator rec(c, logs[static_cast<std::size_t>(c.rank())]);
    const auto engine = build_engine(rec, s, p, {.inject_faults = false, .planted = planted});
    drive(s, ds, *engine);
  });
  return logs;
}

std::vector<comm::OpLog> planner_op_logs(const Scenario& scenario, const ParallelSpec& p) {
  const Scenario s = calm(scenario);
  const int n = p.mesh.world_size();
  parallel::TimingSpec spec = skeleton_spec(s, p, p.mesh.dp, s.train.global_batch);
  spec.steps = s.train.steps;
  const Skeleton k(spec);
  sim::SimOptions o = sim_options(s, n);
  o.meta = true;
  o.record_timeline = false;
  sim::SimWorld world(n, o);
  std::vector<comm::OpLog> logs(static_cast<std::size_t>(n));
  world.run([&](comm::Communicator& c) {
    comm::RecordingCommunicator rec(c, logs[static_cast<std::size_t>(c.rank())]);
    k.run(rec);
  });
  return logs;
}

std::string conformance(const Scenario& scenario, const ParallelSpec& p,
                        parallel::testing::Mutation planted) {
  // The engine rounds as it does: the planner's "local" what-if is not what it issues.
  Scenario s = scenario;
  s.plan.bf16_rounding = "sum_first";
  const std::vector<comm::OpLog> engine = engine_op_logs(s, p, planted);
  const std::vector<comm::OpLog> planner = planner_op_logs(s, p);
  // The planner's routing assumption (parallel/mp/ep_moe.hpp's MoeRouting): uniform keeps every
  // top-k assignment, so its experts' FLOPs bound the engine's from above on each rank with one
  // EP rank, and over the world with EP (a rank's experts then receive what its EP peers routed),
  // where the dispatch and combine splits are the assumption's too. Capacity-bound gives each
  // expert its capacity C of every sequence (at most one row per token): on a rank holding whole
  // sequences that bounds the engine's rank; with a sequence's rows over CP (or SP) ranks, each
  // gets its share of C while the engine's C may fill from one of them: over the world.
  const std::vector<std::string> experts = {"moe experts forward", "moe experts backward"};
  const bool ep = p.mesh.ep > 1;
  const bool shared_rows = p.mesh.cp > 1 || (p.sequence_parallel && p.mesh.tp > 1);
  const bool capacity = s.plan.moe_routing == "capacity";
  comm::CompareOptions o;
  (ep || (capacity && shared_rows) ? o.unchecked_flops : o.upper_bounds) = experts;
  o.routed_splits = ep;
  std::vector<comm::OpLog> a, b;
  for (std::size_t r = 0; r < engine.size(); ++r) {
    a.push_back(comm::cost_view(engine[r]));
    b.push_back(comm::cost_view(planner[r]));
    const std::string d = comm::first_difference(a.back(), b.back(), o);
    if (!d.empty()) return p.label() + ", rank " + std::to_string(r) + ": " + d;
  }
  for (const std::string& name : experts) {
    double engine_flops = 0, planner_flops = 0;
    for (std::size_t r = 0; r < a.size(); ++r) {
      engine_flops += comm::flops_named(a[r], name);
      planner_flops += comm::flops_named(b[r], name);
    }
    if (planner_flops < engine_flops * (1 - o.rel_tol))
      return p.label() + ": the planner's " + name + " FLOPs over the world, " +
             std::to_string(planner_flops) + ", are below the engine's, " +
             std::to_string(engine_flops);
  }
  return "";
}

}  // namespace shardcheck::harness
