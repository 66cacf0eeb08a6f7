// Helpers of the mesh engine's tests (mesh_test.cpp, mesh_zero_test.cpp): the scenarios, a run on
// the simulator with parity against the reference, and per-rank memory.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "parallel/mp/mesh_engine.hpp"
#include "sim/world.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::mesh_test {

using test::Parity;
using test::Scenario;

// Dense: 4 layers (pp 4), heads 4 / kv 2, vocab 32, S 16 (cp 4: 8 chunks of 2), dropout on.
inline Scenario mesh_dense() {
  Scenario s;
  s.name = "mesh-dense";
  s.model.vocab = 32;
  s.model.hidden = 16;
  s.model.layers = 4;
  s.model.heads = 4;
  s.model.kv_heads = 2;
  s.model.ffn = 24;
  s.model.seq_len = 16;
  s.model.dropout = 0.1;
  s.train.steps = 2;
  s.train.global_batch = 16;
  s.train.micro_batch = 2;
  s.train.optimizer.lr = 5e-3;
  s.train.clip_grad_norm = 0.05;
  s.data.documents = 200;
  s.data.min_len = 3;
  s.data.max_len = 20;
  return s;
}

inline Scenario mesh_moe() {
  Scenario s = mesh_dense();
  s.name = "mesh-moe";
  s.model.dropout = 0.0;
  s.model.tie_embeddings = false;
  s.model.moe = ref::MoeConfig{
      .experts = 4, .top_k = 2, .capacity_factor = 1.0, .every = 2, .aux_loss = 0.01};
  return s;
}

inline test::DpRun mesh_run(const Scenario& s, const MeshOptions& o) {
  const ref::Dataset ds = test::dataset_of(s);
  test::DpRun out;
  const int world = o.shape.world_size();
  out.ranks.resize(static_cast<std::size_t>(world));
  sim::SimWorld(world).run([&](comm::Communicator& c) {
    MeshEngine engine(c, s.model, s.train, s.seed, o);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    test::Trace& mine = out.ranks[static_cast<std::size_t>(c.rank())];
    for (int n = 1; n <= s.train.steps; ++n) {
      const ref::Batch local = rank_batch(ds, sampler.next_global_batch(), engine.data_rank(),
                                          engine.data_world(), o.planted);
      mine.steps.push_back(engine.step(local));
      mine.params.push_back(engine.full_params());
    }
  });
  return out;
}

inline Parity parity(const Scenario& s, const MeshOptions& o) {
  return test::compare(test::reference_run(s), mesh_run(s, o));
}

struct Case {
  const char* name;
  MeshOptions options;
};

inline MeshOptions mesh(comm::MeshShape shape) {
  MeshOptions o;
  o.shape = shape;
  return o;
}

inline MeshOptions zero(MeshOptions o, int stage) {
  o.zero = stage;
  return o;
}

// Per rank: the tracker's category peaks over two steps, and the model state at the last
// optimizer.
struct RankMemory {
  comm::MemoryBreakdown peaks, model_state, after;
};

inline std::vector<RankMemory> mesh_memory(const Scenario& s, const MeshOptions& o) {
  const ref::Dataset ds = test::dataset_of(s);
  std::vector<RankMemory> out(static_cast<std::size_t>(o.shape.world_size()));
  sim::SimWorld(o.shape.world_size()).run([&](comm::Communicator& c) {
    MeshEngine e(c, s.model, s.train, s.seed, o);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    for (int n = 1; n <= s.train.steps; ++n)
      e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
    RankMemory& m = out[static_cast<std::size_t>(c.rank())];
    m.peaks = c.memory().category_peaks();
    m.model_state = e.last_model_state();
    m.after = c.memory().current();
  });
  return out;
}

inline std::size_t of(const comm::MemoryBreakdown& b, comm::MemCategory c) {
  return b[c];
}

}  // namespace shardcheck::parallel::mesh_test
