// Planted data-parallel bugs (parallel::testing::Mutation) that the parity check must catch: each
// case runs the same configuration with and without the bug and asserts that parity passes
// without it and fails with it.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <tuple>

#include "parallel/testing.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

using testing::Mutation;

struct Case {
  const char* name;
  Mutation mutation;
  Strategy strategy;
  int world;
  bool moe = false;
  FsdpOptions fsdp{};  // Strategy::fsdp
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class PlantedBug : public ::testing::TestWithParam<Case> {};

TEST_P(PlantedBug, ParityCatchesIt) {
  const Case& c = GetParam();
  const Scenario s = c.moe ? moe_setup() : dense_setup();
  const Trace want = reference_run(s);
  DataParallelOptions o{.strategy = c.strategy, .bucket_elems = 500};
  o.fsdp = c.fsdp;
  const Parity clean = compare(want, dp_run(s, c.world, o));
  o.planted = c.mutation;
  const Parity bad = compare(want, dp_run(s, c.world, o));
  std::printf("mutation %s (%s dp%d): clean %.2e, planted %.2e at %s\n", c.name,
              std::string(name_of(c.strategy)).c_str(), c.world, clean.max(), bad.max(),
              bad.worst.c_str());
  EXPECT_LE(clean.max(), kF64Tolerance) << clean.worst;
  EXPECT_GT(bad.max(), kF64Tolerance) << "the planted bug went unnoticed";
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name;
}

// Wrong shard offsets differ from the right ones only when N % D != 0: dense at DP 4 is uneven.
INSTANTIATE_TEST_SUITE_P(
    DataParallel, PlantedBug,
    ::testing::Values(
        Case{"mean_of_rank_means_ddp", Mutation::kMeanOfRankMeans, Strategy::ddp, 4},
        Case{"mean_of_rank_means_zero3_moe", Mutation::kMeanOfRankMeans, Strategy::zero3, 3, true},
        Case{"local_norm_clip_ddp", Mutation::kLocalNormClip, Strategy::ddp, 2},
        Case{"local_norm_clip_zero2", Mutation::kLocalNormClip, Strategy::zero2, 4},
        Case{"local_norm_clip_zero3", Mutation::kLocalNormClip, Strategy::zero3, 3},
        Case{"skip_bucket_ddp", Mutation::kSkipBucket, Strategy::ddp, 2},
        Case{"skip_bucket_zero1", Mutation::kSkipBucket, Strategy::zero1, 3, true},
        Case{"wrong_shard_offset_zero1", Mutation::kWrongShardOffset, Strategy::zero1, 4},
        Case{"wrong_shard_offset_zero2", Mutation::kWrongShardOffset, Strategy::zero2, 4},
        Case{"wrong_shard_offset_zero3", Mutation::kWrongShardOffset, Strategy::zero3, 4},
        Case{"wrong_shard_offset_zero3_dp8", Mutation::kWrongShardOffset, Strategy::zero3, 8},
        Case{"same_samples_ddp", Mutation::kSameSamples, Strategy::ddp, 4},
        Case{"same_samples_zero2_moe", Mutation::kSameSamples, Strategy::zero2, 2, true},
        Case{"mean_of_rank_means_fsdp", Mutation::kMeanOfRankMeans, Strategy::fsdp, 4},
        Case{"local_norm_clip_fsdp_hybrid",
             Mutation::kLocalNormClip,
             Strategy::fsdp,
             4,
             true,
             {.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 2}},
        Case{"skip_unit_fsdp", Mutation::kSkipBucket, Strategy::fsdp, 3, false, {.prefetch = 2}},
        Case{"wrong_shard_offset_fsdp",
             Mutation::kWrongShardOffset,
             Strategy::fsdp,
             8,
             false,
             {.wrap = WrapPolicy::layer_group, .blocks_per_unit = 2}},
        Case{"same_samples_fsdp_moe",
             Mutation::kSameSamples,
             Strategy::fsdp,
             2,
             true,
             {.sharding = ShardingStrategy::shard_grad_op}}),
    case_name);

}  // namespace
}  // namespace shardcheck::parallel::test
