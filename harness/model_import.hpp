// `shardcheck import-model`: a published model's configuration mapped onto the scenario's "model"
// block. Two sources: a Hugging Face config.json (LlamaForCausalLM, MistralForCausalLM,
// MixtralForCausalLM, Qwen2ForCausalLM) and torchtitan's Llama model arguments as JSON (dim,
// n_layers, n_heads, ...; ffn derived as torchtitan does). RoPE is mapped to model.rope: theta,
// Llama 3.1's "llama3" scaling (another scaling is refused: dropping it would change the angles),
// layout "half" for Hugging Face (its checkpoints are stored for rotate_half) and "interleaved" for
// torchtitan (adjacent pairs, as Meta's code). Every key of the input is accounted for: mapped,
// checked against what the scenario model fixes (RMSNorm eps 1e-5, no biases), reported as not
// mapped where the scenario model cannot express it and it changes the math, ignored when it is
// metadata (token ids, dtype, versions), or reported as not recognised.
// A field that is missing, has the wrong type, or has a value the scenario model cannot take is a
// ScenarioError naming its JSON path ("$.hidden_act: expected \"silu\", got \"gelu\"").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace shardcheck::harness {

struct ModelImport {
  std::string source;            // "Hugging Face LlamaForCausalLM" / "torchtitan Llama model args"
  nlohmann::ordered_json model;  // the scenario's "model" block, keys in scenarios/README.md order
  // "$.rms_norm_eps: 1e-06 (the scenario model's RMSNorm uses eps 1e-05)": what the scenario
  // model cannot express and that changes the math where it applies (stderr note).
  std::vector<std::string> not_mapped;
  // Fields absent from the input, taken as the architecture's default ("$.num_key_value_heads
  // absent: = num_attention_heads (32), as transformers' LlamaConfig").
  std::vector<std::string> defaults;
  std::vector<std::string> ignored;         // paths of metadata keys (no effect on the math)
  std::vector<std::string> not_recognised;  // paths of keys this importer does not know
};

// Maps a parsed configuration. Throws ScenarioError (path: what was expected) for input it cannot
// map; the block it returns loads as a scenario's "model" (checked with the scenario loader).
ModelImport import_model(const nlohmann::json& config);

// Parses `text` under the scenario's input limits (16 MiB, 64 levels of nesting, a key given twice
// in one object refused, numbers within double range) and maps it; errors are prefixed with
// `origin` (the file name, control characters escaped).
ModelImport import_model_text(std::string_view text, const std::string& origin);

// Reads a regular file (a FIFO or device is refused) of at most 16 MiB and maps it.
ModelImport load_model_config(const std::string& file);

// The stderr note: source, not mapped, defaults, ignored and not recognised keys, one line each
// (empty groups left out).
std::string import_note(const ModelImport& m);

}  // namespace shardcheck::harness
