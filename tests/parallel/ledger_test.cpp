// The analytic ledger: the ZeRO paper's closed forms on a 70B-class configuration, and equality
// with the tracked allocator's books on the small models (model state exactly; activation peak
// exactly for dense models and an upper bound for MoE, whose expert buffers depend on routing).
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/ledger.hpp"
#include "reference/model.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

// Llama-2-70B's attention shapes; the reference MLP has two matrices (no gate), so its width is
// 1.5x Llama's 28672 to keep the parameter count at ~69B.
ref::ModelConfig llama70b() {
  ref::ModelConfig m;
  m.vocab = 32000;
  m.hidden = 8192;
  m.layers = 80;
  m.heads = 64;
  m.kv_heads = 8;
  m.ffn = 43008;
  m.seq_len = 4096;
  m.tie_embeddings = false;
  return m;
}

TEST(Ledger, ZeroPaperClosedFormsAt70B) {
  const ref::ModelConfig m = llama70b();
  double psi = 0;
  for (const auto& e : ref::param_shapes(m)) psi += static_cast<double>(ref::numel_of(e.second));
  EXPECT_GT(psi, 6e10);
  for (int n : {8, 64, 1024})
    for (Strategy st :
         {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3, Strategy::fsdp}) {
      const LedgerRow row =
          ledger({.model = m, .recipe = zero_paper_recipe(), .options = {.strategy = st}, .dp = n});
      const double want = zero_paper_bytes(st, psi, 12, n);
      const double got = static_cast<double>(row.model_state());
      // Equal up to padding (fewer than n elements per flat buffer).
      EXPECT_LE(std::abs(got - want) / want, 1e-6) << name_of(st) << " n " << n;
      if (n == 64)
        std::printf(
            "70B %s dp64: %.1f GiB/rank model state (paper %.1f GiB), gather peak %.2f GiB\n",
            std::string(name_of(st)).c_str(), got / (1 << 30), want / (1 << 30),
            static_cast<double>(row.gather_peak) / (1 << 30));
    }
  // Hybrid shard: sharded over the shard group only.
  FsdpOptions hybrid{.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 8};
  const LedgerRow h = ledger({.model = m,
                              .recipe = zero_paper_recipe(),
                              .options = {.strategy = Strategy::fsdp, .fsdp = hybrid},
                              .dp = 64});
  EXPECT_LE(std::abs(static_cast<double>(h.model_state()) - 16 * psi / 8) / (16 * psi / 8), 1e-6);
  // This project's bf16 recipe: 2 + 4 + 4 + 8 = 18 bytes per parameter under DDP.
  const LedgerRow b = ledger({.model = m,
                              .recipe = recipe_of(ref::Precision::kBf16),
                              .options = {.strategy = Strategy::ddp},
                              .dp = 8});
  EXPECT_LE(std::abs(static_cast<double>(b.model_state()) - 18 * psi) / (18 * psi), 1e-6);
}

struct LedgerCase {
  Strategy strategy;
  FsdpOptions fsdp{};
};

// Every strategy, f64 and bf16, dense (DP 4) and MoE (DP 3): the tracker's model state when the
// optimizer starts equals the ledger's, field by field; gather peak and activation peak too.
TEST(Ledger, EqualsTrackedAllocatorOnSmallModels) {
  const std::vector<LedgerCase> cases{
      {Strategy::ddp},
      {Strategy::zero1},
      {Strategy::zero2},
      {Strategy::zero3},
      {Strategy::fsdp, {.wrap = WrapPolicy::layer_group, .blocks_per_unit = 2, .prefetch = 2}},
      {Strategy::fsdp, {.sharding = ShardingStrategy::no_shard}},
      {Strategy::fsdp, {.sharding = ShardingStrategy::shard_grad_op, .prefetch = 1}},
  };
  for (bool moe : {false, true})
    for (ref::Precision prec : {ref::Precision::kF64, ref::Precision::kBf16})
      for (const LedgerCase& lc : cases) {
        Scenario s = moe ? moe_setup() : dense_setup();
        s.train.precision = prec;
        s.train.steps = 1;
        const int dp = moe ? 3 : 4;
        DataParallelOptions o{.strategy = lc.strategy};
        o.fsdp = lc.fsdp;
        const DpRun got = dp_run(s, dp, o);
        const LedgerRow row = mesh_ledger(s.model, s.train, dp_mesh(dp, o), 0);
        const std::string what = s.name + " " + ref::to_string(prec) + " " +
                                 std::string(name_of(lc.strategy)) + " " +
                                 std::string(name_of(lc.fsdp.sharding));
        using comm::MemCategory;
        EXPECT_EQ(got.model_state[MemCategory::params], row.params) << what;
        EXPECT_EQ(got.model_state[MemCategory::grads], row.grads) << what;
        EXPECT_EQ(got.model_state[MemCategory::optimizer], row.optimizer) << what;
        EXPECT_EQ(got.category_peaks[MemCategory::grads], row.grad_peak) << what;
        const std::size_t resident = row.params;
        EXPECT_EQ(got.category_peaks[MemCategory::params] - resident, row.gather_peak) << what;
        const std::size_t act = got.category_peaks[MemCategory::activations];
        if (moe)
          EXPECT_LE(act, row.activation_peak) << what;
        else
          EXPECT_EQ(act, row.activation_peak) << what;
      }
}

// Full and selective recomputation: the tracker's activation peak equals the ledger's, each mode
// saves what it should (full < selective < none), and the parameters are bitwise those of none.
TEST(Ledger, ActivationRecomputationPeaks) {
  std::vector<std::size_t> peaks;
  std::vector<DpRun> runs;
  for (const ref::Recompute mode :
       {ref::Recompute::kNone, ref::Recompute::kSelective, ref::Recompute::kFull}) {
    Scenario s = dense_setup();
    s.train.recompute = mode;
    s.train.steps = 1;
    runs.push_back(dp_run(s, 2, {.strategy = Strategy::zero3}));
    const DpRun& got = runs.back();
    const LedgerRow row =
        mesh_ledger(s.model, s.train, dp_mesh(2, {.strategy = Strategy::zero3}), 0);
    const std::size_t act = got.category_peaks[comm::MemCategory::activations];
    EXPECT_EQ(act, row.activation_peak) << ref::to_string(mode);
    // The peak's phase is named: step, microbatch, pass and unit.
    EXPECT_NE(got.peak_phase.find("step 1"), std::string::npos) << got.peak_phase;
    peaks.push_back(act);
  }
  EXPECT_LT(peaks[1], peaks[0]);
  EXPECT_LT(peaks[2], peaks[1]);
  for (std::size_t m = 1; m < runs.size(); ++m)
    for (const auto& p : runs[0].ranks[0].params.back())
      EXPECT_EQ(runs[m].ranks[0].params.back()[p.name].vec(), p.value.vec()) << m << " " << p.name;
}

}  // namespace
}  // namespace shardcheck::parallel::test
