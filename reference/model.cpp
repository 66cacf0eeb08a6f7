// Forward and backward of the reference model, one sequence at a time (attention and MoE routing
// are per sequence anyway). Activation checkpointing keeps only each block's input and re-runs the
// same block_forward in backward, so it is bitwise equal to storing everything.
#include "reference/model.hpp"

#include <cmath>

#include "reference/rng.hpp"
#include "reference/testing.hpp"

namespace shardcheck::ref {

std::vector<std::pair<std::string, Shape>> part_param_shapes(const ModelConfig& cfg, int part) {
  const int64_t h = cfg.hidden, v = cfg.vocab, f = cfg.ffn;
  const int64_t qd = int64_t{cfg.heads} * cfg.head_dim(),
                kvd = int64_t{cfg.kv_heads} * cfg.head_dim();
  std::vector<std::pair<std::string, Shape>> out;
  if (part < 0) {
    out.push_back({"embed.weight", {v, h}});
  } else if (part < cfg.layers) {
    const int i = part;
    const std::string p = "layers." + std::to_string(i) + ".";
    out.push_back({p + "attn_norm.weight", {h}});
    out.push_back({p + "attn.wq", {h, qd}});
    out.push_back({p + "attn.wk", {h, kvd}});
    out.push_back({p + "attn.wv", {h, kvd}});
    out.push_back({p + "attn.wo", {qd, h}});
    out.push_back({p + "mlp_norm.weight", {h}});
    if (cfg.is_moe_layer(i)) {
      out.push_back({p + "moe.router", {h, cfg.moe->experts}});
      for (int e = 0; e < cfg.moe->experts; ++e) {
        const std::string ep = p + "moe.experts." + std::to_string(e) + ".";
        if (cfg.gated_mlp()) out.push_back({ep + "w_gate", {h, f}});
        out.push_back({ep + "w_up", {h, f}});
        out.push_back({ep + "w_down", {f, h}});
      }
    } else {
      if (cfg.gated_mlp()) out.push_back({p + "mlp.w_gate", {h, f}});
      out.push_back({p + "mlp.w_up", {h, f}});
      out.push_back({p + "mlp.w_down", {f, h}});
    }
  } else {
    out.push_back({"final_norm.weight", {h}});
    if (!cfg.tie_embeddings) out.push_back({"lm_head.weight", {h, v}});
  }
  return out;
}

std::vector<std::pair<std::string, Shape>> param_shapes(const ModelConfig& cfg) {
  std::vector<std::pair<std::string, Shape>> out;
  for (int part = -1; part <= cfg.layers; ++part)
    for (auto& e : part_param_shapes(cfg, part)) out.push_back(std::move(e));
  return out;
}

namespace {
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace

double init_value(const ModelConfig& cfg, uint64_t seed, std::string_view name, int64_t index) {
  if (ends_with(name, "norm.weight")) return 1.0;
  double std = 0.02;
  if (ends_with(name, ".attn.wo") || ends_with(name, ".w_down")) std /= std::sqrt(2.0 * cfg.layers);
  return std * RngStream::of(seed, name).normal(static_cast<uint64_t>(index));
}

template <class T>
void init_param_slice(const ModelConfig& cfg, uint64_t seed, std::string_view name, int64_t begin,
                      std::span<T> out) {
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<T>(init_value(cfg, seed, name, begin + static_cast<int64_t>(i)));
}

template <class T>
ParamMap<T> init_params(const ModelConfig& cfg, uint64_t seed) {
  cfg.validate();
  ParamMap<T> params;
  for (auto& [name, shape] : param_shapes(cfg)) {
    Tensor<T>& t = params.add(name, shape);
    init_param_slice<T>(cfg, seed, name, 0, t.span());
  }
  return params;
}

void LossParts::merge(const LossParts& other) {
  loss_sum += other.loss_sum;
  tokens += other.tokens;
  aux_sum += other.aux_sum;
  sequences += other.sequences;
  merge_loads(moe_load, other.moe_load);
  per_sequence.insert(per_sequence.end(), other.per_sequence.begin(), other.per_sequence.end());
}

double LossParts::loss() const {
  const double aux = sequences > 0 ? aux_sum / static_cast<double>(sequences) : 0.0;
  if (testing::mutated(testing::Mutation::kMeanOfSequenceMeans)) {
    double sum = 0.0;
    for (const auto& s : per_sequence)
      if (s.tokens > 0) sum += s.loss_sum / static_cast<double>(s.tokens);
    return (per_sequence.empty() ? 0.0 : sum / static_cast<double>(per_sequence.size())) + aux;
  }
  return (tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0) + aux;
}

namespace {

template <class T>
SequenceLoss sequence_forward_backward(const ModelConfig& cfg, const ParamMap<T>& params,
                                       const Sequence& seq, const StepContext& ctx,
                                       ParamMap<T>* grads, Tensor<T>* tied_head) {
  check_sequence(seq);
  SequenceLoss out;
  Tensor<T> x = embed_forward(params, seq);
  std::vector<BlockCache<T>> caches(static_cast<size_t>(cfg.layers));
  for (int i = 0; i < cfg.layers; ++i) {
    BlockCache<T>& c = caches[static_cast<size_t>(i)];
    x = block_forward(cfg, params, i, seq, ctx, x, c, &out);
    keep_for_backward(c, ctx.recompute);
  }
  HeadCache<T> head;
  head_forward(cfg, params, seq, x, head, &out);
  if (!grads) return out;

  Tensor<T> dx = head_backward(cfg, params, seq, ctx, head, *grads, tied_head);
  for (int i = cfg.layers - 1; i >= 0; --i) {
    BlockCache<T>& c = caches[static_cast<size_t>(i)];
    if (ctx.recompute == Recompute::kFull) {
      BlockCache<T> full;
      block_forward(cfg, params, i, seq, ctx, c.x_in, full, nullptr);
      dx = block_backward(cfg, params, i, seq, ctx, full, dx, *grads);
    } else {
      dx = block_backward(cfg, params, i, seq, ctx, c, dx, *grads);
    }
    c = BlockCache<T>{};
  }
  embed_backward(dx, seq, *grads);
  return out;
}

}  // namespace

template <class T>
LossParts forward_backward(const ModelConfig& cfg, const ParamMap<T>& params,
                           std::span<const Sequence> sequences, const StepContext& ctx,
                           std::type_identity_t<ParamMap<T>>* grads,
                           std::type_identity_t<Tensor<T>>* tied_head) {
  LossParts parts;
  for (const Sequence& seq : sequences) {
    SequenceLoss sl = sequence_forward_backward(cfg, params, seq, ctx, grads, tied_head);
    parts.loss_sum += sl.loss_sum;
    parts.tokens += sl.tokens;
    parts.aux_sum += sl.aux;
    parts.sequences += 1;
    merge_loads(parts.moe_load, sl.moe_load);
    parts.per_sequence.push_back(std::move(sl));
  }
  return parts;
}

template ParamMap<double> init_params(const ModelConfig&, uint64_t);
template ParamMap<float> init_params(const ModelConfig&, uint64_t);
template void init_param_slice(const ModelConfig&, uint64_t, std::string_view, int64_t,
                               std::span<double>);
template void init_param_slice(const ModelConfig&, uint64_t, std::string_view, int64_t,
                               std::span<float>);
template LossParts forward_backward(const ModelConfig&, const ParamMap<double>&,
                                    std::span<const Sequence>, const StepContext&,
                                    ParamMap<double>*, Tensor<double>*);
template LossParts forward_backward(const ModelConfig&, const ParamMap<float>&,
                                    std::span<const Sequence>, const StepContext&, ParamMap<float>*,
                                    Tensor<float>*);

}  // namespace shardcheck::ref
