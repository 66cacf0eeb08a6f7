// The scenario runner: the reference run, then each configuration on the simulator (or the NCCL
// backend, runner_nccl.cpp) through the same per-rank train_rank; parity, the verdict and the
// reference run itself are in runner_parity.cpp. Faults come from the simulator's diagnosis, the
// health check and the parity check (outcome.hpp).
#include "harness/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <optional>

#include "checkpoint/lock.hpp"
#include "harness/backend.hpp"
#include "harness/checkpointing.hpp"
#include "harness/driver.hpp"
#include "harness/runner_detail.hpp"
#include "harness/sim_options.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "reference/data.hpp"
#include "reference/model.hpp"
#include "reference/trainer.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

using detail::CheckpointPlan;
using detail::RankTrace;
using detail::Trace;

namespace detail {

void train_rank(comm::Communicator& c, const Scenario& s, const ref::Dataset& ds,
                const ParallelSpec& p, const CheckpointPlan& ck, RankTrace& mine,
                RankMemory& memory, const ComputeFactory& compute, const BuildOptions& build) {
  // Installed before the engine exists (its construction may compute) until the rank returns.
  const std::unique_ptr<ref::Compute> device = compute ? compute(c.world_rank()) : nullptr;
  const ref::ComputeScope on_device(device.get());
  mine.compute = device ? device->name() : "cpu";
  const std::unique_ptr<parallel::MeshEngine> built = build_engine(c, s, p, build);
  parallel::MeshEngine& engine = *built;
  DriveOptions o;
  if (!ck.resume_step_dir.empty())
    o.restore = [&](parallel::MeshEngine& e) {
      return restore_training(c, e, s, static_cast<std::int64_t>(ds.samples.size()),
                              ck.resume_step_dir);
    };
  o.started = [&](const TrainCursor& from) { mine.first_step = from.step + 1; };
  o.after_step = [&](const StepDone& d) {
    mine.steps.push_back(d.record);
    mine.step_seconds.push_back(d.seconds);
    mine.pieces.push_back(engine.export_state());
    mine.health.push_back(engine.last_step_health());
    mine.held_digests.push_back(digest_held(engine.held_params()));
    if (device) mine.device_ops = device->ops_run();  // so far, also if a later step fails
    const int k = d.cursor.step;
    if (!ck.save_dir.empty() && ck.every > 0 && k % ck.every == 0)
      save_training(c, engine, s, p, d.cursor, ck.save_dir, {.keep = ck.keep});
  };
  drive(s, ds, engine, o);
  // Outside the measured steps: the final gather of every rank's view.
  c.begin_step(s.train.steps + 1);
  mine.final_params = engine.full_params();
  mine.held = engine.held_params();
  if (device) mine.device_ops = device->ops_run();
  const comm::MemoryTracker& m = c.memory();
  memory = RankMemory{c.world_rank(), m.current(), m.at_peak(), m.peak(), m.peak_phase()};
}

}  // namespace detail

