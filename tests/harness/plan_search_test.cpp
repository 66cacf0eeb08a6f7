// `plan --search` (harness/plan_search.hpp) on the small scenario:
// - the ranking is sorted, and every ranked candidate fits;
// - the winner's step time is what `plan` gives that configuration;
// - nothing listed in the scenario's matrix beats the winner;
// - the bound is below every timed step (also with long sequences, where attention is most of the
//   FLOPs, and on a slow network, where blocking collectives are most of the step), and where it
//   prunes it does not change the answer; a pipeline's stage bound, extended from two short
//   pipelines, is the one timed at the full microbatch count;
// - a device too small says why for every family;
// - the CLI's exit codes and its JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cli_support.hpp"
#include "harness/driver.hpp"
#include "harness/plan.hpp"
#include "harness/plan_search.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {
namespace {

using nlohmann::json;

const std::string kSmallScenario = std::string(SHARDCHECK_SCENARIOS_DIR) + "/plan/small-dp.json";

Scenario small(double memory_gib = 141) {
  std::ifstream f(kSmallScenario);
  json j = json::parse(f);
  j["topology"]["device"]["memory_gib"] = memory_gib;
  return parse_scenario(j);
}

// One search of the small scenario at 8 ranks, shared by the tests that only read it.
const SearchResult& small_search() {
  static const SearchResult r = [] {
    SearchOptions o;
    o.world = 8;
    return search_plans(small(), o);
  }();
  return r;
}

TEST(PlanSearch, RanksFittingCandidatesFastestFirst) {
  const SearchResult& r = small_search();
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.world, 8);
  EXPECT_GT(r.meshes, 1U);
  // Every candidate is accounted for once.
  EXPECT_EQ(r.candidates,
            r.not_built + r.not_fitting + r.recompute_pruned + r.bound_pruned + r.timed);
  EXPECT_EQ(r.timed, r.ranked.size());
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    const SearchCandidate& c = r.ranked[i];
    EXPECT_TRUE(c.timed);
    EXPECT_LE(static_cast<double>(c.memory_per_rank_bytes), r.device_memory_bytes) << c.label;
    EXPECT_LE(c.bound_s, c.eval.step_time_s * (1 + 1e-12)) << c.label;
    EXPECT_EQ(c.spec.mesh.world_size(), 8) << c.label;
    if (i > 0) {
      EXPECT_LE(r.ranked[i - 1].eval.step_time_s, c.eval.step_time_s);
    }
    EXPECT_FALSE(c.reason.empty());
  }
  // Meshes of every family that the small model allows were timed.
  for (const char* f : {"DDP", "FSDP", "TP + DP", "FSDP + TP", "TP + PP + DP", "+ CP"}) {
    const auto it = std::find_if(r.families.begin(), r.families.end(),
                                 [&](const FamilyBest& b) { return b.family == f; });
    ASSERT_NE(it, r.families.end()) << f;
    EXPECT_TRUE(it->found) << f << ": " << it->why;
    EXPECT_EQ(family_of(it->best.spec), f);
  }
  EXPECT_EQ(r.families.size(), 6U);  // no "+ EP" for a dense model
}

TEST(PlanSearch, TheWinnersTimeIsWhatPlanGivesIt) {
  const SearchResult& r = small_search();
  ASSERT_FALSE(r.ranked.empty());
  for (std::size_t i = 0; i < 3 && i < r.ranked.size(); ++i) {
    const SearchCandidate& c = r.ranked[i];
    Scenario s = small();
    s.train.micro_batch = c.micro_batch;
    s.train.recompute = c.recompute;
    // The search times one step; plan reports the mean of two (the first step differs by a few
    // ns here).
    PlanOptions one;
    one.steps = 1;
    const StepEval e = evaluate(s, c.spec, c.spec.mesh.dp, s.train.global_batch, one, false, false);
    EXPECT_NEAR(e.step_time_s, c.eval.step_time_s, 1e-12 * e.step_time_s) << c.label;
    const StepEval mean = evaluate(s, c.spec, c.spec.mesh.dp, s.train.global_batch, PlanOptions{});
    EXPECT_NEAR(mean.step_time_s, c.eval.step_time_s, 1e-4 * e.step_time_s) << c.label;
  }
}

