// The checkpoint drills (drill.hpp). Every training or restore runs in its own sim::SimWorld with
// fresh engines, as a restarted job would. Damaged checkpoints are copies in per-drill directories,
// so no drill can spoil the good checkpoint the others restore from.
#include "harness/drill.hpp"

#include "harness/drill_train.hpp"
#include "harness/driver.hpp"
#include "harness/parity_bound.hpp"

#include <stdlib.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>

#include "checkpoint/checkpoint.hpp"
#include "comm/errors.hpp"
#include "harness/checkpointing.hpp"
#include "harness/runner.hpp"
#include "harness/sim_options.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/parity.hpp"
#include "reference/data.hpp"
#include "reference/trainer.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {

namespace {

using namespace drill_impl;  // NOLINT(google-build-using-namespace): drill internals

constexpr const char* kLatestBad = "latest_bad_refused";

std::uint64_t bits(double v) {
  return std::bit_cast<std::uint64_t>(v);
}

// "" when the two state exports are byte for byte the same, else the first difference.
std::string state_diff(const std::vector<parallel::StatePiece>& got,
                       const std::vector<parallel::StatePiece>& want) {
  if (got.size() != want.size())
    return std::to_string(got.size()) + " state pieces instead of " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto &a = got[i], &b = want[i];
    if (a.tensor != b.tensor || a.begin != b.begin || a.count != b.count || a.dtype != b.dtype)
      return "state piece " + std::to_string(i) + " is " + a.tensor + " instead of " + b.tensor;
    if (a.bytes != b.bytes) return a.tensor + " differs";
  }
  return "";
}

// "" when every parameter is bitwise equal, else the first difference.
std::string params_diff(const ref::ParamMap<double>& got, const ref::ParamMap<double>& want) {
  for (const auto& e : want) {
    const ref::Tensor<double>* t = got.find(e.name);
    if (t == nullptr || t->vec().size() != e.value.vec().size()) return e.name + " is missing";
    for (std::size_t i = 0; i < t->vec().size(); ++i)
      if (bits(t->vec()[i]) != bits(e.value.vec()[i]))
        return e.name + "[" + std::to_string(i) + "] = " + g3(t->vec()[i]) + " instead of " +
               g3(e.value.vec()[i]);
  }
  return "";
}

// "" when the run trained exactly steps from..N.
std::string coverage(const Ctx& x, const Trajectory& t, int from) {
  const int n = x.s.train.steps;
  if (t.first_step == from && t.last_step() == n) return "";
  return "the resumed run trained " +
         (t.steps.empty() ? std::string("no step") : steps_text(t.first_step, t.last_step())) +
         ", expected " + steps_text(from, n);
}

// Loss of every trained step and every rank's final parameters against the reference, each
// against its bound from the noise probe (harness/parity_bound.hpp): the error closest to its
// bound, that bound, and where it was.
struct ReferenceError {
  double err = 0, bound = 0, ratio = -1;
  std::string where = "nowhere";
};

ReferenceError reference_error(const Ctx& x, const Trace& want, const Trajectory& t) {
  ReferenceError worst;
  const auto note = [&](double e, double bound, const std::string& what) {
    const double q0 = e == 0.0 ? 0.0 : e / bound;
    const double q = q0 == q0 ? q0 : INFINITY;  // an error that is no number never passes
    if (q > worst.ratio) worst = {e, bound, q, what};
  };
  const int n = x.s.train.steps;
  for (std::size_t i = 0; i < t.steps.size(); ++i) {
    const int step = t.first_step + static_cast<int>(i);
    if (step < 1 || step > n) continue;
    note(parallel::rel_err(t.steps[i].loss, want.steps[static_cast<std::size_t>(step - 1)].loss),
         want.noise.bound(step, Measure::scalars), "step " + std::to_string(step) + " loss");
  }
  for (std::size_t r = 0; r < t.final_params.size(); ++r) {
    for (const auto& e : want.params.back()) {
      const ref::Tensor<double>* got = t.final_params[r].find(e.name);
      note(got ? parallel::tensor_rel_err(*got, e.value) : INFINITY,
           want.noise.bound(n, Measure::master_max),
           "rank " + std::to_string(r) + " final " + e.name + " (max-abs)");
    }
    // the whole model norm-wise, as parity's measure
    note(parallel::model_norm_err(t.final_params[r], want.params.back()),
         want.noise.bound(n, Measure::master_norm),
         "rank " + std::to_string(r) + " final parameters (norm-wise)");
  }
  return worst;
}

