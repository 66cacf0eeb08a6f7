// The group placement of placement.hpp.
#include "harness/placement.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <set>

#include "harness/driver.hpp"

namespace shardcheck::harness {

std::vector<AxisPlacement> placement_of(const Scenario& s, const ParallelSpec& p) {
  using comm::Axis;
  const parallel::MeshOptions o = engine_options(s, p);
  const comm::DeviceMesh mesh(o.shape, o.order);
  const int per_node = std::max(1, s.topology.ranks_per_node);
  std::vector<AxisPlacement> out;
  for (const Axis a : {Axis::tp, Axis::cp, Axis::ep, Axis::edp, Axis::dp, Axis::pp}) {
    if (a == Axis::edp && mesh.size(Axis::ep) == 1) continue;  // edp is dp x cp then: no group
    if (mesh.size(a) <= 1) continue;
    AxisPlacement x;
    x.axis = a;
    x.size = mesh.size(a);
    const std::array<Axis, 1> axes{a};
    std::set<int> seen;
    for (int r = 0; r < mesh.world_size(); ++r) {
      if (!seen.insert(mesh.group_index(r, axes)).second) continue;
      std::set<int> nodes;
      for (int m : mesh.group(r, axes)) nodes.insert(m / per_node);
      ++x.groups;
      if (nodes.size() > 1) ++x.crossing;
      x.nodes_spanned = std::max(x.nodes_spanned, static_cast<int>(nodes.size()));
    }
    const LinkSpec& link = x.inter_node() ? s.topology.inter_node : s.topology.intra_node;
    x.bandwidth_gbps = link.bandwidth_gbps;
    x.latency_us = link.latency_us;
    out.push_back(x);
  }
  return out;
}

std::string placement_text(const std::vector<AxisPlacement>& v) {
  std::string out;
  for (const AxisPlacement& x : v) {
    char buf[160];
    if (x.inter_node())
      std::snprintf(buf, sizeof buf,
                    "%s %d inter-node (%g GB/s; %d of %d groups span up to %d nodes)",
                    std::string(comm::name_of(x.axis)).c_str(), x.size, x.bandwidth_gbps,
                    x.crossing, x.groups, x.nodes_spanned);
    else
      std::snprintf(buf, sizeof buf, "%s %d intra-node (%g GB/s)",
                    std::string(comm::name_of(x.axis)).c_str(), x.size, x.bandwidth_gbps);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out;
}

}  // namespace shardcheck::harness
