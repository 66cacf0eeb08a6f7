// The shapes of plan_skeleton.hpp's Skeleton, worked out once per configuration and shared by
// its runs: the spec from a scenario, the groups its splits make (and the key that names their
// rules), and the step's model and hardware FLOPs.
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "harness/driver.hpp"
#include "harness/plan_skeleton.hpp"
#include "parallel/costs.hpp"
#include "parallel/flops.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/mesh_rows.hpp"

namespace shardcheck::harness {

namespace {

namespace costs = parallel::costs;

}  // namespace

SkeletonSpec skeleton_spec(const Scenario& s, const ParallelSpec& p, int dp, int global_batch,
                           const comm::DType* reduce_dtype) {
  ParallelSpec q = p;
  q.mesh.dp = dp;
  SkeletonSpec k;
  k.model = s.model;
  k.train = s.train;
  k.mesh = planning_options(s, q);
  k.recipe = parallel::recipe_of(s.train.precision);
  k.param_dtype = s.train.precision == ref::Precision::kBf16 ? comm::DType::bf16
                                                             : numeric_dtype(s.train.precision);
  k.grad_dtype = reduce_dtype ? *reduce_dtype : numeric_dtype(s.train.precision);
  k.dp = dp;
  k.tp = p.mesh.tp;
  if (global_batch % dp != 0 || (global_batch / dp) % s.train.micro_batch != 0 ||
      global_batch / dp == 0)
    throw ScenarioError("$.train.global_batch", "global batch " + std::to_string(global_batch) +
                                                    " does not split into " + std::to_string(dp) +
                                                    " ranks x whole microbatches of " +
                                                    std::to_string(s.train.micro_batch));
  k.local_batch = global_batch / dp;
  k.moe_routing = s.plan.moe_routing == "capacity" ? parallel::MoeRouting::capacity
                                                   : parallel::MoeRouting::uniform;
  k.microbatch_presums = s.plan.bf16_rounding != "local";
  return k;
}

Skeleton::Skeleton(SkeletonSpec spec) : spec_(std::move(spec)) {
  const parallel::MeshOptions& o = spec_.mesh;
  const ref::ModelConfig& m = spec_.model;
  rules_ = parallel::data_parallel_rules(o);
  const parallel::FsdpOptions& f = rules_.fsdp;
  shard_size_ = spec_.dp;
  if (rules_.hybrid_shard) {
    if (f.shard_group_size < 1 || spec_.dp % f.shard_group_size != 0)
      throw ScenarioError("$.parallel.fsdp.shard_group_size", std::to_string(f.shard_group_size) +
                                                                  " does not divide the DP size " +
                                                                  std::to_string(spec_.dp));
    shard_size_ = f.shard_group_size;
  }
  elem_ = spec_.train.precision == ref::Precision::kF64 ? 8 : 4;
  wrap_of_ = parallel::mesh_detail::wrap_map(m, f);
  comm::MeshShape shape = o.shape;
  shape.dp = spec_.dp;
  shape.tp = spec_.tp;
  mesh_ = comm::DeviceMesh(shape, o.order);
  layout_ = parallel::TokenLayout(m.seq_len, shape.cp, shape.tp, o.sequence_parallel);
  parallel::MeshOptions on_mesh = o;
  on_mesh.shape = shape;
  group_splits_ = parallel::mesh_detail::group_splits(mesh_, m, spec_.train.precision, on_mesh);
}

std::vector<sim::SplitRule> Skeleton::splits() const {
  std::vector<sim::SplitRule> out;
  for (const parallel::mesh_detail::GroupSplit& g : group_splits_)
    out.push_back(sim::SplitRule{g.color, [](int r) { return r; }});
  return out;
}

std::string Skeleton::split_key() const {
  const comm::MeshShape& m = mesh_.shape();
  return "mesh " + std::to_string(m.dp) + " " + std::to_string(m.tp) + " " + std::to_string(m.pp) +
         " " + std::to_string(m.cp) + " " + std::to_string(m.ep) + " " + mesh_.order_string() +
         " kv " + std::to_string(kv_replicas()) + " parts " + std::to_string(expert_parts()) +
         " moe " + std::to_string(spec_.model.moe.has_value()) + " hybrid " +
         std::to_string(hybrid_shard()) + " shard " + std::to_string(shard_size_) + " planted " +
         std::to_string(static_cast<int>(spec_.mesh.planted));
}

std::vector<std::string> Skeleton::block_groups() {
  using comm::Axis;
  return {std::string(comm::name_of(Axis::tp)), parallel::mesh_detail::kTpKvGroup,
          std::string(comm::name_of(Axis::cp)), std::string(comm::name_of(Axis::ep))};
}

double Skeleton::model_flops_per_step() const {
  return 3.0 * parallel::model_forward_flops(spec_.model, spec_.model.seq_len) *
         static_cast<double>(spec_.local_batch) * spec_.dp;
}

bool Skeleton::core_recomputed() const {
  return spec_.train.recompute == ref::Recompute::kFull ||
         (spec_.train.recompute == ref::Recompute::kSelective && !flash_style_attention());
}

double Skeleton::executed_attention_core() const {
  const ref::ModelConfig& m = spec_.model;
  const double per = 14 + 4 * (core_recomputed() ? 1 : 0);
  if (!ring_attention())
    return costs::causal_attention_flops(m.seq_len, m.heads, m.head_dim(), per);
  // The ring: whole blocks of chunk pairs, alike on every CP rank at each step (CP rank 0's).
  const int p = mesh_.size(comm::Axis::cp);
  double pairs = 0;
  for (int step = 0; step < p; ++step)
    pairs += costs::ring_run_pairs(layout_.cp_chunks(0), layout_.cp_chunks((p - step) % p), false);
  return per * pairs * p * m.heads * static_cast<double>(m.head_dim());
}

double Skeleton::hardware_flops_per_step() const {
  const ref::ModelConfig& m = spec_.model;
  const double s = m.seq_len;
  double recompute = 0;  // full: each block's forward; selective: its attention core
  for (int i = 0; i < m.layers; ++i)
    if (spec_.train.recompute == ref::Recompute::kFull)
      recompute += parallel::block_forward_flops(m, i, s);
    else if (core_recomputed())
      recompute += parallel::attention_core_flops(m, s);
  // Each layer's attention core as the kernel executes it instead of the full s x s forward and
  // backward (and recompute) of the model FLOPs' convention.
  const double convention =
      parallel::attention_core_flops(m, s) * (3 + (core_recomputed() ? 1 : 0));
  // MoE layers: the experts' rows as executed instead of the convention's s x k, forward, backward
  // and recompute: ep_moe.hpp's routed_rows_per_peer on each of the cp x tp ranks holding a
  // sequence's rows, each routing its n of them (without SP every TP rank routes the same n: the
  // experts are not split over TP).
  double routed = 0;
  if (m.moe) {
    const double n = static_cast<double>(layout_.row_count());
    const double holders = static_cast<double>(mesh_.size(comm::Axis::cp)) * spec_.tp;
    const double rows = parallel::routed_rows_per_peer(parallel::moe_spec(m), m.seq_len, n, ep(),
                                                       spec_.moe_routing) *
                        ep() * holders;
    const double passes = 3 + (spec_.train.recompute == ref::Recompute::kFull ? 1 : 0);
    for (int i = 0; i < m.layers; ++i)
      if (m.is_moe_layer(i)) routed += (rows - s * m.moe->top_k) * 4 * m.hidden * m.ffn * passes;
  }
  const double sequences = static_cast<double>(spec_.local_batch) * spec_.dp;
  return model_flops_per_step() +
         (recompute + routed + m.layers * (executed_attention_core() - convention)) * sequences;
}

}  // namespace shardcheck::harness
