// Up-front memory and time estimates for the commands that allocate and compute in proportion to
// their input (`run`, `matrix`, `drill checkpoint`, `bench collectives`, `plan --search` and
// `plan --simulate-ranks`), checked against a budget
// before anything is allocated: a scenario or size that cannot fit, or cannot finish in the time
// allowed, is refused (exit 2) naming the key that drives the estimate, the estimate and the
// budget, instead of dying of bad_alloc or running for days. The estimates count only what the
// run certainly holds or computes, at an optimistic speed, so they refuse nothing that would fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/plan.hpp"
#include "harness/plan_search.hpp"
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

// One collective on the simulator (SimWorld: a thread per rank), a lower bound of its wall time
// on this machine: a fixed cost per rank and op that grows with the ranks (each op wakes and
// synchronises every rank thread, and each rank's share of the rendezvous grows with the group),
// spread over every core, plus each rank's bytes written at kOptimisticBytesPerCore per core.
// Calibrated on a 2-core VM (reports/2026-12-07-time-guards-per-op-cost-2core-vm.md): there one
// 4 KiB all_reduce took 8.4 us per rank at 2 ranks, 18 at 32, 23 at 128, 35-43 at 512 and 51-53
// at 1,024, all at or above ranks x (7.5 us + 0.03 us x ranks); in CPU seconds per rank and op
// (x 2 cores) the constants below. Other ops measured dearer, not cheaper.
inline constexpr double kSimRankOpCpuSeconds = 1.5e-5;
inline constexpr double kSimRankPairCpuSeconds = 6e-8;
inline constexpr double kOptimisticBytesPerCore = 2e10;
double sim_collective_seconds(int ranks, double bytes_per_rank);

// bench collectives on the simulator: for every size (`sizes`, in bytes: bench_counts' rows) and
// both modes (out-of-place, in-place), the check run and its all_reduce, the warm-up, the timed
// iterations and the barriers around them, each a sim_collective_seconds of its size (iters 0:
// the timed loop runs about 0.2 s, and at least 3 iterations).
TimeEstimate estimate_bench_time(int ranks, const std::vector<std::uint64_t>& sizes, int warmup,
                                 int iters);

// plan --search (plan_search.hpp), counted once the meshes are enumerated: each candidate's
// ledger, bound and clock, in CPU seconds a fixed cost, a cost per layer of the skeleton it
// replays and a cost per rank of the world (groups placed, splits laid out, the clock's per-rank
// state), spread over every core. Calibrated on a 2-core VM (reports/2026-12-07-time-guards-
// per-op-cost-2core-vm.md): the 70B scenario's search took 0.25 ms per candidate at 1,024 ranks,
// 0.82 at 16,384 and 37 at 1,048,576, a 4-layer model's 35 us at 8; the constants are about 60 %
// of a fit through those, a lower bound. Its memory: at least 1 KiB per rank (2.6 GiB measured
// at 1,048,576 ranks).
inline constexpr double kSearchCandidateCpuSeconds = 3e-5;
inline constexpr double kSearchLayerCpuSeconds = 2.5e-6;
inline constexpr double kSearchRankCpuSeconds = 4e-8;
inline constexpr std::uint64_t kSearchBytesPerRank = 1024;
TimeEstimate estimate_search_time(const SearchWork& w);
MemoryEstimate estimate_search_memory(const SearchWork& w);

// plan --simulate-ranks (plan.hpp's SimulateWork): each configuration's SimWorld meta run, every
// rank issuing the collectives the symmetric clock counted per step, each at a cost per rank and
// op that grows with the ranks (rank threads woken and synchronised; no payload in meta mode),
// spread over every core. Calibrated on the 2-core VM: 5.6 us per rank and op at 64 ranks (TP),
// 9.9 at 256 (TP), 21.6 at 512 (ZeRO-3); the constants give 4 us + 0.012 us x ranks there, below
// each. Its memory: at least 256 KiB per rank thread (0.5 to 1.4 MiB measured).
inline constexpr double kSimMetaRankOpCpuSeconds = 8e-6;
inline constexpr double kSimMetaRankPairCpuSeconds = 2.4e-8;
inline constexpr std::uint64_t kSimMetaBytesPerRank = std::uint64_t{256} << 10;
TimeEstimate estimate_simulate_time(const std::vector<SimulateWork>& work);
MemoryEstimate estimate_simulate_memory(const std::vector<SimulateWork>& work);

// Throws BadInput naming e.driver, the estimate and the budget when e.seconds > budget_s
// (budget_s <= 0: no limit).
void check_time(const TimeEstimate& e, double budget_s, const std::string& what);
// --max-time SECONDS on `cmd` (default 3600; 0: no limit; NaN, infinities and negative numbers
// are refused, exit 2, naming the option).
void add_max_time_option(CLI::App& cmd, double& seconds);
inline constexpr double kDefaultMaxTimeSeconds = 3600;

// "1.5 GiB"-style text for messages.
std::string format_bytes(std::uint64_t bytes);

}  // namespace shardcheck::harness
