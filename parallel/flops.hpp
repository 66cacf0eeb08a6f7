// FLOP counts of the reference model's pieces, for comm::Communicator::compute() (the simulator's
// virtual clock) and for MFU. A matmul [m,k]·[k,n] is 2·m·n·k; elementwise ops, norms, softmax and
// RoPE are not counted (as in the usual 6·N·T estimates). Attention counts the full s×s score and
// probability·V products per query head (masked entries included, as dense kernels compute them).
// Backward is 2× forward (input and weight gradients). Not a profiler: shapes only.
#pragma once

#include "reference/config.hpp"

namespace shardcheck::parallel {

// One block's forward over one sequence of s tokens:
//   attention projections 2·s·h·(a·d + 2·kv·d) + output 2·s·(a·d)·h + scores and p·V 4·a·s²·d;
//   dense MLP 2·m·s·h·f with m = cfg.mlp_matrices() (2 GELU, 3 SwiGLU); MoE router 2·s·h·E +
//   experts 2·m·(s·k)·h·f (every top-k assignment, before capacity drops: an upper bound when
//   assignments are dropped).
double block_forward_flops(const ref::ModelConfig& cfg, int layer, double s);
// The attention core of one block over one sequence (scores, softmax, probabilities·V): 4·a·s²·d,
// what selective recomputation repeats in the backward.
double attention_core_flops(const ref::ModelConfig& cfg, double s);
// Final norm and LM head: 2·s·h·V. The embedding lookup is 0.
double head_forward_flops(const ref::ModelConfig& cfg, double s);
inline double backward_flops(double forward) {
  return 2.0 * forward;
}
// Forward of the whole model over s tokens (blocks + head).
double model_forward_flops(const ref::ModelConfig& cfg, double s);
// AdamW over n elements: about 12 FLOPs per element (decay, two moments, bias correction, sqrt,
// divide, update); counted so the optimizer shows on the timeline.
inline double adamw_flops(double n) {
  return 12.0 * n;
}

}  // namespace shardcheck::parallel
