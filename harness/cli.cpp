// Command-line frame: subcommands, option parsing, backend selection and the mapping of outcomes
// to exit codes. Each command's work lives in its own module; this file only wires them.
#include "harness/cli.hpp"

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "harness/bench_collectives.hpp"
#include "harness/report.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

namespace {

struct BenchArgs {
  std::string backend = "sim";
  int ranks = 8;
  std::string op = "all_reduce";
  std::string dtype = "f32";
  std::string redop = "sum";
  std::size_t min_bytes = 4096;
  std::size_t max_bytes = std::size_t{64} << 20;
  int warmup = 2;
  int iters = 0;
  std::string json;
};

class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nlohmann::json to_json(const BenchResult& r) {
  auto cell = [](const BenchCell& c) {
    return nlohmann::json{{"time_us", c.time_us},
                          {"algbw_gbps", c.algbw_gbps},
                          {"busbw_gbps", c.busbw_gbps},
                          {"wrong", c.wrong}};
  };
  nlohmann::json rows = nlohmann::json::array();
  const bool reduces =
      r.options.op == BenchOp::all_reduce || r.options.op == BenchOp::reduce_scatter;
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

  if (a.backend == "nccl")
    throw BadInput(
        "--backend nccl: this shardcheck was built without the gpu/ backend (configure with the "
        "'cuda' preset on a machine with CUDA and NCCL)");
  sim::SimWorld world(a.ranks);
  const RankRunner runner = [&world](const std::function<void(comm::Communicator&)>& fn) {
    world.run(fn);
  };
  // Rows print as each size completes, so a long run shows its progress.
  o.on_row = [&o](const BenchRow& row) { print_row(std::cout, o, row); };
  print_header(std::cout, "sim", a.ranks, o);
  const BenchResult r = bench_collectives(runner, "sim", a.ranks, o);
  print_footer(std::cout, r);
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) throw BadInput("--json: cannot write '" + a.json + "'");
    f << to_json(r).dump(2) << "\n";
  }
  return r.total_wrong() == 0 ? kExitOk : kExitCheckFailed;
}

struct RunArgs {
  std::string backend = "sim";
  std::vector<std::string> paths;
  std::string report;
  std::string junit;
};

void check_backend(const std::string& backend) {
  if (backend == "nccl")
    throw BadInput(
        "--backend nccl: this shardcheck was built without the gpu/ backend (configure "
        "with the 'cuda' preset on a machine with CUDA and NCCL)");
}

void write_report(const std::string& dir, const nlohmann::json& j) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream f(std::filesystem::path(dir) / "report.json");
  if (ec || !f) throw BadInput("--report: cannot write into '" + dir + "'");
  f << j.dump(2) << "\n";
}

// Scenario files named on the command line: files as given, directories searched for *.json.
std::vector<std::string> scenario_files(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (const auto& e : std::filesystem::recursive_directory_iterator(p))
        if (e.path().extension() == ".json") found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      if (found.empty()) throw BadInput("'" + p + "' holds no .json scenario");
      files.insert(files.end(), found.begin(), found.end());
    } else if (std::filesystem::exists(p, ec)) {
      files.push_back(p);
    } else {
      throw BadInput("no such scenario file or directory: '" + p + "'");
    }
  }
  return files;
}

int run_scenarios(const RunArgs& a) {
  check_backend(a.backend);
  const std::vector<std::string> files = scenario_files(a.paths);
  std::vector<Scenario> scenarios;
  for (const auto& f : files) {
    try {
      scenarios.push_back(load_scenario(f));
    } catch (const ScenarioError& e) {
      throw BadInput(e.what());
    }
  }
  std::vector<RunResult> runs;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& sc : scenarios) {
    try {
      runs.push_back(run_scenario(sc));
    } catch (const ScenarioError& e) {
      throw BadInput(sc.name + ": " + e.what());
    }
    print_summary(std::cout, runs.back());
    std::cout << std::flush;
    all.push_back(report_json(runs.back(), a.backend));
  }
  bool pass = true;
  for (const auto& r : runs) pass = pass && r.pass();
  if (!a.report.empty())
    write_report(a.report,
                 runs.size() == 1 ? all[0] : nlohmann::json{{"pass", pass}, {"scenarios", all}});
  if (!a.junit.empty()) write_junit(runs, a.junit);
  std::size_t configs = 0, failed = 0;
  for (const auto& r : runs)
    for (const auto& c : r.configs) {
      ++configs;
      failed += !c.pass;
    }
  std::cout << "parity: " << configs - failed << " passed, " << failed << " failed\n";
  return pass ? kExitOk : kExitCheckFailed;
}

}  // namespace

