// The flat buffers of a rank's parameters (the optimizer's classes, mesh_zero.hpp's header) and
// their sharding over the classes' groups: the layout the optimizer, the ledger and the planner's
// timing-only run share (mesh_classes.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/mp/mesh_params.hpp"

namespace shardcheck::parallel {

// One flat buffer of a rank's parameters: its wrap unit (zero 3) and class, the parameters it
// holds (indices into the spec list, canonical order) with their flat offsets, and its length.
struct FlatClass {
  int unit = 0;
  bool expert = false;
  std::vector<std::size_t> specs;
  std::vector<int64_t> base;
  int64_t numel = 0;
};
// The rule every user of the layout shares (the optimizer, the ledger): one buffer per class,
// and under zero 3 with unit_of one per (unit, class), in order of first appearance.
std::vector<FlatClass> flat_classes(const std::vector<LocalParam>& specs, int zero,
                                    const std::function<int(const LocalParam&)>& unit_of);
// Elements a group of d ranks' member keeps of an n-element buffer: ceil(n / d) when sharded
// (zero >= 1; the padding zeros at the end), else n.
inline int64_t shard_elems(int64_t n, int d, int zero) {
  return zero == 0 ? n : (n + d - 1) / d;
}

// A flat buffer in its groups, as this rank holds it: its sharding (and, without replicas,
// summing) group, its replicas (hybrid_shard), the shard of S elements each member keeps (padded
// buffer: S x the group's size), the range this rank's optimizer owns, and the range it counts
// (norm, export: each element once in the world). The rule the optimizer (MeshOptimizer) and the
// planner's timing-only run share.
struct ShardedClass : FlatClass {
  comm::Communicator* group = nullptr;
  comm::Communicator* replicas = nullptr;
  int64_t shard = 0;
  int64_t own_begin = 0, own_end = 0;  // the optimizer's range (within [0, numel))
  int64_t out_begin = 0, out_end = 0;  // counted range (norm, export)
  int64_t padded() const { return shard * group->size(); }
};
// The groups of the two classes (mesh_zero.hpp's header): dense (dp x cp) and expert (edp); under
// hybrid_shard the shard groups, with the groups across which each shard is replicated.
struct ClassGroups {
  comm::Communicator* dense = nullptr;
  comm::Communicator* expert = nullptr;
  comm::Communicator* dense_replicas = nullptr;
  comm::Communicator* expert_replicas = nullptr;
};
std::vector<ShardedClass> shard_classes(std::vector<FlatClass> classes, int zero,
                                        const ClassGroups& groups);

}  // namespace shardcheck::parallel
