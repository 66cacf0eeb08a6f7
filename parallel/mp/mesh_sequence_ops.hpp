// One sequence's embedding, blocks and head on one rank, for the engine's timing-only backend
// (mesh_timing.hpp): the engine's own (tp_block.hpp's mp_embed_*, mp_block_* and mp_head_*, with
// cp_attention, cp_ring, ep_moe and vocab_parallel under them) instantiated timing-only on shapes
// (meta.hpp): the same TP, CP and EP collectives on null buffers
// and the same compute reports, nothing computed. Sizes from the rank's parameters (their local
// shapes), the token layout and the groups. What the data decides in a numeric run follows stated
// assumptions: every sequence one document without padding, and the MoE routing of
// MoeRouting (uniform, or every expert at its full capacity).
//
// Each kind of call (embedding, dense or MoE block, head; forward or backward) issues the same ops
// every time, so it runs the engine's pieces once, under comm::RecordingCommunicator, and replays
// the recorded tape after (comm::replay): one layer of each kind stands for the others, as a
// BlockMemo (mesh_timing.hpp) assumes too. A thread shares its tapes between runs whose calls
// depend on the same inputs (the model, the layout, the numeric type, recompute, attention,
// routing, the rank's groups and its place in them), a forward with its backward.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/mp/cp_attention.hpp"
#include "parallel/mp/ep_moe.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/tokens.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel {

// What each kind of call issued (comm::OpLog tapes, mesh_sequence_ops.cpp).
struct SequenceTapes;

class SequenceOps {
 public:
  struct Setup {
    const ref::ModelConfig* model = nullptr;
    const TokenLayout* layout = nullptr;
    ref::Precision precision = ref::Precision::kF32;  // f64: the engine computes in double
    ref::Recompute recompute = ref::Recompute::kNone;
    CpAlgo cp_algo = CpAlgo::ring;
    AttentionKernel attention = AttentionKernel::engine;
    MoeRouting moe_routing = MoeRouting::uniform;
    const std::vector<LocalParam>* params = nullptr;  // this rank's
    // The rank's groups (of one rank where an axis is off), as the engine's BlockEnv has them.
    comm::Communicator* tp = nullptr;
    comm::Communicator* cp = nullptr;
    comm::Communicator* ep = nullptr;
  };
  explicit SequenceOps(const Setup& s);
  ~SequenceOps();
  SequenceOps(const SequenceOps&) = delete;
  SequenceOps& operator=(const SequenceOps&) = delete;

  void embed_forward() { call(kEmbedForward); }
  void embed_backward() { call(kEmbedBackward); }
  // Each kind of block (dense or MoE) keeps the cache of its last forward for its backward (the
  // shapes are those of every layer of the kind); selective recompute drops the attention
  // probabilities from it, as the engine does. Full recompute: the caller issues block_forward
  // again first.
  void block_forward(int layer) { call(moe(layer) ? kMoeForward : kDenseForward); }
  void block_backward(int layer) { call(moe(layer) ? kMoeBackward : kDenseBackward); }
  void head_forward() { call(kHeadForward); }
  void head_backward() { call(kHeadBackward); }
  // The kinds of call: each forward's backward follows it (forward | 1).
  enum Call : std::uint8_t {
    kEmbedForward,
    kEmbedBackward,
    kDenseForward,
    kDenseBackward,
    kMoeForward,
    kMoeBackward,
    kHeadForward,
    kHeadBackward,
    kCalls
  };
  // The engine's pieces on Meta tensors, built at the first call no tape holds
  // (mesh_sequence_ops.cpp).
  class Recorder;

 private:
  bool moe(int layer) const { return s_.model->is_moe_layer(layer); }
  void call(Call c);

  Setup s_;
  // What each kind of call issued, recorded at its first call (the shapes and groups do not change
  // from call to call) and replayed at the next ones (comm::replay): this run's recordings, and
  // those published for every run of the thread with the same inputs (mesh_sequence_ops.cpp's key).
  std::unique_ptr<SequenceTapes> own_;
  std::shared_ptr<SequenceTapes> shared_;
  std::unique_ptr<Recorder> recorder_;
};

}  // namespace shardcheck::parallel
