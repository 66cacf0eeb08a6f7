// The TP (+SP) block, embedding and head of tp_block.hpp. Backward mirrors forward: the backward of
// "gather rows over TP" (SP) is a reduce_scatter, of a replicated input to a column-parallel layer
// an all_reduce, of the row-parallel reduction the identity (all_reduce) or an all_gather (SP).
#include "parallel/mp/tp_block.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>

#include "parallel/costs.hpp"
#include "parallel/testing.hpp"
#include "reference/attention.hpp"
#include "reference/moe.hpp"

namespace shardcheck::parallel {
namespace {

using ref::Tensor;

// A layer's parameter names, built in one buffer: name("attn.wq") is "layers.<i>.attn.wq" (valid
// until the next call; a lookup takes it at once).
class LayerName {
 public:
  explicit LayerName(int layer)
      : buf_("layers." + std::to_string(layer) + "."), base_(buf_.size()) {}
  std::string_view operator()(std::string_view suffix) {
    buf_.resize(base_);
    buf_ += suffix;
    return buf_;
  }

 private:
  std::string buf_;
  std::size_t base_;
};

void cost(const BlockEnv& env, const comm::ComputeCost& c) {
  env.tp->compute(c);
}
// Rows of an activation [rows, features], and a weight's columns other than its h-wide side.
template <class T>
double rows_of(const Tensor<T>& x) {
  return static_cast<double>(x.numel() / x.shape().back());
}
template <class T>
double cols_of(const Tensor<T>& w, int64_t h) {
  return static_cast<double>(w.numel() / h);
}

// The CP rank's rows from this rank's rows (SP: all_gather over TP; else the same tensor).
template <class T>
Tensor<T> gather_in(const BlockEnv& env, const Tensor<T>& local) {
  return env.sp() ? sp_gather(*env.tp, local) : local;
}
// Backward of gather_in: the partial input gradients of every TP rank summed (SP: each keeps its
// rows).
template <class T>
Tensor<T> gather_in_backward(const BlockEnv& env, Tensor<T> d_full) {
  if (env.sp()) return sp_reduce_scatter(*env.tp, d_full);
  all_reduce_sum(*env.tp, d_full);
  return d_full;
}
// Row-parallel partial sums [cp rows, h] -> this rank's rows of the sum.
template <class T>
Tensor<T> reduce_out(const BlockEnv& env, Tensor<T> partial, bool may_mutate) {
  if (may_mutate && env.planted == testing::Mutation::kRowParallelNotReduced) {
    if (!env.sp()) return partial;
    const int64_t n = partial.dim(0) / env.tp_size();
    std::vector<int64_t> mine(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = env.tp_rank() * n + i;
    return take_rows(partial, mine);
  }
  if (env.sp()) return sp_reduce_scatter(*env.tp, partial);
  all_reduce_sum(*env.tp, partial);
  return partial;
}
// Backward of reduce_out: the output gradient for every CP row (SP: all_gather).
template <class T>
Tensor<T> reduce_out_backward(const BlockEnv& env, const Tensor<T>& dy) {
  return gather_in(env, dy);
}
// This rank's rows of a tensor over the CP rank's rows that every TP rank holds in full.
template <class T>
Tensor<T> own_part(const BlockEnv& env, const Tensor<T>& full) {
  if (!env.sp()) return full;
  const int64_t n = full.dim(0) / env.tp_size();
  std::vector<int64_t> mine(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = env.tp_rank() * n + i;
  return take_rows(full, mine);
}

std::vector<int32_t> pick(const std::vector<int32_t>& v, const std::vector<int64_t>& rows) {
  std::vector<int32_t> out;
  out.reserve(rows.size());
  for (const int64_t r : rows) out.push_back(v[static_cast<std::size_t>(r)]);
  return out;
}

// The sequence's ids at the CP rank's rows; a timing-only run reads none.
template <class T>
std::vector<int32_t> ids_at(const BlockEnv& env, const std::vector<int32_t>& ids) {
  if constexpr (kIsMeta<T>)
    return {};
  else
    return pick(ids, env.cp_rows());
}

ref::AttentionDropout dropout_of(const BlockEnv& env, const ref::StepContext& ctx, int layer,
                                 const ref::Sequence& seq) {
  ref::AttentionDropout d;
  d.rate = env.model->dropout;
  d.seed = ctx.seed;
  d.layer = layer;
  d.step = ctx.step;
  d.sequence = seq.index;
  d.head_offset = env.tp_rank() * env.local_heads();
  d.total_heads = env.model->heads;
  return d;
}

template <class P, class Map>
void local_experts(const BlockEnv& env, Map& m, int layer, std::vector<P*>& gate,
                   std::vector<P*>& up, std::vector<P*>& down) {
  const int per = env.model->moe->experts / env.ep->size();
  for (int j = env.ep->rank() * per; j < (env.ep->rank() + 1) * per; ++j) {
    LayerName p(layer);
    const std::string expert = "moe.experts." + std::to_string(j) + ".";
    if (env.model->gated_mlp()) gate.push_back(&m[p(expert + "w_gate")]);
    up.push_back(&m[p(expert + "w_up")]);
    down.push_back(&m[p(expert + "w_down")]);
  }
}

// The dense MLP's gate (null for GELU) and up projection of a layer, in params or grads. Planted
// kGateUpSwapped: TP ranks other than 0 take each for the other, as a fused [gate | up] column
// shard read back in the wrong chunk order after a TP reshard.
template <class Map>
auto gate_up(const BlockEnv& env, Map& m, LayerName& p) {
  using P = std::remove_reference_t<decltype(m[std::string()])>;
  P* up = &m[p("mlp.w_up")];
  if (!env.model->gated_mlp()) return std::pair<P*, P*>{nullptr, up};
  P* gate = &m[p("mlp.w_gate")];
  if (env.planted == testing::Mutation::kGateUpSwapped && env.tp_rank() > 0) std::swap(gate, up);
  return std::pair<P*, P*>{gate, up};
}

VocabShard vocab_shard_of(const BlockEnv& env) {
  return vocab_shard(env.model->vocab, env.tp_size(), env.tp_rank(), env.model->vocab_pad_multiple);
}

}  // namespace

std::vector<int32_t> cp_positions(const BlockEnv& env, const ref::Sequence& seq) {
  const std::vector<int64_t> rows = env.cp_rows();
  std::vector<int32_t> pos = pick(seq.positions, rows);
  if (env.planted == testing::Mutation::kCpRopeChunkOffset && env.layout->cp() > 1) {
    const int64_t chunk = env.layout->seq_len() / (2 * int64_t{env.layout->cp()});
    for (std::size_t i = 0; i < rows.size(); ++i) pos[i] = static_cast<int32_t>(rows[i] % chunk);
  }
  return pos;
}

namespace {
// cp_positions; a timing-only run rotates nothing and reads none.
template <class T>
std::vector<int32_t> positions_of(const BlockEnv& env, const ref::Sequence& seq) {
  if constexpr (kIsMeta<T>)
    return {};
  else
    return cp_positions(env, seq);
}
}  // namespace

template <class T>
Tensor<T> mp_embed_forward(const BlockEnv& env, const ref::ParamMap<T>& params,
                           const ref::Sequence& seq) {
  Tensor<T> part;
  if constexpr (kIsMeta<T>) {  // the lookup's shape: a row per token
    part = Tensor<T>({env.layout->cp_row_count(), params["embed.weight"].dim(1)});
  } else {
    const std::vector<int32_t> tokens = pick(seq.tokens, env.cp_rows());
    part = vocab_embed_forward(params["embed.weight"], vocab_shard_of(env),
                               std::span<const int32_t>(tokens));
  }
  return reduce_out(env, std::move(part), false);
}

template <class T>
void mp_embed_backward(const BlockEnv& env, const ref::Sequence& seq, const Tensor<T>& dx,
                       ref::ParamMap<T>& grads) {
  const Tensor<T> dy = reduce_out_backward(env, dx);
  if constexpr (!kIsMeta<T>) {
    const std::vector<int32_t> tokens = pick(seq.tokens, env.cp_rows());
    vocab_embed_backward(dy, vocab_shard_of(env), std::span<const int32_t>(tokens),
                         grads["embed.weight"]);
  }
}

template <class T>
Tensor<T> mp_block_forward(const BlockEnv& env, const ref::ParamMap<T>& params, int layer,
                           const ref::Sequence& seq, const ref::StepContext& ctx,
                           const Tensor<T>& x, MpBlockCache<T>& c, MpSequenceLoss* loss) {
  LayerName p(layer);
  const int hl = env.local_heads(), kvl = env.local_kv_heads();
  c.x_in = x;
  c.a = ref::rmsnorm_forward(x, params[p("attn_norm.weight")], &c.rstd1);
  c.a_full = gather_in(env, c.a);
  const Tensor<T>& wq = params[p("attn.wq")];
  const Tensor<T>& wk = params[p("attn.wk")];
  const Tensor<T>& wv = params[p("attn.wv")];
  const Tensor<T>& wo = params[p("attn.wo")];
  c.q = ref::linear_forward(c.a_full, wq);
  c.k = ref::linear_forward(c.a_full, wk);
  c.v = ref::linear_forward(c.a_full, wv);
  const int64_t h = env.model->hidden;
  cost(env, costs::qkv(rows_of(c.a_full), static_cast<double>(h), cols_of(wq, h), cols_of(wk, h)));
  const std::vector<int32_t> pos = positions_of<T>(env, seq);
  ref::rope_apply(c.q, std::span<const int32_t>(pos), hl, false, env.model->rope);
  ref::rope_apply(c.k, std::span<const int32_t>(pos), kvl, false, env.model->rope);
  c.o = cp_attention_forward(*env.cp, env.cp_algo, *env.layout, c.q, c.k, c.v,
                             std::span<const int32_t>(seq.doc_ids), ref::AttentionShape{hl, kvl},
                             dropout_of(env, ctx, layer, seq), c.attn, env.planted, env.attention);
  Tensor<T> part = ref::linear_forward(c.o, wo);
  cost(env, costs::wo(rows_of(c.o), cols_of(wo, h), static_cast<double>(h)));
  c.x_mid = x;
  ref::add_inplace(c.x_mid, reduce_out(env, std::move(part), true));
  c.b = ref::rmsnorm_forward(c.x_mid, params[p("mlp_norm.weight")], &c.rstd2);
  Tensor<T> x_out = c.x_mid;
  if (env.model->is_moe_layer(layer)) {
    std::vector<const Tensor<T>*> gate, up, down;
    local_experts<const Tensor<T>>(env, params, layer, gate, up, down);
    const EpGroups g{.ep = env.ep, .cp = env.cp, .tp = env.sp() ? env.tp : nullptr};
    double aux = 0.0;
    int64_t dropped = 0;
    ref::add_inplace(
        x_out, ep_moe_forward(g, *env.layout, c.b, std::span<const int32_t>(seq.doc_ids),
                              params[p("moe.router")], gate, up, down, moe_spec(*env.model), c.moe,
                              &aux, &dropped, env.planted, env.moe_routing));
    if (loss) {
      loss->aux += aux;
      loss->dropped += dropped;
    }
  } else {
    c.b_full = gather_in(env, c.b);
    const auto [w_gate, w_up] = gate_up(env, params, p);
    const Tensor<T>& w_down = params[p("mlp.w_down")];
    Tensor<T> mlp_part = ref::mlp_forward(c.b_full, w_gate, *w_up, w_down, &c.mlp);
    cost(env, costs::mlp(rows_of(c.b_full), static_cast<double>(h), cols_of(*w_up, h),
                         env.model->gated_mlp()));
    ref::add_inplace(x_out, reduce_out(env, std::move(mlp_part), true));
  }
  return x_out;
}

template <class T>
Tensor<T> mp_block_backward(const BlockEnv& env, const ref::ParamMap<T>& params, int layer,
                            const ref::Sequence& seq, const ref::StepContext& ctx,
                            const MpBlockCache<T>& c, const Tensor<T>& dy, ref::ParamMap<T>& grads,
                            std::vector<ref::ParamMap<T>>* expert_parts) {
  LayerName p(layer);
  const int hl = env.local_heads(), kvl = env.local_kv_heads();
  const int64_t h = env.model->hidden;
  Tensor<T> dx = dy;
  Tensor<T> db;
  if (env.model->is_moe_layer(layer)) {
    std::vector<const Tensor<T>*> gate, up, down;
    local_experts<const Tensor<T>>(env, params, layer, gate, up, down);
    std::vector<Tensor<T>*> dgate, dup, ddown;
    if (env.ep_part_of_source.empty()) {
      local_experts<Tensor<T>>(env, grads, layer, dgate, dup, ddown);
    } else {
      if (expert_parts == nullptr)
        throw std::invalid_argument("mp_block_backward: the expert gradients' parts are needed");
      for (ref::ParamMap<T>& part : *expert_parts)
        local_experts<Tensor<T>>(env, part, layer, dgate, dup, ddown);
    }
    const EpGroups g{.ep = env.ep, .cp = env.cp, .tp = env.sp() ? env.tp : nullptr};
    db = ep_moe_backward(g, dx, c.moe, ctx.sequence_weight, grads[p("moe.router")], dgate, dup,
                         ddown, env.ep_part_of_source);
  } else {
    const Tensor<T> d_full = reduce_out_backward(env, dx);
    const auto [w_gate, w_up] = gate_up(env, params, p);
    const auto [dw_gate, dw_up] = gate_up(env, grads, p);
    Tensor<T> db_full = ref::mlp_backward(d_full, c.b_full, w_gate, *w_up, params[p("mlp.w_down")],
                                          c.mlp, dw_gate, *dw_up, grads[p("mlp.w_down")]);
    cost(env, costs::mlp_backward(rows_of(c.b_full), static_cast<double>(h), cols_of(*w_up, h),
                                  env.model->gated_mlp()));
    db = gather_in_backward(env, std::move(db_full));
  }
  ref::add_inplace(dx, ref::rmsnorm_backward(db, c.x_mid, params[p("mlp_norm.weight")], c.rstd2,
                                             grads[p("mlp_norm.weight")]));
  const Tensor<T> d_part = reduce_out_backward(env, dx);
  const Tensor<T> d_o =
      ref::linear_backward(d_part, c.o, params[p("attn.wo")], grads[p("attn.wo")]);
  Tensor<T> dq, dk, dv;
  cp_attention_backward(*env.cp, d_o, c.attn, dq, dk, dv);
  const std::vector<int32_t> pos = positions_of<T>(env, seq);
  ref::rope_apply(dq, std::span<const int32_t>(pos), hl, true, env.model->rope);
  ref::rope_apply(dk, std::span<const int32_t>(pos), kvl, true, env.model->rope);
  Tensor<T> da_full = ref::linear_backward(dq, c.a_full, params[p("attn.wq")], grads[p("attn.wq")]);
  ref::add_inplace(da_full,
                   ref::linear_backward(dk, c.a_full, params[p("attn.wk")], grads[p("attn.wk")]));
  ref::add_inplace(da_full,
                   ref::linear_backward(dv, c.a_full, params[p("attn.wv")], grads[p("attn.wv")]));
  cost(env, costs::projections_backward(rows_of(c.a_full), static_cast<double>(h),
                                        cols_of(params[p("attn.wq")], h),
                                        cols_of(params[p("attn.wk")], h)));
  const Tensor<T> da = gather_in_backward(env, std::move(da_full));
  ref::add_inplace(dx, ref::rmsnorm_backward(da, c.x_in, params[p("attn_norm.weight")], c.rstd1,
                                             grads[p("attn_norm.weight")]));
  return dx;
}

template <class T>
void mp_head_forward(const BlockEnv& env, const ref::ParamMap<T>& params, const ref::Sequence& seq,
                     const Tensor<T>& x, MpHeadCache<T>& c, MpSequenceLoss* loss) {
  c.x = x;
  const Tensor<T> y = ref::rmsnorm_forward(x, params["final_norm.weight"], &c.rstd);
  c.y_full = gather_in(env, y);
  const bool tied = env.model->tie_embeddings;
  const Tensor<T>& w = tied ? params["embed.weight"] : params["lm_head.weight"];
  const std::vector<int32_t> targets = ids_at<T>(env, seq.targets);
  const std::vector<int32_t> mask = ids_at<T>(env, seq.loss_mask);
  const std::vector<double> losses = vocab_head_forward(
      *env.tp, c.y_full, w, tied, vocab_shard_of(env), std::span<const int32_t>(targets),
      std::span<const int32_t>(mask), c.vocab, env.planted);
  if (loss) {
    for (const double l : losses) loss->loss_sum += l;
  }
}

template <class T>
Tensor<T> mp_head_backward(const BlockEnv& env, const ref::ParamMap<T>& params,
                           const ref::Sequence& seq, double token_weight, const MpHeadCache<T>& c,
                           ref::ParamMap<T>& grads) {
  const bool tied = env.model->tie_embeddings;
  const char* wname = tied ? "embed.weight" : "lm_head.weight";
  const std::vector<int32_t> mask = ids_at<T>(env, seq.loss_mask);
  std::vector<double> weight(mask.size());
  for (std::size_t t = 0; t < mask.size(); ++t) weight[t] = mask[t] ? token_weight : 0.0;
  const Tensor<T> dy_full = vocab_head_backward(*env.tp, c.y_full, params[wname], tied, c.vocab,
                                                std::span<const double>(weight), grads[wname]);
  return ref::rmsnorm_backward(own_part(env, dy_full), c.x, params["final_norm.weight"], c.rstd,
                               grads["final_norm.weight"]);
}

#define SHARDCHECK_TP_BLOCK(T)                                                                  \
  template Tensor<T> mp_embed_forward(const BlockEnv&, const ref::ParamMap<T>&,                 \
                                      const ref::Sequence&);                                    \
  template void mp_embed_backward(const BlockEnv&, const ref::Sequence&, const Tensor<T>&,      \
                                  ref::ParamMap<T>&);                                           \
  template Tensor<T> mp_block_forward(const BlockEnv&, const ref::ParamMap<T>&, int,            \
                                      const ref::Sequence&, const ref::StepContext&,            \
                                      const Tensor<T>&, MpBlockCache<T>&, MpSequenceLoss*);     \
  template Tensor<T> mp_block_backward(const BlockEnv&, const ref::ParamMap<T>&, int,           \
                                       const ref::Sequence&, const ref::StepContext&,           \
                                       const MpBlockCache<T>&, const Tensor<T>&,                \
                                       ref::ParamMap<T>&, std::vector<ref::ParamMap<T>>*);      \
  template void mp_head_forward(const BlockEnv&, const ref::ParamMap<T>&, const ref::Sequence&, \
                                const Tensor<T>&, MpHeadCache<T>&, MpSequenceLoss*);            \
  template Tensor<T> mp_head_backward(const BlockEnv&, const ref::ParamMap<T>&,                 \
                                      const ref::Sequence&, double, const MpHeadCache<T>&,      \
                                      ref::ParamMap<T>&);
SHARDCHECK_TP_BLOCK(double)
SHARDCHECK_TP_BLOCK(float)
SHARDCHECK_TP_BLOCK(Meta<double>)
SHARDCHECK_TP_BLOCK(Meta<float>)
#undef SHARDCHECK_TP_BLOCK

}  // namespace shardcheck::parallel
