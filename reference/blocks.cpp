// Stage functions of blocks.hpp: the model's math, written once. Parameters are looked up by name
// (LayerRefs) so the same code serves full and partial (pipeline-stage) parameter maps.
#include "reference/blocks.hpp"

#include <string>

#include "reference/attention.hpp"
#include "reference/testing.hpp"

namespace shardcheck::ref {
namespace {

// Pointers to one layer's parameters (or gradients) looked up by name.
template <class P>
struct LayerRefs {
  P* attn_norm = nullptr;
  P* wq = nullptr;
  P* wk = nullptr;
  P* wv = nullptr;
  P* wo = nullptr;
  P* mlp_norm = nullptr;
  P* w_gate = nullptr;  // SwiGLU only
  P* w_up = nullptr;
  P* w_down = nullptr;
  P* router = nullptr;
  std::vector<P*> e_gate, e_up, e_down;  // e_gate empty for GELU
};

template <class P, class Map>
LayerRefs<P> layer_refs(const ModelConfig& cfg, Map& m, int i) {
  const std::string p = "layers." + std::to_string(i) + ".";
  LayerRefs<P> r;
  r.attn_norm = &m[p + "attn_norm.weight"];
  r.wq = &m[p + "attn.wq"];
  r.wk = &m[p + "attn.wk"];
  r.wv = &m[p + "attn.wv"];
  r.wo = &m[p + "attn.wo"];
  r.mlp_norm = &m[p + "mlp_norm.weight"];
  if (cfg.is_moe_layer(i)) {
    r.router = &m[p + "moe.router"];
    for (int e = 0; e < cfg.moe->experts; ++e) {
      const std::string ep = p + "moe.experts." + std::to_string(e) + ".";
      if (cfg.gated_mlp()) r.e_gate.push_back(&m[ep + "w_gate"]);
      r.e_up.push_back(&m[ep + "w_up"]);
      r.e_down.push_back(&m[ep + "w_down"]);
    }
  } else {
    if (cfg.gated_mlp()) r.w_gate = &m[p + "mlp.w_gate"];
    r.w_up = &m[p + "mlp.w_up"];
    r.w_down = &m[p + "mlp.w_down"];
  }
  return r;
}

MoeSpec moe_spec(const ModelConfig& cfg) {
  return {cfg.moe->experts, cfg.moe->top_k, cfg.moe->capacity_factor, cfg.moe->aux_loss};
}

AttentionDropout dropout_of(const ModelConfig& cfg, const StepContext& ctx, int layer,
                            const Sequence& seq) {
  AttentionDropout d;
  d.rate = cfg.dropout;
  d.seed = ctx.seed;
  d.layer = layer;
  d.step = ctx.step;
  d.sequence = seq.index;
  return d;
}

}  // namespace

void check_sequence(const Sequence& seq) {
  const size_t s = seq.tokens.size();
  REF_CHECK(seq.targets.size() == s && seq.loss_mask.size() == s && seq.doc_ids.size() == s &&
                seq.positions.size() == s,
            "sequence fields differ in length");
}

template <class T>
Tensor<T> embed_forward(const ParamMap<T>& params, const Sequence& seq) {
  return embedding_forward(params["embed.weight"], std::span<const int32_t>(seq.tokens));
}

template <class T>
void embed_backward(const Tensor<T>& dx, const Sequence& seq, ParamMap<T>& grads) {
  embedding_backward(dx, std::span<const int32_t>(seq.tokens), grads["embed.weight"]);
}

template <class T>
Tensor<T> block_forward(const ModelConfig& cfg, const ParamMap<T>& params, int layer,
                        const Sequence& seq, const StepContext& ctx, const Tensor<T>& x_in,
                        BlockCache<T>& c, SequenceLoss* loss) {
  const auto w = layer_refs<const Tensor<T>>(cfg, params, layer);
  const AttentionShape shape{cfg.heads, cfg.kv_heads};
  c.x_in = x_in;
  c.a = rmsnorm_forward(x_in, *w.attn_norm, &c.rstd1);
  c.q = linear_forward(c.a, *w.wq);
  c.k = linear_forward(c.a, *w.wk);
  c.v = linear_forward(c.a, *w.wv);
  rope_apply(c.q, seq.positions, cfg.heads, false, cfg.rope);
  rope_apply(c.k, seq.positions, cfg.kv_heads, false, cfg.rope);
  c.o = attention_forward(c.q, c.k, c.v, seq.doc_ids, shape, dropout_of(cfg, ctx, layer, seq),
                          &c.probs);
  c.x_mid = x_in;
  add_inplace(c.x_mid, linear_forward(c.o, *w.wo));
  c.b = rmsnorm_forward(c.x_mid, *w.mlp_norm, &c.rstd2);
  Tensor<T> x_out = c.x_mid;
  if (w.router) {
    std::vector<const Tensor<T>*> gate(w.e_gate.begin(), w.e_gate.end());
    std::vector<const Tensor<T>*> up(w.e_up.begin(), w.e_up.end());
    std::vector<const Tensor<T>*> down(w.e_down.begin(), w.e_down.end());
    double aux = 0.0;
    add_inplace(x_out, moe_forward(c.b, seq.doc_ids, *w.router, gate, up, down, moe_spec(cfg),
                                   &c.moe, &aux));
    if (loss) {
      loss->aux += aux;
      loss->moe_dropped += c.moe.routing.dropped;
      MoeLoad load{.layer = layer,
                   .routed = std::vector<int64_t>(static_cast<std::size_t>(cfg.moe->experts)),
                   .kept = std::vector<int64_t>(static_cast<std::size_t>(cfg.moe->experts))};
      load.add(c.moe.routing);
      loss->moe_load.push_back(std::move(load));
    }
  } else {
    add_inplace(x_out, mlp_forward(c.b, w.w_gate, *w.w_up, *w.w_down, &c.mlp));
  }
  return x_out;
}

template <class T>
Tensor<T> block_backward(const ModelConfig& cfg, const ParamMap<T>& params, int layer,
                         const Sequence& seq, const StepContext& ctx, const BlockCache<T>& c,
                         const Tensor<T>& dy, ParamMap<T>& grads) {
  const auto w = layer_refs<const Tensor<T>>(cfg, params, layer);
  const auto g = layer_refs<Tensor<T>>(cfg, grads, layer);
  const AttentionShape shape{cfg.heads, cfg.kv_heads};
  Tensor<T> dx = dy;
  Tensor<T> db;
  if (w.router) {
    std::vector<const Tensor<T>*> gate(w.e_gate.begin(), w.e_gate.end());
    std::vector<const Tensor<T>*> up(w.e_up.begin(), w.e_up.end());
    std::vector<const Tensor<T>*> down(w.e_down.begin(), w.e_down.end());
    db = moe_backward(dx, c.b, *w.router, gate, up, down, moe_spec(cfg), c.moe, ctx.sequence_weight,
                      *g.router, g.e_gate, g.e_up, g.e_down);
  } else {
    db = mlp_backward(dx, c.b, w.w_gate, *w.w_up, *w.w_down, c.mlp, g.w_gate, *g.w_up, *g.w_down);
  }
  add_inplace(dx, rmsnorm_backward(db, c.x_mid, *w.mlp_norm, c.rstd2, *g.mlp_norm));
  Tensor<T> d_o = linear_backward(dx, c.o, *w.wo, *g.wo);
  Tensor<T> dq, dk, dv;
  const AttentionDropout dropout = dropout_of(cfg, ctx, layer, seq);
  Tensor<T> recomputed;  // selective recompute: the attention core again, the same bits
  if (c.probs.numel() == 0)
    attention_forward(c.q, c.k, c.v, seq.doc_ids, shape, dropout, &recomputed);
  const Tensor<T>& probs = c.probs.numel() == 0 ? recomputed : c.probs;
  attention_backward(d_o, c.q, c.k, c.v, shape, dropout, probs, dq, dk, dv);
  rope_apply(dq, seq.positions, cfg.heads, true, cfg.rope);
  rope_apply(dk, seq.positions, cfg.kv_heads, true, cfg.rope);
  Tensor<T> da = linear_backward(dq, c.a, *w.wq, *g.wq);
  add_inplace(da, linear_backward(dk, c.a, *w.wk, *g.wk));
  add_inplace(da, linear_backward(dv, c.a, *w.wv, *g.wv));
  add_inplace(dx, rmsnorm_backward(da, c.x_in, *w.attn_norm, c.rstd1, *g.attn_norm));
  return dx;
}

template <class T>
void head_forward(const ModelConfig& cfg, const ParamMap<T>& params, const Sequence& seq,
                  const Tensor<T>& x, HeadCache<T>& c, SequenceLoss* loss) {
  REF_CHECK(loss != nullptr,
            "head_forward needs a SequenceLoss to write the per-token losses into (unlike "
            "block_forward, whose loss argument may be null)");
  c.x = x;
  c.y = rmsnorm_forward(x, params["final_norm.weight"], &c.rstd);
  c.logits = cfg.tie_embeddings ? linear_t_forward(c.y, params["embed.weight"])
                                : linear_forward(c.y, params["lm_head.weight"]);
  loss->token_loss = cross_entropy_forward(c.logits, seq.targets, seq.loss_mask);
  loss->tokens = seq.mask_count();
  loss->loss_sum = 0.0;
  for (double l : loss->token_loss) loss->loss_sum += l;
}

template <class T>
Tensor<T> head_backward(const ModelConfig& cfg, const ParamMap<T>& params, const Sequence& seq,
                        const StepContext& ctx, const HeadCache<T>& c, ParamMap<T>& grads,
                        Tensor<T>* tied) {
  const size_t s = seq.tokens.size();
  double tw = ctx.token_weight;
  if (testing::mutated(testing::Mutation::kMeanOfSequenceMeans)) {
    const int64_t n = seq.mask_count();
    tw = n > 0 ? ctx.sequence_weight / static_cast<double>(n) : 0.0;
  }
  std::vector<double> weight(s, 0.0);
  for (size_t t = 0; t < s; ++t) weight[t] = seq.loss_mask[t] ? tw : 0.0;
  const Tensor<T> dlogits = cross_entropy_backward(c.logits, seq.targets, weight);
  const Tensor<T> dy =
      cfg.tie_embeddings
          ? linear_t_backward(dlogits, c.y, params["embed.weight"],
                              tied != nullptr ? *tied : grads["embed.weight"])
          : linear_backward(dlogits, c.y, params["lm_head.weight"], grads["lm_head.weight"]);
  return rmsnorm_backward(dy, c.x, params["final_norm.weight"], c.rstd, grads["final_norm.weight"]);
}

template <class T>
void keep_for_backward(BlockCache<T>& c, Recompute mode) {
  if (mode == Recompute::kSelective) c.probs = Tensor<T>{};
  if (mode == Recompute::kFull) {
    BlockCache<T> input_only;
    input_only.x_in = std::move(c.x_in);
    c = std::move(input_only);
  }
}

#define REF_INSTANTIATE(T)                                                                        \
  template void keep_for_backward(BlockCache<T>&, Recompute);                                     \
  template Tensor<T> embed_forward(const ParamMap<T>&, const Sequence&);                          \
  template void embed_backward(const Tensor<T>&, const Sequence&, ParamMap<T>&);                  \
  template Tensor<T> block_forward(const ModelConfig&, const ParamMap<T>&, int, const Sequence&,  \
                                   const StepContext&, const Tensor<T>&, BlockCache<T>&,          \
                                   SequenceLoss*);                                                \
  template Tensor<T> block_backward(const ModelConfig&, const ParamMap<T>&, int, const Sequence&, \
                                    const StepContext&, const BlockCache<T>&, const Tensor<T>&,   \
                                    ParamMap<T>&);                                                \
  template void head_forward(const ModelConfig&, const ParamMap<T>&, const Sequence&,             \
                             const Tensor<T>&, HeadCache<T>&, SequenceLoss*);                     \
  template Tensor<T> head_backward(const ModelConfig&, const ParamMap<T>&, const Sequence&,       \
                                   const StepContext&, const HeadCache<T>&, ParamMap<T>&,         \
                                   Tensor<T>*);
REF_INSTANTIATE(double)
REF_INSTANTIATE(float)
#undef REF_INSTANTIATE

}  // namespace shardcheck::ref
