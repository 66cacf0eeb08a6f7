// `shardcheck run` and `shardcheck matrix`: load and validate scenarios, run each configuration
// against the reference, print the summary, write report.json / JUnit, map outcomes to exit codes.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/errors.hpp"
#include "checkpoint/lock.hpp"
#include "comm/text.hpp"
#include "harness/backend.hpp"
#include "harness/budget.hpp"
#include "harness/checkpointing.hpp"
#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/html.hpp"
#include "harness/output.hpp"
#include "harness/provenance.hpp"
#include "harness/report.hpp"
#include "harness/runner.hpp"
#include "harness/scenario.hpp"
#include "harness/trace.hpp"

namespace shardcheck::harness {

namespace {

struct RunArgs {
  std::string backend = "sim";
  std::string compute;  // cpu | cuda; "" = the backend's default (sim: cpu, nccl: cuda)
  std::vector<std::string> paths;
  std::string report;
  std::string junit;
  std::string dump_tensors;
  std::string checkpoint_dir;
  std::string resume;
  std::uint64_t max_memory = 0;  // 0: the machine's
  double max_time = kDefaultMaxTimeSeconds;
  bool quiet = false;  // leave out the rank -> group tables printed at start
};

// Progress goes to stderr only when it is a terminal, so logs and pipes stay clean.
RunOptions::Progress progress_reporter(const std::string& scenario) {
  if (isatty(STDERR_FILENO) == 0) return {};
  return [scenario](const std::string& what, int index, int total) {
    if (index == 0)
      std::cerr << "[" << scenario << "] reference run\n";
    else
      std::cerr << "[" << scenario << "] " << index << "/" << total << " " << what << "\n";
  };
}

void write_json(const files::Dir& dir, const char* file, const nlohmann::json& j) {
  write_output_in(dir, file, j.dump(2) + "\n", "--report");
}

// report.json and its human view, index.html (rendered from `view`: the report with each
// configuration's one-step timeline).
void write_report(const files::Dir& dir, const nlohmann::json& j, const nlohmann::json& view) {
  write_output_in(dir, "report.json", j.dump() + "\n", "--report");
  write_output_in(dir, "index.html", render_html(view), "--report");
}

// Each configuration's trace file under dir (trace.hpp), and `report` made into its HTML view:
// every parity row gets the one-step timeline the page draws.
nlohmann::json write_traces(const files::Dir& dir, const RunResult& r,
                            const nlohmann::json& report) {
  nlohmann::json view = report;
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    const ConfigResult& c = r.configs[i];
    if (c.timeline.empty()) continue;
    const std::string file = trace_file(r.scenario.name, i, c.config);
    write_output_in(dir, file,
                    chrome_trace(c, r.scenario.name, r.scenario.train.steps).dump() + "\n",
                    "--report");
    view["parity"][i]["timeline"] = step_timeline(c, file, r.scenario.train.steps);
  }
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    const StepPhases& ph = r.configs[i].phases;
    if (!ph.valid) continue;
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t rank = 0; rank < ph.per_rank.size() && rank < 64; ++rank) {
      nlohmann::json row = {{"rank", rank}};
      for (int p = 0; p < kPhases; ++p)
        row[phase_key(static_cast<Phase>(p))] = ph.per_rank[rank][static_cast<std::size_t>(p)];
      rows.push_back(row);
    }
    view["parity"][i]["phases_per_rank"] = rows;
  }
  return view;
}

// The run manifest, written before anything runs so that a run that breaks still leaves it: one
// scenario's, or {"scenarios": [...]} with every scenario's of a matrix.
void write_manifest(const files::Dir& dir, const std::vector<Scenario>& scenarios,
                    const std::string& run_id) {
  nlohmann::json all = nlohmann::json::array();
  for (const Scenario& s : scenarios) all.push_back(manifest_json(s, run_id));
  write_json(dir, "manifest.json",
             scenarios.size() == 1 ? all[0] : nlohmann::json{{"scenarios", all}});
}

