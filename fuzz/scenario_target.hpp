// The body of the scenario loader's fuzz target, shared by the libFuzzer entry point
// (fuzz/scenario_fuzz.cpp) and the corpus replay test (tests/harness/scenario_corpus_test.cpp).
// Contract: any text either loads or throws ScenarioError (a JSON path and what was expected);
// any other exception, a crash, a sanitizer report or unbounded allocation is a bug. A scenario
// that loads keeps the loader's promises: at least one configuration, each a valid mesh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "comm/mesh.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::fuzz {

// Returns true when the input loaded.
inline bool scenario_one(const std::uint8_t* data, std::size_t size) {
  try {
    const harness::Scenario s = harness::parse_scenario_text(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    if (s.configs.empty()) __builtin_trap();
    for (const harness::ParallelSpec& p : s.configs) {
      const comm::MeshShape& m = p.mesh;
      if (m.dp < 1 || m.tp < 1 || m.pp < 1 || m.cp < 1 || m.ep < 1) __builtin_trap();
      if (m.world_size64() < 1 || m.world_size64() > comm::kMaxWorldSize) __builtin_trap();
    }
    return true;
  } catch (const harness::ScenarioError&) {
    return false;
  }
}

}  // namespace shardcheck::fuzz
