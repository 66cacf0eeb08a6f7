// The bridge between the engine's neutral state pieces (parallel/state.hpp) and the
// checkpoint protocol (checkpoint/): what a save records besides tensors (step, consumed samples
// and tokens, sampler cursor, per-rank RNG keys, LR schedule, configs), and a restore that
// validates first, then imports into an engine of any DP size or strategy and restores the cursor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "comm/communicator.hpp"
#include "harness/scenario.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "reference/data.hpp"

namespace shardcheck::harness {

// Progress of a training run, as a checkpoint records it.
struct TrainCursor {
  int step = 0;  // optimizer steps taken
  std::int64_t consumed_samples = 0;
  std::int64_t consumed_tokens = 0;  // non-padding tokens
  ref::SamplerState sampler;
};

// Collective over `world` (the engine's DP group): saves the engine's state and the cursor into
// dir/step-<cursor.step>. Throws checkpoint::SaveError / comm errors as save() does.
checkpoint::SaveResult save_training(comm::Communicator& world, const parallel::MeshEngine& engine,
                                     const Scenario& s, const ParallelSpec& p,
                                     const TrainCursor& cursor, const std::filesystem::path& dir,
                                     const checkpoint::SaveOptions& opts = {});

// The run's identity: everything that changes the trajectory besides the optimizer and the LR
// schedule, whatever the mesh ({model, precision, seed, global_batch, micro_batch, steps, data});
// what a checkpoint records as $.training and a run manifest describes its model and data with.
nlohmann::json run_identity(const Scenario& s);

// What a restore reads besides tensors, checked against the scenario before any state changes:
// the optimizer and LR schedule values within what a scenario accepts (finite, in the loader's
// ranges); the run's identity, everything that changes the trajectory ($.training: the model
// with dropout and MoE, precision, seed, global and micro batch, train.steps, the data; the
// $.optimizer and $.lr_schedule sections), each field present and equal to this run's; the
// counters (step at most train.steps, consumed samples = step x global batch, tokens at most
// samples x seq_len) and the sampler (integers in range for a dataset of `dataset_samples`, one
// batch per step, the scenario's drop_last). Throws checkpoint::RestoreError(bad_manifest)
// naming the field's JSON path in the manifest and both values; returns the cursor to continue
// from.
TrainCursor resume_cursor(const checkpoint::RunState& state, const Scenario& s,
                          std::int64_t dataset_samples);

// A tensor this scenario's engine reads on restore, whatever its mesh.
struct NeededTensor {
  std::string name;
  comm::DType dtype;
  checkpoint::Shape shape;
};
// Every tensor an engine of this scenario imports (MeshOptimizer::import_pieces): per parameter
// the working weights ("param/", or the f32 "master/" in the bf16 recipe) and both moments, then
// "train/step" and "optimizer/step".
std::vector<NeededTensor> needed_tensors(const Scenario& s);
// The checkpoint holds every needed tensor with its dtype and shape. Throws
// RestoreError(incomplete_coverage) naming a missing tensor, bad_tensor one of another dtype or
// shape.
void check_tensors(const checkpoint::Manifest& m, const Scenario& s);

// The checkpoint a resume from `dir` starts from, and where it continues.
struct ResumePoint {
  checkpoint::Checkpoint checkpoint;
  TrainCursor from;
};
// Before any rank starts: opens the newest committed checkpoint in dir and validates it completely
// (checkpoint::Checkpoint::open), then resume_cursor and check_tensors against this scenario.
// Throws RestoreError(no_checkpoint) when there is none; when the newest fails, throws its error
// (detail prefixed with its step-N) with previous_good() naming the newest older checkpoint that
// passes every one of these checks ("" when none does): it is named, never taken.
ResumePoint open_resume(const std::filesystem::path& dir, const Scenario& s,
                        std::int64_t dataset_samples);

// Collective: validates the checkpoint at step_dir completely (every rank agrees), checks it with
// resume_cursor and check_tensors and imports it into `engine` (resharding as needed). Returns the
// cursor to continue from. Throws checkpoint::RestoreError naming the shard or field and the
// reason; nothing of the engine is touched before validation passed.
TrainCursor restore_training(comm::Communicator& world, parallel::MeshEngine& engine,
                             const Scenario& s, std::int64_t dataset_samples,
                             const std::filesystem::path& step_dir);

// The directory a configuration saves into: dir itself for a single-configuration scenario,
// dir/<config label> otherwise.
std::filesystem::path config_checkpoint_dir(const Scenario& s, const ParallelSpec& p,
                                            const std::filesystem::path& dir);

}  // namespace shardcheck::harness
