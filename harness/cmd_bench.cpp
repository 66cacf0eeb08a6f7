// `shardcheck bench collectives`: argument checks and the table/JSON output around
// bench_collectives.hpp (nccl-tests conventions).
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "harness/backend.hpp"
#include "harness/bench_collectives.hpp"
#include "harness/budget.hpp"
#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/output.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

namespace {

struct BenchArgs {
  std::string backend = "sim";
  int ranks = 8;
  bool ranks_given = false;  // --ranks on the command line (nccl: otherwise every GPU / process)
  std::string op = "all_reduce";
  std::string dtype = "f32";
  std::string redop = "sum";
  std::uint64_t min_bytes = 4096;
  std::uint64_t max_bytes = std::uint64_t{64} << 20;
  std::uint64_t max_memory = 0;  // 0: the machine's
  double max_time = kDefaultMaxTimeSeconds;
  int warmup = 2;
  int iters = 0;
  std::string json;
};

nlohmann::json to_json(const BenchResult& r) {
  auto cell = [](const BenchCell& c) {
    return nlohmann::json{{"time_us", c.time_us},
                          {"algbw_gbps", c.algbw_gbps},
                          {"busbw_gbps", c.busbw_gbps},
                          {"wrong", c.wrong}};
  };
  nlohmann::json rows = nlohmann::json::array();
  const bool reduces = comm::info(r.options.op).reduces;
  for (const auto& row : r.rows)
    rows.push_back({{"bytes", row.bytes},
                    {"count", row.count},
                    {"type", std::string(comm::name_of(r.options.dtype))},
                    {"redop", reduces ? std::string(comm::name_of(r.options.redop)) : "none"},
                    {"out_of_place", cell(row.out_of_place)},
                    {"in_place", cell(row.in_place)}});
  return {{"backend", r.backend},
          {"ranks", r.ranks},
          {"op", std::string(name_of(r.options.op))},
          {"dtype", std::string(comm::name_of(r.options.dtype))},
          {"busbw_factor", bus_factor(r.options.op, r.ranks)},
          {"wrong", r.total_wrong()},
          {"rows", rows}};
}

int bench_collectives_cmd(const BenchArgs& a) {
  BenchOptions o;
  if (!parse_bench_op(a.op, o.op))
    throw BadInput("--op: unknown collective '" + a.op +
                   "'; expected all_reduce, all_gather, reduce_scatter, all_to_all or broadcast");
  const auto dt = comm::parse_dtype(a.dtype);
  if (!dt)
    throw BadInput("--dtype: unknown dtype '" + a.dtype +
                   "'; expected f64, f32, bf16, f16, i32, i64 or u8");
  o.dtype = *dt;
  bool found = false;
  for (auto r : {comm::ReduceOp::sum, comm::ReduceOp::avg, comm::ReduceOp::max, comm::ReduceOp::min,
                 comm::ReduceOp::prod})
    if (comm::name_of(r) == a.redop) {
      o.redop = r;
      found = true;
    }
  if (!found)
    throw BadInput("--redop: unknown reduction '" + a.redop +
                   "'; expected sum, avg, max, min or prod");
  if (a.min_bytes == 0 || a.min_bytes > a.max_bytes)
    throw BadInput("--min-bytes must be positive and at most --max-bytes (got " +
                   std::to_string(a.min_bytes) + " and " + std::to_string(a.max_bytes) + ")");
  o.min_bytes = a.min_bytes;
  o.max_bytes = a.max_bytes;
  o.warmup = a.warmup;
  o.iters = a.iters;

  check_backend(a.backend);
  int ranks = a.ranks;
  bool lead = true;  // under mpirun only world rank 0 prints and writes
  RankRunner runner;
  std::optional<sim::SimWorld> world;
  if (a.backend == "nccl") {
    if (const std::string why = nccl_unavailable(); !why.empty())
      throw BadInput("--backend nccl: " + why);
    const NcclPlace place = nccl_place();
    lead = place.rank == 0;
    if (!a.ranks_given) ranks = place.capacity;
    if (place.mpi && ranks != place.capacity)
      throw BadInput("--ranks " + std::to_string(ranks) + " but mpirun started " +
                     std::to_string(place.capacity) +
                     " processes (one rank per process; leave --ranks out)");
    if (ranks > place.capacity)
      throw BadInput("--ranks " + std::to_string(ranks) + " but only " +
                     std::to_string(place.capacity) + " CUDA devices are visible");
    runner = [ranks](const std::function<void(comm::Communicator&)>& fn) { run_nccl(ranks, fn); };
  } else {
    check_memory(estimate_bench(ranks, a.max_bytes), memory_budget(a.max_memory),
                 "bench collectives");
    std::vector<std::uint64_t> sizes;
    for (const std::size_t count : bench_counts(o, ranks))
      sizes.push_back(count * comm::size_of(o.dtype));
    check_time(estimate_bench_time(ranks, sizes, a.warmup, a.iters), a.max_time,
               "bench collectives");
    world.emplace(ranks);
    runner = [&world](const std::function<void(comm::Communicator&)>& fn) { world->run(fn); };
  }
  if (bench_counts(o, ranks).empty()) {
    const bool split = comm::splits_by_rank(o.op);
    const std::string need =
        split ? std::to_string(ranks) + " elements of " + std::to_string(comm::size_of(o.dtype)) +
                    " bytes (" + std::string(name_of(o.op)) + " splits the buffer over the " +
                    std::to_string(ranks) + " ranks)"
              : "one element of " + std::to_string(comm::size_of(o.dtype)) + " bytes";
    throw BadInput("--min-bytes " + std::to_string(a.min_bytes) + " to --max-bytes " +
                   std::to_string(a.max_bytes) + ": no size in the range (doubling from " +
                   "--min-bytes) holds " + need + " of --dtype " + a.dtype +
                   ", so no row would run; raise --max-bytes");
  }
  std::ostream silent(nullptr);
  std::ostream& out = lead ? std::cout : silent;
  // Rows print as each size completes, so a long run shows its progress.
  o.on_row = [&o, &out](const BenchRow& row) { print_row(out, o, row); };
  print_header(out, a.backend, ranks, o);
  const BenchResult r = bench_collectives(runner, a.backend, ranks, o);
  print_footer(out, r);
  if (lead && !a.json.empty()) {
    write_output(a.json, to_json(r).dump(2) + "\n", "--json");
  }
  return r.total_wrong() == 0 ? kExitOk : kExitCheckFailed;
}

}  // namespace

