// The planner's MoE routing assumption (scenario key plan.moe_routing, parallel/mp/ep_moe.hpp's
// MoeRouting): under "capacity" every expert receives its full capacity C of every sequence, each
// rank its share of the sequence's rows, so the experts' FLOPs over the world are the closed form's
// against "uniform" (every top-k assignment, spread evenly) for capacity factors below, near and
// above one; the planner still issues what the engine issues, and still bounds the engine's expert
// FLOPs over the world; hardware FLOPs count the padded rows; a routing the planner does not know
// is refused with the JSON path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "comm/op_log.hpp"
#include "harness/conformance.hpp"
#include "harness/driver.hpp"
#include "harness/plan.hpp"
#include "harness/plan_skeleton.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {
namespace {

using nlohmann::json;

json parity_json(const std::string& name) {
  std::ifstream f(shardcheck::testing::kScenarios + "/parity/" + name);
  return json::parse(f);
}

Scenario with_routing(json j, const std::string& routing, double capacity_factor) {
  j["model"]["moe"]["capacity_factor"] = capacity_factor;
  j["plan"]["moe_routing"] = routing;
  return parse_scenario(j);
}

// The experts' forward FLOPs over every rank of the planner's timing-only run.
double expert_flops(const Scenario& s, const ParallelSpec& p) {
  double sum = 0;
  for (const comm::OpLog& log : planner_op_logs(s, p))
    sum += comm::flops_named(comm::cost_view(log), "moe experts forward");
  return sum;
}

// Rows one rank's experts receive per sequence share, written out: a rank routes n rows of each
// sequence (s / cp, under SP / tp too); uniform sends ceil(n k / ep) to each EP rank, capacity
// E / ep x ceil(C n / s) with C = ceil(cf s k / E) (at most s).
double received_rows(const Scenario& s, const ParallelSpec& p, bool capacity) {
  const ref::ModelConfig& m = s.model;
  const double seq = m.seq_len, k = m.moe->top_k, e = m.moe->experts, ep = p.mesh.ep;
  const double n = seq / p.mesh.cp / (p.sequence_parallel && p.mesh.tp > 1 ? p.mesh.tp : 1);
  if (!capacity) return ep > 1 ? std::ceil(n * k / ep) * ep : n * k;
  const double cap = std::min(std::ceil(m.moe->capacity_factor * seq * k / e - 1e-9), seq);
  return e * std::ceil(cap * n / seq - 1e-9);
}

TEST(PlanRouting, CapacityGivesEveryExpertItsFullCapacityOfEverySequence) {
  int checked = 0, above = 0, below = 0, conforming = 0;
  for (const char* name : {"mp_ep_bf16.json", "mp_compose_moe.json"}) {
    const json j = parity_json(name);
    for (const double cf : {0.5, 1.25, 3.0}) {
      const Scenario uniform = with_routing(j, "uniform", cf);
      const Scenario capacity = with_routing(j, "capacity", cf);
      for (std::size_t i = 0; i < capacity.configs.size(); ++i) {
        const ParallelSpec& p = capacity.configs[i];
        if (!unsupported(capacity, p).empty()) continue;
        const double want = received_rows(capacity, p, true) / received_rows(uniform, p, false);
        const double got = expert_flops(capacity, p) / expert_flops(uniform, p);
        EXPECT_NEAR(got, want, 1e-12 * want) << name << " cf " << cf << " " << p.label();
        ++checked;
        above += want > 1 ? 1 : 0;
        below += want < 1 ? 1 : 0;
        // The same ops as the engine's run, and expert FLOPs at least the engine's (its capacity
        // drops included): below capacity factor 1, where capacity is the binding bound and the
        // engine drops assignments, and above it.
        if (cf != 3.0) {
          EXPECT_EQ(conformance(capacity, p), "") << name;
          ++conforming;
        }
      }
    }
  }
  EXPECT_GT(checked, 40);
  EXPECT_GT(above, 20);
  EXPECT_GT(below, 10);
  EXPECT_GT(conforming, 40);
  std::printf("capacity routing: %d configurations x factors checked, %d against the engine\n",
              checked, conforming);
}

// The statement itself, over the world: each sequence gives every expert exactly its capacity
// C = ceil(cf s k / E) (at most s) in each MoE layer, so the experts' forward FLOPs of a step are
// 4 h f x E C x the MoE layers x the global batch (x tp without SP, where every TP rank runs the
// experts on the same rows; x 2 under full recompute), where each rank's share C n / s is whole.
TEST(PlanRouting, EverySequenceGivesEveryExpertItsCapacityOverTheWorld) {
  int checked = 0;
  for (const char* name : {"mp_ep_bf16.json", "mp_compose_moe.json"}) {
    const json j = parity_json(name);
    for (const double cf : {0.5, 1.25, 3.0}) {
      const Scenario s = with_routing(j, "capacity", cf);
      const ref::ModelConfig& m = s.model;
      const double seq = m.seq_len, e = m.moe->experts;
      const double cap = std::min(std::ceil(cf * seq * m.moe->top_k / e - 1e-9), seq);
      int moe_layers = 0;
      for (int l = 0; l < m.layers; ++l) moe_layers += m.is_moe_layer(l) ? 1 : 0;
      for (const ParallelSpec& p : s.configs) {
        if (!unsupported(s, p).empty()) continue;
        const bool sp = p.sequence_parallel && p.mesh.tp > 1;
        const double n = seq / p.mesh.cp / (sp ? p.mesh.tp : 1);
        if (std::fmod(cap * n, seq) != 0) continue;
        const double passes = s.train.recompute == ref::Recompute::kFull ? 2 : 1;
        const double want = 4.0 * m.hidden * m.ffn * e * cap * moe_layers * s.train.global_batch *
                            (sp ? 1 : p.mesh.tp) * passes;
        EXPECT_NEAR(expert_flops(s, p) / s.train.steps, want, 1e-12 * want)
            << name << " cf " << cf << " " << p.label();
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 40);
}

// Hardware FLOPs count what the experts execute: the rows as routed on each of the cp x tp ranks
// holding a sequence's rows (without SP every TP rank runs the experts on the same rows), so
// capacity adds its padded rows over uniform, in the forward, the backward and (full) the
// recompute; every mesh of both MoE scenarios, with and without EP, TP and SP.
TEST(PlanRouting, HardwareFlopsCountTheRowsAsExecuted) {
  int checked = 0, duplicated = 0;
  for (const char* name : {"mp_ep_bf16.json", "mp_compose_moe.json"})
    for (const std::string recompute : {"none", "full"}) {
      json r = parity_json(name);
      r["train"]["activation_checkpointing"] = recompute;
      const Scenario uniform = with_routing(r, "uniform", 1.25);
      const Scenario capacity = with_routing(r, "capacity", 1.25);
      const ref::ModelConfig& m = capacity.model;
      int moe_layers = 0;
      for (int l = 0; l < m.layers; ++l) moe_layers += m.is_moe_layer(l) ? 1 : 0;
      for (const ParallelSpec& p : capacity.configs) {
        if (!unsupported(capacity, p).empty()) continue;
        const auto flops = [&](const Scenario& s) {
          return Skeleton(skeleton_spec(s, p, p.mesh.dp, s.train.global_batch))
              .hardware_flops_per_step();
        };
        const double holders = p.mesh.cp * p.mesh.tp;
        const double per_sequence =
            (received_rows(capacity, p, true) - received_rows(uniform, p, false)) * holders;
        const double passes = recompute == "full" ? 4 : 3;
        const double want = per_sequence * 4.0 * m.hidden * m.ffn * passes * moe_layers *
                            capacity.train.global_batch;
        EXPECT_NEAR(flops(capacity) - flops(uniform), want, 1e-9 * std::abs(want) + 1)
            << name << " " << recompute << " " << p.label();
        ++checked;
        duplicated += p.mesh.tp > 1 && !p.sequence_parallel ? 1 : 0;
      }
    }
  EXPECT_GT(checked, 40);
  EXPECT_GT(duplicated, 4);
}

TEST(PlanRouting, AnUnknownRoutingIsRefusedWithItsPath) {
  json j = parity_json("mp_compose_moe.json");
  j["plan"]["moe_routing"] = "balanced";
  try {
    parse_scenario(j);
    ADD_FAILURE() << "accepted";
  } catch (const ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("$.plan.moe_routing"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardcheck::harness
