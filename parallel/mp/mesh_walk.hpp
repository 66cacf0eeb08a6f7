// The order of one chunk's forward and backward on a rank of the mesh engine, written once: its
// steps (the embedding, each layer, the head), the wrap units each step uses (ZeRO-3 / FSDP
// residency, mesh_residency.hpp), the parameters whose gradient each backward step completes for
// the microbatch (DDP's buckets, ZeRO-3's per-microbatch reductions: mesh_grad_units.hpp), and
// the walk over the microbatch's sequences. The numeric engine (mesh_chunks.cpp), its ledger
// (mesh_ledger.cpp) and the planner's timing-only run (mesh_timing.cpp) all walk it.
//
// Forward: the embedding (first virtual stage), each layer, the head (last virtual stage); each
// step uses its units once, then runs every sequence of the microbatch. Backward: the head with
// the tied embedding, each layer in reverse, then the embedding's backward (it uses no
// parameters); each step uses its units, runs every sequence (full recompute: the layer's forward
// again first), then states what it completed.
#pragma once

#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/tokens.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel::mesh_detail {

// Whether the head's backward completes p's gradient: the final norm, an untied head, and the tied
// embedding's copy when `embedding` (tied, and the stage does not also hold the embedding, whose
// backward writes it later: tied_done_at_head).
inline bool head_completes(bool embedding, const ref::ModelConfig& model, const LocalParam& p) {
  if (p.unit == 0) return embedding;
  return p.unit == model.layers + 1;
}
inline bool tied_done_at_head(const ref::ModelConfig& model, bool holds_embedding) {
  return model.tie_embeddings && !holds_embedding;
}

struct ChunkStep {
  enum class Part { embed, layer, head };
  Part part = Part::layer;
  int layer = -1;          // Part::layer
  std::vector<int> units;  // the wrap units it uses (none: the embedding's backward)
  int own = 0;             // the layerwise unit whose parameters it runs (LocalParam::unit)
  // Part::head: its backward completes the tied embedding's copy (head_completes).
  bool completes_embedding = false;

  // Backward: whether this step completes p's gradient for the microbatch.
  bool completes(const LocalParam& p) const {
    if (part == Part::head && p.unit == 0) return completes_embedding;
    return p.unit == own;
  }
};

// The steps of a chunk of layers [first, last) in order; first_stage / last_stage: it is virtual
// stage 0 / the last; holds_embedding: its stage holds virtual stage 0 (StagePlan::has_embed);
// wrap_of: layerwise unit (layerwise.hpp: 0 embedding, 1..L blocks, L+1 head) -> wrap unit.
inline std::vector<ChunkStep> chunk_steps(const ref::ModelConfig& model,
                                          const std::map<int, int>& wrap_of,
                                          std::pair<int, int> layers, bool first_stage,
                                          bool last_stage, bool holds_embedding, bool forward) {
  std::vector<ChunkStep> steps;
  const auto add = [&](ChunkStep::Part part, int layer, std::vector<int> units) {
    const int own = part == ChunkStep::Part::embed   ? 0
                    : part == ChunkStep::Part::layer ? layer + 1
                                                     : model.layers + 1;
    steps.push_back(ChunkStep{.part = part,
                              .layer = layer,
                              .units = std::move(units),
                              .own = own,
                              .completes_embedding = tied_done_at_head(model, holds_embedding)});
  };
  const auto add_head = [&] {
    if (!last_stage) return;
    std::vector<int> units = {wrap_of.at(model.layers + 1)};
    if (model.tie_embeddings) units.push_back(wrap_of.at(0));
    add(ChunkStep::Part::head, -1, std::move(units));
  };
  if (forward) {
    if (first_stage) add(ChunkStep::Part::embed, -1, {wrap_of.at(0)});
    for (int layer = layers.first; layer < layers.second; ++layer)
      add(ChunkStep::Part::layer, layer, {wrap_of.at(layer + 1)});
    add_head();
  } else {
    add_head();
    for (int layer = layers.second - 1; layer >= layers.first; --layer)
      add(ChunkStep::Part::layer, layer, {wrap_of.at(layer + 1)});
    if (first_stage) add(ChunkStep::Part::embed, -1, {});
  }
  return steps;
}

// The groups of units the steps use, in order (the residency's callback uses).
inline std::vector<std::vector<int>> step_uses(const std::vector<ChunkStep>& steps) {
  std::vector<std::vector<int>> uses;
  for (const ChunkStep& s : steps)
    if (!s.units.empty()) uses.push_back(s.units);
  return uses;
}

// A forward: for each step, v.use() (its units), then v.forward(step, i) for each sequence i.
template <class V>
void walk_forward(const std::vector<ChunkStep>& steps, int sequences, V&& v) {
  for (const ChunkStep& s : steps) {
    v.use();
    for (int i = 0; i < sequences; ++i) v.forward(s, i);
  }
}

// A backward: for step k, v.use() when it uses units, v.begin(k), for each sequence i
// v.recompute(step, i) (full recompute, layers) then v.backward(step, i), and v.complete(step, k).
template <class V>
void walk_backward(const std::vector<ChunkStep>& steps, int sequences, bool full_recompute, V&& v) {
  for (std::size_t k = 0; k < steps.size(); ++k) {
    const ChunkStep& s = steps[k];
    if (!s.units.empty()) v.use();
    v.begin(k);
    for (int i = 0; i < sequences; ++i) {
      if (full_recompute && s.part == ChunkStep::Part::layer) v.recompute(s, i);
      v.backward(s, i);
    }
    v.complete(s, k);
  }
}

// What a pipeline message between chunks holds (run_pipeline's activation_shape): the
// microbatch's rows of this rank, [micro batch x rows, h].
inline ref::Shape chunk_activation_shape(const ref::ModelConfig& m, const TokenLayout& layout,
                                         int micro_batch) {
  return ref::Shape{int64_t{micro_batch} * layout.row_count(), m.hidden};
}

}  // namespace shardcheck::parallel::mesh_detail
