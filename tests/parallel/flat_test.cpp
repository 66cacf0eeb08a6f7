// FlatLayout bookkeeping (shards, padding, segments, buckets) as properties over random shapes,
// and the collectives each strategy issues per step with their element counts (the list that
// parallel/README.md documents).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <numeric>

#include "parallel/flat.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/layerwise.hpp"
#include "reference/model.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel {
namespace {

std::vector<std::pair<std::string, ref::Shape>> shapes_of(
    const std::vector<std::vector<int>>& dims) {
  std::vector<std::pair<std::string, ref::Shape>> out;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    ref::Shape s;
    for (int d : dims[i]) s.push_back(d);
    out.push_back({"p" + std::to_string(i), s});
  }
  return out;
}

TEST(FlatLayout, SmallExampleWithPadding) {
  const FlatLayout l(shapes_of({{2, 3}, {5}, {1, 2}}), 4);  // N = 13
  EXPECT_EQ(l.numel(), 13u);
  EXPECT_EQ(l.shard_numel(), 4u);
  EXPECT_EQ(l.padded_numel(), 16u);
  EXPECT_EQ(l.padding(), 3u);
  EXPECT_EQ(l.shard(1), (Range{4, 8}));
  const auto seg = l.segments(l.shard(1));  // p0[4..6), p1[0..2)
  ASSERT_EQ(seg.size(), 2u);
  EXPECT_EQ(seg[0].param->name, "p0");
  EXPECT_EQ(seg[0].param_begin, 4u);
  EXPECT_EQ(seg[0].count, 2u);
  EXPECT_EQ(seg[1].param->name, "p1");
  EXPECT_EQ(seg[1].flat_begin, 6u);
  EXPECT_TRUE(l.params()[0].decay);
  EXPECT_FALSE(l.params()[1].decay);
  EXPECT_TRUE(l.segments(l.shard(3)).empty() == false);  // element 12 then padding
  EXPECT_EQ(l.buckets(6), (std::vector<Range>{{6, 13}, {0, 6}}));
  EXPECT_EQ(l.buckets(0), (std::vector<Range>{{11, 13}, {6, 11}, {0, 6}}));
  EXPECT_EQ(l.buckets(100), (std::vector<Range>{{0, 13}}));
}

RC_GTEST_PROP(FlatLayout, ShardsAndBucketsPartitionTheParameters, ()) {
  const auto dims = *rc::gen::nonEmpty(
      rc::gen::container<std::vector<std::vector<int>>>(rc::gen::container<std::vector<int>>(
          *rc::gen::inRange<std::size_t>(1, 3), rc::gen::inRange(1, 9))));
  const int shards = *rc::gen::inRange(1, 10);
  const auto bucket = *rc::gen::inRange<std::size_t>(0, 200);
  const FlatLayout l(shapes_of(dims), shards);
  RC_ASSERT(l.padded_numel() % static_cast<std::size_t>(shards) == 0);
  RC_ASSERT(l.padding() < static_cast<std::size_t>(shards));
  // Shards tile [0, P); their segments cover every real element exactly once, in order.
  std::size_t next = 0;
  for (int r = 0; r < shards; ++r) {
    RC_ASSERT(l.shard(r).begin == static_cast<std::size_t>(r) * l.shard_numel());
    for (const Segment& s : l.segments(l.shard(r))) {
      RC_ASSERT(s.flat_begin == next);
      RC_ASSERT(s.flat_begin == s.param->offset + s.param_begin);
      RC_ASSERT(s.param_begin + s.count <= s.param->numel);
      next += s.count;
    }
  }
  RC_ASSERT(next == l.numel());
  // Buckets: reverse order, contiguous, on parameter boundaries, full except the last.
  const auto b = l.buckets(bucket);
  std::size_t end = l.numel();
  for (std::size_t i = 0; i < b.size(); ++i) {
    RC_ASSERT(b[i].end == end);
    RC_ASSERT(b[i].begin < b[i].end);
    if (i + 1 < b.size()) RC_ASSERT(b[i].size() >= bucket);
    bool boundary = false;
    for (const FlatParam& p : l.params()) boundary = boundary || p.offset == b[i].begin;
    RC_ASSERT(boundary);
    end = b[i].begin;
  }
  RC_ASSERT(end == 0u);
}

TEST(FlatLayout, PackUnpackRoundTrip) {
  const ref::ModelConfig m = test::moe_setup().model;
  const auto params = ref::init_params<double>(m, 3);
  const FlatLayout l(ref::param_shapes(m), 3);
  std::vector<double> flat(l.padded_numel(), 0.0);
  l.pack(params, std::span<double>(flat));
  auto back = l.zeros<double>();
  l.unpack(std::span<const double>(flat), back);
  for (const auto& e : params) EXPECT_EQ(back[e.name].vec(), e.value.vec()) << e.name;
}

// The per-step collective list of each strategy (what parallel/README.md states), built here
// from the layouts and the residency plan independently of the engine's code.
struct StrategyCase {
  Strategy strategy;
  Zero3Gather gather = Zero3Gather::per_layer;
};

