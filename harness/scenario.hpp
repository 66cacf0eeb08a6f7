// A scenario: the data that says what to check (model, training recipe, data, parallel mesh and the
// matrix of configurations, topology, faults, checkpoint drills, expectations). Loading validates
// every field and the mesh arithmetic; the schema is documented in scenarios/README.md.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/mesh.hpp"
#include "harness/json_reader.hpp"
#include "parallel/config.hpp"
#include "reference/config.hpp"

namespace shardcheck::harness {

// A configuration (the mesh, its order, the data-parallel strategy and the model-parallel
// settings) is parallel/config.hpp's ParallelConfig: the loader maps "parallel" and each "matrix"
// entry to one and checks it once (validate, then parallel::validate_mesh against the model and
// batch); parallel::mesh_options turns it into the engine's options.
using ParallelSpec = parallel::ParallelConfig;

struct LinkSpec {
  double bandwidth_gbps = 0;
  double latency_us = 0;
};
struct TopologySpec {
  int ranks_per_node = 8;
  LinkSpec intra_node{450, 3};
  LinkSpec inter_node{50, 10};
  double peak_tflops = 989;
  double hbm_gbps = 4800;
  double memory_gib = 141;
  // GEMM efficiency by shape (sim::DeviceSpec): SMs (0: not modelled) and the kernel's tile.
  int sm_count = 0;
  int gemm_tile_m = 128;
  int gemm_tile_n = 256;
};

struct FaultSpec {
  std::string kind;  // straggler, hang, crash, skip_collective, mismatch, nan_gradient, ...
  int rank = 0;
  int step = 1;
  int op_index = -1;
  double slowdown = 1.0;
  std::int64_t bytes = 0;
  std::string what = "count";  // mismatch: count, dtype or op
};

// How faults are detected (beyond the deadlock detector and the parity check, always on).
struct HealthSpec {
  bool payload_checksums = false;        // checksum every collective contribution (corruption)
  std::string nan_policy = "skip_step";  // non-finite gradients: skip_step or stop
};

// The planner's inputs (`shardcheck plan`): world sizes for the scaling curves, and the failure
// model for goodput (per-GPU mean time between failures, checkpoint cost and restart cost).
struct PlanSpec {
  std::vector<int> world_sizes;      // empty: the configurations' own sizes only
  double mtbf_gpu_hours = 50000;     // mean time between failures of one GPU
  int checkpoint_every_steps = 100;  // checkpoint interval (0: never)
  double checkpoint_save_s = 10;     // time a save blocks training
  double restart_s = 300;            // detect, reschedule, reload after a failure
  // The attention kernel the plan prices (without CP, or Ulysses): "engine", the engine's own
  // (keeps the s x s probabilities), or "flash" (parallel/costs.hpp's flash_forward).
  std::string attention_kernel = "engine";
  // What MoE layers route (parallel/mp/ep_moe.hpp's MoeRouting): "uniform", every top-k assignment
  // kept and spread evenly over the EP ranks, or "capacity", every expert receiving its full
  // capacity of every sequence (a padded dispatch's volume; every expert at the most it can
  // receive).
  std::string moe_routing = "uniform";
  // When the bf16 recipe rounds a microbatch's gradient (parallel/mp/mesh_bf16.hpp): "sum_first",
  // the engine's (the partials of CP ranks, SP's TP-replicated parameters, replicated kv heads and
  // expert parts summed over their ranks every microbatch, then rounded once, for parity with the
  // reference), or "local", a what-if the engine does not run: each rank rounds its own partial
  // and the partials meet in the step's gradient reduction (Megatron's f32 main grads), so those
  // per-microbatch sums are not timed. Memory stays the engine's either way.
  std::string bf16_rounding = "sum_first";
};

struct CheckpointSpec {
  int every = 0;  // 0: never
  int keep = 2;
  std::optional<ParallelSpec> restore_parallel;
};

struct Scenario {
  std::string name;
  std::string description;
  std::uint64_t seed = 1234;
  ref::ModelConfig model;
  ref::TrainConfig train;
  ref::DataConfig data;
  ParallelSpec parallel;              // the base configuration
  std::vector<ParallelSpec> configs;  // parallel, or each matrix entry applied over it
  bool has_matrix = false;            // configs came from a "matrix" array
  TopologySpec topology;
  std::vector<FaultSpec> faults;
  HealthSpec health;
  CheckpointSpec checkpoint;
  PlanSpec plan;
  std::vector<std::string> drills;
  bool expect_parity = true;
  std::optional<std::string> expect_fault;
};

// Throws ScenarioError (JSON path + what was expected) for anything unusable.
Scenario parse_scenario(const nlohmann::json& j);
// The parts of a scenario that also describe a simulated world alone (sim_options.hpp's
// sim_world_options, the Python module's World): "topology", "faults" (each rank in [0, world),
// each step in [1, steps]; `path` is the array's JSON path) and "health".
TopologySpec parse_topology(ObjectReader topology);
std::vector<FaultSpec> parse_faults(const nlohmann::json& faults, const std::string& path,
                                    int world, int steps);
HealthSpec parse_health(ObjectReader health);
// Parses scenario text under the input limits of scenarios/README.md (size, JSON depth, number
// range); errors are prefixed with `origin` (the file name). What load_scenario and the scenario
// fuzz target (fuzz/scenario_fuzz.cpp) call.
Scenario parse_scenario_text(std::string_view text, const std::string& origin);
// Reads and parses a file (regular files only); the error message is prefixed with the file name.
Scenario load_scenario(const std::string& file);

}  // namespace shardcheck::harness
