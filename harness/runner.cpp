// The scenario runner. The reference Trainer and the parallel engines consume the same sampler
// batches; per step, the error is max(|loss - ref| / |ref|, max over tensors of
// max|p - p_ref| / max|p_ref|): every rank's loss, the parameters assembled from the owners' state
// pieces after each step, and every rank's own gathered view after the last step. Faults come from
// the simulator's diagnosis, the health check and the parity check (outcome.hpp).
#include "harness/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <optional>
#include <type_traits>

#include "harness/backend.hpp"
#include "harness/checkpointing.hpp"
#include "harness/runner_detail.hpp"
#include "harness/sim_options.hpp"
#include "harness/trainee.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/flops.hpp"
#include "parallel/parity.hpp"
#include "reference/data.hpp"
#include "reference/model.hpp"
#include "reference/npy.hpp"
#include "reference/trainer.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

using detail::CheckpointPlan;
using detail::RankTrace;
using detail::Trace;

namespace {}  // namespace

parallel::DataParallelOptions engine_options(const Scenario& s, const ParallelSpec& p) {
  parallel::DataParallelOptions opt;
  opt.strategy = p.fsdp        ? parallel::Strategy::fsdp
                 : p.zero == 0 ? parallel::Strategy::ddp
                 : p.zero == 1 ? parallel::Strategy::zero1
                 : p.zero == 2 ? parallel::Strategy::zero2
                               : parallel::Strategy::zero3;
  opt.bucket_elems = static_cast<std::size_t>(p.bucket_elems);
  if (p.fsdp) {
    using parallel::ShardingStrategy;
    using parallel::WrapPolicy;
    parallel::FsdpOptions& f = opt.fsdp;
    f.sharding = *p.fsdp == "shard_grad_op"  ? ShardingStrategy::shard_grad_op
                 : *p.fsdp == "no_shard"     ? ShardingStrategy::no_shard
                 : *p.fsdp == "hybrid_shard" ? ShardingStrategy::hybrid_shard
                                             : ShardingStrategy::full_shard;
    f.wrap = p.fsdp_wrap == "layer_group"   ? WrapPolicy::layer_group
             : p.fsdp_wrap == "whole_model" ? WrapPolicy::whole_model
                                            : WrapPolicy::block;
    f.blocks_per_unit = p.fsdp_blocks_per_unit;
    f.reshard_after_forward = p.fsdp_reshard_after_forward;
    f.prefetch = p.fsdp_prefetch;
    // PyTorch's HYBRID_SHARD default: shard inside a node, replicate across nodes.
    f.shard_group_size = p.fsdp_shard_group > 0 ? p.fsdp_shard_group
                                                : std::gcd(p.mesh.dp, s.topology.ranks_per_node);
  }
  return opt;
}

namespace {

// Elements of the gathered parameters, assembled from every rank's exported state pieces (the
// master weights in the bf16 recipe, as ref::Trainer::params()). No collective, so parity
// checking leaves the timeline and the faults' op counts untouched.
ref::ParamMap<double> assemble(const std::vector<const std::vector<parallel::StatePiece>*>& ranks,
                               const ref::ModelConfig& model, bool bf16) {
  ref::ParamMap<double> out;
  for (const auto& [name, shape] : ref::param_shapes(model)) out.add(name, shape);
  const std::string prefix = bf16 ? "master/" : "param/";
  for (const auto* pieces : ranks)
    for (const parallel::StatePiece& piece : *pieces) {
      if (piece.tensor.rfind(prefix, 0) != 0) continue;
      ref::Tensor<double>* t = out.find(piece.tensor.substr(prefix.size()));
      if (t == nullptr || piece.begin + piece.count > t->vec().size()) continue;
      comm::visit_dtype(piece.dtype, [&](auto tag) {
        using E = decltype(tag);
        for (std::size_t i = 0; i < piece.count; ++i) {
          E v;
          std::memcpy(&v, piece.bytes.data() + i * sizeof(E), sizeof(E));
          if constexpr (std::is_arithmetic_v<E>)
            t->vec()[piece.begin + i] = static_cast<double>(v);
          else
            t->vec()[piece.begin + i] = static_cast<double>(static_cast<float>(v));
        }
      });
    }
  return out;
}

// On world rank `rank`: writes a NaN into the first element of every local gradient of the first
// microbatch at each nan_gradient fault's step (before any reduction).
parallel::GradHook nan_injector(const Scenario& s, int rank) {
  std::vector<int> steps;
  for (const FaultSpec& f : s.faults)
    if (f.kind == "nan_gradient" && f.rank == rank) steps.push_back(f.step);
  if (steps.empty()) return {};
  return [steps](int step, int microbatch, const std::string& /*param*/, comm::Buffer grad) {
    if (microbatch != 0 || grad.count == 0 ||
        std::find(steps.begin(), steps.end(), step) == steps.end())
      return;
    if (grad.dtype == comm::DType::f64) static_cast<double*>(grad.data)[0] = std::nan("");
    if (grad.dtype == comm::DType::f32) static_cast<float*>(grad.data)[0] = std::nanf("");
  };
}

// Tokens, FLOPs and MFU of a step. FLOPs = 3 x forward (parallel/flops.hpp: matmuls and attention
// products, backward 2x forward) over every position of the global batch, padding included as
// dense kernels compute it; recomputation under activation checkpointing is not counted.
void fill_rates(const Scenario& s, const ParallelSpec& p, const Trace& want, TimingResult& t) {
  if (!t.valid || t.step_time_s <= 0) return;
  double tokens = 0;
  for (const auto& rec : want.steps) tokens += static_cast<double>(rec.non_padding_tokens);
  t.tokens_per_step = tokens / static_cast<double>(want.steps.size());
  t.tokens_per_s = t.tokens_per_step / t.step_time_s;
  t.flops_per_step = 3.0 * parallel::model_forward_flops(s.model, s.model.seq_len) *
                     static_cast<double>(s.train.global_batch);
  t.mfu = t.flops_per_step / (t.step_time_s * p.mesh.world_size() * s.topology.peak_tflops * 1e12);
}

}  // namespace

