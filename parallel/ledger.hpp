// The analytic memory ledger: for a model, a precision recipe (bytes per parameter element, stated
// field by field), a data-parallel strategy and a DP size, the bytes each rank holds by category,
// plus activation and all-gather peak estimates. Pure functions of shapes, so they run for a
// 70B-class configuration; on the small models they equal what the engine reports to its tracker.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "parallel/data_parallel.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel {

// Bytes per element of each piece of model state.
struct Recipe {
  std::string name;
  std::size_t param = 8;     // working parameters (what forward reads and all_gather moves)
  std::size_t grad = 8;      // gradient accumulator across microbatches, and reduction dtype
  std::size_t master = 0;    // separate master weights (0: the working parameters are the master)
  std::size_t moments = 16;  // AdamW exp_avg + exp_avg_sq together
  std::size_t microbatch_grad = 8;  // one microbatch's gradient as backward produces it
  std::size_t activation = 8;       // activations held for backward
  std::size_t optimizer() const { return master + moments; }
};

// f64: 8/8/0/16; f32: 4/4/0/8; bf16 (this project's recipe, Megatron's: bf16 working weights and
// microbatch gradients, f32 gradient accumulation and reduction, f32 master and moments):
// param 2, grad 4, master 4, moments 8 = 18 bytes per parameter; activations f32 (the reference
// does not round them).
Recipe recipe_of(ref::Precision p);
// The ZeRO paper's mixed-precision Adam: param 2, grad 2, optimizer K = 12 (master 4 + moments 8).
Recipe zero_paper_recipe();

// Per-rank bytes. Model state is what a rank holds while its optimizer runs: resident parameters,
// the step's gradient accumulator, optimizer state. Padding (< shard count elements per flat
// buffer) is included, as the engine holds it.
struct LedgerRow {
  std::size_t params = 0;
  std::size_t grads = 0;
  std::size_t optimizer = 0;
  std::size_t model_state() const { return params + grads + optimizer; }
  std::size_t grads_at_peak() const { return std::max(grads, grad_peak); }
  std::size_t model_state_at_peak() const { return params + grads_at_peak() + optimizer; }
  // What the rank needs at once, at most: model state with the gradients at their peak, plus the
  // gathered units and the activations.
  std::size_t total() const { return model_state_at_peak() + gather_peak + activation_peak; }
  std::size_t gather_peak = 0;  // unsharded parameters held at once (ZeRO-3/FSDP), bytes
  // Gradient bytes at their peak, during the backward (mesh ledger: the step's accumulator, in
  // full until the step's reduction except ZeRO-3's shards of the buffers reduced every
  // microbatch, plus the microbatch gradients the recipe keeps apart). 0: grads.
  std::size_t grad_peak = 0;
  std::size_t activation_peak = 0;  // activations of one microbatch at their peak (estimate)
  std::size_t padding_elems = 0;
};

struct LedgerInput {
  ref::ModelConfig model;
  Recipe recipe;
  DataParallelOptions options;  // strategy, fsdp
  int dp = 1;
  int micro_batch = 1;  // sequences per microbatch (activation estimate)
  ref::Recompute recompute = ref::Recompute::kNone;
};

LedgerRow ledger(const LedgerInput& in);

// The ZeRO paper's closed forms (bytes per rank) for psi parameters, K optimizer bytes per
// parameter, DP size n, with 2-byte params and grads: DDP (2+2+K)psi; ZeRO-1 4psi + K psi/n;
// ZeRO-2 2psi + (2+K)psi/n; ZeRO-3 (2+2+K)psi/n.
double zero_paper_bytes(Strategy s, double psi, double k, int n);

// Activation elements one sequence of s tokens keeps for one block's backward (BlockCache) plus
// its running hidden state; dense layers exact, MoE layers an upper bound (every top-k assignment
// kept, capacity permitting).
double block_activation_elems(const ref::ModelConfig& cfg, int layer, double s);

}  // namespace shardcheck::parallel