DrillResult parity_verdict(const Ctx& x, const Trajectory& t, int from, const std::string& head,
                           const Trace* want = nullptr) {
  DrillResult d;
  if (std::string gap = coverage(x, t, from); !gap.empty()) {
    d.detail = head + "; " + gap;
    return d;
  }
  const ReferenceError e = reference_error(x, want != nullptr ? *want : x.want, t);
  d.pass = e.ratio <= 1.0;
  d.detail = head + "; " + steps_text(from, x.s.train.steps) +
             " and every rank's final parameters vs the reference: largest error for its bound " +
             g3(e.err) + (d.pass ? " <= " : " > ") + "bound " + g3(e.bound) + " at " + e.where;
  return d;
}

const Trajectory& resumed_same(Ctx& x) {
  if (!x.resumed && !x.resumed_error) {
    try {
      x.resumed = train(x, {.spec = x.base,
                            .resume_from = x.root / "saved" / step_name(x.k),
                            .last_step = x.s.train.steps});
    } catch (...) {
      x.resumed_error = std::current_exception();
    }
  }
  if (x.resumed_error) std::rethrow_exception(x.resumed_error);
  return *x.resumed;
}

// restore_same (the base mesh, the shared resumed run) or restore_resharded (restore_parallel).
DrillResult restore_into(Ctx& x, bool resharded) {
  const ParallelSpec& q = resharded ? *x.target : x.base;
  if (std::string why = not_built(x.s, q); !why.empty()) return {.name = "", .detail = why};
  const fs::path from = x.root / "saved" / step_name(x.k);
  const Trajectory t =
      resharded ? train(x, {.spec = q, .resume_from = from, .last_step = x.s.train.steps})
                : resumed_same(x);
  return parity_verdict(x, t, x.k + 1,
                        "saved by " + config_text(x.s, x.base) + " at " + step_name(x.k) +
                            ", restored into a new " + config_text(x.s, q),
                        resharded && x.want_target ? &*x.want_target : nullptr);
}

// Same mesh: bitwise the uninterrupted run, and the data cursor exact.
DrillResult resume_exact(Ctx& x) {
  DrillResult d;
  const Trajectory& t = resumed_same(x);
  const Trajectory& u = *x.straight;
  const std::int64_t batch = x.s.train.global_batch;
  const auto fail = [&](const std::string& why) {
    d.detail = "resumed from " + step_name(x.k) + " on " + config_text(x.s, x.base) + ": " + why;
    return d;
  };
  if (std::string gap = coverage(x, t, x.k + 1); !gap.empty()) return fail(gap);
  const TrainCursor &at = u.cursors[static_cast<std::size_t>(x.k - 1)], got = t.restored.value();
  if (got.step != at.step || got.consumed_samples != x.k * batch ||
      got.consumed_tokens != at.consumed_tokens || got.sampler.steps != at.sampler.steps ||
      got.sampler.offset != at.sampler.offset || got.sampler.epoch != at.sampler.epoch)
    return fail("the restored cursor is not the one saved (consumed_samples " +
                std::to_string(got.consumed_samples) + ", expected " + std::to_string(x.k * batch) +
                " = step x global_batch)");
  for (std::size_t i = 0; i < t.steps.size(); ++i) {
    const int step = t.first_step + static_cast<int>(i);
    const auto j = static_cast<std::size_t>(step - 1);
    if (t.ids[i] != u.ids[j])
      return fail("step " + std::to_string(step) +
                  " read other samples than the uninterrupted run (a sample replayed or skipped)");
    if (t.cursors[i].consumed_samples != step * batch)
      return fail("consumed_samples " + std::to_string(t.cursors[i].consumed_samples) +
                  " after step " + std::to_string(step) + ", expected " +
                  std::to_string(step * batch));
    const ref::StepRecord &a = t.steps[i], &b = u.steps[j];
    if (bits(a.loss) != bits(b.loss) || bits(a.grad_norm) != bits(b.grad_norm) ||
        bits(a.lr) != bits(b.lr))
      return fail("step " + std::to_string(step) + " loss " + g3(a.loss) + " (grad norm " +
                  g3(a.grad_norm) + ", lr " + g3(a.lr) +
                  ") is not bitwise the uninterrupted run's " + g3(b.loss));
  }
  for (std::size_t r = 0; r < t.final_state.size(); ++r) {
    if (std::string diff = state_diff(t.final_state[r], u.final_state[r]); !diff.empty())
      return fail("rank " + std::to_string(r) + " final state: " + diff);
    if (std::string diff = params_diff(t.final_params[r], u.final_params[r]); !diff.empty())
      return fail("rank " + std::to_string(r) + " final parameters: " + diff);
  }
  d.pass = true;
  d.detail = "resumed from " + step_name(x.k) + " on a new " + config_text(x.s, x.base) + ": " +
             steps_text(x.k + 1, x.s.train.steps) +
             " bitwise equal to the uninterrupted run (losses, grad norms, LR; every rank's "
             "parameters and optimizer state); same sample ids each step, consumed_samples = "
             "step x " +
             std::to_string(batch);
  return d;
}

