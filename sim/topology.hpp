// Topology and cost model of the simulator's virtual clock: where ranks sit (ranks per node), the
// links between them (alpha-beta: latency and bandwidth) and the device (peak FLOP/s, HBM). Pure
// data and pure functions of it; the formulas are written once here and in sim/README.md.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "comm/communicator.hpp"
#include "sim/op.hpp"

namespace shardcheck::sim {

// One kind of link. Bandwidth in GB/s (10^9 bytes per second, per direction), latency in µs.
struct Link {
  double bandwidth_gbps = 450;
  double latency_us = 3;
};

struct DeviceSpec {
  double peak_tflops = 989;  // dense peak of the datatype in use
  double hbm_gbps = 4800;    // memory bandwidth, GB/s
  double memory_gib = 141;   // capacity; informational (the ledger compares against it)
  // GEMM efficiency by shape (0 SMs: not modelled, every GEMM at the one compute efficiency): a
  // GEMM's output is computed in whole tiles of gemm_tile_m x gemm_tile_n (either orientation,
  // whichever its shape fills better), one tile per SM at a time, so in whole waves of `sms` tiles
  // (NVIDIA's tile and wave quantization). The tile is the large-GEMM kernel's (128 x 256 for
  // bf16 tensor cores on Ampere and Hopper), one for every shape: smaller kernels for skinny
  // shapes are not modelled.
  int sms = 0;
  int gemm_tile_m = 128;
  int gemm_tile_n = 256;
};

// Defaults: an H100/H200-class node of 8 GPUs on NVLink, 400 Gb/s-class network between nodes.
struct Topology {
  int ranks_per_node = 8;  // world rank r sits on node r / ranks_per_node
  Link intra_node{450, 3};
  Link inter_node{50, 10};
  DeviceSpec device{};
  double compute_efficiency = 1.0;  // achieved fraction of peak FLOP/s, in (0, 1]

  // Throws std::invalid_argument naming the field when a value is out of range.
  void validate() const;
};

// The link a group's ring crosses: inter-node when its world ranks sit on more than one node.
struct LinkCost {
  double alpha = 0;  // seconds per message step
  double beta = 0;   // seconds per byte (1 / bandwidth)
  bool inter_node = false;
};
// The node world rank r sits on (Topology::ranks_per_node).
inline int node_of(const Topology& t, int world_rank) {
  return world_rank / t.ranks_per_node;
}
LinkCost group_link(const Topology& t, std::span<const int> world_ranks);
// The intra-node or the inter-node link's cost (what group_link gives a group within one node, or
// one that crosses nodes).
LinkCost link_cost(const Topology& t, bool inter_node);

// Seconds a compute op takes: max(flops / (peak * efficiency), bytes / hbm).
double compute_seconds(const Topology& t, double flops, double bytes);
// The FLOPs the device spends on one GEMM (DeviceSpec's tile and wave quantization): 2mnk when
// the model is off (no SMs), else 2k per output element of its whole tiles in whole waves.
double gemm_spent_flops(const DeviceSpec& d, const comm::Gemm& g);
// The same for a compute report: its GEMMs at what the device spends on them, the rest as counted.
double compute_seconds(const Topology& t, const comm::ComputeCost& c);

// Seconds a communication op takes on p members over link l; `bytes` is the S of its formula:
//   all_reduce (ring)            2(p-1)a + 2(p-1)/p * S*b     S = the buffer
//   reduce_scatter, all_gather   (p-1)a  + (p-1)/p  * S*b     S = the full (unsharded) buffer
//   broadcast (pipelined ring)   (p-1)a  + S*b                S = the buffer
//   all_to_all, all_to_all_v     (p-1)a  + S*b                S = the most bytes any member sends
//                                                             to, or receives from, the others
//   send / recv                  a + S*b                      S = the message
//   barrier                      2(p-1)a                      (an all_reduce of nothing)
//   split                        0                            (bookkeeping; it still synchronises)
// p = 1 costs nothing. a = alpha, b = 1/bandwidth of the slowest link the group crosses. The
// terms and S of each op are rows of the op table (comm/ops.hpp: latency, bandwidth, cost_bytes).
double op_seconds(OpKind k, int p, double bytes, const LinkCost& l);

// "12.5 us", "3.20 ms", "1.234 s": how virtual times appear in messages.
std::string format_seconds(double s);

}  // namespace shardcheck::sim
