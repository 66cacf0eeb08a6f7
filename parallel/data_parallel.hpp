// Data-parallel training of the reference model over one DP group, written only against
// comm::Communicator: DDP (bucketed gradient all_reduce), ZeRO-1/2/3 (optimizer state, then
// gradients, then parameters sharded). Not here: FSDP wrap units, bf16 recipe, overlap with
// backward, memory ledger (see parallel/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/flat.hpp"
#include "reference/batch.hpp"
#include "reference/config.hpp"
#include "reference/data.hpp"
#include "reference/tensor.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::parallel {

enum class Strategy : std::uint8_t { ddp, zero1, zero2, zero3 };
std::string_view name_of(Strategy s);

// How ZeRO-3 materialises parameters for compute. per_layer: every unit (embedding, each block,
// head; see layerwise.hpp) is its own flat buffer sharded over the group, all-gathered just before
// its forward and again before its backward, and dropped after each use. whole_model: one flat
// buffer, all-gathered once per step before the first forward and dropped after the last backward.
enum class Zero3Gather : std::uint8_t { per_layer, whole_model };

struct DataParallelOptions {
  Strategy strategy = Strategy::ddp;
  Zero3Gather zero3_gather = Zero3Gather::per_layer;
  // DDP and ZeRO-1 all-reduce gradients in buckets of about this many elements (reverse parameter
  // order; see FlatLayout::buckets). ZeRO-2/3 reduce-scatter each padded flat buffer (the whole
  // model, or one per unit for ZeRO-3 per_layer) in one call.
  std::size_t bucket_elems = std::size_t{1} << 20;
};

// One collective the engine issued in the last step (for the README's per-step list and tests).
struct CollectiveCall {
  std::string op;  // "all_reduce", "reduce_scatter", "all_gather"
  std::string what;
  std::size_t count = 0;  // elements of the full buffer (all_gather output, reduce_scatter input)
  comm::DType dtype = comm::DType::f64;
  friend bool operator==(const CollectiveCall&, const CollectiveCall&) = default;
};

// DP rank `rank` of `world`'s part of a global batch: the sampler's contiguous rank_slice, with
// Sequence::index kept global (it keys dropout). testing::Mutation::kSameSamples plants a sampler
// bug here (every rank reads rank 0's samples).
ref::Batch rank_batch(const ref::Dataset& data, const std::vector<int64_t>& global_ids, int rank,
                      int world);

class DataParallelEngine {
 public:
  // dp: this rank's data-parallel group (every member constructs an engine with the same
  // arguments). Precision f64 or f32; bf16 throws std::invalid_argument (not in this slice).
  // The local batch per step is train.global_batch / dp.size() sequences, which must be a
  // multiple of train.micro_batch.
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

  // Every parameter at full shape, widened to f64. Collective (ZeRO-3 all-gathers its shards);
  // every rank gets the same map.
  ref::ParamMap<double> full_params();

  // The whole-model flat layout. ZeRO-3 per_layer shards one flat buffer per unit instead; its
  // padding is the sum over units (padding()).
  const FlatLayout& layout() const;
  std::size_t padding() const;  // zeros added so that every sharded buffer divides by the DP size
  Strategy strategy() const;
  // Collectives of the last step(), in issue order.
  const std::vector<CollectiveCall>& last_step_collectives() const;
  // Elements of parameters / optimizer moments this rank holds between steps (not counting the
  // step's temporaries): the measured side of the memory ledger still to come.
  std::size_t resident_param_elems() const;
  std::size_t resident_optimizer_elems() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardcheck::parallel
