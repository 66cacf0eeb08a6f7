// SimWorld: runs one function on N logical ranks, each on its own CPU thread, with a simulated
// communicator per rank. The first failing rank's error is rethrown (RankFailure, naming the rank);
// a failure releases every other rank (nothing is left blocked), and a deadlock is detected from
// global state: when every live rank is blocked and none can progress, the run stops and names who.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "sim/recorder.hpp"

namespace shardcheck::sim {

class WorldState;

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

// What one rank's function ended with.
struct RankOutcome {
  int rank = 0;
  bool ok = true;
  bool root_cause = false;  // false for errors caused by another rank's failure (peer, abort)
  std::string message;
  std::exception_ptr error;
};

class SimWorld {
 public:
  explicit SimWorld(int ranks);
  ~SimWorld();
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  int size() const { return ranks_; }

  // Runs fn on every rank concurrently; returns when all have finished. Throws RankFailure if any
  // rank failed. May be called again; each run starts from fresh groups and sequence numbers.
  void run(const std::function<void(comm::Communicator&)>& fn);

  // Outcomes of the last run, one per rank.
  const std::vector<RankOutcome>& outcomes() const { return outcomes_; }
  // Each rank's flight recorder at the end of the last run (its newest ops, oldest first).
  const std::vector<std::vector<FlightRecord>>& flight_records() const { return records_; }

 private:
  int ranks_;
  std::vector<RankOutcome> outcomes_;
  std::vector<std::vector<FlightRecord>> records_;
};

}  // namespace shardcheck::sim
