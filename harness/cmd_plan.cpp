// `shardcheck plan SCENARIO.json [--json] [--report DIR] [--simulate-ranks N]
// [--compute-efficiency E] [--reduce-dtype f32|bf16] [--search [--world N] [--top K]]
// [--max-time S] [--max-memory B]`: the
// timing-only planner (plan.hpp), or its search over every mesh (plan_search.hpp), as a table, as
// JSON, or as report.json + index.html. Exit 0 when some timed candidate fits in device memory, 1
// when none does, 2 on unusable input or when the search or the simulations are estimated past
// --max-time / --max-memory (budget.hpp), before that work starts.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/budget.hpp"
#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/html.hpp"
#include "harness/output.hpp"
#include "harness/plan.hpp"
#include "harness/plan_search.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {

namespace {

struct PlanArgs {
  std::string scenario;
  bool json = false;
  std::string report;
  int simulate_ranks = 0;
  double compute_efficiency = 1.0;
  std::string reduce_dtype;
  bool search = false;
  int world = 0;
  int top = 10;
  int max_cp = SearchOptions{}.max_cp;
  bool time_all = false;
  double max_time = kDefaultMaxTimeSeconds;
  std::uint64_t max_memory = 0;  // 0: the machine's
};

// v printed with `unit` in at most `width` characters: fixed-point with `decimals` while that
// fits (and, with keep_small false, shows a non-zero digit), else scientific with as many digits
// as fit (4.29e+295 s, not 300 digits cut short).
std::string fitted(double v, int decimals, const char* unit, std::size_t width,
                   bool keep_small = false) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, unit);
  if (std::strlen(buf) <= width &&
      (keep_small || v == 0 || std::fabs(v) >= 0.5 * std::pow(10.0, -decimals)))
    return buf;
  for (int digits = 3; digits >= 0; --digits) {
    std::snprintf(buf, sizeof buf, "%.*e %s", digits, v, unit);
    if (std::strlen(buf) <= width) break;
  }
  return buf;
}

std::string human_bytes(double b) {
  return fitted(b / (1024.0 * 1024.0 * 1024.0), 1, "GiB", 10, true);
}

// Seconds in the tables' 10-character columns.
std::string secs(double s) {
  if (s >= 1 || s == 0) return fitted(s, 3, "s", 10);
  if (s >= 1e-4) return fitted(s * 1e3, 1, "ms", 10);
  return fitted(s, 2, "s", 10);
}

void print_scaling(std::ostream& os, const ConfigPlan& c) {
  os << "\n# scaling of " << c.config << " (efficiency = T_n / (T_0 * n/n_0), T = tokens/s)\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %6s | %7s %10s %12s %6s %4s | %7s %10s %12s %6s %4s\n",
                "world", "strong:", "step", "tokens/s", "eff", "fits", "weak:", "step", "tokens/s",
                "eff", "fits");
  os << line;
  for (std::size_t i = 0; i < c.strong.size(); ++i) {
    const auto cell = [](const ScalePoint& p, char* out, std::size_t n) {
      if (!p.valid)
        std::snprintf(out, n, "%7d %10s %12s %6s %4s", p.global_batch, "-", "-", "-", "-");
      else
        std::snprintf(out, n, "%7d %10s %12.4g %5.1f%% %4s", p.global_batch,
                      secs(p.eval.step_time_s).c_str(), p.tokens_per_s, 100 * p.efficiency,
                      p.fits ? "yes" : "NO");
    };
    char a[128], b[128];
    cell(c.strong[i], a, sizeof a);
    cell(c.weak[i], b, sizeof b);
    std::snprintf(line, sizeof line, "  %6d | %s | %s\n", c.strong[i].world_size, a, b);
    os << line;
  }
  for (const auto* pts : {&c.strong, &c.weak})
    for (const ScalePoint& p : *pts)
      if (!p.valid) os << "  world " << p.world_size << ": not evaluated: " << p.why_not << "\n";
}