namespace detail {

// The verdict. With expect.fault set, the configuration passes when that fault was detected
// (parity is reported, not required: a fault may change the numbers on purpose). Without it, a
// detected fault that breaks runs (FaultResult::breaks_run) means exit 3; otherwise parity decides.
Trace reference_run(const Scenario& s, const ref::Dataset& ds, const std::string& dump_dir) {
  ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                  s.seed, s.data.drop_last);
  ref::Trainer trainer(s.model, s.train, s.seed);
  std::optional<ref::TensorDumper> dumper;
  if (!dump_dir.empty()) {
    dumper.emplace(dump_dir);
    trainer.set_observer(
        [&](const std::string& name, const ref::HostArray& a) { dumper->add(name, a); });
  }
  Trace t;
  for (int n = 1; n <= s.train.steps; ++n) {
    t.steps.push_back(trainer.step(ref::gather_batch(ds, sampler.next_global_batch())));
    t.params.push_back(trainer.params());
  }
  if (dumper) dumper->write_index();
  return t;
}

ConfigResult config_row(const Scenario& s, const ParallelSpec& p) {
  ConfigResult r;
  r.config = p.label();
  r.spec = p;
  r.tolerance = tolerance_for(s.train.precision);
  r.detail = unsupported(s, p);
  r.supported = r.detail.empty();
  return r;
}

void decide(const Scenario& s, ConfigResult& r) {
  if (s.expect_fault) {
    const auto hit = std::find_if(r.faults.begin(), r.faults.end(), [&](const FaultResult& f) {
      return f.detected && f.kind == *s.expect_fault;
    });
    r.pass = hit != r.faults.end();
    if (r.pass) {
      r.detail = "expected fault '" + *s.expect_fault + "' detected (ranks " +
                 comm::rank_list(hit->ranks) + ")";
    } else {
      std::string seen;
      for (const auto& f : r.faults) seen += (seen.empty() ? "" : ", ") + f.kind;
      r.detail = "expected fault '" + *s.expect_fault + "' was not detected" +
                 (seen.empty() ? "" : " (found: " + seen + ")");
    }
    return;
  }
  for (const FaultResult& f : r.faults)
    if (f.detected && f.breaks_run) r.broke = true;
  r.pass = !r.broke && (r.parity_pass || !s.expect_parity);
}

