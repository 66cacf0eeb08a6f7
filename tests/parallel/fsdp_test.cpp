// FSDP against the single-device reference: wrap units, sharding strategies, reshard after
// forward, prefetch depth and hybrid shard, f64 parity at DP 1..8 on dense and MoE (accumulation,
// clipping, uneven shards), and the prefetch depth's effect on the tracked all-gather peak.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <ostream>

#include "parallel/ledger.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

const Trace& fsdp_reference(const Scenario& s) {
  static std::map<std::string, Trace> cache;
  auto it = cache.find(s.name);
  if (it == cache.end()) it = cache.emplace(s.name, reference_run(s)).first;
  return it->second;
}

struct FsdpCase {
  std::string name;
  FsdpOptions fsdp;
  int world = 1;
  bool moe = false;
};

void PrintTo(const FsdpCase& c, std::ostream* os) {
  *os << c.name;
}

std::vector<FsdpCase> cases() {
  using SS = ShardingStrategy;
  using WP = WrapPolicy;
  struct Config {
    std::string name;
    FsdpOptions o;
    std::vector<int> worlds;
  };
  const std::vector<Config> configs{
      {"full_block_pf1",
       {.sharding = SS::full_shard, .wrap = WP::block, .prefetch = 1},
       {1, 2, 3, 4, 8}},
      {"full_group2_keep_pf2",
       {.sharding = SS::full_shard,
        .wrap = WP::layer_group,
        .blocks_per_unit = 2,
        .reshard_after_forward = false,
        .prefetch = 2},
       {2, 3}},
      {"grad_op_block_pf0",
       {.sharding = SS::shard_grad_op, .wrap = WP::block, .prefetch = 0},
       {3, 8}},
      {"no_shard_block", {.sharding = SS::no_shard, .wrap = WP::block}, {2, 4}},
      {"full_whole_model", {.sharding = SS::full_shard, .wrap = WP::whole_model}, {4}},
      {"hybrid_2x2", {.sharding = SS::hybrid_shard, .prefetch = 1, .shard_group_size = 2}, {4}},
      {"hybrid_3x2", {.sharding = SS::hybrid_shard, .prefetch = 2, .shard_group_size = 3}, {6}},
      {"hybrid_4x2", {.sharding = SS::hybrid_shard, .prefetch = 1, .shard_group_size = 4}, {8}},
      {"hybrid_2x4", {.sharding = SS::hybrid_shard, .prefetch = 0, .shard_group_size = 2}, {8}},
  };
  std::vector<FsdpCase> out;
  for (const Config& c : configs)
    for (bool moe : {false, true})
      for (int w : c.worlds)
        out.push_back({std::string(moe ? "moe_" : "dense_") + c.name + "_dp" + std::to_string(w),
                       c.o, w, moe});
  return out;
}

class FsdpParity : public ::testing::TestWithParam<FsdpCase> {};

TEST_P(FsdpParity, F64MatchesReferenceEveryStep) {
  const FsdpCase& c = GetParam();
  const Scenario s = c.moe ? moe_setup() : dense_setup();
  DataParallelOptions o{.strategy = Strategy::fsdp};
  o.fsdp = c.fsdp;
  const DpRun got = dp_run(s, c.world, o);
  const Parity p = compare(fsdp_reference(s), got);
  std::printf("parity fsdp %s: loss %.2e params %.2e\n", c.name.c_str(), p.loss, p.params);
  EXPECT_LE(p.max(), kF64Tolerance) << "worst: " << p.worst;
  for (std::size_t r = 1; r < got.ranks.size(); ++r)
    for (const auto& e : got.ranks[0].params.back())
      ASSERT_EQ(got.ranks[r].params.back()[e.name].vec(), e.value.vec()) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Configs, FsdpParity, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<FsdpCase>& i) { return i.param.name; });

// Uneven shards are exercised: some wrap unit is padded (dense at DP 4 and 8, MoE at DP 3).
TEST(FsdpSetup, UnevenUnitsArePadded) {
  for (const auto& [s, d] : {std::pair{dense_setup(), 4}, {dense_setup(), 8}, {moe_setup(), 3}}) {
    EXPECT_GT(
        mesh_ledger(s.model, s.train, dp_mesh(d, {.strategy = Strategy::fsdp}), 0).padding_elems,
        0u)
        << s.name << " dp" << d;
  }
}

// Prefetch depth 0, 1, 2 (and keeping forward's gather) raise the peak of unsharded parameters
// held at once; the tracker's peak equals the residency plan's (the ledger's all-gather peak).
TEST(FsdpMemory, PrefetchDepthRaisesTheTrackedGatherPeak) {
  const Scenario s = dense_setup();
  std::vector<std::size_t> peaks;
  for (int depth : {0, 1, 2}) {
    for (bool reshard : {true, false}) {
      DataParallelOptions o{.strategy = Strategy::fsdp};
      o.fsdp = {.wrap = WrapPolicy::block, .reshard_after_forward = reshard, .prefetch = depth};
      const DpRun got = dp_run(s, 4, o);
      EXPECT_LE(compare(fsdp_reference(s), got).max(), kF64Tolerance);
      const std::size_t held =
          got.category_peaks[comm::MemCategory::params] - got.resident_params * sizeof(double);
      const LedgerRow row = mesh_ledger(s.model, s.train, dp_mesh(4, o), 0);
      std::printf("fsdp dp4 prefetch %d reshard %d: gathered peak %zu B (ledger %zu B)\n", depth,
                  reshard, held, row.gather_peak);
      EXPECT_EQ(held, row.gather_peak) << "prefetch " << depth << " reshard " << reshard;
      if (reshard) peaks.push_back(held);
    }
  }
  EXPECT_LT(peaks[0], peaks[1]);
  EXPECT_LT(peaks[1], peaks[2]);
}

TEST(FsdpOptionsCheck, RefusesBadHybridAndPrefetch) {
  const Scenario s = dense_setup();
  sim::SimWorld(4).run([&](comm::Communicator& c) {
    DataParallelOptions o{.strategy = Strategy::fsdp};
    o.fsdp = {.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 3};
    EXPECT_THROW(MeshEngine(c, s.model, s.train, 1, dp_mesh(4, o)), MeshConfigError);
    o.fsdp = {.prefetch = 3};
    EXPECT_THROW(MeshEngine(c, s.model, s.train, 1, dp_mesh(4, o)), MeshConfigError);
  });
}

}  // namespace
}  // namespace shardcheck::parallel::test