// The attention kernel priced (scenario key plan.attention_kernel).
std::string attention_text(const Scenario& s) {
  return s.plan.attention_kernel == "flash"
             ? "as a flash kernel (plan.attention_kernel; the ring always)"
             : "as the engine's kernel, s x s probabilities kept (plan.attention_kernel: \"flash\" "
               "for a GPU's; the ring is flash-style)";
}

// The MoE routing assumption (scenario key plan.moe_routing), for a model with MoE layers.
std::string routing_text(const Scenario& s) {
  if (!s.model.moe) return "";
  return s.plan.moe_routing == "capacity"
             ? "; MoE: every expert at its full capacity of every sequence (plan.moe_routing)"
             : "; MoE: every top-k assignment kept, spread evenly over the experts "
               "(plan.moe_routing: \"capacity\" for the capacity bound)";
}

// When the bf16 recipe rounds (scenario key plan.bf16_rounding), for a bf16 scenario.
std::string rounding_text(const Scenario& s) {
  if (s.train.precision != ref::Precision::kBf16) return "";
  return s.plan.bf16_rounding == "local"
             ? "; bf16: each rank rounds its own microbatch gradient, the partials summed by the "
               "gradient reductions the engine issues anyway (plan.bf16_rounding \"local\": a "
               "what-if the engine does not run; memory the engine's)"
             : "; bf16: each microbatch's gradient summed over the ranks holding its partials (CP, "
               "SP replicas, kv replicas, expert parts) before its rounding, as the engine does "
               "(plan.bf16_rounding: \"local\" for Megatron-style f32 main grads)";
}

