// The order of one training step on a rank of the mesh engine, written once: its phases, each
// chunk's forward and backward around the per-sequence work, what a completed gradient sets off,
// a chunk's end and the step's gradient sums. Two backends run it: the numeric engine (MeshImpl<T>,
// mesh_impl.hpp, on data) and the engine's timing-only backend (mesh_timing.hpp, on null
// buffers of the same counts). What differs between them is only what a call does to data; which
// collectives go, in which order, on which group, is decided here and in the pieces this calls
// (mesh_walk.hpp, mesh_residency.hpp, mesh_unit_reducer.hpp, mesh_rows.hpp, mesh_bf16.hpp).
//
// StepOrder<D> is a base of the backend D (CRTP), which provides:
// - residency(): the ZeRO-3 / FSDP Residency, or null;
// - units(): the UnitReducer of ZeRO-3's per-microbatch reductions (inert below ZeRO-3);
// - count(), pipeline(), reduced(), sum(), update(): the step's phases 1, 2, the end of 3 (after
//   the sums), 4 and 5 (run_step);
// - sync_tied_embedding(): the tied embedding's exchange between the first and the last stage;
// - reduce(): the optimizer's gradient reductions at the step's end;
// - round_microbatch(scope): the bf16 recipe's sums before rounding, and the rounding;
// - replica_ops(scope): the Ops of replica_sums over the scope's parameters;
// - microbatch_sum_ops(): the Ops of no_shard_sums (each microbatch's gradient);
// - accumulate_microbatch(): the microbatch's gradients reduced at the step's end join the step's;
// - completed(mb, step): the gradients `step` completed are whole for this microbatch;
// - issue_bucket(pick, flush): DDP overlap, the picked gradients join the open bucket.
// A scope names the gradients a call reaches: those reduced at the step's end (deferred) or one
// flat class's (ZeRO-3's buffers reduced every microbatch, mesh_unit_reducer.hpp).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_rows.hpp"
#include "parallel/mp/mesh_walk.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel::mesh_detail {

struct GradScope {
  static constexpr std::size_t kDeferred = static_cast<std::size_t>(-1);
  std::size_t cls = kDeferred;  // a flat class's index, or kDeferred
  bool deferred() const { return cls == kDeferred; }
};

template <class D>
class StepOrder {
 public:
  // What the order reads, fixed for the rank: its chunks, the data-parallel rules, the precision,
  // the groups it sums over (null, or of one rank, where there is nothing to sum: the Ops skip
  // them).
  struct Setup {
    const ref::ModelConfig* model = nullptr;
    const std::map<int, int>* wrap_of = nullptr;  // layerwise unit -> wrap unit
    const StagePlan* plan = nullptr;
    int pp = 1, virtual_stages = 1, stage = 0;
    int micro_batch = 1;
    ref::Precision precision = ref::Precision::kF32;
    ref::Recompute recompute = ref::Recompute::kNone;
    bool no_shard = false;     // FSDP no_shard: each microbatch's gradient summed
    bool ddp_overlap = false;  // DDP's buckets issued during the last microbatch's backward
    comm::Communicator* sp_tp = nullptr;  // under SP: tp (its TP-replicated partial gradients)
    comm::Communicator* kv = nullptr;     // the TP ranks sharing one replicated kv head
    comm::Communicator* dense = nullptr;  // no_shard: the dense and the expert sums' groups
    comm::Communicator* expert = nullptr;
  };

 protected:
  void set_order(const Setup& s) {
    o_ = s;
    chunk_steps_.assign(static_cast<std::size_t>(2 * s.virtual_stages), std::nullopt);
  }
  const Setup& order() const { return o_; }
  bool bf16() const { return o_.precision == ref::Precision::kBf16; }

  // The step: 1. the loss denominators, 2. the pipeline over the microbatches, 3. the gradient
  // sums (sync_gradients), 4. the norm, the numerators and the health check, 5. the update.
  void run_step() {
    d().count();
    d().pipeline();
    sync_gradients();
    d().reduced();
    d().sum();
    d().update();
  }

  // Set by the pipeline phase: this step's microbatches per rank.
  int microbatches_ = 1;

  int virtual_stage(int chunk) const { return chunk * o_.pp + o_.stage; }
  int last_virtual_stage() const { return o_.pp * o_.virtual_stages - 1; }

  // The steps of a chunk's forward or backward (mesh_walk.hpp) and the units they use: the same
  // every microbatch, so built once per chunk and direction.
  struct Steps {
    std::vector<ChunkStep> steps;
    std::vector<std::vector<int>> uses;
  };
  const Steps& chunk_steps(int chunk, bool forward) {
    std::optional<Steps>& s = chunk_steps_[static_cast<std::size_t>(2 * chunk + (forward ? 1 : 0))];
    if (!s) {
      const int vs = virtual_stage(chunk);
      s.emplace();
      s->steps = mesh_detail::chunk_steps(
          *o_.model, *o_.wrap_of, o_.plan->chunk_layers[static_cast<std::size_t>(chunk)], vs == 0,
          vs == last_virtual_stage(), o_.plan->has_embed, forward);
      s->uses = step_uses(s->steps);
    }
    return *s;
  }

