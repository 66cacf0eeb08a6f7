// `shardcheck import-model CONFIG.json`: a Hugging Face config.json (Llama, Mistral, Mixtral,
// Qwen2) or torchtitan Llama model args mapped onto the scenario's "model" block (RoPE included:
// theta, Llama 3.1's scaling, the layout), printed as JSON on stdout; what the scenario model
// cannot express (norm eps, biases, sliding windows, ...) is listed on stderr, as are defaults
// taken and keys ignored or unknown. A field that is missing, of the wrong type or not mappable (a
// RoPE scaling other than "llama3" among them) exits 2 naming its JSON path.
#include <iostream>
#include <memory>
#include <string>

#include "harness/cli.hpp"
#include "harness/cli_commands.hpp"
#include "harness/json_reader.hpp"
#include "harness/model_import.hpp"

namespace shardcheck::harness {

namespace {

struct ImportArgs {
  std::string config;
};

int import_model_cmd(const ImportArgs& a) {
  ModelImport m;
  try {
    m = load_model_config(a.config);
  } catch (const ScenarioError& e) {
    throw BadInput(e.what());
  }
  std::cerr << import_note(m);
  std::cout << m.model.dump(2) << "\n";
  return kExitOk;
}

}  // namespace

void add_import_model_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ImportArgs>();
  auto* cmd = app.add_subcommand(
      "import-model",
      "Map a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2) or torchtitan Llama model "
      "args onto the scenario's \"model\" block (JSON on stdout; what is not mapped on stderr)");
  cmd->add_option("config", args->config, "config.json or torchtitan model-args JSON file")
      ->required();
  cmd->callback([args, &exit_code] { exit_code = import_model_cmd(*args); });
}

}  // namespace shardcheck::harness