void measure_parity(const Scenario& s, const Trace& want, const std::vector<RankTrace>& got,
                    ConfigResult& r) {
  double worst = -1;
  const bool bf16 = s.train.precision == ref::Precision::kBf16;
  std::vector<const std::vector<parallel::StatePiece>*> pieces(got.size());
  const int first = got[0].first_step;
  for (int k = first - 1; k < s.train.steps; ++k) {
    const auto uk = static_cast<std::size_t>(k);              // into the reference trace
    const auto ug = static_cast<std::size_t>(k - first + 1);  // into the ranks' traces
    StepParity sp{k + 1, got[0].steps[ug].loss, want.steps[uk].loss, 0};
    const auto note = [&](double e, std::size_t rank, const std::string& what) {
      if (!(e <= sp.max_rel_err)) sp.max_rel_err = e;
      if (!(e <= worst)) {
        worst = e;
        r.detail = "largest error: rank " + std::to_string(rank) + " step " +
                   std::to_string(k + 1) + " " + what;
      }
    };
    for (std::size_t rank = 0; rank < got.size(); ++rank) {
      note(parallel::rel_err(got[rank].steps[ug].loss, want.steps[uk].loss), rank, "loss");
      pieces[rank] = &got[rank].pieces[ug];
    }
    const ref::ParamMap<double> params = assemble(pieces, s.model, bf16);
    for (const auto& e : want.params[uk]) {
      const ref::Tensor<double>* t = params.find(e.name);
      note(t ? parallel::tensor_rel_err(*t, e.value) : INFINITY, 0, e.name + " (owner shards)");
    }
    if (k + 1 == s.train.steps)  // every rank's own view of the final parameters
      for (std::size_t rank = 0; rank < got.size(); ++rank)
        for (const auto& e : want.params[uk]) {
          const ref::Tensor<double>* t = got[rank].final_params.find(e.name);
          note(t ? parallel::tensor_rel_err(*t, e.value) : INFINITY, rank,
               e.name + " (gathered by the rank)");
        }
    r.steps.push_back(sp);
    if (!(sp.max_rel_err <= r.max_rel_err)) r.max_rel_err = sp.max_rel_err;
  }
  if (first > s.train.steps && first > 1) {
    // Resumed after the last step: nothing left to train, so check that the restored parameters
    // (every rank's gathered view) are the reference's after that step.
    const auto uk = static_cast<std::size_t>(first - 2);
    StepParity sp{first - 1, NAN, want.steps[uk].loss, 0};
    for (std::size_t rank = 0; rank < got.size(); ++rank)
      for (const auto& e : want.params[uk]) {
        const ref::Tensor<double>* t = got[rank].final_params.find(e.name);
        const double err = t ? parallel::tensor_rel_err(*t, e.value) : INFINITY;
        if (!(err <= sp.max_rel_err)) sp.max_rel_err = err;
      }
    r.steps.push_back(sp);
    r.max_rel_err = sp.max_rel_err;
    r.detail = "resumed after the last step: restored parameters checked";
  }
  r.parity_pass = r.max_rel_err <= r.tolerance;
}

// The health check's verdict (the same on every rank): the first step with non-finite gradients.
std::optional<FaultResult> nan_result(const RankTrace& rank0) {
  for (std::size_t k = 0; k < rank0.health.size(); ++k) {
    const parallel::StepHealth& h = rank0.health[k];
    if (h.nonfinite_ranks.empty()) continue;
    FaultResult f;
    f.kind = "nan";
    f.ranks = h.nonfinite_ranks;
    f.step = static_cast<int>(k) + 1;
    f.message = "non-finite gradient at step " + std::to_string(k + 1) + " on DP rank(s) " +
                comm::rank_list(h.nonfinite_ranks) +
                (h.skipped ? "; every rank skipped the update of that step" : "");
    return f;
  }
  return std::nullopt;
}

