// ZeRO-3 / FSDP gradient reduction by flat buffer during the backward, shared by the mesh engine
// (mesh_engine.cpp), its ledger (mesh_ledger.cpp) and the planner's step skeleton. As PyTorch FSDP
// and DeepSpeed ZeRO-3 do by default, a microbatch's gradient of a flat buffer (one wrap unit's
// class, mesh_zero.hpp) is reduce_scattered as soon as the backward has written all of it, and
// only the reduced shard is accumulated over the microbatches: the buffer's unsharded gradient
// lives from the backward step that first writes it until its reduce_scatter completes. One
// reduce_scatter is in flight at a time (issuing the next waits for it, so it overlaps the next
// step's compute); the callback's end waits for the last.
//
// A buffer qualifies when the backward of one local chunk writes all of it and no other chunk
// writes any of it. The tied embedding under a pipeline or virtual stages (two chunks write it,
// and the stages' copies are summed first) and a unit whose layers lie in two chunks stay in the
// step's full accumulator and are reduced at the step's end, as ZeRO-2 is.
//
// A chunk's backward runs in steps (mesh_walk.hpp's chunk_steps): the head with the tied
// embedding, then each layer in reverse, then, on virtual stage 0, the embedding's backward.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/mesh_walk.hpp"
#include "parallel/mp/mesh_zero.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel::mesh_detail {

// Per flat class (flat_classes' order): the local chunk whose backward reduces it every
// microbatch, or -1 (reduced at the step's end). All -1 unless zero == 3.
inline std::vector<int> unit_reduce_chunks(const ref::ModelConfig& model, const StagePlan& plan,
                                           int pp, int virtual_stages, int stage, int zero,
                                           const std::vector<LocalParam>& specs,
                                           const std::vector<FlatClass>& classes) {
  std::vector<int> out(classes.size(), -1);
  if (zero != 3) return out;
  const int last_vs = pp * virtual_stages - 1;
  const auto writer = [&](const LocalParam& p) {
    if (p.unit == 0 && model.tie_embeddings && last_vs > 0) return -1;  // the embedding
    for (int c = 0; c < virtual_stages; ++c)
      if (chunk_writes(model, plan, c, c * pp + stage, last_vs, p)) return c;
    return -1;
  };
  for (std::size_t ci = 0; ci < classes.size(); ++ci) {
    int chunk = -2;
    for (const std::size_t k : classes[ci].specs) {
      const int w = writer(specs[k]);
      chunk = chunk == -2 || chunk == w ? w : -1;
    }
    out[ci] = chunk < 0 ? -1 : chunk;
  }
  return out;
}

struct UnitReduceSchedule {
  // Per step (chunk_steps' backward): the classes whose unsharded gradient starts before the
  // step's compute, and those complete after it (in class order).
  std::vector<std::vector<std::size_t>> alloc, ready;
};

// The backward of local chunk `chunk` (virtual stage vs of last_vs); reduce_chunk from
// unit_reduce_chunks.
inline UnitReduceSchedule unit_reduce_schedule(const ref::ModelConfig& model,
                                               const std::map<int, int>& wrap_of,
                                               const StagePlan& plan, int chunk, int vs,
                                               int last_vs, const std::vector<LocalParam>& specs,
                                               const std::vector<FlatClass>& classes,
                                               const std::vector<int>& reduce_chunk) {
  const std::vector<ChunkStep> steps =
      chunk_steps(model, wrap_of, plan.chunk_layers[static_cast<std::size_t>(chunk)], vs == 0,
                  vs == last_vs, plan.has_embed, false);
  // The step after which the chunk's backward has written p for the last time.
  const auto done_at = [&](const LocalParam& p) -> std::size_t {
    for (std::size_t j = 0; j < steps.size(); ++j)
      if (steps[j].completes(p)) return j;
    return 0;
  };
  UnitReduceSchedule s;
  s.alloc.resize(steps.size());
  s.ready.resize(steps.size());
  for (std::size_t ci = 0; ci < classes.size(); ++ci) {
    if (reduce_chunk[ci] != chunk) continue;
    std::size_t ready = 0;
    for (const std::size_t k : classes[ci].specs) ready = std::max(ready, done_at(specs[k]));
    std::size_t begin = ready;
    for (std::size_t j = 0; j < begin; ++j) {
      const std::vector<int>& units = steps[j].units;
      if (std::find(units.begin(), units.end(), classes[ci].unit) != units.end()) begin = j;
    }
    s.alloc[begin].push_back(ci);
    s.ready[ready].push_back(ci);
  }
  return s;
}

// The unsharded gradient elements held at once at most during a backward with this schedule
// (sizes: elements per class), replaying the engine: a step's buffers start, its compute runs,
// then each ready class's reduce_scatter is issued after the one in flight completes (freed).
inline int64_t unit_reduce_peak(const UnitReduceSchedule& s, const std::vector<int64_t>& sizes) {
  int64_t held = 0, peak = 0;
  std::ptrdiff_t in_flight = -1;
  for (std::size_t j = 0; j < s.alloc.size(); ++j) {
    for (const std::size_t ci : s.alloc[j]) held += sizes[ci];
    peak = std::max(peak, held);
    for (const std::size_t ci : s.ready[j]) {
      if (in_flight >= 0) held -= sizes[static_cast<std::size_t>(in_flight)];
      in_flight = static_cast<std::ptrdiff_t>(ci);
    }
  }
  return peak;
}

}  // namespace shardcheck::parallel::mesh_detail
