// The parallel configuration of one training run, as one typed value (torchtitan's ParallelDims):
// the mesh and its rank order, a closed data-parallel variant (DDP, ZeRO or FSDP) and the
// model-parallel settings (sequence parallelism, the pipeline schedule, CP's algorithm), with
// everything derived from it (zero stage, sharded parameters, keep after forward, hybrid, label,
// strategy name) in one place, and validate(), the rules the configuration must meet on its own,
// naming the field to change. The scenario loader maps JSON to it (harness/scenario.cpp); the
// engine's MeshOptions are built from it (parallel/mp/mesh_engine.hpp's mesh_options). What a run
// adds that is not the configuration (ranks per node, the health policy, the attention kernel)
// travels beside it, not in it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "comm/mesh.hpp"
#include "parallel/fsdp.hpp"

namespace shardcheck::parallel {

// The pipeline schedules (parallel/mp/pipeline.hpp runs them).
enum class PipeSchedule : std::uint8_t { gpipe, one_f_one_b, interleaved };
std::string_view name_of(PipeSchedule s);  // "gpipe", "1f1b", "interleaved"

// Context-parallel attention (parallel/mp/cp_attention.hpp): K/V around a ring, or Ulysses'
// all_to_all over heads.
enum class CpAlgo : std::uint8_t { ring, ulysses };
std::string_view name_of(CpAlgo a);  // "ring", "ulysses"

// Replicated parameters and optimizer state; gradients all-reduced in buckets of about
// bucket_elems elements, issued during the last microbatch's backward with `overlap`.
struct Ddp {
  std::size_t bucket_elems = std::size_t{1} << 20;
  bool overlap = true;
};
// ZeRO stage 1 (optimizer state sharded), 2 (also gradients) or 3 (also parameters) over the
// data-parallel ranks; stage 1 all-reduces its gradients in DDP's overlapped buckets.
struct Zero {
  int stage = 1;
  std::size_t bucket_elems = std::size_t{1} << 20;
};
// PyTorch FSDP (parallel/fsdp.hpp's FsdpOptions: sharding, wrap, blocks_per_unit,
// reshard_after_forward, prefetch, shard_group_size). In a configuration shard_group_size 0 means
// "ranks per node" (resolved by mesh_options: gcd(dp, ranks_per_node)).
using Fsdp = FsdpOptions;

using DataParallel = std::variant<Ddp, Zero, Fsdp>;

struct ParallelConfig {
  static constexpr std::string_view kDefaultOrder = "tp-cp-ep-dp-pp";

  comm::MeshShape mesh;
  std::string order{kDefaultOrder};
  DataParallel data = Ddp{};
  bool sequence_parallel = false;
  PipeSchedule pp_schedule = PipeSchedule::one_f_one_b;
  int virtual_stages = 1;
  CpAlgo cp_algo = CpAlgo::ring;

  // The data-parallel alternative held, or null.
  const Ddp* ddp() const { return std::get_if<Ddp>(&data); }
  const Zero* zero() const { return std::get_if<Zero>(&data); }
  const Fsdp* fsdp() const { return std::get_if<Fsdp>(&data); }
  Fsdp* fsdp() { return std::get_if<Fsdp>(&data); }

  // Derived, the one rule each. ZeRO stage of the step: FSDP other than no_shard is 3.
  int zero_stage() const;
  // The stage as written ("zero": N; 0 for DDP and FSDP), what reports print.
  int zero_given() const { return zero() ? zero()->stage : 0; }
  // Parameters sharded over the data-parallel ranks (ZeRO-3, or FSDP other than no_shard).
  bool shards_params() const;
  bool no_shard() const;  // FSDP no_shard: replicated, a sum per microbatch
  bool hybrid() const;    // FSDP hybrid_shard: sharded in shard groups, replicated across them
  // A forward's gathered parameters kept until the microbatch's backward (shard_grad_op, or
  // reshard_after_forward off); false where nothing is gathered.
  bool keeps_params_after_forward() const;
  // DDP's bucket size (DDP and ZeRO; FSDP: the DDP default).
  std::size_t bucket_elems() const;
  bool model_parallel() const { return mesh.tp > 1 || mesh.pp > 1 || mesh.cp > 1 || mesh.ep > 1; }
  // "ddp", "zero1".."zero3" or "fsdp" (the data-parallel strategy, whatever the mesh).
  std::string strategy_name() const;
  // "zero N" or "fsdp <sharding>", the planner's words for the data-parallel mode.
  std::string data_parallel_words() const;
  // "dp2-tp2-zero3": names the configuration's outputs (scenarios/README.md).
  std::string label() const;
};

// A rule the configuration breaks: the field to change (relative to the configuration's JSON
// object: "fsdp.shard_group_size"), what is wrong, and whether the combination is valid but not
// built (a row reports it) rather than wrong.
struct ConfigError {
  std::string field;
  std::string what;
  bool not_built = false;
};

// The rules a configuration meets on its own (axes >= 1, the world-size ceiling, ep dividing
// dp*cp, the order, the
// ZeRO stage, FSDP's knobs and shard group, the schedule's virtual stages), checked once where a
// configuration is made (the scenario loader; parallel::validate_mesh adds the model and batch
// rules). An FSDP shard group of 0 is left to mesh_options.
std::optional<ConfigError> validate(const ParallelConfig& c);

}  // namespace shardcheck::parallel
