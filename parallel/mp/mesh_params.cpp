#include "parallel/mp/mesh_params.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <tuple>

#include "parallel/flops.hpp"
#include "parallel/mp/mesh_walk.hpp"
#include "parallel/mp/pipeline.hpp"
#include "parallel/testing.hpp"
#include "reference/model.hpp"

namespace shardcheck::parallel {

int64_t LocalParam::global_index(int64_t i) const {
  if (split == TpSplit::replicated || local_shape.size() < 2) return i;
  const int64_t cols = local_shape[1];
  const int64_t r = i / cols, c = i % cols;
  if (split == TpSplit::rows)
    return r < local_shape[0] - pad ? (offset + r) * global_shape[1] + c : -1;
  return c < cols - pad ? r * global_shape[1] + offset + c : -1;
}

std::vector<LocalParam::Run> LocalParam::runs() const {
  if (split != TpSplit::columns) {
    const int64_t n =
        ref::numel_of(local_shape) - (split == TpSplit::rows ? pad * local_shape[1] : 0);
    if (n <= 0) return {};
    return {{0, global_index(0), n}};
  }
  std::vector<Run> out;
  const int64_t cols = local_shape[1], real = cols - pad;
  if (real <= 0) return out;
  for (int64_t r = 0; r < local_shape[0]; ++r)
    out.push_back({r * cols, global_index(r * cols), real});
  return out;
}

std::vector<std::pair<int, int>> virtual_stage_layers(const ref::ModelConfig& model, int pp,
                                                      int virtual_stages) {
  const double s = static_cast<double>(model.seq_len);
  std::vector<double> cost;
  for (int i = 0; i < model.layers; ++i) cost.push_back(block_forward_flops(model, i, s));
  const double head = head_forward_flops(model, s);
  const int chunks = pp * virtual_stages;
  // partition_layers is O(chunks x layers^2) and every rank's parameters, ledger and stage plan
  // ask for it: remembered per (profile, head, chunks), a pure function's cache (the planner's
  // search asks for the same few partitions millions of times).
  using Key = std::tuple<std::vector<double>, double, int>;
  static std::mutex mu;
  static std::map<Key, std::vector<std::pair<int, int>>> memo;
  Key key{std::move(cost), head, chunks};
  {
    const std::lock_guard<std::mutex> lock(mu);
    if (const auto it = memo.find(key); it != memo.end()) return it->second;
  }
  auto out = partition_layers(std::get<0>(key), 0.0, head, chunks);
  const std::lock_guard<std::mutex> lock(mu);
  if (memo.size() >= 1024) memo.clear();  // bounded: a long-running process sees many models
  memo.emplace(std::move(key), out);
  return out;
}

StagePlan stage_plan(const ref::ModelConfig& model, int pp, int virtual_stages, int stage) {
  const auto all = virtual_stage_layers(model, pp, virtual_stages);
  StagePlan plan;
  for (int c = 0; c < virtual_stages; ++c) {
    plan.chunk_layers.push_back(all[static_cast<std::size_t>(c * pp + stage)]);
  }
  plan.has_embed = stage == 0;
  plan.has_head = stage == pp - 1;
  return plan;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int expert_of(const std::string& name) {
  const auto at = name.find(".experts.");
  return at == std::string::npos ? -1 : std::stoi(name.substr(at + 9));
}

}  // namespace

std::vector<LocalParam> local_params(const ref::ModelConfig& model, const comm::DeviceMesh& mesh,
                                     int world_rank, int virtual_stages,
                                     testing::Mutation planted) {
  const int tp = mesh.size(comm::Axis::tp), ep = mesh.size(comm::Axis::ep);
  const int pp = mesh.size(comm::Axis::pp);
  const int t = mesh.coord(world_rank, comm::Axis::tp);
  const int e = mesh.coord(world_rank, comm::Axis::ep);
  const StagePlan plan =
      stage_plan(model, pp, virtual_stages, mesh.coord(world_rank, comm::Axis::pp));
  auto holds_layer = [&](int layer) {
    return std::any_of(plan.chunk_layers.begin(), plan.chunk_layers.end(),
                       [&](const auto& r) { return layer >= r.first && layer < r.second; });
  };
  const int d = model.head_dim();
  std::vector<LocalParam> out;
  // param_shapes' parts in its order (embedding, layers, head), only the layers this rank holds.
  for (int part = -1; part <= model.layers; ++part) {
    if (part >= 0 && part < model.layers && !holds_layer(part)) continue;
    for (const auto& [name, shape] : ref::part_param_shapes(model, part)) {
      LocalParam p;
      p.name = name;
      p.unit = part + 1;
      p.global_shape = shape;
      p.local_shape = shape;
      const int layer = part < model.layers ? part : -1;  // -1: the embedding or the head
      if (name == "embed.weight") {
        if (!plan.has_embed && !(plan.has_head && model.tie_embeddings)) continue;
        p.tied_copy = !plan.has_embed;
        p.split = TpSplit::rows;
      } else if (name == "lm_head.weight") {
        if (!plan.has_head) continue;
        p.split = TpSplit::columns;
      } else if (name == "final_norm.weight") {
        if (!plan.has_head) continue;
        p.tp_replicated = true;
      } else if (layer >= 0) {
        if (!holds_layer(layer)) continue;
        const int expert = expert_of(name);
        if (expert >= 0) {
          const int per = model.moe->experts / ep;
          if (expert / per != e) continue;
          p.expert = true;
          p.tp_replicated = true;
        } else if (ends_with(name, "attn.wq") || ends_with(name, "mlp.w_up") ||
                   ends_with(name, "mlp.w_gate")) {
          p.split = TpSplit::columns;
        } else if (ends_with(name, "attn.wk") || ends_with(name, "attn.wv")) {
          p.split = TpSplit::columns;
          // kv heads of TP rank t: [t*kv/tp, (t+1)*kv/tp), the ones its query heads read; with
          // tp > kv, the one kv head its query heads share, replicated on tp/kv consecutive ranks.
          const bool replicated = tp > model.kv_heads;
          p.kv_replicas = replicated ? tp / model.kv_heads : 1;
          const int64_t kv_cols = int64_t{replicated ? 1 : model.kv_heads / tp} * d;
          const int64_t first = replicated ? t / p.kv_replicas : t;
          p.offset = planted == testing::Mutation::kGqaWrongHeadMapping ? 0 : first * kv_cols;
          p.local_shape[1] = kv_cols;
        } else if (ends_with(name, "attn.wo") || ends_with(name, "mlp.w_down")) {
          p.split = TpSplit::rows;
        } else {
          p.tp_replicated = true;  // norms, router
        }
      }
      if (name == "embed.weight" || name == "lm_head.weight") {
        // Split over the padded vocabulary: a trailing slice past V is padding.
        const VocabShard v = vocab_shard(model.vocab, tp, t, model.vocab_pad_multiple);
        p.local_shape[name == "embed.weight" ? 0 : 1] = v.size;
        p.offset = v.offset;
        p.pad = v.size - v.real;
      } else if (p.split == TpSplit::rows) {
        p.local_shape[0] = shape[0] / tp;
        p.offset = t * p.local_shape[0];
      } else if (p.split == TpSplit::columns &&
                 !(ends_with(name, "attn.wk") || ends_with(name, "attn.wv"))) {
        p.local_shape[1] = shape[1] / tp;
        p.offset = t * p.local_shape[1];
      }
      out.push_back(std::move(p));
    }
  }
  return out;
}

bool chunk_writes(const ref::ModelConfig& model, const StagePlan& plan, int chunk, int vs,
                  int last_vs, const LocalParam& p) {
  const auto [first, last] = plan.chunk_layers[static_cast<std::size_t>(chunk)];
  if (p.unit > 0 && p.unit <= model.layers) return p.unit > first && p.unit <= last;
  if (p.unit == 0 && vs == 0) return true;
  return vs == last_vs && mesh_detail::head_completes(
                              mesh_detail::tied_done_at_head(model, plan.has_embed), model, p);
}

std::shared_ptr<const std::vector<LocalParam>> shared_local_params(const ref::ModelConfig& model,
                                                                   const comm::DeviceMesh& mesh,
                                                                   int world_rank,
                                                                   int virtual_stages) {
  // What local_params reads of the mesh and the rank: the tp, ep and pp sizes and the rank's
  // coordinates on them (not its dp or cp coordinate, nor the order).
  using Key = std::array<int, 7>;
  const Key key{mesh.size(comm::Axis::tp),
                mesh.size(comm::Axis::ep),
                mesh.size(comm::Axis::pp),
                mesh.coord(world_rank, comm::Axis::tp),
                mesh.coord(world_rank, comm::Axis::ep),
                mesh.coord(world_rank, comm::Axis::pp),
                virtual_stages};
  struct Cache {
    ref::ModelConfig model;
    std::map<Key, std::shared_ptr<const std::vector<LocalParam>>> params;
    std::size_t held = 0;  // parameters in the cache, all entries
  };
  thread_local Cache cache;
  // Bounded by the parameters held (names and shapes, about 100 bytes each).
  if (!(cache.model == model) || cache.held > (1U << 18)) cache = Cache{model, {}, 0};
  auto& slot = cache.params[key];
  if (!slot) {
    slot = std::make_shared<const std::vector<LocalParam>>(
        local_params(model, mesh, world_rank, virtual_stages));
    cache.held += slot->size();
  }
  return slot;
}

}  // namespace shardcheck::parallel