TEST(PlanSearch, NoConfigurationOfTheScenarioBeatsTheWinner) {
  const SearchResult& r = small_search();
  ASSERT_FALSE(r.ranked.empty());
  const PlanResult p = plan_scenario(small());
  int compared = 0;
  for (const ConfigPlan& c : p.configs) {
    if (!c.modelled || !c.fits) continue;
    ++compared;
    EXPECT_GE(c.eval.step_time_s, r.ranked[0].eval.step_time_s * (1 - 1e-12)) << c.config;
  }
  EXPECT_GE(compared, 6);
}

// The small model with long sequences (attention most of the FLOPs, little to communicate): a
// compute-bound search, where the bound does rule candidates out.
Scenario long_sequences() {
  Scenario s = small();
  s.model.hidden = 128;
  s.model.heads = 4;
  s.model.kv_heads = 2;
  s.model.ffn = 512;
  s.model.seq_len = 2048;
  s.train.global_batch = 32;
  return s;
}

// The small model on a slow device (2 TFLOP/s) with 0.1 GiB: compute-bound, and the DP settings
// that replicate need recompute to fit, so their bounds lie above the best steps: the bound prunes.
Scenario compute_bound() {
  Scenario s = small(0.1);
  s.topology.peak_tflops = 2;
  return s;
}

// The bound (the hardware FLOPs: attention as its kernel computes it) is a lower bound of every
// timed step, on the small scenario, the long-sequence one and the compute-bound one; HFU (those
// FLOPs over the step) is at most 1 there.
TEST(PlanSearch, TheComputeBoundIsBelowEveryTimedStep) {
  for (const Scenario& s : {small(), long_sequences(), compute_bound()}) {
    SearchOptions o;
    o.world = 8;
    o.prune = false;
    const SearchResult r = search_plans(s, o);
    EXPECT_EQ(r.bound_pruned, 0U);
    ASSERT_GT(r.ranked.size(), 100U) << s.model.seq_len;
    for (const SearchCandidate& c : r.ranked) {
      EXPECT_LE(c.bound_s, c.eval.step_time_s * (1 + 1e-12)) << s.model.seq_len << " " << c.label;
      // HFU counts what the kernels execute, so it is at most the efficiency (1 here), and
      // above MFU where recompute adds more than the causal kernels leave out.
      EXPECT_LE(c.hfu, 1 + 1e-12) << s.model.seq_len << " " << c.label;
      EXPECT_GT(c.hfu, 0) << c.label;
    }
  }
}

// Where the bound prunes (the compute-bound scenario), the top 5 and each family's best are those
// of the search that times every fitting candidate.
TEST(PlanSearch, TheComputeBoundDoesNotChangeTheAnswer) {
  SearchOptions o;
  o.world = 8;
  o.top = 5;
  o.prune = false;
  const SearchResult all = search_plans(compute_bound(), o);
  o.prune = true;
  const SearchResult pruned = search_plans(compute_bound(), o);
  EXPECT_EQ(all.bound_pruned, 0U);
  EXPECT_GT(pruned.bound_pruned, 0U);
  EXPECT_EQ(all.timed, pruned.timed + pruned.bound_pruned);
  for (std::size_t i = 0; i < 5 && i < all.ranked.size(); ++i) {
    ASSERT_LT(i, pruned.ranked.size());
    EXPECT_EQ(all.ranked[i].label, pruned.ranked[i].label) << i;
    EXPECT_EQ(all.ranked[i].eval.step_time_s, pruned.ranked[i].eval.step_time_s) << i;
  }
  ASSERT_EQ(all.families.size(), pruned.families.size());
  for (std::size_t i = 0; i < all.families.size(); ++i)
    EXPECT_EQ(all.families[i].best.label, pruned.families[i].best.label) << all.families[i].family;
}

