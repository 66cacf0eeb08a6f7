// Internal to the checkpoint drills (drill.cpp): the reference trace, one simulated training run
// on any engine (saving, crashing, resuming as a TrainPlan says), the restore paths with the
// planted bugs, and small text helpers.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "harness/checkpointing.hpp"
#include "harness/drill.hpp"
#include "harness/runner_detail.hpp"
#include "harness/scenario.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "reference/data.hpp"
#include "reference/trainer.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness::drill_impl {

namespace fs = std::filesystem;
namespace ck = checkpoint;

using detail::Trace;  // the single-device reference

// What one simulated training run recorded. Steps, sample ids and cursors are rank 0's (every
// rank's step record is the global one); parameters and state are every rank's own.
struct Trajectory {
  int first_step = 1;
  std::vector<ref::StepRecord> steps;
  std::vector<std::vector<std::int64_t>> ids;  // the global batch's sample ids of each step
  std::vector<TrainCursor> cursors;            // after each step
  std::optional<TrainCursor> restored;
  std::vector<ref::ParamMap<double>> final_params;
  std::vector<std::vector<parallel::StatePiece>> final_state;
  int last_step() const { return first_step + static_cast<int>(steps.size()) - 1; }
};

struct TrainPlan {
  ParallelSpec spec{};
  fs::path resume_from{};  // a step directory; empty: from the initial weights
  int last_step = 0;
  fs::path save_dir{};
  std::vector<int> save_at{};
  int crash_step = 0;  // the save at this step loses crash_rank after it wrote its shards
  int crash_rank = -1;
};

// One rank's answer to a restore that should be refused.
struct Attempt {
  bool refused = false;  // threw checkpoint::RestoreError
  ck::Reason reason = ck::Reason::io_error;
  std::string file, what, previous_good;
  std::string other;  // any other exception (not fail-closed)
  bool untouched = true;
  std::string changed;  // the first state piece that changed
};

struct Ctx {
  const Scenario& s;
  PlantedBug bug = PlantedBug::none;
  ref::Dataset ds{};
  Trace want{};  // with its noise floor (the bounds of the parity verdicts)
  // restore_resharded onto a mesh that rounds the bf16 tied embedding otherwise than the base:
  // the reference of base's rounding up to the save step and the target's after it
  std::optional<Trace> want_target{};
  ParallelSpec base{};
  std::optional<ParallelSpec> target{};
  int k = 0, k2 = 0;  // restores start at k; crash_before_commit and latest_bad also save at k2
  fs::path root{};
  std::optional<Trajectory> straight{};  // the uninterrupted run, saving at k and k2
  std::optional<Trajectory> resumed{};   // restored at k on the base mesh, trained to the end
  std::exception_ptr resumed_error{};
};

// Whether a rank failure's root cause is an E (a planted crash, a checkpoint refusal).
template <class E>
bool caused_by(const sim::RankFailure& f) {
  try {
    f.rethrow_cause();
  } catch (const E&) {
    return true;
  } catch (...) {
  }
  return false;
}

std::string g3(double v);

std::string step_name(int k);

std::string steps_text(int from, int to);

std::string not_built(const Scenario& s, const ParallelSpec& p);

std::string config_text(const Scenario& s, const ParallelSpec& p);

// PlantedBug::skip_checksums: each rank opens the checkpoint alone without hashing payloads and
// imports straight away; a read that re-hashes a whole shard may still throw, but only mid-import.
TrainCursor restore_unverified(parallel::MeshEngine& e, const fs::path& step_dir);

// restore_training as the drills call it, or with the planted bug a test asked for.
TrainCursor restore(comm::Communicator& c, parallel::MeshEngine& e, const Ctx& x,
                    const fs::path& step_dir);

// The checkpoint a resume from `dir` uses: the newest committed one, validated (open_latest
// refuses a bad newest one naming the previous good one), or what a planted bug picks instead.
fs::path resolve_latest(const Ctx& x, const fs::path& dir);

sim::SimOptions world_options(const Scenario& s, int n);

// Trains plan.spec on a fresh SimWorld. Throws sim::RankFailure when a rank fails.
Trajectory train(const Ctx& x, const TrainPlan& plan);

}  // namespace shardcheck::harness::drill_impl
