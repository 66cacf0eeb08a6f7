// ZeRO on the data-parallel axes of the mesh (mesh_zero.hpp): parity in f64 (tight) and bf16,
// ZeRO-3 / FSDP full_shard, the planted shard offset bug caught, validation, memory.
#include <gtest/gtest.h>

#include "parallel/testing.hpp"
#include "tests/mp/mesh_support.hpp"

namespace shardcheck::parallel {
namespace {

using namespace mesh_test;  // NOLINT

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
    const Parity p = parity(mesh_moe(), zero(mesh({.dp = 4, .ep = 2}), z));
    EXPECT_LE(p.max(), test::kF64Tolerance) << "moe dp2-ep2 zero" << z << ": " << p.worst;
    std::printf("moe dp2-ep2 zero%d           f64 %.2e\n", z, p.max());
  }
  const Parity cpep = parity(mesh_moe(), zero(mesh({.dp = 4, .tp = 2, .cp = 2, .ep = 2}), 2));
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
  for (const int z : {1, 3}) {
    const MeshOptions o = zero(mesh({.dp = 3, .tp = 2}), z);
    const Parity clean = parity(s, o);
    EXPECT_LE(clean.max(), test::kF64Tolerance) << "zero" << z << ": " << clean.worst;
    MeshOptions planted = o;
    planted.planted = testing::Mutation::kWrongShardOffset;
    const Parity bad = parity(s, planted);
    EXPECT_GT(bad.max(), 1e-6) << "zero" << z << ": wrong shard offset was not caught";
    std::printf("wrong shard offset zero%d: clean %.2e planted %.2e (%s)\n", z, clean.max(),
                bad.max(), bad.worst.c_str());
  }
}

// hybrid_shard: each shard group's reduce_scatter sums only its own ranks' gradients; leaving out
// the all_reduce over the replicas must fail parity (dp4 x tp2, shard groups of 2; and MoE with EP
// folded over CP, dp4 x cp2 x ep2: dense shard groups of cp ranks, expert shard groups of 2).
TEST(MeshEngineZero, HybridShardWithoutTheReplicaSumIsCaught) {
  MeshOptions dense = mesh({.dp = 4, .tp = 2});
  dense.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 2};
  MeshOptions folded = mesh({.dp = 4, .cp = 2, .ep = 2});
  folded.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 1};
  for (const auto& [s, options] : {std::pair{mesh_dense(), dense}, std::pair{mesh_moe(), folded}}) {
    MeshOptions o = options;
    const Parity clean = parity(s, o);
    EXPECT_LE(clean.max(), test::kF64Tolerance) << clean.worst;
    o.planted = testing::Mutation::kSkipReplicaSum;
    const Parity bad = parity(s, o);
    EXPECT_GT(bad.max(), 1e-6) << "the missing replica sum was not caught";
    std::printf("hybrid replica sum (%d ranks): clean %.2e planted %.2e (%s)\n",
                o.shape.world_size(), clean.max(), bad.max(), bad.worst.c_str());
  }
}

// What each FSDP setting keeps gathered, on the tracker: prefetch holds the next unit early,
// keeping a forward's gathers until the backward (reshard_after_forward off, shard_grad_op)
// holds every unit of the model at once, and whole_model is one unit.
TEST(MeshEngineMemory, FsdpSettingsShapeTheParameterPeak) {
  const Scenario s = mesh_dense();  // 4 layers: 6 block units
  const auto peak = [&](const FsdpOptions& f) {
    MeshOptions o = mesh({.dp = 2, .tp = 2});
    o.fsdp = f;
    std::size_t p = 0;
    for (const RankMemory& m : mesh_memory(s, o))
      p = std::max(p, of(m.peaks, comm::MemCategory::params));
    return p;
  };
  const std::size_t none = peak({.prefetch = 0});
  const std::size_t ahead = peak({.prefetch = 2});
  const std::size_t keep = peak({.reshard_after_forward = false, .prefetch = 0});
  const std::size_t grad_op = peak({.sharding = ShardingStrategy::shard_grad_op, .prefetch = 0});
  const std::size_t whole = peak({.wrap = WrapPolicy::whole_model, .prefetch = 0});
  std::printf("params peak: prefetch0 %zu prefetch2 %zu keep %zu shard_grad_op %zu whole %zu B\n",
              none, ahead, keep, grad_op, whole);
  EXPECT_LT(none, ahead);
  EXPECT_LT(ahead, keep);
  EXPECT_EQ(keep, grad_op);
  EXPECT_GE(whole, keep);
}

