// MoE forward/backward as DESIGN.md pins it. Each token's output sums its kept choices in choice
// order (c = 0..k-1), so the result does not depend on how experts are batched or placed.
#include "reference/moe.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace shardcheck::ref {

int64_t MoeLoad::dropped() const {
  int64_t d = 0;
  for (std::size_t e = 0; e < routed.size(); ++e) d += routed[e] - kept[e];
  return d;
}

void MoeLoad::add(const MoeRouting& r) {
  for (std::size_t i = 0; i < r.choice.size(); ++i) {
    const int32_t e = r.choice[i];
    if (e < 0 || static_cast<std::size_t>(e) >= routed.size()) continue;
    ++routed[static_cast<std::size_t>(e)];
    kept[static_cast<std::size_t>(e)] += r.kept[i] != 0;
  }
}

void MoeLoad::merge(const MoeLoad& other) {
  if (other.layer != layer || other.routed.size() != routed.size())
    throw std::invalid_argument("MoeLoad::merge: layer " + std::to_string(other.layer) + " with " +
                                std::to_string(other.routed.size()) + " experts into layer " +
                                std::to_string(layer) + " with " + std::to_string(routed.size()));
  for (std::size_t e = 0; e < routed.size(); ++e) {
    routed[e] += other.routed[e];
    kept[e] += other.kept[e];
  }
}

void merge_loads(std::vector<MoeLoad>& into, const std::vector<MoeLoad>& from) {
  if (into.empty()) {
    into = from;
    return;
  }
  if (from.empty()) return;
  if (from.size() != into.size())
    throw std::invalid_argument("merge_loads: " + std::to_string(from.size()) +
                                " MoE layers into " + std::to_string(into.size()));
  for (std::size_t i = 0; i < into.size(); ++i) into[i].merge(from[i]);
}

int64_t moe_capacity(const MoeSpec& spec, int64_t s) {
  const double c = spec.capacity_factor * static_cast<double>(s) * spec.top_k / spec.experts;
  return static_cast<int64_t>(std::ceil(c - 1e-9));
}

// Row of each kept slot (t * k + choice) inside its expert's batch: experts take first choices
// in token order, then second choices, ... (the fill order of route()); -1 for dropped slots.
static std::vector<int64_t> expert_rows(const MoeRouting& r, int e_n, int k, int64_t s) {
  std::vector<int64_t> cursor(static_cast<size_t>(e_n), 0);
  std::vector<int64_t> row_of(static_cast<size_t>(s * k), -1);
  for (int ci = 0; ci < k; ++ci)
    for (int64_t t = 0; t < s; ++t) {
      const size_t slot = static_cast<size_t>(t * k + ci);
      if (r.kept[slot]) row_of[slot] = cursor[static_cast<size_t>(r.choice[slot])]++;
    }
  return row_of;
}