namespace {

using detail::decide;
using detail::measure_parity;
using detail::nan_result;

struct SimRun {
  std::vector<RankTrace> got;
  std::vector<RankMemory> memory;
  bool failed = false;
  std::exception_ptr root_cause;
};

SimRun simulate(const Scenario& s, const ref::Dataset& ds, sim::SimWorld& world,
                const ParallelSpec& p, const CheckpointPlan& ck, const ComputeFactory& compute,
                const BuildOptions& build) {
  const int n = world.size();
  SimRun out;
  out.got.resize(static_cast<std::size_t>(n));
  out.memory.resize(static_cast<std::size_t>(n));
  try {
    world.run([&](comm::Communicator& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      detail::train_rank(c, s, ds, p, ck, out.got[r], out.memory[r], compute, build);
    });
  } catch (const sim::RankFailure& e) {
    out.failed = true;
    out.root_cause = e.cause();
  }
  return out;
}

ConfigResult run_config(const Scenario& s, const ref::Dataset& ds, const Trace& want,
                        const ParallelSpec& p, const RunOptions& o) {
  if (o.backend == "nccl") {
    const NcclPlace place = nccl_place();
    return detail::run_config_ranks(
        s, ds, want, p, [&p](const auto& fn) { run_nccl(p.mesh.world_size(), fn); }, place.mpi,
        place.capacity, place.mpi ? "processes started by mpirun" : "visible GPUs",
        o.compute.factory);
  }
  ConfigResult r = detail::config_row(s, p);
  if (!r.supported) return r;
  r.strategy = strategy_name(p);
  const int world = p.mesh.world_size();
  CheckpointPlan ck;
  if (!o.checkpoint_dir.empty()) {
    ck.save_dir = config_checkpoint_dir(s, p, o.checkpoint_dir);
    ck.every = s.checkpoint.every;
    ck.keep = static_cast<std::size_t>(s.checkpoint.keep);
  }
  // A matrix saves into DIR/<label>: a run given that folder itself is another writer of it.
  std::optional<checkpoint::DirLock> config_lock;
  if (!ck.save_dir.empty() && ck.save_dir != std::filesystem::path(o.checkpoint_dir))
    config_lock.emplace(ck.save_dir);
  std::optional<Trace> switched;  // the reference of a restore across the tied rounding
  if (!o.resume_dir.empty()) {
    // Validated here, in full, before any rank starts: a committed checkpoint that fails is
    // refused with the shard and reason, and the previous good one named — never skipped.
    std::filesystem::path dir = o.resume_dir;
    if (!checkpoint::latest_committed(dir) && std::filesystem::is_directory(dir / p.label()))
      dir /= p.label();
    try {
      // Identity, counters, sampler and every tensor the engine reads too, before any rank
      // starts: a refusal naming the field or tensor (and the previous good one), never a run
      // that breaks inside the ranks or resumes another recipe.
      const ResumePoint point = open_resume(dir, s, static_cast<std::int64_t>(ds.samples.size()));
      const checkpoint::Checkpoint& latest = point.checkpoint;
      const TrainCursor& from = point.from;
      ck.resume_step_dir = latest.path();
      // Saved by a mesh that rounds the bf16 tied embedding's uses otherwise than this one: the
      // restored run follows the saver's recipe up to the save, this mesh's after it.
      const nlohmann::json& m = latest.manifest().state.mesh;
      const auto axis = [&](const char* k) {
        return m.is_object() && m.contains(k) && m.at(k).is_number_integer() ? m.at(k).get<int>()
                                                                             : 1;
      };
      const comm::MeshShape saver{axis("dp"), axis("tp"), axis("pp"), axis("cp"), axis("ep")};
      const bool was = parallel::rounds_gradient_parts(s.model, s.train, saver);
      const bool now = parallel::rounds_gradient_parts(s.model, s.train, p.mesh);
      if (was != now) {
        switched = detail::reference_run(
            s, ds, "", {.apart = was, .switch_after = from.step, .apart_after = now});
        if (const std::string why = switched->noise.chaos(o.compute.name != "cpu"); !why.empty())
          throw ScenarioError("$.train", "the scenario is " + why);
      }
    } catch (const checkpoint::RestoreError& e) {
      r.detail =
          std::string("cannot resume from ") + dir.string() + ": " + e.what() +
          (e.previous_good().empty() ? std::string()
                                     : "; the previous good checkpoint is " + e.previous_good() +
                                           " (resume from it by "
                                           "moving the bad one away)");
      r.resume_refused = true;
      return r;
    }
    r.resumed_from = ck.resume_step_dir.string();
  }
  const auto t0 = std::chrono::steady_clock::now();
  sim::SimWorld sw(world, sim_options(s, world));
  const BuildOptions build{.planted = o.planted};
  SimRun run = simulate(s, ds, sw, p, ck, o.compute.factory, build);
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  detail::note_compute(run.got, r);
  r.memory = run.memory;
  r.timeline = sw.timeline();
  for (const comm::MemoryTracker& m : sw.memory()) r.memory_series.push_back(m.series());
  r.timing = timing_of(sw.step_times(), s.train.steps);
  r.phases = step_phases(r.timeline, sw.step_times(), world, s.train.steps);
  if (!run.failed) r.pipeline = pipeline_bubble(s, p, r.timeline, sw.step_times());
  if (r.pipeline && o.schedule_bubble && s.faults.empty() && ck.resume_step_dir.empty()) {
    // The schedule's own bubble: the same training with free links, so the compute stream idles
    // only where the schedule leaves it nothing to do (and where stage costs differ).
    sim::SimOptions free = sim_options(s, world);
    free.topology.intra_node = free.topology.inter_node = {1e15, 0.0};
    sim::SimWorld fw(world, free);
    // (on the CPU: virtual time comes from the cost model, not from where the ops ran)
    const SimRun again = simulate(s, ds, fw, p, {}, {}, build);
    if (!again.failed)
      if (auto f = pipeline_bubble(s, p, fw.timeline(), fw.step_times()))
        r.pipeline->schedule_bubble = f->measured;
  }
  if (run.failed) {
    r.memory.clear();
    bool nan_stop = false;
    try {
      if (run.root_cause) std::rethrow_exception(run.root_cause);
    } catch (const parallel::NonFiniteGradientError& e) {
      FaultResult f;
      f.kind = "nan";
      f.ranks = e.ranks();
      f.step = e.step();
      f.message = std::string(e.what()) + "; the run stopped (health.nan_policy \"stop\")";
      r.faults.push_back(f);
      nan_stop = true;
    } catch (...) {
    }
    if (!nan_stop && sw.diagnosis()) r.faults.push_back(from_diagnosis(*sw.diagnosis()));
    r.detail = r.faults.empty() ? "the run failed" : r.faults.back().message;
  } else {
    measure_parity(s, switched ? *switched : want, run.got, r);
    r.goodput = detail::goodput_of(
        want, run.got[0],
        r.timing.valid ? r.timing.step_time_s * static_cast<double>(run.got[0].steps.size()) : 0.0);
    if (auto f = nan_result(run.got[0])) r.faults.push_back(*f);
    for (const sim::FiredFault& ff : sw.fired_faults())
      if (ff.fault.kind == sim::FaultKind::corrupt_payload) {
        FaultResult f;
        f.kind = "corruption";
        f.detected = !r.parity_pass;
        f.breaks_run = false;
        f.ranks = {ff.fault.rank};
        f.op = ff.op;
        f.group = ff.group;
        f.seq = ff.seq;
        f.step = ff.step;
        f.message = (r.parity_pass ? "UNDETECTED: the parity check passed despite "
                                   : "the parity "
                                     "check diverged (" +
                                         r.detail + ") after ") +
                    ff.describe();
        r.faults.push_back(f);
      }
  }
  for (const FaultSpec& f : s.faults)
    if (f.kind == "straggler" && f.rank < world && !run.failed) {
      Scenario calm = s;
      calm.faults.clear();
      sim::SimWorld base(world, sim_options(calm, world));
      simulate(calm, ds, base, p, {}, o.compute.factory, build);
      const double without = timing_of(base.step_times(), s.train.steps).step_time_s;
      r.faults.push_back(
          straggler_result(sw.timeline(), r.phases, world, f, r.timing.step_time_s, without));
      break;
    }
  detail::fill_rates(s, p, want, r.timing);
  decide(s, r);
  return r;
}

}  // namespace

