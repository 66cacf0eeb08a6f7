// `shardcheck import-model` (harness/model_import.hpp): the published config.json files of Llama 3
// 8B and 70B, Llama 3.1 8B and 405B, Llama 3.2 1B, Mistral 7B v0.1 and v0.3, Mixtral 8x7B and
// Qwen2 7B, torchtitan's Llama model args and Meta's params.json, mapped onto the scenario's
// "model" block field by field (RoPE theta, Llama 3.1's scaling and the layout included), with the
// published parameter counts as a check of the whole shape; what the scenario model cannot express
// is reported; bad input (a RoPE scaling other than "llama3" among it) exits 2 naming the JSON
// path.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli_support.hpp"
#include "harness/json_reader.hpp"
#include "harness/model_import.hpp"
#include "harness/scenario.hpp"
#include "reference/model.hpp"

namespace shardcheck::harness {
namespace {

namespace fs = std::filesystem;
using shardcheck::testing::has;
using shardcheck::testing::TempDir;

// The config.json files as published on the Hugging Face Hub (meta-llama/Meta-Llama-3-8B,
// meta-llama/Meta-Llama-3-70B, meta-llama/Meta-Llama-3.1-405B, meta-llama/Llama-3.1-8B,
// meta-llama/Llama-3.2-1B, mistralai/Mistral-7B-v0.1, mistralai/Mistral-7B-v0.3,
// mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen2-7B).
const char* const kLlama3_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* const kLlama3_70B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 8192,
  "initializer_range": 0.02, "intermediate_size": 28672, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 64, "num_hidden_layers": 80,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* const kLlama31_405B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 16384,
  "initializer_range": 0.02, "intermediate_size": 53248, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 128, "num_hidden_layers": 126,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* const kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* const kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* const kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

const char* const kMistral7B_v03 = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 32768})";

const char* const kMixtral8x7B = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* const kQwen2_7B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.37.2", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 152064})";

ModelImport import_text(const char* text) {
  return import_model(nlohmann::json::parse(text));
}

// The block as the scenario loader reads it.
ref::ModelConfig loaded(const ModelImport& m) {
  return parse_scenario(nlohmann::json{{"name", "imported"}, {"model", nlohmann::json(m.model)}})
      .model;
}

double parameters(const ref::ModelConfig& m) {
  double n = 0;
  for (const auto& [name, shape] : ref::param_shapes(m)) {
    double e = 1;
    for (const auto d : shape) e *= static_cast<double>(d);
    n += e;
  }
  return n;
}

struct Shape {
  int vocab, hidden, layers, heads, kv_heads, ffn, seq_len;
};

void expect_shape(const ModelImport& m, const Shape& s) {
  const auto& b = m.model;
  EXPECT_EQ(b.at("vocab"), s.vocab);
  EXPECT_EQ(b.at("hidden"), s.hidden);
  EXPECT_EQ(b.at("layers"), s.layers);
  EXPECT_EQ(b.at("heads"), s.heads);
  EXPECT_EQ(b.at("kv_heads"), s.kv_heads);
  EXPECT_EQ(b.at("ffn"), s.ffn);
  EXPECT_EQ(b.at("mlp"), "swiglu");
  EXPECT_EQ(b.at("seq_len"), s.seq_len);
  EXPECT_EQ(b.at("tie_embeddings"), false);
}

// The RoPE the block loads as (ref::RopeConfig, reference/config.hpp).
ref::RopeConfig rope(double theta, ref::RopeLayout layout,
                     std::optional<ref::RopeScaling> scaling = std::nullopt) {
  ref::RopeConfig r;
  r.theta = theta;
  r.layout = layout;
  r.scaling = scaling;
  return r;
}
constexpr auto kHalf = ref::RopeLayout::kHalf;
constexpr auto kInterleaved = ref::RopeLayout::kInterleaved;
// Llama 3.1's published scaling: factor 8, low 1, high 4, original 8192 (RopeScaling's defaults).
const ref::RopeScaling kLlama31Scaling{};

// Whether one of `lines` starts with `path` (the note names each field by its JSON path).
bool names(const std::vector<std::string>& lines, const std::string& path) {
  for (const std::string& l : lines)
    if (l.rfind(path, 0) == 0) return true;
  return false;
}

