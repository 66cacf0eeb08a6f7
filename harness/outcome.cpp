// Faults and timing of a configuration's run (see outcome.hpp).
#include "harness/outcome.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "sim/topology.hpp"

namespace shardcheck::harness {

std::string fault_kind(sim::DiagnosisKind k) {
  switch (k) {
    case sim::DiagnosisKind::deadlock:
      return "deadlock";
    case sim::DiagnosisKind::hang:
      return "hang";
    case sim::DiagnosisKind::crash:
      return "crash";
    case sim::DiagnosisKind::mismatch:
      return "mismatch";
    case sim::DiagnosisKind::corruption:
      return "corruption";
    case sim::DiagnosisKind::oom:
      return "oom";
    case sim::DiagnosisKind::error:
      return "error";
  }
  return "error";
}

FaultResult from_diagnosis(const sim::Diagnosis& d) {
  FaultResult f;
  f.kind = fault_kind(d.kind);
  f.ranks = d.ranks;
  f.op = d.op;
  f.group = d.group;
  f.seq = d.seq;
  f.step = d.step;
  f.message = d.message;
  f.flight_records = d.flight_records;
  return f;
}

TimingResult timing_of(const std::vector<sim::StepTime>& steps, int max_step) {
  std::vector<sim::StepTime> kept;
  for (const auto& s : steps)
    if (s.step >= 1 && s.step <= max_step) kept.push_back(s);
  const sim::StepSummary sum = sim::summarize(kept);
  TimingResult t;
  t.valid = sum.samples > 0;
  t.step_time_s = sum.step_time;
  t.p50 = sum.p50;
  t.p95 = sum.p95;
  t.max = sum.max;
  t.slowest_rank = sum.slowest_rank;
  return t;
}

FaultResult straggler_result(const std::vector<sim::TimelineEvent>& timeline,
                             const StepPhases& phases, int ranks, const FaultSpec& injected,
                             double with_s, double without_s) {
  std::vector<double> busy(static_cast<std::size_t>(ranks), 0.0);
  for (const auto& e : timeline)
    if (e.stream == sim::Stream::compute && e.rank >= 0 && e.rank < ranks)
      busy[static_cast<std::size_t>(e.rank)] += e.end - e.start;
  const auto it = std::max_element(busy.begin(), busy.end());
  const int slow = static_cast<int>(it - busy.begin());
  std::vector<double> sorted = busy;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  FaultResult f;
  f.kind = "straggler";
  f.breaks_run = false;
  f.ranks = {slow};
  f.step = injected.step;
  // Detected when the injected rank stands out: the most compute time, clearly above the median.
  f.detected = slow == injected.rank && *it > median * 1.05;
  std::ostringstream os;
  os << "rank " << slow << " is the slowest: " << sim::format_seconds(*it)
     << " of compute in the run against a median of " << sim::format_seconds(median)
     << " per rank; step time " << sim::format_seconds(with_s) << " with it, "
     << sim::format_seconds(without_s) << " without the injected slowdown";
  if (without_s > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, " (+%.1f%%)", 100.0 * (with_s / without_s - 1.0));
    os << pct;
  }
  if (phases.valid && static_cast<std::size_t>(slow) < phases.per_rank.size()) {
    const auto& mine = phases.per_rank[static_cast<std::size_t>(slow)];
    Phase worst = Phase::forward;
    double excess = -1;
    for (Phase p : {Phase::forward, Phase::backward, Phase::recompute, Phase::optimizer}) {
      const double d =
          mine[static_cast<std::size_t>(p)] - phases.stats[static_cast<std::size_t>(p)].p50;
      if (d > excess) {
        excess = d;
        worst = p;
      }
    }
    f.phase = phase_key(worst);
    os << "; most of it in " << f.phase << ": "
       << sim::format_seconds(mine[static_cast<std::size_t>(worst)])
       << " per step against a median of "
       << sim::format_seconds(phases.stats[static_cast<std::size_t>(worst)].p50)
       << "; the other ranks wait for it in exposed communication (median "
       << sim::format_seconds(phases.stats[static_cast<std::size_t>(Phase::exposed_comm)].p50)
       << " per step, its own "
       << sim::format_seconds(mine[static_cast<std::size_t>(Phase::exposed_comm)]) << ")";
  }
  os << "; injected: rank " << injected.rank << " slowed " << injected.slowdown << "x from step "
     << injected.step;
  f.message = os.str();
  return f;
}

}  // namespace shardcheck::harness
