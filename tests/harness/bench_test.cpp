// The collective benchmark's #wrong column: zero on a correct backend for every op and dtype, and
// non-zero when a bug is planted in the simulator (so the column can fail).
#include <gtest/gtest.h>

#include "harness/bench_collectives.hpp"
#include "sim/testing.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {
namespace {

BenchResult small_bench(int ranks, BenchOp op, comm::DType dt, comm::ReduceOp redop,
                        sim::testing::Mutation planted = sim::testing::Mutation::none) {
  sim::SimOptions so;
  so.planted = planted;
  sim::SimWorld w(ranks, so);
  BenchOptions o;
  o.op = op;
  o.dtype = dt;
  o.redop = redop;
  o.min_bytes = 64;
  o.max_bytes = 8192;
  o.warmup = 1;
  o.iters = 2;
  return bench_collectives([&w](const auto& fn) { w.run(fn); }, "sim", ranks, o);
}

TEST(BenchCollectives, NoWrongElementsOnEveryOpAndDtype) {
  for (BenchOp op : {BenchOp::all_reduce, BenchOp::all_gather, BenchOp::reduce_scatter,
                     BenchOp::all_to_all, BenchOp::broadcast})
    for (comm::DType dt : comm::kAllDTypes)
      for (comm::ReduceOp redop : {comm::ReduceOp::sum, comm::ReduceOp::avg, comm::ReduceOp::prod,
                                   comm::ReduceOp::max, comm::ReduceOp::min}) {
        const BenchResult r = small_bench(3, op, dt, redop);
        ASSERT_EQ(r.rows.size(), 8u);
        EXPECT_EQ(r.total_wrong(), 0u)
            << name_of(op) << " " << comm::name_of(dt) << " " << comm::name_of(redop);
        for (const auto& row : r.rows) {
          EXPECT_EQ(row.bytes, row.count * comm::size_of(dt));
          EXPECT_GT(row.out_of_place.time_us, 0.0);
          EXPECT_NEAR(row.in_place.busbw_gbps, row.in_place.algbw_gbps * bus_factor(op, 3), 1e-9);
        }
      }
}

TEST(BenchCollectives, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::all_to_all, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::broadcast, 8), 1.0);
}

TEST(BenchCollectives, PlantedBugsShowUpAsWrongElements) {
  const auto planted = sim::testing::Mutation::skip_last_element_of_chunk;
  EXPECT_GT(small_bench(4, BenchOp::all_reduce, comm::DType::f32, comm::ReduceOp::sum, planted)
                .total_wrong(),
            0u);
  EXPECT_GT(small_bench(4, BenchOp::reduce_scatter, comm::DType::i32, comm::ReduceOp::max, planted)
                .total_wrong(),
            0u);
  EXPECT_EQ(
      small_bench(4, BenchOp::all_reduce, comm::DType::f32, comm::ReduceOp::sum).total_wrong(), 0u);
}

}  // namespace
}  // namespace shardcheck::harness
