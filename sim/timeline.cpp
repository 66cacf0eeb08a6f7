// Step-time summary of a timeline (percentiles, the slowest rank).
#include "sim/timeline.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace shardcheck::sim {

std::string_view name_of(Stream s) {
  return s == Stream::compute ? "compute" : "comm";
}

StepSummary summarize(const std::vector<StepTime>& steps) {
  StepSummary out;
  if (steps.empty()) return out;
  std::vector<double> t;
  std::map<int, double> per_step_max, per_rank_total;
  for (const StepTime& s : steps) {
    t.push_back(s.seconds());
    auto& m = per_step_max[s.step];
    m = std::max(m, s.seconds());
    per_rank_total[s.rank] += s.seconds();
  }
  std::sort(t.begin(), t.end());
  auto pct = [&](double p) {
    const auto i = static_cast<std::size_t>(std::ceil(p * static_cast<double>(t.size())));
    return t[std::min(t.size() - 1, i == 0 ? 0 : i - 1)];
  };
  out.p50 = pct(0.50);
  out.p95 = pct(0.95);
  out.max = t.back();
  out.samples = t.size();
  double sum = 0;
  for (const auto& [step, m] : per_step_max) sum += m;
  out.step_time = sum / static_cast<double>(per_step_max.size());
  double worst = -1;
  for (const auto& [rank, total] : per_rank_total)
    if (total > worst) {
      worst = total;
      out.slowest_rank = rank;
    }
  return out;
}

}  // namespace shardcheck::sim
