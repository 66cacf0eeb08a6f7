// `shardcheck ledger SCENARIO.json [--json]`: the analytic memory ledger (parallel/ledger.hpp) of
// every configuration of a scenario, per rank, against the device memory of its topology. Pure
// arithmetic on shapes: runs instantly for 70B-class models; `run --report` has the tracked side.
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/driver.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"
#include "parallel/ledger.hpp"
#include "reference/model.hpp"

namespace shardcheck::harness {

namespace {

struct LedgerArgs {
  std::string scenario;
  bool json = false;
};

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

double parameter_count(const ref::ModelConfig& m) {
  double n = 0;
  for (const auto& [name, shape] : ref::param_shapes(m)) {
    double e = 1;
    for (auto d : shape) e *= static_cast<double>(d);
    n += e;
  }
  return n;
}

struct Row {
  std::string config, strategy;
  int ranks = 0;
  parallel::LedgerRow l;
  std::size_t total = 0;
};

int ledger_cmd(const LedgerArgs& a) {
  Scenario s;
  try {
    s = load_scenario(a.scenario);
  } catch (const ScenarioError& e) {
    throw BadInput(e.what());
  }
  const parallel::Recipe recipe = parallel::recipe_of(s.train.precision);
  const double device = s.topology.memory_gib * 1024.0 * 1024.0 * 1024.0;
  std::vector<Row> rows;
  std::vector<std::string> skipped;
  for (const ParallelSpec& p : s.configs) {
    if (p.mesh.tp > 1 || p.mesh.pp > 1 || p.mesh.cp > 1 || p.mesh.ep > 1) {
      skipped.push_back(p.label());
      continue;
    }
    parallel::LedgerInput in;
    in.model = s.model;
    in.recipe = recipe;
    in.options = data_parallel_view(engine_options(s, p));
    in.dp = p.mesh.dp;
    in.micro_batch = s.train.micro_batch;
    in.recompute = s.train.recompute;
    Row r{p.label(), std::string(parallel::name_of(in.options.strategy)), p.mesh.dp,
          parallel::ledger(in), 0};
    r.total = r.l.model_state() + r.l.gather_peak + r.l.activation_peak;
    rows.push_back(r);
  }
  const std::string recipe_text =
      recipe.name + ": param " + std::to_string(recipe.param) + " B, grad " +
      std::to_string(recipe.grad) + " B, master " + std::to_string(recipe.master) + " B, moments " +
      std::to_string(recipe.moments) + " B per parameter; activations " +
      std::to_string(recipe.activation) + " B per element";
  if (a.json) {
    nlohmann::json out{{"scenario", s.name},
                       {"recipe",
                        {{"name", recipe.name},
                         {"param", recipe.param},
                         {"grad", recipe.grad},
                         {"master", recipe.master},
                         {"moments", recipe.moments},
                         {"activation", recipe.activation}}},
                       {"device_memory_bytes", device},
                       {"parameters", parameter_count(s.model)},
                       {"configs", nlohmann::json::array()},
                       {"not_modelled", skipped}};
    for (const Row& r : rows)
      out["configs"].push_back({{"config", r.config},
                                {"strategy", r.strategy},
                                {"ranks", r.ranks},
                                {"per_rank",
                                 {{"params", r.l.params},
                                  {"grads", r.l.grads},
                                  {"optimizer", r.l.optimizer},
                                  {"model_state", r.l.model_state()},
                                  {"gather_peak", r.l.gather_peak},
                                  {"activation_peak", r.l.activation_peak},
                                  {"total", r.total},
                                  {"padding_elems", r.l.padding_elems}}},
                                {"fits", static_cast<double>(r.total) <= device}});
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "# ledger " << s.name << ": bytes per rank (every rank of a configuration holds the "
            << "same; padding included)\n# recipe " << recipe_text << "\n# device memory "
            << human(device) << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-34s %-6s %5s %11s %11s %11s %11s %11s %11s %11s  %s\n",
                "config", "strat", "ranks", "params", "grads", "optimizer", "model", "gather",
                "activation", "total", "fits");
  std::cout << line;
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "  %-34s %-6s %5d %11s %11s %11s %11s %11s %11s %11s  %s\n",
                  r.config.c_str(), r.strategy.c_str(), r.ranks, human(r.l.params).c_str(),
                  human(r.l.grads).c_str(), human(r.l.optimizer).c_str(),
                  human(r.l.model_state()).c_str(), human(r.l.gather_peak).c_str(),
                  human(r.l.activation_peak).c_str(), human(r.total).c_str(),
                  static_cast<double>(r.total) <= device ? "yes" : "NO");
    std::cout << line;
  }
  for (const auto& k : skipped)
    std::cout << "  " << k << ": not modelled yet (tensor/pipeline/context/expert parallel)\n";
  std::cout << "# model = params + grads + optimizer (held while the optimizer runs); gather = "
               "unsharded parameters held at once (ZeRO-3/FSDP); activation = one microbatch's "
               "activations kept for backward (estimate)\n";
  return kExitOk;
}

}  // namespace

void add_ledger_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<LedgerArgs>();
  auto* cmd = app.add_subcommand(
      "ledger", "Memory per rank (analytic ledger) for the scenario's recipe and configurations");
  cmd->add_option("scenario", args->scenario, "Scenario JSON file")->required();
  cmd->add_flag("--json", args->json, "Print JSON instead of the table");
  cmd->callback([args, &exit_code] { exit_code = ledger_cmd(*args); });
}

}  // namespace shardcheck::harness