// Scenario files named on the command line: files as given, directories searched for *.json.
std::vector<std::string> scenario_files(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      std::vector<std::string> found;
      try {
        for (const auto& e : std::filesystem::recursive_directory_iterator(p))
          if (e.path().extension() == ".json") found.push_back(e.path().string());
      } catch (const std::filesystem::filesystem_error& e) {
        throw BadInput("cannot read the scenario directory '" + p + "': '" + e.path1().string() +
                       "': " + e.code().message());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) throw BadInput("'" + p + "' holds no .json scenario");
      files.insert(files.end(), found.begin(), found.end());
    } else if (std::filesystem::exists(p, ec)) {
      files.push_back(p);
    } else {
      throw BadInput(ec ? "cannot read the scenario path '" + p + "': " + ec.message()
                        : "no such scenario file or directory: '" + p + "'");
    }
  }
  return files;
}

// --backend nccl runs the same training and parity check on GPUs; what only the simulator can do
// (inject faults, checksum payloads, save or resume checkpoints) is refused up front.
void check_nccl_run(const RunArgs& a, const std::vector<Scenario>& scenarios) {
  const std::string only_sim =
      " only the simulator offers; run it with --backend sim (the default)";
  if (!a.checkpoint_dir.empty() || !a.resume.empty())
    throw BadInput("--backend nccl: --checkpoint-dir and --resume are checkpoint drills," +
                   only_sim);
  for (const Scenario& s : scenarios) {
    if (!s.faults.empty())
      throw BadInput(s.name + ": --backend nccl: injected faults ($.faults, '" + s.faults[0].kind +
                     "') are" + only_sim);
    if (s.expect_fault)
      throw BadInput(s.name + ": --backend nccl: $.expect.fault (a fault to detect) is" + only_sim);
    if (s.health.payload_checksums)
      throw BadInput(s.name + ": --backend nccl: $.health.payload_checksums is" + only_sim);
  }
  if (const std::string why = nccl_unavailable(); !why.empty())
    throw BadInput("--backend nccl: " + why);
}

// Where the strategies' ranks compute (the reference run is always on the CPU): --compute, or
// by default the CPU on the simulator and the GPUs on the nccl backend.
ComputeChoice choose_compute(const RunArgs& a) {
  const std::string compute = !a.compute.empty() ? a.compute : a.backend == "nccl" ? "cuda" : "cpu";
  if (compute == "cpu") return {};
  if (const std::string why = cuda_compute_unavailable(); !why.empty())
    throw BadInput("--compute cuda" +
                   std::string(a.compute.empty() ? " (the default of --backend nccl)" : "") + ": " +
                   why);
  return {cuda_compute(a.backend == "nccl"), "cuda"};
}

