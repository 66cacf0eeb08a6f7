// Unit-by-unit forward/backward over a microbatch: the composition of model.cpp, reordered so each
// unit's parameters are needed in one contiguous stretch (forward: embed, blocks, head with its
// backward; backward: blocks in reverse, embed lookup, which needs no parameters), with the
// activations it holds reported to the tracker as they are created and dropped.
#include "parallel/layerwise.hpp"

#include <utility>

#include "parallel/flops.hpp"
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

std::string unit_label(const ref::ModelConfig& cfg, int unit) {
  if (unit == 0) return "embed";
  if (unit == cfg.layers + 1) return "head";
  return "layers." + std::to_string(unit - 1);
}

template <class T>
std::size_t cache_elems(const ref::BlockCache<T>& c) {
  const auto n = [](const ref::Tensor<T>& t) { return static_cast<std::size_t>(t.numel()); };
  std::size_t e = n(c.x_in) + c.rstd1.size() + n(c.a) + n(c.q) + n(c.k) + n(c.v) + n(c.probs) +
                  n(c.o) + n(c.x_mid) + c.rstd2.size() + n(c.b) + n(c.mlp.up) + n(c.mlp.act);
  e += n(c.moe.probs) + c.moe.gate.size();
  for (const auto& t : c.moe.in) e += n(t);
  for (const auto& t : c.moe.out) e += n(t);
  for (const auto& m : c.moe.mlp) e += n(m.up) + n(m.act);
  return e;
}

namespace {

template <class T>
std::size_t head_elems(const ref::HeadCache<T>& h) {
  return static_cast<std::size_t>(h.x.numel() + h.y.numel() + h.logits.numel()) + h.rstd.size();
}

// Activation bookkeeping: every hold is matched by a drop before the microbatch ends.
template <class T>
class Activations {
 public:
  explicit Activations(const UnitHooks<T>& h) : h_(h) {}
  ~Activations() {
    if (h_.memory != nullptr && held_ > 0)
      h_.memory->release(comm::MemCategory::activations, held_);
  }
  Activations(const Activations&) = delete;
  Activations& operator=(const Activations&) = delete;
  void hold(std::size_t elems) {
    if (h_.memory == nullptr) return;
    h_.memory->allocate(comm::MemCategory::activations, elems * h_.activation_bytes);
    held_ += elems * h_.activation_bytes;
  }
  void drop(std::size_t elems) {
    if (h_.memory == nullptr) return;
    h_.memory->release(comm::MemCategory::activations, elems * h_.activation_bytes);
    held_ -= elems * h_.activation_bytes;
  }
  void phase(const ref::ModelConfig& cfg, const char* what, int unit) {
    if (h_.memory != nullptr)
      h_.memory->set_phase(h_.phase_prefix + " " + what + " " + unit_label(cfg, unit));
  }
  void compute(const ref::ModelConfig& cfg, const char* what, int unit, double flops) {
    if (!h_.compute) return;
    const std::string name = std::string(what) + " " + unit_label(cfg, unit);
    h_.compute({name, flops, 0.0});
  }

 private:
  const UnitHooks<T>& h_;
  std::size_t held_ = 0;
};

}  // namespace