template <class T>
Tensor<T> moe_forward(const Tensor<T>& x, std::span<const int32_t> doc_ids, const Tensor<T>& router,
                      const std::vector<const Tensor<T>*>& w_gate,
                      const std::vector<const Tensor<T>*>& w_up,
                      const std::vector<const Tensor<T>*>& w_down, const MoeSpec& spec,
                      std::type_identity_t<MoeCache<T>>* cache_out, double* aux) {
  const int64_t s = x.dim(0), h = x.dim(1);
  const int e_n = spec.experts, k = spec.top_k;
  REF_CHECK(k >= 1 && k <= e_n, "top_k must be in [1, experts]");
  MoeCache<T> local;
  MoeCache<T>& c = cache_out ? *cache_out : local;
  c = MoeCache<T>{};

  // Router softmax.
  Tensor<T> logits = linear_forward(x, router);
  c.probs = Tensor<T>({s, e_n});
  for (int64_t t = 0; t < s; ++t) {
    T mx = logits.at(t, 0);
    for (int e = 1; e < e_n; ++e) mx = std::max(mx, logits.at(t, e));
    T sum = 0;
    for (int e = 0; e < e_n; ++e) sum += (c.probs.at(t, e) = std::exp(logits.at(t, e) - mx));
    for (int e = 0; e < e_n; ++e) c.probs.at(t, e) /= sum;
  }

  // Top-k (strictly greater wins, so ties go to the lower expert) and renormalised gates.
  MoeRouting& r = c.routing;
  r.choice.assign(static_cast<size_t>(s * k), -1);
  r.kept.assign(static_cast<size_t>(s * k), 0);
  r.f.assign(static_cast<size_t>(e_n), 0.0);
  c.gate.assign(static_cast<size_t>(s * k), T{0});
  std::vector<double> p_mean(static_cast<size_t>(e_n), 0.0);
  for (int64_t t = 0; t < s; ++t) {
    if (doc_ids[static_cast<size_t>(t)] < 0) continue;
    ++r.routed_tokens;
    std::vector<uint8_t> taken(static_cast<size_t>(e_n), 0);
    T total = 0;
    for (int ci = 0; ci < k; ++ci) {
      int best = -1;
      for (int e = 0; e < e_n; ++e)
        if (!taken[static_cast<size_t>(e)] && (best < 0 || c.probs.at(t, e) > c.probs.at(t, best)))
          best = e;
      taken[static_cast<size_t>(best)] = 1;
      r.choice[static_cast<size_t>(t * k + ci)] = best;
      total += c.probs.at(t, best);
      r.f[static_cast<size_t>(best)] += 1.0;
    }
    for (int ci = 0; ci < k; ++ci) {
      const size_t slot = static_cast<size_t>(t * k + ci);
      c.gate[slot] = c.probs.at(t, r.choice[slot]) / total;
    }
    for (int e = 0; e < e_n; ++e)
      p_mean[static_cast<size_t>(e)] += static_cast<double>(c.probs.at(t, e));
  }

  // Capacity: all first choices in token order, then all second choices, ...
  const int64_t cap = moe_capacity(spec, s);
  c.rows.assign(static_cast<size_t>(e_n), {});
  for (int ci = 0; ci < k; ++ci)
    for (int64_t t = 0; t < s; ++t) {
      const size_t slot = static_cast<size_t>(t * k + ci);
      const int e = r.choice[slot];
      if (e < 0) continue;
      auto& rows = c.rows[static_cast<size_t>(e)];
      if (static_cast<int64_t>(rows.size()) < cap) {
        rows.push_back(t);
        r.kept[slot] = 1;
      } else {
        ++r.dropped;
      }
    }

  // Experts on their gathered rows.
  c.in.assign(static_cast<size_t>(e_n), {});
  c.out.assign(static_cast<size_t>(e_n), {});
  c.mlp.assign(static_cast<size_t>(e_n), {});
  for (int e = 0; e < e_n; ++e) {
    const auto& rows = c.rows[static_cast<size_t>(e)];
    Tensor<T> in({static_cast<int64_t>(rows.size()), h});
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t col = 0; col < h; ++col)
        in.at(static_cast<int64_t>(i), col) = x.at(rows[i], col);
    const auto ei = static_cast<size_t>(e);
    c.out[ei] =
        mlp_forward(in, w_gate.empty() ? nullptr : w_gate[ei], *w_up[ei], *w_down[ei], &c.mlp[ei]);
    c.in[static_cast<size_t>(e)] = std::move(in);
  }

  // Combine in choice order; row_of[slot] is the kept slot's row in its expert's batch.
  Tensor<T> y({s, h});
  const std::vector<int64_t> row_of = expert_rows(r, e_n, k, s);
  for (int64_t t = 0; t < s; ++t)
    for (int ci = 0; ci < k; ++ci) {
      const size_t slot = static_cast<size_t>(t * k + ci);
      if (!r.kept[slot]) continue;
      const Tensor<T>& out = c.out[static_cast<size_t>(r.choice[slot])];
      for (int64_t col = 0; col < h; ++col)
        y.at(t, col) += c.gate[slot] * out.at(row_of[slot], col);
    }

  double a = 0.0;
  if (r.routed_tokens > 0) {
    const auto n = static_cast<double>(r.routed_tokens);
    for (int e = 0; e < e_n; ++e) {
      r.f[static_cast<size_t>(e)] /= n * k;
      a += r.f[static_cast<size_t>(e)] * p_mean[static_cast<size_t>(e)] / n;
    }
    a *= spec.aux_coef * e_n;
  }
  if (aux) *aux = a;
  return y;
}

