// Checkpoint drills (`shardcheck drill checkpoint`): train a scenario's base configuration on the
// simulator, save, then prove that good checkpoints restore exactly (same mesh bitwise, another
// mesh within tolerance) and that every damaged one is refused before any state is touched.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "harness/outcome.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {

// Bugs a test plants in the drills' restore path, to show that each drill can fail (a drill that
// cannot fail proves nothing). Never set by the CLI.
enum class PlantedBug {
  none,
  swallow_restore_errors,  // a refused restore is ignored: training starts over from scratch
  skip_checksums,          // per-rank open without hashing payloads, then import (reads may throw)
  replay_data,             // the sampler cursor is not restored: the data restarts at sample 0
  off_by_one_step,         // the cursor says one step before the imported weights
  accept_uncommitted,      // resume picks the newest step-N* directory, committed or not
  skip_bad_latest,         // a bad newest checkpoint is silently replaced by the previous good one
  // SwiGLU: a converter that held each layer's gate and up as one fused [gate_t | up_t] column
  // block per TP rank t of the saving mesh splits their concatenation in halves on load instead of
  // undoing the per-rank interleave (a no-op for a checkpoint saved at TP 1)
  fused_gate_up_order,
  // Vocabulary padding: a loader that takes the untied head lm_head.weight [h, V] for the padded
  // [h, Vp] Megatron stores (Vp the saving mesh's ModelConfig::padded_vocab) reads each row at a
  // stride of Vp instead of V (a no-op when the saver did not pad)
  head_read_as_padded,
};
std::string_view name_of(PlantedBug b);

struct DrillOptions {
  // Where checkpoints go: kept afterwards. Empty: a fresh temporary directory, removed at the end.
  std::filesystem::path work_dir{};
  PlantedBug planted_bug = PlantedBug::none;  // tests only
};

struct DrillResult {
  std::string name;
  bool pass = false;
  bool broke = false;  // something unexpected stopped the drill (not a checkpoint refusal): exit 3
  std::string detail;  // what was checked, or why it failed (shard and reason named)
  double wall_seconds = 0;
};

struct DrillReport {
  Scenario scenario;
  std::string config;          // the base configuration's label
  std::string restore_config;  // checkpoint.restore_parallel's label, "" when absent
  int save_step = 0;           // the checkpoint the restores start from
  int steps = 0;
  std::filesystem::path work_dir;  // empty when it was temporary (removed)
  std::vector<DrillResult> drills;
  // Goodput of the failure a restore drill stands for: a run that lost everything after its last
  // step and resumed from save_step replays steps save_step + 1 .. steps (tokens only; no rates).
  GoodputResult goodput;
  bool pass() const;
  bool broke() const;
};

// The drills run: the scenario's, in its order, plus latest_bad_refused (always: a committed newest
// checkpoint failing validation must be refused naming the previous good one). Throws
// ScenarioError (JSON path) when the scenario cannot be drilled (no drills, too few steps, a
// restore_resharded without checkpoint.restore_parallel, a corpus smaller than one global batch).
std::vector<std::string> drills_to_run(const Scenario& s);
DrillReport run_drills(const Scenario& s, const DrillOptions& o = {});

// report.json ({pass, scenario, backend, world_size, manifest, drills: [{name, pass, detail}],
// ...}), JUnit XML (one testcase per drill), and the table printed on stdout.
nlohmann::json drill_report_json(const DrillReport& r, const std::string& run_id = "");
void write_drill_junit(const DrillReport& r, const std::string& file);
void print_drill_table(std::ostream& os, const DrillReport& r);

}  // namespace shardcheck::harness
