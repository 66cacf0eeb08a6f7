#include "harness/trainee.hpp"

#include "harness/driver.hpp"
#include "parallel/mp/mesh_engine.hpp"

namespace shardcheck::harness {
namespace {

class DpTrainee final : public Trainee {
 public:
  DpTrainee(comm::Communicator& world, const Scenario& s, const parallel::DataParallelOptions& o)
      : e_(world, s.model, s.train, s.seed, o), rank_(world.rank()), size_(world.size()) {
    planted_ = o.planted;
  }
  ref::StepRecord step(const ref::Batch& local) override { return e_.step(local); }
  ref::ParamMap<double> full_params() override { return e_.full_params(); }
  std::vector<parallel::StatePiece> export_state() const override { return e_.export_state(); }
  void import_state(const parallel::StateReader& read) override { e_.import_state(read); }
  parallel::StepHealth last_step_health() const override { return e_.last_step_health(); }
  int data_rank() const override { return rank_; }
  int data_world() const override { return size_; }
  std::string strategy() const override { return std::string(parallel::name_of(e_.strategy())); }

 private:
  parallel::DataParallelEngine e_;
  int rank_, size_;
};

// The mesh engine's options: the layout from the spec, the FSDP settings, health check, gradient
// hook and planted bug from the step driver's options (driver.hpp), the same on either engine.
parallel::MeshOptions mesh_options(const ParallelSpec& p, const parallel::DataParallelOptions& d) {
  parallel::MeshOptions o;
  o.shape = p.mesh;
  o.order = p.order;
  o.sequence_parallel = p.sequence_parallel;
  o.schedule = p.pp_schedule == "gpipe"         ? parallel::PipeSchedule::gpipe
               : p.pp_schedule == "interleaved" ? parallel::PipeSchedule::interleaved
                                                : parallel::PipeSchedule::one_f_one_b;
  o.virtual_stages = p.virtual_stages;
  o.cp_algo = p.cp_algo == "ulysses" ? parallel::CpAlgo::ulysses : parallel::CpAlgo::ring;
  o.zero = p.zero;
  if (d.strategy == parallel::Strategy::fsdp) o.fsdp = d.fsdp;
  o.health = d.health;
  o.grad_hook = d.grad_hook;
  o.planted = d.planted;
  return o;
}

class MeshTrainee final : public Trainee {
 public:
  MeshTrainee(comm::Communicator& world, const Scenario& s, const ParallelSpec& p,
              const parallel::DataParallelOptions& o)
      : e_(world, s.model, s.train, s.seed, mesh_options(p, o)) {
    planted_ = o.planted;
  }
  ref::StepRecord step(const ref::Batch& local) override { return e_.step(local); }
  ref::ParamMap<double> full_params() override { return e_.full_params(); }
  std::vector<parallel::StatePiece> export_state() const override { return e_.export_state(); }
  void import_state(const parallel::StateReader& read) override { e_.import_state(read); }
  parallel::StepHealth last_step_health() const override { return e_.last_step_health(); }
  int data_rank() const override { return e_.data_rank(); }
  int data_world() const override { return e_.data_world(); }
  std::string strategy() const override { return "mesh"; }

 private:
  parallel::MeshEngine e_;
};

}  // namespace

bool model_parallel(const ParallelSpec& p) {
  return p.mesh.tp > 1 || p.mesh.pp > 1 || p.mesh.cp > 1 || p.mesh.ep > 1;
}

std::string unsupported(const Scenario& s, const ParallelSpec& p) {
  if (!model_parallel(p)) return "";
  try {
    parallel::validate_mesh(s.model, s.train, mesh_options(p, engine_options(s, p)));
  } catch (const parallel::MeshConfigError& e) {
    return e.what();
  }
  return "";
}

std::unique_ptr<Trainee> make_trainee(comm::Communicator& world, const Scenario& s,
                                      const ParallelSpec& p,
                                      const parallel::DataParallelOptions& dp_options) {
  if (model_parallel(p)) return std::make_unique<MeshTrainee>(world, s, p, dp_options);
  return std::make_unique<DpTrainee>(world, s, dp_options);
}

}  // namespace shardcheck::harness