// Every output of the run, checked before anything runs (output.hpp): the scenarios' files are
// distinct, no two scenarios share a trace directory (names that sanitise alike, "a/b" and
// "a_b"), no output is a symlink or an input, and each configuration's checkpoint directory
// below --checkpoint-dir is a real directory.
void check_outputs(const RunArgs& a, const std::vector<std::string>& files,
                   const std::vector<Scenario>& scenarios, const files::Dir* report,
                   const files::Dir* checkpoints) {
  for (std::size_t i = 0; i < files.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (std::error_code ec; std::filesystem::equivalent(files[i], files[j], ec))
        throw BadInput("the scenario file '" + files[i] + "' is given twice (also as '" + files[j] +
                       "'); each scenario runs once");
  std::map<std::string, std::size_t> trace_dirs;
  for (std::size_t i = 0; i < scenarios.size(); ++i) {
    const std::string dir =
        std::filesystem::path(trace_file(scenarios[i].name, 0, "x")).parent_path().string();
    const auto [at, fresh] = trace_dirs.emplace(dir, i);
    if (!fresh)
      throw BadInput("the scenarios '" + scenarios[at->second].name + "' (" + files[at->second] +
                     ") and '" + scenarios[i].name + "' (" + files[i] +
                     ") would write their traces to the same directory " + dir +
                     "; give them names that differ in letters, digits, '-' or '_'");
  }
  refuse_output_over_input(a.junit, files, "--junit");
  if (report != nullptr) {
    std::vector<std::filesystem::path> outs{"manifest.json", "report.json", "index.html"};
    for (const Scenario& s : scenarios)
      for (std::size_t i = 0; i < s.configs.size(); ++i)
        outs.emplace_back(trace_file(s.name, i, s.configs[i].label()));
    check_output_files(*report, outs, files, "--report");
  }
  if (checkpoints != nullptr)
    for (const Scenario& s : scenarios)
      for (const ParallelSpec& p : s.configs) {
        const std::filesystem::path d = config_checkpoint_dir(s, p, checkpoints->path());
        if (d == checkpoints->path()) continue;
        try {
          (void)checkpoints->sub(d.lexically_relative(checkpoints->path()), true);
        } catch (const files::Error& e) {
          throw BadInput("--checkpoint-dir: " + std::string(e.what()));
        }
      }
}

int run_scenarios(const RunArgs& a) {
  const std::vector<std::string> files = scenario_files(a.paths);
  std::vector<Scenario> scenarios;
  for (const auto& f : files) {
    try {
      scenarios.push_back(load_scenario(f));
    } catch (const ScenarioError& e) {
      throw BadInput(e.what());
    }
  }
  // Under mpirun (--backend nccl) every process runs and reaches the same verdict; rank 0 alone
  // prints and writes files.
  bool lead = true;
  if (a.backend == "nccl") {
    check_nccl_run(a, scenarios);
    lead = nccl_place().rank == 0;
  }
  // The simulator holds every rank in this process and computes on its CPUs: a scenario that
  // cannot fit, or cannot finish in --max-time, is refused now.
  if (a.backend == "sim")
    for (const Scenario& s : scenarios) {
      check_memory(estimate_run(s), memory_budget(a.max_memory), s.name);
      check_time(estimate_run_time(s), a.max_time, s.name);
    }
  const ComputeChoice compute = choose_compute(a);
  std::ostream silent(nullptr);
  std::ostream& out = lead ? std::cout : silent;
  std::vector<RunResult> runs;
  nlohmann::json all = nlohmann::json::array(), views = nlohmann::json::array();
  std::optional<files::Dir> report, checkpoints;
  if (lead && !a.report.empty()) report.emplace(open_output_dir("--report", a.report));
  if (lead && !a.dump_tensors.empty()) {
    const std::vector<std::filesystem::path> dumped{"index.json", "noise/index.json"};
    check_output_files(open_output_dir("--dump-tensors", a.dump_tensors), dumped, files,
                       "--dump-tensors");
  }
  if (!a.checkpoint_dir.empty())
    checkpoints.emplace(open_output_dir("--checkpoint-dir", a.checkpoint_dir));
  check_outputs(a, files, scenarios, report ? &*report : nullptr,
                checkpoints ? &*checkpoints : nullptr);
  const std::string run_id = new_run_id();
  if (report) write_manifest(*report, scenarios, run_id);
  // The rank -> group table of every configuration, logged before anything runs (a reader of the
  // log need not work it out from the configuration).
  if (!a.quiet)
    for (const Scenario& s : scenarios)
      for (const ParallelSpec& p : s.configs)
        out << "# groups " << comm::printable(s.name) << " " << groups_line(p) << "\n";
  // One writer per checkpoint directory, for the whole run: a second run is refused at once.
  std::optional<checkpoint::DirLock> lock;
  if (checkpoints) {
    try {
      lock.emplace(*checkpoints);
    } catch (const checkpoint::CheckpointError& e) {
      throw BadInput("--checkpoint-dir: " + e.detail());
    }
  }
  if (!a.resume.empty() && !std::filesystem::is_directory(a.resume))
    throw BadInput("--resume: no such directory '" + a.resume + "'");
  for (const auto& sc : scenarios) {
    RunOptions o;
    o.backend = a.backend;
    o.compute = compute;
    if (lead) o.dump_tensors = a.dump_tensors;
    o.checkpoint_dir = a.checkpoint_dir;
    o.resume_dir = a.resume;
    if (!a.checkpoint_dir.empty() && sc.checkpoint.every == 0)
      throw BadInput(sc.name +
                     ": --checkpoint-dir needs $.checkpoint.every > 0 in the scenario "
                     "(how often to save), got 0");
    if (lead) o.progress = progress_reporter(sc.name);
    try {
      runs.push_back(run_scenario(sc, o));
    } catch (const ScenarioError& e) {
      throw BadInput(sc.name + ": " + e.what());
    } catch (const checkpoint::CheckpointError& e) {
      if (e.reason() != checkpoint::Reason::locked) throw;
      throw BadInput("--checkpoint-dir: " + e.detail());
    }
    print_summary(out, runs.back());
    out << std::flush;
    all.push_back(report_json(runs.back(), a.backend, run_id));
    if (report) views.push_back(write_traces(*report, runs.back(), all.back()));
  }
  bool pass = true;
  for (const auto& r : runs) pass = pass && r.pass();
  if (report)
    write_report(
        *report, runs.size() == 1 ? all[0] : nlohmann::json{{"pass", pass}, {"scenarios", all}},
        runs.size() == 1 ? views[0] : nlohmann::json{{"pass", pass}, {"scenarios", views}});
  if (lead && !a.junit.empty()) write_junit(runs, a.junit);
  std::size_t configs = 0, failed = 0;
  for (const auto& r : runs)
    for (const auto& c : r.configs) {
      ++configs;
      failed += !c.pass;
    }
  out << "parity: " << configs - failed << " passed, " << failed << " failed\n";
  bool broke = false;
  for (const auto& r : runs) broke = broke || r.broke();
  if (broke) {
    if (lead)
      std::cerr << "shardcheck: the run broke: an unexpected fault was diagnosed (see above)\n";
    return kExitRunBroke;
  }
  return pass ? kExitOk : kExitCheckFailed;
}

}  // namespace