  // A chunk's forward over microbatch mb: parts.forward(step, sequence) for each step and
  // sequence (mesh_walk.hpp), each step's units gathered first (ZeRO-3); parts.walked() after the
  // last, before the units are freed.
  template <class Parts>
  void forward_chunk(int mb, int chunk, Parts&& parts) {
    const Steps& s = chunk_steps(chunk, true);
    begin_uses(mb, chunk, true, s);
    struct Walk {
      StepOrder& o;
      Parts& parts;
      void use() { o.use(); }
      void forward(const ChunkStep& step, int i) { parts.forward(step, i); }
    };
    walk_forward(s.steps, o_.micro_batch, Walk{*this, parts});
    parts.walked();
    end_uses();
  }

  // A chunk's backward over microbatch mb: parts.recompute (full recompute) and parts.backward
  // for each step and sequence; what each step completes set off (the hook, DDP's bucket, ZeRO-3's
  // reductions); parts.walked() after the last step; then the chunk's end: the rounding and sums
  // of the microbatch's gradient, its accumulation, DDP's last bucket of the chunk.
  template <class Parts>
  void backward_chunk(int mb, int chunk, Parts&& parts) {
    const bool last = mb == microbatches_ - 1;
    const Steps& s = chunk_steps(chunk, false);
    begin_uses(mb, chunk, false, s);
    struct Walk {
      StepOrder& o;
      Parts& parts;
      int mb, chunk;
      bool bucket;  // DDP overlap, f64/f32, the last microbatch: buckets issued as they fill
      void use() { o.use(); }
      void begin(std::size_t step) { o.d().units().begin(chunk, step); }
      void recompute(const ChunkStep& step, int i) { parts.recompute(step, i); }
      void backward(const ChunkStep& step, int i) { parts.backward(step, i); }
      void complete(const ChunkStep& step, std::size_t k) {
        o.d().completed(mb, step);
        if (bucket)
          o.d().issue_bucket([&](const LocalParam& p) { return step.completes(p); }, false);
        o.unit_ready(chunk, k);
      }
    };
    // The bf16 recipe rounds the whole chunk's microbatch gradient first, so its buckets go at
    // the chunk's end.
    walk_backward(s.steps, o_.micro_batch, o_.recompute == ref::Recompute::kFull,
                  Walk{*this, parts, mb, chunk, !bf16() && o_.ddp_overlap && last});
    parts.walked();
    end_uses();
    d().units().finish();
    // What the step's end reduces (ZeRO-3: the buffers not reduced above): rounded (bf16), summed
    // (FSDP no_shard), added to the step's.
    if (bf16()) d().round_microbatch(GradScope{});
    if (o_.no_shard) no_shard_sums(o_.dense, o_.expert, d().microbatch_sum_ops());
    d().accumulate_microbatch();
    if (o_.ddp_overlap && last)
      d().issue_bucket(
          [&](const LocalParam& p) {
            return chunk_writes(*o_.model, *o_.plan, chunk, virtual_stage(chunk),
                                last_virtual_stage(), p);
          },
          true);
  }

 private:
  friend D;
  D& d() { return static_cast<D&>(*this); }

  void begin_uses(int mb, int chunk, bool forward, const Steps& s) {
    if (auto* r = d().residency()) r->begin(mb, chunk, forward, s.uses);
  }
  void use() {
    if (auto* r = d().residency()) r->next();
  }
  void end_uses() {
    if (auto* r = d().residency()) r->end();
  }

  // ZeRO-3: a buffer the step completes is rounded (bf16) and pre-summed as sync_gradients would
  // (SP's TP-replicated, the replicated kv heads) before its reduce_scatter.
  void unit_ready(int chunk, std::size_t step) {
    d().units().ready(chunk, step, [&](std::size_t ci) {
      if (bf16()) d().round_microbatch(GradScope{ci});
      replica_sums(o_.sp_tp, o_.kv, d().replica_ops(GradScope{ci}));
    });
  }

  // 3. The tied embedding between the first and the last stage, SP's TP-replicated parameters
  // and the replicated kv heads over their ranks (ZeRO-3's buffers reduced every microbatch had
  // these sums then: unit_ready), then the optimizer's reductions (none under no_shard: each
  // microbatch's were summed).
  void sync_gradients() {
    d().sync_tied_embedding();
    replica_sums(o_.sp_tp, o_.kv, d().replica_ops(GradScope{}));
    if (!o_.no_shard) d().reduce();
  }

  Setup o_;
  std::vector<std::optional<Steps>> chunk_steps_;  // per chunk: backward, forward
};

}  // namespace shardcheck::parallel::mesh_detail
