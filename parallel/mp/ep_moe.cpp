// Expert-parallel MoE: whole-sequence routing on every rank holding part of the sequence, then
// dispatch/combine of the local rows' kept assignments with all_to_all_v over the EP group.
// Every per-row quantity (router softmax, expert MLP output, combine sum in choice order) is
// computed by the same code in the same order as ref::moe_forward, so the outputs match it
// bitwise; sums across rows (expert and router weight gradients) differ only in order.
#include "parallel/mp/ep_moe.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "parallel/costs.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::parallel {
namespace {

using Counts = std::vector<std::size_t>;

template <class T>
ref::Tensor<T> softmax_rows(const ref::Tensor<T>& logits) {
  const int64_t n = logits.dim(0), e_n = logits.dim(1);
  ref::Tensor<T> p({n, e_n});
  if constexpr (!kIsMeta<T>) {
    for (int64_t t = 0; t < n; ++t) {
      T mx = logits.at(t, 0);
      for (int64_t e = 1; e < e_n; ++e) mx = std::max(mx, logits.at(t, e));
      T sum = 0;
      for (int64_t e = 0; e < e_n; ++e) sum += (p.at(t, e) = std::exp(logits.at(t, e) - mx));
      for (int64_t e = 0; e < e_n; ++e) p.at(t, e) /= sum;
    }
  }
  return p;
}

// The reference's routing of the whole sequence from its probabilities [S, E].
template <class T>
struct Routing {
  std::vector<int32_t> choice;
  std::vector<uint8_t> kept;
  std::vector<T> gate;
  std::vector<double> f;
  int64_t routed = 0, dropped = 0;
  double aux = 0.0;
};

template <class T>
Routing<T> route(const ref::Tensor<T>& probs, std::span<const int32_t> doc_ids,
                 const ref::MoeSpec& spec, testing::Mutation planted) {
  const int64_t s = probs.dim(0);
  const int e_n = spec.experts, k = spec.top_k;
  const auto sk = static_cast<std::size_t>(s * k);
  Routing<T> r;
  r.choice.assign(sk, -1);
  r.kept.assign(sk, 0);
  r.gate.assign(sk, T{0});
  r.f.assign(static_cast<std::size_t>(e_n), 0.0);
  std::vector<double> p_mean(static_cast<std::size_t>(e_n), 0.0);
  for (int64_t t = 0; t < s; ++t) {
    if (doc_ids[static_cast<std::size_t>(t)] < 0) continue;
    ++r.routed;
    std::vector<uint8_t> taken(static_cast<std::size_t>(e_n), 0);
    T total = 0;
    for (int ci = 0; ci < k; ++ci) {
      int best = -1;
      for (int e = 0; e < e_n; ++e)
        if (!taken[static_cast<std::size_t>(e)] && (best < 0 || probs.at(t, e) > probs.at(t, best)))
          best = e;
      taken[static_cast<std::size_t>(best)] = 1;
      r.choice[static_cast<std::size_t>(t * k + ci)] = best;
      total += probs.at(t, best);
      r.f[static_cast<std::size_t>(best)] += 1.0;
    }
    for (int ci = 0; ci < k; ++ci) {
      const auto slot = static_cast<std::size_t>(t * k + ci);
      r.gate[slot] = probs.at(t, r.choice[slot]) / total;
    }
    for (int e = 0; e < e_n; ++e)
      p_mean[static_cast<std::size_t>(e)] += static_cast<double>(probs.at(t, e));
  }
  // Capacity: first choices in token order, then second choices, ...
  const int64_t cap = ref::moe_capacity(spec, s);
  const bool no_capacity = planted == testing::Mutation::kRouteDroppedTokens;
  std::vector<int64_t> used(static_cast<std::size_t>(e_n), 0);
  for (int ci = 0; ci < k; ++ci)
    for (int64_t t = 0; t < s; ++t) {
      const auto slot = static_cast<std::size_t>(t * k + ci);
      const int e = r.choice[slot];
      if (e < 0) continue;
      if (no_capacity || used[static_cast<std::size_t>(e)] < cap) {
        ++used[static_cast<std::size_t>(e)];
        r.kept[slot] = 1;
      } else {
        ++r.dropped;
      }
    }
  if (r.routed > 0) {
    const auto n = static_cast<double>(r.routed);
    for (int e = 0; e < e_n; ++e) {
      r.f[static_cast<std::size_t>(e)] /= n * k;
      r.aux += r.f[static_cast<std::size_t>(e)] * p_mean[static_cast<std::size_t>(e)] / n;
    }
    r.aux *= spec.aux_coef * e_n;
  }
  return r;
}

// Rows [sum(send_rows), h] to EP peers (send_rows[d] rows to rank d, contiguous in rank order);
// returns the rows received [sum(recv_rows), h], in source-rank order.
template <class T>
ref::Tensor<T> exchange(comm::Communicator& ep, const ref::Tensor<T>& send,
                        const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows, int64_t h) {
  int64_t total = 0;
  for (const int64_t r : recv_rows) total += r;
  if (ep.size() == 1) return send;
  ref::Tensor<T> recv({total, h});
  Counts sc, rc;
  for (const int64_t r : send_rows) sc.push_back(static_cast<std::size_t>(r * h));
  for (const int64_t r : recv_rows) rc.push_back(static_cast<std::size_t>(r * h));
  ep.all_to_all_v(cbuffer_of(send), sc, buffer_of(recv), rc)->wait();
  return recv;
}

// Rows per EP peer from per-expert counts ([ep * epl], peer-major).
std::vector<int64_t> per_peer(const std::vector<int64_t>& per_expert, int ep, int epl) {
  std::vector<int64_t> out(static_cast<std::size_t>(ep), 0);
  for (int d = 0; d < ep; ++d)
    for (int j = 0; j < epl; ++j)
      out[static_cast<std::size_t>(d)] += per_expert[static_cast<std::size_t>(d * epl + j)];
  return out;
}

// Offset of (source rank src, local expert j) in the received buffer, and of (src, j) inside
// expert j's batch.
struct RecvIndex {
  std::vector<int64_t> buf_off;     // [ep * epl]
  std::vector<int64_t> batch_off;   // [ep * epl]
  std::vector<int64_t> batch_rows;  // [epl]
};
RecvIndex recv_index(const std::vector<int64_t>& recv_count, int ep, int epl) {
  RecvIndex ix;
  ix.buf_off.assign(recv_count.size(), 0);
  ix.batch_off.assign(recv_count.size(), 0);
  ix.batch_rows.assign(static_cast<std::size_t>(epl), 0);
  int64_t off = 0;
  for (int src = 0; src < ep; ++src)
    for (int j = 0; j < epl; ++j) {
      const auto q = static_cast<std::size_t>(src * epl + j);
      ix.buf_off[q] = off;
      off += recv_count[q];
      ix.batch_off[q] = ix.batch_rows[static_cast<std::size_t>(j)];
      ix.batch_rows[static_cast<std::size_t>(j)] += recv_count[q];
    }
  return ix;
}

// (Meta: nothing to copy.)
template <class T>
void copy_rows(const ref::Tensor<T>& from, int64_t from_row, ref::Tensor<T>& to, int64_t to_row,
               int64_t rows, int64_t h) {
  if constexpr (!kIsMeta<T>)
    std::copy_n(from.data() + from_row * h, rows * h, to.data() + to_row * h);
}

// Per local expert j, the batch of rows it received (sources in EP-rank order).
template <class T>
std::vector<ref::Tensor<T>> split_batches(const ref::Tensor<T>& recv, const RecvIndex& ix,
                                          const std::vector<int64_t>& recv_count, int ep, int epl,
                                          int64_t h) {
  std::vector<ref::Tensor<T>> out;
  for (int j = 0; j < epl; ++j) out.emplace_back(ref::Shape{ix.batch_rows[j], h});
  for (int src = 0; src < ep; ++src)
    for (int j = 0; j < epl; ++j) {
      const auto q = static_cast<std::size_t>(src * epl + j);
      copy_rows(recv, ix.buf_off[q], out[static_cast<std::size_t>(j)], ix.batch_off[q],
                recv_count[q], h);
    }
  return out;
}

// Inverse of split_batches: per-expert batches back into the received buffer's layout.
template <class T>
ref::Tensor<T> join_batches(const std::vector<ref::Tensor<T>>& batches, const RecvIndex& ix,
                            const std::vector<int64_t>& recv_count, int ep, int epl, int64_t h) {
  int64_t total = 0;
  for (const int64_t r : recv_count) total += r;
  ref::Tensor<T> out({total, h});
  for (int src = 0; src < ep; ++src)
    for (int j = 0; j < epl; ++j) {
      const auto q = static_cast<std::size_t>(src * epl + j);
      copy_rows(batches[static_cast<std::size_t>(j)], ix.batch_off[q], out, ix.buf_off[q],
                recv_count[q], h);
    }
  return out;
}

// The rows of local expert j's batch that came from the EP ranks of one part (part_of_source),
// in source order: taken out of a [rows, c] tensor of the batch, and put back into one.
struct PartRows {
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first row in the batch, rows)
  int64_t total = 0;
  template <class T>
  ref::Tensor<T> take(const ref::Tensor<T>& batch) const {
    const int64_t c = batch.dim(1);
    ref::Tensor<T> out({total, c});
    int64_t at = 0;
    for (const auto& [first, rows] : runs) {
      copy_rows(batch, first, out, at, rows, c);
      at += rows;
    }
    return out;
  }
  template <class T>
  void put(const ref::Tensor<T>& part, ref::Tensor<T>& batch) const {
    const int64_t c = batch.dim(1);
    int64_t at = 0;
    for (const auto& [first, rows] : runs) {
      copy_rows(part, at, batch, first, rows, c);
      at += rows;
    }
  }
};
PartRows part_rows(const RecvIndex& ix, const std::vector<int64_t>& recv_count,
                   std::span<const int> part_of_source, int part, int j, int epl) {
  PartRows r;
  for (std::size_t src = 0; src < part_of_source.size(); ++src) {
    if (part_of_source[src] != part) continue;
    const auto q = src * static_cast<std::size_t>(epl) + static_cast<std::size_t>(j);
    if (recv_count[q] == 0) continue;
    r.runs.emplace_back(ix.batch_off[q], recv_count[q]);
    r.total += recv_count[q];
  }
  return r;
}

}  // namespace

