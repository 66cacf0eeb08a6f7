// FLOP formulas of flops.hpp.
#include "parallel/flops.hpp"

namespace shardcheck::parallel {

double block_forward_flops(const ref::ModelConfig& cfg, int layer, double s) {
  const double h = cfg.hidden, a = cfg.heads, kv = cfg.kv_heads, d = cfg.head_dim(), f = cfg.ffn;
  double flops =
      2.0 * s * h * (a * d + 2.0 * kv * d) + 2.0 * s * a * d * h + attention_core_flops(cfg, s);
  const double mlp = 2.0 * cfg.mlp_matrices() * s * h * f;  // per token routed to one MLP
  if (cfg.is_moe_layer(layer)) {
    const double e = cfg.moe->experts, k = cfg.moe->top_k;
    flops += 2.0 * s * h * e + k * mlp;
  } else {
    flops += mlp;
  }
  return flops;
}

double attention_core_flops(const ref::ModelConfig& cfg, double s) {
  return 4.0 * cfg.heads * s * s * cfg.head_dim();
}

double head_forward_flops(const ref::ModelConfig& cfg, double s) {
  return 2.0 * s * cfg.hidden * cfg.vocab;
}

double model_forward_flops(const ref::ModelConfig& cfg, double s) {
  double f = head_forward_flops(cfg, s);
  for (int i = 0; i < cfg.layers; ++i) f += block_forward_flops(cfg, i, s);
  return f;
}

}  // namespace shardcheck::parallel
