// The mesh engine against the single-device reference: every axis alone, pairs and full
// compositions, f64 (tight) and f32, dropout on; planted bugs each caught. Parity per step: the
// global loss and every parameter gathered to full shape (DESIGN.md "Parity rule").
#include "parallel/mp/mesh_engine.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "parallel/testing.hpp"
#include "sim/world.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel {
namespace {

using test::Parity;
using test::Scenario;

// Dense: 4 layers (pp 4), heads 4 / kv 2, vocab 32, S 16 (cp 4: 8 chunks of 2), dropout on.
Scenario mesh_dense() {
  Scenario s;
  s.name = "mesh-dense";
  s.model.vocab = 32;
  s.model.hidden = 16;
  s.model.layers = 4;
  s.model.heads = 4;
  s.model.kv_heads = 2;
  s.model.ffn = 24;
  s.model.seq_len = 16;
  s.model.dropout = 0.1;
  s.train.steps = 2;
  s.train.global_batch = 16;
  s.train.micro_batch = 2;
  s.train.optimizer.lr = 5e-3;
  s.train.clip_grad_norm = 0.05;
  s.data.documents = 200;
  s.data.min_len = 3;
  s.data.max_len = 20;
  return s;
}

Scenario mesh_moe() {
  Scenario s = mesh_dense();
  s.name = "mesh-moe";
  s.model.dropout = 0.0;
  s.model.tie_embeddings = false;
  s.model.moe = ref::MoeConfig{
      .experts = 4, .top_k = 2, .capacity_factor = 1.0, .every = 2, .aux_loss = 0.01};
  return s;
}

test::DpRun mesh_run(const Scenario& s, const MeshOptions& o) {
  const ref::Dataset ds = test::dataset_of(s);
  test::DpRun out;
  const int world = o.shape.world_size();
  out.ranks.resize(static_cast<std::size_t>(world));
  sim::SimWorld(world).run([&](comm::Communicator& c) {
    MeshEngine engine(c, s.model, s.train, s.seed, o);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    test::Trace& mine = out.ranks[static_cast<std::size_t>(c.rank())];
    for (int n = 1; n <= s.train.steps; ++n) {
      const ref::Batch local =
          rank_batch(ds, sampler.next_global_batch(), engine.data_rank(), engine.data_world());
      mine.steps.push_back(engine.step(local));
      mine.params.push_back(engine.full_params());
    }
  });
  return out;
}

Parity parity(const Scenario& s, const MeshOptions& o) {
  return test::compare(test::reference_run(s), mesh_run(s, o));
}

struct Case {
  const char* name;
  MeshOptions options;
};

MeshOptions mesh(comm::MeshShape shape) {
  MeshOptions o;
  o.shape = shape;
  return o;
}

TEST(MeshEngine, SingleRankEqualsTheReference) {
  const Parity p = parity(mesh_dense(), mesh({}));
  EXPECT_LE(p.max(), 1e-12) << p.worst;
}

TEST(MeshEngine, TensorParallelWithAndWithoutSequenceParallel) {
  const Scenario s = mesh_dense();
  for (const bool sp : {false, true}) {
    MeshOptions o = mesh({.tp = 2});
    o.sequence_parallel = sp;
    const Parity p = parity(s, o);
    EXPECT_LE(p.max(), test::kF64Tolerance) << "sp " << sp << ": " << p.worst;
  }
}

TEST(MeshEngine, PipelineSchedules) {
  const Scenario s = mesh_dense();
  for (const PipeSchedule sched : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b}) {
    MeshOptions o = mesh({.pp = 2});
    o.schedule = sched;
    const Parity p = parity(s, o);
    EXPECT_LE(p.max(), test::kF64Tolerance) << name_of(sched) << ": " << p.worst;
  }
  MeshOptions o = mesh({.pp = 2});
  o.schedule = PipeSchedule::interleaved;
  o.virtual_stages = 2;
  const Parity p = parity(s, o);
  EXPECT_LE(p.max(), test::kF64Tolerance) << "interleaved: " << p.worst;
}