TEST(ImportModel, Llama3Family) {
  const ModelImport l8 = import_text(kLlama3_8B);
  EXPECT_EQ(l8.source, "Hugging Face LlamaForCausalLM");
  expect_shape(l8, {128256, 4096, 32, 32, 8, 14336, 8192});
  EXPECT_EQ(l8.model.at("dropout"), 0.0);
  EXPECT_FALSE(l8.model.contains("moe"));
  // The published parameter counts: the block is the whole shape (embedding and head untied,
  // three MLP matrices, GQA projections, norms).
  EXPECT_EQ(parameters(loaded(l8)), 8030261248.0);
  // RoPE: theta 500000, unscaled (rope_scaling null), rotate_half as Hugging Face stores the
  // checkpoint; printed as a block, loaded as ref::RopeConfig.
  EXPECT_EQ(l8.model.at("rope"), nlohmann::ordered_json::parse(
                                     R"({"theta": 500000.0, "layout": "half", "scaling": null})"));
  EXPECT_EQ(loaded(l8).rope, rope(500000, kHalf));
  // The initialisation is not the scenario model's; eps 1e-5, no biases, pretraining_tp 1 are, and
  // RoPE is mapped.
  EXPECT_TRUE(names(l8.not_mapped, "$.initializer_range")) << import_note(l8);
  for (const char* same : {"$.rms_norm_eps", "$.attention_bias", "$.pretraining_tp", "$.rope_theta",
                           "$.rope_scaling", "$.hidden_act"})
    EXPECT_FALSE(names(l8.not_mapped, same)) << same;
  EXPECT_TRUE(l8.not_recognised.empty()) << import_note(l8);
  EXPECT_TRUE(l8.defaults.empty()) << import_note(l8);
  for (const char* meta : {"$.bos_token_id", "$.eos_token_id", "$.torch_dtype",
                           "$.transformers_version", "$.use_cache"})
    EXPECT_TRUE(names(l8.ignored, meta)) << meta;

  const ModelImport l70 = import_text(kLlama3_70B);
  expect_shape(l70, {128256, 8192, 80, 64, 8, 28672, 8192});
  EXPECT_EQ(parameters(loaded(l70)), 70553706496.0);
  EXPECT_EQ(loaded(l70).rope, rope(500000, kHalf));

  // Llama 3.1: rope_scaling "llama3" (factor 8, low 1, high 4, original 8192) is the block's
  // rope.scaling, field for field.
  const ModelImport l405 = import_text(kLlama31_405B);
  expect_shape(l405, {128256, 16384, 126, 128, 8, 53248, 131072});
  EXPECT_EQ(parameters(loaded(l405)), 405853388800.0);
  EXPECT_EQ(l405.model.at("rope"),
            nlohmann::ordered_json::parse(R"({"theta": 500000.0, "layout": "half",
      "scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})"));
  EXPECT_EQ(loaded(l405).rope, rope(500000, kHalf, kLlama31Scaling));
  for (const char* same : {"$.rope_theta", "$.rope_scaling", "$.mlp_bias"})
    EXPECT_FALSE(names(l405.not_mapped, same)) << same << "\n" << import_note(l405);
  EXPECT_TRUE(l405.not_recognised.empty()) << import_note(l405);

  const ModelImport l31_8 = import_text(kLlama31_8B);
  expect_shape(l31_8, {128256, 4096, 32, 32, 8, 14336, 131072});
  EXPECT_EQ(parameters(loaded(l31_8)), 8030261248.0);
  EXPECT_EQ(loaded(l31_8).rope, rope(500000, kHalf, kLlama31Scaling));
  EXPECT_TRUE(l31_8.defaults.empty()) << import_note(l31_8);

  // Llama 3.2 1B: the same scaling with factor 32, embeddings tied.
  const ModelImport l1 = import_text(kLlama32_1B);
  EXPECT_EQ(l1.model.at("tie_embeddings"), true);
  EXPECT_EQ(parameters(loaded(l1)), 1235814400.0);
  ref::RopeScaling f32;
  f32.factor = 32;
  EXPECT_EQ(loaded(l1).rope, rope(500000, kHalf, f32));
}

