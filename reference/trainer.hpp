// Trainer: the whole single-device training loop (microbatches, gradient accumulation, clipping,
// AdamW, schedule, precision recipe) behind one small API, with an observer for named tensors.
// It is what parity checks compare against; it does not load data or parse scenarios itself.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reference/batch.hpp"
#include "reference/config.hpp"
#include "reference/moe.hpp"
#include "reference/npy.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref {

struct StepRecord {
  int step = 0;           // 1-based
  double loss = 0.0;      // global loss: sum(token losses) / sum(mask) + mean(aux)
  double loss_sum = 0.0;  // numerator of the token term
  int64_t tokens = 0;     // its denominator (loss-mask count of the global batch)
  double aux = 0.0;       // mean aux loss over the global batch's sequences
  int64_t sequences = 0;
  int64_t non_padding_tokens = 0;  // tokens with doc_id >= 0 (for tokens/s and goodput)
  double grad_norm = 0.0;          // global L2 norm before clipping
  double clip_factor = 1.0;
  double lr = 0.0;
  int64_t moe_dropped = 0;  // MoE assignments dropped over capacity, all layers
};

// Receives named tensors (DESIGN.md "Tensor dumps" names): init/param/<p> once, batch/<k>/<field>
// for each microbatch of step 1, step<N>/loss, step<N>/grad/<p> (accumulated, before clipping) and
// step<N>/param/<p> (after the update). Parameters are the master copy (f64 or f32).
using TensorObserver = std::function<void(const std::string& name, const HostArray& array)>;

// Step n (1-based) -> the global batch of that step (global_batch sequences).
using BatchSource = std::function<Batch(int step)>;

struct TrainResult {
  std::vector<StepRecord> steps;
  std::vector<std::vector<MoeLoad>> moe_load;  // per step: the expert load of each MoE layer
  ParamMap<double> params;                     // final master parameters, widened to f64
};

// Everything a resumed run needs besides the data cursor (randomness is counter-based: no RNG
// state). Tensors are widened to f64; f32 values round-trip exactly.
struct TrainerState {
  int steps_done = 0;
  ParamMap<double> params;
  ParamMap<double> exp_avg;
  ParamMap<double> exp_avg_sq;
};

class Trainer {
 public:
  Trainer(const ModelConfig& model, const TrainConfig& train, uint64_t seed);
  ~Trainer();
  Trainer(Trainer&&) noexcept;
  Trainer& operator=(Trainer&&) noexcept;

  void set_observer(TensorObserver observer);
  // bf16 recipe with a tied embedding: round its two uses' microbatch gradients (the embedding's
  // and the head's) to bf16 apart and add them in f32, as a pipeline whose first and last stage
  // each hold one use does (parallel::rounds_gradient_parts), instead of rounding their sum.
  // No effect in f64 / f32 or without tied embeddings.
  void round_tied_uses_apart(bool apart);
  // One optimizer step on this global batch: microbatches of micro_batch sequences in order,
  // gradients accumulated, then clip, schedule and AdamW. batch[i].index must equal i (it keys
  // dropout); a batch of the wrong size or with other indices throws std::logic_error.
  StepRecord step(const Batch& global_batch);
  // train.steps steps, batches from the source.
  TrainResult run(const BatchSource& source);

  ParamMap<double> params() const;      // master parameters, widened to f64
  ParamMap<double> last_grads() const;  // accumulated gradients of the last step, before clipping
  // The last step's expert load over its global batch, one per MoE layer (empty: dense).
  const std::vector<MoeLoad>& last_moe_load() const;
  int steps_done() const;

  TrainerState save() const;
  // Restores a saved state (same model config and precision); the next step is steps_done + 1.
  void load(const TrainerState& state);

  struct Engine;  // the precision-specific state (defined in trainer.cpp)

 private:
  std::unique_ptr<Engine> engine_;
};

// Convenience: run a whole training and dump every observed tensor plus index.json into dir.
TrainResult train_and_dump(const ModelConfig& model, const TrainConfig& train, uint64_t seed,
                           const BatchSource& source, const std::string& dir);

}  // namespace shardcheck::ref
