// Inside the scenario runner (runner.cpp), shared with its NCCL path (runner_nccl.cpp): one
// rank's training loop and record, and the parity measurement and verdict over all ranks' records.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "harness/driver.hpp"
#include "harness/runner.hpp"
#include "parallel/state.hpp"
#include "reference/data.hpp"
#include "reference/npy.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::harness::detail {

// How the bf16 recipe rounds the tied embedding's two uses at each step: apart
// (ref::Trainer::round_tied_uses_apart, the recipe of a mesh that holds them on two stages:
// parallel::rounds_gradient_parts) or as their sum; `apart` up to step `switch_after` (0: every
// step), `apart_after` after it (a restore onto a mesh that rounds otherwise).
struct TiedRounding {
  bool apart = false;
  int switch_after = 0;
  bool apart_after = false;
  bool at(int step) const { return switch_after > 0 && step > switch_after ? apart_after : apart; }
};

// The reference run: its step records and parameters after each step.
struct Trace {
  std::vector<ref::StepRecord> steps;
  std::vector<std::vector<ref::MoeLoad>> moe_load;  // per step (the reference's; empty: engines)
  std::vector<ref::ParamMap<double>> params;        // after each step
  NoiseFloor noise;   // the noise probe's errors against this run (noise_floor), the bounds' base
  TiedRounding tied;  // the recipe's rounding of the tied embedding's uses
};

// A checksum of one copy a rank computes with (a piece of held_params()): the per-step replica
// check, cheap where the whole copy is kept only after the last step.
struct HeldDigest {
  std::string tensor;
  comm::DType dtype = comm::DType::f64;
  std::size_t begin = 0, count = 0;
  std::uint64_t hash = 0;  // checkpoint::xxh3 of the piece's bytes
};
std::vector<HeldDigest> digest_held(const std::vector<parallel::StatePiece>& held);

// One rank's record of a configuration's run.
struct RankTrace {
  int first_step = 1;  // after a resume from step K: K + 1
  std::vector<ref::StepRecord> steps;
  std::vector<std::vector<parallel::StatePiece>> pieces;  // after each step
  ref::ParamMap<double> final_params;                     // full_params() after the last step
  std::vector<parallel::StatePiece> held;                 // held_params() after the last step
  std::vector<std::vector<HeldDigest>> held_digests;      // ... digested, after each step
  std::vector<parallel::StepHealth> health;
  std::vector<double> step_seconds;  // wall time of each step on this rank
  std::string compute = "cpu";       // the name() of the Compute the rank trained on
  int64_t device_ops = 0;            // ops it computed there (ref::Compute::ops_run)
};

// Saving every `every` steps into save_dir, and resuming from resume_step_dir (validated before).
struct CheckpointPlan {
  std::filesystem::path save_dir;
  int every = 0;
  std::size_t keep = 0;
  std::filesystem::path resume_step_dir;
};

// The per-rank function of a configuration's run, on any backend: builds the engine and trains the
// scenario's steps with the step driver (driver.hpp), records them into `mine` and the rank's
// memory books into `memory`. With a `compute` factory, the rank's Compute (made on the calling
// thread for its world rank) is installed on that thread from before the engine is built until the
// rank is done.
void train_rank(comm::Communicator& c, const Scenario& s, const ref::Dataset& ds,
                const ParallelSpec& p, const CheckpointPlan& ck, RankTrace& mine,
                RankMemory& memory, const ComputeFactory& compute = {},
                const BuildOptions& build = {});

// Where the ranks computed (compute, device_ops; from any rank that started, also for a failed
// run); a device widens the bounds (parity_bound.hpp).
void note_compute(const std::vector<RankTrace>& got, ConfigResult& r);
// Every measure of every step of the ranks' records against the reference, each judged against
// its bound from want.noise (parity_bound.hpp); fills r's steps, error, bound, margin, verdict.
void measure_parity(const Scenario& s, const Trace& want, const std::vector<RankTrace>& got,
                    ConfigResult& r);
std::optional<FaultResult> nan_result(const RankTrace& rank0);
void decide(const Scenario& s, ConfigResult& r);
// The goodput of the ranks' run (rank 0's steps and health; the tokens of each step from the
// reference) over `seconds`.
GoodputResult goodput_of(const Trace& want, const RankTrace& rank0, double seconds);
// Tokens, FLOPs and MFU of t's step time (parallel/flops.hpp), against the scenario's device peak.
void fill_rates(const Scenario& s, const ParallelSpec& p, const Trace& want, TimingResult& t);
// The single-device reference over the scenario's steps (the sampler's global batches); with a
// dump_dir, its tensors as .npy files there (and the noise probe's in dump_dir/noise). Always on
// the CPU, whatever Compute the calling thread has installed. With its noise floor (noise_floor).
// `tied`: how the bf16 recipe rounds the tied embedding's two uses, per step (TiedRounding).
Trace reference_run(const Scenario& s, const ref::Dataset& ds, const std::string& dump_dir,
                    TiedRounding tied = {});
// The noise probe (parity_bound.hpp): the reference trained again under ref::RoundingNoise, its
// errors against `want` (its recipe, want.tied) per step and measure. With a `dump` writer, the
// probe's tensors through it (reference_run gives DIR/noise: what `compare` derives its bounds
// from).
NoiseFloor noise_floor(const Scenario& s, const ref::Dataset& ds, const Trace& want,
                       const ref::TensorDumper::Writer& dump);
// A configuration's row before it runs: label, spec, and, when it cannot run,
// supported = false with the reason in detail.
ConfigResult config_row(const Scenario& s, const ParallelSpec& p);

// Runs `fn` on every rank of a configuration (a backend's rank runner).
using Ranks = std::function<void(const std::function<void(comm::Communicator&)>&)>;

// The NCCL path of run_config (runner_nccl.cpp): the same per-rank function run by `ranks`. With
// `gather` (one rank per process, under mpirun) every rank's record and memory books are
// all-gathered over the world communicator after training, so every process holds all of them
// and reaches the same verdict. Configurations that need more ranks than `capacity` are reported
// as not run (unsupported) with the reason. Timing is the ranks' wall time per step (wall_timing).
ConfigResult run_config_ranks(const Scenario& s, const ref::Dataset& ds, const Trace& want,
                              const ParallelSpec& p, const Ranks& ranks, bool gather, int capacity,
                              const std::string& capacity_what, const ComputeFactory& compute = {});

// Byte form of a rank's record and books (for the gather); unpack(pack(x)) == x.
std::vector<std::byte> pack(const RankTrace& t, const RankMemory& m);
void unpack(const std::vector<std::byte>& bytes, RankTrace& t, RankMemory& m);

}  // namespace shardcheck::harness::detail