TEST(ImportModel, MistralMixtralQwen2) {
  const ModelImport mistral = import_text(kMistral7B);
  EXPECT_EQ(mistral.source, "Hugging Face MistralForCausalLM");
  expect_shape(mistral, {32000, 4096, 32, 32, 8, 14336, 32768});
  EXPECT_FALSE(mistral.model.contains("dropout"));  // no attention_dropout key
  EXPECT_EQ(parameters(loaded(mistral)), 7241732096.0);
  // The 4096-token sliding window changes attention past 4096 tokens; RoPE theta 10000 (v0.1's
  // published value) is mapped.
  EXPECT_TRUE(names(mistral.not_mapped, "$.sliding_window: 4096")) << import_note(mistral);
  EXPECT_FALSE(names(mistral.not_mapped, "$.rope_theta"));
  EXPECT_EQ(loaded(mistral).rope, rope(10000, kHalf));
  // v0.3: theta 1e6, no sliding window, vocabulary 32768.
  const ModelImport v03 = import_text(kMistral7B_v03);
  expect_shape(v03, {32768, 4096, 32, 32, 8, 14336, 32768});
  EXPECT_EQ(parameters(loaded(v03)), 7248023552.0);
  EXPECT_EQ(loaded(v03).rope, rope(1e6, kHalf));
  EXPECT_FALSE(names(v03.not_mapped, "$.sliding_window")) << import_note(v03);

  const ModelImport mixtral = import_text(kMixtral8x7B);
  EXPECT_EQ(mixtral.source, "Hugging Face MixtralForCausalLM");
  expect_shape(mixtral, {32000, 4096, 32, 32, 8, 14336, 32768});
  const auto& moe = mixtral.model.at("moe");
  EXPECT_EQ(moe.at("experts"), 8);
  EXPECT_EQ(moe.at("top_k"), 2);
  EXPECT_EQ(moe.at("every"), 1);
  EXPECT_EQ(moe.at("aux_loss"), 0.02);
  EXPECT_EQ(moe.at("capacity_factor"), 4.0);  // experts / top_k: no token dropped, as Mixtral
  EXPECT_EQ(parameters(loaded(mixtral)), 46702792704.0);
  EXPECT_FALSE(names(mixtral.not_mapped, "$.sliding_window"));  // null: no window
  EXPECT_FALSE(names(mixtral.not_mapped, "$.rope_theta"));
  EXPECT_EQ(loaded(mixtral).rope, rope(1e6, kHalf));
  EXPECT_TRUE(names(mixtral.not_mapped, "$.output_router_logits"));
  EXPECT_TRUE(names(mixtral.not_mapped, "$.num_local_experts"));  // the capacity rule
  EXPECT_TRUE(mixtral.not_recognised.empty()) << import_note(mixtral);

  const ModelImport qwen = import_text(kQwen2_7B);
  EXPECT_EQ(qwen.source, "Hugging Face Qwen2ForCausalLM");
  expect_shape(qwen, {152064, 3584, 28, 28, 4, 18944, 131072});
  // Qwen2's q, k, v biases (28 x (3584 + 512 + 512) parameters) are not in the scenario model:
  // the published 7,615,616,512 less them, and the note says so.
  EXPECT_EQ(parameters(loaded(qwen)), 7615616512.0 - 28 * (3584 + 512 + 512));
  EXPECT_TRUE(names(qwen.not_mapped, "$.architectures[0]: Qwen2ForCausalLM")) << import_note(qwen);
  EXPECT_TRUE(names(qwen.not_mapped, "$.rms_norm_eps: 1e-06"));
  EXPECT_EQ(loaded(qwen).rope, rope(1e6, kHalf));
  // use_sliding_window false: the window is inactive, listed as ignored, not as a difference.
  EXPECT_FALSE(names(qwen.not_mapped, "$.sliding_window"));
  EXPECT_TRUE(names(qwen.ignored, "$.sliding_window"));
  EXPECT_TRUE(qwen.not_recognised.empty()) << import_note(qwen);
}