int run_cli(int argc, char** argv) {
  CLI::App app{
      "shardcheck: deterministic multi-rank simulator and parity harness for distributed training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardcheck 0.1.0");

  RunArgs ra;
  auto* run = app.add_subcommand(
      "run", "Check one scenario's configurations for parity with the reference");
  run->add_option("scenario", ra.paths, "Scenario JSON file")->required()->expected(1);
  run->add_option("--backend", ra.backend, "sim (CPU threads) or nccl (GPUs)")
      ->check(CLI::IsMember({"sim", "nccl"}))
      ->capture_default_str();
  run->add_option("--report", ra.report, "Write report.json into this directory");
  RunArgs ma;
  ma.paths = {"scenarios/parity"};
  auto* matrix =
      app.add_subcommand("matrix", "Run every scenario in the given files or directories");
  matrix->add_option("scenarios", ma.paths, "Scenario files or directories")->capture_default_str();
  matrix->add_option("--backend", ma.backend, "sim (CPU threads) or nccl (GPUs)")
      ->check(CLI::IsMember({"sim", "nccl"}))
      ->capture_default_str();
  matrix->add_option("--report", ma.report, "Write report.json into this directory");
  matrix->add_option("--junit", ma.junit, "Write JUnit XML (one testcase per configuration)");

  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  BenchArgs ba;
  auto* coll = bench->add_subcommand("collectives",
                                     "nccl-tests-style collective benchmark with a #wrong check");
  coll->add_option("--backend", ba.backend, "sim (CPU threads) or nccl (GPUs)")
      ->check(CLI::IsMember({"sim", "nccl"}))
      ->capture_default_str();
  coll->add_option("--ranks", ba.ranks, "Number of ranks (sim)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  coll->add_option("--op", ba.op, "all_reduce, all_gather, reduce_scatter, all_to_all or broadcast")
      ->capture_default_str();
  coll->add_option("--dtype", ba.dtype, "f64, f32, bf16, f16, i32, i64 or u8")
      ->capture_default_str();
  coll->add_option("--redop", ba.redop, "sum, avg, max, min or prod (reducing ops)")
      ->capture_default_str();
  coll->add_option("--min-bytes,-b", ba.min_bytes, "Smallest size (e.g. 4096, 4KB, 1MB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  coll->add_option("--max-bytes,-e", ba.max_bytes, "Largest size; sizes double from min to max")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  coll->add_option("--warmup", ba.warmup, "Warm-up iterations per size")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  coll->add_option("--iters", ba.iters, "Timed iterations per size (0: about 0.2 s per size)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  coll->add_option("--json", ba.json, "Also write the results as JSON to this file");

  if (argc > 1 && argv[1][0] != '-' && std::string_view(argv[1]) != "bench" &&
      std::string_view(argv[1]) != "run" && std::string_view(argv[1]) != "matrix") {
    std::cerr << "shardcheck: error: unknown command '" << argv[1]
              << "'; expected one of: run, matrix, bench\n";
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  try {
    if (coll->parsed()) return bench_collectives_cmd(ba);
    if (run->parsed()) return run_scenarios(ra);
    if (matrix->parsed()) return run_scenarios(ma);
  } catch (const BadInput& e) {
    std::cerr << "shardcheck: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "shardcheck: the run broke: " << e.what() << "\n";
    return kExitRunBroke;
  }
  return kExitBadInput;
}

}  // namespace shardcheck::harness