template <class T>
Tensor<T> moe_backward(const Tensor<T>& dy, const Tensor<T>& x, const Tensor<T>& router,
                       const std::vector<const Tensor<T>*>& w_gate,
                       const std::vector<const Tensor<T>*>& w_up,
                       const std::vector<const Tensor<T>*>& w_down, const MoeSpec& spec,
                       const MoeCache<T>& c, double aux_weight, Tensor<T>& drouter,
                       const std::vector<Tensor<T>*>& dw_gate, const std::vector<Tensor<T>*>& dw_up,
                       const std::vector<Tensor<T>*>& dw_down) {
  const int64_t s = x.dim(0), h = x.dim(1);
  const int e_n = spec.experts, k = spec.top_k;
  const MoeRouting& r = c.routing;
  Tensor<T> dx({s, h});

  // Row of each kept slot inside its expert's batch (same order as the forward fill).
  const std::vector<int64_t> row_of = expert_rows(r, e_n, k, s);

  // Gradients of expert outputs and of gates.
  std::vector<Tensor<T>> dout(static_cast<size_t>(e_n));
  for (int e = 0; e < e_n; ++e)
    dout[static_cast<size_t>(e)] = Tensor<T>(c.out[static_cast<size_t>(e)].shape());
  std::vector<T> dgate(static_cast<size_t>(s * k), T{0});
  for (int64_t t = 0; t < s; ++t)
    for (int ci = 0; ci < k; ++ci) {
      const size_t slot = static_cast<size_t>(t * k + ci);
      if (!r.kept[slot]) continue;
      const auto e = static_cast<size_t>(r.choice[slot]);
      T acc = 0;
      for (int64_t col = 0; col < h; ++col) {
        acc += dy.at(t, col) * c.out[e].at(row_of[slot], col);
        dout[e].at(row_of[slot], col) = c.gate[slot] * dy.at(t, col);
      }
      dgate[slot] = acc;
    }

  for (int e = 0; e < e_n; ++e) {
    const auto ei = static_cast<size_t>(e);
    Tensor<T> din = mlp_backward(dout[ei], c.in[ei], w_gate.empty() ? nullptr : w_gate[ei],
                                 *w_up[ei], *w_down[ei], c.mlp[ei],
                                 dw_gate.empty() ? nullptr : dw_gate[ei], *dw_up[ei], *dw_down[ei]);
    const auto& rows = c.rows[ei];
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t col = 0; col < h; ++col)
        dx.at(rows[i], col) += din.at(static_cast<int64_t>(i), col);
  }

  // d probs: from the gates g_c = p_{e_c} / sum_c' p_{e_c'} and from the aux loss (via P_e only;
  // f_e counts discrete choices and has no gradient).
  Tensor<T> dprobs({s, e_n});
  const double n = static_cast<double>(r.routed_tokens);
  for (int64_t t = 0; t < s; ++t) {
    if (r.choice[static_cast<size_t>(t * k)] < 0) continue;
    T total = 0, gdot = 0;
    for (int ci = 0; ci < k; ++ci) {
      const size_t slot = static_cast<size_t>(t * k + ci);
      total += c.probs.at(t, r.choice[slot]);
      gdot += dgate[slot] * c.gate[slot];
    }
    for (int ci = 0; ci < k; ++ci) {
      const size_t slot = static_cast<size_t>(t * k + ci);
      dprobs.at(t, r.choice[slot]) += (dgate[slot] - gdot) / total;
    }
    for (int e = 0; e < e_n; ++e)
      dprobs.at(t, e) +=
          static_cast<T>(aux_weight * spec.aux_coef * e_n * r.f[static_cast<size_t>(e)] / n);
  }

  // Softmax backward, then the router's linear backward.
  Tensor<T> dlogits({s, e_n});
  for (int64_t t = 0; t < s; ++t) {
    T dot = 0;
    for (int e = 0; e < e_n; ++e) dot += c.probs.at(t, e) * dprobs.at(t, e);
    for (int e = 0; e < e_n; ++e) dlogits.at(t, e) = c.probs.at(t, e) * (dprobs.at(t, e) - dot);
  }
  add_inplace(dx, linear_backward(dlogits, x, router, drouter));
  return dx;
}

#define REF_INSTANTIATE(T)                                                                        \
  template Tensor<T> moe_forward(                                                                 \
      const Tensor<T>&, std::span<const int32_t>, const Tensor<T>&,                               \
      const std::vector<const Tensor<T>*>&, const std::vector<const Tensor<T>*>&,                 \
      const std::vector<const Tensor<T>*>&, const MoeSpec&, MoeCache<T>*, double*);               \
  template Tensor<T> moe_backward(                                                                \
      const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const std::vector<const Tensor<T>*>&, \
      const std::vector<const Tensor<T>*>&, const std::vector<const Tensor<T>*>&, const MoeSpec&, \
      const MoeCache<T>&, double, Tensor<T>&, const std::vector<Tensor<T>*>&,                     \
      const std::vector<Tensor<T>*>&, const std::vector<Tensor<T>*>&);
REF_INSTANTIATE(double)
REF_INSTANTIATE(float)
#undef REF_INSTANTIATE

}  // namespace shardcheck::ref
