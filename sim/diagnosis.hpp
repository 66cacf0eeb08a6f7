// Diagnosis of a failed simulated run: what kind of failure, which ranks caused it, where (op,
// group, seq, step), a paragraph a person can act on, and every rank's flight recorder. Built by
// SimWorld after its threads have joined, from the errors, the deadlock detector's picture and
// the faults that fired; injected faults are traced to their rank (a hang is "hang", not just
// "deadlock").
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sim/faults.hpp"
#include "sim/recorder.hpp"

namespace shardcheck::sim {

// What one rank's function ended with.
struct RankOutcome {
  int rank = 0;
  bool ok = true;
  bool root_cause = false;  // false for errors caused by another rank's failure (peer, abort)
  std::string message;
  std::exception_ptr error;
};

// One rank as the deadlock detector saw it when it fired.
struct RankPicture {
  int rank = 0;
  bool finished = false;  // else blocked
  bool hung = false;      // blocked by an injected hang fault
  std::string group, op;
  std::uint64_t seq = 0;
  std::vector<int> missing;  // world ranks that never arrived at the op it waits in
  bool has_last = false;
  FlightRecord last_completed;
};

enum class DiagnosisKind : std::uint8_t { deadlock, hang, crash, mismatch, corruption, oom, error };
std::string_view name_of(DiagnosisKind k);

struct Diagnosis {
  DiagnosisKind kind = DiagnosisKind::error;
  std::vector<int> ranks;  // the culprits (world ranks): who never arrived, crashed, disagreed...
  std::string op;  // where it showed: the op the culprit never arrived at, that mismatched...
  std::string group;
  std::uint64_t seq = 0;
  int step = 0;                     // the culprit's step (0: before the first begin_step)
  std::string message;              // a paragraph: who, where, what each blocked rank waits in
  std::optional<FiredFault> fault;  // the injected fault this was traced to, if any
  std::vector<std::vector<FlightRecord>> flight_records;  // per world rank, oldest first
};

// Everything SimWorld knows after a failed run (internal to sim/, public for tests).
struct DiagnosisInput {
  int chosen = -1;  // the rank whose error RankFailure reports
  const std::vector<RankOutcome>* outcomes = nullptr;
  const std::vector<RankPicture>* picture = nullptr;  // empty unless a deadlock fired
  std::vector<FiredFault> fired;                      // every rank's, in rank order
  std::vector<int> steps;                             // each rank's step at the end
  std::vector<std::vector<FlightRecord>> records;
};
Diagnosis diagnose(DiagnosisInput in);

}  // namespace shardcheck::sim
