// What the virtual clock leaves behind: one event per compute op and per completed communication
// op, on the rank's compute or comm stream, and each rank's step boundaries. Plain data for
// reports (SVG timelines, step-time percentiles); the simulator fills it, the harness reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"

namespace shardcheck::sim {

enum class Stream : std::uint8_t { compute, comm };
std::string_view name_of(Stream s);

struct TimelineEvent {
  int rank = 0;  // world rank
  Stream stream = Stream::compute;
  std::string kind;  // "compute", or the op: "all_reduce", "send", ...
  std::string name;  // the ComputeCost label, or the op again
  int step = 0;      // 0 before the first begin_step
  double start = 0;  // virtual seconds since the run started
  double end = 0;
  std::size_t bytes = 0;    // compute: memory traffic; comm: the S of the op's cost formula
  std::string group;        // comm only
  std::uint64_t seq = 0;    // comm only
  comm::WorkScope scope{};  // what the rank was working on when it issued the op
};

// One step of one rank: from its begin_step(step) to its next begin_step, or to the end of the
// rank's work (compute and comm streams both drained) for its last step.
struct StepTime {
  int rank = 0;
  int step = 0;
  double start = 0;
  double end = 0;
  double seconds() const { return end - start; }
};

// Percentiles of per-rank step times over all (rank, step) pairs, and the slowest rank.
struct StepSummary {
  double p50 = 0, p95 = 0, max = 0;
  double step_time =
      0;  // mean over steps of the max over ranks (a step ends when its last rank does)
  int slowest_rank = -1;  // rank with the largest total step time
  std::size_t samples = 0;
};
// Nearest-rank percentiles; empty input gives zeros and slowest_rank -1.
StepSummary summarize(const std::vector<StepTime>& steps);

}  // namespace shardcheck::sim
