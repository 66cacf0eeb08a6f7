// Pipeline schedules (Megatron-LM's orders), the bubble formula and measurement, and the layer
// partition by cost profile. The executor is in pipeline_run.cpp.
#include "parallel/mp/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace shardcheck::parallel {

namespace {

std::string num(int v) {
  return std::to_string(v);
}

void validate(PipeSchedule s, int p, int stage, int m, int v) {
  const std::string what = std::string(name_of(s)) + " pipeline: ";
  if (p < 1) throw PipelineError(what + "stages = " + num(p) + ", expected >= 1");
  if (stage < 0 || stage >= p) {
    throw PipelineError(what + "stage " + num(stage) + " is outside 0.." + num(p - 1));
  }
  if (m < 1) throw PipelineError(what + "microbatches = " + num(m) + ", expected >= 1");
  if (v < 1) throw PipelineError(what + "virtual_stages = " + num(v) + ", expected >= 1");
  if (s != PipeSchedule::interleaved && v != 1) {
    throw PipelineError(what + "virtual_stages = " + num(v) +
                        ", expected 1 (only the interleaved schedule runs several model chunks)");
  }
  if (p > 1 && m < p) {
    throw PipelineError(what + "microbatches = " + num(m) + " < stages = " + num(p) +
                        " (every stage needs at least one microbatch per pipeline slot)");
  }
  if (s == PipeSchedule::interleaved) {
    if (v < 2) {
      throw PipelineError(what + "virtual_stages = " + num(v) +
                          ", expected >= 2 model chunks per stage");
    }
    if (m % p != 0) {
      throw PipelineError(what + "microbatches = " + num(m) + " is not divisible by stages = " +
                          num(p) + " (microbatches go through each chunk in groups of p)");
    }
  }
}

PipeAction fwd(int mb, int chunk) {
  return {PipeAction::Kind::forward, mb, chunk};
}
PipeAction bwd(int mb, int chunk) {
  return {PipeAction::Kind::backward, mb, chunk};
}

}  // namespace

std::vector<PipeAction> pipeline_schedule(PipeSchedule s, int stages, int stage, int microbatches,
                                          int virtual_stages) {
  validate(s, stages, stage, microbatches, virtual_stages);
  const int p = stages, m = microbatches, v = virtual_stages;
  std::vector<PipeAction> out;
  out.reserve(static_cast<std::size_t>(2 * m * v));
  switch (s) {
    case PipeSchedule::gpipe:
      for (int i = 0; i < m; ++i) out.push_back(fwd(i, 0));
      for (int i = 0; i < m; ++i) out.push_back(bwd(i, 0));
      break;
    case PipeSchedule::one_f_one_b: {
      const int warmup = std::min(p - stage - 1, m);
      for (int i = 0; i < warmup; ++i) out.push_back(fwd(i, 0));
      for (int i = 0; i < m - warmup; ++i) {
        out.push_back(fwd(warmup + i, 0));
        out.push_back(bwd(i, 0));
      }
      for (int i = m - warmup; i < m; ++i) out.push_back(bwd(i, 0));
      break;
    }
    case PipeSchedule::interleaved: {
      // Megatron-LM forward_backward_pipelining_with_interleaving: the k-th forward/backward of
      // the stage, k over all m*v (microbatch, chunk) pairs.
      const int total = m * v;
      const int group = p * v;
      const auto kth = [&](int k, bool forward) {
        const int in_group = k % group;
        const int mb = (k / group) * p + in_group % p;
        const int chunk = forward ? in_group / p : v - 1 - in_group / p;
        return forward ? fwd(mb, chunk) : bwd(mb, chunk);
      };
      const int warmup = m == p ? total : std::min((p - stage - 1) * 2 + (v - 1) * p, total);
      for (int k = 0; k < warmup; ++k) out.push_back(kth(k, true));
      for (int k = 0; k < total - warmup; ++k) {
        out.push_back(kth(warmup + k, true));
        out.push_back(kth(k, false));
      }
      for (int k = total - warmup; k < total; ++k) out.push_back(kth(k, false));
      break;
    }
  }
  return out;
}

double bubble_formula(int stages, int microbatches, int virtual_stages) {
  if (stages < 1 || microbatches < 1 || virtual_stages < 1) {
    throw PipelineError("bubble_formula: stages = " + num(stages) +
                        ", microbatches = " + num(microbatches) +
                        ", virtual_stages = " + num(virtual_stages) + ", expected all >= 1");
  }
  const double idle = stages - 1;
  return idle / (static_cast<double>(virtual_stages) * microbatches + idle);
}