void train_rank(comm::Communicator& c, const Scenario& s, const ref::Dataset& ds,
                const parallel::DataParallelOptions& opt, const ParallelSpec& p,
                const CheckpointPlan& ck, RankTrace& mine, RankMemory& memory) {
  parallel::DataParallelOptions mine_opt = opt;
  mine_opt.grad_hook = nan_injector(s, c.world_rank());
  const std::unique_ptr<Trainee> trainee = make_trainee(c, s, p, mine_opt);
  Trainee& engine = *trainee;
  ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                  s.seed, s.data.drop_last);
  TrainCursor cursor;
  if (!ck.resume_step_dir.empty()) {
    cursor = restore_training(c, engine, s, ck.resume_step_dir);
    sampler.restore(cursor.sampler);
  }
  mine.first_step = cursor.step + 1;
  for (int k = cursor.step + 1; k <= s.train.steps; ++k) {
    const ref::Batch local = engine.local_batch(ds, sampler.next_global_batch());
    mine.steps.push_back(engine.step(local));
    mine.pieces.push_back(engine.export_state());
    mine.health.push_back(engine.last_step_health());
    cursor.step = k;
    cursor.consumed_samples += s.train.global_batch;
    cursor.consumed_tokens += mine.steps.back().non_padding_tokens;
    cursor.sampler = sampler.state();
    if (!ck.save_dir.empty() && ck.every > 0 && k % ck.every == 0)
      save_training(c, engine, s, p, cursor, ck.save_dir, {.keep = ck.keep});
  }
  // Outside the measured steps: the final gather of every rank's view.
  c.begin_step(s.train.steps + 1);
  mine.final_params = engine.full_params();
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
                const parallel::DataParallelOptions& opt, const ParallelSpec& p,
                const CheckpointPlan& ck = {}) {
  const int n = world.size();
  SimRun out;
  out.got.resize(static_cast<std::size_t>(n));
  out.memory.resize(static_cast<std::size_t>(n));
  try {
    world.run([&](comm::Communicator& c) {
      const auto r = static_cast<std::size_t>(c.rank());
      detail::train_rank(c, s, ds, opt, p, ck, out.got[r], out.memory[r]);
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
        place.capacity, place.mpi ? "processes started by mpirun" : "visible GPUs");
  }
  ConfigResult r = detail::config_row(s, p);
  if (!r.supported) return r;
  parallel::DataParallelOptions opt = engine_options(s, p);
  opt.health.check = true;
  opt.health.policy = s.health.nan_policy == "stop" ? parallel::NonFinitePolicy::stop
                                                    : parallel::NonFinitePolicy::skip_step;
  r.strategy = model_parallel(p) ? "mesh" : std::string(parallel::name_of(opt.strategy));
  const int world = p.mesh.world_size();
  CheckpointPlan ck;
  if (!o.checkpoint_dir.empty()) {
    ck.save_dir = config_checkpoint_dir(s, p, o.checkpoint_dir);
    ck.every = s.checkpoint.every;
    ck.keep = static_cast<std::size_t>(s.checkpoint.keep);
  }
  if (!o.resume_dir.empty()) {
    // Validated here, in full, before any rank starts: a committed checkpoint that fails is
    // refused with the shard and reason, and the previous good one named — never skipped.
    std::filesystem::path dir = o.resume_dir;
    if (!checkpoint::latest_committed(dir) && std::filesystem::is_directory(dir / p.label()))
      dir /= p.label();
    try {
      ck.resume_step_dir = checkpoint::open_latest(dir).path();
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
  SimRun run = simulate(s, ds, sw, opt, p, ck);
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.memory = run.memory;
  r.timeline = sw.timeline();
  r.timing = timing_of(sw.step_times(), s.train.steps);
  if (!run.failed) r.pipeline = pipeline_bubble(s, p, r.timeline, sw.step_times());
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
    measure_parity(s, want, run.got, r);
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
      simulate(calm, ds, base, opt, p);
      const double without = timing_of(base.step_times(), s.train.steps).step_time_s;
      r.faults.push_back(straggler_result(sw.timeline(), world, f, r.timing.step_time_s, without));
      break;
    }
  fill_rates(s, p, want, r.timing);
  decide(s, r);
  return r;
}

}  // namespace

double tolerance_for(ref::Precision p) {
  switch (p) {
    case ref::Precision::kF64:
      return 1e-10;
    case ref::Precision::kF32:
      return 1e-5;
    case ref::Precision::kBf16:
      return 2e-2;
  }
  return 0;
}

bool RunResult::broke() const {
  return std::any_of(configs.begin(), configs.end(), [](const ConfigResult& c) { return c.broke; });
}

bool RunResult::pass() const {
  return !configs.empty() &&
         std::all_of(configs.begin(), configs.end(), [](const ConfigResult& c) { return c.pass; });
}

RunResult run_scenario(const Scenario& s, const RunOptions& o) {
  RunResult out{s, {}};
  const ref::Dataset ds = ref::build_dataset(s.data, s.model, s.seed);
  if (static_cast<int64_t>(ds.samples.size()) < s.train.global_batch)
    throw ScenarioError("$.data.documents",
                        "the corpus packs into " + std::to_string(ds.samples.size()) +
                            " sequences, fewer than train.global_batch (" +
                            std::to_string(s.train.global_batch) + "); add documents");
  const int total = static_cast<int>(s.configs.size());
  if (o.progress) o.progress("reference", 0, total);
  const Trace want = detail::reference_run(s, ds, o.dump_tensors);
  for (const ParallelSpec& p : s.configs) {
    if (o.progress) o.progress(p.label(), static_cast<int>(out.configs.size()) + 1, total);
    out.configs.push_back(run_config(s, ds, want, p, o));
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
