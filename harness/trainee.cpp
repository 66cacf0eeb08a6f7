#include "harness/trainee.hpp"

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

parallel::MeshOptions mesh_options(const ParallelSpec& p) {
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
  if (p.fsdp) o.fsdp = *p.fsdp;
  return o;
}

// The step driver's health check, gradient hook and planted bug, the same on either engine.
parallel::MeshOptions with_step_options(parallel::MeshOptions m,
                                        const parallel::DataParallelOptions& o) {
  m.health = o.health;
  m.grad_hook = o.grad_hook;
  m.planted = o.planted;
  return m;
}

class MeshTrainee final : public Trainee {
 public:
  MeshTrainee(comm::Communicator& world, const Scenario& s, const ParallelSpec& p,
              const parallel::DataParallelOptions& o)
      : e_(world, s.model, s.train, s.seed, with_step_options(mesh_options(p), o)) {
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
  if (p.fsdp && (p.fsdp_wrap != "block" || !p.fsdp_reshard_after_forward || p.fsdp_prefetch > 1))
    return "on a model-parallel mesh FSDP gathers each pipeline chunk's parameters before its "
           "forward and again before its backward, without prefetch: fsdp wrap, "
           "reshard_after_forward and prefetch settings are not built there";
  try {
    parallel::validate_mesh(s.model, s.train, mesh_options(p));
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