void add_bench_commands(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  BenchArgs& ba = *args;
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto* coll = bench->add_subcommand("collectives",
                                     "nccl-tests-style collective benchmark with a #wrong check");
  coll->add_option("--backend", ba.backend, "sim (CPU threads) or nccl (GPUs)")
      ->check(CLI::IsMember({"sim", "nccl"}))
      ->capture_default_str();
  coll->add_option("--ranks", ba.ranks,
                   "Number of ranks (sim; nccl: GPUs of this process, default all, or leave out "
                   "under mpirun)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  coll->add_option("--op", ba.op, "all_reduce, all_gather, reduce_scatter, all_to_all or broadcast")
      ->capture_default_str();
  coll->add_option("--dtype", ba.dtype, "f64, f32, bf16, f16, i32, i64 or u8")
      ->capture_default_str();
  coll->add_option("--redop", ba.redop, "sum, avg, max, min or prod (reducing ops)")
      ->capture_default_str();
  add_size_option(*coll, "--min-bytes,-b", ba.min_bytes, "Smallest size (e.g. 4096, 4KB, 1MB)")
      ->capture_default_str();
  add_size_option(*coll, "--max-bytes,-e", ba.max_bytes,
                  "Largest size; sizes double from min to max")
      ->capture_default_str();
  add_max_memory_option(*coll, ba.max_memory);
  add_max_time_option(*coll, ba.max_time);
  coll->add_option("--warmup", ba.warmup, "Warm-up iterations per size")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  coll->add_option("--iters", ba.iters,
                   "Timed iterations per size (0: about 0.2 s per size); on the simulator each "
                   "collective costs a fixed time that grows with --ranks (about 12 ms at 512 "
                   "ranks on 2 cores), counted by --max-time's estimate")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  coll->add_option("--json", ba.json, "Also write the results as JSON to this file");

  coll->callback([args, coll, &exit_code] {
    args->ranks_given = coll->count("--ranks") > 0;
    exit_code = bench_collectives_cmd(*args);
  });
}

}  // namespace shardcheck::harness
