// The CLI's commands, registered on the CLI11 app by the module that implements them; cli.cpp is
// only the frame. A command's callback stores its exit code; BadInput means exit 2.
#pragma once

#include <CLI/CLI.hpp>

#include <stdexcept>
#include <string>

namespace shardcheck::harness {

// Unusable input (bad arguments, bad scenario, unwritable output): exit 2 with this message.
class BadInput : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `bench collectives`.
void add_bench_commands(CLI::App& app, int& exit_code);
// `run` and `matrix`.
void add_run_commands(CLI::App& app, int& exit_code);

// `ledger`.
void add_ledger_command(CLI::App& app, int& exit_code);
// `plan`.
void add_plan_command(CLI::App& app, int& exit_code);

// `drill checkpoint`.
void add_drill_command(CLI::App& app, int& exit_code);

// `compare`: a run's tensor dump against an oracle's.
void add_compare_command(CLI::App& app, int& exit_code);

// `import-model`: a Hugging Face config.json or torchtitan model args as a scenario "model" block.
void add_import_model_command(CLI::App& app, int& exit_code);

// Refuses an empty path (exit 2, naming the option) for every option of `app` and its commands
// that names a file or directory (--report, --junit, --json, --dump-tensors, --checkpoint-dir,
// --resume, --keep-dir, the scenario, dump and model-configuration inputs): "" would be ignored or
// read as ".". Called once by cli.cpp after every command is registered.
void refuse_empty_paths(CLI::App& app);

// Refuses --backend nccl in a build without gpu/.
void check_backend(const std::string& backend);

}  // namespace shardcheck::harness
