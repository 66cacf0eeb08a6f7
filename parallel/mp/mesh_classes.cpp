// The flat buffers of a rank's parameters and their sharding (mesh_classes.hpp): flat_classes, the
// layout the optimizer, the ledger and the planner share, and shard_classes, each buffer in its
// groups with the rank's shard and ranges.
#include <algorithm>
#include <map>
#include <utility>

#include "parallel/mp/mesh_classes.hpp"

namespace shardcheck::parallel {

std::vector<FlatClass> flat_classes(const std::vector<LocalParam>& specs, int zero,
                                    const std::function<int(const LocalParam&)>& unit_of) {
  std::vector<FlatClass> out;
  std::map<std::pair<int, bool>, std::size_t> index;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const LocalParam& p = specs[i];
    const int unit = zero == 3 && unit_of ? unit_of(p) : 0;
    const auto [it, fresh] = index.try_emplace({unit, p.expert}, out.size());
    if (fresh)
      out.push_back({.unit = unit, .expert = p.expert, .specs = {}, .base = {}, .numel = 0});
    FlatClass& c = out[it->second];
    c.specs.push_back(i);
    c.base.push_back(c.numel);
    c.numel += ref::numel_of(p.local_shape);
  }
  return out;
}

std::vector<ShardedClass> shard_classes(std::vector<FlatClass> classes, int zero,
                                        const ClassGroups& groups) {
  std::vector<ShardedClass> out;
  out.reserve(classes.size());
  for (FlatClass& f : classes) {
    ShardedClass c;
    static_cast<FlatClass&>(c) = std::move(f);
    c.group = c.expert ? groups.expert : groups.dense;
    c.replicas = c.expert ? groups.expert_replicas : groups.dense_replicas;
    const int d = c.group->size(), r = c.group->rank();
    c.shard = shard_elems(c.numel, d, zero);
    if (zero == 0) {
      c.own_begin = 0;
      c.own_end = c.numel;
      c.out_begin = 0;
      c.out_end = r == 0 ? c.numel : 0;
    } else {
      c.own_begin = std::min(c.numel, r * c.shard);
      c.own_end = std::min(c.numel, (r + 1) * c.shard);
      c.out_begin = c.own_begin;
      c.out_end = c.replicas != nullptr && c.replicas->rank() != 0 ? c.own_begin : c.own_end;
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace shardcheck::parallel
