// Faults the simulator injects, deterministically: a plan (data, from the scenario) and, per rank,
// the matcher that says what to do at a step start or at the rank's k-th communication op of a
// step. No threads here; the communicator asks, the world records what fired.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardcheck::sim {

enum class FaultKind : std::uint8_t {
  straggler,        // rank's compute costs `slowdown` times more from step `from_step` on
  hang,             // rank blocks forever at (step, op_index); op_index -1: at the step start
  crash,            // rank's thread throws InjectedCrash at (step, op_index)
  skip_collective,  // rank returns from its op_index-th op of `step` without joining it
  mismatch,         // rank issues that op with an altered descriptor (`what`)
  corrupt_payload,  // that op's contribution of the rank is altered in flight
  memory_budget,    // the rank's MemoryTracker budget is `bytes`
  nan_gradient,     // injected above the simulator (by the harness); the sim only carries it
};
std::string_view name_of(FaultKind k);

enum class MismatchWhat : std::uint8_t { count, dtype, op };
std::string_view name_of(MismatchWhat w);

// One fault. Which fields matter depends on the kind (see FaultKind). Steps are 1-based, as
// Communicator::begin_step numbers them. op_index counts every communication op the rank issues
// after begin_step(step) (collectives on any group, barrier, send, recv; not split), from 0.
struct Fault {
  FaultKind kind = FaultKind::hang;
  int rank = 0;  // world rank
  int step = 1;
  int op_index = 0;
  double slowdown = 1.0;  // straggler
  int from_step = 1;      // straggler
  MismatchWhat what = MismatchWhat::count;
  std::size_t bytes = 0;         // memory_budget
  std::string describe() const;  // "hang of rank 2 at step 2, op 3"
};

struct FaultPlan {
  std::uint64_t seed = 0;  // picks the corrupted element of corrupt_payload
  std::vector<Fault> faults;
};

// A fault that fired: where the rank was when it did.
struct FiredFault {
  Fault fault;
  int step = 0;
  int op_index = -1;  // -1: at the step start
  std::string group;  // empty at the step start
  std::string op;
  std::uint64_t seq = 0;
  double virtual_time = 0;  // the rank's compute clock
  std::string detail;       // e.g. which element was flipped
  std::string describe() const;
};

// Thrown on a rank's thread by a crash fault.
class InjectedCrash : public std::runtime_error {
 public:
  InjectedCrash(int rank, int step, int op_index, const std::string& where);
  int rank() const { return rank_; }
  int step() const { return step_; }
  int op_index() const { return op_index_; }

 private:
  int rank_, step_, op_index_;
};

// Checks a plan against the world size: std::invalid_argument naming faults[i] and the field.
void validate(const FaultPlan& plan, int world_size);

// The faults of one rank, asked at each step start and op. Used only by that rank's thread.
class RankFaults {
 public:
  RankFaults() = default;
  RankFaults(const FaultPlan& plan, int rank);
  // Compute slowdown factor at `step` (product of the stragglers that apply; 1 if none).
  double slowdown(int step) const;
  // The fault (hang or crash) that fires at the start of `step`, if any.
  std::optional<Fault> at_step_start(int step) const;
  // The fault that fires at op `op_index` of `step` (first in plan order), if any.
  std::optional<Fault> at_op(int step, int op_index) const;
  // The budget of a memory_budget fault, if any.
  std::optional<std::size_t> memory_budget() const;

 private:
  std::vector<Fault> faults_;
};

// Deterministic choice of the corrupted element: which of `count` elements (count > 0).
std::size_t corrupt_index(std::uint64_t seed, int rank, int step, int op_index, std::size_t count);
// Flips bit 6 of the most significant byte of element `index` (little-endian): the top exponent
// bit of every float format, a large value change for integers. A corruption that small parity
// tolerances would hide is of no use to a fault drill.
void flip_element(void* data, std::size_t elem_size, std::size_t index);

}  // namespace shardcheck::sim
