// The layerwise units of layerwise.hpp.
#include "parallel/layerwise.hpp"

#include <charconv>
#include <stdexcept>
#include <string>
#include <utility>

#include "reference/model.hpp"

namespace shardcheck::parallel {

int unit_count(const ref::ModelConfig& cfg) {
  return cfg.layers + 2;
}

int unit_of(const ref::ModelConfig& cfg, std::string_view name) {
  if (name == "embed.weight") return 0;
  constexpr std::string_view kLayers = "layers.";
  if (name.starts_with(kLayers)) {
    const std::string_view rest = name.substr(kLayers.size());
    int layer = 0;
    const auto [end, err] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
    if (err != std::errc{} || end == rest.data())
      throw std::invalid_argument("unit_of: no layer index in " + std::string(name));
    return 1 + layer;
  }
  return cfg.layers + 1;  // final_norm.weight, lm_head.weight
}

std::vector<std::pair<std::string, ref::Shape>> unit_shapes(const ref::ModelConfig& cfg, int unit) {
  return ref::part_param_shapes(cfg, unit - 1);  // unit 0 = the embedding = part -1
}

std::string unit_label(const ref::ModelConfig& cfg, int unit) {
  if (unit == 0) return "embed";
  if (unit == cfg.layers + 1) return "head";
  return "layers." + std::to_string(unit - 1);
}

}  // namespace shardcheck::parallel