TEST(MeshEngine, ContextParallelRingAndUlysses) {
  const Scenario s = mesh_dense();
  for (const CpAlgo algo : {CpAlgo::ring, CpAlgo::ulysses}) {
    MeshOptions o = mesh({.cp = 2});
    o.cp_algo = algo;
    const Parity p = parity(s, o);
    EXPECT_LE(p.max(), test::kF64Tolerance) << name_of(algo) << ": " << p.worst;
  }
}

TEST(MeshEngine, ExpertParallel) {
  const Parity p = parity(mesh_moe(), mesh({.ep = 2}));
  EXPECT_LE(p.max(), test::kF64Tolerance) << p.worst;
}

TEST(MeshEngine, FullComposition) {
  MeshOptions o = mesh({.dp = 2, .tp = 2, .pp = 2});
  const Parity p = parity(mesh_dense(), o);
  EXPECT_LE(p.max(), test::kF64Tolerance) << p.worst;
}

// tp > kv_heads: each kv head replicated on tp / kv_heads TP ranks (GQA 4/2 at tp 4, MQA at tp 2,
// with SP), its gradient summed over them; the wrong kv head for a rank's query heads is caught.
TEST(MeshEngine, ReplicatedKvHeadsWhenTpExceedsThem) {
  Scenario mqa = mesh_dense();
  mqa.model.kv_heads = 1;
  MeshOptions sp = mesh({.tp = 2});
  sp.sequence_parallel = true;
  for (const auto& [s, o] : {std::pair{mesh_dense(), mesh({.tp = 4})}, std::pair{mqa, sp},
                             std::pair{mesh_dense(), mesh({.dp = 2, .tp = 4})}}) {
    const Parity p = parity(s, o);
    EXPECT_LE(p.max(), test::kF64Tolerance) << o.shape.world_size() << ": " << p.worst;
  }
  testing::ScopedMutation m(testing::Mutation::kGqaWrongHeadMapping);
  EXPECT_GT(parity(mesh_dense(), mesh({.tp = 4})).max(), 1e-6);
}

}  // namespace
}  // namespace shardcheck::parallel

namespace shardcheck::parallel {
namespace {

// Each planted bug of issue 7 makes parity fail by far more than the tolerance.
struct MutationCase {
  testing::Mutation mutation;
  const char* name;
  bool moe;
  MeshOptions options;
};

MeshOptions with(MeshOptions o, CpAlgo algo) {
  o.cp_algo = algo;
  return o;
}

TEST(MeshEngineMutations, EveryPlantedBugIsCaught) {
  MeshOptions sp = mesh({.tp = 2});
  sp.sequence_parallel = true;
  const std::vector<MutationCase> cases = {
      {testing::Mutation::kRowParallelNotReduced, "row-parallel output not reduced", false,
       mesh({.tp = 2})},
      {testing::Mutation::kRowParallelNotReduced, "row-parallel not reduce-scattered (SP)", false,
       sp},
      {testing::Mutation::kGqaWrongHeadMapping, "GQA kv heads of the wrong rank", false,
       mesh({.tp = 2})},
      {testing::Mutation::kCpRopeChunkOffset, "RoPE from the chunk start", false, mesh({.cp = 2})},
      {testing::Mutation::kRingDiagonalUnmasked, "ring diagonal block unmasked", false,
       with(mesh({.cp = 2}), CpAlgo::ring)},
      {testing::Mutation::kSkipTiedEmbeddingSync, "tied embedding not synced", false,
       mesh({.pp = 2})},
      {testing::Mutation::kRouteDroppedTokens, "dropped tokens routed", true, mesh({.ep = 2})},
      {testing::Mutation::kAuxPerRankMean, "aux loss per-rank mean", true, mesh({.ep = 2})},
      {testing::Mutation::kLocalNormClip, "clipping by the local norm", false,
       mesh({.dp = 2, .tp = 2})},
  };
  for (const MutationCase& c : cases) {
    const Scenario s = c.moe ? mesh_moe() : mesh_dense();
    const Parity clean = parity(s, c.options);
    EXPECT_LE(clean.max(), test::kF64Tolerance) << c.name << " (clean): " << clean.worst;
    testing::ScopedMutation m(c.mutation);
    const Parity bad = parity(s, c.options);
    EXPECT_GT(bad.max(), 1e-6) << c.name << " was not caught";
    std::printf("%-40s clean %.2e  planted %.2e (%s)\n", c.name, clean.max(), bad.max(),
                bad.worst.c_str());
  }
}

}  // namespace
}  // namespace shardcheck::parallel

