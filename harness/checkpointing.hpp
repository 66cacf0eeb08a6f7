// The bridge between the engine's neutral state pieces (parallel/state.hpp) and the
// checkpoint protocol (checkpoint/): what a save records besides tensors (step, consumed samples
// and tokens, sampler cursor, per-rank RNG keys, LR schedule, configs), and a restore that
// validates first, then imports into an engine of any DP size or strategy and restores the cursor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

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

// What a restore reads besides tensors, checked against the scenario before any state changes:
// the run's identity (model, precision, seed, global batch), the counters (step at most
// train.steps, consumed samples = step x global batch, tokens at most samples x seq_len) and the
// sampler (integers in range for a dataset of `dataset_samples`, one batch per step, the
// scenario's drop_last). Throws checkpoint::RestoreError(bad_manifest) naming the field; returns
// the cursor to continue from.
TrainCursor resume_cursor(const checkpoint::RunState& state, const Scenario& s,
                          std::int64_t dataset_samples);

// Collective: validates the checkpoint at step_dir completely (every rank agrees), checks it with
// resume_cursor and imports it into `engine` (resharding as needed). Returns the cursor to
// continue from. Throws checkpoint::RestoreError naming the shard or field and the reason; nothing
// of the engine is touched before validation passed.
TrainCursor restore_training(comm::Communicator& world, parallel::MeshEngine& engine,
                             const Scenario& s, std::int64_t dataset_samples,
                             const std::filesystem::path& step_dir);

// The directory a configuration saves into: dir itself for a single-configuration scenario,
// dir/<config label> otherwise.
std::filesystem::path config_checkpoint_dir(const Scenario& s, const ParallelSpec& p,
                                            const std::filesystem::path& dir);

}  // namespace shardcheck::harness
