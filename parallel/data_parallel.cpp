// DataParallelEngine's public face: argument checks, the choice of master type, and forwarding
// to EngineImpl (engine.hpp); plus rank_batch and the names of the enums.
#include "parallel/data_parallel.hpp"

#include <stdexcept>

#include "parallel/engine.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::parallel {

std::string_view name_of(Strategy s) {
  switch (s) {
    case Strategy::ddp:
      return "ddp";
    case Strategy::zero1:
      return "zero1";
    case Strategy::zero2:
      return "zero2";
    case Strategy::zero3:
      return "zero3";
    case Strategy::fsdp:
      return "fsdp";
  }
  return "?";
}

DataParallelEngine::DataParallelEngine(comm::Communicator& dp, const ref::ModelConfig& model,
                                       const ref::TrainConfig& train, uint64_t seed,
                                       DataParallelOptions options) {
  model.validate();
  train.validate();
  if (train.global_batch % dp.size() != 0)
    throw std::invalid_argument("train.global_batch must be divisible by the DP size");
  if ((train.global_batch / dp.size()) % train.micro_batch != 0)
    throw std::invalid_argument(
        "train.micro_batch must divide the per-rank batch (global_batch / DP size)");
  const FsdpOptions& f = options.fsdp;
  if (options.strategy == Strategy::fsdp) {
    if (f.prefetch < 0 || f.prefetch > 2)
      throw std::invalid_argument("fsdp.prefetch must be 0, 1 or 2");
    if (f.wrap == WrapPolicy::layer_group && f.blocks_per_unit < 1)
      throw std::invalid_argument("fsdp.blocks_per_unit must be >= 1");
  }
  if (train.precision == ref::Precision::kF64)
    impl_ = std::make_unique<EngineImpl<double>>(dp, model, train, seed, std::move(options));
  else  // f32, and bf16 (f32 master weights and moments; bf16 working weights and gradients)
    impl_ = std::make_unique<EngineImpl<float>>(dp, model, train, seed, std::move(options));
}

DataParallelEngine::~DataParallelEngine() = default;

ref::StepRecord DataParallelEngine::step(const ref::Batch& local_batch) {
  return impl_->step(local_batch);
}
ref::ParamMap<double> DataParallelEngine::full_params() {
  return impl_->full_params();
}
std::vector<StatePiece> DataParallelEngine::export_state() const {
  return impl_->export_state();
}
void DataParallelEngine::import_state(const StateReader& read) {
  impl_->import_state(read);
}
const FlatLayout& DataParallelEngine::layout() const {
  return impl_->layout;
}
std::size_t DataParallelEngine::padding() const {
  return impl_->padding();
}
Strategy DataParallelEngine::strategy() const {
  return impl_->strategy;
}
const std::vector<CollectiveCall>& DataParallelEngine::last_step_collectives() const {
  return impl_->calls;
}
const StepHealth& DataParallelEngine::last_step_health() const {
  return impl_->health;
}
int DataParallelEngine::skipped_steps() const {
  return impl_->skipped;
}
std::size_t DataParallelEngine::resident_param_elems() const {
  return impl_->param_elems();
}
std::size_t DataParallelEngine::resident_optimizer_elems() const {
  return impl_->optimizer_elems();
}
const comm::MemoryBreakdown& DataParallelEngine::last_model_state() const {
  return impl_->model_state;
}

}  // namespace shardcheck::parallel
