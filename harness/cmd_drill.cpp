// `shardcheck drill checkpoint SCENARIO.json [--report DIR] [--junit FILE] [--keep-dir DIR]`: runs
// the scenario's checkpoint drills (drill.hpp), prints one line per drill, writes report.json,
// index.html and JUnit, and maps the verdicts to exit codes (0 all pass, 1 a drill failed, 2 bad
// input, 3 a drill broke).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "checkpoint/errors.hpp"
#include "checkpoint/lock.hpp"
#include "harness/budget.hpp"
#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/drill.hpp"
#include "harness/html.hpp"
#include "harness/output.hpp"
#include "harness/provenance.hpp"
#include "harness/report.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {

namespace {

namespace fs = std::filesystem;

struct DrillArgs {
  std::string scenario;
  std::string report;
  std::string junit;
  std::string keep_dir;
  std::uint64_t max_memory = 0;  // 0: the machine's
  double max_time = kDefaultMaxTimeSeconds;
};

// The drills' work directory (--keep-dir): created now, and empty. The drills write step-N
// directories of their own and damage some of them: never mix them with checkpoints already there.
files::Dir keep_dir(const std::string& dir) {
  files::Dir d = open_output_dir("--keep-dir", dir);
  bool empty = false;
  try {
    empty = d.list().empty();
  } catch (const files::Error& e) {
    throw BadInput("--keep-dir: " + std::string(e.what()));
  }
  if (!empty)
    throw BadInput("--keep-dir: '" + dir + "' is not empty; give a new or empty directory");
  return d;
}

int drill_cmd(const DrillArgs& a) {
  Scenario s;
  try {
    s = load_scenario(a.scenario);
    // Refuses an undrillable scenario before anything runs; each drill trains at least once.
    const auto drills = drills_to_run(s);
    check_memory(estimate_run(s), memory_budget(a.max_memory), s.name);
    check_time(estimate_run_time(s, static_cast<int>(drills.size())), a.max_time, s.name);
  } catch (const ScenarioError& e) {
    throw BadInput(e.what());
  }
  std::optional<files::Dir> report;
  const std::vector<std::string> inputs{a.scenario};
  if (!a.report.empty()) {
    report.emplace(open_output_dir("--report", a.report));
    const std::vector<fs::path> outs{"report.json", "index.html"};
    check_output_files(*report, outs, inputs, "--report");
  }
  refuse_output_over_input(a.junit, inputs, "--junit");
  std::optional<checkpoint::DirLock> lock;  // two drills racing into one empty --keep-dir
  if (!a.keep_dir.empty()) {
    try {
      lock.emplace(keep_dir(a.keep_dir));
    } catch (const checkpoint::CheckpointError& e) {
      throw BadInput("--keep-dir: " + e.detail());
    }
  }
  DrillReport r;
  try {
    r = run_drills(s, {.work_dir = a.keep_dir});
  } catch (const ScenarioError& e) {
    throw BadInput(a.scenario + ": " + e.what());
  }
  print_drill_table(std::cout, r);
  std::cout << std::flush;
  if (report) {
    const nlohmann::json j = drill_report_json(r, new_run_id());
    write_output_in(*report, "report.json", j.dump(2) + "\n", "--report");
    write_output_in(*report, "index.html", render_html(j), "--report");
  }
  if (!a.junit.empty()) write_drill_junit(r, a.junit);
  if (r.broke()) {
    std::cerr << "shardcheck: the run broke: a drill stopped on an unexpected error (see above)\n";
    return kExitRunBroke;
  }
  return r.pass() ? kExitOk : kExitCheckFailed;
}

}  // namespace

