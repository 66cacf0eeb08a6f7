// mesh_sequence_ops.hpp: the engine's sequence pieces on Meta tensors, recorded once per kind of
// call and replayed.
#include "parallel/mp/mesh_sequence_ops.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "comm/op_log.hpp"
#include "parallel/mp/meta.hpp"
#include "parallel/mp/tp_block.hpp"
#include "reference/batch.hpp"
#include "reference/blocks.hpp"

namespace shardcheck::parallel {

struct SequenceTapes {
  struct Tape {
    comm::OpLog log;  // over groups 0, 1, 2: tp, cp, ep
    bool recorded = false;
  };
  std::array<Tape, SequenceOps::kCalls> calls;
};

class SequenceOps::Recorder {
 public:
  virtual ~Recorder() = default;
  // Runs call c of the engine's pieces on `env` (the setup's, over recording groups).
  virtual void run(Call c, const BlockEnv& env) = 0;
};

namespace {

template <class U>
class MetaRecorder final : public SequenceOps::Recorder {
  using M = Meta<U>;
  using Tensor = ref::Tensor<M>;
  using Call = SequenceOps::Call;

 public:
  explicit MetaRecorder(const SequenceOps::Setup& s)
      : model_(*s.model), recompute_(s.recompute), rows_({s.layout->row_count(), s.model->hidden}) {
    // One layer of each kind stands for all of the rank's (their shapes and collectives are
    // alike); the rest of its parameters are the embedding's and the head's.
    for (const LocalParam& p : *s.params) {
      const int layer = p.unit >= 1 && p.unit <= model_.layers ? p.unit - 1 : -1;
      if (layer >= 0 && rep_[kind(layer)] < 0) rep_[kind(layer)] = layer;
      if (layer < 0 || layer == rep_[kind(layer)]) params_.add(p.name, p.local_shape);
    }
    // Only the document ids are read (their count); one document, no padding.
    seq_.doc_ids.assign(static_cast<std::size_t>(s.layout->seq_len()), 0);
  }

  void run(Call c, const BlockEnv& e) override {
    const std::size_t k = c == Call::kMoeForward || c == Call::kMoeBackward ? 1 : 0;
    switch (c) {
      case Call::kEmbedForward:
        mp_embed_forward(e, params_, seq_);
        break;
      case Call::kEmbedBackward:
        mp_embed_backward(e, seq_, rows_, params_);
        break;
      case Call::kDenseForward:
      case Call::kMoeForward:
        mp_block_forward(e, params_, rep_[k], seq_, ctx_, rows_, blocks_[k], nullptr);
        drop_selective(blocks_[k], recompute_);
        break;
      case Call::kDenseBackward:
      case Call::kMoeBackward:
        mp_block_backward(e, params_, rep_[k], seq_, ctx_, blocks_[k], rows_, params_);
        break;
      case Call::kHeadForward:
        mp_head_forward(e, params_, seq_, rows_, head_, nullptr);
        break;
      case Call::kHeadBackward:
        mp_head_backward(e, params_, seq_, ctx_.token_weight, head_, params_);
        break;
      case Call::kCalls:
        break;
    }
  }

 private:
  // 0: dense, 1: MoE.
  std::size_t kind(int layer) const { return model_.is_moe_layer(layer) ? 1 : 0; }

