// MeshImpl (mesh_impl.hpp): one chunk's forward and backward over a microbatch on this rank, as
// mesh_walk.hpp orders them (the steps, the units each uses, the gradients each completes); at
// each completion the gradient hook and health flag, DDP's buckets (mesh_buckets.hpp) and
// ZeRO-3's per-microbatch reductions (mesh_unit_reducer.hpp); at the chunk's end the bf16
// rounding and FSDP no_shard's per-microbatch sum.
#include "parallel/mp/mesh_impl.hpp"

namespace shardcheck::parallel::mesh_detail {

template <class T>
void MeshImpl<T>::unit_ready(int chunk, std::size_t step) {
  units_->ready(chunk, step, [&](std::size_t ci) {
    std::vector<LocalParam> specs;
    for (const std::size_t k : units_->class_specs(ci)) specs.push_back(specs_[k]);
    if (train_.precision == ref::Precision::kBf16)
      round_microbatch_gradient(specs, *g_.cp, kv_.get(), env_.sp() ? g_.tp.get() : nullptr,
                                mb_grads_, experts_.get(), expert_parts_);
    struct Sums {
      const std::vector<LocalParam>& specs;
      ref::ParamMap<T>& grads;
      void sum(comm::Communicator* g, ParamPick pick) {
        if (g != nullptr) all_reduce_picked(specs, *g, pick, grads);
      }
    };
    replica_sums(env_.sp() ? g_.tp.get() : nullptr, kv_.get(), Sums{specs, mb_grads_});
  });
}

template <class T>
Tensor<T> MeshImpl<T>::forward(int mb, int chunk, Tensor<T> input) {
  const int mbs = train_.micro_batch;
  const int vs = virtual_stage(chunk);
  const auto [first, last] = plan_.chunk_layers[static_cast<std::size_t>(chunk)];
  mem_.set_phase(prefix_ + " microbatch " + std::to_string(mb) + " forward chunk " +
                 std::to_string(chunk));
  const std::vector<ChunkStep> steps = chunk_steps(chunk, true);
  begin_uses(mb, chunk, true, steps);
  ChunkCache<T>& cc = caches_[{mb, chunk}];
  const auto layers = static_cast<std::size_t>(last - first);
  cc.blocks.assign(static_cast<std::size_t>(mbs), std::vector<MpBlockCache<T>>(layers));
  cc.heads.resize(vs == last_virtual_stage() ? static_cast<std::size_t>(mbs) : 0);
  std::vector<Tensor<T>> xs;
  if (vs != 0) xs = split_rows(input, mbs);
  // Layer by layer over the microbatch's sequences (one use of each wrap unit); the MoE sums
  // are added sequence by sequence, as one sequence at a time would add them.
  std::vector<MpSequenceLoss> moe(static_cast<std::size_t>(mbs) * layers);
  struct Walk {
    MeshImpl& e;
    int mb, first;
    std::size_t layers;
    ChunkCache<T>& cc;
    std::vector<Tensor<T>>& xs;
    std::vector<MpSequenceLoss>& moe;
    void use() { e.use(); }
    void forward(const ChunkStep& s, int i) {
      const auto ui = static_cast<std::size_t>(i);
      switch (s.part) {
        case ChunkStep::Part::embed:
          xs.push_back(mp_embed_forward(e.env_, e.weights(), e.seq(mb, i)));
          break;
        case ChunkStep::Part::layer: {
          const auto l = static_cast<std::size_t>(s.layer - first);
          MpBlockCache<T>& bc = cc.blocks[ui][l];
          xs[ui] = mp_block_forward(e.env_, e.weights(), s.layer, e.seq(mb, i), e.ctx_, xs[ui], bc,
                                    &moe[ui * layers + l]);
          e.keep_for_backward(bc);
          break;
        }
        case ChunkStep::Part::head: {
          MpSequenceLoss l;
          mp_head_forward(e.env_, e.weights(), e.seq(mb, i), xs[ui], cc.heads[ui], &l);
          if (e.g_.tp->rank() == 0) e.counted_[0] += l.loss_sum;
          break;
        }
      }
    }
  };
  walk_forward(steps, mbs, Walk{*this, mb, first, layers, cc, xs, moe});
  if (g_.tp->rank() == 0 && g_.cp->rank() == 0) {
    for (const MpSequenceLoss& l : moe) {
      counted_[1] += l.aux;
      counted_[2] += static_cast<double>(l.dropped);
    }
  }
  std::size_t held = 0;
  for (const auto& blocks : cc.blocks)
    for (const MpBlockCache<T>& b : blocks) held += cache_elems(b);
  for (const MpHeadCache<T>& h : cc.heads) held += cache_elems(h);
  cc.held = comm::TrackedBytes(mem_, comm::MemCategory::activations, held * recipe_.activation);
  end_uses();
  if (vs != last_virtual_stage()) return concat_rows(xs);
  return {};
}

template <class T>
Tensor<T> MeshImpl<T>::backward(int mb, int chunk, Tensor<T> dout) {
  const int mbs = train_.micro_batch;
  const int vs = virtual_stage(chunk);
  const auto [first, last] = plan_.chunk_layers[static_cast<std::size_t>(chunk)];
  mem_.set_phase(prefix_ + " microbatch " + std::to_string(mb) + " backward chunk " +
                 std::to_string(chunk));
  const std::vector<ChunkStep> steps = chunk_steps(chunk, false);
  begin_uses(mb, chunk, false, steps);
  ChunkCache<T>& cc = caches_.at({mb, chunk});
  ref::ParamMap<T>& grads = grad_target();
  // The gradients a step completes for this microbatch: the hook and the health flag see them,
  // then (f64/f32, DDP overlap, last microbatch) their all_reduce is issued. The bf16 recipe
  // rounds the whole chunk's microbatch gradient first, so it issues at the chunk's end.
  const bool bf16 = train_.precision == ref::Precision::kBf16;
  std::vector<Tensor<T>> dxs;
  if (vs != last_virtual_stage()) dxs = split_rows(dout, mbs);
  // Layer by layer (each over the microbatch's sequences), so a layer's gradient is complete as
  // early as possible; every parameter still adds its sequences' contributions in order.
  struct Walk {
    MeshImpl& e;
    int mb, chunk, first;
    bool bf16;
    ChunkCache<T>& cc;
    ref::ParamMap<T>& grads;
    std::vector<Tensor<T>>& dxs;
    MpBlockCache<T> again;  // full recompute: the block from its input, its collectives too
    comm::TrackedBytes recomputed;
    void use() { e.use(); }
    void begin(std::size_t step) { e.units_->begin(chunk, step); }
    MpBlockCache<T>& cache(const ChunkStep& s, int i) {
      return cc.blocks[static_cast<std::size_t>(i)][static_cast<std::size_t>(s.layer - first)];
    }
    void recompute(const ChunkStep& s, int i) {
      again = MpBlockCache<T>{};
      mp_block_forward(e.env_, e.weights(), s.layer, e.seq(mb, i), e.ctx_, cache(s, i).x_in, again,
                       nullptr);
      recomputed = comm::TrackedBytes(e.mem_, comm::MemCategory::activations,
                                      cache_elems(again) * e.recipe_.activation);
    }
    void backward(const ChunkStep& s, int i) {
      const auto ui = static_cast<std::size_t>(i);
      switch (s.part) {
        case ChunkStep::Part::head:
          dxs.push_back(mp_head_backward(e.env_, e.weights(), e.seq(mb, i), e.ctx_.token_weight,
                                         cc.heads[ui], grads));
          break;
        case ChunkStep::Part::layer: {
          const bool full = e.train_.recompute == ref::Recompute::kFull;
          dxs[ui] = mp_block_backward(e.env_, e.weights(), s.layer, e.seq(mb, i), e.ctx_,
                                      full ? again : cache(s, i), dxs[ui], grads, &e.expert_parts_);
          again = MpBlockCache<T>{};
          recomputed.reset();
          break;
        }
        case ChunkStep::Part::embed:
          mp_embed_backward(e.env_, e.seq(mb, i), dxs[ui], grads);
          break;
      }
    }
    void complete(const ChunkStep& s, std::size_t step) {
      const auto pick = [&s](const LocalParam& p) { return s.completes(p); };
      e.check_gradients(mb, grads, pick);
      if (!bf16 && e.ddp_overlap() && mb == e.microbatches_ - 1) e.issue_bucket(pick, false);
      e.unit_ready(chunk, step);
    }
  };
  walk_backward(steps, mbs, train_.recompute == ref::Recompute::kFull,
                Walk{*this, mb, chunk, first, bf16, cc, grads, dxs, {}, {}});
  Tensor<T> result;
  if (vs != 0) result = concat_rows(dxs);
  caches_.erase({mb, chunk});
  end_uses();
  units_->finish();
  // What the step's end reduces (ZeRO-3: the buffers not reduced above) joins the accumulator.
  const std::vector<LocalParam>& whole = units_->deferred_specs();
  if (bf16) {
    round_microbatch_gradient(whole, *g_.cp, kv_.get(), env_.sp() ? g_.tp.get() : nullptr,
                              mb_grads_, experts_.get(), expert_parts_);
  }
  if (microbatch_grads()) {
    if (no_shard_) {  // FSDP no_shard: each microbatch's gradient summed after its backward
      struct Sums {
        MeshImpl& e;
        void sum(comm::Communicator* g, ParamPick pick) {
          // planted (tests): the dense parameters left out
          if (g == nullptr) return;
          if (g == e.dense_.get() && e.opt_.planted == testing::Mutation::kSkipBucket) return;
          all_reduce_picked(e.specs_, *g, pick, e.mb_grads_, e.zopt_->sum());  // planted: avg
        }
      };
      no_shard_sums(dense_.get(), expert_.get(), Sums{*this});
    }
    for (const LocalParam& p : whole) {
      ref::add_inplace(grads_[p.name], mb_grads_[p.name]);
      mb_grads_[p.name].fill(T{0});
    }
  }
  if (ddp_overlap() && mb == microbatches_ - 1)
    issue_bucket([&](const LocalParam& p) { return chunk_writes(chunk, p); }, true);
  return result;
}

template <class T>
void MeshImpl<T>::issue_bucket(const typename MeshOptimizer<T>::Pick& pick, bool flush) {
  // The optimizer holds the same specs in the same order (its copy of specs_).
  if (const std::vector<std::size_t> bucket = buckets_.add(specs_, pick, flush); !bucket.empty())
    zopt_->issue_reduce(grads_, bucket);
}

template <class T>
void MeshImpl<T>::check_gradients(int mb, ref::ParamMap<T>& grads,
                                  const typename MeshOptimizer<T>::Pick& pick) {
  if (!opt_.grad_hook && !opt_.health.check) return;
  for (const LocalParam& p : specs_) {
    if (!pick(p)) continue;
    Tensor<T> summed;  // an expert's gradient kept in parts: their sum
    if (p.expert && !expert_parts_.empty()) {
      summed = Tensor<T>(p.local_shape);
      for (ref::ParamMap<T>& part : expert_parts_) ref::add_inplace(summed, part[p.name]);
    }
    Tensor<T>& g = summed.numel() > 0 ? summed : grads[p.name];
    if (opt_.grad_hook) {
      const Tensor<T> before = summed;
      opt_.grad_hook(steps_, mb, p.name, comm::view(g.span()));
      // what the hook wrote into the sum goes into the first part, so it reaches the gradient
      for (int64_t i = 0; i < summed.numel(); ++i)
        if (std::memcmp(&summed[i], &before[i], sizeof(T)) != 0)
          expert_parts_.front()[p.name][i] += summed[i] - before[i];
    }
    if (opt_.health.check && !nonfinite_) nonfinite_ = any_nonfinite(std::span<const T>(g.vec()));
  }
}

template <class T>
void MeshImpl<T>::keep_for_backward(MpBlockCache<T>& c) const {
  drop_selective(c, train_.recompute);
  if (train_.recompute == ref::Recompute::kFull) {
    MpBlockCache<T> input_only;
    input_only.x_in = std::move(c.x_in);
    c = std::move(input_only);
  }
}

template void MeshImpl<double>::unit_ready(int, std::size_t);
template Tensor<double> MeshImpl<double>::forward(int, int, Tensor<double>);
template Tensor<double> MeshImpl<double>::backward(int, int, Tensor<double>);
template void MeshImpl<double>::issue_bucket(const MeshOptimizer<double>::Pick&, bool);
template void MeshImpl<double>::check_gradients(int, ref::ParamMap<double>&,
                                                const MeshOptimizer<double>::Pick&);
template void MeshImpl<double>::keep_for_backward(MpBlockCache<double>&) const;
template void MeshImpl<float>::unit_ready(int, std::size_t);
template Tensor<float> MeshImpl<float>::forward(int, int, Tensor<float>);
template Tensor<float> MeshImpl<float>::backward(int, int, Tensor<float>);
template void MeshImpl<float>::issue_bucket(const MeshOptimizer<float>::Pick&, bool);
template void MeshImpl<float>::check_gradients(int, ref::ParamMap<float>&,
                                               const MeshOptimizer<float>::Pick&);
template void MeshImpl<float>::keep_for_backward(MpBlockCache<float>&) const;

}  // namespace shardcheck::parallel::mesh_detail