nlohmann::json drill_report_json(const DrillReport& r, const std::string& run_id) {
  const Scenario& s = r.scenario;
  nlohmann::json drills = nlohmann::json::array();
  for (const DrillResult& d : r.drills)
    drills.push_back({{"name", d.name},
                      {"pass", d.pass},
                      {"detail", d.detail},
                      {"broke", d.broke},
                      {"wall_seconds", d.wall_seconds}});
  return {{"pass", r.pass()},
          {"broke", r.broke()},
          {"command", "drill checkpoint"},
          {"scenario", s.name},
          {"description", s.description},
          {"backend", "sim"},
          {"world_size", s.parallel.mesh.world_size()},
          {"config", r.config},
          {"restore_config",
           r.restore_config.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.restore_config)},
          {"checkpoint",
           {{"save_step", r.save_step}, {"steps", r.steps}, {"every", s.checkpoint.every}}},
          {"work_dir",
           r.work_dir.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.work_dir.string())},
          {"manifest", manifest_json(s, run_id)},
          {"goodput", goodput_json(r.goodput)},
          {"drills", drills}};
}

void write_drill_junit(const DrillReport& r, const std::string& file) {
  std::ostringstream f;
  std::size_t failures = 0;
  double total = 0;
  for (const DrillResult& d : r.drills) {
    failures += !d.pass;
    total += d.wall_seconds;
  }
  f << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<testsuites tests=\"" << r.drills.size() << "\" failures=\"" << failures << "\">\n"
    << "  <testsuite name=\"drill." << xml_escape(r.scenario.name) << "\" tests=\""
    << r.drills.size() << "\" failures=\"" << failures << "\" time=\"" << total << "\">\n";
  for (const DrillResult& d : r.drills) {
    f << "    <testcase classname=\"drill." << xml_escape(r.scenario.name) << "\" name=\""
      << xml_escape(d.name) << "\" time=\"" << d.wall_seconds << "\">";
    if (!d.pass)
      f << "<failure message=\"" << xml_escape(d.broke ? "broke" : "not fail-closed or not exact")
        << "\">" << xml_escape(d.detail) << "</failure>";
    else
      f << "<system-out>" << xml_escape(d.detail) << "</system-out>";
    f << "</testcase>\n";
  }
  f << "  </testsuite>\n</testsuites>\n";
  write_output(file, f.str(), "--junit");
}

void print_drill_table(std::ostream& os, const DrillReport& r) {
  os << "# drill checkpoint " << r.scenario.name << ": " << r.config << " saves step-"
     << r.save_step << " of " << r.steps << " steps"
     << (r.restore_config.empty() ? "" : "; resharded restore into " + r.restore_config) << "\n";
  if (!r.work_dir.empty()) os << "# checkpoints kept in " << r.work_dir.string() << "\n";
  char line[128];
  std::snprintf(line, sizeof line, "  %-22s %-6s %s\n", "drill", "result", "detail");
  os << line;
  std::size_t failed = 0;
  for (const DrillResult& d : r.drills) {
    failed += !d.pass;
    std::snprintf(line, sizeof line, "  %-22s %-6s ", d.name.c_str(),
                  d.pass    ? "pass"
                  : d.broke ? "BROKE"
                            : "FAIL");
    os << line << d.detail << "\n";
  }
  os << "drills: " << r.drills.size() - failed << " passed, " << failed << " failed\n";
}

void add_drill_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<DrillArgs>();
  auto* drill = app.add_subcommand("drill", "Fault drills");
  drill->require_subcommand(1);
  auto* ckpt = drill->add_subcommand(
      "checkpoint",
      "Checkpoint drills: good checkpoints restore exactly (same and other mesh), damaged ones "
      "are refused naming the shard");
  ckpt->add_option("scenario", args->scenario, "Scenario JSON file (with a drills list)")
      ->required();
  ckpt->add_option("--report", args->report,
                   "Write report.json and index.html into this directory");
  ckpt->add_option("--junit", args->junit, "Write JUnit XML (one testcase per drill)");
  ckpt->add_option("--keep-dir", args->keep_dir,
                   "Keep the drills' checkpoints in this new or empty directory (default: a "
                   "temporary directory, removed)");
  add_max_memory_option(*ckpt, args->max_memory);
  add_max_time_option(*ckpt, args->max_time);
  ckpt->callback([args, &exit_code] { exit_code = drill_cmd(*args); });
}

}  // namespace shardcheck::harness
