// Unit-by-unit forward/backward over a microbatch: the composition of model.cpp, reordered so each
// unit's parameters are needed in one contiguous stretch (forward: embed, blocks, head; backward:
// head, blocks in reverse, embed lookup, which needs no parameters).
#include "parallel/layerwise.hpp"

#include <utility>

#include "reference/blocks.hpp"

namespace shardcheck::parallel {

int unit_count(const ref::ModelConfig& cfg) {
  return cfg.layers + 2;
}

int unit_of(const ref::ModelConfig& cfg, std::string_view name) {
  if (name == "embed.weight") return 0;
  constexpr std::string_view kLayers = "layers.";
  if (name.starts_with(kLayers)) {
    const std::string_view rest = name.substr(kLayers.size());
    return 1 + std::stoi(std::string(rest.substr(0, rest.find('.'))));
  }
  return cfg.layers + 1;  // final_norm.weight, lm_head.weight
}

std::vector<std::pair<std::string, ref::Shape>> unit_shapes(const ref::ModelConfig& cfg, int unit) {
  std::vector<std::pair<std::string, ref::Shape>> out;
  for (auto& e : ref::param_shapes(cfg))
    if (unit_of(cfg, e.first) == unit) out.push_back(std::move(e));
  return out;
}

template <class T>
ref::LossParts layerwise_forward_backward(const ref::ModelConfig& cfg, const UnitFetch<T>& fetch,
                                          std::span<const ref::Sequence> seqs,
                                          const ref::StepContext& ctx, ref::ParamMap<T>& grads) {
  const std::size_t n = seqs.size();
  const auto layers = static_cast<std::size_t>(cfg.layers);
  std::vector<ref::Tensor<T>> x(n);
  std::vector<ref::SequenceLoss> loss(n);
  std::vector<std::vector<ref::BlockCache<T>>> caches(n, std::vector<ref::BlockCache<T>>(layers));
  {
    const ref::ParamMap<T> p = fetch(0);
    for (std::size_t s = 0; s < n; ++s) {
      ref::check_sequence(seqs[s]);
      x[s] = ref::embed_forward(p, seqs[s]);
    }
  }
  for (std::size_t i = 0; i < layers; ++i) {
    const ref::ParamMap<T> p = fetch(static_cast<int>(i) + 1);
    for (std::size_t s = 0; s < n; ++s) {
      ref::BlockCache<T>& c = caches[s][i];
      x[s] = ref::block_forward(cfg, p, static_cast<int>(i), seqs[s], ctx, x[s], c, &loss[s]);
      if (ctx.activation_checkpointing) {
        ref::BlockCache<T> input_only;
        input_only.x_in = std::move(c.x_in);
        c = std::move(input_only);
      }
    }
  }
  std::vector<ref::Tensor<T>> dx(n);
  {
    ref::ParamMap<T> p = fetch(cfg.layers + 1);
    if (cfg.tie_embeddings) {
      ref::ParamMap<T> e = fetch(0);
      ref::Tensor<T>& w = e["embed.weight"];
      p.add("embed.weight", w.shape()) = std::move(w);
    }
    for (std::size_t s = 0; s < n; ++s) {
      ref::HeadCache<T> head;
      ref::head_forward(cfg, p, seqs[s], x[s], head, &loss[s]);
      x[s] = ref::Tensor<T>{};
      dx[s] = ref::head_backward(cfg, p, seqs[s], ctx, head, grads);
    }
  }
  for (std::size_t i = layers; i-- > 0;) {
    const ref::ParamMap<T> p = fetch(static_cast<int>(i) + 1);
    for (std::size_t s = 0; s < n; ++s) {
      ref::BlockCache<T>& c = caches[s][i];
      if (ctx.activation_checkpointing) {
        ref::BlockCache<T> full;
        ref::block_forward(cfg, p, static_cast<int>(i), seqs[s], ctx, c.x_in, full, nullptr);
        dx[s] = ref::block_backward(cfg, p, static_cast<int>(i), seqs[s], ctx, full, dx[s], grads);
      } else {
        dx[s] = ref::block_backward(cfg, p, static_cast<int>(i), seqs[s], ctx, c, dx[s], grads);
      }
      c = ref::BlockCache<T>{};
    }
  }
  ref::LossParts parts;
  for (std::size_t s = 0; s < n; ++s) {
    ref::embed_backward(dx[s], seqs[s], grads);
    parts.loss_sum += loss[s].loss_sum;
    parts.tokens += loss[s].tokens;
    parts.aux_sum += loss[s].aux;
    parts.sequences += 1;
    parts.per_sequence.push_back(std::move(loss[s]));
  }
  return parts;
}

template ref::LossParts layerwise_forward_backward(const ref::ModelConfig&,
                                                   const UnitFetch<double>&,
                                                   std::span<const ref::Sequence>,
                                                   const ref::StepContext&, ref::ParamMap<double>&);
template ref::LossParts layerwise_forward_backward(const ref::ModelConfig&, const UnitFetch<float>&,
                                                   std::span<const ref::Sequence>,
                                                   const ref::StepContext&, ref::ParamMap<float>&);

}  // namespace shardcheck::parallel
