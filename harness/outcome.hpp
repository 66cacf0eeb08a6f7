// What a configuration's simulated run tells beyond parity: detected faults (with the flight
// recorder), timing metrics from the virtual timeline, and the rules that turn them into a verdict
// (an expected fault detected is a pass; an unexpected one means the run broke).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/phases.hpp"
#include "harness/scenario.hpp"
#include "sim/diagnosis.hpp"
#include "sim/timeline.hpp"

namespace shardcheck::harness {

struct FaultResult {
  // In expect.fault's vocabulary: deadlock, hang, crash, mismatch, corruption, nan, oom,
  // straggler; "error" for a failure that is none of these.
  std::string kind;
  bool detected = true;
  // Unexpected, it means the run broke (exit 3). Not for a straggler (numbers unchanged) or a
  // corruption only the parity check saw (that is a failed check, exit 1).
  bool breaks_run = true;
  std::vector<int> ranks;  // culprits (world ranks)
  std::string op, group;
  std::uint64_t seq = 0;
  int step = 0;
  std::string message;
  std::string phase;  // straggler: the step phase (phases.hpp) its extra time went to
  std::vector<std::vector<sim::FlightRecord>> flight_records;  // per rank, oldest first
};

struct TimingResult {
  bool valid = false;
  double step_time_s = 0;  // mean over steps of the slowest rank's step
  double p50 = 0, p95 = 0, max = 0;
  int slowest_rank = -1;
  double tokens_per_step = 0;  // non-padding tokens of the global batch, mean over steps
  double tokens_per_s = 0;
  double flops_per_step = 0;       // model FLOPs (forward + backward, see parallel/flops.hpp)
  double mfu = 0;                  // flops_per_step / (step_time_s * ranks * peak)
  double scaling_efficiency = -1;  // set across a matrix; -1 = not computed
  std::string scaling_baseline;
};

// Goodput (DESIGN.md): the tokens that advanced training, beside all the tokens processed. A
// step skipped by the non-finite policy processed its tokens for nothing; tokens replayed after
// a resume (steps trained again because they were lost) and discarded work (steps run after the
// last checkpoint of a run that crashed) count the same way. Rates over the run's time.
struct GoodputResult {
  bool valid = false;
  double tokens_processed = 0;  // non-padding tokens of every step the ranks ran
  double tokens_skipped = 0, tokens_replayed = 0, tokens_discarded = 0;
  double tokens_good = 0;  // processed - skipped - replayed - discarded
  double fraction = 0;     // good / processed
  double seconds = 0;      // the run's time (virtual on the simulator)
  double tokens_per_s = 0, good_tokens_per_s = 0;
};

// The expect-vocabulary name of a simulator diagnosis.
std::string fault_kind(sim::DiagnosisKind k);
FaultResult from_diagnosis(const sim::Diagnosis& d);

// Per-step step-time summary over ranks and steps 1..steps (later steps, e.g. the harness's final
// parameter gather, are left out).
TimingResult timing_of(const std::vector<sim::StepTime>& steps, int max_step);

// The straggler verdict: the rank with the most compute time in the timeline, the compute phase
// in which it is furthest above the median rank (its per-step seconds against the phase's p50, as
// Megatron's straggler detector compares ranks' compute), what the other ranks wait for it in
// exposed communication, and the cost of it (step time with the straggler against the same run
// without it).
FaultResult straggler_result(const std::vector<sim::TimelineEvent>& timeline,
                             const StepPhases& phases, int ranks, const FaultSpec& injected,
                             double with_s, double without_s);

}  // namespace shardcheck::harness
