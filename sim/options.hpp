// How a SimWorld runs: the topology its virtual clock models, the faults it injects, timing-only
// ("meta") mode and payload checksums. Plain data with defaults; the harness maps a scenario here.
#pragma once

#include "sim/faults.hpp"
#include "sim/testing.hpp"
#include "sim/topology.hpp"

namespace shardcheck::sim {

struct SimOptions {
  Topology topology{};
  FaultPlan faults{};
  // Timing only: collectives check descriptors and advance virtual time but move no data and never
  // read payloads, so buffers may be views with null data and the right counts.
  bool meta = false;
  // Each contribution is checksummed (XXH3-64) when issued and verified before any member uses it;
  // a difference fails the op for every member with comm::CorruptionError. Off: corruption is
  // silent, as on a real network without end-to-end checks (the parity check must catch it).
  bool checksum_payloads = false;
  // Keep timeline events (one per op per rank). Off saves memory in very large timing runs.
  bool record_timeline = true;
  // Internal use (tests): rank threads from this one on fail to start, as when the system's thread
  // limit is reached (0: no limit but the system's).
  int thread_limit = 0;
  // Internal use (tests): a known bug planted in this world's reduction kernels (sim/testing.hpp).
  testing::Mutation planted = testing::Mutation::none;
};

}  // namespace shardcheck::sim
