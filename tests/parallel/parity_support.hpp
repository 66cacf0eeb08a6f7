// Shared by the parallel tests: the tiny dense/MoE setups, the reference Trainer run on the
// sampler's global batches, the same steps through the engine (parallel/mp/mesh_engine.hpp) on a
// data-parallel mesh of D ranks on SimWorld(D), and the parity measure (per step: loss and every
// gathered parameter). Test code only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/data_parallel.hpp"
#include "parallel/mp/mesh_engine.hpp"
#include "parallel/mp/mesh_ledger.hpp"
#include "parallel/parity.hpp"
#include "reference/data.hpp"
#include "reference/trainer.hpp"
#include "sim/world.hpp"

namespace shardcheck::parallel::test {

struct Scenario {
  std::string name;
  ref::ModelConfig model;
  ref::TrainConfig train;
  ref::DataConfig data;
  uint64_t seed = 7;
};

// Dense: h = 18 (3 heads, MQA), so N is not a multiple of 4 or 8 (uneven shards for DP 4, 8);
// tied embedding, attention dropout on (keyed by global Sequence::index).
inline Scenario dense_setup() {
  Scenario s;
  s.name = "dense";
  s.model.vocab = 30;
  s.model.hidden = 18;
  s.model.layers = 2;
  s.model.heads = 3;
  s.model.kv_heads = 1;
  s.model.ffn = 20;
  s.model.seq_len = 12;
  s.model.dropout = 0.1;
  s.train.steps = 3;
  s.train.global_batch = 48;  // 48 / D sequences per rank for D in {1, 2, 3, 4, 8}
  s.train.micro_batch = 2;    // accumulated over >= 3 microbatches on every rank
  s.train.optimizer.lr = 5e-3;
  s.train.optimizer.warmup = 1;
  s.train.optimizer.min_lr = 1e-3;
  s.train.clip_grad_norm = 0.05;  // below every step's norm (and every shard's): clipping active
  s.data.documents = 320;
  s.data.min_len = 3;
  s.data.max_len = 20;
  return s;
}

// MoE (every 2nd layer, 4 experts, top-2, capacity binding), untied LM head; N = 16 * odd, so
// uneven for DP 3.
inline Scenario moe_setup() {
  Scenario s = dense_setup();
  s.name = "moe";
  s.model.vocab = 29;
  s.model.hidden = 16;
  s.model.heads = 4;
  s.model.kv_heads = 2;
  s.model.ffn = 24;
  s.model.dropout = 0.0;
  s.model.tie_embeddings = false;
  s.model.moe = ref::MoeConfig{
      .experts = 4, .top_k = 2, .capacity_factor = 1.0, .every = 2, .aux_loss = 0.01};
  return s;
}

struct Trace {
  std::vector<ref::StepRecord> steps;
  std::vector<ref::ParamMap<double>> params;  // after each step, full shape
};

inline ref::Dataset dataset_of(const Scenario& s) {
  return ref::build_dataset(s.data, s.model, s.seed);
}

inline Trace reference_run(const Scenario& s) {
  const ref::Dataset ds = dataset_of(s);
  ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                  s.seed, true);
  ref::Trainer trainer(s.model, s.train, s.seed);
  Trace out;
  for (int n = 1; n <= s.train.steps; ++n) {
    out.steps.push_back(trainer.step(ref::gather_batch(ds, sampler.next_global_batch())));
    out.params.push_back(trainer.params());
  }
  return out;
}

// (setup name, strategy, DP size): the parameter of the strategy matrices, and its test name.
using StrategyParam = std::tuple<std::string, Strategy, int>;
inline std::string strategy_param_name(const ::testing::TestParamInfo<StrategyParam>& info) {
  const auto& [name, strategy, world] = info.param;
  return name + "_" + std::string(name_of(strategy)) + "_dp" + std::to_string(world);
}

// The engine's options for a data-parallel mesh of `world` ranks under a data-parallel strategy.
inline MeshOptions dp_mesh(int world, const DataParallelOptions& o) {
  MeshOptions m;
  m.shape.dp = world;
  m.zero = o.strategy == Strategy::zero1   ? 1
           : o.strategy == Strategy::zero2 ? 2
           : o.strategy == Strategy::zero3 ? 3
                                           : 0;
  if (o.strategy == Strategy::fsdp) m.fsdp = o.fsdp;
  m.bucket_elems = o.bucket_elems;
  m.overlap = o.overlap;
  m.health = o.health;
  m.grad_hook = o.grad_hook;
  m.planted = o.planted;
  return m;
}

// One Trace per rank (each rank's own view: its records and its full_params()).
struct DpRun {
  std::vector<Trace> ranks;
  // Rank 0's memory books: the model state when the last optimizer step began, the peak (its
  // breakdown and phase), and each category's own peak.
  comm::MemoryBreakdown model_state{}, at_peak{}, category_peaks{};
  std::string peak_phase{};
  std::size_t resident_params = 0;
};

inline DpRun dp_run(const Scenario& s, int world, DataParallelOptions options) {
  const ref::Dataset ds = dataset_of(s);
  DpRun out;
  out.ranks.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  sim::SimWorld(world).run([&](comm::Communicator& c) {
    MeshEngine engine(c, s.model, s.train, s.seed, dp_mesh(c.size(), options));
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    Trace& mine = out.ranks[static_cast<std::size_t>(c.rank())];
    for (int n = 1; n <= s.train.steps; ++n) {
      const ref::Batch local =
          rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size(), options.planted);
      mine.steps.push_back(engine.step(local));
      mine.params.push_back(engine.full_params());
    }
    if (c.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      out.model_state = engine.last_model_state();
      out.at_peak = c.memory().at_peak();
      out.category_peaks = c.memory().category_peaks();
      out.peak_phase = c.memory().peak_phase();
      out.resident_params = engine.resident_param_elems();
    }
  });
  return out;
}

struct Parity {
  double loss = 0.0;    // max over steps and ranks
  double params = 0.0;  // max over steps, ranks and tensors
  std::string worst;    // where the largest error was
  double max() const { return std::max(loss, params); }
};

inline Parity compare(const Trace& want, const DpRun& got) {
  Parity p;
  for (std::size_t r = 0; r < got.ranks.size(); ++r) {
    const Trace& run = got.ranks[r];
    if (run.steps.size() != want.steps.size()) return {INFINITY, INFINITY, "missing steps"};
    for (std::size_t k = 0; k < want.steps.size(); ++k) {
      const double le = rel_err(run.steps[k].loss, want.steps[k].loss);
      if (!(le <= p.loss)) {
        p.loss = le;
        if (p.loss >= p.params)
          p.worst = "rank " + std::to_string(r) + " step " + std::to_string(k + 1) + " loss";
      }
      for (const auto& e : want.params[k]) {
        const ref::Tensor<double>* t = run.params[k].find(e.name);
        const double te = t ? tensor_rel_err(*t, e.value) : INFINITY;
        if (!(te <= p.params)) {
          p.params = te;
          if (p.params >= p.loss)
            p.worst = "rank " + std::to_string(r) + " step " + std::to_string(k + 1) + " " + e.name;
        }
      }
    }
  }
  return p;
}

inline constexpr double kF64Tolerance = 1e-10;
inline constexpr double kF32Tolerance = 1e-5;

}  // namespace shardcheck::parallel::test
