// Command-line frame: the app, the commands each module registers, and the mapping of outcomes
// to exit codes. Each command's work lives in its own file (cmd_*.cpp); this file only wires them.
#include "harness/cli.hpp"

#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <set>
#include <string>
#include <string_view>

#include "harness/build_info.hpp"
#include "harness/cli_commands.hpp"
#include "harness/output.hpp"

namespace shardcheck::harness {

void refuse_empty_paths(CLI::App& app) {
  // Options naming an output or input file or directory, by long name (a flag of the same name,
  // e.g. plan's --json, takes no value and is left alone), and the commands' positional inputs.
  static const std::set<std::string> kPaths = {
      "report", "junit", "json", "dump-tensors", "checkpoint-dir", "resume", "keep-dir"};
  static const std::set<std::string> kInputs = {"scenario", "scenarios", "oracle", "run", "config"};
  const CLI::Validator non_empty(
      [](std::string& v) {
        return v.empty() ? std::string("an empty path; give a file or directory name")
                         : std::string();
      },
      "", "non-empty path");
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size_max() == 0) continue;  // a flag: no value to name a path
    bool path = opt->get_positional() && kInputs.count(opt->get_name(true)) > 0;
    for (const std::string& n : opt->get_lnames()) path = path || kPaths.count(n) > 0;
    if (path) opt->check(non_empty);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    refuse_empty_paths(*sub);
}

int run_cli(int argc, char** argv) {
  // A closed pipe (`| head`) or a FIFO whose reader left is lost output, reported as such (EPIPE,
  // exit 3), not a death by signal.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "shardcheck: deterministic multi-rank simulator and parity harness for distributed training"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version", std::string("shardcheck ") + code_version() + " (commit " + code_commit() + ")");
  int exit_code = kExitBadInput;
  add_run_commands(app, exit_code);
  add_ledger_command(app, exit_code);
  add_plan_command(app, exit_code);
  add_bench_commands(app, exit_code);
  add_drill_command(app, exit_code);
  add_compare_command(app, exit_code);
  add_import_model_command(app, exit_code);
  refuse_empty_paths(app);

  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->get_name() == argv[1];
    if (!known) {
      std::cerr << "shardcheck: error: unknown command '" << argv[1] << "'; expected one of:";
      for (const CLI::App* sub : app.get_subcommands({})) std::cerr << ' ' << sub->get_name();
      std::cerr << "\n";
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  } catch (const BadInput& e) {
    std::cerr << "shardcheck: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const OutputError& e) {
    std::cerr << "shardcheck: output lost: " << e.what() << "\n";
    return kExitRunBroke;
  } catch (const std::exception& e) {
    std::cerr << "shardcheck: the run broke: " << e.what() << "\n";
    return kExitRunBroke;
  }
  // Tables and --json go to standard output: a full disk or a closed pipe there is lost output.
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::cerr << "shardcheck: output lost: standard output could not be written completely\n";
    return kExitRunBroke;
  }
  return exit_code;
}

}  // namespace shardcheck::harness