// Absent fields take transformers' defaults for the architecture, and the note says which.
TEST(ImportModel, AbsentFieldsTakeTheArchitecturesDefaultsAndSaySo) {
  nlohmann::json j = nlohmann::json::parse(kLlama3_8B);
  for (const char* k : {"num_key_value_heads", "hidden_act", "tie_word_embeddings",
                        "max_position_embeddings", "architectures"})
    j.erase(k);
  const ModelImport m = import_model(j);  // model_type alone names the architecture
  EXPECT_EQ(m.model.at("kv_heads"), 32);  // LlamaConfig: None means multi-head attention
  EXPECT_EQ(m.model.at("tie_embeddings"), false);
  EXPECT_FALSE(m.model.contains("seq_len"));
  EXPECT_TRUE(names(m.defaults, "$.num_key_value_heads"));
  EXPECT_TRUE(names(m.defaults, "$.hidden_act"));
  EXPECT_TRUE(names(m.defaults, "$.tie_word_embeddings"));
  nlohmann::json mistral = nlohmann::json::parse(kMistral7B);
  mistral.erase("num_key_value_heads");
  EXPECT_EQ(import_model(mistral).model.at("kv_heads"), 8);  // MistralConfig's default
  // rope_theta absent: 10000, as LlamaConfig, MistralConfig and Qwen2Config; 1e6 as MixtralConfig.
  j.erase("rope_theta");
  const ModelImport no_theta = import_model(j);
  EXPECT_EQ(loaded(no_theta).rope, rope(10000, kHalf));
  EXPECT_TRUE(names(no_theta.defaults, "$.rope_theta absent: 10000")) << import_note(no_theta);
  nlohmann::json mixtral = nlohmann::json::parse(kMixtral8x7B);
  mixtral.erase("rope_theta");
  EXPECT_EQ(loaded(import_model(mixtral)).rope, rope(1e6, kHalf));
  // A key the importer does not know is listed, never dropped silently.
  j["quantization_config"] = {{"bits", 4}};
  EXPECT_TRUE(names(import_model(j).not_recognised, "$.quantization_config"));
}

// torchtitan's Llama model args: ffn = multiple_of-rounded int(ffn_dim_multiplier *
// int(2 * 4 * dim / 3)), as torchtitan's FeedForward; the Llama 3 sizes of torchtitan's
// llama3_configs give the published intermediate sizes, Llama 2 7B's defaults its 11008.
TEST(ImportModel, TorchtitanArgsDeriveTheMlpWidth) {
  const auto args = [](int dim, int layers, int heads, int kv, double mult, int multiple_of) {
    return nlohmann::json{{"dim", dim},
                          {"n_layers", layers},
                          {"n_heads", heads},
                          {"n_kv_heads", kv},
                          {"vocab_size", 128256},
                          {"multiple_of", multiple_of},
                          {"ffn_dim_multiplier", mult},
                          {"norm_eps", 1e-5},
                          {"rope_theta", 500000},
                          {"max_seq_len", 8192},
                          {"depth_init", true},
                          {"use_flex_attn", false},
                          {"attn_mask_type", "causal"},
                          {"eos_id", 0}};
  };
  const ModelImport l8 = import_model(args(4096, 32, 32, 8, 1.3, 1024));
  EXPECT_EQ(l8.source, "torchtitan Llama model args");
  expect_shape(l8, {128256, 4096, 32, 32, 8, 14336, 8192});
  EXPECT_EQ(parameters(loaded(l8)), 8030261248.0);
  expect_shape(import_model(args(8192, 80, 64, 8, 1.3, 4096)),
               {128256, 8192, 80, 64, 8, 28672, 8192});
  const ModelImport l405 = import_model(args(16384, 126, 128, 8, 1.2, 4096));
  expect_shape(l405, {128256, 16384, 126, 128, 8, 53248, 8192});
  EXPECT_EQ(parameters(loaded(l405)), 405853388800.0);
  // RoPE: theta 500000, adjacent pairs as torchtitan's code; rope_scaling_args absent is
  // TransformerModelArgs' default, Llama 3.1's scaling (torchtitan applies it to every Llama 3).
  EXPECT_EQ(loaded(l405).rope, rope(500000, kInterleaved, kLlama31Scaling));
  EXPECT_FALSE(names(l405.not_mapped, "$.rope_theta"));
  EXPECT_TRUE(names(l405.defaults, "$.rope_scaling_args absent: llama3 scaling"))
      << import_note(l405);
  EXPECT_TRUE(names(l405.not_mapped, "$.attn_mask_type"));  // causal across documents
  EXPECT_TRUE(names(l405.not_mapped, "$.depth_init"));
  EXPECT_FALSE(names(l405.not_mapped, "$.norm_eps"));
  EXPECT_TRUE(l405.not_recognised.empty()) << import_note(l405);

  // Llama 2 7B: no multiplier, multiple_of 256 (its default), n_kv_heads null.
  const ModelImport l2 = import_model(nlohmann::json{{"dim", 4096},
                                                     {"n_layers", 32},
                                                     {"n_heads", 32},
                                                     {"n_kv_heads", nullptr},
                                                     {"vocab_size", 32000},
                                                     {"ffn_dim_multiplier", nullptr}});
  EXPECT_EQ(l2.model.at("ffn"), 11008);
  EXPECT_EQ(l2.model.at("kv_heads"), 32);
  EXPECT_FALSE(l2.model.contains("seq_len"));
  EXPECT_TRUE(names(l2.defaults, "$.multiple_of"));
  EXPECT_TRUE(names(l2.defaults, "$.n_kv_heads"));
  EXPECT_TRUE(names(l2.defaults, "$.rope_theta absent: 10000"));
}