double measured_bubble(std::span<const Interval> compute, double step_start, double step_end) {
  if (!(step_end > step_start)) {
    throw PipelineError("measured_bubble: the step [" + std::to_string(step_start) + ", " +
                        std::to_string(step_end) + "] is empty");
  }
  std::vector<Interval> iv;
  iv.reserve(compute.size());
  for (const Interval& i : compute) {
    const double a = std::max(i.start, step_start);
    const double b = std::min(i.end, step_end);
    if (b > a) iv.push_back({a, b});
  }
  std::sort(iv.begin(), iv.end(), [](const Interval& x, const Interval& y) {
    return x.start < y.start || (x.start == y.start && x.end < y.end);
  });
  double busy = 0;
  double cur_start = 0, cur_end = 0;
  bool open = false;
  for (const Interval& i : iv) {
    if (open && i.start <= cur_end) {
      cur_end = std::max(cur_end, i.end);
      continue;
    }
    if (open) busy += cur_end - cur_start;
    cur_start = i.start;
    cur_end = i.end;
    open = true;
  }
  if (open) busy += cur_end - cur_start;
  return 1.0 - busy / (step_end - step_start);
}

double mean_measured_bubble(std::span<const std::vector<Interval>> per_stage, double step_start,
                            double step_end) {
  if (per_stage.empty()) throw PipelineError("mean_measured_bubble: no stages");
  double sum = 0;
  for (const auto& s : per_stage) sum += measured_bubble(s, step_start, step_end);
  return sum / static_cast<double>(per_stage.size());
}

std::vector<std::pair<int, int>> partition_layers(std::span<const double> layer_cost,
                                                  double first_extra, double last_extra,
                                                  int chunks) {
  const int layers = static_cast<int>(layer_cost.size());
  if (chunks < 1) throw PipelineError("partition_layers: chunks = " + num(chunks) + " < 1");
  if (layers < chunks) {
    throw PipelineError("partition_layers: " + num(layers) + " layers cannot fill " + num(chunks) +
                        " chunks (every chunk needs >= 1 layer)");
  }
  const auto bad = [](double c) { return !std::isfinite(c) || c < 0; };
  if (bad(first_extra) || bad(last_extra) ||
      std::any_of(layer_cost.begin(), layer_cost.end(), bad)) {
    throw PipelineError("partition_layers: costs must be finite and >= 0");
  }
  std::vector<double> pre(static_cast<std::size_t>(layers) + 1, 0.0);
  for (int i = 0; i < layers; ++i) {
    pre[static_cast<std::size_t>(i) + 1] =
        pre[static_cast<std::size_t>(i)] + layer_cost[static_cast<std::size_t>(i)];
  }
  // cost of chunk c holding layers [i, j)
  const auto cost = [&](int c, int i, int j) {
    double x = pre[static_cast<std::size_t>(j)] - pre[static_cast<std::size_t>(i)];
    if (c == 0) x += first_extra;
    if (c == chunks - 1) x += last_extra;
    return x;
  };
  // best[c][i]: the smallest possible largest cost of chunks c.. covering layers [i, layers).
  const double inf = std::numeric_limits<double>::infinity();
  const auto idx = [&](int c, int i) {
    return static_cast<std::size_t>(c) * static_cast<std::size_t>(layers + 1) +
           static_cast<std::size_t>(i);
  };
  std::vector<double> best(
      static_cast<std::size_t>(chunks + 1) * static_cast<std::size_t>(layers + 1), inf);
  best[idx(chunks, layers)] = 0;
  for (int c = chunks - 1; c >= 0; --c) {
    for (int i = c; i <= layers - (chunks - c); ++i) {
      double b = inf;
      // The last chunk ends at the last layer: only j = layers is finite (linear for pp = 1).
      for (int j = c == chunks - 1 ? layers : i + 1; j <= layers - (chunks - 1 - c); ++j) {
        b = std::min(b, std::max(cost(c, i, j), best[idx(c + 1, j)]));
      }
      best[idx(c, i)] = b;
    }
  }
  const double target = best[idx(0, 0)];
  // Among the partitions reaching the optimum, the most even one (least sum of squared chunk
  // costs); remaining ties give earlier chunks fewer layers (smallest j first).
  std::vector<double> even(best.size(), inf);
  std::vector<int> cut(best.size(), -1);
  even[idx(chunks, layers)] = 0;
  for (int c = chunks - 1; c >= 0; --c) {
    for (int i = c; i <= layers - (chunks - c); ++i) {
      for (int j = c == chunks - 1 ? layers : i + 1; j <= layers - (chunks - 1 - c); ++j) {
        const double x = cost(c, i, j);
        if (!(x <= target) || even[idx(c + 1, j)] == inf) continue;
        const double e = x * x + even[idx(c + 1, j)];
        if (e < even[idx(c, i)]) {
          even[idx(c, i)] = e;
          cut[idx(c, i)] = j;
        }
      }
    }
  }
  std::vector<std::pair<int, int>> out;
  out.reserve(static_cast<std::size_t>(chunks));
  for (int c = 0, i = 0; c < chunks; ++c) {
    const int j = cut[idx(c, i)];
    out.emplace_back(i, j);
    i = j;
  }
  return out;
}

}  // namespace shardcheck::parallel
