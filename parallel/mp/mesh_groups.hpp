// The mesh engine's process groups, in the order it splits them, written once for the engine
// (mesh_engine.cpp) and the planner's timing-only run (mesh_timing.cpp), whose symmetric
// clock states each split's rule for every member: a split is its group, the group it is split
// from (the world, or the TP group for the kv replicas), its name, and each member's colour as a
// function of its rank in that parent (the key is that rank).
//
// In order: comm::build_groups' axis groups (dp, tp, pp, cp, ep; names of the axes); the data
// ranks ("data": the loss denominators); the dense gradient group dp x cp ("dp-cp"); the expert
// group edp = dp x cp / ep ("expert-dp"); with tp above the kv heads, the TP ranks sharing a kv
// head (mesh_rows.hpp's kTpKvGroup, split from tp); in the bf16 recipe of a MoE model, the
// expert-parts group (mesh_bf16.hpp); under hybrid_shard, the dense and the expert classes' shard
// and replica groups (mesh_rows.hpp's hybrid_colors: shard groups of shard_group_size x cp
// positions over {cp, dp}, and of the gcd of that and the expert-data-parallel size over {edp}).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mesh.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/mp/mesh_rows.hpp"
#include "parallel/testing.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel::mesh_detail {

enum class Group : std::uint8_t {
  dp,
  tp,
  pp,
  cp,
  ep,
  data,
  dense,
  expert,
  kv,
  parts,
  dense_shard,
  dense_replicas,
  expert_shard,
  expert_replicas,
  count
};

struct GroupSplit {
  Group group = Group::dp;
  bool from_tp = false;  // split from the TP group (by TP rank), else from the world
  std::string name;
  std::function<int(int parent_rank)> color;
};

// The splits of a mesh's engine with these options (its planted bug included: tests), in order.
inline std::vector<GroupSplit> group_splits(const comm::DeviceMesh& mesh,
                                            const ref::ModelConfig& model, ref::Precision precision,
                                            const MeshOptions& o) {
  using comm::Axis;
  std::vector<GroupSplit> out;
  const auto over = [&](Group g, std::vector<Axis> axes, std::string name) {
    out.push_back({.group = g,
                   .from_tp = false,
                   .name = std::move(name),
                   .color = [ix = mesh.group_indexer(axes)](int r) { return ix.index(r); }});
  };
  static_assert(comm::kAllAxes[0] == Axis::dp && comm::kAllAxes[1] == Axis::tp &&
                comm::kAllAxes[2] == Axis::pp && comm::kAllAxes[3] == Axis::cp &&
                comm::kAllAxes[4] == Axis::ep);
  const Group axis_groups[] = {Group::dp, Group::tp, Group::pp, Group::cp, Group::ep};
  for (std::size_t i = 0; i < comm::kAllAxes.size(); ++i)
    over(axis_groups[i], {comm::kAllAxes[i]}, std::string(comm::name_of(comm::kAllAxes[i])));
  const std::vector<Axis> dense = {Axis::dp, Axis::cp};
  over(Group::data, {Axis::dp}, "data");
  over(Group::dense, dense, "dp-cp");
  const bool wrong = o.planted == testing::Mutation::kExpertSumOverDenseGroup;
  over(Group::expert, wrong ? dense : std::vector<Axis>{Axis::edp}, "expert-dp");
  if (o.shape.tp > model.kv_heads) {
    const int replicas = o.shape.tp / model.kv_heads;
    out.push_back(
        {.group = Group::kv, .from_tp = true, .name = kTpKvGroup, .color = [replicas](int r) {
           return r / replicas;
         }});
  }
  if (precision == ref::Precision::kBf16 && model.moe)
    out.push_back(
        {.group = Group::parts, .from_tp = false, .name = "expert-parts", .color = [mesh](int r) {
           return expert_parts_color(mesh, r);
         }});
  if (const DataParallelRules rules = data_parallel_rules(o); rules.hybrid_shard) {
    const int s = rules.fsdp.shard_group_size * o.shape.cp;
    const auto hybrid = [&](Group shard, Group replicas, std::vector<Axis> axes, int size,
                            const std::string& name) {
      out.push_back({.group = shard,
                     .from_tp = false,
                     .name = name + "-shard",
                     .color = [mesh, axes, size](int r) {
                       return hybrid_colors(mesh, axes, size, r).shard;
                     }});
      out.push_back({.group = replicas,
                     .from_tp = false,
                     .name = name + "-replicas",
                     .color = [mesh, axes, size](int r) {
                       return hybrid_colors(mesh, axes, size, r).replicas;
                     }});
    };
    hybrid(Group::dense_shard, Group::dense_replicas, {Axis::cp, Axis::dp}, s, "dp-cp");
    hybrid(Group::expert_shard, Group::expert_replicas, {Axis::edp},
           std::gcd(s, mesh.size(Axis::edp)), "expert-dp");
  }
  return out;
}

// The groups made by running the splits of `mesh` in order on a rank of `world`, which must have
// the mesh's ranks (else comm::InvalidArgument, as comm::build_groups).
class MeshGroupSet {
 public:
  MeshGroupSet(comm::Communicator& world, const comm::DeviceMesh& mesh,
               const std::vector<GroupSplit>& splits) {
    if (world.size() != mesh.world_size())
      throw comm::InvalidArgument({world.world_rank(), world.name(), "mesh groups", 0},
                                  "mesh needs " + std::to_string(mesh.world_size()) +
                                      " ranks but the communicator has " +
                                      std::to_string(world.size()));
    for (const GroupSplit& s : splits) {
      comm::Communicator& parent = s.from_tp ? *get(Group::tp) : world;
      groups_[static_cast<std::size_t>(s.group)] =
          parent.split(s.color(parent.rank()), parent.rank(), {.name = s.name});
    }
  }
  // Null when the splits did not make it.
  comm::Communicator* get(Group g) const { return groups_[static_cast<std::size_t>(g)].get(); }
  std::unique_ptr<comm::Communicator> take(Group g) {
    return std::move(groups_[static_cast<std::size_t>(g)]);
  }

 private:
  std::unique_ptr<comm::Communicator> groups_[static_cast<std::size_t>(Group::count)];
};

}  // namespace shardcheck::parallel::mesh_detail