  const ref::ModelConfig& model_;
  ref::Recompute recompute_;
  int rep_[2] = {-1, -1};  // the layer standing for each kind
  // Those parameters as shapes; also their gradients (a timing-only backward writes none).
  ref::ParamMap<M> params_;
  ref::Sequence seq_;
  ref::StepContext ctx_;
  Tensor rows_;                // an activation or its gradient over this rank's rows [rows, h]
  MpBlockCache<M> blocks_[2];  // each kind's
  MpHeadCache<M> head_;
};

// What the calls issue depends on, besides the model: the token layout, the numeric type, the
// recompute mode, the attention and the routing, the sizes of the rank's groups and its place in
// them. (Its parameters' shapes follow from the model and the TP and EP sizes, as local_params
// splits them; which of them it holds decides only which calls it makes.)
using TapeKey = std::array<int64_t, 13>;  // the layout's cp and tp are its groups' sizes

TapeKey tape_key(const SequenceOps::Setup& s) {
  return {s.layout->seq_len(),
          s.layout->sp() ? 1 : 0,
          s.precision == ref::Precision::kF64 ? 1 : 0,
          static_cast<int64_t>(s.recompute),
          static_cast<int64_t>(s.cp_algo),
          static_cast<int64_t>(s.attention),
          static_cast<int64_t>(s.moe_routing),
          s.tp->size(),
          s.tp->rank(),
          s.cp->size(),
          s.cp->rank(),
          s.ep->size(),
          s.ep->rank()};
}

// The thread's published tapes by key (one model at a time, bounded), shared by the runs of a
// search's candidates and of a simulated world's ranks (fibers of one thread take turns; a tape
// is published only once recorded whole, and never changes after).
std::shared_ptr<SequenceTapes> published_tapes(const SequenceOps::Setup& s) {
  struct Cache {
    ref::ModelConfig model;
    std::map<TapeKey, std::shared_ptr<SequenceTapes>> by_key;
  };
  thread_local Cache cache;
  if (!(cache.model == *s.model) || cache.by_key.size() > 4096) cache = Cache{*s.model, {}};
  std::shared_ptr<SequenceTapes>& slot = cache.by_key[tape_key(s)];
  if (!slot) slot = std::make_shared<SequenceTapes>();
  return slot;
}

}  // namespace

SequenceOps::SequenceOps(const Setup& s) : s_(s), own_(std::make_unique<SequenceTapes>()) {
  // The key reads the layout's CP and TP sizes from the groups.
  if (s.layout->cp() != s.cp->size() || s.layout->tp() != s.tp->size())
    throw std::logic_error("SequenceOps: the token layout's cp " + std::to_string(s.layout->cp()) +
                           " and tp " + std::to_string(s.layout->tp()) +
                           " are not its groups' sizes " + std::to_string(s.cp->size()) + " and " +
                           std::to_string(s.tp->size()));
  shared_ = published_tapes(s);
}

SequenceOps::~SequenceOps() = default;

void SequenceOps::call(Call c) {
  comm::Communicator* groups[] = {s_.tp, s_.cp, s_.ep};
  // A backward reads its forward's cache: the two are published, and taken, together.
  const auto pair_of = [](Call k) {
    return std::pair{static_cast<Call>(k & ~1U), static_cast<Call>(k | 1U)};
  };
  const std::pair<Call, Call> pair = pair_of(c);
  const Call forward = pair.first, backward = pair.second;  // plain names: the lambda captures them
  const auto both = [&](const SequenceTapes& t) {
    return t.calls[forward].recorded && t.calls[backward].recorded;
  };
  if (both(*shared_)) return comm::replay(shared_->calls[c].log, groups);
  SequenceTapes::Tape& t = own_->calls[c];
  if (t.recorded) return comm::replay(t.log, groups);
  if (c == backward && !own_->calls[forward].recorded)  // its cache would be empty
    throw std::logic_error("SequenceOps: a backward recorded before its forward ran here");
  if (!recorder_) {
    if (s_.precision == ref::Precision::kF64)
      recorder_ = std::make_unique<MetaRecorder<double>>(s_);
    else
      recorder_ = std::make_unique<MetaRecorder<float>>(s_);
  }
  comm::RecordingCommunicator tp(*s_.tp, t.log), cp(*s_.cp, t.log), ep(*s_.ep, t.log);
  recorder_->run(c, {.model = s_.model,
                     .tp = &tp,
                     .cp = &cp,
                     .ep = &ep,
                     .layout = s_.layout,
                     .cp_algo = s_.cp_algo,
                     .attention = s_.attention,
                     .moe_routing = s_.moe_routing,
                     .planted = testing::Mutation::kNone,
                     .ep_part_of_source = {}});
  t.recorded = true;
  if (both(*own_) && !both(*shared_)) {
    shared_->calls[forward] = own_->calls[forward];
    shared_->calls[backward] = own_->calls[backward];
  }
}

}  // namespace shardcheck::parallel