void print_table(std::ostream& os, const Scenario& s, const PlanResult& r, const PlanOptions& o) {
  const TopologySpec& t = s.topology;
  os << "# plan " << r.scenario
     << ": memory on the fullest rank (model-parallel meshes: the mesh engine's ledger) and group "
        "placement of every "
        "configuration; step skeletons timed on the symmetric clock (pipelines: one clock per "
        "stage)\n"
     << "# cluster: " << t.ranks_per_node << " ranks/node, intra " << t.intra_node.bandwidth_gbps
     << " GB/s " << t.intra_node.latency_us << " us, inter " << t.inter_node.bandwidth_gbps
     << " GB/s " << t.inter_node.latency_us << " us, " << t.peak_tflops << " TFLOP/s x "
     << r.compute_efficiency << " efficiency (GEMMs: " << r.gemm_model << "), " << t.memory_gib
     << " GiB per device; attention " << attention_text(s) << routing_text(s) << rounding_text(s)
     << "\n"
     << "# batch: " << s.train.global_batch << " sequences x " << s.model.seq_len
     << " tokens per step (every token counted as non-padding); gradient reductions in "
     << r.reduce_dtype << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-34s %-20s %5s %10s %10s %10s %10s %4s %11s %6s %8s",
                "config", "strategy", "ranks", "step", "compute", "exposed", "mem/rank", "fits",
                "tokens/s", "MFU", "goodput");
  os << line << (o.simulate_ranks > 0 ? "   simulated (rel diff)\n" : "\n");
  for (const ConfigPlan& c : r.configs) {
    if (!c.not_built.empty()) {
      std::snprintf(line, sizeof line, "  %-34s %-20s %5d  not built by the engine yet\n",
                    c.config.c_str(), "mesh", c.world_size);
      os << line;
      continue;
    }
    char good[16] = "-";
    if (c.goodput.valid) std::snprintf(good, sizeof good, "%.2f%%", 100 * c.goodput.fraction);
    std::snprintf(line, sizeof line, "  %-34s %-20s %5d %10s %10s %10s %10s %4s %11.4g %5.1f%% %8s",
                  c.config.c_str(), c.strategy.c_str(), c.world_size,
                  secs(c.eval.step_time_s).c_str(), secs(c.eval.compute_s).c_str(),
                  secs(c.eval.exposed_comm_s).c_str(),
                  human_bytes(static_cast<double>(c.memory_per_rank_bytes)).c_str(),
                  c.fits ? "yes" : "NO", c.tokens_per_s, 100 * c.mfu, good);
    os << line;
    if (c.simulated) {
      std::snprintf(line, sizeof line, "   %s (%.1e, %.2f s wall)",
                    secs(c.simulated->step_time_s).c_str(), c.simulated_rel_diff,
                    c.simulated->wall_s);
      os << line;
    } else if (o.simulate_ranks > 0) {
      os << "   (over --simulate-ranks)";
    }
    os << "\n";
  }
  os << "\n# ranking\n";
  for (const ConfigPlan& c : r.configs) os << "  " << c.config << ": " << c.note << "\n";
  if (r.best < 0) os << "  no timed candidate fits in device memory\n";
  os << "\n# placement: the link each axis's collectives cross (a group spanning two nodes is "
        "priced at the inter-node link; pp sends are priced by their own pair)\n";
  for (const ConfigPlan& c : r.configs) {
    if (!c.not_built.empty()) continue;
    const std::string p = placement_text(c.placement);
    os << "  " << c.config << ": " << (p.empty() ? "one rank, no groups" : p) << "\n";
  }
  if (r.scaling_config >= 0) {
    const ConfigPlan& c = r.configs[static_cast<std::size_t>(r.scaling_config)];
    print_scaling(os, c);
    const Goodput& g = c.goodput;
    os << "\n# goodput of " << c.config
       << ": failures at lambda = world / MTBF = " << g.failure_rate_per_s * 3600
       << " per hour (job MTBF " << g.job_mtbf_s / 3600 << " h); checkpoint every "
       << s.plan.checkpoint_every_steps << " steps (" << secs(g.interval_s) << "), save "
       << s.plan.checkpoint_save_s << " s, restart " << s.plan.restart_s << " s\n";
    if (g.valid)
      os << "  goodput = tau/(tau+delta) * (1 - lambda*((tau+delta)/2 + R)) = " << g.fraction
         << "; effective tokens/s = " << g.effective_tokens_per_s << "\n";
    else
      os << "  " << g.note << "\n";
    os << "  Young's interval sqrt(2*delta/lambda) = " << g.young_interval_steps
       << " steps, goodput there " << g.fraction_at_young << "\n";
  }
  os << "\n# MFU = 3 x forward FLOPs (parallel/flops.hpp: matmuls and attention, recompute not "
        "counted) x batch / (step time x ranks x peak); exposed = step - compute busy; bubble: "
        "a pipeline's idle share with free communication (0 without); memory = params + max(grads, "
        "gradient peak) + optimizer + all-gather peak "
        "+ activations\n"
     << "# planned in " << r.wall_s << " s wall\n";
}

