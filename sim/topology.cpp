// The alpha-beta cost formulas of sim/topology.hpp.
#include "sim/topology.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace shardcheck::sim {

namespace {
void require(bool ok, const std::string& field, double v, const char* range) {
  if (!ok)
    throw std::invalid_argument("topology." + field + " = " + std::to_string(v) + ": expected " +
                                range);
}
void check_link(const Link& l, const std::string& name) {
  require(std::isfinite(l.bandwidth_gbps) && l.bandwidth_gbps > 0, name + ".bandwidth_gbps",
          l.bandwidth_gbps, "> 0");
  require(std::isfinite(l.latency_us) && l.latency_us >= 0, name + ".latency_us", l.latency_us,
          ">= 0");
}
}  // namespace

void Topology::validate() const {
  require(ranks_per_node >= 1, "ranks_per_node", ranks_per_node, ">= 1");
  check_link(intra_node, "intra_node");
  check_link(inter_node, "inter_node");
  require(std::isfinite(device.peak_tflops) && device.peak_tflops > 0, "device.peak_tflops",
          device.peak_tflops, "> 0");
  require(std::isfinite(device.hbm_gbps) && device.hbm_gbps > 0, "device.hbm_gbps", device.hbm_gbps,
          "> 0");
  require(compute_efficiency > 0 && compute_efficiency <= 1, "compute_efficiency",
          compute_efficiency, "in (0, 1]");
}

LinkCost group_link(const Topology& t, std::span<const int> world_ranks) {
  bool inter = false;
  if (!world_ranks.empty()) {
    const int node = node_of(t, world_ranks[0]);
    inter = std::any_of(world_ranks.begin(), world_ranks.end(),
                        [&](int r) { return node_of(t, r) != node; });
  }
  return link_cost(t, inter);
}

LinkCost link_cost(const Topology& t, bool inter_node) {
  const Link& l = inter_node ? t.inter_node : t.intra_node;
  return {l.latency_us * 1e-6, 1.0 / (l.bandwidth_gbps * 1e9), inter_node};
}

double compute_seconds(const Topology& t, double flops, double bytes) {
  const double f = flops / (t.device.peak_tflops * 1e12 * t.compute_efficiency);
  const double m = bytes / (t.device.hbm_gbps * 1e9);
  return std::max(f, m);
}

double op_seconds(OpKind k, int p, double bytes, const LinkCost& l) {
  if (p <= 1) return 0;
  const double pm1 = p - 1;
  const double frac = pm1 / p;
  switch (k) {
    case OpKind::all_reduce:
      return 2 * pm1 * l.alpha + 2 * frac * bytes * l.beta;
    case OpKind::reduce_scatter:
    case OpKind::all_gather:
      return pm1 * l.alpha + frac * bytes * l.beta;
    case OpKind::broadcast:
    case OpKind::all_to_all:
    case OpKind::all_to_all_v:
      return pm1 * l.alpha + bytes * l.beta;
    case OpKind::send:
    case OpKind::recv:
      return l.alpha + bytes * l.beta;
    case OpKind::barrier:
      return 2 * pm1 * l.alpha;
    case OpKind::split:
      return 0;
  }
  return 0;
}

std::string format_seconds(double s) {
  char buf[64];
  const double a = std::fabs(s);
  if (a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.3f us", s * 1e6);
  else if (a < 1)
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

}  // namespace shardcheck::sim
