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
