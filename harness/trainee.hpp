// What the runner, checkpoints and drills need from a training engine, whichever it is: the
// data-parallel engine (DDP, ZeRO, FSDP) for pure-DP meshes, the mesh engine (parallel/mp/) as soon
// as any of tp, pp, cp, ep is above 1.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "harness/scenario.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/state.hpp"
#include "reference/batch.hpp"
#include "reference/data.hpp"
#include "reference/trainer.hpp"

namespace shardcheck::harness {

class Trainee {
 public:
  virtual ~Trainee() = default;
  virtual ref::StepRecord step(const ref::Batch& local) = 0;
  virtual ref::ParamMap<double> full_params() = 0;
  virtual std::vector<parallel::StatePiece> export_state() const = 0;
  virtual void import_state(const parallel::StateReader& read) = 0;
  virtual parallel::StepHealth last_step_health() const = 0;
  // The slice of the global batch this rank reads: data_rank() of data_world().
  virtual int data_rank() const = 0;
  virtual int data_world() const = 0;
  // "ddp", "zero3", "fsdp", ... or "mesh" (model parallel).
  virtual std::string strategy() const = 0;

  ref::Batch local_batch(const ref::Dataset& ds, const std::vector<int64_t>& global_ids) const {
    return parallel::rank_batch(ds, global_ids, data_rank(), data_world(), planted_);
  }

 protected:
  // A planted bug (tests) the engine's options carry; kSameSamples breaks local_batch.
  parallel::testing::Mutation planted_ = parallel::testing::Mutation::kNone;
};

// True when the configuration needs the mesh engine (any model-parallel axis above 1).
bool model_parallel(const ParallelSpec& p);
// Why the configuration cannot run, or "".
std::string unsupported(const Scenario& s, const ParallelSpec& p);

// Collective over world: builds the engine for configuration p. dp_options apply to the
// data-parallel engine; on a model-parallel mesh only its health check, gradient hook and planted
// bug apply.
std::unique_ptr<Trainee> make_trainee(comm::Communicator& world, const Scenario& s,
                                      const ParallelSpec& p,
                                      const parallel::DataParallelOptions& dp_options);

}  // namespace shardcheck::harness
