// The drills' training and restore machinery (drill_train.hpp).
#include "harness/drill_train.hpp"

#include <algorithm>
#include <cstdio>
#include <span>
#include <vector>

#include "harness/driver.hpp"
#include "harness/runner.hpp"
#include "harness/sim_options.hpp"
#include "parallel/data_parallel.hpp"

namespace shardcheck::harness::drill_impl {

std::string g3(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

std::string step_name(int k) {
  return ck::step_dir_name(static_cast<std::uint64_t>(k));
}

std::string steps_text(int from, int to) {
  return from == to ? "step " + std::to_string(from)
                    : "steps " + std::to_string(from) + "-" + std::to_string(to);
}

std::string not_built(const Scenario& s, const ParallelSpec& p) {
  const std::string why = unsupported(s, p);
  return why.empty() ? "" : p.label() + ": " + why;
}

std::string config_text(const Scenario& /*s*/, const ParallelSpec& p) {
  return p.label() + " (" + strategy_name(p) + ")";
}

// PlantedBug::skip_checksums: each rank opens the checkpoint alone without hashing payloads and
// imports straight away; a read that re-hashes a whole shard may still throw, but only mid-import.
TrainCursor restore_unverified(parallel::MeshEngine& e, const Scenario& s, std::int64_t samples,
                               const fs::path& step_dir) {
  const ck::Checkpoint c = ck::Checkpoint::open(step_dir, {.verify_checksums = false});
  e.import_state([&](const std::string& tensor, comm::DType, std::size_t begin, std::size_t count,
                     std::span<std::byte> out) {
    c.read(tensor, ck::FlatRange{begin, count}, out);
  });
  return resume_cursor(c.manifest().state, s, samples);
}

// PlantedBug::fused_gate_up_order: the checkpoint is validated and imported as restore_training
// does, but a SwiGLU layer's gate and up (parameters and optimizer state alike) are read through a
// fused layout that lost its chunk order: the saving mesh's TP ranks t each held [gate_t | up_t];
// the loader concatenates those blocks and takes the first half of the columns as the gate.
TrainCursor restore_fused_gate_up(comm::Communicator& world, parallel::MeshEngine& e, const Ctx& x,
                                  const fs::path& step_dir) {
  const ck::Checkpoint c = ck::Checkpoint::open_collective(world, step_dir);
  const TrainCursor cur =
      resume_cursor(c.manifest().state, x.s, static_cast<std::int64_t>(x.ds.samples.size()));
  const auto saved_tp = static_cast<std::size_t>(x.base.mesh.tp);
  auto full = [&](const std::string& name) {
    const ck::TensorRecord& t = c.tensor(name);
    std::size_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::size_t>(d);
    std::vector<std::byte> bytes(n * comm::size_of(t.dtype));
    c.read(name, ck::FlatRange{0, n}, bytes);
    return bytes;
  };
  e.import_state([&](const std::string& tensor, comm::DType dtype, std::size_t begin,
                     std::size_t count, std::span<std::byte> out) {
    const bool gate = tensor.ends_with("mlp.w_gate"), up = tensor.ends_with("mlp.w_up");
    if (!gate && !up) return c.read(tensor, ck::FlatRange{begin, count}, out);
    const std::string stem = tensor.substr(0, tensor.rfind('.') + 1);
    const std::vector<std::byte> g = full(stem + "w_gate"), u = full(stem + "w_up");
    const ck::TensorRecord& t = c.tensor(tensor);
    const auto cols = static_cast<std::size_t>(t.shape.at(1)), block = cols / saved_tp;
    const std::size_t es = comm::size_of(dtype);
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t row = (begin + i) / cols, col = (begin + i) % cols;
      const std::size_t fused = (up ? cols : 0) + col;  // column of the concatenated blocks
      const std::size_t rank = fused / (2 * block), within = fused % (2 * block);
      const std::vector<std::byte>& from = within < block ? g : u;
      const std::size_t src = row * cols + rank * block + within % block;
      std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(src * es), es,
                  out.begin() + static_cast<std::ptrdiff_t>(i * es));
    }
  });
  return cur;
}

// PlantedBug::head_read_as_padded: validated and imported as restore_training does, but every
// lm_head.weight tensor (the parameter and its optimizer state) is read as if stored [h, Vp] with
// the saving mesh's padded vocabulary Vp: element (row, col) from row * Vp + col, zero past the
// end.
TrainCursor restore_head_as_padded(comm::Communicator& world, parallel::MeshEngine& e, const Ctx& x,
                                   const fs::path& step_dir) {
  const ck::Checkpoint c = ck::Checkpoint::open_collective(world, step_dir);
  const TrainCursor cur =
      resume_cursor(c.manifest().state, x.s, static_cast<std::int64_t>(x.ds.samples.size()));
  const auto vocab = static_cast<std::size_t>(x.s.model.vocab);
  const auto padded = static_cast<std::size_t>(x.s.model.padded_vocab(x.base.mesh.tp));
  e.import_state([&](const std::string& tensor, comm::DType dtype, std::size_t begin,
                     std::size_t count, std::span<std::byte> out) {
    if (!tensor.ends_with("lm_head.weight"))
      return c.read(tensor, ck::FlatRange{begin, count}, out);
    const ck::TensorRecord& t = c.tensor(tensor);
    const std::size_t n = static_cast<std::size_t>(t.shape.at(0)) * vocab,
                      es = comm::size_of(dtype);
    std::vector<std::byte> all(n * es);
    c.read(tensor, ck::FlatRange{0, n}, all);
    std::fill(out.begin(), out.end(), std::byte{0});
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t src = (begin + i) / vocab * padded + (begin + i) % vocab;
      if (src < n)
        std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(src * es), es,
                    out.begin() + static_cast<std::ptrdiff_t>(i * es));
    }
  });
  return cur;
}

