// The model's layerwise units, the grain of FSDP wrapping and of the planner's skeleton: the
// embedding, each transformer block and the head, and which parameters each holds.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reference/config.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// Units: 0 = embedding, 1..L = transformer block i-1, L+1 = head (final norm, untied LM head).
int unit_count(const ref::ModelConfig& cfg);
int unit_of(const ref::ModelConfig& cfg, std::string_view param_name);
// The canonical parameter shapes of one unit, in canonical order.
std::vector<std::pair<std::string, ref::Shape>> unit_shapes(const ref::ModelConfig& cfg, int unit);
// "embed", "layers.<i>", "head": the unit's label in phases and compute costs.
std::string unit_label(const ref::ModelConfig& cfg, int unit);

}  // namespace shardcheck::parallel