// The stage bound of a pipeline with many microbatches is extended from two short ones
// (plan.hpp's stage_bound): for every pipeline candidate of the small search with more than
// 2 x pp microbatches, it equals the bound timed at its full count (under ZeRO-3 / FSDP, the
// listed bound: compute and the blocks' collectives), which is at most the forced one.
TEST(PlanSearch, TheStageBoundsLineIsTheBoundAtTheFullCount) {
  const SearchResult& r = small_search();
  PlanOptions po;
  po.steps = 1;
  int compared = 0, sharded = 0, apart = 0;
  std::set<std::string> schedules;
  for (const SearchCandidate& c : r.ranked) {
    const int pp = c.spec.mesh.pp;
    if (pp == 1 || 64 / c.spec.mesh.dp / c.micro_batch <= 2 * pp) continue;
    Scenario s = small();
    s.train.micro_batch = c.micro_batch;
    s.train.recompute = c.recompute;
    const bool shards = c.spec.shards_params();
    double want = 0, forced = 0;
    for (const StageLowerBound& b : stage_lower_bounds(s, c.spec, c.spec.mesh.dp, 64, po)) {
      EXPECT_LE(b.listed, b.forced) << c.label;
      want = std::max(want, shards ? b.listed : b.forced);
      forced = std::max(forced, b.forced);
    }
    EXPECT_NEAR(stage_bound(s, c.spec, 64, po), want, 1e-9 * want) << c.label;
    EXPECT_GT(want, 0) << c.label;
    ++compared;
    sharded += shards;
    apart += shards && forced > want * (1 + 1e-9);
    schedules.insert(std::string(parallel::name_of(c.spec.pp_schedule)));
  }
  EXPECT_GE(compared, 20);
  EXPECT_GT(sharded, 0);
  EXPECT_GT(apart, 0);  // the sharded groups' gathers and reductions leave the listed bound
  EXPECT_EQ(schedules.size(), 3U);  // gpipe, 1f1b and interleaved
}

// The stage bound of every rank order (plan.hpp's stage_bound_any_order) is one number for all the
// orders of a candidate's mesh and at most each order's own stage bound, and below some: the small
// scenario has 4 ranks per node, so some orders put a group across nodes. The search rules
// candidates out by it before it computes their own order's bound.
TEST(PlanSearch, TheBoundOfEveryOrderIsBelowEachOrdersBound) {
  const SearchResult& r = small_search();
  EXPECT_GT(r.any_order_pruned, 0U);
  EXPECT_LE(r.any_order_pruned, r.bound_pruned);
  PlanOptions po;
  po.steps = 1;
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "tp-pp-cp-ep-dp", "tp-cp-ep-pp-dp"};
  int below = 0;
  for (std::size_t i = 0; i < r.ranked.size(); i += 3) {
    const SearchCandidate& c = r.ranked[i];
    Scenario s = small();
    s.train.micro_batch = c.micro_batch;
    s.train.recompute = c.recompute;
    std::optional<double> any;
    for (const std::string& order : orders) {
      ParallelSpec p = c.spec;
      p.order = order;
      if (!unsupported(s, p).empty()) continue;  // tp or pp between cp and ep
      const double a = stage_bound_any_order(s, p, 64, po);
      if (!any) any = a;
      EXPECT_EQ(a, *any) << c.label << " " << order;
      const double own = stage_bound(s, p, 64, po);
      EXPECT_LE(a, own * (1 + 1e-12)) << c.label << " " << order;  // the line's rounding
      below += a < own * (1 - 1e-9);
    }
  }
  EXPECT_GT(below, 0);
}

// The stage bound times one stage per distinct program (plan.hpp's stage_lower_bounds): fewer
// than every stage of a deep pipeline, and the same largest bound as every stage gives.
TEST(PlanSearch, TheDistinctStagesGiveTheBoundOfEveryStage) {
  const SearchResult& r = small_search();
  PlanOptions po;
  po.steps = 1;
  int fewer = 0;
  for (const SearchCandidate& c : r.ranked) {
    if (c.spec.mesh.pp == 1) continue;
    Scenario s = small();
    s.train.micro_batch = c.micro_batch;
    s.train.recompute = c.recompute;
    const auto largest = [&](bool every) {
      StageLowerBound m;
      const std::vector<StageLowerBound> b =
          stage_lower_bounds(s, c.spec, c.spec.mesh.dp, 64, po, every);
      for (const StageLowerBound& x : b)
        m = {std::max(m.forced, x.forced), std::max(m.listed, x.listed)};
      return std::pair{m, b.size()};
    };
    const auto [some, n] = largest(false);
    const auto [all, every] = largest(true);
    EXPECT_EQ(some.forced, all.forced) << c.label;
    EXPECT_EQ(some.listed, all.listed) << c.label;
    EXPECT_EQ(every, static_cast<std::size_t>(c.spec.mesh.pp));
    fewer += n < every;
  }
  EXPECT_GT(fewer, 0);
}

