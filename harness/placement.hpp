// Where a configuration's process groups sit on the cluster: for each parallel axis of size > 1,
// its groups' world ranks (comm::DeviceMesh over the order string, as the engine builds them)
// against the nodes (topology.ranks_per_node), and the link each group's collectives cross — the
// slowest, as the simulator prices a collective (sim::group_link): inter-node as soon as a group's
// ranks span two nodes. What `plan` says about "which collective goes on which link". Two
// qualifications: pp's traffic is sends between neighbouring stages, each priced by its own pair
// (a pp group marked inter-node may have intra-node neighbours), and under hybrid_shard the dp
// collectives run in shard and replica subgroups, not over the whole dp group.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {

struct AxisPlacement {
  comm::Axis axis = comm::Axis::dp;
  int size = 1;                               // members per group
  int groups = 0;                             // groups of this axis
  int crossing = 0;                           // groups whose ranks span more than one node
  int nodes_spanned = 1;                      // the most nodes one group spans
  double bandwidth_gbps = 0, latency_us = 0;  // the link a crossing group is priced at, else intra
  bool inter_node() const { return crossing > 0; }
};

// The axes tp, cp, ep, edp (expert data parallel, when ep > 1), dp, pp of size > 1, in that order.
std::vector<AxisPlacement> placement_of(const Scenario& s, const ParallelSpec& p);

// One line: "tp 8 intra-node (450 GB/s); dp 128 inter-node (50 GB/s; 8 of 8 groups span up to
// 128 nodes)"; "" for a single rank.
std::string placement_text(const std::vector<AxisPlacement>& v);

}  // namespace shardcheck::harness
