// Memory and time estimates and the budget checks (budget.hpp).
#include "harness/budget.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
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

TimeEstimate estimate_bench_time(int ranks, std::uint64_t min_bytes, std::uint64_t max_bytes,
                                 int warmup, int iters) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  double seconds = 0;
  int sizes = 0;
  for (double b = static_cast<double>(std::max<u64>(min_bytes, 1));
       b <= static_cast<double>(max_bytes); b *= 2, ++sizes) {
    const double per_iter = static_cast<double>(ranks) * b / (kOptimisticBytesPerCore * cores);
    seconds += per_iter * (warmup + std::max(iters, 1)) + (iters == 0 ? 0.2 : 0.0);
  }
  TimeEstimate e;
  e.seconds = seconds;
  e.driver = "--iters " + std::to_string(iters) + ", --warmup " + std::to_string(warmup) +
             " over " + std::to_string(sizes) + " sizes up to " + format_bytes(max_bytes) + " on " +
             std::to_string(ranks) + " ranks";
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
  cmd.add_option("--max-time", seconds,
                 "Refuse a run whose time estimate (a lower bound, at an optimistic CPU speed) "
                 "exceeds this many seconds (0: no limit)")
      ->check(CLI::NonNegativeNumber)
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
