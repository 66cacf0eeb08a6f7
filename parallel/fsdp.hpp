// FSDP planning, shared by the engine (data_parallel.cpp) and the analytic ledger: wrap units
// (which layerwise units share one flat, sharded buffer), the order in which a microbatch uses
// them, and the residency plan (when each unit is all-gathered, prefetched and freed). Pure: no
// communication, no numerics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "reference/config.hpp"

namespace shardcheck::parallel {

// PyTorch's ShardingStrategy. full_shard: parameters, gradients and optimizer state sharded over
// the DP group. shard_grad_op: the same, but parameters gathered in forward stay unsharded until
// the microbatch's backward is done (never resharded after forward). no_shard: replicated (DDP
// with one all_reduce per wrap unit per microbatch). hybrid_shard: full_shard inside each shard
// group of FsdpOptions::shard_group_size consecutive DP ranks, replicated across the groups
// (reduce_scatter in the shard group, then all_reduce of the shard across the replicate group).
enum class ShardingStrategy : std::uint8_t { full_shard, shard_grad_op, no_shard, hybrid_shard };
std::string_view name_of(ShardingStrategy s);

// block: the embedding, every transformer block and the head (final norm, untied LM head) are
// units of their own. layer_group: blocks_per_unit consecutive blocks per unit (embedding and
// head still their own). whole_model: one unit.
enum class WrapPolicy : std::uint8_t { block, layer_group, whole_model };
std::string_view name_of(WrapPolicy w);

struct FsdpOptions {
  ShardingStrategy sharding = ShardingStrategy::full_shard;
  WrapPolicy wrap = WrapPolicy::block;
  int blocks_per_unit = 2;            // layer_group only
  bool reshard_after_forward = true;  // full_shard / hybrid_shard; shard_grad_op never reshards
  int prefetch = 1;                   // upcoming units whose all_gather is issued early (0, 1, 2)
  int shard_group_size = 0;           // hybrid_shard: DP ranks per shard group (divides DP size)
};

// Wrap units as lists of layerwise units (layerwise.hpp: 0 = embedding, 1..L = blocks, L+1 = head).
std::vector<std::vector<int>> wrap_units(const ref::ModelConfig& cfg, WrapPolicy wrap,
                                         int blocks_per_unit);

// Layerwise units in the order layerwise_forward_backward acquires them for one microbatch:
// forward 0, 1, ..., L; the head L+1 (and 0 again when the LM head is tied to the embedding);
// backward L, ..., 1. The embedding's backward needs no parameters.
std::vector<int> acquire_order(const ref::ModelConfig& cfg);

// What happens to sharded wrap units around each use (one use = one acquire of the order above,
// released in the same order). Units are indices into wrap_units(); replicated strategies need
// no plan.
class ResidencyPlan {
 public:
  // uses: the wrap unit of each acquire, in order; keep_after_forward: shard_grad_op, or
  // reshard_after_forward == false; prefetch: how many upcoming distinct units to gather early;
  // forward_uses: how many leading uses are forward (the head's included); paired_use: a use i
  // acquired together with use i + 1 before either is released (the tied head), or -1.
  ResidencyPlan(std::vector<int> uses, bool keep_after_forward, int prefetch, int forward_uses,
                int paired_use);

  const std::vector<int>& uses() const { return uses_; }
  // Units to all_gather (asynchronously) right after use i is acquired, beyond unit uses()[i]
  // itself; the caller skips those it already holds.
  std::vector<int> prefetch_after(std::size_t i) const;
  // Whether unit uses()[i] is freed when use i is released.
  bool free_after(std::size_t i) const { return free_after_[i]; }
  int paired_use() const { return paired_; }

  // Peak bytes of unsharded units held at once in one microbatch, given each unit's unsharded
  // (padded) bytes: the all-gather peak the ledger predicts and the tracker must show.
  std::size_t peak_held_bytes(const std::vector<std::size_t>& unit_bytes) const;

 private:
  std::vector<int> uses_;
  int prefetch_;
  int paired_;
  std::vector<bool> free_after_;
};

// The residency plan for a model under these options (acquire_order mapped to wrap units).
ResidencyPlan residency_plan(const ref::ModelConfig& cfg, const FsdpOptions& o);

}  // namespace shardcheck::parallel