bool RunResult::broke() const {
  return std::any_of(configs.begin(), configs.end(), [](const ConfigResult& c) { return c.broke; });
}

bool RunResult::pass() const {
  return !configs.empty() &&
         std::all_of(configs.begin(), configs.end(), [](const ConfigResult& c) { return c.pass; });
}

RunResult run_scenario(const Scenario& s, const RunOptions& o) {
  RunResult out{s, {}, {}, {}, o.compute.name, {}, {}};
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  if (static_cast<int64_t>(ds.samples.size()) < s.train.global_batch)
    throw ScenarioError("$.data.documents",
                        "the corpus packs into " + std::to_string(ds.samples.size()) +
                            " sequences, fewer than train.global_batch (" +
                            std::to_string(s.train.global_batch) + "); add documents");
  const int total = static_cast<int>(s.configs.size());
  if (o.progress) o.progress("reference", 0, total);
  const auto checked = [&](Trace t) {
    if (const std::string why = t.noise.chaos(o.compute.name != "cpu"); !why.empty())
      throw ScenarioError("$.train", "the scenario is " + why +
                                         "; lower the learning rate or weight decay, or run fewer "
                                         "steps");
    return t;
  };
  const Trace want = checked(detail::reference_run(s, ds, o.dump_tensors));
  out.noise = want.noise;
  out.reference_steps = want.steps;
  out.reference_moe_load = want.moe_load;
  // Meshes that round the tied embedding's two uses apart (bf16 pipelines) are compared against
  // the reference of that recipe (ref::Trainer::round_tied_uses_apart).
  std::optional<Trace> want_apart;
  for (const ParallelSpec& p : s.configs) {
    if (o.progress) o.progress(p.label(), static_cast<int>(out.configs.size()) + 1, total);
    const bool apart = parallel::rounds_gradient_parts(s.model, s.train, p.mesh);
    if (apart && !want_apart) {
      want_apart = checked(detail::reference_run(s, ds, "", {.apart = true}));
      out.noise_tied_apart = want_apart->noise;
    }
    out.configs.push_back(run_config(s, ds, apart ? *want_apart : want, p, o));
    out.configs.back().tied_apart_reference = apart;
  }
  // Strong scaling (the global batch is fixed): throughput against the smallest world that ran,
  // T_n / (T_0 * n / n_0) with T = tokens/s.
  const ConfigResult* base = nullptr;
  for (const ConfigResult& c : out.configs)
    if (c.timing.valid && c.timing.tokens_per_s > 0 &&
        (base == nullptr || c.spec.mesh.world_size() < base->spec.mesh.world_size()))
      base = &c;
  if (base != nullptr)
    for (ConfigResult& c : out.configs)
      if (c.timing.valid && c.timing.tokens_per_s > 0) {
        const double n = c.spec.mesh.world_size(), n0 = base->spec.mesh.world_size();
        c.timing.scaling_efficiency = c.timing.tokens_per_s / (base->timing.tokens_per_s * n / n0);
        c.timing.scaling_baseline = base->config;
      }
  return out;
}

}  // namespace shardcheck::harness
