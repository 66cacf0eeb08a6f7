// mesh_ledger (mesh_ledger.hpp): the engine's buffers rule by rule, its residency and activation
// holdings replayed over the rank's pipeline schedule.
#include "parallel/mp/mesh_ledger.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "comm/memory.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_grad_units.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/mesh_walk.hpp"
#include "parallel/mp/mesh_zero.hpp"

namespace shardcheck::parallel {
namespace {

// The replay's Ops: nothing moves, only each unit's unsharded size is known.
struct CountedGathers {
  struct Pending {};
  const std::map<int, int64_t>* sizes = nullptr;
  Pending issue(int /*unit*/) { return {}; }
  void complete(Pending& /*p*/) {}
  void release(int /*unit*/) {}
  int64_t elems(int unit) const {
    const auto it = sizes->find(unit);
    return it == sizes->end() ? 0 : it->second;
  }
};

struct Shape {
  double s, h, cp_rows, rows, hl, kvl, d, fl, vocab_local;
  int cp, tp;
};

Shape shape_of(const ref::ModelConfig& m, const MeshOptions& o) {
  const int tp = o.shape.tp, cp = o.shape.cp;
  const bool sp = o.sequence_parallel && tp > 1;
  Shape x{};
  x.s = m.seq_len;
  x.h = m.hidden;
  x.cp_rows = x.s / cp;
  x.rows = sp ? x.cp_rows / tp : x.cp_rows;
  x.hl = static_cast<double>(m.heads) / tp;
  x.kvl = std::max(1, m.kv_heads / tp);
  x.d = m.head_dim();
  x.fl = static_cast<double>(m.ffn) / tp;
  x.vocab_local = static_cast<double>(m.padded_vocab(tp)) / tp;  // padding included
  x.cp = cp;
  x.tp = tp;
  return x;
}

// mesh_detail::wrap_map, remembered per thread for the last model and wrap policy: a search asks
// for it with every ledger. The reference is valid until the next call on the thread.
const std::map<int, int>& wrap_of(const ref::ModelConfig& model, const FsdpOptions& f) {
  struct Last {
    ref::ModelConfig model;
    WrapPolicy wrap = WrapPolicy::block;
    int blocks_per_unit = 0;
    std::map<int, int> map;
  };
  thread_local std::optional<Last> last;
  if (!last || last->wrap != f.wrap || last->blocks_per_unit != f.blocks_per_unit ||
      !(last->model == model))
    last = Last{model, f.wrap, f.blocks_per_unit, mesh_detail::wrap_map(model, f)};
  return last->map;
}

double head_elems(const Shape& x) {
  // x, rstd (own rows); y_full, logits (vocab split over TP), row max and sum (CP rank's rows).
  return x.rows * x.h + x.rows + x.cp_rows * x.h + x.cp_rows * x.vocab_local + 2 * x.cp_rows;
}

}  // namespace

double mesh_block_activation_elems(const ref::ModelConfig& m, const MeshOptions& o, int layer,
                                   ref::Recompute recompute) {
  const Shape x = shape_of(m, o);
  if (recompute == ref::Recompute::kFull) return x.rows * x.h;  // the block's input only
  // x_in, a, x_mid, b and the two rstd on the rank's own rows; a gathered to the CP rank's rows;
  // q, k, v, o on them (TP-split heads).
  double e = 4 * x.rows * x.h + 2 * x.rows + x.cp_rows * x.h +
             x.cp_rows * (2 * x.hl * x.d + 2 * x.kvl * x.d);
  if (o.cp_algo == CpAlgo::ring && x.cp > 1) {
    // The ring's q, k, v, o and the log-sum-exp per (local head, row): no probabilities.
    e += x.cp_rows * (2 * x.hl * x.d + 2 * x.kvl * x.d) + x.hl * x.cp_rows;
  } else {
    // Ulysses (or one CP rank): q, k, v of the whole sequence for heads / cp, and the
    // probabilities [heads / tp / cp, s, s] unless the attention core is recomputed (a flash
    // kernel: a log-sum-exp per row and head instead, whatever the recompute).
    e += x.s * (x.hl / x.cp) * x.d + 2 * x.s * (x.kvl / x.cp) * x.d;
    if (o.attention == AttentionKernel::flash)
      e += (x.hl / x.cp) * x.s;
    else if (recompute != ref::Recompute::kSelective)
      e += (x.hl / x.cp) * x.s * x.s;
  }
  const double mlp_kept = m.gated_mlp() ? 3 : 2;  // the MLP's up, act; gate (SwiGLU)
  if (m.is_moe_layer(layer)) {
    const double experts = m.moe->experts, k = m.moe->top_k, f = m.ffn;
    const double cap = std::ceil(m.moe->capacity_factor * x.s * k / experts - 1e-9);
    const double local = experts / o.shape.ep;
    const double n = x.rows;
    e += n * (x.h + experts + k) + std::min(n * k, experts * cap) * x.h +
         o.shape.ep * std::min(n * k, local * cap) * (x.h + mlp_kept * f);
  } else {
    e += x.cp_rows * x.h + mlp_kept * x.cp_rows * x.fl;  // b gathered; the MLP's caches
  }
  return e;
}

LedgerRow mesh_ledger(const ref::ModelConfig& model, const ref::TrainConfig& train,
                      const MeshOptions& options, int world_rank) {
  return mesh_ledger_modes(model, train, options, world_rank, {&train.recompute, 1})[0];
}

namespace {

// mesh_ledger_modes of options already validated (validate_mesh).
std::vector<LedgerRow> validated_ledger_modes(const ref::ModelConfig& model,
                                              const ref::TrainConfig& train,
                                              const MeshOptions& options, int world_rank,
                                              std::span<const ref::Recompute> modes) {
  MeshOptions o = options;
  const DataParallelRules rules = data_parallel_rules(o);
  o.zero = rules.zero;
  const comm::DeviceMesh mesh(o.shape, o.order);
  const Recipe r = recipe_of(train.precision);
  const FsdpOptions& f = rules.fsdp;
  const std::map<int, int>& wrap = wrap_of(model, f);

  // Model state: the optimizer's flat buffers and their shards.
  const std::shared_ptr<const std::vector<LocalParam>> params =
      shared_local_params(model, mesh, world_rank, o.virtual_stages);
  const std::vector<LocalParam>& specs = *params;
  const auto wrap_unit = [&](const LocalParam& p) { return wrap.at(p.unit); };
  const int cp = o.shape.cp, edp = mesh.size(comm::Axis::edp);
  const bool hybrid = rules.hybrid_shard;
  const int dense = (hybrid ? f.shard_group_size : o.shape.dp) * cp;
  const int expert = hybrid ? std::gcd(dense, edp) : edp;  // edp = dp x cp / ep
  const int pp = o.shape.pp, stage = mesh.coord(world_rank, comm::Axis::pp);
  const StagePlan plan = stage_plan(model, pp, o.virtual_stages, stage);
  LedgerRow row;
  // accumulated: what the step's gradient accumulator holds (ZeRO-3: the shards of the buffers
  // reduced every microbatch, mesh_grad_units.hpp); whole: the elements written into it at a
  // chunk's end (ZeRO-3: the other buffers).
  int64_t numel = 0, shards = 0, accumulated = 0, whole = 0;
  std::map<int, int64_t> unit_sizes;
  const std::vector<FlatClass> classes = flat_classes(specs, o.zero, wrap_unit);
  const std::vector<int> reduce_chunk = mesh_detail::unit_reduce_chunks(
      model, plan, pp, o.virtual_stages, stage, o.zero, specs, classes);
  std::vector<int64_t> class_elems;
  for (std::size_t ci = 0; ci < classes.size(); ++ci) {
    const FlatClass& c = classes[ci];
    const int d = c.expert ? expert : dense;
    const int64_t sh = shard_elems(c.numel, d, o.zero);
    numel += c.numel;
    shards += sh;
    accumulated += reduce_chunk[ci] >= 0 ? sh : c.numel;
    whole += reduce_chunk[ci] >= 0 ? 0 : c.numel;
    class_elems.push_back(c.numel);
    if (d > 1) unit_sizes[c.unit] += sh * d;
    if (o.zero > 0) row.padding_elems += static_cast<std::size_t>(sh * d - c.numel);
  }
  row.params = static_cast<std::size_t>(o.zero == 3 ? shards : numel) * r.param;
  row.grads = static_cast<std::size_t>(o.zero >= 2 ? shards : numel) * r.grad;
  row.optimizer = static_cast<std::size_t>(shards) * r.optimizer();
  const bool microbatch_grads =
      train.precision == ref::Precision::kBf16 || rules.no_shard || o.zero == 3;
  // ZeRO-3: the unsharded microbatch gradients of the buffers reduced during a backward, at their
  // most in any chunk's.
  int64_t unit_peak = 0;
  if (o.zero == 3)
    for (int c = 0; c < o.virtual_stages; ++c)
      unit_peak =
          std::max(unit_peak, mesh_detail::unit_reduce_peak(
                                  mesh_detail::unit_reduce_schedule(
                                      model, wrap, plan, c, c * pp + stage,
                                      pp * o.virtual_stages - 1, specs, classes, reduce_chunk),
                                  class_elems));
  // bf16 with MoE: the microbatch's expert gradients kept per data rank until rounded
  // (mesh_bf16.hpp), as many as the engine's parts.
  int64_t part_elems = 0;
  if (train.precision == ref::Precision::kBf16 && model.moe) {
    const int parts = mesh_detail::expert_part_count(mesh, world_rank);
    for (const LocalParam& p : specs)
      if (p.expert) part_elems += parts * ref::numel_of(p.local_shape);
  }
  row.grad_peak =
      static_cast<std::size_t>(accumulated) * r.grad +
      static_cast<std::size_t>((microbatch_grads ? whole : 0) + part_elems + unit_peak) *
          r.microbatch_grad;

  // The pipeline schedule replayed: units gathered and freed, activations kept from each
  // (microbatch, chunk) forward to its backward.
  const int microbatches = static_cast<int>(train.global_batch / o.shape.dp / train.micro_batch);
  comm::MemoryTracker mem;
  std::unique_ptr<mesh_detail::Residency<CountedGathers>> res;
  if (o.zero == 3) {
    res = std::make_unique<mesh_detail::Residency<CountedGathers>>(
        CountedGathers{&unit_sizes}, mem, r.param,
        mesh_detail::Residency<CountedGathers>::Options{
            .prefetch = f.prefetch, .keep_after_forward = rules.keep_after_forward});
  }
  const Shape x = shape_of(model, o);
  const double mbs = train.micro_batch;
  // What each of the rank's chunks holds per microbatch (and its widest block's whole cache), and
  // the units its forward and backward use: the same for every microbatch, so computed once.
  struct ChunkHold {
    std::vector<double> held;  // per mode
    double widest = 0;
    std::vector<std::vector<int>> uses[2];  // [backward, forward]
  };
  std::vector<ChunkHold> chunks(static_cast<std::size_t>(o.virtual_stages));
  for (int c = 0; c < o.virtual_stages; ++c) {
    ChunkHold& h = chunks[static_cast<std::size_t>(c)];
    const int vs = c * pp + stage;
    const bool last = vs == pp * o.virtual_stages - 1;
    const auto layers = plan.chunk_layers[static_cast<std::size_t>(c)];
    if (res)
      for (const bool forward : {false, true})
        h.uses[forward] = mesh_detail::step_uses(
            mesh_detail::chunk_steps(model, wrap, layers, vs == 0, last, plan.has_embed, forward));
    h.held.assign(modes.size(), last ? head_elems(x) : 0.0);
    for (int l = layers.first; l < layers.second; ++l) {
      for (std::size_t k = 0; k < modes.size(); ++k)
        h.held[k] += mesh_block_activation_elems(model, o, l, modes[k]);
      h.widest =
          std::max(h.widest, mesh_block_activation_elems(model, o, l, ref::Recompute::kNone));
    }
    for (double& e : h.held) e *= mbs;
  }
  std::vector<double> act(modes.size(), 0.0), peak(modes.size(), 0.0);
  // The (chunk, direction) callbacks replayed from an idle residency back to idle: another from
  // idle repeats their bytes exactly and cannot raise the peak, so it is not replayed (without
  // units kept after the forward, every callback is one of these).
  std::set<std::pair<int, bool>> idle_to_idle;
  for (const PipeAction& a :
       pipeline_schedule(o.schedule, pp, stage, microbatches, o.virtual_stages)) {
    const bool forward = a.kind == PipeAction::Kind::forward;
    const ChunkHold& h = chunks[static_cast<std::size_t>(a.chunk)];
    if (res && !(res->idle() && idle_to_idle.contains({a.chunk, forward}))) {
      const bool from_idle = res->idle();
      const auto& uses = h.uses[forward];
      res->begin(a.microbatch, a.chunk, forward, uses);
      for (std::size_t i = 0; i < uses.size(); ++i) res->next();
      res->end();
      if (from_idle && res->idle()) idle_to_idle.insert({a.chunk, forward});
    }
    for (std::size_t k = 0; k < modes.size(); ++k) {
      if (forward) {
        act[k] += h.held[k];
        peak[k] = std::max(peak[k], act[k]);
      } else {
        // Full recompute: one block's whole cache at a time during the backward.
        if (modes[k] == ref::Recompute::kFull) peak[k] = std::max(peak[k], act[k] + h.widest);
        act[k] -= h.held[k];
      }
    }
  }
  row.gather_peak = mem.category_peaks()[comm::MemCategory::params];
  std::vector<LedgerRow> rows(modes.size(), row);
  // Saturated at 2^60 bytes (an exabyte): a hostile seq_len squared must not overflow the sums.
  for (std::size_t k = 0; k < modes.size(); ++k)
    rows[k].activation_peak =
        static_cast<std::size_t>(std::min(peak[k] * static_cast<double>(r.activation), 0x1p60));
  return rows;
}

}  // namespace

std::vector<LedgerRow> mesh_ledger_modes(const ref::ModelConfig& model,
                                         const ref::TrainConfig& train, const MeshOptions& options,
                                         int world_rank, std::span<const ref::Recompute> modes) {
  validate_mesh(model, train, options);
  return validated_ledger_modes(model, train, options, world_rank, modes);
}

namespace {

// What mesh_ledger reads of a rank's parameters: their units (wrap units and chunks), local
// shapes and the expert flag, in order. Ranks of one stage equal in these (TP ranks of a model
// whose heads, kv heads and FFN split evenly, the padded vocabulary always does; EP ranks holding
// as many experts) have the same row.
bool same_ledger_params(const std::vector<LocalParam>& a, const std::vector<LocalParam>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.unit == y.unit && x.expert == y.expert && x.local_shape == y.local_shape;
  });
}

}  // namespace