void print_search(std::ostream& os, const Scenario& s, const SearchResult& r) {
  const TopologySpec& t = s.topology;
  os << "# plan --search " << r.scenario << ": every mesh of " << r.world << " ranks ("
     << t.ranks_per_node << " per node, " << t.memory_gib << " GiB each), global batch "
     << r.global_batch << " x " << s.model.seq_len << " tokens; GEMMs: " << r.gemm_model
     << "; attention " << attention_text(s) << routing_text(s) << rounding_text(s) << "\n"
     << "# meshes (dp, tp, pp, cp up to " << r.max_cp << ", ep, CP algorithm): " << r.meshes
     << " considered, " << r.meshes_not_built << " not built by the engine\n"
     << "# candidates (ZeRO/FSDP, sequence parallel, schedule, micro batch, recompute, order): "
     << r.candidates << "; not built " << r.not_built << ", do not fit " << r.not_fitting
     << ", heavier recompute of a fitting one " << r.recompute_pruned << ", ruled out by the bound "
     << r.bound_pruned << " (" << r.any_order_pruned << " by the bound of every rank order), timed "
     << r.timed << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %4s %-52s %-13s %10s %10s %10s %6s %6s\n", "rank", "config",
                "family", "step", "exposed", "mem/rank", "MFU", "HFU");
  os << "\n# top " << std::min<std::size_t>(r.ranked.size(), static_cast<std::size_t>(r.top))
     << " of " << r.ranked.size() << " timed candidates that fit\n"
     << line;
  for (std::size_t i = 0; i < r.ranked.size() && i < static_cast<std::size_t>(r.top); ++i) {
    const SearchCandidate& c = r.ranked[i];
    std::snprintf(line, sizeof line, "  %4zu %-52s %-13s %10s %10s %10s %5.1f%% %5.1f%%\n", i + 1,
                  c.label.c_str(), c.family.c_str(), secs(c.eval.step_time_s).c_str(),
                  secs(c.eval.exposed_comm_s).c_str(),
                  human_bytes(static_cast<double>(c.memory_per_rank_bytes)).c_str(), 100 * c.mfu,
                  100 * c.hfu);
    os << line << "       " << c.reason << "\n";
  }
  if (r.ranked.empty()) os << "  no candidate fits in device memory\n";
  os << "\n# the best of each family\n";
  for (const FamilyBest& f : r.families)
    os << "  " << f.family << " (" << f.candidates
       << " candidates): " << (f.found || f.any_built ? f.best.label + ": " : "") << f.why << "\n";
  os << "\n# step = the planner's clock (one step, plan.hpp's evaluate); exposed = step - compute "
        "busy (pipelines: bubble included); compute bound = hardware FLOPs (what the kernels "
        "execute: causal attention, recompute) / (world x peak x efficiency); HFU = hardware "
        "FLOPs / (step x world x peak), MFU = model FLOPs (full s x s attention) / the same; "
        "searched in "
     << r.wall_s << " s wall (enumeration and memory ledger " << r.enumerate_s << " s, bounds "
     << r.bound_wall_s << " s, clock " << r.timing_s << " s)\n";
}

int search_cmd(const PlanArgs& a, const Scenario& s, const PlanOptions& po) {
  SearchOptions o;
  o.world = a.world;
  o.top = a.top;
  o.max_cp = a.max_cp;
  o.plan = po;
  o.prune = !a.time_all;
  o.check_work = [&a](const SearchWork& w) {
    check_memory(estimate_search_memory(w), memory_budget(a.max_memory), "plan --search");
    check_time(estimate_search_time(w), a.max_time, "plan --search");
  };
  SearchResult r;
  try {
    r = search_plans(s, o);
  } catch (const ScenarioError& e) {
    throw BadInput(a.scenario + ": " + e.what());
  }
  const nlohmann::json search = search_json(r);
  if (!a.report.empty()) {
    const nlohmann::json report{{"pass", !r.ranked.empty()},    {"scenario", s.name},
                                {"description", s.description}, {"backend", "plan"},
                                {"world_size", r.world},        {"search", search}};
    const files::Dir dir = open_output_dir("--report", a.report);
    write_output_in(dir, "report.json", report.dump(2) + "\n", "--report");
    write_output_in(dir, "index.html", render_html(report), "--report");
  }
  if (a.json)
    std::cout << nlohmann::json{{"scenario", s.name}, {"search", search}}.dump(2) << "\n";
  else
    print_search(std::cout, s, r);
  return r.ranked.empty() ? kExitCheckFailed : kExitOk;
}

