// Memory and time estimates and the budget checks (budget.hpp).
#include "harness/budget.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "harness/cli_commands.hpp"
#include "harness/driver.hpp"
#include "parallel/flops.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_ledger.hpp"
#include "reference/model.hpp"

namespace shardcheck::harness {
namespace {

using u64 = std::uint64_t;
constexpr u64 kMax = std::numeric_limits<u64>::max();

// a * b and a + b, saturating: an estimate past 2^64 bytes is simply "too much".
u64 mul(u64 a, u64 b) {
  return b != 0 && a > kMax / b ? kMax : a * b;
}
u64 add(u64 a, u64 b) {
  return a > kMax - b ? kMax : a + b;
}

u64 param_count(const ref::ModelConfig& m) {
  u64 n = 0;
  for (const auto& [name, shape] : ref::param_shapes(m)) {
    u64 v = 1;
    for (auto d : shape) v = mul(v, static_cast<u64>(d));
    n = add(n, v);
  }
  return n;
}

// One configuration's ranks: the fuller of the first and last rank (the first and last pipeline
// stages hold the embedding and the head) times the world size, activations apart from the rest;
// plus what the parity check keeps: one copy of the model state over the world per step (each
// element is exported once) and every rank's full f64 view of the final parameters.
struct RankBytes {
  u64 state = 0, activations = 0;
  u64 total() const { return add(state, activations); }
};

RankBytes config_bytes(const Scenario& s, const ParallelSpec& p, u64 params) {
  const parallel::MeshOptions o = engine_options(s, p);
  const auto world = static_cast<u64>(p.mesh.world_size());
  RankBytes b;
  for (u64 rank : {u64{0}, world - 1}) {
    const parallel::LedgerRow row =
        parallel::mesh_ledger(s.model, s.train, o, static_cast<int>(rank));
    b.state = std::max<u64>(b.state, row.total() - row.activation_peak);
    b.activations = std::max<u64>(b.activations, row.activation_peak);
  }
  const parallel::Recipe r = parallel::recipe_of(s.train.precision);
  const u64 exports = mul(mul(static_cast<u64>(s.train.steps), params), r.param + r.optimizer());
  return {add(add(mul(world, b.state), exports), mul(mul(world, params), 8)),
          mul(world, b.activations)};
}

}  // namespace

std::uint64_t machine_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  u64 bytes = pages > 0 && page > 0 ? mul(static_cast<u64>(pages), static_cast<u64>(page)) : kMax;
  for (int res : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit l{};
    if (::getrlimit(res, &l) == 0 && l.rlim_cur != RLIM_INFINITY)
      bytes = std::min<u64>(bytes, static_cast<u64>(l.rlim_cur));
  }
  return bytes;
}

MemoryEstimate estimate_run(const Scenario& s) {
  const u64 tokens = mul(static_cast<u64>(s.data.documents), static_cast<u64>(s.data.min_len));
  // The documents, then five packed arrays over at least one padded sequence.
  const u64 packed = std::max<u64>(tokens, static_cast<u64>(s.model.seq_len));
  const u64 data = add(mul(tokens, sizeof(std::int32_t)), mul(packed, 5 * sizeof(std::int32_t)));
  const u64 params = param_count(s.model);
  // The reference in f64: parameters, gradients, two moments, and the parameters of every step.
  const u64 reference = mul(mul(params, 8), 4 + static_cast<u64>(s.train.steps));
  RankBytes widest;
  std::string where = "$.parallel";
  for (std::size_t i = 0; i < s.configs.size(); ++i) {
    RankBytes b;
    try {
      b = config_bytes(s, s.configs[i], params);
    } catch (const parallel::MeshConfigError&) {
      continue;  // not built: the row reports why and allocates nothing
    }
    if (b.total() > widest.total()) {
      widest = b;
      where = (s.has_matrix ? "$.matrix[" + std::to_string(i) + "] " : "$.parallel ") +
              s.configs[i].label();
    }
  }
  const u64 ranks = widest.total();
  MemoryEstimate e;
  e.bytes = add(add(data, reference), ranks);
  if (data >= reference && data >= ranks)
    e.driver = "$.data.documents, $.model.seq_len: " + std::to_string(s.data.documents) +
               " documents of at least " + std::to_string(s.data.min_len) +
               " tokens packed into sequences of " + std::to_string(s.model.seq_len) + " take " +
               format_bytes(data);
  else if (reference >= ranks)
    e.driver = "$.model: " + std::to_string(params) + " parameters; the reference run holds " +
               format_bytes(reference) + " (f64 state and the parameters of each of " +
               std::to_string(s.train.steps) + " steps)";
  else if (widest.activations >= widest.state)
    e.driver = "$.model.seq_len, $.train.micro_batch: the activations of " + where + " take " +
               format_bytes(widest.activations) + " (seq_len " + std::to_string(s.model.seq_len) +
               ", micro_batch " + std::to_string(s.train.micro_batch) + ", the ledger's figures)";
  else
    e.driver = "$.model: " + std::to_string(params) + " parameters; the ranks of " + where +
               " hold " + format_bytes(widest.state) +
               " of model state and per-step exports (the ledger's figures)";
  return e;
}