double routed_rows_per_peer(const ref::MoeSpec& spec, int64_t seq_len, double rows, int ep,
                            MoeRouting routing) {
  if (routing == MoeRouting::capacity) {
    const double cap = static_cast<double>(std::min(ref::moe_capacity(spec, seq_len), seq_len));
    const double per_expert = std::ceil(cap * rows / static_cast<double>(seq_len) - 1e-9);
    return static_cast<double>(spec.experts / ep) * per_expert;
  }
  const double assignments = rows * spec.top_k;
  return ep > 1 ? std::ceil(assignments / ep) : assignments;
}

template <class T>
ref::Tensor<T> ep_moe_forward(const EpGroups& g, const TokenLayout& layout, const ref::Tensor<T>& x,
                              std::span<const int32_t> doc_ids, const ref::Tensor<T>& router,
                              const std::vector<const ref::Tensor<T>*>& local_w_gate,
                              const std::vector<const ref::Tensor<T>*>& local_w_up,
                              const std::vector<const ref::Tensor<T>*>& local_w_down,
                              const ref::MoeSpec& spec, EpMoeCache<T>& c, double* aux,
                              int64_t* dropped, testing::Mutation planted, MoeRouting routing) {
  if (g.ep == nullptr) throw std::invalid_argument("ep_moe_forward: the ep group is required");
  const int ep = g.ep->size(), e_n = spec.experts, k = spec.top_k;
  if (e_n < 1 || k < 1 || k > e_n)
    throw std::invalid_argument("ep_moe_forward: top_k " + std::to_string(k) +
                                " must be in [1, experts = " + std::to_string(e_n) + "]");
  if (e_n % ep != 0)
    throw LayoutError("expert parallelism: " + std::to_string(e_n) +
                      " experts are not divisible by ep = " + std::to_string(ep));
  const int epl = e_n / ep;
  if (static_cast<int>(local_w_up.size()) != epl || static_cast<int>(local_w_down.size()) != epl ||
      !(local_w_gate.empty() || static_cast<int>(local_w_gate.size()) == epl))
    throw std::invalid_argument("ep_moe_forward: expected " + std::to_string(epl) +
                                " local experts, got " + std::to_string(local_w_up.size()));
  const int64_t s = layout.seq_len(), n = x.dim(0), h = x.dim(1);
  if (static_cast<int64_t>(doc_ids.size()) != s || n != layout.row_count() || router.dim(0) != h ||
      router.dim(1) != e_n)
    throw std::invalid_argument("ep_moe_forward: shapes of x, doc_ids or router do not match");
  if (layout.cp() > 1 && g.cp == nullptr)
    throw std::invalid_argument("ep_moe_forward: CP layout needs the cp group");
  const bool sp = layout.sp() && layout.tp() > 1;
  if (sp && g.tp == nullptr)
    throw std::invalid_argument("ep_moe_forward: SP layout needs the tp group");

  c = EpMoeCache<T>{};
  c.spec = spec;
  c.seq_len = s;
  c.router = &router;
  c.w_gate = local_w_gate;
  c.w_up = local_w_up;
  c.w_down = local_w_down;
  c.x = x;

  // Router on the local rows, then the whole sequence's probabilities and routing.
  c.probs = softmax_rows(ref::linear_forward(x, router));
  g.ep->compute(costs::moe_router(static_cast<double>(n), static_cast<double>(h),
                                  static_cast<double>(e_n), kElemBytes<T>));
  ref::Tensor<T> full;
  if (layout.cp() > 1)
    full = gather_sequence(layout, *g.cp, g.tp, c.probs);
  else
    full = sp ? sp_gather(*g.tp, c.probs) : c.probs;
  c.send_count.assign(static_cast<std::size_t>(e_n), 0);
  int64_t nsend = 0;
  if constexpr (kIsMeta<T>) {
    // The assumption's rows to each expert: uniform puts each peer's on its first expert.
    const double per_peer_rows = routed_rows_per_peer(spec, s, static_cast<double>(n), ep, routing);
    for (int e = 0; e < e_n; ++e) {
      if (routing == MoeRouting::capacity)
        c.send_count[static_cast<std::size_t>(e)] = static_cast<int64_t>(per_peer_rows) / epl;
      else if (e % epl == 0)
        c.send_count[static_cast<std::size_t>(e)] = static_cast<int64_t>(per_peer_rows);
      nsend += c.send_count[static_cast<std::size_t>(e)];
    }
    if (aux) *aux = 0.0;
    if (dropped) *dropped = 0;
  } else {
    const std::vector<int64_t> rows = layout.rows(g.cp ? g.cp->rank() : 0, sp ? g.tp->rank() : 0);
    const Routing<T> r = route(full, doc_ids, spec, planted);
    if (aux) *aux = r.aux;
    if (dropped) *dropped = r.dropped;
    c.f = r.f;
    c.routed_tokens = r.routed;
    c.choice.resize(static_cast<std::size_t>(n * k));
    c.kept.resize(c.choice.size());
    c.gate.resize(c.choice.size());
    for (int64_t i = 0; i < n; ++i)
      for (int ci = 0; ci < k; ++ci) {
        const auto from = static_cast<std::size_t>(rows[static_cast<std::size_t>(i)] * k + ci);
        const auto to = static_cast<std::size_t>(i * k + ci);
        c.choice[to] = r.choice[from];
        c.kept[to] = r.kept[from];
        c.gate[to] = r.gate[from];
      }
    // Dispatch: kept slots ordered by expert (so by destination rank), then choice, then row.
    for (int e = 0; e < e_n; ++e)
      for (int ci = 0; ci < k; ++ci)
        for (int64_t i = 0; i < n; ++i) {
          const auto slot = static_cast<std::size_t>(i * k + ci);
          if (c.kept[slot] && c.choice[slot] == e) {
            c.send_slots.push_back(static_cast<int64_t>(slot));
            ++c.send_count[static_cast<std::size_t>(e)];
          }
        }
    nsend = static_cast<int64_t>(c.send_slots.size());
  }
  c.recv_count.assign(static_cast<std::size_t>(e_n), 0);
  if (ep > 1)
    g.ep->all_to_all(comm::cview(std::span<const int64_t>(c.send_count)),
                     comm::view(std::span<int64_t>(c.recv_count)))
        ->wait();
  // One EP rank keeps its rows; under the timing-only assumption every rank sends alike, so each
  // receives from every peer what it sends to it (a timing-only exchange moves no counts).
  if (ep == 1 || kIsMeta<T>) c.recv_count = c.send_count;
  ref::Tensor<T> send({nsend, h});
  for (int64_t p = 0; p < static_cast<int64_t>(c.send_slots.size()); ++p)
    copy_rows(x, c.send_slots[static_cast<std::size_t>(p)] / k, send, p, 1, h);
  const std::vector<int64_t> to_peer = per_peer(c.send_count, ep, epl);
  const std::vector<int64_t> from_peer = per_peer(c.recv_count, ep, epl);
  const ref::Tensor<T> recv = exchange(*g.ep, send, to_peer, from_peer, h);

  // Local experts on every row they received.
  const RecvIndex ix = recv_index(c.recv_count, ep, epl);
  c.in = split_batches(recv, ix, c.recv_count, ep, epl, h);
  c.mlp.assign(static_cast<std::size_t>(epl), {});
  std::vector<ref::Tensor<T>> outs(static_cast<std::size_t>(epl));
  int64_t kept = 0;
  for (int j = 0; j < epl; ++j) {
    const auto ju = static_cast<std::size_t>(j);
    outs[ju] = ref::mlp_forward(c.in[ju], local_w_gate.empty() ? nullptr : local_w_gate[ju],
                                *local_w_up[ju], *local_w_down[ju], &c.mlp[ju]);
    kept += ix.batch_rows[ju];
  }
  g.ep->compute(costs::moe_experts_forward(static_cast<double>(kept), static_cast<double>(h),
                                           static_cast<double>(local_w_up.front()->dim(1)),
                                           !local_w_gate.empty()));

  // Combine: outputs back to the senders, then y_t = sum of kept choices in choice order.
  c.out = exchange(*g.ep, join_batches(outs, ix, c.recv_count, ep, epl, h), from_peer, to_peer, h);
  ref::Tensor<T> y({n, h});
  if constexpr (!kIsMeta<T>) {
    std::vector<int64_t> pos(static_cast<std::size_t>(n * k), -1);
    for (int64_t p = 0; p < nsend; ++p) pos[static_cast<std::size_t>(c.send_slots[p])] = p;
    for (int64_t i = 0; i < n; ++i)
      for (int ci = 0; ci < k; ++ci) {
        const auto slot = static_cast<std::size_t>(i * k + ci);
        if (!c.kept[slot]) continue;
        for (int64_t col = 0; col < h; ++col)
          y.at(i, col) += c.gate[slot] * c.out.at(pos[slot], col);
      }
  }
  return y;
}

