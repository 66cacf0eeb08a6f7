// Forward + backward of one microbatch unit by unit (embedding, each block, head), acquiring each
// unit's parameters just before use and releasing them right after (ZeRO-3/FSDP gather-use-free),
// with each unit's gradients handed over as soon as they are complete (DDP buckets, FSDP
// reduce-scatter) and every activation reported to the memory tracker. Same math as
// ref::forward_backward (reference/blocks.hpp); not a scheduler, no communication.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/memory.hpp"
#include "reference/batch.hpp"
#include "reference/config.hpp"
#include "reference/model.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// Units: 0 = embedding, 1..L = transformer block i-1, L+1 = head (final norm, untied LM head).
int unit_count(const ref::ModelConfig& cfg);
int unit_of(const ref::ModelConfig& cfg, std::string_view param_name);
// The canonical parameter shapes of one unit, in canonical order.
std::vector<std::pair<std::string, ref::Shape>> unit_shapes(const ref::ModelConfig& cfg, int unit);
// "embed", "layers.<i>", "head": the unit's label in phases and compute costs.
std::string unit_label(const ref::ModelConfig& cfg, int unit);

// What the caller provides. Units are acquired in fsdp.hpp's acquire_order() and each released
// before the next is acquired, except the tied head: acquire(L+1), acquire(0), release(L+1),
// release(0).
template <class T>
struct UnitHooks {
  // The unit's full parameters, valid until release(unit).
  std::function<const ref::ParamMap<T>&(int unit)> acquire;
  std::function<void(int unit)> release;
  // The unit's gradient map for this microbatch (its parameters' full shapes); gradients are
  // added into it. Asked for before the unit's first backward.
  std::function<ref::ParamMap<T>&(int unit)> grads;
  // The unit's gradient for this microbatch is complete (order: head, blocks L..1, embedding).
  std::function<void(int unit)> grads_ready;
  // Optional: activations (held for backward) and phases are reported here.
  comm::MemoryTracker* memory = nullptr;
  // Optional: each unit's forward and backward (FLOPs of parallel/flops.hpp).
  std::function<void(const comm::ComputeCost&)> compute;
  std::string phase_prefix;  // "step 3 microbatch 1": phases are "<prefix> forward layers.0" etc.
  // Bytes per activation element as the recipe holds them (default: sizeof(T)).
  std::size_t activation_bytes = sizeof(T);
};

// Activation bytes layerwise_forward_backward holds, for the ledger's estimate and the tracker:
// per sequence and block, the BlockCache (everything block_backward reads) plus the running x.
template <class T>
std::size_t cache_elems(const ref::BlockCache<T>& c);

// Per parameter, contributions are added in sequence order as in the reference; only the two
// parts of a tied embedding's gradient are added in another order (all LM-head parts, then all
// lookup parts), so results agree to rounding.
template <class T>
ref::LossParts layerwise_forward_backward(const ref::ModelConfig& cfg, const UnitHooks<T>& hooks,
                                          std::span<const ref::Sequence> sequences,
                                          const ref::StepContext& ctx);

}  // namespace shardcheck::parallel