MemoryEstimate estimate_bench(int ranks, std::uint64_t max_bytes) {
  MemoryEstimate e;
  e.bytes = mul(mul(static_cast<u64>(ranks), max_bytes), 2);
  e.driver = "--max-bytes " + format_bytes(max_bytes) + " on " + std::to_string(ranks) +
             " ranks (a send and a receive buffer each)";
  return e;
}

void check_memory(const MemoryEstimate& e, std::uint64_t budget, const std::string& what) {
  if (e.bytes <= budget) return;
  throw BadInput(what + ": needs at least " + format_bytes(e.bytes) + ", more than the budget of " +
                 format_bytes(budget) + " (--max-memory; default: this machine's memory); " +
                 e.driver);
}

CLI::Option* add_size_option(CLI::App& cmd, const std::string& name, std::uint64_t& bytes,
                             const std::string& help) {
  const CLI::Validator not_negative(
      [](std::string& v) {
        return v.find('-') == std::string::npos ? std::string()
                                                : "a size cannot be negative, got " + v;
      },
      "SIZE");
  // CLI11 runs transforms before checks, the last added first: the sign is looked at before the
  // size parser could wrap "-5b" to 2^64 - 5.
  return cmd.add_option(name, bytes, help)
      ->transform(CLI::AsSizeValue(false))
      ->transform(not_negative);
}

void add_max_memory_option(CLI::App& cmd, std::uint64_t& bytes) {
  add_size_option(cmd, "--max-memory", bytes,
                  "Refuse a run whose memory estimate exceeds this (e.g. 8GB; default: this "
                  "machine's memory, or ulimit -v when lower)");
}

std::uint64_t memory_budget(std::uint64_t max_memory_option) {
  return max_memory_option > 0 ? max_memory_option : machine_memory_bytes();
}

TimeEstimate estimate_run_time(const Scenario& s, int runs) {
  const double seq = static_cast<double>(s.model.seq_len);
  const double forward = parallel::model_forward_flops(s.model, seq);
  double recompute = 0;  // what the backward repeats
  if (s.train.recompute == ref::Recompute::kFull)
    recompute = forward - parallel::head_forward_flops(s.model, seq);
  else if (s.train.recompute == ref::Recompute::kSelective)
    recompute = s.model.layers * parallel::attention_core_flops(s.model, seq);
  const double per_sequence = forward + parallel::backward_flops(forward) + recompute;
  const double step = per_sequence * s.train.global_batch;
  const double trainings = 1.0 + static_cast<double>(s.configs.size()) * std::max(runs, 1);
  const double flops = step * s.train.steps * trainings;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  TimeEstimate e;
  e.seconds = flops / (kOptimisticFlopsPerCore * cores);
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.3g", flops);
  e.driver = "$.train.steps, $.train.global_batch, $.model: " + std::to_string(s.train.steps) +
             " steps of " + std::to_string(s.train.global_batch) + " sequences of " +
             std::to_string(s.model.seq_len) + " tokens, trained " +
             std::to_string(static_cast<long long>(trainings)) +
             " times (the reference and each configuration), are at least " + buf + " FLOPs";
  return e;
}

double sim_collective_seconds(int ranks, double bytes_per_rank) {
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const double n = std::max(ranks, 1);
  return n * (kSimRankOpCpuSeconds + kSimRankPairCpuSeconds * n) / cores +
         n * bytes_per_rank / (kOptimisticBytesPerCore * cores);
}

TimeEstimate estimate_bench_time(int ranks, const std::vector<std::uint64_t>& sizes, int warmup,
                                 int iters) {
  // Per size and mode: the check run, its all_reduce of the wrong count and two barriers (three
  // and a broadcast when iters is 0: the calibration's op), the warm-up and the timed loop.
  double seconds = 0, slowest_op = 0;
  for (const std::uint64_t bytes : sizes) {
    const double op = sim_collective_seconds(ranks, static_cast<double>(bytes));
    const double small = sim_collective_seconds(ranks, 8);
    slowest_op = std::max(slowest_op, op);
    double mode = op * (1 + warmup) + small * 3;
    if (iters > 0)
      mode += op * iters;
    else
      mode += op + small * 2 + std::max(0.2, 3 * op);
    seconds += 2 * mode;
  }
  TimeEstimate e;
  e.seconds = seconds;
  char per_op[64];
  std::snprintf(per_op, sizeof per_op, "%.3g ms", slowest_op * 1e3);
  e.driver = "--iters " + std::to_string(iters) + " and --warmup " + std::to_string(warmup) +
             " in 2 modes over " + std::to_string(sizes.size()) + " sizes up to " +
             format_bytes(sizes.empty() ? 0 : sizes.back()) + " on " + std::to_string(ranks) +
             " ranks, each collective at least " + per_op +
             " (every rank thread woken and synchronised per op: a cost per op that grows with "
             "--ranks); shrink --iters (0: about 0.2 s per size), --ranks or the size range";
  return e;
}

