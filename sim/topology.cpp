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
  require(device.sms >= 0 && device.sms <= 1 << 16, "device.sms", device.sms, "in [0, 65536]");
  require(device.gemm_tile_m >= 1 && device.gemm_tile_m <= 4096, "device.gemm_tile_m",
          device.gemm_tile_m, "in [1, 4096]");
  require(device.gemm_tile_n >= 1 && device.gemm_tile_n <= 4096, "device.gemm_tile_n",
          device.gemm_tile_n, "in [1, 4096]");
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

double gemm_spent_flops(const DeviceSpec& d, const comm::Gemm& g) {
  const double counted = 2 * g.m * g.n * g.k;
  if (d.sms <= 0 || g.m <= 0 || g.n <= 0) return counted;
  const auto spent = [&](double tm, double tn) {
    const double tiles = std::ceil(g.m / tm) * std::ceil(g.n / tn);
    return std::ceil(tiles / d.sms) * d.sms * tm * tn * 2 * g.k;
  };
  const double a = d.gemm_tile_m, b = d.gemm_tile_n;
  return std::min(spent(a, b), spent(b, a));
}

double compute_seconds(const Topology& t, const comm::ComputeCost& c) {
  double flops = c.flops;
  if (t.device.sms > 0)
    for (const comm::Gemm& g : c.gemms)
      flops += gemm_spent_flops(t.device, g) - 2 * g.m * g.n * g.k;
  return compute_seconds(t, flops, c.bytes);
}

double op_seconds(OpKind k, int p, double bytes, const LinkCost& l) {
  return comm::link_seconds(k, p, bytes, l.alpha, l.beta);  // the op table's latency and bandwidth
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
