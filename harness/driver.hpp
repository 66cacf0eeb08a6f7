// The one step driver: how every entry point (run, matrix, --resume, the drills, the NCCL path)
// builds a configuration's engine and trains it step by step. The engine itself (parallel/) owns
// what happens inside a step (denominators, health check, norm, clipping, AdamW:
// parallel/step.hpp); this loop owns what happens between steps (the sampler, the cursor, restore,
// and the caller's per-step work such as recording and saving).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "harness/checkpointing.hpp"
#include "harness/scenario.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "reference/data.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::harness {

// parallel::mesh_options (parallel/mp/mesh_engine.hpp) for the scenario's topology, with the health
// check on under the scenario's health.nan_policy.
parallel::MeshOptions engine_options(const Scenario& s, const ParallelSpec& p);
// engine_options with the planner's inputs: the attention kernel of s.plan (a GPU run's kernel,
// which the numeric engine does not run), for the planner's skeleton and ledgers.
parallel::MeshOptions planning_options(const Scenario& s, const ParallelSpec& p);

// True when any model-parallel axis (tp, pp, cp, ep) is above 1.
bool model_parallel(const ParallelSpec& p);
// "mesh" on a model-parallel mesh, else the data-parallel strategy ("ddp", "zero3", "fsdp", ...).
std::string strategy_name(const ParallelSpec& p);
// Why the configuration cannot run (validate_mesh's message), or "".
std::string unsupported(const Scenario& s, const ParallelSpec& p);

struct BuildOptions {
  // Inject this world rank's nan_gradient faults through the gradient hook (the drills, which
  // damage checkpoints and not runs, turn it off).
  bool inject_faults = true;
  // Internal use (tests): a known bug planted in the engine (parallel/testing.hpp).
  parallel::testing::Mutation planted = parallel::testing::Mutation::kNone;
};

// Collective over c: the configuration's engine, as every entry point builds it.
std::unique_ptr<parallel::MeshEngine> build_engine(comm::Communicator& c, const Scenario& s,
                                                   const ParallelSpec& p,
                                                   const BuildOptions& o = {});

// One finished step, as the driver hands it to the caller.
struct StepDone {
  const std::vector<std::int64_t>& ids;  // the global batch's sample ids
  const ref::StepRecord& record;
  const TrainCursor& cursor;  // after the step (sampler advanced)
  double seconds = 0;         // wall time of the engine's step on this rank
};

struct DriveOptions {
  // Resume: restores the engine and returns the cursor to continue from. Empty: from step 0.
  std::function<TrainCursor(parallel::MeshEngine&)> restore{};
  bool restore_sampler = true;     // false only for the drills' planted replay_data bug
  std::optional<int> last_step{};  // empty: the scenario's train.steps
  std::function<void(const TrainCursor&)> started{};  // after any restore, before the first step
  std::function<void(const StepDone&)> after_step{};
};

// Trains `engine` (on every rank of its world) from the restored cursor, or step 0, to last_step:
// each step's global batch from the distributed sampler, this rank's slice of it, the engine's
// step, the cursor advanced, then after_step. Returns the final cursor.
TrainCursor drive(const Scenario& s, const ref::Dataset& ds, parallel::MeshEngine& engine,
                  const DriveOptions& o = {});

}  // namespace shardcheck::harness
