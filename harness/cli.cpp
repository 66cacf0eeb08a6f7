// Command-line frame: the app, the commands each module registers, and the mapping of outcomes
// to exit codes. Each command's work lives in its own file (cmd_*.cpp); this file only wires them.
#include "harness/cli.hpp"

#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <string_view>

#include "harness/build_info.hpp"
#include "harness/cli_commands.hpp"
#include "harness/output.hpp"

namespace shardcheck::harness {

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
