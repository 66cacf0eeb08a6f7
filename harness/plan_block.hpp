// What one sequence's sublayers issue on one rank of the mesh engine, without data, for the
// planner's step skeleton (plan_skeleton.hpp): the compute reports (parallel/costs.hpp) and the
// TP and CP collectives of tp_block.cpp (the block: SP gathers and reduce_scatters or the
// row-parallel all_reduces, their backwards), cp_attention.cpp (Ulysses' all_to_alls, the ring's
// messages),
// vocab_parallel.cpp (the embedding and the head's loss all_reduces) and ep_moe.cpp (the router,
// its probabilities gathered over TP under SP and over CP, the counts and rows exchanged with the
// EP peers, and the experts; the routing assumption, Shape::capacity_routing: uniform, every top-k
// assignment kept and spread evenly, or capacity-bound, every expert at its full capacity).
// Sizes from the model, the token layout and the TP / CP sizes; null buffers. The conformance test
// compares what it issues with the engine's numeric run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/mp/tokens.hpp"
#include "reference/config.hpp"

namespace shardcheck::harness {

namespace skeleton_detail {
inline comm::DType numeric_dtype(ref::Precision p) {
  return p == ref::Precision::kF64 ? comm::DType::f64 : comm::DType::f32;
}
inline comm::Buffer null_buf(std::size_t count, comm::DType t) {
  return comm::Buffer{nullptr, count, t, {}};
}
inline std::size_t count_of(int64_t n) {
  return static_cast<std::size_t>(n);
}
}  // namespace skeleton_detail

// The rows (token, choice assignments) a rank routing `rows` rows of a sequence sends to each of
// its `ep` EP ranks (one: keeps) in a MoE layer, under the routing assumption. Uniform: its
// rows x k assignments spread evenly over the experts, ceil(rows k / ep) to each. Capacity-bound
// (`capacity`): every expert receives its full capacity C = ref::moe_capacity (at most s) of every
// sequence, each rank its share rows / s of them: E / ep x ceil(C rows / s). That is the volume
// GShard's and DeepSpeed-MoE's padded dispatch moves and computes, and puts every expert at the
// most it can receive; with a capacity factor above 1 it is more than any routing sends in all
// (E C above s k). Every rank's experts receive ep times that.
double routed_rows_per_peer(const ref::ModelConfig& model, double rows, int ep, bool capacity);

class SequenceOps {
 public:
  struct Shape {
    const ref::ModelConfig* model = nullptr;
    const parallel::TokenLayout* layout = nullptr;
    ref::Precision precision = ref::Precision::kF32;
    ref::Recompute recompute = ref::Recompute::kNone;
    bool sequence_parallel = false;  // and tp > 1
    bool ring = false;               // CP's algorithm: ring attention (else Ulysses)
    bool flash = false;  // without the ring: a flash kernel's costs (else the engine's kernel's)
    bool capacity_routing = false;  // MoE: every expert at its full capacity (else uniform)
    int tp = 1, cp = 1;
    double elem = 4;  // bytes of the engine's numeric type
  };
  // world: compute reports; tp, cp, ep: the rank's groups (null when of one rank).
  SequenceOps(Shape s, comm::Communicator& world, comm::Communicator* tp, comm::Communicator* cp,
              comm::Communicator* ep = nullptr)
      : s_(s), world_(world), tp_(tp), cp_(cp), ep_(ep) {}

  void embed_forward() { reduce_out(); }
  void embed_backward() { reduce_out_backward(); }
  void block_forward(int layer);
  // Full recompute: the caller issues block_forward again first.
  void block_backward(int layer);
  void head_forward();
  void head_backward();

 private:
  comm::DType activation() const { return skeleton_detail::numeric_dtype(s_.precision); }
  bool sp() const { return s_.sequence_parallel && s_.tp > 1; }
  // The CP rank's rows (SP: the TP group's together).
  double rows() const { return static_cast<double>(s_.layout->cp_row_count()); }
  // The rows a MoE layer routes on this rank: the CP rank's (SP: this TP rank's part of them).
  double moe_rows() const { return sp() ? rows() / s_.tp : rows(); }
  int local_heads() const { return s_.model->heads / s_.tp; }
  int local_kv_heads() const;
  void tp_all_reduce_rows(double width);
  void sp_gather();
  void sp_reduce_scatter();
  // tp_block.cpp's gather_in (SP: all_gather), its backward (SP: reduce_scatter, else
  // all_reduce), reduce_out (SP: reduce_scatter, else all_reduce) and its backward (gather_in).
  void gather_in() { sp_gather(); }
  void gather_in_backward();
  void reduce_out() { gather_in_backward(); }
  void reduce_out_backward() { sp_gather(); }
  void ulysses_exchange(double elems);
  // cp_ring.cpp's ring attention on this CP rank: cp steps, each a K/V block to the next rank and
  // one from the previous (cp - 1 hops) around the block kernels over the pairs the causal mask
  // leaves of this rank's rows against the block owner's; the backward also passes the dK/dV
  // accumulators (cp hops).
  void ring_attention(bool forward);
  // Per ring step, this rank's block kernels, forward and backward (computed once).
  std::vector<comm::ComputeCost> ring_forward_, ring_backward_;
  void moe_forward();
  void moe_backward();
  // ep_moe.cpp's exchange of rows with the EP peers (dispatch, combine and their backwards),
  // routed_rows_per_peer to each.
  double routed_rows_per_peer() const {
    return harness::routed_rows_per_peer(*s_.model, moe_rows(), ep_ ? ep_->size() : 1,
                                         s_.capacity_routing);
  }
  void ep_exchange();

  Shape s_;
  comm::Communicator& world_;
  comm::Communicator* tp_;
  comm::Communicator* cp_;
  comm::Communicator* ep_;
};

}  // namespace shardcheck::harness
