// MoE load in report.json (moe_load.hpp).
#include "harness/moe_load.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace shardcheck::harness {

namespace {

// max / mean of counts (1 when balanced; null when nothing was routed).
nlohmann::json max_over_mean(const std::vector<int64_t>& counts) {
  const int64_t sum = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (counts.empty() || sum == 0) return nullptr;
  const double mean = static_cast<double>(sum) / static_cast<double>(counts.size());
  return static_cast<double>(*std::max_element(counts.begin(), counts.end())) / mean;
}

}  // namespace

nlohmann::json moe_load_json(const Scenario& s, const std::vector<ref::StepRecord>& steps,
                             const MoeSteps& loads) {
  if (!s.model.moe) return nullptr;
  const auto experts = static_cast<std::size_t>(s.model.moe->experts);
  std::vector<int64_t> routed(experts, 0), kept(experts, 0);
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t k = 0; k < steps.size() && k < loads.size(); ++k) {
    const ref::StepRecord& r = steps[k];
    nlohmann::json layers = nlohmann::json::array();
    int64_t dropped = 0;
    for (const ref::MoeLoad& l : loads[k]) {
      layers.push_back({{"layer", l.layer},
                        {"routed", l.routed},
                        {"kept", l.kept},
                        {"dropped", l.dropped()},
                        {"max_over_mean", max_over_mean(l.routed)}});
      dropped += l.dropped();
      for (std::size_t e = 0; e < experts && e < l.routed.size(); ++e) {
        routed[e] += l.routed[e];
        kept[e] += l.kept[e];
      }
    }
    rows.push_back({{"step", r.step}, {"aux", r.aux}, {"dropped", dropped}, {"layers", layers}});
  }
  const int64_t all = std::accumulate(routed.begin(), routed.end(), int64_t{0});
  const int64_t held = std::accumulate(kept.begin(), kept.end(), int64_t{0});
  return {
      {"source", "the reference run's routing (the configurations' own counts are not recorded)"},
      {"experts", s.model.moe->experts},
      {"top_k", s.model.moe->top_k},
      {"capacity_factor", s.model.moe->capacity_factor},
      {"steps", rows},
      {"total",
       {{"routed", routed},
        {"kept", kept},
        {"dropped", all - held},
        {"drop_fraction",
         all > 0 ? nlohmann::json(static_cast<double>(all - held) / static_cast<double>(all))
                 : nlohmann::json(nullptr)},
        {"max_over_mean", max_over_mean(routed)}}}};
}

nlohmann::json ep_load_json(const Scenario& s, const ParallelSpec& p, const MoeSteps& loads) {
  if (!s.model.moe || p.mesh.ep < 2 || s.model.moe->experts % p.mesh.ep != 0) return nullptr;
  const int per = s.model.moe->experts / p.mesh.ep;
  std::vector<int64_t> kept(static_cast<std::size_t>(p.mesh.ep), 0);
  for (const std::vector<ref::MoeLoad>& step : loads)
    for (const ref::MoeLoad& l : step)
      for (std::size_t e = 0; e < l.kept.size(); ++e)
        kept[e / static_cast<std::size_t>(per)] += l.kept[e];
  return {{"kept", kept}, {"max_over_mean", max_over_mean(kept)}};
}

}  // namespace shardcheck::harness
