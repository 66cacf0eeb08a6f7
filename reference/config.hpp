// Plain configuration structs of the reference model and training run (the scenario's "model",
// "train" and "data" objects). No parsing here: harness/ maps JSON onto these.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace shardcheck::ref {

struct MoeConfig {
  int experts = 4;
  int top_k = 2;
  double capacity_factor = 1.25;
  int every = 2;  // layer i is an MoE layer iff (i + 1) % every == 0
  double aux_loss = 0.01;
  bool operator==(const MoeConfig&) const = default;
};

// The dense MLP (and each expert): GELU is w_down(gelu(x . w_up)), two matrices (GPT-2, the
// committed scenarios); SwiGLU is w_down(silu(x . w_gate) * (x . w_up)), three (Llama, Mistral,
// Qwen, Mixtral's experts; torchtitan's w1 = w_gate, w3 = w_up, w2 = w_down).
enum class MlpKind { kGelu, kSwiglu };
std::string to_string(MlpKind k);  // "gelu", "swiglu"

// Rotary position embedding as the model families define it. layout: which channels of a head
// rotate together, kInterleaved the adjacent pairs (2j, 2j+1) (Meta's Llama code, torchtitan),
// kHalf the pairs (j, j + d/2) (GPT-NeoX, Hugging Face's rotate_half). Pair j turns by position *
// theta^(-2j/d), or with Llama 3.1's scaling by that frequency rescaled (frequencies()).
enum class RopeLayout { kInterleaved, kHalf };
std::string to_string(RopeLayout l);  // "interleaved", "half"
struct RopeScaling {  // Llama 3.1's "rope_type": "llama3" (its published values as defaults)
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_positions = 8192;
  bool operator==(const RopeScaling&) const = default;
};
struct RopeConfig {
  double theta = 10000.0;
  RopeLayout layout = RopeLayout::kInterleaved;
  std::optional<RopeScaling> scaling;
  // The angle per position of pair j < head_dim / 2: theta^(-2j/d); with scaling, wavelengths
  // 2 pi / f shorter than original / high_freq_factor keep f, longer than original /
  // low_freq_factor take f / factor, and those between blend the two linearly in original /
  // wavelength.
  std::vector<double> frequencies(int head_dim) const;
  bool operator==(const RopeConfig&) const = default;
};

// vocab rounded up to a multiple of `multiple` (>= 1).
inline int64_t padded_vocab(int64_t vocab, int64_t multiple) {
  return (vocab + multiple - 1) / multiple * multiple;
}
// Bounds the multiple; the padded vocabulary is computed in 64 bits and validate_mesh bounds it
// to int32 ids.
inline constexpr int kMaxVocabPadMultiple = 1 << 16;

struct ModelConfig {
  int vocab = 64;
  // Megatron's make-vocab-size-divisible-by: under tensor parallelism of size tp (1 included) the
  // embedding and the head hold padded_vocab(tp) = round_up(vocab, tp * vocab_pad_multiple)
  // rows/columns, the pad masked out of the softmax and never updated. Checkpoints, dumps and the
  // reference keep the logical vocab.
  int vocab_pad_multiple = 1;
  int hidden = 32;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int ffn = 64;  // MLP width, also each expert's width
  MlpKind mlp = MlpKind::kGelu;
  int seq_len = 16;
  bool tie_embeddings = true;
  double dropout = 0.0;  // on attention probabilities only
  RopeConfig rope;
  std::optional<MoeConfig> moe;

  int head_dim() const { return hidden / heads; }
  int64_t padded_vocab(int tp) const {
    return ref::padded_vocab(vocab, int64_t{tp} * vocab_pad_multiple);
  }
  bool gated_mlp() const { return mlp == MlpKind::kSwiglu; }
  int mlp_matrices() const { return gated_mlp() ? 3 : 2; }
  bool is_moe_layer(int layer) const { return moe && (layer + 1) % moe->every == 0; }
  // Throws ConfigError naming the field when the shape is impossible.
  void validate() const;
  bool operator==(const ModelConfig&) const = default;
};

// A configuration the reference cannot build. field(): the key to change, as a scenario names it
// ("model.hidden", "train.micro_batch", "data.min_len"); the scenario loader reports it as the
// JSON path "$.<field>". These validate() methods are the one place the rules are written.
class ConfigError : public std::invalid_argument {
 public:
  ConfigError(std::string field, const std::string& what)
      : std::invalid_argument(what), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

enum class Precision { kF64, kF32, kBf16 };
std::string to_string(Precision p);

// Activation recomputation (Korthikanti et al. 2022): none keeps every activation a block's
// backward reads; selective keeps all but the attention core's probabilities (softmax of the
// scores, before dropout), recomputed in the backward from q, k, v; full keeps only each block's
// input and recomputes the block. All three give the same bits (dropout masks are counter-based).
enum class Recompute { kNone, kSelective, kFull };
std::string to_string(Recompute r);  // "none", "selective", "full"

struct OptimizerConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;  // decoupled, on 2-D weights only
  int warmup = 1;             // steps of linear warmup
  double min_lr = 1e-4;       // cosine floor, reached at the last step
};

struct TrainConfig {
  int steps = 3;
  int global_batch = 8;  // sequences per optimizer step
  int micro_batch = 1;   // sequences per forward/backward; global_batch % micro_batch == 0
  Precision precision = Precision::kF64;
  OptimizerConfig optimizer;
  double clip_grad_norm = 1.0;  // <= 0 disables clipping
  Recompute recompute = Recompute::kNone;
  void validate() const;  // throws ConfigError
};

struct DataConfig {
  int64_t documents = 256;
  int min_len = 4;   // tokens per document, inclusive
  int max_len = 24;  // inclusive
  bool packing = true;
  bool drop_last =
      true;  // false: the last short global batch wraps around (pads) to the epoch start
  // Throws ConfigError; the synthetic documents need a vocabulary of at least 3 tokens.
  void validate(int vocab) const;
};

}  // namespace shardcheck::ref