template <class T>
ref::Tensor<T> ep_moe_backward(const EpGroups& g, const ref::Tensor<T>& dy, const EpMoeCache<T>& c,
                               double aux_weight, ref::Tensor<T>& drouter,
                               const std::vector<ref::Tensor<T>*>& local_dw_gate,
                               const std::vector<ref::Tensor<T>*>& local_dw_up,
                               const std::vector<ref::Tensor<T>*>& local_dw_down,
                               std::span<const int> part_of_source) {
  if (g.ep == nullptr) throw std::invalid_argument("ep_moe_backward: the ep group is required");
  const int ep = g.ep->size(), e_n = c.spec.experts, k = c.spec.top_k, epl = e_n / ep;
  const int64_t n = c.x.dim(0), h = c.x.dim(1);
  if (dy.dim(0) != n || dy.dim(1) != h)
    throw std::invalid_argument("ep_moe_backward: dy does not match the forward's rows");
  int parts = 1;
  if (!part_of_source.empty()) {
    if (static_cast<int>(part_of_source.size()) != ep)
      throw std::invalid_argument("ep_moe_backward: part_of_source needs one part per EP rank");
    parts = 1 + *std::max_element(part_of_source.begin(), part_of_source.end());
  }
  if (static_cast<int>(local_dw_up.size()) != parts * epl ||
      static_cast<int>(local_dw_down.size()) != parts * epl ||
      local_dw_gate.size() != (c.w_gate.empty() ? 0 : local_dw_up.size()))
    throw std::invalid_argument("ep_moe_backward: expected " + std::to_string(parts * epl) +
                                " local expert gradients");

  // Gate gradients and the expert outputs' gradients (gate_c * dy_t), in send order.
  int64_t nsend = 0;
  for (const int64_t rows : c.send_count) nsend += rows;
  std::vector<T> dgate(static_cast<std::size_t>(n * k), T{});
  ref::Tensor<T> dsend({nsend, h});
  if constexpr (!kIsMeta<T>) {
    for (int64_t p = 0; p < nsend; ++p) {
      const auto slot = static_cast<std::size_t>(c.send_slots[static_cast<std::size_t>(p)]);
      const auto i = static_cast<int64_t>(slot) / k;
      T acc = 0;
      for (int64_t col = 0; col < h; ++col) {
        acc += dy.at(i, col) * c.out.at(p, col);
        dsend.at(p, col) = c.gate[slot] * dy.at(i, col);
      }
      dgate[slot] = acc;
    }
  }
  const std::vector<int64_t> to_peer = per_peer(c.send_count, ep, epl);
  const std::vector<int64_t> from_peer = per_peer(c.recv_count, ep, epl);
  const ref::Tensor<T> drecv = exchange(*g.ep, dsend, to_peer, from_peer, h);

  // Local experts' backward on every row they processed.
  const RecvIndex ix = recv_index(c.recv_count, ep, epl);
  const std::vector<ref::Tensor<T>> dout = split_batches(drecv, ix, c.recv_count, ep, epl, h);
  std::vector<ref::Tensor<T>> din(static_cast<std::size_t>(epl));
  const bool gated = !c.w_gate.empty();
  int64_t kept = 0;
  for (int j = 0; j < epl; ++j) {
    const auto ju = static_cast<std::size_t>(j);
    if (parts == 1 || kIsMeta<T>) {
      din[ju] = ref::mlp_backward(dout[ju], c.in[ju], gated ? c.w_gate[ju] : nullptr, *c.w_up[ju],
                                  *c.w_down[ju], c.mlp[ju], gated ? local_dw_gate[ju] : nullptr,
                                  *local_dw_up[ju], *local_dw_down[ju]);
    } else if constexpr (!kIsMeta<T>) {
      din[ju] = ref::Tensor<T>({ix.batch_rows[ju], h});
      for (int part = 0; part < parts; ++part) {
        const PartRows rows = part_rows(ix, c.recv_count, part_of_source, part, j, epl);
        if (rows.total == 0) continue;
        const ref::MlpCache<T> mlp{gated ? rows.take(c.mlp[ju].gate) : ref::Tensor<T>{},
                                   rows.take(c.mlp[ju].up), rows.take(c.mlp[ju].act)};
        const auto q = static_cast<std::size_t>(part * epl + j);
        rows.put(ref::mlp_backward(rows.take(dout[ju]), rows.take(c.in[ju]),
                                   gated ? c.w_gate[ju] : nullptr, *c.w_up[ju], *c.w_down[ju], mlp,
                                   gated ? local_dw_gate[q] : nullptr, *local_dw_up[q],
                                   *local_dw_down[q]),
                 din[ju]);
      }
    }
    kept += ix.batch_rows[ju];
  }
  g.ep->compute(costs::moe_experts_backward(static_cast<double>(kept), static_cast<double>(h),
                                            static_cast<double>(c.w_up.front()->dim(1)), gated));
  const ref::Tensor<T> dx_rows =
      exchange(*g.ep, join_batches(din, ix, c.recv_count, ep, epl, h), from_peer, to_peer, h);
  ref::Tensor<T> dx({n, h});
  ref::Tensor<T> dlogits({n, e_n});
  if constexpr (!kIsMeta<T>) {
    // Send order is expert order, so each row adds its experts' parts in expert order (as the
    // reference does).
    for (int64_t p = 0; p < nsend; ++p) {
      const int64_t i = c.send_slots[static_cast<std::size_t>(p)] / k;
      for (int64_t col = 0; col < h; ++col) dx.at(i, col) += dx_rows.at(p, col);
    }
    // d probs of the local rows: gates (renormalised over the top-k) and the aux loss via P_e.
    ref::Tensor<T> dprobs({n, e_n});
    const auto routed = static_cast<double>(c.routed_tokens);
    for (int64_t i = 0; i < n; ++i) {
      if (c.choice[static_cast<std::size_t>(i * k)] < 0) continue;
      T total = 0, gdot = 0;
      for (int ci = 0; ci < k; ++ci) {
        const auto slot = static_cast<std::size_t>(i * k + ci);
        total += c.probs.at(i, c.choice[slot]);
        gdot += dgate[slot] * c.gate[slot];
      }
      for (int ci = 0; ci < k; ++ci) {
        const auto slot = static_cast<std::size_t>(i * k + ci);
        dprobs.at(i, c.choice[slot]) += (dgate[slot] - gdot) / total;
      }
      for (int e = 0; e < e_n; ++e)
        dprobs.at(i, e) += static_cast<T>(aux_weight * c.spec.aux_coef * e_n *
                                          c.f[static_cast<std::size_t>(e)] / routed);
    }
    for (int64_t i = 0; i < n; ++i) {
      T dot = 0;
      for (int e = 0; e < e_n; ++e) dot += c.probs.at(i, e) * dprobs.at(i, e);
      for (int e = 0; e < e_n; ++e) dlogits.at(i, e) = c.probs.at(i, e) * (dprobs.at(i, e) - dot);
    }
  }
  ref::add_inplace(dx, ref::linear_backward(dlogits, c.x, *c.router, drouter));
  g.ep->compute(costs::moe_router_backward(static_cast<double>(n), static_cast<double>(h),
                                           static_cast<double>(e_n)));
  return dx;
}

#define SHARDCHECK_EP_MOE(T)                                                                  \
  template ref::Tensor<T> ep_moe_forward(                                                     \
      const EpGroups&, const TokenLayout&, const ref::Tensor<T>&, std::span<const int32_t>,   \
      const ref::Tensor<T>&, const std::vector<const ref::Tensor<T>*>&,                       \
      const std::vector<const ref::Tensor<T>*>&, const std::vector<const ref::Tensor<T>*>&,   \
      const ref::MoeSpec&, EpMoeCache<T>&, double*, int64_t*, testing::Mutation, MoeRouting); \
  template ref::Tensor<T> ep_moe_backward(                                                    \
      const EpGroups&, const ref::Tensor<T>&, const EpMoeCache<T>&, double, ref::Tensor<T>&,  \
      const std::vector<ref::Tensor<T>*>&, const std::vector<ref::Tensor<T>*>&,               \
      const std::vector<ref::Tensor<T>*>&, std::span<const int>);
SHARDCHECK_EP_MOE(double)
SHARDCHECK_EP_MOE(float)
SHARDCHECK_EP_MOE(Meta<double>)
SHARDCHECK_EP_MOE(Meta<float>)
#undef SHARDCHECK_EP_MOE

}  // namespace shardcheck::parallel
