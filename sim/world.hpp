// SimWorld: runs one function on N logical ranks, each on its own CPU thread, with a simulated
// communicator per rank, a virtual clock per rank and the faults of its options. The first failing
// rank's error is rethrown (RankFailure, naming the rank) and a structured Diagnosis is kept; a
// failure releases every other rank (nothing is left blocked), and a deadlock is detected from
// global state: when every live rank is blocked and none can progress, the run stops and names who.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "sim/diagnosis.hpp"
#include "sim/faults.hpp"
#include "sim/options.hpp"
#include "sim/recorder.hpp"
#include "sim/timeline.hpp"
#include "sim/topology.hpp"

namespace shardcheck::sim {

class WorldState;

// Thrown by SimWorld::run when the system cannot start a thread for every rank (the ranks that did
// start are aborted and joined first): names how many could start.
class ThreadStartError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by SimWorld::run: the rank whose error came first (root causes before the follow-on
// errors they caused in other ranks), its message, and the original exception.
class RankFailure : public std::runtime_error {
 public:
  RankFailure(int rank, const std::string& what, std::exception_ptr cause)
      : std::runtime_error("rank " + std::to_string(rank) + ": " + what),
        rank_(rank),
        cause_(cause) {}
  int rank() const { return rank_; }
  std::exception_ptr cause() const { return cause_; }
  [[noreturn]] void rethrow_cause() const { std::rethrow_exception(cause_); }

 private:
  int rank_;
  std::exception_ptr cause_;
};

class SimWorld {
 public:
  // Throws std::invalid_argument for fewer than one rank, a bad topology or a fault naming a
  // rank outside the world.
  explicit SimWorld(int ranks, SimOptions opts = {});
  ~SimWorld();
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  int size() const { return ranks_; }
  const SimOptions& options() const { return opts_; }

  // Runs fn on every rank concurrently; returns when all have finished. Throws RankFailure if any
  // rank failed, ThreadStartError if not every rank's thread could start. May be called again; each
  // run starts from fresh groups, sequence numbers, clocks (virtual time 0), memory books and
  // faults.
  void run(const std::function<void(comm::Communicator&)>& fn);

  // Outcomes of the last run, one per rank.
  const std::vector<RankOutcome>& outcomes() const { return outcomes_; }
  // Each rank's flight recorder at the end of the last run (its newest ops, oldest first).
  const std::vector<std::vector<FlightRecord>>& flight_records() const { return records_; }
  // Why the last run failed; nullopt after a run that succeeded.
  const std::optional<Diagnosis>& diagnosis() const { return diagnosis_; }
  // Faults that fired in the last run, in rank order (a corrupt_payload without checksums fires
  // silently: this says where, for the harness's parity failure to name rank, op and seq).
  const std::vector<FiredFault>& fired_faults() const { return fired_; }

  // Virtual time of the last run. Events by rank, each rank's in issue order; ops that never
  // completed leave no event.
  const std::vector<TimelineEvent>& timeline() const { return timeline_; }
  // Per rank per step (ranks that called begin_step), by rank then step.
  const std::vector<StepTime>& step_times() const { return steps_; }
  // Each rank's virtual time when its function returned (both streams drained).
  const std::vector<double>& rank_end_times() const { return end_times_; }
  // The run's virtual duration: the latest rank end time.
  double virtual_time() const;
  // Each rank's tracked-allocator books at the end of the last run.
  const std::vector<comm::MemoryTracker>& memory() const { return memory_; }

 private:
  int ranks_;
  SimOptions opts_;
  std::vector<RankOutcome> outcomes_;
  std::vector<std::vector<FlightRecord>> records_;
  std::optional<Diagnosis> diagnosis_;
  std::vector<FiredFault> fired_;
  std::vector<TimelineEvent> timeline_;
  std::vector<StepTime> steps_;
  std::vector<double> end_times_;
  std::vector<comm::MemoryTracker> memory_;
};

}  // namespace shardcheck::sim