TEST(DataParallelEngine, CollectivesPerStep) {
  const test::Scenario s = test::dense_setup();
  const ref::Dataset ds = test::dataset_of(s);
  constexpr int kWorld = 3;
  constexpr std::size_t kBucket = 500;
  const std::vector<StrategyCase> cases{{Strategy::ddp},
                                        {Strategy::zero1},
                                        {Strategy::zero2},
                                        {Strategy::zero3, Zero3Gather::whole_model},
                                        {Strategy::zero3, Zero3Gather::per_layer}};
  for (const StrategyCase& sc : cases) {
    const Strategy st = sc.strategy;
    sim::SimWorld(kWorld).run([&](comm::Communicator& c) {
      DataParallelEngine e(c, s.model, s.train, s.seed,
                           {.strategy = st, .zero3_gather = sc.gather, .bucket_elems = kBucket});
      ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                      s.seed, true);
      e.step(rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size()));
      const FlatLayout& l = e.layout();
      const std::size_t n = l.numel(), p = l.padded_numel(), shard = l.shard_numel();
      const int microbatches = s.train.global_batch / kWorld / s.train.micro_batch;
      using comm::DType;
      std::vector<CollectiveCall> want{
          {"all_reduce", "mask tokens, sequences, non-padding tokens", 3, DType::i64}};
      std::vector<FlatLayout> units;  // ZeRO-3: one sharded buffer per wrap unit
      const WrapPolicy wrap =
          sc.gather == Zero3Gather::per_layer ? WrapPolicy::block : WrapPolicy::whole_model;
      if (st == Strategy::zero3)
        for (const auto& w : wrap_units(s.model, wrap, 1)) {
          std::vector<std::pair<std::string, ref::Shape>> shapes;
          for (int u : w)
            for (auto& x : unit_shapes(s.model, u)) shapes.push_back(x);
          units.emplace_back(shapes, kWorld);
        }
      const auto gather = [&](int w) {
        return CollectiveCall{"all_gather", "parameters (one unit)",
                              units[static_cast<std::size_t>(w)].padded_numel(), DType::f64};
      };
      const auto scatter = [&](std::size_t count) {
        return CollectiveCall{"reduce_scatter", "gradients to owners", count, DType::f64};
      };
      if (st == Strategy::ddp || st == Strategy::zero1) {
        std::size_t total = 0;  // all in the last microbatch's backward, in bucket order
        for (const Range& b : l.buckets(kBucket)) {
          want.push_back({"all_reduce", "gradient bucket", b.size(), DType::f64});
          total += b.size();
        }
        EXPECT_EQ(total, n);
        EXPECT_GE(l.buckets(kBucket).size(), 3u);
      } else if (st == Strategy::zero2) {
        for (int k = 0; k < microbatches; ++k) want.push_back(scatter(p));
      } else if (sc.gather == Zero3Gather::whole_model) {
        for (int k = 0; k < microbatches; ++k) {
          want.push_back(gather(0));  // kept through the microbatch's backward
          want.push_back(scatter(units[0].padded_numel()));
        }
      } else {
        const int layers = s.model.layers, head = layers + 1;
        for (int k = 0; k < microbatches; ++k) {
          for (int u = 0; u <= head; ++u) want.push_back(gather(u));  // forward, resharded
          if (s.model.tie_embeddings) want.push_back(gather(0));      // the head's LM weight
          want.push_back(scatter(units[static_cast<std::size_t>(head)].padded_numel()));
          for (int u = layers; u >= 1; --u) {  // backward: gather, then the unit's gradient
            want.push_back(gather(u));
            want.push_back(scatter(units[static_cast<std::size_t>(u)].padded_numel()));
          }
          want.push_back(scatter(units[0].padded_numel()));  // the embedding's, last
        }
      }
      if (st != Strategy::ddp && st != Strategy::zero1)
        want.push_back({"all_reduce", "squared gradient norm", 1, DType::f64});
      want.push_back({"all_reduce", "loss sum, aux sum", 2, DType::f64});
      if (st == Strategy::zero1 || st == Strategy::zero2)
        want.push_back({"all_gather", "updated parameters", p, DType::f64});
      EXPECT_EQ(e.last_step_collectives(), want)
          << name_of(st) << " " << static_cast<int>(sc.gather);
      // Resident state between steps (elements): what each stage shards.
      std::size_t unit_shards = 0;
      for (const FlatLayout& u : units) unit_shards += u.shard_numel();
      EXPECT_EQ(e.resident_param_elems(), st == Strategy::zero3 ? unit_shards : p) << name_of(st);
      EXPECT_EQ(e.resident_optimizer_elems(), 2 * (st == Strategy::ddp     ? n
                                                   : st == Strategy::zero3 ? unit_shards
                                                                           : shard))
          << name_of(st);
    });
  }
}

TEST(Layerwise, UnitsPartitionTheParameters) {
  for (const test::Scenario& s : {test::dense_setup(), test::moe_setup()}) {
    std::size_t total = 0;
    for (int u = 0; u < unit_count(s.model); ++u)
      for (const auto& [name, shape] : unit_shapes(s.model, u)) {
        EXPECT_EQ(unit_of(s.model, name), u) << name;
        total += static_cast<std::size_t>(ref::numel_of(shape));
      }
    EXPECT_EQ(total, FlatLayout(ref::param_shapes(s.model), 1).numel()) << s.name;
    EXPECT_EQ(unit_of(s.model, "layers.1.moe.router"), 2);
    EXPECT_EQ(unit_of(s.model, "final_norm.weight"), s.model.layers + 1);
  }
}

}  // namespace
}  // namespace shardcheck::parallel
