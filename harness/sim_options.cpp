// Scenario → sim::SimOptions (see sim_options.hpp).
#include "harness/sim_options.hpp"

namespace shardcheck::harness {

namespace {

sim::FaultKind kind_of(const std::string& k) {
  if (k == "straggler") return sim::FaultKind::straggler;
  if (k == "hang") return sim::FaultKind::hang;
  if (k == "crash") return sim::FaultKind::crash;
  if (k == "skip_collective") return sim::FaultKind::skip_collective;
  if (k == "mismatch") return sim::FaultKind::mismatch;
  if (k == "corrupt_payload") return sim::FaultKind::corrupt_payload;
  if (k == "memory_budget") return sim::FaultKind::memory_budget;
  return sim::FaultKind::nan_gradient;
}

sim::MismatchWhat what_of(const std::string& w) {
  if (w == "dtype") return sim::MismatchWhat::dtype;
  if (w == "op") return sim::MismatchWhat::op;
  return sim::MismatchWhat::count;
}

}  // namespace

sim::SimOptions sim_options(const Scenario& s, int world_size) {
  sim::SimOptions o;
  const TopologySpec& t = s.topology;
  o.topology.ranks_per_node = t.ranks_per_node;
  o.topology.intra_node = {t.intra_node.bandwidth_gbps, t.intra_node.latency_us};
  o.topology.inter_node = {t.inter_node.bandwidth_gbps, t.inter_node.latency_us};
  o.topology.device = {.peak_tflops = t.peak_tflops,
                       .hbm_gbps = t.hbm_gbps,
                       .memory_gib = t.memory_gib,
                       .sms = t.sm_count,
                       .gemm_tile_m = t.gemm_tile_m,
                       .gemm_tile_n = t.gemm_tile_n};
  o.faults.seed = s.seed;
  for (const FaultSpec& f : s.faults) {
    if (f.rank >= world_size) continue;
    sim::Fault x;
    x.kind = kind_of(f.kind);
    x.rank = f.rank;
    x.step = f.step;
    x.from_step = f.step;
    x.op_index = f.op_index;
    x.slowdown = f.slowdown;
    x.what = what_of(f.what);
    x.bytes = static_cast<std::size_t>(f.bytes);
    o.faults.faults.push_back(x);
  }
  o.checksum_payloads = s.health.payload_checksums;
  return o;
}

sim::SimOptions sim_world_options(const nlohmann::json& j, int world_size, int max_steps) {
  ObjectReader o(j, "$");
  Scenario s;
  if (const nlohmann::json* seed = o.raw("seed")) {
    if (!seed->is_number_unsigned())
      throw ScenarioError("$.seed", "expected an integer >= 0, got " + describe_json(*seed));
    s.seed = seed->get<std::uint64_t>();
  }
  s.topology = parse_topology(o.object("topology"));
  s.faults = parse_faults(o.array("faults"), "$.faults", world_size, max_steps);
  s.health = parse_health(o.object("health"));
  o.finish();
  return sim_options(s, world_size);
}

}  // namespace shardcheck::harness
