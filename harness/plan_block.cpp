// The per-sequence ops of plan_block.hpp, in the order the engine's pieces issue them.
#include "harness/plan_block.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel/costs.hpp"
#include "parallel/mp/cp_attention.hpp"
#include "reference/moe.hpp"

namespace shardcheck::harness {

namespace costs = parallel::costs;
using skeleton_detail::count_of;
using skeleton_detail::null_buf;

int SequenceOps::local_kv_heads() const {
  return std::max(1, s_.model->kv_heads / s_.tp);
}

// tokens.cpp's TP collectives on one sequence's [rows, h] activation (rows: the CP rank's; SP:
// each TP rank holds rows / tp of them).
void SequenceOps::tp_all_reduce_rows(double width) {
  if (!tp_) return;
  tp_->all_reduce(null_buf(count_of(static_cast<int64_t>(rows() * width)), activation()))->wait();
}

void SequenceOps::sp_gather() {
  if (!sp()) return;
  const double h = s_.model->hidden;
  tp_->all_gather(null_buf(count_of(static_cast<int64_t>(rows() / s_.tp * h)), activation()),
                  null_buf(count_of(static_cast<int64_t>(rows() * h)), activation()))
      ->wait();
}

void SequenceOps::sp_reduce_scatter() {
  const double h = s_.model->hidden;
  tp_->reduce_scatter(null_buf(count_of(static_cast<int64_t>(rows() * h)), activation()),
                      null_buf(count_of(static_cast<int64_t>(rows() / s_.tp * h)), activation()))
      ->wait();
}

void SequenceOps::gather_in_backward() {
  if (sp())
    sp_reduce_scatter();
  else
    tp_all_reduce_rows(s_.model->hidden);
}

// One of Ulysses' all_to_alls over CP of `elems` elements per rank (cp_attention.cpp's
// rows_to_heads / heads_to_rows).
void SequenceOps::ulysses_exchange(double elems) {
  if (!cp_) return;
  const std::size_t n = count_of(static_cast<int64_t>(elems));
  cp_->all_to_all(null_buf(n, activation()), null_buf(n, activation()))->wait();
}

void SequenceOps::ring_attention(bool forward) {
  const int p = cp_->size(), r = cp_->rank();
  const double n = rows(), d = s_.model->head_dim();
  const int heads = local_heads(), kv = local_kv_heads();
  if (ring_forward_.empty()) {
    const auto own = s_.layout->cp_chunks(r);
    for (int step = 0; step < p; ++step) {
      const double pairs =
          costs::ring_run_pairs(own, s_.layout->cp_chunks((r - step + p) % p), false);
      ring_forward_.push_back(costs::ring_forward(pairs, n, heads, kv, d, s_.elem));
      ring_backward_.push_back(costs::ring_backward(pairs, n, heads, kv, d, s_.elem));
    }
  }
  const std::size_t block = count_of(static_cast<int64_t>(2 * n * kv * d));  // k and v
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const int tag = forward ? parallel::kRingKvForwardTag : parallel::kRingKvBackwardTag;
  for (int step = 0; step < p; ++step) {
    comm::WorkPtr ws, wr;
    if (step < p - 1) {
      ws = cp_->send(null_buf(block, activation()), next, {.tag = tag});
      wr = cp_->recv(null_buf(block, activation()), prev, {.tag = tag});
    }
    world_.compute((forward ? ring_forward_ : ring_backward_)[static_cast<std::size_t>(step)]);
    if (step < p - 1) {
      ws->wait();
      wr->wait();
    }
    if (!forward && p > 1) {
      comm::WorkPtr dws =
          cp_->send(null_buf(block, activation()), next, {.tag = parallel::kRingDkvTag});
      comm::WorkPtr dwr =
          cp_->recv(null_buf(block, activation()), prev, {.tag = parallel::kRingDkvTag});
      dws->wait();
      dwr->wait();
    }
  }
}

namespace {

// Ulysses over CP: each rank attends the whole sequence with heads / cp of its TP heads (one CP
// rank: its TP heads).
costs::UlyssesShape attention(const ref::ModelConfig& m, int heads, int kv_heads, int cp) {
  return {m.seq_len, heads / cp, kv_heads / cp, m.head_dim()};
}

}  // namespace

double routed_rows_per_peer(const ref::ModelConfig& model, double rows, int ep, bool capacity) {
  const ref::MoeConfig& moe = *model.moe;
  if (capacity) {
    const int64_t s = model.seq_len;
    const ref::MoeSpec spec{
        .experts = moe.experts, .top_k = moe.top_k, .capacity_factor = moe.capacity_factor};
    const double cap = static_cast<double>(std::min(ref::moe_capacity(spec, s), s));
    const double per_expert = std::ceil(cap * rows / static_cast<double>(s) - 1e-9);
    return static_cast<double>(moe.experts / ep) * per_expert;
  }
  const double assignments = rows * moe.top_k;
  return ep > 1 ? std::ceil(assignments / ep) : assignments;
}

void SequenceOps::ep_exchange() {
  if (!ep_) return;
  const auto peers = static_cast<std::size_t>(ep_->size());
  const std::size_t split =
      count_of(static_cast<int64_t>(routed_rows_per_peer())) * count_of(s_.model->hidden);
  const std::vector<std::size_t> splits(peers, split);
  ep_->all_to_all_v(null_buf(split * peers, activation()), splits,
                    null_buf(split * peers, activation()), splits)
      ->wait();
}

// ep_moe_forward: the router on the rank's own rows (SP: its TP part of the CP rank's), the whole
// sequence's probabilities gathered (tokens.cpp's gather_sequence: over TP under SP, then over
// CP), with EP the per-expert counts exchanged (all_to_all) and the rows dispatched, the local
// experts on every row they receive, the outputs combined back.
void SequenceOps::moe_forward() {
  const ref::ModelConfig& m = *s_.model;
  const double n = moe_rows(), h = m.hidden, e = m.moe->experts;
  world_.compute(costs::moe_router(n, h, e, s_.elem));
  if (sp())
    tp_->all_gather(null_buf(count_of(static_cast<int64_t>(n * e)), activation()),
                    null_buf(count_of(static_cast<int64_t>(rows() * e)), activation()))
        ->wait();
  if (cp_)
    cp_->all_gather(null_buf(count_of(static_cast<int64_t>(rows() * e)), activation()),
                    null_buf(count_of(static_cast<int64_t>(rows() * s_.cp * e)), activation()))
        ->wait();
  if (ep_)
    ep_->all_to_all(null_buf(count_of(m.moe->experts), comm::DType::i64),
                    null_buf(count_of(m.moe->experts), comm::DType::i64))
        ->wait();
  ep_exchange();  // dispatch
  const double received = routed_rows_per_peer() * (ep_ ? ep_->size() : 1);
  world_.compute(costs::moe_experts_forward(received, h, m.ffn));
  ep_exchange();  // combine
}

// ep_moe_backward: the output gradients to the experts, their backward, the input gradients back;
// no TP or CP collectives (each rank routed its own rows).
void SequenceOps::moe_backward() {
  const ref::ModelConfig& m = *s_.model;
  const double n = moe_rows(), h = m.hidden;
  ep_exchange();
  const double received = routed_rows_per_peer() * (ep_ ? ep_->size() : 1);
  world_.compute(costs::moe_experts_backward(received, h, m.ffn));
  ep_exchange();
  world_.compute(costs::moe_router_backward(n, h, m.moe->experts));
}

// mp_block_forward (tp_block.cpp, cp_attention.cpp, ep_moe.cpp).
void SequenceOps::block_forward(int layer) {
  const ref::ModelConfig& m = *s_.model;
  const double s = rows(), h = m.hidden, q = local_heads() * m.head_dim(),
               kv = local_kv_heads() * m.head_dim();
  const costs::UlyssesShape a = attention(m, local_heads(), local_kv_heads(), s_.cp);
  gather_in();
  world_.compute(costs::qkv(s, h, q, kv));
  if (s_.ring && cp_) {
    ring_attention(true);
  } else {
    ulysses_exchange(s * q);  // rows_to_heads of q, k and v
    ulysses_exchange(s * kv);
    ulysses_exchange(s * kv);
    world_.compute(s_.flash ? costs::flash_forward(a, s_.elem)
                            : costs::ulysses_forward(a, s_.elem));
    ulysses_exchange(s * q);  // heads_to_rows of the output
  }
  world_.compute(costs::wo(s, q, h));
  reduce_out();
  if (m.is_moe_layer(layer)) {
    moe_forward();
  } else {
    gather_in();
    world_.compute(costs::mlp(s, h, static_cast<double>(m.ffn) / s_.tp));
    reduce_out();
  }
}

// mp_block_backward.
void SequenceOps::block_backward(int layer) {
  const ref::ModelConfig& m = *s_.model;
  const double s = rows(), h = m.hidden, q = local_heads() * m.head_dim(),
               kv = local_kv_heads() * m.head_dim();
  const costs::UlyssesShape a = attention(m, local_heads(), local_kv_heads(), s_.cp);
  if (m.is_moe_layer(layer)) {
    moe_backward();
  } else {
    reduce_out_backward();
    world_.compute(costs::mlp_backward(s, h, static_cast<double>(m.ffn) / s_.tp));
    gather_in_backward();
  }
  reduce_out_backward();
  if (s_.ring && cp_) {  // flash-style: the scores again inside the backward, whatever recompute
    ring_attention(false);
  } else {
    ulysses_exchange(s * q);  // rows_to_heads of the output gradient
    const bool selective = s_.recompute == ref::Recompute::kSelective;
    if (s_.flash) {  // the scores again inside the backward, whatever the recompute
      world_.compute(costs::flash_backward(a, s_.elem));
    } else {
      if (selective) world_.compute(costs::ulysses_recompute(a, s_.elem));
      world_.compute(costs::ulysses_backward(a, !selective, s_.elem));
    }
    ulysses_exchange(s * q);  // heads_to_rows of dq, dk, dv
    ulysses_exchange(s * kv);
    ulysses_exchange(s * kv);
  }
  world_.compute(costs::projections_backward(s, h, q, kv));
  gather_in_backward();
}

// mp_head_forward and vocab_head_forward: the row max, then [sum exp | target logit].
void SequenceOps::head_forward() {
  const ref::ModelConfig& m = *s_.model;
  gather_in();
  world_.compute(
      costs::vocab_head_forward(rows(), m.hidden, static_cast<double>(m.vocab) / s_.tp, s_.elem));
  if (tp_) {
    const auto n = static_cast<std::size_t>(rows());
    tp_->all_reduce(null_buf(n, activation()), {.op = comm::ReduceOp::max})->wait();
    tp_->all_reduce(null_buf(2 * n, activation()))->wait();
  }
}

// mp_head_backward: the input gradient summed over TP.
void SequenceOps::head_backward() {
  const ref::ModelConfig& m = *s_.model;
  world_.compute(
      costs::vocab_head_backward(rows(), m.hidden, static_cast<double>(m.vocab) / s_.tp, s_.elem));
  tp_all_reduce_rows(m.hidden);
}

}  // namespace shardcheck::harness
