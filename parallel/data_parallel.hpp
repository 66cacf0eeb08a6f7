// Data-parallel training of the reference model over one DP group, written only against
// comm::Communicator: DDP (bucketed gradient all_reduce overlapping backward), ZeRO-1/2/3
// (optimizer state, then gradients, then parameters sharded) and FSDP (wrap units, sharding
// strategies, prefetch, hybrid shard), in f64, f32 and the bf16 mixed-precision recipe, with
// memory tracking, a non-finite-gradient health check and checkpoint state export/import.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/flat.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/state.hpp"
#include "parallel/step.hpp"
#include "parallel/testing.hpp"
#include "reference/batch.hpp"
#include "reference/config.hpp"
#include "reference/data.hpp"
#include "reference/tensor.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::parallel {

enum class Strategy : std::uint8_t { ddp, zero1, zero2, zero3, fsdp };
std::string_view name_of(Strategy s);

// How ZeRO-3 materialises parameters: per_layer is FSDP full_shard with one unit per block (and
// the embedding and head), no prefetch; whole_model is FSDP full_shard over one unit (gathered
// once per microbatch, kept through its backward).
enum class Zero3Gather : std::uint8_t { per_layer, whole_model };

struct DataParallelOptions {
  Strategy strategy = Strategy::ddp;
  Zero3Gather zero3_gather = Zero3Gather::per_layer;
  // DDP and ZeRO-1 all-reduce gradients in buckets of about this many elements (reverse parameter
  // order; see FlatLayout::buckets).
  std::size_t bucket_elems = std::size_t{1} << 20;
  FsdpOptions fsdp{};  // Strategy::fsdp only
  // DDP / ZeRO-1: issue each bucket's all_reduce during the last microbatch's backward as soon as
  // its gradients are complete (PyTorch DDP order); false: all after backward.
  bool overlap = true;
  GradHealthOptions health{};
  GradHook grad_hook{};
  // Internal use (tests): a known bug planted in this engine's step (parallel/testing.hpp).
  testing::Mutation planted = testing::Mutation::kNone;
};

// One collective the engine issued in the last step (for the README's per-step list and tests).
struct CollectiveCall {
  std::string op;  // "all_reduce", "reduce_scatter", "all_gather"
  std::string what;
  std::size_t count = 0;  // elements of the full buffer (all_gather output, reduce_scatter input)
  comm::DType dtype = comm::DType::f64;
  friend bool operator==(const CollectiveCall&, const CollectiveCall&) = default;
};

class DataParallelEngine {
 public:
  // dp: this rank's data-parallel group (every member constructs an engine with the same
  // arguments). The local batch per step is train.global_batch / dp.size() sequences, which must
  // be a multiple of train.micro_batch. Buffers are reported to dp.memory() from here on.
  DataParallelEngine(comm::Communicator& dp, const ref::ModelConfig& model,
                     const ref::TrainConfig& train, uint64_t seed,
                     DataParallelOptions options = {});
  ~DataParallelEngine();
  DataParallelEngine(const DataParallelEngine&) = delete;
  DataParallelEngine& operator=(const DataParallelEngine&) = delete;

  // One optimizer step. Collective over the DP group. local_batch: this rank's sequences (global
  // Sequence::index). Returns the global record (loss, counts, grad norm, clip factor, lr), the
  // same on every rank and comparable field by field with ref::Trainer::step.
  ref::StepRecord step(const ref::Batch& local_batch);

  // Every parameter at full shape, widened to f64 (the master weights in the bf16 recipe, as
  // ref::Trainer::params()). Collective; every rank gets the same map.
  ref::ParamMap<double> full_params();

  // Checkpoint state: this rank's pieces; over all ranks every element of every tensor is written
  // exactly once (replicated state is split: each rank writes its shard range of the DP-size
  // layout; under hybrid_shard only replica 0 writes). Not collective.
  std::vector<StatePiece> export_state() const;
  // Replaces parameters, master weights, moments and step counts with the ones `read` supplies,
  // reading only the ranges this engine's layout holds (any exporting DP size or strategy; the
  // same precision recipe). Not collective; call on every rank before the next step.
  void import_state(const StateReader& read);

  // The whole-model flat layout (DDP, ZeRO-1/2 shard it; ZeRO-3/FSDP shard one per wrap unit).
  const FlatLayout& layout() const;
  std::size_t padding() const;  // zeros added so that every sharded buffer divides evenly
  Strategy strategy() const;
  const std::vector<CollectiveCall>& last_step_collectives() const;
  const StepHealth& last_step_health() const;
  int skipped_steps() const;
  // Elements of parameters / optimizer moments this rank holds between steps.
  std::size_t resident_param_elems() const;
  std::size_t resident_optimizer_elems() const;
  // dp.memory()'s holdings when the last step's optimizer began (gradients reduced, activations
  // and temporaries freed): the model state the analytic ledger predicts.
  const comm::MemoryBreakdown& last_model_state() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardcheck::parallel
