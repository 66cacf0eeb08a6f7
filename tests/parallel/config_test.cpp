// ParallelConfig (parallel/config.hpp): the derived properties of each data-parallel alternative,
// the label's spelling, validate()'s fields, and the round trip to the engine's MeshOptions.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "parallel/config.hpp"
#include "parallel/mp/mesh_engine.hpp"

namespace shardcheck::parallel::test {
namespace {

ParallelConfig dp(int n, DataParallel d = Ddp{}) {
  ParallelConfig c;
  c.mesh.dp = n;
  c.data = d;
  return c;
}

std::string field_of(const ParallelConfig& c) {
  const std::optional<ConfigError> e = validate(c);
  return e ? e->field : "";
}

TEST(ParallelConfig, DerivedPropertiesOfEachAlternative) {
  const ParallelConfig ddp = dp(2);
  EXPECT_EQ(ddp.zero_stage(), 0);
  EXPECT_FALSE(ddp.shards_params());
  EXPECT_EQ(ddp.strategy_name(), "ddp");
  EXPECT_EQ(ddp.bucket_elems(), std::size_t{1} << 20);

  for (int stage = 1; stage <= 3; ++stage) {
    const ParallelConfig z = dp(2, Zero{.stage = stage, .bucket_elems = 500});
    EXPECT_EQ(z.zero_stage(), stage);
    EXPECT_EQ(z.zero_given(), stage);
    EXPECT_EQ(z.shards_params(), stage == 3);
    EXPECT_FALSE(z.keeps_params_after_forward());
    EXPECT_EQ(z.strategy_name(), "zero" + std::to_string(stage));
    EXPECT_EQ(z.bucket_elems(), 500u);
  }

  const ParallelConfig full = dp(4, Fsdp{});
  EXPECT_EQ(full.zero_stage(), 3);
  EXPECT_EQ(full.zero_given(), 0);
  EXPECT_TRUE(full.shards_params());
  EXPECT_FALSE(full.keeps_params_after_forward());
  EXPECT_FALSE(full.hybrid());
  EXPECT_EQ(full.strategy_name(), "fsdp");
  EXPECT_EQ(full.data_parallel_words(), "fsdp full_shard");

  const ParallelConfig no_shard = dp(4, Fsdp{.sharding = ShardingStrategy::no_shard});
  EXPECT_EQ(no_shard.zero_stage(), 0);
  EXPECT_FALSE(no_shard.shards_params());
  EXPECT_TRUE(no_shard.no_shard());

  EXPECT_TRUE(
      dp(4, Fsdp{.sharding = ShardingStrategy::shard_grad_op}).keeps_params_after_forward());
  EXPECT_TRUE(dp(4, Fsdp{.reshard_after_forward = false}).keeps_params_after_forward());
  EXPECT_TRUE(dp(4, Fsdp{.sharding = ShardingStrategy::hybrid_shard}).hybrid());
}

TEST(ParallelConfig, LabelSpellsEverySetting) {
  EXPECT_EQ(ParallelConfig{}.label(), "single");
  EXPECT_EQ(dp(2, Zero{.stage = 3}).label(), "dp2-zero3");
  ParallelConfig c = dp(8, Fsdp{.sharding = ShardingStrategy::hybrid_shard,
                                .wrap = WrapPolicy::layer_group,
                                .blocks_per_unit = 3,
                                .reshard_after_forward = false,
                                .prefetch = 2,
                                .shard_group_size = 4});
  EXPECT_EQ(c.label(), "dp8-fsdp_hybrid_shard-wrap3-noreshard-pf2-sg4");
  c.data = Fsdp{.wrap = WrapPolicy::whole_model, .prefetch = 0};
  EXPECT_EQ(c.label(), "dp8-fsdp_full_shard-wrapall-pf0");
  ParallelConfig m;
  m.mesh = {.dp = 2, .tp = 2, .pp = 2, .cp = 2};
  m.sequence_parallel = true;
  m.pp_schedule = PipeSchedule::interleaved;
  m.virtual_stages = 2;
  m.cp_algo = CpAlgo::ulysses;
  EXPECT_EQ(m.label(), "dp2-tp2-pp2-cp2-sp-interleavedx2-ulysses");
  m.order = "pp-tp-cp-ep-dp";
  EXPECT_NE(m.label().find("-order_pp_tp"), std::string::npos) << m.label();
  EXPECT_EQ(name_of(PipeSchedule::one_f_one_b), "1f1b");
}

TEST(ParallelConfig, ValidateNamesTheField) {
  EXPECT_EQ(field_of(dp(2)), "");
  EXPECT_EQ(field_of(dp(0)), "dp");
  EXPECT_EQ(field_of(dp(2, Zero{.stage = 4})), "zero");
  EXPECT_EQ(field_of(dp(2, Fsdp{.prefetch = 3})), "fsdp.prefetch");
  EXPECT_EQ(field_of(dp(2, Fsdp{.wrap = WrapPolicy::layer_group, .blocks_per_unit = 0})),
            "fsdp.blocks_per_unit");
  // A shard group must divide dp; 0 is "ranks per node", resolved by mesh_options.
  EXPECT_EQ(
      field_of(dp(6, Fsdp{.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 4})),
      "fsdp.shard_group_size");
  EXPECT_EQ(field_of(dp(6, Fsdp{.sharding = ShardingStrategy::hybrid_shard})), "");
  ParallelConfig tp = dp(2, Fsdp{.sharding = ShardingStrategy::no_shard});
  tp.mesh.tp = 2;
  const std::optional<ConfigError> e = validate(tp);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->field, "fsdp");
  EXPECT_TRUE(e->not_built);
  ParallelConfig v = dp(2);
  v.virtual_stages = 2;
  EXPECT_EQ(field_of(v), "virtual_stages");
  v.pp_schedule = PipeSchedule::interleaved;
  EXPECT_EQ(field_of(v), "");
  v.order = "tp-tp";
  EXPECT_EQ(field_of(v), "order");
}

TEST(ParallelConfig, MeshOptionsRoundTrip) {
  const ParallelConfig h = dp(16, Fsdp{.sharding = ShardingStrategy::hybrid_shard, .prefetch = 2});
  const MeshOptions o = mesh_options(h, 8);
  ASSERT_TRUE(o.fsdp);
  EXPECT_EQ(o.fsdp->shard_group_size, 8);  // gcd(dp, ranks per node)
  EXPECT_EQ(o.fsdp->prefetch, 2);
  EXPECT_EQ(o.zero, 0);
  const DataParallelRules r = data_parallel_rules(o);
  EXPECT_EQ(r.zero, 3);
  EXPECT_TRUE(r.hybrid_shard);
  EXPECT_FALSE(r.ddp_overlap);

  const MeshOptions z1 = mesh_options(dp(2, Zero{.stage = 1, .bucket_elems = 500}), 8);
  EXPECT_EQ(z1.zero, 1);
  EXPECT_EQ(z1.bucket_elems, 500u);
  EXPECT_TRUE(data_parallel_rules(z1).ddp_overlap);
  EXPECT_TRUE(std::holds_alternative<Zero>(data_parallel_of(z1)));

  const MeshOptions d = mesh_options(dp(2, Ddp{.bucket_elems = 7, .overlap = false}), 8);
  EXPECT_FALSE(d.overlap);
  EXPECT_FALSE(data_parallel_rules(d).ddp_overlap);
  EXPECT_EQ(std::get<Ddp>(data_parallel_of(d)).bucket_elems, 7u);
}

}  // namespace
}  // namespace shardcheck::parallel::test
