// Forward + backward of one microbatch unit by unit (embedding, each block, head), fetching each
// unit's parameters just before use and dropping them right after: ZeRO-3's gather-use-free.
// Same math as ref::forward_backward (reference/blocks.hpp); not a scheduler, no communication.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

// Returns the full parameters of one unit (e.g. all-gathered from shards); called once per unit in
// forward and once per block in backward, and the map is dropped after that use.
template <class T>
using UnitFetch = std::function<ref::ParamMap<T>(int unit)>;

// Adds the microbatch's gradients into grads (full shapes). Per parameter, contributions are added
// in sequence order as in the reference; only the two parts of a tied embedding's gradient are
// added in another order (all LM-head parts, then all lookup parts), so results agree to rounding.
template <class T>
ref::LossParts layerwise_forward_backward(const ref::ModelConfig& cfg, const UnitFetch<T>& fetch,
                                          std::span<const ref::Sequence> sequences,
                                          const ref::StepContext& ctx, ref::ParamMap<T>& grads);

}  // namespace shardcheck::parallel