// Restores into fresh engines of the base mesh; `resolve` picks the step directory on each rank.
std::vector<Attempt> attempt_restore(const Ctx& x, const std::function<fs::path()>& resolve) {
  const int n = x.base.mesh.world_size();
  sim::SimWorld world(n, world_options(x.s, n));
  std::vector<Attempt> out(static_cast<std::size_t>(n));
  world.run([&](comm::Communicator& c) {
    Attempt& a = out[static_cast<std::size_t>(c.rank())];
    const std::unique_ptr<parallel::MeshEngine> built =
        build_engine(c, x.s, x.base, {.inject_faults = false});
    parallel::MeshEngine& engine = *built;
    const std::vector<parallel::StatePiece> before = engine.export_state();
    try {
      (void)restore(c, engine, x, resolve());
    } catch (const ck::RestoreError& e) {
      a.refused = true;
      a.reason = e.reason();
      a.file = e.file();
      a.what = e.what();
      a.previous_good = e.previous_good();
    } catch (const std::exception& e) {
      a.other = e.what();
    }
    a.changed = state_diff(engine.export_state(), before);
    a.untouched = a.changed.empty();
  });
  return out;
}

// Pass only when every rank refused with the expected reason, named the damaged file, and its
// engine is exactly as before.
DrillResult judge(const std::vector<Attempt>& attempts, const ck::drill::Damage& damage,
                  const std::string& head) {
  DrillResult d;
  const std::string want =
      std::string(ck::name_of(damage.expect)) + " naming '" + damage.file + "'";
  // Every rank's problem, ranks with the same one grouped: "rank 0, 1, 3: ...; rank 2: ...".
  std::vector<std::pair<std::string, std::vector<int>>> problems;
  for (std::size_t r = 0; r < attempts.size(); ++r) {
    const Attempt& a = attempts[r];
    std::string p;
    if (!a.other.empty())
      p = "failed with a non-checkpoint error instead of refusing (" + a.other + ")";
    else if (!a.refused)
      p = "did not refuse: the restore went on; expected " + want;
    else if (a.reason != damage.expect || a.file != damage.file)
      p = "refused with " + std::string(ck::name_of(a.reason)) + " naming '" + a.file +
          "', expected " + want + " (" + a.what + ")";
    else if (!a.untouched)
      p = "refused, but only after changing the engine's state (" + a.changed + ")";
    else
      continue;
    auto it =
        std::find_if(problems.begin(), problems.end(), [&](const auto& e) { return e.first == p; });
    if (it == problems.end()) it = problems.insert(problems.end(), {p, {}});
    it->second.push_back(static_cast<int>(r));
  }
  d.pass = problems.empty();
  d.detail = head;
  for (const auto& [p, ranks] : problems)
    d.detail += (ranks.size() > 1 ? "; ranks " : "; rank ") + comm::rank_list(ranks) + ": " + p;
  if (d.pass)
    d.detail += ": refused on all " + std::to_string(attempts.size()) +
                " ranks before touching any state: " + (attempts.empty() ? "" : attempts[0].what);
  return d;
}

