// Expert parallelism for the MoE layer (reference/moe.hpp semantics, exactly): the experts of a
// layer are split over the EP group (EP rank e holds experts [e*E/ep, (e+1)*E/ep)), the router is
// replicated. The EP group is carved out of the DP x CP ranks, so its members hold different
// sequences or different CP shards of one; inside a sequence, several ranks may hold some of its
// rows (CP ranks and, with sequence parallel, TP ranks: see TokenLayout).
//
// Forward, per rank: router softmax on its own rows; the sequence's probabilities are gathered
// (gather_sequence over cp/tp) so every rank holding part of the sequence computes the routing of
// the WHOLE sequence identically (routing group = one sequence: capacity C = ref::moe_capacity
// over S, first choices first in token order, drops contribute zero). Each rank then dispatches
// its own rows' kept assignments to the EP rank owning the expert (counts first with all_to_all,
// then rows with all_to_all_v), the experts run the reference MLP on every row they received, and
// the combine all_to_all_v sends the outputs back; y_t = sum over kept choices c (in order c =
// 0..k-1) of gate_c * out. Padding rows (doc_id < 0) are not routed and output zero.
//
// Without SP every TP rank holds a full replica of its CP rank's rows (and dispatches within its
// own EP group); "the ranks holding the sequence" below then means one TP rank per CP rank.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/mp/meta.hpp"
#include "parallel/mp/tokens.hpp"
#include "parallel/testing.hpp"
#include "reference/config.hpp"
#include "reference/moe.hpp"
#include "reference/ops.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// What a timing-only run (Meta, meta.hpp) assumes of the routing, which a numeric run computes
// from its data. uniform: every top-k assignment kept, spread evenly over the EP ranks. capacity:
// every expert receives its full capacity C = ref::moe_capacity (at most s) of every sequence,
// each rank its share rows / s of it: the volume GShard's and DeepSpeed-MoE's padded dispatch
// moves and computes, the most any expert can receive; with a capacity factor above 1 it is more
// than any routing sends in all (E C above s k).
enum class MoeRouting : std::uint8_t { uniform, capacity };

// The rows (token, choice assignments) a rank routing `rows` rows of a sequence of `seq_len`
// sends to each of its `ep` EP ranks (one: keeps) under the assumption. uniform: its rows x k
// assignments spread evenly, ceil(rows k / ep) to each; capacity: E / ep x ceil(C rows / s). Every
// rank's experts receive ep times that.
double routed_rows_per_peer(const ref::MoeSpec& spec, int64_t seq_len, double rows, int ep,
                            MoeRouting routing);

// The MoE layer's spec (reference/moe.hpp) of a model with experts.
inline ref::MoeSpec moe_spec(const ref::ModelConfig& m) {
  return {.experts = m.moe->experts,
          .top_k = m.moe->top_k,
          .capacity_factor = m.moe->capacity_factor,
          .aux_coef = m.moe->aux_loss};
}

struct EpGroups {
  comm::Communicator* ep = nullptr;  // experts split over this group (size 1: all experts local)
  comm::Communicator* cp = nullptr;  // other CP ranks holding rows of the same sequence (size 1 ok)
  comm::Communicator* tp = nullptr;  // with layout.sp(): TP ranks holding other rows of the
                                     // sequence; else unused (may be null)
};

