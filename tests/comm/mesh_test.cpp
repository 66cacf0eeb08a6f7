// DeviceMesh: coordinates and groups follow the order string (fastest axis first), bad meshes are
// refused with a message naming what is wrong, and the printed table lists every rank's groups.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "comm/mesh.hpp"

namespace shardcheck::comm {
namespace {

using V = std::vector<int>;

TEST(DeviceMesh, MegatronOrderPutsTpInnermost) {
  DeviceMesh m({.dp = 2, .tp = 2, .pp = 2}, "tp-cp-ep-dp-pp");
  EXPECT_EQ(m.world_size(), 8);
  EXPECT_EQ(m.group(0, Axis::tp), (V{0, 1}));
  EXPECT_EQ(m.group(0, Axis::dp), (V{0, 2}));
  EXPECT_EQ(m.group(0, Axis::pp), (V{0, 4}));
  EXPECT_EQ(m.group(5, Axis::tp), (V{4, 5}));
  EXPECT_EQ(m.group(5, Axis::dp), (V{5, 7}));
  EXPECT_EQ(m.coord(6, Axis::dp), 1);
  EXPECT_EQ(m.coord(6, Axis::pp), 1);
  EXPECT_EQ(m.coord(6, Axis::tp), 0);
  const Axis dp_tp[] = {Axis::dp, Axis::tp};
  EXPECT_EQ(m.group(6, dp_tp), (V{4, 5, 6, 7}));
  EXPECT_EQ(m.order_string(), "tp-cp-ep-dp-pp");
}

TEST(DeviceMesh, OtherOrderPutsDpInnermost) {
  DeviceMesh m({.dp = 2, .tp = 2}, "dp-tp");
  EXPECT_EQ(m.group(0, Axis::dp), (V{0, 1}));
  EXPECT_EQ(m.group(0, Axis::tp), (V{0, 2}));
  EXPECT_EQ(m.order_string(), "dp-tp-pp-cp-ep");
}

TEST(DeviceMesh, GroupIndexIsAColorThatPartitionsRanks) {
  DeviceMesh m({.dp = 3, .tp = 2, .cp = 2});
  for (Axis a : kAllAxes) {
    const int groups = m.world_size() / m.size(a);
    std::vector<int> seen(static_cast<std::size_t>(groups), 0);
    for (int r = 0; r < m.world_size(); ++r) {
      const int c = m.group_index(r, std::span<const Axis>(&a, 1));
      ASSERT_GE(c, 0);
      ASSERT_LT(c, groups);
      ++seen[static_cast<std::size_t>(c)];
      for (int peer : m.group(r, a))
        EXPECT_EQ(m.group_index(peer, std::span<const Axis>(&a, 1)), c);
    }
    for (int s : seen) EXPECT_EQ(s, m.size(a));
  }
}

TEST(DeviceMesh, RefusesBadOrdersAndSizes) {
  EXPECT_THROW(DeviceMesh({.dp = 0}), MeshError);
  EXPECT_THROW(DeviceMesh({.dp = 2}, "tp-xx"), MeshError);
  EXPECT_THROW(DeviceMesh({.dp = 2}, "dp-dp"), MeshError);
  try {
    DeviceMesh({.dp = 2, .tp = 2}, "dp-pp");
    FAIL() << "an order leaving out tp of size 2 was accepted";
  } catch (const MeshError& e) {
    EXPECT_NE(std::string(e.what()).find("leaves out axis tp"), std::string::npos) << e.what();
  }
}

TEST(DeviceMesh, RefusesWorldsOverTheCeilingWithoutWrapping) {
  try {
    DeviceMesh({.dp = 65536, .tp = 65536});  // 2^32: 0 in 32 bits
    FAIL() << "a 2^32-rank mesh was accepted";
  } catch (const MeshError& e) {
    EXPECT_NE(std::string(e.what()).find("4294967296 is over the ceiling of 1048576"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(MeshShape({.dp = 65536, .tp = 65536, .pp = 2}).world_size64(), int64_t{1} << 33);
  EXPECT_NO_THROW(DeviceMesh({.dp = 1024, .tp = 1024}));  // exactly the ceiling
}

TEST(DeviceMesh, TableListsEveryRankAndItsGroups) {
  DeviceMesh m({.dp = 2, .tp = 2});
  const std::string t = m.table();
  EXPECT_NE(t.find("world=4"), std::string::npos);
  EXPECT_NE(
      t.find("   3   1  1  0  0  0  [1,3]     [2,3]     [3]       [3]       [3]       [1,3]\n"),
      std::string::npos)
      << t;
}

// Expert parallelism is carved out of the data-parallel ranks (Megatron-Core): {dp 4, ep 2} is 4
// ranks; the expert view tp x ep x edp reads the dp slot of the order as edp = dp x cp / ep.
TEST(DeviceMesh, ExpertRanksAreCarvedOutOfTheDataParallelRanks) {
  const DeviceMesh m({.dp = 4, .tp = 2, .ep = 2});
  EXPECT_EQ(m.world_size(), 8);
  EXPECT_EQ(m.order_string(), "tp-cp-ep-dp-pp");
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(m.group(r, Axis::dp).size(), 4u) << r;
    EXPECT_EQ(m.group(r, Axis::ep).size(), 2u) << r;
    EXPECT_EQ(m.group(r, Axis::edp).size(), 2u) << r;
    EXPECT_EQ(m.coord(r, Axis::dp), r / 2) << r;  // tp fastest, then ep, then edp
    EXPECT_EQ(m.coord(r, Axis::ep), (r / 2) % 2) << r;
  }
  EXPECT_EQ(m.group(5, Axis::dp), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.group(5, Axis::ep), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(5, Axis::edp), (std::vector<int>{1, 5}));
  // edp faster than ep: the dense dp coordinate still counts the group in rank order.
  const DeviceMesh swapped({.dp = 4, .ep = 2}, "dp-ep");
  EXPECT_EQ(swapped.group(1, Axis::ep), (std::vector<int>{1, 3}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(swapped.coord(r, Axis::dp), r);
  EXPECT_NE(m.table().find("edp-group"), std::string::npos);
  try {
    DeviceMesh({.dp = 2, .ep = 4});
    FAIL() << "ep 4 over dp 2 was accepted";
  } catch (const MeshError& e) {
    EXPECT_NE(std::string(e.what()).find("ep (4) must divide dp x cp (2 x 1)"), std::string::npos)
        << e.what();
  }
}

// MoE parallel folding (Megatron-Core's two rank generators): the dense view tp x cp x dp and the
// expert view tp x ep x edp over the same ranks. {dp 2, cp 2, ep 4} is 4 ranks, all one EP group;
// with ep 2 the EP group is the CP group (cp is fastest after tp in the order), as in Megatron.
TEST(DeviceMesh, ExpertRanksFoldOverTheContextParallelRanks) {
  const DeviceMesh all({.dp = 2, .cp = 2, .ep = 4});
  EXPECT_EQ(all.world_size(), 4);
  EXPECT_EQ(all.size(Axis::edp), 1);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(all.group(r, Axis::ep), (V{0, 1, 2, 3})) << r;
    EXPECT_EQ(all.coord(r, Axis::ep), r) << r;
    EXPECT_EQ(all.group(r, Axis::edp), (V{r})) << r;
    EXPECT_EQ(all.coord(r, Axis::cp), r % 2) << r;
    EXPECT_EQ(all.coord(r, Axis::dp), r / 2) << r;
  }
  const DeviceMesh half({.dp = 4, .tp = 2, .cp = 2, .ep = 2});  // 16 ranks, edp = 4
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(half.group(r, Axis::ep), half.group(r, Axis::cp)) << r;
    EXPECT_EQ(half.group(r, Axis::edp).size(), 4u) << r;
    EXPECT_EQ(half.coord(r, Axis::ep), half.coord(r, Axis::cp)) << r;
  }
  EXPECT_EQ(half.group(3, Axis::edp), (V{3, 7, 11, 15}));
  // ep 4 over cp 2 x dp 4 spans the CP group and two DP positions.
  const DeviceMesh wide({.dp = 4, .cp = 2, .ep = 4});
  EXPECT_EQ(wide.group(5, Axis::ep), (V{4, 5, 6, 7}));
  EXPECT_EQ(wide.group(5, Axis::edp), (V{1, 5}));
  // Groups partition the ranks in both views (group_index is a colour).
  for (const Axis a : {Axis::ep, Axis::edp, Axis::dp, Axis::cp}) {
    for (int r = 0; r < 8; ++r)
      for (int peer : wide.group(r, a))
        EXPECT_EQ(wide.group_index(peer, std::span<const Axis>(&a, 1)),
                  wide.group_index(r, std::span<const Axis>(&a, 1)));
  }
  const std::array<Axis, 2> mixed = {Axis::ep, Axis::cp};
  EXPECT_THROW(wide.group(0, mixed), MeshError);
  // tp between cp and ep would give the two views different tp groups.
  try {
    DeviceMesh({.dp = 2, .tp = 2, .cp = 2, .ep = 2}, "cp-tp-ep-dp-pp");
    FAIL() << "an order splitting the tp groups of the two views was accepted";
  } catch (const MeshError& e) {
    EXPECT_NE(std::string(e.what()).find("tp and pp may not lie between cp, ep and dp"),
              std::string::npos)
        << e.what();
  }
  try {
    DeviceMesh({.dp = 2, .cp = 2, .ep = 8});
    FAIL() << "ep 8 over dp 2 x cp 2 was accepted";
  } catch (const MeshError& e) {
    EXPECT_NE(std::string(e.what()).find("ep (8) must divide dp x cp (2 x 2)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardcheck::comm
