// Wrap units, acquire order and the residency plan of fsdp.hpp. The plan is simulated in
// peak_held_bytes() exactly as the engine executes it, so the ledger's all-gather peak and the
// tracked one agree by construction of the same rules, not by sharing a counter.
#include "parallel/fsdp.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "parallel/layerwise.hpp"

namespace shardcheck::parallel {

std::string_view name_of(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::full_shard:
      return "full_shard";
    case ShardingStrategy::shard_grad_op:
      return "shard_grad_op";
    case ShardingStrategy::no_shard:
      return "no_shard";
    case ShardingStrategy::hybrid_shard:
      return "hybrid_shard";
  }
  return "?";
}

std::string_view name_of(WrapPolicy w) {
  switch (w) {
    case WrapPolicy::block:
      return "block";
    case WrapPolicy::layer_group:
      return "layer_group";
    case WrapPolicy::whole_model:
      return "whole_model";
  }
  return "?";
}

std::vector<std::vector<int>> wrap_units(const ref::ModelConfig& cfg, WrapPolicy wrap,
                                         int blocks_per_unit) {
  const int head = cfg.layers + 1;
  std::vector<std::vector<int>> out;
  if (wrap == WrapPolicy::whole_model) {
    out.emplace_back();
    for (int u = 0; u <= head; ++u) out.back().push_back(u);
    return out;
  }
  const int k = wrap == WrapPolicy::block ? 1 : blocks_per_unit;
  if (k < 1) throw std::invalid_argument("fsdp.blocks_per_unit must be >= 1");
  out.push_back({0});
  for (int b = 1; b <= cfg.layers; b += k) {
    out.emplace_back();
    for (int u = b; u < std::min(b + k, head); ++u) out.back().push_back(u);
  }
  out.push_back({head});
  return out;
}

std::vector<int> acquire_order(const ref::ModelConfig& cfg) {
  std::vector<int> out;
  for (int u = 0; u <= cfg.layers; ++u) out.push_back(u);
  out.push_back(cfg.layers + 1);
  if (cfg.tie_embeddings) out.push_back(0);
  for (int u = cfg.layers; u >= 1; --u) out.push_back(u);
  return out;
}

ResidencyPlan::ResidencyPlan(std::vector<int> uses, bool keep_after_forward, int prefetch,
                             int forward_uses, int paired_use)
    : uses_(std::move(uses)),
      prefetch_(prefetch),
      paired_(paired_use),
      free_after_(uses_.size(), false) {
  if (prefetch < 0) throw std::invalid_argument("fsdp.prefetch must be >= 0");
  for (std::size_t i = 0; i < uses_.size(); ++i) {
    std::size_t next = i + 1;
    while (next < uses_.size() && uses_[next] != uses_[i]) ++next;
    if (next == uses_.size()) {
      free_after_[i] = true;  // last use in the microbatch
    } else if (next == i + 1) {
      free_after_[i] = false;  // used again right away (same unit, or the tied head)
    } else {
      // Used again later (its backward): reshard unless told to keep forward's gather. The
      // head's uses (forward and backward together) count as forward here.
      const bool in_forward = static_cast<int>(i) < forward_uses;
      free_after_[i] = !(keep_after_forward && in_forward);
    }
  }
}

std::vector<int> ResidencyPlan::prefetch_after(std::size_t i) const {
  std::vector<int> out;
  for (std::size_t j = i + 1; j < uses_.size() && static_cast<int>(out.size()) < prefetch_; ++j) {
    const int u = uses_[j];
    if (u != uses_[i] && std::find(out.begin(), out.end(), u) == out.end()) out.push_back(u);
  }
  return out;
}

std::size_t ResidencyPlan::peak_held_bytes(const std::vector<std::size_t>& unit_bytes) const {
  std::set<int> held;
  std::size_t now = 0, peak = 0;
  const auto hold = [&](int u) {
    if (held.insert(u).second) now += unit_bytes[static_cast<std::size_t>(u)];
    peak = std::max(peak, now);
  };
  const auto release = [&](std::size_t i) {
    if (free_after_[i] && held.erase(uses_[i]) > 0)
      now -= unit_bytes[static_cast<std::size_t>(uses_[i])];
  };
  // Each use is released before the next is acquired, except the tied head's pair, acquired
  // together: the same interleaving as layerwise_forward_backward.
  for (std::size_t i = 0; i < uses_.size(); ++i) {
    hold(uses_[i]);
    for (int u : prefetch_after(i)) hold(u);
    if (static_cast<int>(i) == paired_ && i + 1 < uses_.size()) {
      hold(uses_[i + 1]);
      for (int u : prefetch_after(i + 1)) hold(u);
      release(i);
      release(++i);
    } else {
      release(i);
    }
  }
  return peak;
}

ResidencyPlan residency_plan(const ref::ModelConfig& cfg, const FsdpOptions& o) {
  const auto units = wrap_units(cfg, o.wrap, o.blocks_per_unit);
  std::vector<int> wrap_of(static_cast<std::size_t>(unit_count(cfg)), 0);
  for (std::size_t w = 0; w < units.size(); ++w)
    for (int u : units[w]) wrap_of[static_cast<std::size_t>(u)] = static_cast<int>(w);
  std::vector<int> uses;
  for (int u : acquire_order(cfg)) uses.push_back(wrap_of[static_cast<std::size_t>(u)]);
  const bool keep = o.sharding == ShardingStrategy::shard_grad_op || !o.reshard_after_forward;
  // Forward uses: embedding, blocks, and the head's one or two uses.
  const int forward_uses = cfg.layers + 2 + (cfg.tie_embeddings ? 1 : 0);
  return ResidencyPlan(std::move(uses), keep, o.prefetch, forward_uses,
                       cfg.tie_embeddings ? cfg.layers + 1 : -1);
}

}  // namespace shardcheck::parallel
