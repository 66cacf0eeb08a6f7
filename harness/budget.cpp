// Memory estimates and the budget check (budget.hpp).
#include "harness/budget.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "harness/cli_commands.hpp"
#include "harness/driver.hpp"
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