// restore_training as the drills call it, or with the planted bug a test asked for.
TrainCursor restore(comm::Communicator& c, parallel::MeshEngine& e, const Ctx& x,
                    const fs::path& step_dir) {
  const auto samples = static_cast<std::int64_t>(x.ds.samples.size());
  switch (x.bug) {
    case PlantedBug::swallow_restore_errors:
      try {
        return restore_training(c, e, x.s, samples, step_dir);
      } catch (const ck::RestoreError&) {
        return {};
      }
    case PlantedBug::skip_checksums:
      return restore_unverified(e, x.s, samples, step_dir);
    case PlantedBug::fused_gate_up_order:
      return restore_fused_gate_up(c, e, x, step_dir);
    case PlantedBug::head_read_as_padded:
      return restore_head_as_padded(c, e, x, step_dir);
    case PlantedBug::off_by_one_step: {
      TrainCursor cur = restore_training(c, e, x.s, samples, step_dir);
      cur.step -= 1;
      return cur;
    }
    default:
      return restore_training(c, e, x.s, samples, step_dir);
  }
}

// The checkpoint a resume from `dir` uses: the newest committed one, validated (open_latest
// refuses a bad newest one naming the previous good one), or what a planted bug picks instead.
fs::path resolve_latest(const Ctx& x, const fs::path& dir) {
  if (x.bug == PlantedBug::accept_uncommitted) {
    fs::path best;
    std::uint64_t best_step = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::string name = e.path().filename().string();
      if (name.ends_with(".tmp")) name.resize(name.size() - 4);
      if (auto n = ck::parse_step_dir_name(name); n && (best.empty() || *n >= best_step)) {
        best = e.path();
        best_step = *n;
      }
    }
    return best;
  }
  if (x.bug == PlantedBug::skip_bad_latest) {
    try {
      return ck::open_latest(dir).path();
    } catch (const ck::RestoreError& e) {
      if (e.previous_good().empty()) throw;
      return e.previous_good();
    }
  }
  return ck::open_latest(dir).path();
}

sim::SimOptions world_options(const Scenario& s, int n) {
  Scenario calm = s;  // the drills inject checkpoint damage, not the scenario's run faults
  calm.faults.clear();
  return sim_options(calm, n);
}

// Trains plan.spec on a fresh SimWorld with the step driver. Throws sim::RankFailure when a rank
// fails.
Trajectory train(const Ctx& x, const TrainPlan& plan) {
  const ParallelSpec& p = plan.spec;
  const int n = p.mesh.world_size();
  sim::SimWorld world(n, world_options(x.s, n));
  Trajectory t;
  t.final_params.resize(static_cast<std::size_t>(n));
  t.final_state.resize(static_cast<std::size_t>(n));
  world.run([&](comm::Communicator& c) {
    const bool lead = c.rank() == 0;
    const std::unique_ptr<parallel::MeshEngine> built =
        build_engine(c, x.s, p, {.inject_faults = false});
    parallel::MeshEngine& engine = *built;
    DriveOptions o;
    if (!plan.resume_from.empty())
      o.restore = [&](parallel::MeshEngine& e) { return restore(c, e, x, plan.resume_from); };
    o.restore_sampler = x.bug != PlantedBug::replay_data;
    o.last_step = plan.last_step;
    o.started = [&](const TrainCursor& from) {
      if (!lead) return;
      if (!plan.resume_from.empty()) t.restored = from;
      t.first_step = from.step + 1;
    };
    o.after_step = [&](const StepDone& d) {
      const int k = d.cursor.step;
      if (lead) {
        t.steps.push_back(d.record);
        t.ids.push_back(d.ids);
        t.cursors.push_back(d.cursor);
      }
      if (std::find(plan.save_at.begin(), plan.save_at.end(), k) != plan.save_at.end()) {
        // Throwaway drill data: no fsync (the commit order, which the drills check, is the same).
        // keep = 0 (all): retention must not delete step-k, which every restore drill starts from.
        ck::SaveOptions so{.keep = 0, .durable = false};
        if (k == plan.crash_step) so = ck::drill::crash_before_commit(so, plan.crash_rank);
        save_training(c, engine, x.s, p, d.cursor, plan.save_dir, so);
      }
    };
    drive(x.s, x.ds, engine, o);
    const auto r = static_cast<std::size_t>(c.rank());
    t.final_params[r] = engine.full_params();
    t.final_state[r] = engine.export_state();
  });
  return t;
}

}  // namespace shardcheck::harness::drill_impl