// The stage bound counts the collectives a stage's compute stream waits on at once: on a slow
// network (0.05 GB/s) it is above the compute bound for tensor-parallel candidates (their TP
// collectives block), and it rules candidates out where the compute bound alone times them all;
// the answer is the same as when every fitting candidate is timed.
TEST(PlanSearch, TheStageBoundPrunesBlockingCommunicationAndKeepsTheAnswer) {
  Scenario s = small();
  for (LinkSpec* l : {&s.topology.intra_node, &s.topology.inter_node}) l->bandwidth_gbps = 0.05;
  SearchOptions o;
  o.world = 8;
  o.top = 5;
  o.prune = false;
  const SearchResult all = search_plans(s, o);
  const double peak = s.topology.peak_tflops * 1e12;
  int above = 0;
  for (const SearchCandidate& c : all.ranked) {
    EXPECT_LE(c.bound_s, c.eval.step_time_s * (1 + 1e-12)) << c.label;
    if (c.spec.mesh.tp > 1 && c.bound_s > 2 * c.hardware_flops / (8 * peak)) ++above;
  }
  EXPECT_GT(above, 0);
  o.prune = true;
  const SearchResult pruned = search_plans(s, o);
  EXPECT_GT(pruned.bound_pruned, all.timed / 2);
  for (std::size_t i = 0; i < 5 && i < all.ranked.size(); ++i) {
    ASSERT_LT(i, pruned.ranked.size());
    EXPECT_EQ(all.ranked[i].label, pruned.ranked[i].label) << i;
  }
  ASSERT_EQ(all.families.size(), pruned.families.size());
  for (std::size_t i = 0; i < all.families.size(); ++i)
    EXPECT_EQ(all.families[i].best.label, pruned.families[i].best.label)
        << all.families[i].family << " " << all.families[i].best.eval.step_time_s << " "
        << pruned.families[i].best.eval.step_time_s << " " << all.families[i].best.bound_s << " "
        << pruned.families[i].best.bound_s;
}

// A MoE model (the EP parity scenario) on 8 ranks: expert-parallel meshes are timed, the + EP
// family has a best, and its step is what plan's evaluate gives that configuration.
TEST(PlanSearch, ExpertParallelMeshesAreTimed) {
  const Scenario s = load_scenario(std::string(SHARDCHECK_SCENARIOS_DIR) + "/parity/mp_ep.json");
  SearchOptions o;
  o.world = 8;
  const SearchResult r = search_plans(s, o);
  const auto ep = std::find_if(r.families.begin(), r.families.end(),
                               [](const FamilyBest& f) { return f.family == "+ EP"; });
  ASSERT_NE(ep, r.families.end());
  ASSERT_TRUE(ep->found) << ep->why;
  EXPECT_GT(ep->best.spec.mesh.ep, 1);
  Scenario sc = s;
  sc.train.micro_batch = ep->best.micro_batch;
  sc.train.recompute = ep->best.recompute;
  PlanOptions po;
  po.steps = 1;
  const StepEval e =
      evaluate(sc, ep->best.spec, ep->best.spec.mesh.dp, s.train.global_batch, po, false, false);
  EXPECT_DOUBLE_EQ(e.step_time_s, ep->best.eval.step_time_s);
  EXPECT_LE(ep->best.bound_s, e.step_time_s * (1 + 1e-12));
}

TEST(PlanSearch, ADeviceTooSmallSaysWhyForEveryFamily) {
  SearchOptions o;
  o.world = 8;
  const SearchResult r = search_plans(small(0.0001), o);
  EXPECT_TRUE(r.ranked.empty());
  EXPECT_EQ(r.timed, 0U);
  EXPECT_GT(r.not_fitting, 0U);
  for (const FamilyBest& f : r.families) {
    EXPECT_FALSE(f.found) << f.family;
    EXPECT_NE(f.why.find("nothing fits"), std::string::npos) << f.family << ": " << f.why;
  }
}

// Four sequences on 8 ranks: no mesh of data parallelism alone splits the batch, and both of its
// families (DDP and FSDP: the same meshes) say why, rather than "no mesh of this family".
TEST(PlanSearch, ABatchTooSmallForDataParallelismSaysSoForDdpAndFsdp) {
  Scenario s = small();
  s.train.global_batch = 4;
  SearchOptions o;
  o.world = 8;
  const SearchResult r = search_plans(s, o);
  int seen = 0;
  for (const FamilyBest& f : r.families) {
    if (f.family != "DDP" && f.family != "FSDP") continue;
    ++seen;
    EXPECT_FALSE(f.found) << f.family;
    EXPECT_EQ(f.why.rfind("not built: ", 0), 0U) << f.family << ": " << f.why;
    EXPECT_NE(f.why.find("global_batch"), std::string::npos) << f.family << ": " << f.why;
  }
  EXPECT_EQ(seen, 2);
  EXPECT_FALSE(r.ranked.empty());  // meshes with model parallelism still split it
}