// torchtitan's rope_scaling_args (RoPEScalingArgs: scaling_factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings; absent fields its defaults, null none) and
// Meta's params.json use_scaled_rope (apply_scaling's fixed 8, 1, 4, 8192).
TEST(ImportModel, TorchtitanAndMetaRopeScaling) {
  const nlohmann::json base = {{"dim", 4096},
                               {"n_layers", 32},
                               {"n_heads", 32},
                               {"n_kv_heads", 8},
                               {"vocab_size", 128256},
                               {"multiple_of", 1024},
                               {"ffn_dim_multiplier", 1.3},
                               {"rope_theta", 500000}};
  const auto with = [&](const nlohmann::json& extra) {
    nlohmann::json j = base;
    for (const auto& [k, v] : extra.items()) j[k] = v;
    return import_model(j);
  };
  const ModelImport args = with({{"rope_scaling_args",
                                  {{"scaling_factor", 8.0},
                                   {"low_freq_factor", 1.0},
                                   {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 8192}}}});
  EXPECT_EQ(loaded(args).rope, rope(500000, kInterleaved, kLlama31Scaling));
  EXPECT_TRUE(args.defaults.empty()) << import_note(args);
  EXPECT_TRUE(args.not_recognised.empty()) << import_note(args);
  // One field given, the others RoPEScalingArgs' defaults, each noted.
  const ModelImport part = with({{"rope_scaling_args", {{"scaling_factor", 32.0}}}});
  ref::RopeScaling f32;
  f32.factor = 32;
  EXPECT_EQ(loaded(part).rope, rope(500000, kInterleaved, f32));
  for (const char* d : {"$.rope_scaling_args.low_freq_factor absent: 1",
                        "$.rope_scaling_args.high_freq_factor absent: 4",
                        "$.rope_scaling_args.original_max_position_embeddings absent: 8192"})
    EXPECT_TRUE(names(part.defaults, d)) << d << "\n" << import_note(part);
  // null: no scaling (torchtitan before #1839); a key RoPEScalingArgs lacks is listed.
  EXPECT_EQ(loaded(with({{"rope_scaling_args", nullptr}})).rope, rope(500000, kInterleaved));
  EXPECT_TRUE(names(with({{"rope_scaling_args", {{"beta", 1}}}}).not_recognised,
                    "$.rope_scaling_args.beta"));
  // Meta's params.json for Llama 3.1 8B (use_scaled_rope true) and Llama 3 8B (false).
  const ModelImport meta = with({{"norm_eps", 1e-5}, {"use_scaled_rope", true}});
  EXPECT_EQ(loaded(meta).rope, rope(500000, kInterleaved, kLlama31Scaling));
  EXPECT_EQ(parameters(loaded(meta)), 8030261248.0);
  EXPECT_TRUE(meta.not_recognised.empty()) << import_note(meta);
  EXPECT_FALSE(names(meta.defaults, "$.rope_scaling_args"));
  EXPECT_EQ(loaded(with({{"use_scaled_rope", false}})).rope, rope(500000, kInterleaved));
}

