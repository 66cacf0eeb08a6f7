// The op table (comm/ops.hpp): names round-trip, the nccl-tests busbw factors, the buffer layouts,
// and the simulator's byte and alpha-beta rules written out by hand for each collective.
#include <gtest/gtest.h>

#include "comm/ops.hpp"

namespace shardcheck::comm {
namespace {

TEST(Ops, NamesRoundTrip) {
  for (const OpInfo& i : kOps) {
    EXPECT_EQ(name_of(i.op), i.name);
    EXPECT_EQ(op_named(i.name), i.op);
  }
  EXPECT_FALSE(op_named("all_reduce_v").has_value());
  EXPECT_TRUE(is_communication(Op::barrier));
  EXPECT_TRUE(is_communication(Op::send));
  EXPECT_FALSE(is_communication(Op::split));
  EXPECT_FALSE(is_communication(Op::wait));
}

TEST(Ops, BusBandwidthFactorsOfNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(Op::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::all_to_all, 2), 0.5);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(Op::reduce, 8), 1.0);
}

TEST(Ops, Layouts) {
  EXPECT_EQ(counts_for(Op::all_reduce, 12, 4).send, 12u);
  EXPECT_EQ(counts_for(Op::all_gather, 12, 4).send, 3u);
  EXPECT_EQ(counts_for(Op::all_gather, 12, 4).recv, 12u);
  EXPECT_EQ(counts_for(Op::reduce_scatter, 12, 4).recv, 3u);
  EXPECT_EQ(counts_for(Op::all_to_all, 12, 4).recv, 12u);
  EXPECT_TRUE(splits_by_rank(Op::all_to_all));
  EXPECT_FALSE(splits_by_rank(Op::broadcast));
}

TEST(Ops, SimulatorCostRules) {
  const double a = 3e-6, b = 1e-10, p = 4, bytes = 1 << 20;
  EXPECT_EQ(cost_bytes(Op::all_reduce, 100, 4, p), 400.0);
  EXPECT_EQ(cost_bytes(Op::reduce_scatter, 100, 4, p), 1600.0);
  EXPECT_EQ(cost_bytes(Op::all_to_all, 100, 4, p), 300.0);
  EXPECT_EQ(cost_bytes(Op::barrier, 100, 4, p), 0.0);
  EXPECT_EQ(cost_bytes(Op::reduce, 100, 4, p), 400.0);  // the buffer, as broadcast
  EXPECT_EQ(link_seconds(Op::reduce, 4, bytes, a, b), link_seconds(Op::broadcast, 4, bytes, a, b));
  EXPECT_EQ(link_seconds(Op::reduce, 4, bytes, a, b), 3.0 * a + bytes * b);
  EXPECT_TRUE(info(Op::reduce).reduces && info(Op::reduce).rooted);
  EXPECT_EQ(link_seconds(Op::all_reduce, 4, bytes, a, b), 2 * 3.0 * a + 2 * (3.0 / 4) * bytes * b);
  EXPECT_EQ(link_seconds(Op::all_gather, 4, bytes, a, b), 3.0 * a + (3.0 / 4) * bytes * b);
  EXPECT_EQ(link_seconds(Op::all_to_all_v, 4, bytes, a, b), 3.0 * a + bytes * b);
  EXPECT_EQ(link_seconds(Op::send, 2, bytes, a, b), a + bytes * b);
  EXPECT_EQ(link_seconds(Op::barrier, 4, bytes, a, b), 2 * 3.0 * a);
  EXPECT_EQ(link_seconds(Op::split, 4, bytes, a, b), 0.0);
  EXPECT_EQ(link_seconds(Op::all_reduce, 1, bytes, a, b), 0.0);
}

}  // namespace
}  // namespace shardcheck::comm
