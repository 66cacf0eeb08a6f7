// Up-front memory and time estimates for the commands that allocate and compute in proportion to
// their input (`run`, `matrix`, `drill checkpoint`, `bench collectives`), checked against a budget
// before anything is allocated: a scenario or size that cannot fit, or cannot finish in the time
// allowed, is refused (exit 2) naming the key that drives the estimate, the estimate and the
// budget, instead of dying of bad_alloc or running for days. The estimates count only what the
// run certainly holds or computes, at an optimistic speed, so they refuse nothing that would fit.
#pragma once

#include <cstdint>
#include <string>

#include "harness/scenario.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace shardcheck::harness {

struct MemoryEstimate {
  std::uint64_t bytes = 0;
  std::string driver;  // what dominates, with its JSON path or option ("$.data.documents: ...")
};

// The budget when --max-memory is not given: the machine's physical memory, or the process's
// address-space or data limit (ulimit -v / -d) when lower.
std::uint64_t machine_memory_bytes();

// A run of the scenario on the simulator, all ranks in this process: the dataset (every token
// in five packed arrays), the reference run (its parameters, gradients, optimizer state and the
// parameters it keeps per step for the parity check) and, for the largest configuration, every
// rank's model state and activations from the engine's analytic ledger (parallel/mp/mesh_ledger)
// plus what the parity check keeps (one copy of the model state per step, every rank's final
// parameters in f64).
MemoryEstimate estimate_run(const Scenario& s);

// bench collectives on the simulator: every rank's send and receive buffer at the largest size.
MemoryEstimate estimate_bench(int ranks, std::uint64_t max_bytes);

// Throws BadInput naming e.driver, the estimate and the budget when e.bytes > budget; `option`
// names how to raise the budget ("--max-memory").
void check_memory(const MemoryEstimate& e, std::uint64_t budget, const std::string& what);

// A byte-size option ("4096", "4KB", "1GiB"); a negative value is refused (CLI11's size parser
// alone would wrap "-5" to 2^64 - 5).
CLI::Option* add_size_option(CLI::App& cmd, const std::string& name, std::uint64_t& bytes,
                             const std::string& help);
// --max-memory SIZE on `cmd` (0, the default: machine_memory_bytes()).
void add_max_memory_option(CLI::App& cmd, std::uint64_t& bytes);
// The budget --max-memory gave, or the machine's.
std::uint64_t memory_budget(std::uint64_t max_memory_option);

struct TimeEstimate {
  double seconds = 0;
  std::string driver;  // what dominates, with its JSON path or option
};

// The CPU speed the time estimates assume for the reference model's kernels, per core: well above
// what they reach on any CPU (reports/ has the measured rate), so the estimate is a lower bound.
inline constexpr double kOptimisticFlopsPerCore = 2e10;

// A lower bound on the wall time of training the scenario on the simulator: the training FLOPs
// (forward, backward, recomputation, from parallel/flops) of the reference run and of each
// configuration's ranks together (at least the reference's), `runs` trainings per configuration
// (a drill trains and resumes), at kOptimisticFlopsPerCore on every core of this machine.
TimeEstimate estimate_run_time(const Scenario& s, int runs = 1);

// bench collectives on the simulator: every timed and warm-up iteration of every size writes at
// least each rank's receive buffer, at kOptimisticBytesPerCore on every core (iters 0 times about
// 0.2 s per size, so it is counted as 0.2 s).
inline constexpr double kOptimisticBytesPerCore = 2e10;
TimeEstimate estimate_bench_time(int ranks, std::uint64_t min_bytes, std::uint64_t max_bytes,
                                 int warmup, int iters);

// Throws BadInput naming e.driver, the estimate and the budget when e.seconds > budget_s
// (budget_s <= 0: no limit).
void check_time(const TimeEstimate& e, double budget_s, const std::string& what);
// --max-time SECONDS on `cmd` (default 3600; 0: no limit).
void add_max_time_option(CLI::App& cmd, double& seconds);
inline constexpr double kDefaultMaxTimeSeconds = 3600;

// "1.5 GiB"-style text for messages.
std::string format_bytes(std::uint64_t bytes);

}  // namespace shardcheck::harness
