// The compute reports (comm::Communicator::compute) of the mesh engine's pieces, as functions of
// shapes only: the one description of what a sublayer costs, called by the numeric pieces with
// their tensors' shapes (parallel/mp/) and by the planner's timing-only run with the shapes it
// derives from the model and mesh (parallel/mp/mesh_timing.cpp), so the two report the same. A
// matmul [m,k]·[k,n] is 2·m·k·n FLOPs; a backward is twice its forward; attention counts the causal
// half (s·(s+1)/2 query-key pairs per head), as a causal kernel computes it (parallel/flops.hpp's
// MFU counts the full s², as the usual model-FLOPs formulas do). `elem` is the bytes of one element
// of the numeric type, for the memory traffic of the bandwidth-bound pieces.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/flops.hpp"
#include "parallel/ledger.hpp"

namespace shardcheck::parallel::costs {

inline double matmul(double m, double k, double n) {
  return 2.0 * m * k * n;
}

// The GEMM shapes (comm::Gemm: an m x n output over k) of y[m,n] = x[m,k] w[k,n] and of its
// backward: the input's gradient dx[m,k] = dy w^T over n, the weight's dw[k,n] = x^T dy over m.
inline comm::Gemm gemm(double m, double k, double n) {
  return {.m = m, .n = n, .k = k};
}
inline comm::Gemm gemm_dgrad(double m, double k, double n) {
  return {.m = m, .n = k, .k = n};
}
inline comm::Gemm gemm_wgrad(double m, double k, double n) {
  return {.m = k, .n = n, .k = m};
}

// The attention block's projections over `rows` tokens of width h: q (q_cols = local heads · d),
// k and v (kv_cols each) as one fused GEMM (as Megatron-Core and most kernels run them), and the
// output projection.
inline comm::ComputeCost qkv(double rows, double h, double q_cols, double kv_cols) {
  return {.name = "qkv",
          .flops = matmul(rows, h, q_cols) + 2 * matmul(rows, h, kv_cols),
          .gemms = {gemm(rows, h, q_cols + 2 * kv_cols)}};
}
inline comm::ComputeCost wo(double rows, double q_cols, double h) {
  return {.name = "wo", .flops = matmul(rows, q_cols, h), .gemms = {gemm(rows, q_cols, h)}};
}
inline comm::ComputeCost projections_backward(double rows, double h, double q_cols,
                                              double kv_cols) {
  const double qkv_cols = q_cols + 2 * kv_cols;
  return {.name = "attention projections backward",
          .flops = 2 * (matmul(rows, h, q_cols) + 2 * matmul(rows, h, kv_cols) +
                        matmul(rows, q_cols, h)),
          .gemms = {gemm_dgrad(rows, h, qkv_cols), gemm_wgrad(rows, h, qkv_cols),
                    gemm_dgrad(rows, q_cols, h), gemm_wgrad(rows, q_cols, h)}};
}
// The dense MLP over `rows` tokens, f = the local ffn width: up, activation, down; `gated`
// (SwiGLU) adds the gate projection, run as one GEMM with up ([h, 2f], as Megatron fuses them).
inline comm::ComputeCost mlp(double rows, double h, double f, bool gated) {
  const double in_cols = gated ? 2 * f : f;
  return {.name = "mlp",
          .flops = matmul(rows, h, in_cols) + matmul(rows, f, h),
          .gemms = {gemm(rows, h, in_cols), gemm(rows, f, h)}};
}
inline comm::ComputeCost mlp_backward(double rows, double h, double f, bool gated) {
  const double in_cols = gated ? 2 * f : f;
  return {.name = "mlp backward",
          .flops = 2 * (matmul(rows, h, in_cols) + matmul(rows, f, h)),
          .gemms = {gemm_dgrad(rows, h, in_cols), gemm_wgrad(rows, h, in_cols),
                    gemm_dgrad(rows, f, h), gemm_wgrad(rows, f, h)}};
}

// Causal attention over s tokens, `heads` heads of width d: per_element FLOPs per (pair, channel).
inline double causal_attention_flops(int64_t s, int heads, int64_t d, double per_element) {
  return per_element * static_cast<double>(s * (s + 1) / 2 * heads * d);
}
// Ulysses attention on a CP rank after the all_to_all: the whole sequence of s tokens for its
// `heads` query and `kv_heads` key/value heads of width d. The forward reads q, k, v and writes o
// and the probabilities; the recompute (selective) the same; the backward reads dout, q, k, v, the
// probabilities it kept (`kept_probs`: false when selective recompute dropped them) and writes
// dq, dk, dv.
struct UlyssesShape {
  int64_t s = 0;
  int heads = 0, kv_heads = 0;
  int64_t d = 0;
  double q_elems() const { return static_cast<double>(s * heads * d); }
  double kv_elems() const { return static_cast<double>(s * kv_heads * d); }
  double prob_elems() const { return static_cast<double>(heads) * static_cast<double>(s * s); }
};
inline comm::ComputeCost ulysses_forward(const UlyssesShape& a, double elem) {
  return {.name = "cp ulysses attention forward",
          .flops = causal_attention_flops(a.s, a.heads, a.d, 4),
          .bytes = (2 * a.q_elems() + 2 * a.kv_elems() + a.prob_elems()) * elem};
}
inline comm::ComputeCost ulysses_recompute(const UlyssesShape& a, double elem) {
  return {.name = "cp ulysses attention recompute",
          .flops = causal_attention_flops(a.s, a.heads, a.d, 4),
          .bytes = (2 * a.q_elems() + 2 * a.kv_elems() + a.prob_elems()) * elem};
}
inline comm::ComputeCost ulysses_backward(const UlyssesShape& a, bool kept_probs, double elem) {
  return {.name = "cp ulysses attention backward",
          .flops = causal_attention_flops(a.s, a.heads, a.d, 10),
          .bytes = (3 * a.q_elems() + 4 * a.kv_elems() + (kept_probs ? a.prob_elems() : 0)) * elem};
}

// A flash-style kernel over the same shape (what a GPU run's FlashAttention does, not the
// engine's kernel; the planner's `plan.attention_kernel: "flash"`): the forward reads q, k, v and
// writes o and a log-sum-exp per row and head, never the probabilities; the backward reads q, k,
// v, o, dout and the log-sum-exp, computes the scores again (2 of its 10 FLOPs per pair and
// channel) and writes dq, dk, dv. Selective recompute adds nothing: there are no probabilities
// to drop.
inline comm::ComputeCost flash_forward(const UlyssesShape& a, double elem) {
  const double lse = static_cast<double>(a.s * a.heads);
  return {.name = "flash attention forward",
          .flops = causal_attention_flops(a.s, a.heads, a.d, 4),
          .bytes = (2 * a.q_elems() + 2 * a.kv_elems() + lse) * elem};
}
inline comm::ComputeCost flash_backward(const UlyssesShape& a, double elem) {
  const double lse = static_cast<double>(a.s * a.heads);
  return {.name = "flash attention backward",
          .flops = causal_attention_flops(a.s, a.heads, a.d, 10),
          .bytes = (4 * a.q_elems() + 4 * a.kv_elems() + lse) * elem};
}

// Ring attention (parallel/mp/cp_ring.cpp) at one ring step: this CP rank's query rows against
// the K/V block of another rank's rows. The rows come in the layout's chunks of `chunk` rows
// (TokenLayout: seq_len / (2 cp), two per rank), and each run of consecutive query rows inside a
// chunk meets each such run of key rows as a whole block, skipped only when every key is after
// every query (`unmasked`, a planted bug's diagonal: nothing skipped); the query-key pairs of the
// blocks computed. With the chunks apart, every rank computes the same at each step: its own
// block three chunk pairs, every other block two.
inline int64_t ring_chunk(int64_t seq_len, int cp) {
  return seq_len / (2 * int64_t{cp});
}
// The same from the runs themselves ([begin, end) of global rows, none across a chunk boundary:
// TokenLayout::cp_chunks).
inline double ring_run_pairs(std::span<const std::pair<int64_t, int64_t>> q_runs,
                             std::span<const std::pair<int64_t, int64_t>> k_runs, bool unmasked) {
  double pairs = 0;
  for (const auto& [qb, qe] : q_runs)
    for (const auto& [kb, ke] : k_runs)
      if (unmasked || kb <= qe - 1) pairs += static_cast<double>((qe - qb) * (ke - kb));
  return pairs;
}
inline double ring_block_pairs(std::span<const int64_t> q_rows, std::span<const int64_t> k_rows,
                               int64_t chunk, bool unmasked) {
  const auto runs = [chunk](std::span<const int64_t> rows) {
    std::vector<std::pair<int64_t, int64_t>> out;  // [begin, end) of global rows
    for (const int64_t r : rows) {
      if (!out.empty() && out.back().second == r && r % chunk != 0)
        ++out.back().second;
      else
        out.emplace_back(r, r + 1);
    }
    return out;
  };
  return ring_run_pairs(runs(q_rows), runs(k_rows), unmasked);
}
// The ring step's kernels over those pairs for `heads` query and `kv_heads` key/value heads of
// width d, n query rows: the forward reads q and the K/V block and updates the accumulator; the
// backward reads dout twice and the K/V block and its dK/dV accumulator twice.
inline comm::ComputeCost ring_forward(double pairs, double n, int heads, int kv_heads, double d,
                                      double elem) {
  return {.name = "cp ring attention forward",
          .flops = 4.0 * pairs * heads * d,
          .bytes = (n * heads * d + 4 * n * kv_heads * d) * elem};
}
inline comm::ComputeCost ring_backward(double pairs, double n, int heads, int kv_heads, double d,
                                       double elem) {
  return {.name = "cp ring attention backward",
          .flops = 10.0 * pairs * heads * d,
          .bytes = (2 * n * heads * d + 8 * n * kv_heads * d) * elem};
}

// The vocab-parallel head over n tokens of width h, vl = the local vocabulary slice.
inline comm::ComputeCost vocab_head_forward(double n, double h, double vl, double elem) {
  return {.name = "vocab head forward",
          .flops = 2.0 * n * h * vl,
          .bytes = elem * (n * h + h * vl + n * vl),
          .gemms = {gemm(n, h, vl)}};
}
inline comm::ComputeCost vocab_head_backward(double n, double h, double vl, double elem) {
  return {.name = "vocab head backward",
          .flops = 4.0 * n * h * vl,
          .bytes = elem * (2 * n * h + 2 * h * vl + n * vl),
          .gemms = {gemm_dgrad(n, h, vl), gemm_wgrad(n, h, vl)}};
}

// The MoE router over n tokens of width h and E experts (logits, softmax), and the experts' MLPs
// over the `rows` (token, choice) assignments they keep (f: an expert's ffn width). Their GEMMs
// are not described (one per expert, of rows the routing decides; a skinny router): they run at
// the one compute efficiency. The rows depend
// on the routing: the numeric run counts what its router kept; a timing-only run states an
// assumption (the planner: every top-k assignment kept, an upper bound when capacity drops some).
inline comm::ComputeCost moe_router(double n, double h, double experts, double elem) {
  return {.name = "moe router",
          .flops = 2.0 * n * h * experts,
          .bytes = (n * h + h * experts + 2 * n * experts) * elem};
}
inline comm::ComputeCost moe_router_backward(double n, double h, double experts) {
  return {.name = "moe router backward", .flops = 4.0 * n * h * experts};
}
inline comm::ComputeCost moe_experts_forward(double rows, double h, double f, bool gated) {
  return {.name = "moe experts forward", .flops = (gated ? 6.0 : 4.0) * rows * h * f};
}
inline comm::ComputeCost moe_experts_backward(double rows, double h, double f, bool gated) {
  return {.name = "moe experts backward", .flops = (gated ? 12.0 : 8.0) * rows * h * f};
}

// AdamW over the `owned` elements this rank updates (adamw_flops); reads and writes the parameter,
// gradient and optimizer state of the recipe.
inline comm::ComputeCost adamw(double owned, const Recipe& r) {
  return {.name = "adamw",
          .flops = adamw_flops(owned),
          .bytes = owned * static_cast<double>(r.param + r.grad + r.optimizer())};
}

}  // namespace shardcheck::parallel::costs