template <class T>
ref::LossParts layerwise_forward_backward(const ref::ModelConfig& cfg, const UnitHooks<T>& hooks,
                                          std::span<const ref::Sequence> seqs,
                                          const ref::StepContext& ctx) {
  const std::size_t n = seqs.size();
  const auto layers = static_cast<std::size_t>(cfg.layers);
  const int head = cfg.layers + 1;
  Activations<T> act(hooks);
  double tokens = 0.0;
  for (const ref::Sequence& s : seqs) tokens += static_cast<double>(s.tokens.size());
  // Per sequence: attention's s^2 term is per sequence, not per microbatch.
  const auto block_flops = [&](int layer) {
    double f = 0.0;
    for (const ref::Sequence& q : seqs)
      f += block_forward_flops(cfg, layer, static_cast<double>(q.tokens.size()));
    return f;
  };
  const auto row = static_cast<std::size_t>(cfg.hidden);

  std::vector<ref::Tensor<T>> x(n);
  std::vector<ref::SequenceLoss> loss(n);
  std::vector<std::vector<ref::BlockCache<T>>> caches(n, std::vector<ref::BlockCache<T>>(layers));
  {
    act.phase(cfg, "forward", 0);
    const ref::ParamMap<T>& p = hooks.acquire(0);
    for (std::size_t s = 0; s < n; ++s) {
      ref::check_sequence(seqs[s]);
      x[s] = ref::embed_forward(p, seqs[s]);
      act.hold(seqs[s].tokens.size() * row);
    }
    hooks.release(0);
  }
  for (std::size_t i = 0; i < layers; ++i) {
    const int u = static_cast<int>(i) + 1;
    act.phase(cfg, "forward", u);
    const ref::ParamMap<T>& p = hooks.acquire(u);
    for (std::size_t s = 0; s < n; ++s) {
      ref::BlockCache<T>& c = caches[s][i];
      x[s] = ref::block_forward(cfg, p, static_cast<int>(i), seqs[s], ctx, x[s], c, &loss[s]);
      const std::size_t full = cache_elems(c);
      act.hold(full);
      ref::keep_for_backward(c, ctx.recompute);
      act.drop(full - cache_elems(c));
    }
    act.compute(cfg, "forward", u, block_flops(static_cast<int>(i)));
    hooks.release(u);
  }
  std::vector<ref::Tensor<T>> dx(n);
  {
    act.phase(cfg, "forward", head);
    const ref::ParamMap<T>& ph = hooks.acquire(head);
    ref::ParamMap<T>& gh = hooks.grads(head);
    // Tied: the head reads and writes the embedding too. Its weight is copied into the head's map
    // (a view on a device), its gradient moved in and back (no extra rounding).
    ref::ParamMap<T> tied_params;
    ref::ParamMap<T> tied_grads;
    if (cfg.tie_embeddings) {
      const ref::ParamMap<T>& pe = hooks.acquire(0);
      ref::ParamMap<T>& ge = hooks.grads(0);
      for (const auto& e : ph) tied_params.add(e.name, e.value.shape()) = e.value;
      tied_params.add("embed.weight", pe["embed.weight"].shape()) = pe["embed.weight"];
      for (auto& e : gh) tied_grads.add(e.name, {}) = std::move(e.value);
      tied_grads.add("embed.weight", {}) = std::move(ge["embed.weight"]);
    }
    const ref::ParamMap<T>& p = cfg.tie_embeddings ? tied_params : ph;
    ref::ParamMap<T>& g = cfg.tie_embeddings ? tied_grads : gh;
    for (std::size_t s = 0; s < n; ++s) {
      ref::HeadCache<T> hc;
      ref::head_forward(cfg, p, seqs[s], x[s], hc, &loss[s]);
      act.hold(head_elems(hc));
      x[s] = ref::Tensor<T>{};
      act.drop(seqs[s].tokens.size() * row);
      dx[s] = ref::head_backward(cfg, p, seqs[s], ctx, hc, g);
      act.hold(seqs[s].tokens.size() * row);
      act.drop(head_elems(hc));
    }
    if (cfg.tie_embeddings) {
      for (auto& e : gh) e.value = std::move(tied_grads[e.name]);
      hooks.grads(0)["embed.weight"] = std::move(tied_grads["embed.weight"]);
    }
    const double f = head_forward_flops(cfg, tokens);
    act.compute(cfg, "forward", head, f);
    act.compute(cfg, "backward", head, backward_flops(f));
    hooks.release(head);
    if (cfg.tie_embeddings) hooks.release(0);
    hooks.grads_ready(head);
  }
  for (std::size_t i = layers; i-- > 0;) {
    const int u = static_cast<int>(i) + 1;
    act.phase(cfg, "backward", u);
    const ref::ParamMap<T>& p = hooks.acquire(u);
    ref::ParamMap<T>& g = hooks.grads(u);
    for (std::size_t s = 0; s < n; ++s) {
      ref::BlockCache<T>& c = caches[s][i];
      const std::size_t kept = cache_elems(c);
      if (ctx.recompute == ref::Recompute::kFull) {
        ref::BlockCache<T> full;
        ref::block_forward(cfg, p, static_cast<int>(i), seqs[s], ctx, c.x_in, full, nullptr);
        act.hold(cache_elems(full));
        dx[s] = ref::block_backward(cfg, p, static_cast<int>(i), seqs[s], ctx, full, dx[s], g);
        act.drop(cache_elems(full));
      } else {
        if (ctx.recompute == ref::Recompute::kSelective)  // block_backward recomputes the probs
          act.hold(static_cast<std::size_t>(cfg.heads) * seqs[s].tokens.size() *
                   seqs[s].tokens.size());
        dx[s] = ref::block_backward(cfg, p, static_cast<int>(i), seqs[s], ctx, c, dx[s], g);
        if (ctx.recompute == ref::Recompute::kSelective)
          act.drop(static_cast<std::size_t>(cfg.heads) * seqs[s].tokens.size() *
                   seqs[s].tokens.size());
      }
      c = ref::BlockCache<T>{};
      act.drop(kept);
    }
    const double f = block_flops(static_cast<int>(i));
    if (ctx.recompute == ref::Recompute::kFull) act.compute(cfg, "recompute", u, f);
    if (ctx.recompute == ref::Recompute::kSelective) {
      double core = 0.0;
      for (const ref::Sequence& q : seqs)
        core += attention_core_flops(cfg, static_cast<double>(q.tokens.size()));
      act.compute(cfg, "recompute", u, core);
    }
    act.compute(cfg, "backward", u, backward_flops(f));
    hooks.release(u);
    hooks.grads_ready(u);
  }
  act.phase(cfg, "backward", 0);
  ref::ParamMap<T>& ge = hooks.grads(0);
  ref::LossParts parts;
  for (std::size_t s = 0; s < n; ++s) {
    ref::embed_backward(dx[s], seqs[s], ge);
    dx[s] = ref::Tensor<T>{};
    act.drop(seqs[s].tokens.size() * row);
    parts.loss_sum += loss[s].loss_sum;
    parts.tokens += loss[s].tokens;
    parts.aux_sum += loss[s].aux;
    parts.sequences += 1;
    parts.per_sequence.push_back(std::move(loss[s]));
  }
  hooks.grads_ready(0);
  return parts;
}

#define SHARDCHECK_LAYERWISE(T)                                                                    \
  template std::size_t cache_elems(const ref::BlockCache<T>&);                                     \
  template ref::LossParts layerwise_forward_backward(const ref::ModelConfig&, const UnitHooks<T>&, \
                                                     std::span<const ref::Sequence>,               \
                                                     const ref::StepContext&);
SHARDCHECK_LAYERWISE(double)
SHARDCHECK_LAYERWISE(float)
#undef SHARDCHECK_LAYERWISE

}  // namespace shardcheck::parallel
