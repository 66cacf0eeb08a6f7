// `shardcheck compare ORACLE_DUMP RUN_DUMP [--report DIR] [--junit FILE] [--rtol X]`: judges a
// run's tensor dump against an oracle's step by step (compare.hpp: bounds from the oracle's noise
// probe when it has one, else by dtype), prints one line per step with its failing tensors, writes
// report.json, index.html and JUnit, and maps the verdict to exit codes (0 every tensor within
// tolerance, 1 some tensor out of it, 2 dumps that cannot be compared or a bad argument, 3 an
// output that could not be written).
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/compare.hpp"
#include "harness/output.hpp"

namespace shardcheck::harness {

namespace {

struct CompareArgs {
  std::string oracle;
  std::string run;
  std::string report;
  std::string junit;
  double rtol = 0;
  const CLI::Option* rtol_option = nullptr;
};

int compare_cmd(const CompareArgs& a) {
  std::optional<double> rtol;
  if (a.rtol_option && a.rtol_option->count() > 0) {
    if (!std::isfinite(a.rtol) || !(a.rtol > 0))
      throw BadInput("--rtol: expected a finite number > 0, got " + std::to_string(a.rtol));
    rtol = a.rtol;
  }
  // The report directory is made and checked now, so a typo fails before the dumps are read.
  std::optional<files::Dir> report;
  const std::vector<std::string> inputs{(std::filesystem::path(a.oracle) / "index.json").string(),
                                        (std::filesystem::path(a.run) / "index.json").string()};
  if (!a.report.empty()) {
    report.emplace(open_output_dir("--report", a.report));
    const std::vector<std::filesystem::path> outs{"report.json", "index.html"};
    check_output_files(*report, outs, inputs, "--report");
  }
  refuse_output_over_input(a.junit, inputs, "--junit");
  const CompareResult r = compare_dumps(a.oracle, a.run, rtol);
  print_compare(std::cout, r);
  std::cout << std::flush;
  if (report) {
    write_output_in(*report, "report.json", compare_report_json(r).dump() + "\n", "--report");
    write_output_in(*report, "index.html", compare_html(r), "--report");
  }
  if (!a.junit.empty()) write_output(a.junit, compare_junit(r), "--junit");
  return r.failed() == 0 ? kExitOk : kExitCheckFailed;
}

}  // namespace

void add_compare_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<CompareArgs>();
  auto* cmd = app.add_subcommand(
      "compare",
      "Judge a run's tensor dump (--dump-tensors) against an oracle's, step by step: every "
      "step<N>/ tensor, and init/ tensors both dumps hold");
  cmd->add_option("oracle", args->oracle, "The oracle's dump directory (with index.json)")
      ->required();
  cmd->add_option("run", args->run, "The run's dump directory (with index.json)")->required();
  cmd->add_option("--report", args->report, "Write report.json and index.html into this directory");
  cmd->add_option("--junit", args->junit, "Write JUnit XML (one testcase per step)");
  args->rtol_option = cmd->add_option("--rtol", args->rtol,
                                      "Tolerance on max_rel_err for every tensor (default: 100 x "
                                      "the noise probe's error when ORACLE_DUMP/noise holds one, "
                                      "as `run --dump-tensors` writes; else by the run's dtype: "
                                      "float64 1e-9, float32 1e-4, float16 1e-2, integers 0)")
                          ->check(CLI::PositiveNumber);
  cmd->callback([args, &exit_code] { exit_code = compare_cmd(*args); });
}

}  // namespace shardcheck::harness