TEST(PlanSearch, BadArgumentsAreScenarioErrors) {
  SearchOptions o;
  o.world = -4;
  EXPECT_THROW(search_plans(small(), o), ScenarioError);
  o.world = 8;
  o.top = 0;
  EXPECT_THROW(search_plans(small(), o), ScenarioError);
}

TEST(PlanSearch, CommandLine) {
  auto [code, out] =
      shardcheck::testing::shardcheck("plan " + kSmallScenario + " --search --world 8 --json");
  ASSERT_EQ(code, 0) << out;
  const json j = json::parse(out.substr(out.find('{')));
  const json& s = j.at("search");
  EXPECT_EQ(s.at("world_size"), 8);
  EXPECT_EQ(s.at("attention_kernel"), "engine");
  ASSERT_FALSE(s.at("top").empty());
  EXPECT_EQ(s.at("top")[0].at("rank"), 1);
  EXPECT_EQ(s.at("best"), s.at("top")[0].at("config"));
  EXPECT_GT(s.at("top")[0].at("step_time_s").get<double>(), 0);
  std::tie(code, out) =
      shardcheck::testing::shardcheck("plan " + kSmallScenario + " --search --top 3");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("# the best of each family"), std::string::npos) << out;
  std::tie(code, out) = shardcheck::testing::shardcheck("plan " + kSmallScenario + " --world 8");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--search"), std::string::npos) << out;
  std::tie(code, out) =
      shardcheck::testing::shardcheck("plan " + kSmallScenario + " --search --world 0");
  EXPECT_EQ(code, 2) << out;
}

// The search is guarded by a cost model (candidates x a per-candidate cost that grows with the
// world and the layers, budget.hpp), checked once the meshes are enumerated and before any ledger,
// bound or clock: the 70B scenario on 1,048,576 ranks (185 s and 2.6 GB measured) is refused under
// --max-time 5 and under --max-memory 100MB, naming the estimate, the limit and --world; the hook
// sees the counts, and a small search under the same limit still runs.
TEST(PlanSearch, PastMaxTimeOrMemoryIsRefusedBeforeTheWork) {
  const std::string big = std::string(SHARDCHECK_SCENARIOS_DIR) + "/plan/llama-70b-class.json";
  auto [code, out] =
      shardcheck::testing::shardcheck("plan " + big + " --search --world 1048576 --max-time 5");
  EXPECT_EQ(code, 2) << out;
  for (const char* part : {"plan --search: needs at least", "more than 5 s (--max-time",
                           "--world 1048576: 1679 meshes", "shrink --world"})
    EXPECT_NE(out.find(part), std::string::npos) << part << "\n" << out;
  std::tie(code, out) = shardcheck::testing::shardcheck(
      "plan " + big + " --search --world 1048576 --max-memory 100MB");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--max-memory"), std::string::npos) << out;
  std::tie(code, out) =
      shardcheck::testing::shardcheck("plan " + kSmallScenario + " --search --max-time 5");
  EXPECT_EQ(code, 0) << out;

  SearchOptions o;
  o.world = 8;
  std::vector<SearchWork> seen;
  o.check_work = [&seen](const SearchWork& w) { seen.push_back(w); };
  const SearchResult r = search_plans(load_scenario(kSmallScenario), o);
  ASSERT_EQ(seen.size(), 2u);  // one rank order per mesh, then every order counted
  EXPECT_FALSE(seen[0].orders_counted);
  EXPECT_TRUE(seen[1].orders_counted);
  EXPECT_EQ(seen[1].candidates, r.candidates);
  EXPECT_LE(seen[0].candidates, seen[1].candidates);
  EXPECT_EQ(seen[1].meshes, r.meshes);
  EXPECT_EQ(seen[1].meshes_built, r.meshes - r.meshes_not_built);
  // A hook that throws stops the search.
  o.check_work = [](const SearchWork&) { throw std::runtime_error("refused"); };
  EXPECT_THROW(search_plans(load_scenario(kSmallScenario), o), std::runtime_error);
}

}  // namespace
}  // namespace shardcheck::harness
