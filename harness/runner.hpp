// Runs a scenario: the single-device reference once, then every configuration of its matrix on
// the simulator, and measures parity per step (global loss and every parameter at full shape).
// Configurations whose strategies are not built yet are reported as such, never silently passed.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/memory.hpp"
#include "harness/bubble.hpp"
#include "harness/outcome.hpp"
#include "harness/parity_bound.hpp"
#include "harness/phases.hpp"
#include "harness/scenario.hpp"
#include "parallel/data_parallel.hpp"
#include "reference/compute.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::harness {

struct StepParity {
  int step = 0;
  double loss = 0, ref_loss = 0;
  // The step's error closest to its bound (parity_bound.hpp: over every measure, rank and
  // tensor), that bound, and the measure it is.
  double max_rel_err = 0;
  double bound = 0;
  std::string measure;
};

// One rank's tracked-allocator books at the end of a configuration's run (bytes).
struct RankMemory {
  int rank = 0;
  comm::MemoryBreakdown resident;  // held at the end (between steps)
  comm::MemoryBreakdown at_peak;   // breakdown when the total peaked
  std::size_t peak = 0;
  std::string peak_phase;
};

struct ConfigResult {
  std::string config;  // ParallelSpec::label()
  ParallelSpec spec;
  std::string strategy;  // "ddp", "zero1".. or "" when unsupported
  std::vector<StepParity> steps;
  // The run's error closest to its bound (over every step and measure), that bound, the measure,
  // and the margin tolerance / max_rel_err (infinite when the error is 0).
  double max_rel_err = 0;
  double tolerance = 0;
  std::string measure;
  double margin = 0;
  // Per measure (parity_bound.hpp Measure): its error closest to its bound, that bound, where.
  struct MeasureResult {
    double err = 0, bound = 0;
    std::string where;
    bool exceeds() const { return !(err <= bound); }
  };
  std::array<MeasureResult, kMeasures> measures{};
  // Compared against the bf16 reference that rounds the tied embedding's two uses apart, as this
  // mesh does (parallel::rounds_gradient_parts), rather than their sum.
  bool tied_apart_reference = false;
  bool supported = true;
  bool parity_pass = false;  // every measure within its bound (false when the run did not finish)
  bool pass = false;         // the verdict (outcome.hpp: parity, or the expected fault detected)
  bool broke = false;        // an unexpected fault stopped or corrupted the run (exit 3)
  std::string detail;        // why unsupported, or where the largest error was
  double wall_seconds = 0;
  // What rank 0 computed on: "cpu", or the name() of the ref::Compute RunOptions::compute gave
  // it ("" when the configuration did not run), and how many ops the ranks computed there (0 on
  // the CPU; a device that declined everything shows as 0 too).
  std::string compute;
  int64_t device_ops = 0;
  // timing measured in wall seconds per rank and step (the nccl backend), not the simulator's
  // virtual clock.
  bool wall_timing = false;
  std::vector<RankMemory> memory;  // one per rank (empty when unsupported)
  std::vector<FaultResult> faults;
  TimingResult timing;
  GoodputResult goodput;
  StepPhases phases;  // where each rank's step went (simulator: from the timeline)
  std::vector<sim::TimelineEvent> timeline;
  // Per world rank, the tracked total after each allocate / release on the virtual clock
  // (simulator; empty elsewhere): the trace's memory counters and the HTML's memory over the step.
  std::vector<std::vector<comm::MemorySample>> memory_series;
  std::optional<PipelineResult> pipeline;  // pp > 1: measured bubble beside the formula
  std::string resumed_from;                // the step directory a --resume started from
  bool resume_refused = false;             // the newest committed checkpoint failed validation
};

struct RunResult {
  Scenario scenario;
  std::vector<ConfigResult> configs;
  NoiseFloor noise;  // the probe the bounds were derived from
  // ... and that of the reference with the tied embedding's uses rounded apart, when a
  // configuration was compared against it (ConfigResult::tied_apart_reference)
  std::optional<NoiseFloor> noise_tied_apart;
  std::string compute = "cpu";  // RunOptions::compute.name
  // The reference run's step records and, per step, its MoE expert load: report.json's "moe".
  std::vector<ref::StepRecord> reference_steps;
  std::vector<std::vector<ref::MoeLoad>> reference_moe_load;
  bool pass() const;
  bool broke() const;
};

// Makes the ref::Compute that strategy rank `rank` (its world rank) computes on while it trains;
// called on that rank's own thread (or process). nullptr: the CPU loops.
using ComputeFactory = std::function<std::unique_ptr<ref::Compute>(int rank)>;

// A factory and what report.json calls it ("cpu", "cuda", or a test's fake). Empty: the CPU.
struct ComputeChoice {
  ComputeFactory factory;
  std::string name = "cpu";
};

struct RunOptions {
  // "sim" (the simulator) or "nccl" (GPUs through harness/backend.hpp: no faults, no virtual
  // timeline, no checkpoints; the caller refuses scenarios that need them).
  std::string backend = "sim";
  // When set, the reference run's tensors are written there as .npy files plus index.json
  // (DESIGN.md "Tensor dumps").
  std::string dump_tensors;
  // Save every checkpoint.every steps into this directory (dir/<config label> for a matrix), and
  // resume from the newest committed checkpoint in resume_dir (validated first; fail closed).
  std::string checkpoint_dir;
  std::string resume_dir;
  // Where every rank of every configuration computes the reference ops while it trains (installed
  // on its thread with ref::ComputeScope for the time it trains: the simulator, a resume, the
  // straggler baseline, the nccl ranks). The single-device reference run always stays on the
  // CPU: it is the oracle, and a broken device op computed on both sides would be invisible.
  ComputeChoice compute;
  // pp > 1 on the simulator: train each configuration once more with free links (no latency, no
  // bandwidth limit) to measure its schedule's own bubble (PipelineResult::schedule_bubble). Tests
  // that only judge parity leave it off.
  bool schedule_bubble = true;
  // Internal use (tests): a known bug planted in every configuration's engine (the gate must fail).
  parallel::testing::Mutation planted = parallel::testing::Mutation::kNone;
  // Called before each configuration starts ("reference", then each config label).
  using Progress = std::function<void(const std::string& what, int index, int total)>;
  Progress progress;
};

// Throws ScenarioError for configurations that cannot be run at all.
RunResult run_scenario(const Scenario& s, const RunOptions& o = {});

}  // namespace shardcheck::harness