namespace {
double cores() {
  return std::max(1u, std::thread::hardware_concurrency());
}
std::string fmt3(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
}  // namespace

TimeEstimate estimate_search_time(const SearchWork& w) {
  const double per = kSearchCandidateCpuSeconds + kSearchLayerCpuSeconds * w.layers +
                     kSearchRankCpuSeconds * w.world;
  TimeEstimate e;
  e.seconds = static_cast<double>(w.candidates) * per / cores();
  e.driver = "--world " + std::to_string(w.world) + ": " + std::to_string(w.meshes) + " meshes (" +
             std::to_string(w.meshes_built) + " built by the engine), " +
             (w.orders_counted ? "" : "at least ") + std::to_string(w.candidates) +
             (w.orders_counted ? " candidates (settings x rank orders x 3 recompute modes)"
                               : " candidates (settings x 3 recompute modes, one rank order "
                                 "each counted so far)") +
             ", each at least " + fmt3("%.3g ms", per * 1e3) +
             " of CPU (its ledger, bound and clock replay " + std::to_string(w.layers) +
             " layers over " + std::to_string(w.world) + " ranks); shrink --world or --max-cp";
  return e;
}

MemoryEstimate estimate_search_memory(const SearchWork& w) {
  MemoryEstimate e;
  e.bytes = mul(static_cast<u64>(w.world), kSearchBytesPerRank);
  e.driver = "--world " + std::to_string(w.world) + ": the clock's state of every rank (at least " +
             format_bytes(kSearchBytesPerRank) + " each); shrink --world";
  return e;
}

TimeEstimate estimate_simulate_time(const std::vector<SimulateWork>& work) {
  double seconds = 0, worst = -1;
  const SimulateWork* big = nullptr;
  for (const SimulateWork& w : work) {
    const double n = w.world;
    const double t = static_cast<double>(w.steps) * static_cast<double>(w.comm_ops_per_step) * n *
                     (kSimMetaRankOpCpuSeconds + kSimMetaRankPairCpuSeconds * n) / cores();
    seconds += t;
    if (t > worst) worst = t, big = &w;
  }
  TimeEstimate e;
  e.seconds = seconds;
  int largest = 0;
  for (const SimulateWork& w : work) largest = std::max(largest, w.world);
  if (big != nullptr)
    e.driver = "--simulate-ranks selects " + std::to_string(work.size()) +
               " configurations of up to " + std::to_string(largest) + " ranks; the dearest, " +
               big->config + ", runs " + std::to_string(big->world) + " rank threads through " +
               std::to_string(big->comm_ops_per_step) + " collectives per step for " +
               std::to_string(big->steps) + " steps (" + fmt3("%.3g s", worst) +
               "; each collective costs every rank thread a wake-up that grows with the ranks); "
               "lower --simulate-ranks below " +
               std::to_string(big->world) + " to leave it out";
  return e;
}

MemoryEstimate estimate_simulate_memory(const std::vector<SimulateWork>& work) {
  int largest = 0;
  for (const SimulateWork& w : work) largest = std::max(largest, w.world);
  MemoryEstimate e;  // one SimWorld at a time
  e.bytes = mul(static_cast<u64>(largest), kSimMetaBytesPerRank);
  e.driver = "--simulate-ranks: a SimWorld of " + std::to_string(largest) +
             " rank threads (at least " + format_bytes(kSimMetaBytesPerRank) +
             " each); lower --simulate-ranks below " + std::to_string(largest);
  return e;
}

void check_time(const TimeEstimate& e, double budget_s, const std::string& what) {
  if (budget_s <= 0 || e.seconds <= budget_s) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, "needs at least %.3g s on this machine's %u cores, more than ",
                e.seconds, std::max(1u, std::thread::hardware_concurrency()));
  char budget[64];
  std::snprintf(budget, sizeof budget, "%.3g s", budget_s);
  throw BadInput(what + ": " + buf + budget + " (--max-time; 0: no limit); " + e.driver);
}

void add_max_time_option(CLI::App& cmd, double& seconds) {
  // CLI11's NonNegativeNumber lets "nan" through (every comparison with NaN is false) and "inf"
  // would disable the limit unannounced: only a finite number of seconds is accepted.
  const CLI::Validator finite_seconds(
      [](std::string& v) {
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x) || x < 0)
          return "expected a finite number of seconds, at least 0 (0: no limit), got '" + v + "'";
        return std::string();
      },
      "SECONDS");
  cmd.add_option("--max-time", seconds,
                 "Refuse a run whose time estimate (a lower bound, at an optimistic CPU speed) "
                 "exceeds this many seconds (0: no limit)")
      ->check(finite_seconds)
      ->capture_default_str();
}

std::string format_bytes(std::uint64_t bytes) {
  if (bytes == kMax) return "more than 16 EiB";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace shardcheck::harness
