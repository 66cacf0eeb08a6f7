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
    << ", \"dropout\": " << m.dropout << ", \"steps\": " << train.steps
    << ", \"global_batch\": " << train.global_batch
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
  const uint64_t seed = 1234;
  for (const Case& c : {Case{"moe_tied_dropout", moe, 0.05, std::nullopt},
                        Case{"dense_untied_mqa", dense, 0.0, std::nullopt},
                        Case{"moe_corpus_packed", moe, 1.0, packed},
                        Case{"dense_corpus_unpacked", dense, 1.0, unpacked},
                        Case{"dense_swiglu_untied_mqa", dense_swiglu, 0.0, std::nullopt},
                        Case{"moe_swiglu_tied_dropout", moe_swiglu, 0.05, std::nullopt}}) {
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