// Hugging Face's RoPE keys beyond the published files: the older "type" for rope_type,
// rope_type "default" (none), and transformers 5's rope_parameters (rope_theta inside), which
// must agree with rope_theta / rope_scaling where both are given.
TEST(ImportModel, HuggingFaceRopeForms) {
  const nlohmann::json l405 = nlohmann::json::parse(kLlama31_405B);
  nlohmann::json legacy = l405;
  legacy["rope_scaling"].erase("rope_type");
  legacy["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(loaded(import_model(legacy)).rope, rope(500000, kHalf, kLlama31Scaling));
  nlohmann::json plain = l405;
  plain["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(loaded(import_model(plain)).rope, rope(500000, kHalf));

  nlohmann::json v5 = l405;
  v5["rope_parameters"] = v5["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  const ModelImport m5 = import_model(v5);
  EXPECT_EQ(loaded(m5).rope, rope(500000, kHalf, kLlama31Scaling));
  EXPECT_TRUE(m5.not_recognised.empty()) << import_note(m5);
  EXPECT_TRUE(m5.defaults.empty()) << import_note(m5);
  nlohmann::json both = v5;  // the same RoPE given both ways
  both["rope_theta"] = 500000.0;
  both["rope_scaling"] = l405.at("rope_scaling");
  EXPECT_EQ(loaded(import_model(both)).rope, rope(500000, kHalf, kLlama31Scaling));
  nlohmann::json v5_plain = nlohmann::json::parse(kLlama3_8B);
  v5_plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  v5_plain.erase("rope_theta");
  EXPECT_EQ(loaded(import_model(v5_plain)).rope, rope(500000, kHalf));
}

// ---- the command ----

struct ImportRun {
  int code = -1;
  std::string out, err;
};

// `shardcheck import-model FILE`, stdout and stderr apart.
ImportRun import_cli(const std::string& file, const fs::path& dir) {
  const fs::path err = dir / "stderr.txt";
  const std::string cmd =
      std::string(SHARDCHECK_BIN) + " import-model '" + file + "' 2>'" + err.string() + "'";
  ImportRun r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) r.out += buf;
  const int status = p ? pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = shardcheck::testing::slurp(err);
  return r;
}

fs::path write(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path f = dir / name;
  std::ofstream(f, std::ios::binary) << text;
  return f;
}

TEST(ImportModelCommand, PrintsTheBlockAndTheNoteOnStderr) {
  TempDir tmp("shardcheck_import_model_ok");
  const ImportRun r =
      import_cli(write(tmp.path(), "config.json", kLlama31_405B).string(), tmp.path());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json block = nlohmann::json::parse(r.out);  // stdout is the block alone
  EXPECT_EQ(block, nlohmann::json(import_text(kLlama31_405B).model));
  EXPECT_EQ(block.at("ffn"), 53248);
  // It loads as a scenario's model, as printed.
  EXPECT_EQ(parse_scenario(nlohmann::json{{"name", "x"}, {"model", block}}).model.mlp,
            ref::MlpKind::kSwiglu);
  EXPECT_EQ(block.at("rope").at("scaling").at("factor"), 8.0);
  for (const char* part :
       {"LlamaForCausalLM", "rope layout \"half\"", "not mapped", "ignored", "$.torch_dtype"})
    EXPECT_TRUE(has(r.err, part)) << part << "\n" << r.err;
  // RoPE is mapped now: neither theta nor scaling is listed as not mapped.
  EXPECT_FALSE(has(r.err, "$.rope_theta")) << r.err;
  EXPECT_FALSE(has(r.err, "$.rope_scaling")) << r.err;
  const ImportRun mixtral =
      import_cli(write(tmp.path(), "mixtral.json", kMixtral8x7B).string(), tmp.path());
  ASSERT_EQ(mixtral.code, 0) << mixtral.err;
  EXPECT_EQ(nlohmann::json::parse(mixtral.out).at("moe").at("experts"), 8);
}

// Every unusable input exits 2 naming the JSON path (or the file) and what was expected.
TEST(ImportModelCommand, BadInputExitsTwoNamingThePath) {
  TempDir tmp("shardcheck_import_model_bad");
  const nlohmann::json llama = nlohmann::json::parse(kLlama3_8B);
  const nlohmann::json mixtral = nlohmann::json::parse(kMixtral8x7B);
  const nlohmann::json l405 = nlohmann::json::parse(kLlama31_405B);
  const auto patched = [](nlohmann::json j, const nlohmann::json& patch) {
    j.merge_patch(patch);  // a null in the patch removes the key
    return j.dump();
  };
  const nlohmann::json titan = {
      {"dim", 4096}, {"n_layers", 32}, {"n_heads", 32}, {"vocab_size", 128256}};
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {patched(llama, {{"hidden_act", "gelu"}}), {"$.hidden_act: expected \"silu\", got \"gelu\""}},
      {patched(llama, {{"hidden_act", 1}}), {"$.hidden_act: expected a string"}},
      {patched(llama, {{"hidden_size", nullptr}}), {"$.hidden_size: missing"}},
      {patched(llama, {{"hidden_size", "4096"}}), {"$.hidden_size: expected an integer"}},
      {patched(llama, {{"hidden_size", 4096.0}}), {"$.hidden_size: expected an integer"}},
      {patched(llama, {{"num_hidden_layers", 0}}), {"$.num_hidden_layers: expected an integer"}},
      {patched(llama, {{"vocab_size", -1}}), {"$.vocab_size"}},
      {patched(llama, {{"num_key_value_heads", 5}}), {"$.num_key_value_heads", "does not divide"}},
      {patched(llama, {{"hidden_size", 4080}}), {"$.num_attention_heads", "does not divide"}},
      {patched(llama, {{"head_dim", 64}}), {"$.head_dim: 64 differs"}},
      {patched(llama, {{"max_position_embeddings", 1}}), {"$.max_position_embeddings"}},
      {patched(llama, {{"tie_word_embeddings", "no"}}), {"$.tie_word_embeddings: expected true"}},
      {patched(llama, {{"attention_dropout", 1.5}}), {"$.attention_dropout"}},
      {patched(llama, {{"rope_theta", "big"}}), {"$.rope_theta: expected a number"}},
      {patched(llama, {{"rope_theta", 1}}), {"$.rope_theta: expected a number > 1"}},
      // A RoPE scaling other than Llama 3.1's is refused, never dropped.
      {patched(llama, {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}),
       {"$.rope_scaling.rope_type: expected \"llama3\"", "got \"linear\"", "\"default\""}},
      {patched(llama, {{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}}),
       {"$.rope_scaling.rope_type: expected \"llama3\"", "got \"dynamic\""}},
      {patched(llama, {{"rope_scaling",
                        {{"rope_type", "yarn"},
                         {"factor", 4.0},
                         {"original_max_position_embeddings", 32768}}}}),
       {"$.rope_scaling.rope_type: expected \"llama3\"", "got \"yarn\""}},
      {patched(llama, {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}}}),
       {"$.rope_scaling.type: expected \"llama3\"", "got \"linear\""}},
      {patched(llama, {{"rope_scaling", {{"type", "yarn"}, {"rope_type", "llama3"}}}}),
       {"$.rope_scaling.type: \"yarn\" differs from rope_type"}},
      {patched(llama, {{"rope_scaling", {{"factor", 8.0}}}}),
       {"$.rope_scaling.rope_type: missing"}},
      {patched(llama, {{"rope_scaling", {{"rope_type", 3}}}}),
       {"$.rope_scaling.rope_type: expected a string"}},
      {patched(llama, {{"rope_scaling", "llama3"}}), {"$.rope_scaling: expected an object"}},
      {patched(l405, {{"rope_scaling", {{"factor", nullptr}}}}),
       {"$.rope_scaling.factor: missing"}},
      {patched(l405, {{"rope_scaling", {{"factor", "8"}}}}),
       {"$.rope_scaling.factor: expected a number"}},
      {patched(l405, {{"rope_scaling", {{"factor", 0.5}}}}),
       {"$.rope_scaling.factor: expected a number in [1,"}},
      {patched(l405, {{"rope_scaling", {{"high_freq_factor", 1.0}}}}),
       {"$.rope_scaling.high_freq_factor: expected a number greater than low_freq_factor"}},
      {patched(l405, {{"rope_scaling", {{"original_max_position_embeddings", 8192.0}}}}),
       {"$.rope_scaling.original_max_position_embeddings: expected an integer"}},
      {patched(l405, {{"rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 500000}}}}),
       {"$.rope_parameters.rope_type: expected \"llama3\"", "got \"yarn\""}},
      {patched(l405, {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000}}}}),
       {"$.rope_theta: 500000 differs from $.rope_parameters.rope_theta (10000)"}},
      {patched(l405, {{"rope_parameters", {{"rope_type", "default"}}}}),
       {"$.rope_scaling: differs from $.rope_parameters"}},
      {patched(llama, {{"architectures", nlohmann::json::array({"GPT2LMHeadModel"})}}),
       {"$.architectures[0]: expected one of", "GPT2LMHeadModel"}},
      {patched(llama, {{"architectures", "LlamaForCausalLM"}}), {"$.architectures: expected"}},
      {patched(llama, {{"model_type", "mistral"}}), {"$.model_type: expected \"llama\""}},
      {patched(mixtral, {{"num_local_experts", nullptr}}), {"$.num_local_experts: missing"}},
      {patched(mixtral, {{"num_experts_per_tok", 9}}), {"$.num_experts_per_tok", "[1, 8]"}},
      {patched(titan, {{"vocab_size", -1}}), {"$.vocab_size", "tokenizer"}},
      {patched(titan, {{"ffn_dim_multiplier", "1.3"}}), {"$.ffn_dim_multiplier"}},
      {patched(titan, {{"n_heads", nullptr}}), {"$.n_heads: missing"}},
      {patched(titan, {{"norm_type", "layernorm"}}), {"$.norm_type"}},
      {patched(titan, {{"moe_args", {{"num_experts", 8}}}}), {"$.moe_args"}},
      {patched(titan, {{"rope_theta", 0.5}}), {"$.rope_theta: expected a number > 1"}},
      {patched(titan, {{"rope_scaling_args", "llama3"}}),
       {"$.rope_scaling_args: expected an object"}},
      {patched(titan, {{"rope_scaling_args", {{"scaling_factor", 0.5}}}}),
       {"$.rope_scaling_args.scaling_factor: expected a number in [1,"}},
      {patched(titan, {{"rope_scaling_args", {{"low_freq_factor", 4.0}}}}),
       {"$.rope_scaling_args.high_freq_factor: expected a number greater than low_freq_factor"}},
      {patched(titan, {{"use_scaled_rope", "yes"}}), {"$.use_scaled_rope: expected true or false"}},
      {patched(titan, {{"use_scaled_rope", true}, {"rope_scaling_args", nlohmann::json::object()}}),
       {"$.use_scaled_rope: given with $.rope_scaling_args"}},
      {R"([1, 2])", {": $: expected a JSON object"}},
      {R"({"n_embd": 768})", {": $: neither a Hugging Face config.json"}},
      {R"({"hidden_size": 4096,)", {"not valid JSON"}},
      {R"({"model_type": "llama", "hidden_size": 1, "hidden_size": 2})",
       {"$.hidden_size: duplicate key"}},
      {std::string(100, '[') + std::string(100, ']'), {"nested deeper than 64"}},
      {R"({"dim": 1e400})", {"out of range"}},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const fs::path f = write(tmp.path(), "c" + std::to_string(i) + ".json", cases[i].first);
    const ImportRun r = import_cli(f.string(), tmp.path());
    EXPECT_EQ(r.code, 2) << cases[i].first << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_TRUE(has(r.err, f.string() + ": ")) << r.err;  // the file, then the path
    for (const std::string& part : cases[i].second)
      EXPECT_TRUE(has(r.err, part)) << part << "\n" << cases[i].first << "\n" << r.err;
  }
  // Files: a directory, a missing file, an empty name, a file past 16 MiB.
  ImportRun r = import_cli(tmp.path().string(), tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "not a regular file")) << r.err;
  r = import_cli((tmp.path() / "absent.json").string(), tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "cannot open")) << r.err;
  r = import_cli("", tmp.path());
  EXPECT_EQ(r.code, 2) << r.err;
  const fs::path big =
      write(tmp.path(), "big.json", "{\"x\": \"" + std::string(17 << 20, 'a') + "\"}");
  r = import_cli(big.string(), tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "at most 16777216")) << r.err.substr(0, 400);
}

}  // namespace
}  // namespace shardcheck::harness
