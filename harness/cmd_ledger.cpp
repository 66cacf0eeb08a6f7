// `shardcheck ledger SCENARIO.json [--json]`: the analytic memory ledger of the engine
// (parallel/mp/mesh_ledger.hpp) for every configuration of a scenario, any mesh, its fullest rank
// under each activation recomputation mode (none, selective, full), against the device memory of
// its topology. Pure arithmetic on shapes: runs in moments for 70B-class models on 1,024 ranks;
// `run --report` has the tracked side, which equals it on the small models.
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/driver.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_ledger.hpp"
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

std::size_t total_of(const parallel::LedgerRow& l) {
  return l.total();
}

// One recompute mode of a configuration: its fullest rank (ranks at data-parallel position 0
// stand for the others, which hold the same amounts).
struct Mode {
  ref::Recompute recompute = ref::Recompute::kNone;
  int rank = 0;
  parallel::LedgerRow l;
  std::size_t total = 0;
};

struct Row {
  std::string config, strategy;
  int ranks = 0;
  int tp = 1;
  int64_t vocab_padded = 0;  // the engine's padded vocabulary (ModelConfig::padded_vocab)
  std::vector<Mode> modes;   // none, selective, full
  const Mode& scenario_mode(ref::Recompute r) const {
    for (const Mode& m : modes)
      if (m.recompute == r) return m;
    return modes.front();
  }
};

Mode fullest(const Scenario& s, const ParallelSpec& p, ref::Recompute recompute) {
  ref::TrainConfig t = s.train;
  t.recompute = recompute;
  const parallel::RankLedger f = parallel::mesh_ledger_fullest(s.model, t, engine_options(s, p));
  return {recompute, f.rank, f.row, total_of(f.row)};
}

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
    const std::string why = unsupported(s, p);
    if (!why.empty()) {
      skipped.push_back(p.label() + ": " + why);
      continue;
    }
    // The engine pads the vocabulary for its tp (tp 1 too, with a multiple > 1).
    Row r{p.label(),
          strategy_name(p),
          p.mesh.world_size(),
          p.mesh.tp,
          s.model.padded_vocab(p.mesh.tp),
          {}};
    for (const ref::Recompute m :
         {ref::Recompute::kNone, ref::Recompute::kSelective, ref::Recompute::kFull})
      r.modes.push_back(fullest(s, p, m));
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
                       {"recompute", ref::to_string(s.train.recompute)},
                       {"configs", nlohmann::json::array()},
                       {"not_built", skipped}};
    const auto per_rank = [](const Mode& m) {
      return nlohmann::json{{"rank", m.rank},
                            {"params", m.l.params},
                            {"grads", m.l.grads},
                            {"optimizer", m.l.optimizer},
                            {"model_state", m.l.model_state()},
                            {"grad_peak", m.l.grad_peak},
                            {"gather_peak", m.l.gather_peak},
                            {"activation_peak", m.l.activation_peak},
                            {"total", m.total},
                            {"padding_elems", m.l.padding_elems}};
    };
    for (const Row& r : rows) {
      const Mode& m = r.scenario_mode(s.train.recompute);
      nlohmann::json modes = nlohmann::json::object();
      for (const Mode& x : r.modes) modes[ref::to_string(x.recompute)] = per_rank(x);
      out["configs"].push_back({{"config", r.config},
                                {"strategy", r.strategy},
                                {"ranks", r.ranks},
                                {"vocab_padded", r.vocab_padded},
                                {"per_rank", per_rank(m)},
                                {"per_recompute", modes},
                                {"fits", static_cast<double>(m.total) <= device}});
    }
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "# ledger " << s.name << ": bytes on the fullest rank of each configuration, per "
            << "activation recomputation mode (padding included)\n# recipe " << recipe_text
            << "\n# device memory " << human(device) << "\n";
  char line[512];
  std::snprintf(line, sizeof line,
                "  %-34s %-6s %5s %-9s %5s %11s %11s %11s %11s %11s %11s %11s  %s\n", "config",
                "strat", "ranks", "recompute", "rank", "params", "grads", "optimizer", "model",
                "gather", "activation", "total", "fits");
  std::cout << line;
  for (const Row& r : rows)
    for (const Mode& m : r.modes) {
      std::snprintf(
          line, sizeof line, "  %-34s %-6s %5d %-9s %5d %11s %11s %11s %11s %11s %11s %11s  %s\n",
          r.config.c_str(), r.strategy.c_str(), r.ranks, ref::to_string(m.recompute).c_str(),
          m.rank, human(m.l.params).c_str(), human(m.l.grads).c_str(), human(m.l.optimizer).c_str(),
          human(m.l.model_state()).c_str(), human(m.l.gather_peak).c_str(),
          human(m.l.activation_peak).c_str(), human(m.total).c_str(),
          static_cast<double>(m.total) <= device ? "yes" : "NO");
      std::cout << line;
    }
  for (const auto& k : skipped) std::cout << "  " << k << " (not built)\n";
  // Megatron's vocabulary padding, per tp size where it pads.
  std::map<int, int64_t> padded;
  for (const Row& r : rows)
    if (r.vocab_padded != s.model.vocab) padded[r.tp] = r.vocab_padded;
  if (!padded.empty()) {
    std::cout << "# vocabulary " << s.model.vocab << " padded to a multiple of tp x "
              << s.model.vocab_pad_multiple << " (model.vocab_pad_multiple), the padding rows of "
              << (s.model.tie_embeddings ? "embed.weight"
                                         : "embed.weight and columns of lm_head.weight")
              << " counted in params, grads and optimizer state:";
    const char* sep = " ";
    for (const auto& [tp, vp] : padded) {
      std::cout << sep << "tp " << tp << " -> " << vp << " ids (" << vp - s.model.vocab
                << " padding)";
      sep = ", ";
    }
    std::cout << "\n";
  }
  std::cout
      << "# model = params + grads + optimizer (held while the optimizer runs); total = model with "
         "the "
         "gradients at their backward peak (the engine accumulates them in full; ZeRO-2/3 "
         "shard them at the step's reduction) + gather + activation; gather = "
         "unsharded parameters held at once (ZeRO-3/FSDP); activation = what the pipeline schedule "
         "keeps for backward at its peak (Korthikanti et al. 2022 per block as the engine "
         "holds it; MoE layers an upper bound)\n";
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