namespace shardcheck::parallel {
namespace {

// export_state writes every element once over the world; import into another mesh (TP 2 x PP 2
// -> TP 1 x DP 2 x CP 2, and back to one rank) continues exactly like the uninterrupted run.
struct Store {
  std::mutex mu;
  std::map<std::string, std::vector<double>> values;  // tensor -> elements (as f64)
  std::map<std::string, std::vector<int>> writes;     // tensor -> times each element was written
};

void put(Store& st, const StatePiece& p) {
  const std::size_t n = p.shape.empty() ? 1 : static_cast<std::size_t>(ref::numel_of(p.shape));
  std::lock_guard<std::mutex> lock(st.mu);
  auto& v = st.values[p.tensor];
  auto& w = st.writes[p.tensor];
  v.resize(n);
  w.resize(n);
  for (std::size_t i = 0; i < p.count; ++i) {
    double x = 0;
    if (p.dtype == comm::DType::f64) {
      std::memcpy(&x, p.bytes.data() + i * 8, 8);
    } else {
      int64_t k = 0;
      std::memcpy(&k, p.bytes.data() + i * 8, 8);
      x = static_cast<double>(k);
    }
    v[p.begin + i] = x;
    ++w[p.begin + i];
  }
}

MeshOptions zero(MeshOptions o, int stage) {
  o.zero = stage;
  return o;
}

// Saves after step 1 on `src`, checks every element was written once, and continues step 2 on
// each of `dsts` from the saved state: parity with the uninterrupted reference.
void state_round_trip(const MeshOptions& src, const std::vector<MeshOptions>& dsts) {
  const Scenario s = mesh_dense();
  const ref::Dataset ds = test::dataset_of(s);
  Store st;
  sim::SimWorld(src.shape.world_size()).run([&](comm::Communicator& c) {
    MeshEngine e(c, s.model, s.train, s.seed, src);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
    for (const StatePiece& p : e.export_state()) put(st, p);
  });
  for (const auto& [name, w] : st.writes) {
    for (std::size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], 1) << name << "[" << i << "]";
  }
  EXPECT_EQ(st.values.count("exp_avg/layers.1.attn.wq"), 1u);
  const StateReader reader = [&](const std::string& tensor, comm::DType dtype, std::size_t begin,
                                 std::size_t count, std::span<std::byte> out) {
    const auto& v = st.values.at(tensor);
    for (std::size_t i = 0; i < count; ++i) {
      if (dtype == comm::DType::f64) {
        std::memcpy(out.data() + i * 8, &v[begin + i], 8);
      } else {
        const auto k = static_cast<int64_t>(v[begin + i]);
        std::memcpy(out.data() + i * 8, &k, 8);
      }
    }
  };
  const test::Trace want = test::reference_run(s);
  for (const MeshOptions& dst : dsts) {
    double worst = 0;
    const int world = dst.shape.world_size();
    std::mutex mu;
    sim::SimWorld(world).run([&](comm::Communicator& c) {
      MeshEngine e(c, s.model, s.train, s.seed, dst);
      e.import_state(reader);
      ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                      s.seed, true);
      sampler.next_global_batch();  // step 1 was consumed before the save
      const ref::StepRecord rec =
          e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
      const ref::ParamMap<double> full = e.full_params();
      std::lock_guard<std::mutex> lock(mu);
      worst = std::max(worst, rel_err(rec.loss, want.steps[1].loss));
      for (const auto& p : want.params[1])
        worst = std::max(worst, tensor_rel_err(full[p.name], p.value));
    });
    EXPECT_LE(worst, test::kF64Tolerance) << "world " << world << " zero " << dst.zero;
  }
}

