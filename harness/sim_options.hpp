// Maps a scenario's topology, faults and health settings onto the simulator's options. The only
// place that knows both vocabularies (scenario JSON names and sim:: types).
#pragma once

#include "harness/scenario.hpp"
#include "sim/options.hpp"

namespace shardcheck::harness {

// Faults whose rank lies outside a configuration's world are dropped for that configuration (a
// matrix may mix world sizes); nan_gradient is carried but injected by the runner, not the sim.
sim::SimOptions sim_options(const Scenario& s, int world_size);

}  // namespace shardcheck::harness
