// Step phases from the timeline (phases.hpp).
#include "harness/phases.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace shardcheck::harness {
namespace {

using Span = std::pair<double, double>;

// The union of the spans, sorted and merged.
std::vector<Span> merged(std::vector<Span> v) {
  std::sort(v.begin(), v.end());
  std::vector<Span> out;
  for (const Span& s : v) {
    if (!out.empty() && s.first <= out.back().second)
      out.back().second = std::max(out.back().second, s.second);
    else
      out.push_back(s);
  }
  return out;
}

double length(const std::vector<Span>& v) {
  double n = 0;
  for (const Span& s : v) n += s.second - s.first;
  return n;
}

// Length of a minus b (both merged).
double minus(const std::vector<Span>& a, const std::vector<Span>& b) {
  double n = 0;
  std::size_t j = 0;
  for (const Span& s : a) {
    double at = s.first;
    while (j < b.size() && b[j].second <= at) ++j;
    for (std::size_t k = j; k < b.size() && b[k].first < s.second; ++k) {
      if (b[k].first > at) n += b[k].first - at;
      at = std::max(at, b[k].second);
      if (at >= s.second) break;
    }
    if (at < s.second) n += s.second - at;
  }
  return n;
}

// By the op's name, and by the pass it ran in: a forward op inside a backward pass recomputes
// what the forward did not keep (full activation checkpointing re-runs the block).
Phase compute_phase(const sim::TimelineEvent& e) {
  const std::string& name = e.name;
  if (name.find("recompute") != std::string::npos) return Phase::recompute;
  if (name.find("backward") != std::string::npos) return Phase::backward;
  if (name == "adamw" || name.find("optimizer") != std::string::npos) return Phase::optimizer;
  if (e.scope.pass == comm::WorkScope::Pass::backward) return Phase::recompute;
  return Phase::forward;
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, k == 0 ? 0 : k - 1)];
}

}  // namespace

const char* phase_key(Phase p) {
  static constexpr const char* kKeys[] = {"forward",      "backward",  "recompute", "optimizer",
                                          "exposed_comm", "comm_busy", "idle"};
  return kKeys[static_cast<int>(p)];
}

StepPhases step_phases(const std::vector<sim::TimelineEvent>& timeline,
                       const std::vector<sim::StepTime>& steps, int ranks, int max_step) {
  StepPhases out;
  if (ranks < 1 || timeline.empty()) return out;
  struct Acc {
    std::array<double, kPhases> sum{};
    std::vector<Span> compute, comm;
  };
  std::map<std::pair<int, int>, Acc> by;  // (rank, step)
  for (const sim::TimelineEvent& e : timeline) {
    if (e.step < 1 || e.step > max_step || e.rank < 0 || e.rank >= ranks) continue;
    Acc& a = by[{e.rank, e.step}];
    if (e.stream == sim::Stream::compute) {
      a.sum[static_cast<std::size_t>(compute_phase(e))] += e.end - e.start;
      a.compute.emplace_back(e.start, e.end);
    } else {
      a.comm.emplace_back(e.start, e.end);
    }
  }
  out.per_rank.assign(static_cast<std::size_t>(ranks), {});
  std::vector<int> n(static_cast<std::size_t>(ranks), 0);
  for (const sim::StepTime& st : steps) {
    if (st.step < 1 || st.step > max_step || st.rank < 0 || st.rank >= ranks) continue;
    Acc& a = by[{st.rank, st.step}];
    const std::vector<Span> compute = merged(a.compute), comm = merged(a.comm);
    std::vector<Span> both = compute;
    both.insert(both.end(), comm.begin(), comm.end());
    a.sum[static_cast<std::size_t>(Phase::exposed_comm)] = minus(comm, compute);
    a.sum[static_cast<std::size_t>(Phase::comm_busy)] = length(comm);
    a.sum[static_cast<std::size_t>(Phase::idle)] =
        std::max(0.0, st.seconds() - length(merged(both)));
    auto& row = out.per_rank[static_cast<std::size_t>(st.rank)];
    for (int p = 0; p < kPhases; ++p)
      row[static_cast<std::size_t>(p)] += a.sum[static_cast<std::size_t>(p)];
    ++n[static_cast<std::size_t>(st.rank)];
  }
  for (int r = 0; r < ranks; ++r)
    if (n[static_cast<std::size_t>(r)] > 0)
      for (double& v : out.per_rank[static_cast<std::size_t>(r)])
        v /= n[static_cast<std::size_t>(r)];
  out.valid = std::any_of(n.begin(), n.end(), [](int k) { return k > 0; });
  for (int p = 0; p < kPhases; ++p) {
    std::vector<double> v;
    int slowest = 0;
    for (int r = 0; r < ranks; ++r) {
      const double x = out.per_rank[static_cast<std::size_t>(r)][static_cast<std::size_t>(p)];
      v.push_back(x);
      if (x > out.per_rank[static_cast<std::size_t>(slowest)][static_cast<std::size_t>(p)])
        slowest = r;
    }
    std::sort(v.begin(), v.end());
    out.stats[static_cast<std::size_t>(p)] = {percentile(v, 0.5), percentile(v, 0.95), v.back(),
                                              slowest};
  }
  return out;
}

}  // namespace shardcheck::harness
