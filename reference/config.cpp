// Validation of the reference configs: impossible shapes are refused with the field's name.
// Scenario-level checks (meshes, JSON paths) belong to harness/, not here.
#include "reference/config.hpp"

#include <stdexcept>

namespace shardcheck::ref {
namespace {
void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}
}  // namespace

void ModelConfig::validate() const {
  require(vocab > 0 && hidden > 0 && layers > 0 && ffn > 0 && seq_len > 0,
          "model: vocab, hidden, layers, ffn, seq_len must be positive");
  require(heads > 0 && hidden % heads == 0, "model.heads must divide model.hidden");
  require(head_dim() % 2 == 0, "model: head dim (hidden/heads) must be even for RoPE");
  require(kv_heads > 0 && heads % kv_heads == 0, "model.kv_heads must divide model.heads");
  require(dropout >= 0.0 && dropout < 1.0, "model.dropout must be in [0, 1)");
  if (moe) {
    require(moe->experts > 0, "model.moe.experts must be positive");
    require(moe->top_k >= 1 && moe->top_k <= moe->experts,
            "model.moe.top_k must be in [1, experts]");
    require(moe->capacity_factor > 0.0, "model.moe.capacity_factor must be positive");
    require(moe->every >= 1, "model.moe.every must be >= 1");
  }
}

void TrainConfig::validate() const {
  require(steps >= 0, "train.steps must be >= 0");
  require(global_batch > 0 && micro_batch > 0 && global_batch % micro_batch == 0,
          "train.micro_batch must divide train.global_batch");
  require(optimizer.warmup >= 0, "train.optimizer.warmup must be >= 0");
}

void DataConfig::validate() const {
  require(documents > 0, "data.documents must be positive");
  require(min_len >= 2 && max_len >= min_len, "data: need 2 <= min_len <= max_len");
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