void check_backend(const std::string& backend) {
  if (backend == "nccl" && !nccl_built()) throw BadInput("--backend nccl: " + nccl_unavailable());
}

namespace {
constexpr const char* kQuietHelp =
    "Leave out the rank -> group table of each configuration printed at start";
constexpr const char* kComputeHelp =
    "Where the strategies' ranks compute the model's ops: cpu or cuda (GPUs; default: cpu with "
    "--backend sim, cuda with --backend nccl). The reference run is always on the CPU";
}  // namespace

void add_run_commands(CLI::App& app, int& exit_code) {
  auto ra_ptr = std::make_shared<RunArgs>();
  auto ma_ptr = std::make_shared<RunArgs>();
  RunArgs& ra = *ra_ptr;
  RunArgs& ma = *ma_ptr;
  auto* run = app.add_subcommand(
      "run", "Check one scenario's configurations for parity with the reference");
  run->add_option("scenario", ra.paths, "Scenario JSON file")->required()->expected(1);
  run->add_option("--backend", ra.backend, "sim (CPU threads) or nccl (GPUs)")
      ->check(CLI::IsMember({"sim", "nccl"}))
      ->capture_default_str();
  run->add_option("--compute", ra.compute, kComputeHelp)->check(CLI::IsMember({"cpu", "cuda"}));
  run->add_option("--report", ra.report,
                  "Write manifest.json (at start) and report.json into this directory");
  run->add_option("--junit", ra.junit, "Write JUnit XML (one testcase per configuration)");
  run->add_option("--dump-tensors", ra.dump_tensors,
                  "Write the reference run's tensors (.npy + index.json) into this directory, "
                  "and its noise probe's into DIR/noise (the bounds of `compare`)");
  run->add_option("--checkpoint-dir", ra.checkpoint_dir,
                  "Save a sharded checkpoint every checkpoint.every steps into this directory");
  run->add_option("--resume", ra.resume,
                  "Resume from the newest committed checkpoint in this directory (validated "
                  "first; the scenario may give another mesh)");
  add_max_memory_option(*run, ra.max_memory);
  add_max_time_option(*run, ra.max_time);
  run->add_flag("--quiet", ra.quiet, kQuietHelp);
  ma.paths = {"scenarios/parity"};
  auto* matrix =
      app.add_subcommand("matrix", "Run every scenario in the given files or directories");
  matrix->add_option("scenarios", ma.paths, "Scenario files or directories")->capture_default_str();
  matrix->add_option("--backend", ma.backend, "sim (CPU threads) or nccl (GPUs)")
      ->check(CLI::IsMember({"sim", "nccl"}))
      ->capture_default_str();
  matrix->add_option("--compute", ma.compute, kComputeHelp)->check(CLI::IsMember({"cpu", "cuda"}));
  matrix->add_option("--report", ma.report,
                     "Write manifest.json (at start) and report.json into this directory");
  matrix->add_option("--junit", ma.junit, "Write JUnit XML (one testcase per configuration)");
  add_max_memory_option(*matrix, ma.max_memory);
  add_max_time_option(*matrix, ma.max_time);
  matrix->add_flag("--quiet", ma.quiet, kQuietHelp);

  run->callback([ra_ptr, &exit_code] { exit_code = run_scenarios(*ra_ptr); });
  matrix->callback([ma_ptr, &exit_code] { exit_code = run_scenarios(*ma_ptr); });
}

}  // namespace shardcheck::harness