fs::path copy_saved(const Ctx& x, int step, const std::string& drill) {
  const fs::path dir = x.root / drill;
  fs::create_directories(dir);
  fs::copy(x.root / "saved" / step_name(step), dir / step_name(step), fs::copy_options::recursive);
  return dir / step_name(step);
}

DrillResult damaged(const Ctx& x, const std::string& name) {
  const fs::path step_dir = copy_saved(x, x.k, name);
  // Spread over the manifest's shards (tensors by name, then slices), so that the drills hit
  // several kinds of tensor (moments, master weights, parameters, step counters) and ranks.
  const ck::Checkpoint saved = ck::Checkpoint::open(step_dir);
  std::size_t shards = 0;
  for (const ck::TensorRecord& t : saved.manifest().tensors) shards += t.shards.size();
  const auto at = [&](std::size_t fifths) { return shards * fifths / 5; };
  const ck::drill::Damage dmg =
      name == "missing_shard"     ? ck::drill::remove_shard(step_dir, at(1))
      : name == "corrupt_shard"   ? ck::drill::flip_payload_byte(step_dir, at(2), 3)
      : name == "truncated_shard" ? ck::drill::truncate_shard(step_dir, at(3))
                                  : ck::drill::replace_with_stale_shard(step_dir, at(4));
  return judge(attempt_restore(x, [&] { return step_dir; }), dmg, dmg.what);
}

DrillResult latest_bad_refused(const Ctx& x) {
  copy_saved(x, x.k, kLatestBad);
  const fs::path newest = copy_saved(x, x.k2, kLatestBad);
  const fs::path dir = newest.parent_path();
  const ck::drill::Damage dmg = ck::drill::flip_payload_byte(newest, 0, 5);
  const std::vector<Attempt> attempts = attempt_restore(x, [&] { return resolve_latest(x, dir); });
  DrillResult d = judge(attempts, dmg, "newest " + step_name(x.k2) + ": " + dmg.what);
  if (!d.pass) return d;
  for (std::size_t r = 0; r < attempts.size(); ++r)
    if (fs::path(attempts[r].previous_good).filename() != step_name(x.k)) {
      d.pass = false;
      d.detail = "rank " + std::to_string(r) + " refused the bad newest checkpoint but named '" +
                 attempts[r].previous_good + "' as the previous good one, expected " +
                 step_name(x.k);
      return d;
    }
  d.detail += "; previous good checkpoint offered: " + step_name(x.k);
  return d;
}

DrillResult crash_before_commit(const Ctx& x) {
  DrillResult d;
  const fs::path dir = x.root / "crash_before_commit";
  const int victim = x.base.mesh.world_size() - 1;
  const std::string k1 = step_name(x.k), k2 = step_name(x.k2);
  const std::string head =
      "rank " + std::to_string(victim) + " died at the " + k2 + " save after writing its shards";
  try {
    train(x, {.spec = x.base,
              .last_step = x.k2,
              .save_dir = dir,
              .save_at = {x.k, x.k2},
              .crash_step = x.k2,
              .crash_rank = victim});
    d.detail = head + ", yet SimWorld::run reported no failure";
    return d;
  } catch (const sim::RankFailure& e) {
    if (e.rank() != victim || !caused_by<ck::drill::SimulatedCrash>(e)) {
      d.detail = head + ", but SimWorld::run reported " + e.what();
      return d;
    }
  }
  if (fs::exists(dir / k2 / "SUCCESS")) {
    d.detail = head + ", yet " + k2 + " was committed";
    return d;
  }
  const auto latest = ck::latest_committed(dir);
  if (!latest || latest->filename() != k1) {
    d.detail = head + "; latest_committed is " + (latest ? latest->filename().string() : "none") +
               ", expected " + k1;
    return d;
  }
  const fs::path from = resolve_latest(x, dir);
  if (from.filename() != k1) {
    d.detail = head + "; the resume picked " + from.filename().string() + ", expected " + k1;
    return d;
  }
  const bool tmp_left = fs::exists(dir / (k2 + ".tmp"));
  const Trajectory t =
      train(x, {.spec = x.base, .resume_from = from, .last_step = x.s.train.steps});
  return parity_verdict(x, t, x.k + 1,
                        head + ": run failed naming rank " + std::to_string(victim) + "; " +
                            (tmp_left ? k2 + ".tmp left uncommitted" : "no " + k2) +
                            "; open_latest = " + k1 + "; resumed from it");
}

