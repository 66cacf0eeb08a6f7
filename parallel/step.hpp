// The parts of one optimizer step that every engine shares, written once: the loss denominators
// (reduced before any backward, so gradients are of the global loss, never a mean of rank means),
// the step context they give, the step record (loss, counts, norm, clip factor, LR), and the
// non-finite-gradient health check (grad hook, verdict agreed by every rank, skip/stop policy).
// The engine (mp/mesh_engine.cpp) applies them on every mesh.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/testing.hpp"
#include "reference/batch.hpp"
#include "reference/blocks.hpp"
#include "reference/config.hpp"
#include "reference/data.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::parallel {

// Data rank `rank` of `world`'s part of a global batch: the sampler's contiguous rank_slice, with
// Sequence::index kept global (it keys dropout). planted = kSameSamples plants a sampler bug here
// (every rank reads rank 0's samples).
ref::Batch rank_batch(const ref::Dataset& data, const std::vector<int64_t>& global_ids, int rank,
                      int world, testing::Mutation planted = testing::Mutation::kNone);

// What to do when some rank's local gradient holds a NaN or infinity.
enum class NonFinitePolicy : std::uint8_t { skip_step, stop };

struct GradHealthOptions {
  bool check = false;  // all_gather one i32 flag per rank after backward
  NonFinitePolicy policy = NonFinitePolicy::skip_step;
};

// Called on each rank for every parameter of every microbatch, as soon as that microbatch's local
// gradient of the parameter is complete and before it is reduced over any other rank (other
// gradients may already be in flight). grad: the writable local gradient (the engine's dtype:
// f64, f32; bf16 recipe: f32 before rounding); where an engine accumulates microbatches in place
// (the mesh engine in f64/f32) it holds the sum over microbatches 0..microbatch. step is 1-based,
// microbatch 0-based.
using GradHook =
    std::function<void(int step, int microbatch, const std::string& param, comm::Buffer grad)>;

// Thrown on every rank (same step, same verdict) by NonFinitePolicy::stop.
class NonFiniteGradientError : public std::runtime_error {
 public:
  NonFiniteGradientError(int step, std::vector<int> ranks);
  int step() const { return step_; }
  const std::vector<int>& ranks() const { return ranks_; }  // ranks with non-finite gradients

 private:
  int step_;
  std::vector<int> ranks_;
};

// The health verdict of the last step, the same on every rank.
struct StepHealth {
  bool skipped = false;              // no optimizer update was applied
  std::vector<int> nonfinite_ranks;  // ranks of the checked group whose local gradient had a
                                     // NaN or infinity (DP ranks; on a mesh, world ranks)
};

// The global loss denominators of a step: loss-mask tokens, sequences, non-padding tokens.
using LossCounts = std::array<int64_t, 3>;
LossCounts local_counts(const ref::Batch& local);

// A step's sums over the world: the squared gradient norm and the numerators (token loss sum,
// aux sum, dropped assignments).
using StepSums = std::array<double, 4>;
// The step's scalar collectives: the counts summed over the data-parallel ranks (before any
// backward), the sums over the world (after the gradient sums).
LossCounts global_counts(comm::Communicator& data, LossCounts local);
StepSums global_sums(comm::Communicator& world, StepSums local);

// The context the microbatches' backward runs with: gradients of the global loss (weights 1 / the
// global counts), dropout keyed by (seed, step).
ref::StepContext step_context(uint64_t seed, int step, const LossCounts& global,
                              const ref::TrainConfig& train);

// The global record from the global counts, the reduced numerators (token loss sum, aux sum) and
// the squared global gradient norm: loss = loss_sum / tokens + aux_sum / sequences, the clip factor
// (ref::clip_factor) and the LR of the step.
ref::StepRecord step_record(int step, const LossCounts& global, double loss_sum, double aux_sum,
                            double squared_norm, const ref::TrainConfig& train);

// Whether any element of v is a NaN or infinity.
template <class T>
bool any_nonfinite(std::span<const T> v) {
  for (const T x : v)
    if (!std::isfinite(x)) return true;
  return false;
}

// The health check's collective: every member of `group` learns which members flagged a
// non-finite gradient (one all_gather of an i32 per rank). skipped = some rank did.
StepHealth agree_health(comm::Communicator& group, bool nonfinite);

// The policy after the verdict: throws NonFiniteGradientError under stop when the step was skipped.
void enforce_health(const StepHealth& h, const GradHealthOptions& o, int step);

}  // namespace shardcheck::parallel
