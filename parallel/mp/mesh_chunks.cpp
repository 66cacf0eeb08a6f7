// MeshImpl (mesh_impl.hpp): one chunk's forward and backward over a microbatch on this rank's
// data, in the order of mesh_step.hpp (its walk of mesh_walk.hpp, ZeRO-3's residency and
// per-microbatch reductions, DDP's buckets, the chunk's end), and what that order asks of the
// gradients: the hook and health flag on a completed gradient, the bf16 rounding and the sums
// before a reduction, the microbatch's accumulation.
#include "parallel/mp/mesh_impl.hpp"

namespace shardcheck::parallel::mesh_detail {

template <class T>
std::vector<LocalParam> MeshImpl<T>::scope_params(GradScope scope) const {
  if (scope.deferred()) return units_->deferred_specs();
  std::vector<LocalParam> specs;
  for (const std::size_t k : units_->class_specs(scope.cls)) specs.push_back(specs_[k]);
  return specs;
}

template <class T>
void MeshImpl<T>::round_microbatch(GradScope scope) {
  round_microbatch_gradient(scope_params(scope), *g_.cp, kv_.get(),
                            env_.sp() ? g_.tp.get() : nullptr, mb_grads_, experts_.get(),
                            expert_parts_);
}

template <class T>
typename MeshImpl<T>::ReplicaSums MeshImpl<T>::replica_ops(GradScope scope) {
  return {scope_params(scope), scope.deferred() ? grads_ : mb_grads_};
}

template <class T>
void MeshImpl<T>::accumulate_microbatch() {
  if (!microbatch_grads()) return;
  for (const LocalParam& p : units_->deferred_specs()) {
    ref::add_inplace(grads_[p.name], mb_grads_[p.name]);
    mb_grads_[p.name].fill(T{0});
  }
}

template <class T>
Tensor<T> MeshImpl<T>::forward(int mb, int chunk, Tensor<T> input) {
  const int mbs = train_.micro_batch;
  const int vs = this->virtual_stage(chunk);
  const int first = plan_.chunk_layers[static_cast<std::size_t>(chunk)].first;
  const auto layers =
      static_cast<std::size_t>(plan_.chunk_layers[static_cast<std::size_t>(chunk)].second - first);
  mem_.set_phase(prefix_ + " microbatch " + std::to_string(mb) + " forward chunk " +
                 std::to_string(chunk));
  ChunkCache<T>& cc = caches_[{mb, chunk}];
  cc.blocks.assign(static_cast<std::size_t>(mbs), std::vector<MpBlockCache<T>>(layers));
  cc.heads.resize(vs == this->last_virtual_stage() ? static_cast<std::size_t>(mbs) : 0);
  std::vector<Tensor<T>> xs;
  if (vs != 0) xs = split_rows(input, mbs);
  // Layer by layer over the microbatch's sequences (one use of each wrap unit); the MoE sums
  // are added sequence by sequence, as one sequence at a time would add them.
  std::vector<MpSequenceLoss> moe(static_cast<std::size_t>(mbs) * layers);
  struct Parts {
    MeshImpl& e;
    int mb, first;
    std::size_t layers;
    ChunkCache<T>& cc;
    std::vector<Tensor<T>>& xs;
    std::vector<MpSequenceLoss>& moe;
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
    // The MoE sums counted once (TP and CP rank 0), what the chunk keeps held.
    void walked() {
      if (e.g_.tp->rank() == 0 && e.g_.cp->rank() == 0) {
        for (const MpSequenceLoss& l : moe) {
          e.counted_[1] += l.aux;
          e.counted_[2] += static_cast<double>(l.dropped);
        }
      }
      std::size_t held = 0;
      for (const auto& blocks : cc.blocks)
        for (const MpBlockCache<T>& b : blocks) held += cache_elems(b);
      for (const MpHeadCache<T>& h : cc.heads) held += cache_elems(h);
      cc.held =
          comm::TrackedBytes(e.mem_, comm::MemCategory::activations, held * e.recipe_.activation);
    }
  };
  this->forward_chunk(mb, chunk, Parts{*this, mb, first, layers, cc, xs, moe});
  if (vs != this->last_virtual_stage()) return concat_rows(xs);
  return {};
}

template <class T>
Tensor<T> MeshImpl<T>::backward(int mb, int chunk, Tensor<T> dout) {
  const int mbs = train_.micro_batch;
  const int vs = this->virtual_stage(chunk);
  const int first = plan_.chunk_layers[static_cast<std::size_t>(chunk)].first;
  mem_.set_phase(prefix_ + " microbatch " + std::to_string(mb) + " backward chunk " +
                 std::to_string(chunk));
  ChunkCache<T>& cc = caches_.at({mb, chunk});
  std::vector<Tensor<T>> dxs;
  if (vs != this->last_virtual_stage()) dxs = split_rows(dout, mbs);
  Tensor<T> result;
  // Layer by layer (each over the microbatch's sequences), so a layer's gradient is complete as
  // early as possible; every parameter still adds its sequences' contributions in order.
  struct Parts {
    MeshImpl& e;
    int mb, chunk, first, vs;
    ChunkCache<T>& cc;
    ref::ParamMap<T>& grads;
    std::vector<Tensor<T>>& dxs;
    Tensor<T>& result;
    MpBlockCache<T> again;  // full recompute: the block from its input, its collectives too
    comm::TrackedBytes recomputed;
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
    // The input's gradient for the previous stage; the chunk's cache goes.
    void walked() {
      if (vs != 0) result = concat_rows(dxs);
      e.caches_.erase({mb, chunk});
    }
  };
  this->backward_chunk(mb, chunk,
                       Parts{*this, mb, chunk, first, vs, cc, grad_target(), dxs, result, {}, {}});
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

template std::vector<LocalParam> MeshImpl<double>::scope_params(GradScope) const;
template void MeshImpl<double>::round_microbatch(GradScope);
template MeshImpl<double>::ReplicaSums MeshImpl<double>::replica_ops(GradScope);
template void MeshImpl<double>::accumulate_microbatch();
template Tensor<double> MeshImpl<double>::forward(int, int, Tensor<double>);
template Tensor<double> MeshImpl<double>::backward(int, int, Tensor<double>);
template void MeshImpl<double>::issue_bucket(const MeshOptimizer<double>::Pick&, bool);
template void MeshImpl<double>::check_gradients(int, ref::ParamMap<double>&,
                                                const MeshOptimizer<double>::Pick&);
template void MeshImpl<double>::keep_for_backward(MpBlockCache<double>&) const;
template std::vector<LocalParam> MeshImpl<float>::scope_params(GradScope) const;
template void MeshImpl<float>::round_microbatch(GradScope);
template MeshImpl<float>::ReplicaSums MeshImpl<float>::replica_ops(GradScope);
template void MeshImpl<float>::accumulate_microbatch();
template Tensor<float> MeshImpl<float>::forward(int, int, Tensor<float>);
template Tensor<float> MeshImpl<float>::backward(int, int, Tensor<float>);
template void MeshImpl<float>::issue_bucket(const MeshOptimizer<float>::Pick&, bool);
template void MeshImpl<float>::check_gradients(int, ref::ParamMap<float>&,
                                               const MeshOptimizer<float>::Pick&);
template void MeshImpl<float>::keep_for_backward(MpBlockCache<float>&) const;

}  // namespace shardcheck::parallel::mesh_detail
