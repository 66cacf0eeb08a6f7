// Ledger arithmetic (ledger.hpp). Model state follows the engine's buffers rule by rule (same
// FlatLayouts, wrap units and residency plan), not by running it; activations follow what
// layerwise_forward_backward holds at its peak (the head of the last microbatch sequence).
#include "parallel/ledger.hpp"

#include <algorithm>
#include <cmath>

#include "parallel/flat.hpp"
#include "parallel/layerwise.hpp"
#include "reference/model.hpp"

namespace shardcheck::parallel {

Recipe recipe_of(ref::Precision p) {
  switch (p) {
    case ref::Precision::kF64:
      return {"f64", 8, 8, 0, 16, 8, 8};
    case ref::Precision::kF32:
      return {"f32", 4, 4, 0, 8, 4, 4};
    case ref::Precision::kBf16:
      return {"bf16", 2, 4, 4, 8, 2, 4};
  }
  return {};
}

Recipe zero_paper_recipe() {
  return {"zero-paper mixed-precision adam", 2, 2, 4, 8, 2, 2};
}

double zero_paper_bytes(Strategy s, double psi, double k, int n) {
  const double d = n;
  switch (s) {
    case Strategy::ddp:
      return (2 + 2 + k) * psi;
    case Strategy::zero1:
      return 4 * psi + k * psi / d;
    case Strategy::zero2:
      return 2 * psi + (2 + k) * psi / d;
    case Strategy::zero3:
    case Strategy::fsdp:
      return (4 + k) * psi / d;
  }
  return 0.0;
}

double block_activation_elems(const ref::ModelConfig& cfg, int layer, double s) {
  const double h = cfg.hidden, a = cfg.heads, kv = cfg.kv_heads, d = cfg.head_dim(), f = cfg.ffn;
  // x_in, a (normed), x_mid, b (normed), rstd1, rstd2, q, k, v, o, probs [a, s, s].
  double e = 4 * s * h + 2 * s + 2 * s * a * d + 2 * s * kv * d + a * s * s;
  const double mlp_kept = cfg.gated_mlp() ? 3 : 2;  // up, act; gate (SwiGLU)
  if (cfg.is_moe_layer(layer)) {
    const double experts = cfg.moe->experts, k = cfg.moe->top_k;
    const double capacity = std::ceil(cfg.moe->capacity_factor * s * k / experts - 1e-9);
    const double kept = std::min(s * k, experts * capacity);
    e += s * experts + s * k + kept * (2 * h + mlp_kept * f);  // probs, gates, in/out, MLP
  } else {
    e += mlp_kept * s * f;
  }
  return e;
}

namespace {

std::vector<std::pair<std::string, ref::Shape>> shapes_of(const ref::ModelConfig& cfg,
                                                          const std::vector<int>& units) {
  std::vector<std::pair<std::string, ref::Shape>> out;
  for (int u : units)
    for (auto& e : unit_shapes(cfg, u)) out.push_back(std::move(e));
  return out;
}

std::size_t activation_peak(const LedgerInput& in) {
  const ref::ModelConfig& c = in.model;
  const double s = c.seq_len, n = in.micro_batch, h = c.hidden;
  const double head = 2 * s * h + s + s * c.vocab;  // x, y, rstd, logits of one sequence
  double elems = 0;
  if (in.recompute == ref::Recompute::kFull) {
    double widest = head;
    for (int i = 0; i < c.layers; ++i) widest = std::max(widest, block_activation_elems(c, i, s));
    elems = n * (c.layers + 1) * s * h + widest;
  } else {
    // Selective: no block keeps its probabilities [a, s, s]; one sequence's are recomputed at a
    // time in the backward, after the head's cache is gone.
    const double probs = c.heads * s * s;
    const bool selective = in.recompute == ref::Recompute::kSelective;
    double caches = 0;
    for (int i = 0; i < c.layers; ++i)
      caches += block_activation_elems(c, i, s) - (selective ? probs : 0.0);
    elems = n * (caches + s * h) + (selective ? std::max(head, probs) : head);
  }
  return static_cast<std::size_t>(elems) * in.recipe.activation;
}

}  // namespace

LedgerRow ledger(const LedgerInput& in) {
  const Recipe& r = in.recipe;
  LedgerRow row;
  const Strategy st = in.options.strategy;
  row.activation_peak = activation_peak(in);
  if (st == Strategy::ddp || st == Strategy::zero1 || st == Strategy::zero2) {
    const FlatLayout l(ref::param_shapes(in.model), in.dp);
    const std::size_t owned = st == Strategy::ddp ? l.numel() : l.shard_numel();
    row.params = l.padded_numel() * r.param;
    row.grads = (st == Strategy::zero2 ? l.shard_numel() : l.padded_numel()) * r.grad;
    row.optimizer = owned * r.optimizer();
    row.padding_elems = l.padding();
    return row;
  }
  FsdpOptions f = in.options.fsdp;
  if (st == Strategy::zero3)
    f = {.sharding = ShardingStrategy::full_shard,
         .wrap = WrapPolicy::block,
         .reshard_after_forward = true,
         .prefetch = 0};
  const bool no_shard = f.sharding == ShardingStrategy::no_shard;
  const int shards = no_shard                                       ? 1
                     : f.sharding == ShardingStrategy::hybrid_shard ? f.shard_group_size
                                                                    : in.dp;
  std::vector<std::size_t> unsharded;
  for (const auto& w : wrap_units(in.model, f.wrap, f.blocks_per_unit)) {
    const FlatLayout l(shapes_of(in.model, w), shards);
    const std::size_t held = no_shard ? l.numel() : l.shard_numel();
    row.params += (no_shard ? l.padded_numel() : held) * r.param;
    row.grads += (no_shard ? l.padded_numel() : held) * r.grad;
    row.optimizer += held * r.optimizer();
    row.padding_elems += l.padding();
    unsharded.push_back(l.padded_numel() * r.param);
  }
  if (!no_shard) row.gather_peak = residency_plan(in.model, f).peak_held_bytes(unsharded);
  return row;
}

}  // namespace shardcheck::parallel