int plan_cmd(const PlanArgs& a) {
  Scenario s;
  try {
    s = load_scenario(a.scenario);
  } catch (const ScenarioError& e) {
    throw BadInput(e.what());
  }
  PlanOptions o;
  o.simulate_ranks = a.simulate_ranks;
  o.compute_efficiency = a.compute_efficiency;
  o.check_simulate = [&a](const std::vector<SimulateWork>& w) {
    check_memory(estimate_simulate_memory(w), memory_budget(a.max_memory), "plan --simulate-ranks");
    check_time(estimate_simulate_time(w), a.max_time, "plan --simulate-ranks");
  };
  if (!a.reduce_dtype.empty()) {
    const auto t = comm::parse_dtype(a.reduce_dtype);
    if (!t || (*t != comm::DType::f32 && *t != comm::DType::bf16 && *t != comm::DType::f64))
      throw BadInput("--reduce-dtype: expected f32, bf16 or f64, got '" + a.reduce_dtype + "'");
    o.reduce_dtype = *t;
  }
  if (!a.report.empty()) {  // made and checked now: a typo or a planted link fails before the plan
    const std::vector<std::filesystem::path> outs{"report.json", "index.html"};
    const std::vector<std::string> inputs{a.scenario};
    check_output_files(open_output_dir("--report", a.report), outs, inputs, "--report");
  }
  if (a.search) return search_cmd(a, s, o);
  if (a.world != 0 || a.top != 10) throw BadInput("--world and --top need --search");
  PlanResult r;
  try {
    r = plan_scenario(s, o);
  } catch (const ScenarioError& e) {
    throw BadInput(a.scenario + ": " + e.what());
  }
  const nlohmann::json plan = plan_json(r);
  int world = 0;
  for (const ConfigPlan& c : r.configs) world = std::max(world, c.world_size);
  if (!a.report.empty()) {
    const nlohmann::json report{{"pass", r.best >= 0},          {"scenario", s.name},
                                {"description", s.description}, {"backend", "plan"},
                                {"world_size", world},          {"plan", plan}};
    const files::Dir dir = open_output_dir("--report", a.report);
    write_output_in(dir, "report.json", report.dump(2) + "\n", "--report");
    write_output_in(dir, "index.html", render_html(report), "--report");
  }
  if (a.json)
    std::cout << nlohmann::json{{"scenario", s.name}, {"plan", plan}}.dump(2) << "\n";
  else
    print_table(std::cout, s, r, o);
  return r.best >= 0 ? kExitOk : kExitCheckFailed;
}

}  // namespace

void add_plan_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan",
      "Timing-only planner: step time, exposed communication, memory, tokens/s, MFU, scaling and "
      "goodput of the scenario's configurations (data and tensor parallel meshes timed), ranked");
  cmd->add_option("scenario", args->scenario, "Scenario JSON file")->required();
  cmd->add_flag("--json", args->json, "Print JSON instead of the table");
  cmd->add_option("--report", args->report, "Write report.json and index.html into DIR");
  cmd->add_option("--simulate-ranks", args->simulate_ranks,
                  "Also run the full SimWorld meta simulation for configurations of at most N "
                  "ranks (a cross-check; each collective costs every rank thread a wake-up: "
                  "about 10 us per rank at 256 ranks on 2 cores; counted by --max-time)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--compute-efficiency", args->compute_efficiency,
                  "Achieved fraction of peak FLOP/s for compute, in (0, 1] (default 1)");
  cmd->add_option("--reduce-dtype", args->reduce_dtype,
                  "What-if dtype of gradient reductions (default: the recipe's, f32 for bf16)");
  cmd->add_flag("--search", args->search,
                "Search every mesh and setting of the scenario's model on --world ranks, drop what "
                "does not fit, rank the rest by step time, print the top K and each family's "
                "best with why it lost");
  cmd->add_option("--world", args->world,
                  "With --search: ranks to plan for (default: the scenario's parallel block's)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--top", args->top, "With --search: candidates listed (default 10)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-cp", args->max_cp, "With --search: CP sizes tried up to this (default 16)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--time-all", args->time_all,
                "With --search: time every candidate that fits, also those the bound rules out "
                "(the same answer, slower: a check of the bound)");
  add_max_time_option(*cmd, args->max_time);
  add_max_memory_option(*cmd, args->max_memory);
  cmd->callback([args, &exit_code] { exit_code = plan_cmd(*args); });
}

}  // namespace shardcheck::harness
