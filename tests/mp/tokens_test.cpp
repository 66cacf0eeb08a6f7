// TokenLayout: causal load balancing (chunks r and 2cp-1-r), SP split, and the row movers on the
// simulator (gather_sequence reassembles the sequence from every rank's rows, in global order).
#include "parallel/mp/tokens.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "comm/mesh.hpp"
#include "sim/world.hpp"

namespace shardcheck::parallel {
namespace {

TEST(TokenLayout, CausalLoadBalancingPairsFrontAndMirrorChunks) {
  const TokenLayout l(16, 4, 1, false);
  EXPECT_EQ(l.cp_rows(0), (std::vector<int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(l.cp_rows(1), (std::vector<int64_t>{2, 3, 12, 13}));
  EXPECT_EQ(l.cp_rows(3), (std::vector<int64_t>{6, 7, 8, 9}));
  // Every row exactly once.
  std::vector<int64_t> all;
  for (int r = 0; r < 4; ++r) {
    const auto rows = l.cp_rows(r);
    all.insert(all.end(), rows.begin(), rows.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> want(16);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(all, want);
}

TEST(TokenLayout, SequenceParallelSplitsACpRanksRows) {
  const TokenLayout l(16, 2, 2, true);
  EXPECT_EQ(l.rows(0, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(l.rows(0, 1), (std::vector<int64_t>{12, 13, 14, 15}));
  EXPECT_EQ(l.rows(1, 1), (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(TokenLayout(16, 2, 2, false).rows(1, 1), TokenLayout(16, 2, 2, false).cp_rows(1));
}

TEST(TokenLayout, IndivisibleShapesAreNamed) {
  EXPECT_THROW(TokenLayout(12, 4, 1, false), LayoutError);  // 12 % 8
  EXPECT_THROW(TokenLayout(12, 2, 4, true), LayoutError);   // 6 rows over tp 4
  try {
    TokenLayout(12, 4, 1, false);
  } catch (const LayoutError& e) {
    EXPECT_NE(std::string(e.what()).find("2*cp = 8"), std::string::npos) << e.what();
  }
}

TEST(TokenLayout, GatherSequenceReassemblesEveryRanksRows) {
  const comm::DeviceMesh mesh({.tp = 2, .cp = 2}, "tp-cp");
  const TokenLayout l(8, 2, 2, true);
  sim::SimWorld(4).run([&](comm::Communicator& world) {
    comm::MeshGroups g = comm::build_groups(mesh, world);
    const auto rows = l.rows(g.cp->rank(), g.tp->rank());
    ref::Tensor<double> local({static_cast<int64_t>(rows.size()), 3});
    for (std::size_t i = 0; i < rows.size(); ++i) {
      for (int c = 0; c < 3; ++c) local.at(static_cast<int64_t>(i), c) = 10.0 * rows[i] + c;
    }
    const ref::Tensor<double> full = gather_sequence(l, *g.cp, g.tp.get(), local);
    ASSERT_EQ(full.shape(), (ref::Shape{8, 3}));
    for (int64_t t = 0; t < 8; ++t) {
      for (int c = 0; c < 3; ++c) EXPECT_EQ(full.at(t, c), 10.0 * t + c);
    }
    // take_rows of the full tensor gives back the local rows.
    EXPECT_EQ(take_rows(full, rows).vec(), local.vec());
  });
}

}  // namespace
}  // namespace shardcheck::parallel
