#include "harness/bubble.hpp"

#include <algorithm>
#include <map>

#include "comm/mesh.hpp"
#include "parallel/mp/pipeline.hpp"

namespace shardcheck::harness {

std::optional<PipelineResult> pipeline_bubble(const Scenario& s, const ParallelSpec& p,
                                              const std::vector<sim::TimelineEvent>& timeline,
                                              const std::vector<sim::StepTime>& steps) {
  if (p.mesh.pp == 1 || timeline.empty() || steps.empty()) return std::nullopt;
  const comm::DeviceMesh mesh(p.mesh, p.order);
  PipelineResult r;
  r.schedule = std::string(parallel::name_of(p.pp_schedule));
  r.stages = p.mesh.pp;
  r.virtual_stages = p.virtual_stages;
  r.microbatches = s.train.global_batch / (p.mesh.dp * s.train.micro_batch);
  r.formula = parallel::bubble_formula(r.stages, r.microbatches, r.virtual_stages);
  // Per step: each rank's start, and the end of the pipeline phase (the last forward/backward
  // compute of that step on any rank).
  std::map<int, double> phase_end;
  std::map<std::pair<int, int>, std::vector<parallel::Interval>> busy;  // (step, rank)
  for (const sim::TimelineEvent& e : timeline) {
    if (e.stream != sim::Stream::compute || e.step < 1 || e.name == "adamw") continue;
    busy[{e.step, e.rank}].push_back({e.start, e.end});
    phase_end[e.step] = std::max(phase_end[e.step], e.end);
  }
  std::vector<double> sum(static_cast<std::size_t>(r.stages), 0.0);
  std::vector<int> n(static_cast<std::size_t>(r.stages), 0);
  for (const sim::StepTime& st : steps) {
    const auto end = phase_end.find(st.step);
    if (end == phase_end.end() || end->second <= st.start) continue;
    const auto stage = static_cast<std::size_t>(mesh.coord(st.rank, comm::Axis::pp));
    const auto& iv = busy[{st.step, st.rank}];
    sum[stage] += parallel::measured_bubble(iv, st.start, end->second);
    ++n[stage];
  }
  double total = 0;
  for (std::size_t i = 0; i < sum.size(); ++i) {
    r.stage_bubble.push_back(n[i] > 0 ? sum[i] / n[i] : 0.0);
    total += r.stage_bubble.back();
  }
  r.measured = total / r.stages;
  return r;
}

}  // namespace shardcheck::harness
