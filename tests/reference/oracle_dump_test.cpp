// Writes dumps for reference/tools/check_dump.py, an independent pure-Python implementation of
// reference/README.md, which the reference_python_oracle ctest runs; skipped when run on its own.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "reference/data.hpp"
#include "reference/trainer.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

struct Case {
  std::string name;
  ModelConfig model;
  double clip;
  std::optional<DataConfig> data;  // set: batches come from the corpus and the sampler
};

void write_config(const std::filesystem::path& file, const Case& c, const TrainConfig& train,
                  uint64_t seed) {
  const ModelConfig& m = c.model;
  const OptimizerConfig& o = train.optimizer;
  std::ofstream f(file);
  f.precision(17);
  f << "{\"seed\": " << seed << ", \"vocab\": " << m.vocab << ", \"hidden\": " << m.hidden
    << ", \"layers\": " << m.layers << ", \"heads\": " << m.heads
    << ", \"kv_heads\": " << m.kv_heads << ", \"ffn\": " << m.ffn << ", \"mlp\": \""
    << to_string(m.mlp) << "\", \"seq_len\": " << m.seq_len
    << ", \"tie_embeddings\": " << (m.tie_embeddings ? "true" : "false")
    << ", \"dropout\": " << m.dropout << ", \"rope\": {\"theta\": " << m.rope.theta
    << ", \"layout\": \"" << to_string(m.rope.layout) << "\", \"scaling\": ";
  if (m.rope.scaling) {
    const RopeScaling& s = *m.rope.scaling;
    f << "{\"rope_type\": \"llama3\", \"factor\": " << s.factor
      << ", \"low_freq_factor\": " << s.low_freq_factor
      << ", \"high_freq_factor\": " << s.high_freq_factor
      << ", \"original_max_position_embeddings\": " << s.original_max_positions << "}";
  } else {
    f << "null";
  }
  f << "}, \"steps\": " << train.steps << ", \"global_batch\": " << train.global_batch
    << ", \"clip_grad_norm\": " << train.clip_grad_norm << ", \"optimizer\": {\"lr\": " << o.lr
    << ", \"beta1\": " << o.beta1 << ", \"beta2\": " << o.beta2 << ", \"eps\": " << o.eps
    << ", \"weight_decay\": " << o.weight_decay << ", \"warmup\": " << o.warmup
    << ", \"min_lr\": " << o.min_lr << "}";
  if (m.moe)
    f << ", \"moe\": {\"experts\": " << m.moe->experts << ", \"top_k\": " << m.moe->top_k
      << ", \"capacity_factor\": " << m.moe->capacity_factor << ", \"every\": " << m.moe->every
      << ", \"aux_loss\": " << m.moe->aux_loss << "}";
  if (c.data)
    f << ", \"data\": {\"documents\": " << c.data->documents << ", \"min_len\": " << c.data->min_len
      << ", \"max_len\": " << c.data->max_len
      << ", \"packing\": " << (c.data->packing ? "true" : "false") << "}";
  f << "}\n";
  ASSERT_TRUE(f.good());
}

TEST(OracleDump, WritesDumpsForThePythonOracle) {
  const char* root = std::getenv("SHARDCHECK_ORACLE_DUMP_DIR");
  if (root == nullptr) GTEST_SKIP() << "SHARDCHECK_ORACLE_DUMP_DIR not set";
  ModelConfig moe = test::tiny_moe();
  moe.dropout = 0.1;
  ModelConfig dense = test::tiny_dense();
  dense.tie_embeddings = false;
  dense.kv_heads = 1;
  DataConfig packed;
  packed.documents = 60;
  packed.min_len = 3;
  packed.max_len = 20;
  DataConfig unpacked = packed;
  unpacked.packing = false;
  ModelConfig dense_swiglu = dense;  // untied, MQA
  dense_swiglu.mlp = MlpKind::kSwiglu;
  ModelConfig moe_swiglu = moe;  // tied, dropout 0.1, experts with w_gate
  moe_swiglu.mlp = MlpKind::kSwiglu;
  // RoPE as Llama 3.1 defines it, on head dim 8 (hidden 16, 2 heads, MQA): theta 500000 gives
  // wavelengths 6.3, 167, 4443 and 118k, so with original_max_position_embeddings 8192 (low 1,
  // high 4: divided above 8192, blended from 2048) pairs 0-1 keep their frequency, pair 2 blends,
  // pair 3 is divided by 8; in the half layout (pairs (j, j + 4)).
  ModelConfig llama_rope = dense_swiglu;
  llama_rope.heads = 2;
  llama_rope.rope.theta = 500000.0;
  llama_rope.rope.layout = RopeLayout::kHalf;
  llama_rope.rope.scaling = RopeScaling{};
  // Interleaved pairs at theta 500000 without scaling; MoE, tied, dropout 0.1.
  ModelConfig moe_rope = moe;
  moe_rope.heads = 2;
  moe_rope.kv_heads = 1;
  moe_rope.rope.theta = 500000.0;
  // Scaling fields away from their defaults, which a short context shows: original 64, factor 4,
  // low 1, high 8 put the boundaries at wavelengths 64 and 8 (theta 10000, d 8: 6.3 kept, 63
  // blended, 628 and 6283 divided); GELU, GQA 4/2 on hidden 32.
  ModelConfig scaled_short = test::tiny_dense();
  scaled_short.hidden = 32;
  scaled_short.rope.scaling = RopeScaling{
      .factor = 4.0, .low_freq_factor = 1.0, .high_freq_factor = 8.0, .original_max_positions = 64};
  const uint64_t seed = 1234;
  for (const Case& c : {Case{"moe_tied_dropout", moe, 0.05, std::nullopt},
                        Case{"dense_untied_mqa", dense, 0.0, std::nullopt},
                        Case{"moe_corpus_packed", moe, 1.0, packed},
                        Case{"dense_corpus_unpacked", dense, 1.0, unpacked},
                        Case{"dense_swiglu_untied_mqa", dense_swiglu, 0.0, std::nullopt},
                        Case{"moe_swiglu_tied_dropout", moe_swiglu, 0.05, std::nullopt},
                        Case{"dense_swiglu_rope_half_llama3", llama_rope, 0.0, std::nullopt},
                        Case{"moe_rope_interleaved_theta", moe_rope, 0.05, std::nullopt},
                        Case{"dense_rope_scaled_short_packed", scaled_short, 1.0, packed}}) {
    TrainConfig train;
    train.steps = 2;
    train.global_batch = 3;
    train.micro_batch = 1;
    train.clip_grad_norm = c.clip;
    train.optimizer.warmup = 2;
    const auto dir = std::filesystem::path(root) / c.name;
    if (c.data) {
      const Dataset ds = build_dataset(*c.data, c.model, seed);
      DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), train.global_batch, seed,
                                 c.data->drop_last);
      train_and_dump(c.model, train, seed, sampler_batch_source(ds, sampler), dir.string());
    } else {
      const Batch batch = test::tiny_batch(c.model, train.global_batch);
      train_and_dump(
          c.model, train, seed, [&](int) { return batch; }, dir.string());
    }
    write_config(dir / "config.json", c, train, seed);
  }
}

}  // namespace
}  // namespace shardcheck::ref