// Runs one drill; a failure to restore a good checkpoint is a failed drill, anything else that
// throws is a broken run.
DrillResult run_one(Ctx& x, const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  DrillResult d;
  try {
    if (std::string why = not_built(x.s, x.base); !why.empty()) {
      d.detail = why;
    } else if (!x.straight) {
      d.broke = true;
      d.detail = "the uninterrupted run that saves the checkpoints broke";
    } else if (name == "restore_same" || name == "restore_resharded") {
      d = restore_into(x, name == "restore_resharded");
    } else if (name == "resume_exact") {
      d = resume_exact(x);
    } else if (name == "crash_before_commit") {
      d = crash_before_commit(x);
    } else if (name == kLatestBad) {
      d = latest_bad_refused(x);
    } else {
      d = damaged(x, name);
    }
  } catch (const sim::RankFailure& e) {
    const bool refusal = caused_by<ck::CheckpointError>(e);
    d.pass = false;
    d.broke = !refusal;
    d.detail =
        (refusal ? "a good checkpoint was refused: " : "the run broke: ") + std::string(e.what());
  } catch (const ck::CheckpointError& e) {
    d.pass = false;
    d.detail = std::string("a good checkpoint was refused: ") + e.what();
  } catch (const std::exception& e) {
    d.pass = false;
    d.broke = true;
    d.detail = std::string("the drill broke: ") + e.what();
  }
  // Paths inside the work directory are shown relative to it: the report does not depend on it.
  for (std::size_t at; (at = d.detail.find(x.root.string() + "/")) != std::string::npos;)
    d.detail.erase(at, x.root.string().size() + 1);
  d.name = name;
  d.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

// A temporary work directory, removed when the drills end.
struct WorkDir {
  fs::path path;
  bool temporary = false;
  ~WorkDir() {
    std::error_code ec;
    if (temporary) fs::remove_all(path, ec);
  }
};

}  // namespace

std::string_view name_of(PlantedBug b) {
  static constexpr const char* kNames[] = {"none",
                                           "swallow_restore_errors",
                                           "skip_checksums",
                                           "replay_data",
                                           "off_by_one_step",
                                           "accept_uncommitted",
                                           "skip_bad_latest",
                                           "fused_gate_up_order",
                                           "head_read_as_padded"};
  return kNames[static_cast<int>(b)];
}

bool DrillReport::pass() const {
  return !drills.empty() &&
         std::all_of(drills.begin(), drills.end(), [](const DrillResult& d) { return d.pass; });
}

bool DrillReport::broke() const {
  return std::any_of(drills.begin(), drills.end(), [](const DrillResult& d) { return d.broke; });
}

std::vector<std::string> drills_to_run(const Scenario& s) {
  // The drills train the base mesh and damage checkpoints themselves: a matrix or injected faults
  // would be silently ignored, so they are refused.
  if (s.has_matrix)
    throw ScenarioError("$.matrix",
                        "drill checkpoint trains the base \"parallel\" mesh (and "
                        "checkpoint.restore_parallel); give one drill scenario per mesh instead "
                        "of a matrix");
  if (!s.faults.empty())
    throw ScenarioError("$.faults",
                        "drill checkpoint injects its own damage; faults are for `run` and "
                        "`matrix` (remove them, or run the scenario with `run`)");
  if (s.drills.empty())
    throw ScenarioError("$.drills",
                        "lists no drill; expected some of restore_same, "
                        "restore_resharded, missing_shard, corrupt_shard, "
                        "truncated_shard, crash_before_commit, stale_marker, "
                        "resume_exact");
  if (s.train.steps < 2)
    throw ScenarioError("$.train.steps",
                        "the drills save at a step and resume after it: expected "
                        "at least 2 steps, got " +
                            std::to_string(s.train.steps));
  if (s.checkpoint.every >= s.train.steps)
    throw ScenarioError("$.checkpoint.every",
                        "the drills restore a checkpoint and train on: expected 1.." +
                            std::to_string(s.train.steps - 1) + " (below train.steps), got " +
                            std::to_string(s.checkpoint.every));
  std::vector<std::string> out;
  for (const std::string& d : s.drills)
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  if (std::find(out.begin(), out.end(), "restore_resharded") != out.end() &&
      !s.checkpoint.restore_parallel)
    throw ScenarioError("$.checkpoint.restore_parallel",
                        "the restore_resharded drill needs the mesh to restore into (a parallel "
                        "object, e.g. {\"dp\": 2, \"zero\": 3})");
  out.push_back(kLatestBad);
  return out;
}