std::vector<RankLedger> mesh_ledger_stages(const ref::ModelConfig& model,
                                           const ref::TrainConfig& train,
                                           const MeshOptions& options) {
  return mesh_ledger_stages_modes(model, train, options, {&train.recompute, 1})[0];
}

std::vector<std::vector<RankLedger>> mesh_ledger_stages_modes(
    const ref::ModelConfig& model, const ref::TrainConfig& train, const MeshOptions& options,
    std::span<const ref::Recompute> modes) {
  validate_mesh(model, train, options);
  const comm::DeviceMesh mesh(options.shape, options.order);
  const auto stages = static_cast<std::size_t>(options.shape.pp);
  std::vector<std::vector<RankLedger>> best(modes.size(), std::vector<RankLedger>(stages));
  std::vector<bool> seen(stages, false);
  // mesh_ledger reads a rank only through its stage, its parameters (local_params: its TP and EP
  // coordinates) and its expert part count: ranks alike in those (the CP ranks, the expert-data
  // ranks, TP ranks with equal slices, EP ranks holding as many experts) have one row, computed
  // once (tests/mp: equal to every rank's own ledger).
  struct Computed {
    int stage = 0, parts = 0;
    std::shared_ptr<const std::vector<LocalParam>> params;
    std::vector<LedgerRow> rows;  // per mode
  };
  std::vector<Computed> computed;
  std::map<std::array<int, 4>, std::size_t> by_coord;  // -> computed
  // The parts are read only by the bf16 recipe with MoE (validated_ledger_modes).
  const bool parts_read = train.precision == ref::Precision::kBf16 && model.moe.has_value();
  for (int r = 0; r < options.shape.world_size(); ++r) {
    if (mesh.coord(r, comm::Axis::dp) != 0) continue;
    const int stage = mesh.coord(r, comm::Axis::pp);
    const int parts = parts_read ? mesh_detail::expert_part_count(mesh, r) : 0;
    const std::array<int, 4> key{stage, mesh.coord(r, comm::Axis::tp),
                                 mesh.coord(r, comm::Axis::ep), parts};
    auto it = by_coord.find(key);
    if (it == by_coord.end()) {
      auto params = shared_local_params(model, mesh, r, options.virtual_stages);
      std::size_t i = 0;
      while (i < computed.size() && !(computed[i].stage == stage && computed[i].parts == parts &&
                                      same_ledger_params(*computed[i].params, *params)))
        ++i;
      if (i == computed.size())
        computed.push_back(
            {stage, parts, params, validated_ledger_modes(model, train, options, r, modes)});
      it = by_coord.emplace(key, i).first;
    }
    const auto s = static_cast<std::size_t>(stage);
    for (std::size_t k = 0; k < modes.size(); ++k) {
      const LedgerRow& l = computed[it->second].rows[k];
      if (!seen[s] || l.total() > best[k][s].row.total()) best[k][s] = {r, l};
    }
    seen[s] = true;
  }
  return best;
}

RankLedger mesh_ledger_fullest(const ref::ModelConfig& model, const ref::TrainConfig& train,
                               const MeshOptions& options) {
  return fullest_of(mesh_ledger_stages(model, train, options));
}

RankLedger fullest_of(const std::vector<RankLedger>& stages) {
  return *std::max_element(stages.begin(), stages.end(), [](const auto& a, const auto& b) {
    return a.row.total() < b.row.total();
  });
}

std::vector<LedgerRow> mesh_ledger_ranks(const ref::ModelConfig& model,
                                         const ref::TrainConfig& train,
                                         const MeshOptions& options) {
  std::vector<LedgerRow> out;
  for (int rank = 0; rank < options.shape.world_size(); ++rank)
    out.push_back(mesh_ledger(model, train, options, rank));
  return out;
}

}  // namespace shardcheck::parallel