// What the forward keeps for the backward. Holds POINTERS to the router and the local expert
// weights given to ep_moe_forward: they must outlive the backward call.
template <class T>
struct EpMoeCache {
  ref::MoeSpec spec;
  int64_t seq_len = 0;
  const ref::Tensor<T>* router = nullptr;
  std::vector<const ref::Tensor<T>*> w_gate, w_up, w_down;  // this EP rank's experts (gate: SwiGLU)
  ref::Tensor<T> x;                                         // [n, h] local rows
  ref::Tensor<T> probs;  // [n, E] router softmax of the local rows
  // Routing of the local rows (slot = i * k + c, i = local row), taken from the whole sequence's.
  std::vector<int32_t> choice;  // expert, -1 for a padding row
  std::vector<uint8_t> kept;    // 1 if the assignment fits within capacity (is dispatched)
  std::vector<T> gate;          // renormalised gates
  std::vector<double> f;        // [E] fraction of the sequence's routed choices per expert
  int64_t routed_tokens = 0;    // of the whole sequence
  // Dispatch layout: kept slots in send order (by destination EP rank, then local expert there,
  // then choice, then local row); send_count[e] = rows this rank sends to expert e (global id);
  // recv_count[src * epl + j] = rows received from EP rank src for local expert j.
  std::vector<int64_t> send_slots;
  std::vector<int64_t> send_count;
  std::vector<int64_t> recv_count;
  ref::Tensor<T> out;  // [send_slots.size(), h] expert output of each sent slot (combine result)
  // Per local expert: its received inputs (sources in EP-rank order) and MLP caches.
  std::vector<ref::Tensor<T>> in;
  std::vector<ref::MlpCache<T>> mlp;
};

// x [n, h]: this rank's rows of the MoE input for one sequence, rows = layout.rows(cp rank, tp
// rank) (global row ids). doc_ids: the whole sequence [S]. local_w_gate/local_w_up/local_w_down:
// this EP rank's experts in order (local_w_gate empty for GELU experts). Returns y [n, h] for the
// local rows. *aux = the sequence's aux loss (the same value on every rank holding part of the
// sequence); *dropped = the sequence's dropped assignments. Either pointer may be null. Collective
// over g.tp (SP), g.cp and g.ep, every member calling it the same number of times in the same
// order. Throws LayoutError when E % ep != 0. planted (tests): kRouteDroppedTokens keeps
// assignments over capacity. routing: what a timing-only run (T = Meta<...>) sends; a numeric run
// routes its data.
template <class T>
ref::Tensor<T> ep_moe_forward(const EpGroups& g, const TokenLayout& layout, const ref::Tensor<T>& x,
                              std::span<const int32_t> doc_ids, const ref::Tensor<T>& router,
                              const std::vector<const ref::Tensor<T>*>& local_w_gate,
                              const std::vector<const ref::Tensor<T>*>& local_w_up,
                              const std::vector<const ref::Tensor<T>*>& local_w_down,
                              const ref::MoeSpec& spec, EpMoeCache<T>& cache, double* aux,
                              int64_t* dropped,
                              testing::Mutation planted = testing::Mutation::kNone,
                              MoeRouting routing = MoeRouting::uniform);

// dy [n, h] for the local rows. Returns dx [n, h] for the local rows (router path + expert path).
// ADDS into drouter this rank's rows' contribution only (gate gradient + aux gradient of its rows,
// the aux gradient scaled by aux_weight as in ref::moe_backward); ADDS into local_dw_gate (SwiGLU)
// / local_dw_up / local_dw_down the contributions of every token this rank's experts processed
// (from all EP peers). Summing drouter over the ranks holding the sequence gives the reference's
// drouter; expert gradients need no further reduction across EP. Collective over g.ep only.
// part_of_source (empty, or one entry per EP rank: parts 0..P-1) splits the expert gradients by
// where their tokens came from: local_dw_*[p * epl + j] gets local expert j's gradient from the
// rows of the EP ranks of part p (the bf16 recipe rounds each data rank's microbatch apart).
template <class T>
ref::Tensor<T> ep_moe_backward(const EpGroups& g, const ref::Tensor<T>& dy,
                               const EpMoeCache<T>& cache, double aux_weight,
                               ref::Tensor<T>& drouter,
                               const std::vector<ref::Tensor<T>*>& local_dw_gate,
                               const std::vector<ref::Tensor<T>*>& local_dw_up,
                               const std::vector<ref::Tensor<T>*>& local_dw_down,
                               std::span<const int> part_of_source = {});

}  // namespace shardcheck::parallel
