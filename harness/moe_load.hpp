// The MoE part of report.json: the reference run's expert load (per step and MoE layer, the
// assignments routed to each expert and those kept within capacity, the drops and the aux loss),
// its totals (drop fraction, the busiest expert against the mean), and for an expert-parallel
// configuration the kept assignments each EP coordinate computes. These are the reference's
// routing decisions: the engines must route the same (parity), but their own counts are not
// recorded.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "harness/scenario.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::harness {

// Per step of the reference run: its record (the aux loss) and each MoE layer's load.
using MoeSteps = std::vector<std::vector<ref::MoeLoad>>;

// Null for a dense model.
nlohmann::json moe_load_json(const Scenario& s, const std::vector<ref::StepRecord>& steps,
                             const MoeSteps& loads);
// {"kept": [per EP coordinate e, over every step and MoE layer: the assignments of experts
// [e*E/ep, (e+1)*E/ep), which the ranks at that coordinate compute (each expert-DP replica and
// TP / PP rank its share)], "max_over_mean"}; null for a dense model, ep == 1, or E % ep != 0.
nlohmann::json ep_load_json(const Scenario& s, const ParallelSpec& p, const MoeSteps& loads);

}  // namespace shardcheck::harness