TEST(MeshEngineZero, ValidationAcceptsFsdpFullShardAndShardGradOp) {
  const Scenario s = mesh_dense();
  const auto refuses = [&](const MeshOptions& o, const char* needle) {
    try {
      validate_mesh(s.model, s.train, o);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const MeshConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refuses(zero(mesh({.dp = 2}), 4), "zero 4");
  MeshOptions f = mesh({.dp = 2, .tp = 2});
  f.fsdp = FsdpOptions{.sharding = ShardingStrategy::no_shard};
  refuses(f, "fsdp \"no_shard\" is built only on a data-parallel mesh");
  f.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 3};
  refuses(f, "shard_group_size 3 must be >= 1 and divide dp (2)");
  f.fsdp->shard_group_size = 1;
  EXPECT_NO_THROW(validate_mesh(s.model, s.train, f));
  f.fsdp = FsdpOptions{.prefetch = 3};
  refuses(f, "fsdp.prefetch 3 is not 0, 1 or 2");
  f.fsdp = FsdpOptions{};
  EXPECT_NO_THROW(validate_mesh(s.model, s.train, f));
  EXPECT_NO_THROW(validate_mesh(s.model, s.train, zero(f, 3)));
  refuses(zero(f, 2), "choose either zero (stage 2) or fsdp (\"full_shard\"), not both");
  f.fsdp = FsdpOptions{.sharding = ShardingStrategy::shard_grad_op};
  EXPECT_NO_THROW(validate_mesh(s.model, s.train, f));
  EXPECT_NO_THROW(validate_mesh(s.model, s.train, zero(mesh({.dp = 2, .tp = 2}), 3)));
  EXPECT_NO_THROW(validate_mesh(s.model, s.train, zero(mesh({.dp = 2, .tp = 2}), 2)));
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

// ZeRO-3 / FSDP: parameters sharded per wrap unit over each class's group, each unit gathered
// before its use in a chunk's forward and backward (prefetched, or kept from forward to backward).
TEST(MeshEngineZero, Zero3ParityWithTheReference) {
  MeshOptions fsdp = mesh({.dp = 2, .tp = 2, .pp = 2});
  fsdp.fsdp = FsdpOptions{};
  MeshOptions hybrid = mesh({.dp = 4, .tp = 2});
  hybrid.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard,
                            .reshard_after_forward = false,
                            .prefetch = 0,
                            .shard_group_size = 2};
  MeshOptions groups = mesh({.dp = 2, .pp = 2, .cp = 2});
  groups.fsdp = FsdpOptions{.wrap = WrapPolicy::layer_group, .blocks_per_unit = 2, .prefetch = 2};
  MeshOptions whole = mesh({.dp = 2, .tp = 2});
  whole.fsdp =
      FsdpOptions{.sharding = ShardingStrategy::shard_grad_op, .wrap = WrapPolicy::whole_model};
  MeshOptions inter = zero(mesh({.dp = 2, .pp = 2}), 3);
  inter.schedule = PipeSchedule::interleaved;
  inter.virtual_stages = 2;
  const std::vector<Case> cases = {
      {"dp2-tp2 zero3", zero(mesh({.dp = 2, .tp = 2}), 3)},
      {"dp2-tp2-pp2 fsdp full_shard", fsdp},
      {"dp2-pp2 interleaved zero3", inter},
      {"dp2-cp2 zero3", zero(mesh({.dp = 2, .cp = 2}), 3)},
      {"dp4-tp2 hybrid sg2 keep pf0", hybrid},
      {"dp2-pp2-cp2 layer_group pf2", groups},
      {"dp2-tp2 shard_grad_op whole", whole},
  };
  for (const Case& c : cases) {
    const Parity p = parity(mesh_dense(), c.options);
    EXPECT_LE(p.max(), test::kF64Tolerance) << c.name << ": " << p.worst;
    std::printf("%-28s f64 %.2e\n", c.name, p.max());
  }
  const Parity moe = parity(mesh_moe(), zero(mesh({.dp = 4, .ep = 2}), 3));
  EXPECT_LE(moe.max(), test::kF64Tolerance) << "moe dp2-ep2 zero3: " << moe.worst;
  std::printf("moe dp2-ep2 zero3           f64 %.2e\n", moe.max());
  Scenario bf = mesh_dense();
  bf.train.precision = ref::Precision::kBf16;
  const Parity p = parity(bf, zero(mesh({.dp = 2, .tp = 2, .pp = 2}), 3));
  EXPECT_LE(p.loss, 2e-2) << p.worst;
  EXPECT_LE(p.params, 1e-3) << p.worst;
  std::printf("bf16 dp2-tp2-pp2 zero3 loss %.2e params %.2e\n", p.loss, p.params);
}

// Between steps a ZeRO-3 rank holds about half the parameters of a ZeRO-0 one at dp 2 (padding:
// < D elements per class); during a chunk's use its gathered copy is on top.
TEST(MeshEngineZero, Zero3ShardsTheParameters) {
  const Scenario s = mesh_dense();
  const auto z0 = mesh_memory(s, mesh({.dp = 2, .tp = 2}));
  const auto z3 = mesh_memory(s, zero(mesh({.dp = 2, .tp = 2}), 3));
  for (std::size_t r = 0; r < z0.size(); ++r) {
    const std::size_t p0 = of(z0[r].after, comm::MemCategory::params);
    const std::size_t p3 = of(z3[r].after, comm::MemCategory::params);
    EXPECT_GE(2 * p3, p0);
    EXPECT_LE(2 * p3, p0 + 2 * 8);
    EXPECT_EQ(of(z3[r].model_state, comm::MemCategory::params), p3);
    EXPECT_GT(of(z3[r].peaks, comm::MemCategory::params), p3);
    EXPECT_LE(of(z3[r].peaks, comm::MemCategory::params), p3 + p0);
    if (r == 0)
      std::printf("dp2-tp2 rank 0 params between steps: zero0 %zu B, zero3 %zu B (peak %zu B)\n",
                  p0, p3, of(z3[r].peaks, comm::MemCategory::params));
  }
  // Interleaved (two chunks per stage): one chunk's parameters gathered at a time, never the
  // stage's whole set.
  MeshOptions inter = zero(mesh({.dp = 2, .pp = 2}), 3);
  inter.schedule = PipeSchedule::interleaved;
  inter.virtual_stages = 2;
  MeshOptions inter0 = inter;
  inter0.zero = 0;
  const auto i0 = mesh_memory(s, inter0), i3 = mesh_memory(s, inter);
  for (std::size_t r = 0; r < i0.size(); ++r) {
    const std::size_t p0 = of(i0[r].after, comm::MemCategory::params);
    const std::size_t p3 = of(i3[r].after, comm::MemCategory::params);
    EXPECT_LT(of(i3[r].peaks, comm::MemCategory::params), p3 + p0) << "rank " << r;
  }
}

}  // namespace
}  // namespace shardcheck::parallel