TEST(MeshEngineState, ExportWritesEachElementOnceAndImportReshards) {
  state_round_trip(mesh({.tp = 2, .pp = 2}), {mesh({.dp = 2, .cp = 2}), mesh({})});
  // TP 2 <-> 4 (kv heads replicated at 4), PP 2 -> 1.
  state_round_trip(mesh({.tp = 2, .pp = 2}), {mesh({.tp = 4})});
  state_round_trip(mesh({.tp = 4}), {mesh({.tp = 2, .pp = 2})});
}

// Sharded optimizer state (ZeRO-1/2): each shard's owner writes its pieces; any mesh reads them.
TEST(MeshEngineState, ZeroShardsExportOnceAndImportAnywhere) {
  state_round_trip(zero(mesh({.dp = 2, .tp = 2}), 1),
                   {mesh({.tp = 2, .pp = 2}), zero(mesh({.dp = 2, .cp = 2}), 2)});
  state_round_trip(zero(mesh({.dp = 2, .pp = 2, .cp = 2}), 2),
                   {zero(mesh({.dp = 4}), 1), mesh({})});
}

}  // namespace
}  // namespace shardcheck::parallel

namespace shardcheck::parallel {
namespace {

// ZeRO on the data-parallel axes of the mesh: parity in f64 (tight) and bf16, the planted shard
// offset bug caught.
TEST(MeshEngineZero, ParityWithTheReference) {
  MeshOptions sp = mesh({.dp = 2, .tp = 2, .pp = 2});
  sp.sequence_parallel = true;
  const std::vector<Case> cases = {
      {"dp2-tp2 zero1", zero(mesh({.dp = 2, .tp = 2}), 1)},
      {"dp2-tp2-pp2 zero2", zero(mesh({.dp = 2, .tp = 2, .pp = 2}), 2)},
      {"dp2-tp2-pp2 sp zero1", zero(sp, 1)},
      {"dp2-cp2 zero2", zero(mesh({.dp = 2, .cp = 2}), 2)},
      {"dp4 zero2", zero(mesh({.dp = 4}), 2)},
  };
  for (const Case& c : cases) {
    const Parity p = parity(mesh_dense(), c.options);
    EXPECT_LE(p.max(), test::kF64Tolerance) << c.name << ": " << p.worst;
    std::printf("%-28s f64 %.2e\n", c.name, p.max());
  }
  for (const int z : {1, 2}) {
    const Parity p = parity(mesh_moe(), zero(mesh({.dp = 2, .ep = 2}), z));
    EXPECT_LE(p.max(), test::kF64Tolerance) << "moe dp2-ep2 zero" << z << ": " << p.worst;
    std::printf("moe dp2-ep2 zero%d           f64 %.2e\n", z, p.max());
  }
  const Parity cpep = parity(mesh_moe(), zero(mesh({.dp = 2, .tp = 2, .cp = 2, .ep = 2}), 2));
  EXPECT_LE(cpep.max(), test::kF64Tolerance) << "moe dp2-tp2-cp2-ep2 zero2: " << cpep.worst;
  std::printf("moe dp2-tp2-cp2-ep2 zero2   f64 %.2e\n", cpep.max());
}

TEST(MeshEngineZero, Bf16RecipeParity) {
  Scenario s = mesh_dense();
  s.train.precision = ref::Precision::kBf16;
  for (const int z : {0, 1, 2}) {
    const Parity p = parity(s, zero(mesh({.dp = 2, .tp = 2, .pp = 2}), z));
    EXPECT_LE(p.loss, 2e-2) << "zero" << z << ": " << p.worst;
    EXPECT_LE(p.params, 1e-3) << "zero" << z << ": " << p.worst;
    std::printf("bf16 dp2-tp2-pp2 zero%d loss %.2e params %.2e\n", z, p.loss, p.params);
  }
}

// The owner reads its gradient shard at r * floor(N / D) instead of r * S: needs N % D != 0
// (DP 3 x TP 2: N = 3472 non-expert elements per rank, S = 1158).
TEST(MeshEngineZero, WrongShardOffsetIsCaught) {
  Scenario s = mesh_dense();
  s.train.global_batch = 18;
  const MeshOptions o = zero(mesh({.dp = 3, .tp = 2}), 1);
  const Parity clean = parity(s, o);
  EXPECT_LE(clean.max(), test::kF64Tolerance) << clean.worst;
  testing::ScopedMutation m(testing::Mutation::kWrongShardOffset);
  const Parity bad = parity(s, o);
  EXPECT_GT(bad.max(), 1e-6) << "wrong shard offset was not caught";
  std::printf("wrong shard offset: clean %.2e planted %.2e (%s)\n", clean.max(), bad.max(),
              bad.worst.c_str());
}

TEST(MeshEngineZero, ValidationRefusesWhatIsNotBuilt) {
  const Scenario s = mesh_dense();
  const auto refuses = [&](const MeshOptions& o, const char* needle) {
    try {
      validate_mesh(s.model, s.train, o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const MeshConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refuses(zero(mesh({.dp = 2, .tp = 2}), 3), "zero 3");
  refuses(zero(mesh({.dp = 2}), 4), "zero 4");
  MeshOptions f = mesh({.dp = 2, .tp = 2});
  f.fsdp = "full_shard";
  refuses(f, "fsdp \"full_shard\"");
  EXPECT_NO_THROW(validate_mesh(s.model, s.train, zero(mesh({.dp = 2, .tp = 2}), 2)));
}

// Per rank: the tracker's category peaks over two steps, and the model state at the last
// optimizer.
struct RankMemory {
  comm::MemoryBreakdown peaks, model_state, after;
};

std::vector<RankMemory> mesh_memory(const Scenario& s, const MeshOptions& o) {
  const ref::Dataset ds = test::dataset_of(s);
  std::vector<RankMemory> out(static_cast<std::size_t>(o.shape.world_size()));
  sim::SimWorld(o.shape.world_size()).run([&](comm::Communicator& c) {
    MeshEngine e(c, s.model, s.train, s.seed, o);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    for (int n = 1; n <= s.train.steps; ++n)
      e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
    RankMemory& m = out[static_cast<std::size_t>(c.rank())];
    m.peaks = c.memory().category_peaks();
    m.model_state = e.last_model_state();
    m.after = c.memory().current();
  });
  return out;
}

std::size_t of(const comm::MemoryBreakdown& b, comm::MemCategory c) {
  return b[c];
}

TEST(MeshEngineMemory, OneFOneBKeepsFewerActivationsThanGPipe) {
  const Scenario s = mesh_dense();  // 8 microbatches per step over 4 stages
  MeshOptions gpipe = mesh({.pp = 4});
  gpipe.schedule = PipeSchedule::gpipe;
  const MeshOptions ofob = mesh({.pp = 4});
  const auto g = mesh_memory(s, gpipe), f = mesh_memory(s, ofob);
  for (int stage = 0; stage < 4; ++stage) {
    const std::size_t ga =
        of(g[static_cast<std::size_t>(stage)].peaks, comm::MemCategory::activations);
    const std::size_t fa =
        of(f[static_cast<std::size_t>(stage)].peaks, comm::MemCategory::activations);
    std::printf("stage %d activation peak: gpipe %zu B, 1f1b %zu B\n", stage, ga, fa);
    EXPECT_GT(ga, 0u);
    // 1F1B keeps at most pp - stage microbatches in flight, GPipe all 8.
    EXPECT_LT(fa, ga) << "stage " << stage;
    EXPECT_EQ(of(f[static_cast<std::size_t>(stage)].after, comm::MemCategory::activations), 0u);
    EXPECT_EQ(of(f[static_cast<std::size_t>(stage)].after, comm::MemCategory::grads), 0u);
  }
  const double first = static_cast<double>(of(f[0].peaks, comm::MemCategory::activations)) /
                       static_cast<double>(of(g[0].peaks, comm::MemCategory::activations));
  EXPECT_NEAR(first, 4.0 / 8.0, 0.05);  // stage 0: 4 of 8 microbatches
}

TEST(MeshEngineMemory, TensorParallelHalvesTheSplitWeights) {
  const Scenario s = mesh_dense();
  const auto one = mesh_memory(s, mesh({})), two = mesh_memory(s, mesh({.tp = 2}));
  const auto p1 = static_cast<double>(of(one[0].model_state, comm::MemCategory::params));
  // The norms (2 per layer and the final one, 9 x 16 of 6 800 elements) stay replicated;
  // everything else (embedding, attention, MLP) is split over TP.
  const double replicated = 9.0 * 16.0 * 8.0;
  for (const RankMemory& m : two) {
    const auto p2 = static_cast<double>(of(m.model_state, comm::MemCategory::params));
    EXPECT_DOUBLE_EQ(p2 - replicated, (p1 - replicated) / 2.0);
    EXPECT_DOUBLE_EQ(static_cast<double>(of(m.model_state, comm::MemCategory::optimizer)),
                     2.0 * p2);  // f64: moments 16 B per 8 B parameter
  }
  std::printf("params per rank: tp1 %.0f B, tp2 %zu B\n", p1,
              of(two[0].model_state, comm::MemCategory::params));
}

TEST(MeshEngineMemory, ZeroShardsOptimizerStateAndGradients) {
  const Scenario s = mesh_dense();
  const auto z0 = mesh_memory(s, mesh({.dp = 2, .tp = 2}));
  const auto z1 = mesh_memory(s, zero(mesh({.dp = 2, .tp = 2}), 1));
  const auto z2 = mesh_memory(s, zero(mesh({.dp = 2, .tp = 2}), 2));
  for (std::size_t r = 0; r < z0.size(); ++r) {
    const std::size_t o0 = of(z0[r].model_state, comm::MemCategory::optimizer);
    const std::size_t o1 = of(z1[r].model_state, comm::MemCategory::optimizer);
    const std::size_t g0 = of(z0[r].model_state, comm::MemCategory::grads);
    const std::size_t g2 = of(z2[r].model_state, comm::MemCategory::grads);
    EXPECT_GE(2 * o1, o0);
    EXPECT_LE(2 * o1, o0 + 2 * 16);  // padding: < D elements per class
    EXPECT_EQ(of(z2[r].model_state, comm::MemCategory::optimizer), o1);
    EXPECT_EQ(of(z1[r].model_state, comm::MemCategory::grads), g0);
    EXPECT_GE(2 * g2, g0);
    EXPECT_LE(2 * g2, g0 + 2 * 8);
    EXPECT_EQ(of(z1[r].model_state, comm::MemCategory::params),
              of(z0[r].model_state, comm::MemCategory::params));
    if (r == 0)
      std::printf(
          "dp2-tp2 rank 0: optimizer zero0 %zu B, zero1 %zu B; grads zero0 %zu B, "
          "zero2 %zu B\n",
          o0, o1, g0, g2);
  }
}

}  // namespace
}  // namespace shardcheck::parallel
