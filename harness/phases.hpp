// Per-rank step phases from a run's timeline (virtual time on the simulator): where each rank's
// step went. Compute is split by what the op computes (its ComputeCost name) and the pass it ran
// in (a forward op inside a backward pass is full recompute): forward, backward, recompute,
// optimizer; communication by whether compute waited for it: exposed (the comm stream
// busy while the compute stream is idle) or hidden under compute; the rest of the step, with
// neither stream busy, is idle (on a pipeline: its bubble). Each phase is a rank's mean per step;
// report.json gives p50 / p95 / max over ranks and the slowest rank of each.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "sim/timeline.hpp"

namespace shardcheck::harness {

enum class Phase : int { forward, backward, recompute, optimizer, exposed_comm, comm_busy, idle };
inline constexpr int kPhases = 7;
const char* phase_key(Phase p);  // "forward", ..., "exposed_comm", "comm_busy", "idle"

struct PhaseStats {
  double p50 = 0, p95 = 0, max = 0;
  int slowest_rank = -1;  // the rank with the most of it
};

struct StepPhases {
  bool valid = false;
  std::vector<std::array<double, kPhases>> per_rank;  // seconds per step, mean over steps
  std::array<PhaseStats, kPhases> stats{};
};

// Steps 1..max_step of `steps` (each rank's step boundaries) over the events of the timeline.
StepPhases step_phases(const std::vector<sim::TimelineEvent>& timeline,
                       const std::vector<sim::StepTime>& steps, int ranks, int max_step);

}  // namespace shardcheck::harness
