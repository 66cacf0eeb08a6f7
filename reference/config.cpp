// Validation of the reference configs: impossible shapes are refused with the field's name.
// Scenario-level checks (meshes, JSON paths) belong to harness/, not here.
#include "reference/config.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace shardcheck::ref {
namespace {
void require(bool ok, const char* field, const std::string& what) {
  if (!ok) throw ConfigError(field, what);
}
std::string num(int64_t v) {
  return std::to_string(v);
}
}  // namespace

void ModelConfig::validate() const {
  require(vocab > 0, "model.vocab", "model.vocab must be positive");
  require(vocab_pad_multiple >= 1 && vocab_pad_multiple <= kMaxVocabPadMultiple,
          "model.vocab_pad_multiple",
          "model.vocab_pad_multiple must be in [1, " + num(kMaxVocabPadMultiple) + "]");
  require(hidden > 0, "model.hidden", "model.hidden must be positive");
  require(layers > 0, "model.layers", "model.layers must be positive");
  require(ffn > 0, "model.ffn", "model.ffn must be positive");
  require(seq_len > 0, "model.seq_len", "model.seq_len must be positive");
  require(heads > 0, "model.heads", "model.heads must be positive");
  require(hidden % heads == 0, "model.hidden",
          num(hidden) + " is not divisible by model.heads (" + num(heads) +
              "); expected a multiple of it");
  require(head_dim() % 2 == 0, "model.hidden",
          "the head dim hidden / heads = " + num(head_dim()) + " must be even for RoPE");
  require(kv_heads > 0 && heads % kv_heads == 0, "model.kv_heads",
          num(kv_heads) + " does not divide model.heads (" + num(heads) +
              "); expected a divisor of it");
  require(dropout >= 0.0 && dropout < 1.0, "model.dropout", "model.dropout must be in [0, 1)");
  require(rope.theta > 1.0, "model.rope.theta", "model.rope.theta must be > 1");
  if (rope.scaling) {
    const RopeScaling& s = *rope.scaling;
    require(s.factor >= 1.0, "model.rope.scaling.factor", "must be >= 1");
    require(s.low_freq_factor > 0.0, "model.rope.scaling.low_freq_factor", "must be positive");
    require(s.high_freq_factor > s.low_freq_factor, "model.rope.scaling.high_freq_factor",
            "must be greater than low_freq_factor");
    require(s.original_max_positions > 0, "model.rope.scaling.original_max_position_embeddings",
            "must be positive");
  }
  if (moe) {
    require(moe->experts > 0, "model.moe.experts", "model.moe.experts must be positive");
    require(moe->top_k >= 1 && moe->top_k <= moe->experts, "model.moe.top_k",
            "model.moe.top_k must be in [1, experts]");
    require(moe->capacity_factor > 0.0, "model.moe.capacity_factor",
            "model.moe.capacity_factor must be positive");
    require(moe->every >= 1, "model.moe.every", "model.moe.every must be >= 1");
  }
}

void TrainConfig::validate() const {
  require(steps >= 0, "train.steps", "train.steps must be >= 0");
  require(global_batch > 0, "train.global_batch", "train.global_batch must be positive");
  require(micro_batch > 0 && global_batch % micro_batch == 0, "train.micro_batch",
          num(micro_batch) + " does not divide train.global_batch (" + num(global_batch) + ")");
  require(optimizer.warmup >= 0, "train.optimizer.warmup", "train.optimizer.warmup must be >= 0");
}

void DataConfig::validate(int vocab) const {
  require(documents > 0, "data.documents", "data.documents must be positive");
  require(min_len >= 2, "data.min_len", "data.min_len " + num(min_len) + " must be >= 2");
  require(max_len >= min_len, "data.max_len",
          "data.max_len " + num(max_len) + " must be >= data.min_len (" + num(min_len) + ")");
  require(vocab >= 3, "model.vocab",
          "the synthetic documents need model.vocab >= 3 (token 0 is reserved), got " + num(vocab));
}

std::string to_string(RopeLayout l) {
  return l == RopeLayout::kHalf ? "half" : "interleaved";
}

std::vector<double> RopeConfig::frequencies(int head_dim) const {
  std::vector<double> f(static_cast<size_t>(head_dim / 2));
  for (int j = 0; j < head_dim / 2; ++j) {
    double freq = std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(head_dim));
    if (scaling) {
      const RopeScaling& s = *scaling;
      const double wavelen = 2.0 * std::numbers::pi / freq;
      const double old = s.original_max_positions;
      if (wavelen > old / s.low_freq_factor) {
        freq /= s.factor;
      } else if (wavelen >= old / s.high_freq_factor) {
        const double smooth =
            (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        freq = (1.0 - smooth) * freq / s.factor + smooth * freq;
      }
    }
    f[static_cast<size_t>(j)] = freq;
  }
  return f;
}

std::string to_string(MlpKind k) {
  return k == MlpKind::kSwiglu ? "swiglu" : "gelu";
}

std::string to_string(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

std::string to_string(Precision p) {
  switch (p) {
    case Precision::kF64:
      return "f64";
    case Precision::kF32:
      return "f32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

}  // namespace shardcheck::ref