DrillReport run_drills(const Scenario& s, const DrillOptions& o) {
  const std::vector<std::string> names = drills_to_run(s);
  Ctx x{.s = s, .bug = o.planted_bug, .base = s.parallel, .target = s.checkpoint.restore_parallel};
  x.ds = ref::build_dataset(s.data, s.model, s.seed);
  if (static_cast<int64_t>(x.ds.samples.size()) < s.train.global_batch)
    throw ScenarioError("$.data.documents",
                        "the corpus packs into " + std::to_string(x.ds.samples.size()) +
                            " sequences, fewer than train.global_batch (" +
                            std::to_string(s.train.global_batch) + "); add documents");
  const int every = s.checkpoint.every > 0 ? s.checkpoint.every : std::max(1, s.train.steps / 2);
  x.k = every;
  x.k2 = std::min(x.k + every, s.train.steps);

  WorkDir work;
  if (o.work_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "shardcheck-drill-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr)
      throw std::runtime_error("cannot create a temporary directory in " +
                               fs::temp_directory_path().string());
    work.path = tmpl;
    work.temporary = true;
  } else {
    fs::create_directories(o.work_dir);
    work.path = o.work_dir;
  }
  x.root = work.path;

  DrillReport r;
  r.scenario = s;
  r.config = x.base.label();
  r.restore_config = x.target ? x.target->label() : "";
  r.save_step = x.k;
  r.steps = s.train.steps;
  r.work_dir = work.temporary ? fs::path() : work.path;
  std::string broke;
  if (not_built(x.s, x.base).empty()) {
    // The reference of the base mesh's recipe (a bf16 pipeline rounds the tied embedding's uses
    // apart); a restore onto a mesh that rounds otherwise is judged against the reference that
    // switches at the save step, as the restored run does.
    const bool apart = parallel::rounds_gradient_parts(s.model, s.train, x.base.mesh);
    x.want = detail::reference_run(s, x.ds, "", {.apart = apart});
    if (x.target && parallel::rounds_gradient_parts(s.model, s.train, x.target->mesh) != apart)
      x.want_target = detail::reference_run(
          s, x.ds, "", {.apart = apart, .switch_after = x.k, .apart_after = !apart});
    for (const Trace* t : {&x.want, x.want_target ? &*x.want_target : nullptr})
      if (const std::string why = t ? t->noise.chaos() : ""; !why.empty())
        throw ScenarioError("$.train", "the scenario is " + why);
    GoodputResult& g = r.goodput;
    for (std::size_t k = 0; k < x.want.steps.size(); ++k) {
      const auto tokens = static_cast<double>(x.want.steps[k].non_padding_tokens);
      g.tokens_processed += tokens;
      if (static_cast<int>(k) + 1 > x.k) {  // trained again after the restore
        g.tokens_processed += tokens;
        g.tokens_replayed += tokens;
      }
    }
    g.valid = g.tokens_processed > 0;
    g.tokens_good = g.tokens_processed - g.tokens_replayed;
    g.fraction = g.valid ? g.tokens_good / g.tokens_processed : 0.0;
    try {
      x.straight = train(x, {.spec = x.base,
                             .last_step = s.train.steps,
                             .save_dir = x.root / "saved",
                             .save_at = {x.k, x.k2}});
    } catch (const std::exception& e) {
      broke = e.what();
    }
  }
  for (const std::string& name : names) {
    r.drills.push_back(run_one(x, name));
    if (!broke.empty()) r.drills.back().detail += ": " + broke;
  }
  return r;
}

}  // namespace shardcheck::harness
