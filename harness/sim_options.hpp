// Maps a scenario's topology, faults and health settings onto the simulator's options. The only
// place that knows both vocabularies (scenario JSON names and sim:: types).
#pragma once

#include "harness/scenario.hpp"
#include "sim/options.hpp"

namespace shardcheck::harness {

// Faults whose rank lies outside a configuration's world are dropped for that configuration (a
// matrix may mix world sizes); nan_gradient is carried but injected by the runner, not the sim.
sim::SimOptions sim_options(const Scenario& s, int world_size);

// A simulated world's options from JSON in the scenario's vocabulary, for a world run without a
// scenario (the Python module): {"seed", "topology", "faults", "health"}, every key optional,
// read as a scenario reads them (unknown keys refused); faults may name steps up to `max_steps`.
// Throws ScenarioError naming the JSON path and what was expected.
sim::SimOptions sim_world_options(const nlohmann::json& j, int world_size, int max_steps);

}  // namespace shardcheck::harness
