// The mesh engine's process groups (parallel/mp/mesh_groups.hpp), which the engine and the
// planner's timing-only run both split: on every rank of a dp x tp x cp x ep mesh each group holds
// the ranks the device mesh names for its axes, the kv replicas are consecutive TP ranks, hybrid
// shard cuts dp x cp into shard and replica groups, and a world of the wrong size is refused.
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "comm/errors.hpp"
#include "comm/mesh.hpp"
#include "parallel/mp/mesh_groups.hpp"
#include "sim/world.hpp"
#include "tests/mp/mesh_support.hpp"

namespace shardcheck::parallel::mesh_detail {
namespace {

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(MeshGroups, EachGroupHoldsTheRanksOfItsAxes) {
  ref::ModelConfig m = mesh_test::mesh_moe().model;  // kv heads 2
  MeshOptions o;
  o.shape = comm::MeshShape{.dp = 2, .tp = 4, .cp = 2, .ep = 2};
  o.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard,
                       .reshard_after_forward = true,
                       .prefetch = 0,
                       .shard_group_size = 1};
  const comm::DeviceMesh mesh(o.shape, o.order);
  const std::vector<GroupSplit> splits = group_splits(mesh, m, ref::Precision::kBf16, o);
  std::mutex mu;
  int checked = 0;
  sim::SimWorld(mesh.world_size()).run([&](comm::Communicator& c) {
    MeshGroupSet g(c, mesh, splits);
    const int r = c.rank();
    using comm::Axis;
    const auto members = [&](Group x) { return sorted(g.get(x)->members()); };
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(members(Group::tp), sorted(mesh.group(r, Axis::tp)));
    EXPECT_EQ(members(Group::cp), sorted(mesh.group(r, Axis::cp)));
    EXPECT_EQ(members(Group::ep), sorted(mesh.group(r, Axis::ep)));
    EXPECT_EQ(members(Group::data), sorted(mesh.group(r, Axis::dp)));
    const Axis dense[] = {Axis::dp, Axis::cp};
    EXPECT_EQ(members(Group::dense), sorted(mesh.group(r, dense)));
    EXPECT_EQ(members(Group::expert), sorted(mesh.group(r, Axis::edp)));
    // tp 4 over 2 kv heads: pairs of consecutive TP ranks.
    ASSERT_NE(g.get(Group::kv), nullptr);
    EXPECT_EQ(g.get(Group::kv)->size(), 2);
    EXPECT_EQ(g.get(Group::kv)->members()[0],
              mesh.group(r, Axis::tp)[static_cast<std::size_t>(g.get(Group::tp)->rank() / 2 * 2)]);
    EXPECT_NE(g.get(Group::parts), nullptr);  // bf16 with MoE
    // hybrid shard, one DP rank per shard group: the shard group is the rank's CP group, the
    // replicas its DP group; their product is the dense group.
    EXPECT_EQ(members(Group::dense_shard), sorted(mesh.group(r, Axis::cp)));
    EXPECT_EQ(members(Group::dense_replicas), sorted(mesh.group(r, Axis::dp)));
    EXPECT_EQ(g.get(Group::dense_shard)->size() * g.get(Group::dense_replicas)->size(),
              g.get(Group::dense)->size());
    ++checked;
  });
  EXPECT_EQ(checked, mesh.world_size());
}

TEST(MeshGroups, AWorldOfTheWrongSizeIsRefused) {
  const ref::ModelConfig m = mesh_test::mesh_dense().model;
  MeshOptions o;
  o.shape = comm::MeshShape{.dp = 4};
  const comm::DeviceMesh mesh(o.shape, o.order);
  const std::vector<GroupSplit> splits = group_splits(mesh, m, ref::Precision::kF32, o);
  int refused = 0;
  std::mutex mu;
  sim::SimWorld(2).run([&](comm::Communicator& c) {
    try {
      MeshGroupSet g(c, mesh, splits);
    } catch (const comm::InvalidArgument&) {
      std::lock_guard<std::mutex> lock(mu);
      ++refused;
    }
  });
  EXPECT_EQ(refused, 2);
}

}  // namespace
}  // namespace shardcheck::parallel::mesh_detail
