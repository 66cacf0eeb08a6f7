// plan_skeleton.hpp's Skeleton: the spec from a scenario, the engine's timing-only run on it (plain
// or with its blocks replayed on a clock), the rules of the splits it makes and the key that names
// them, and the step's model and hardware FLOPs.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "harness/driver.hpp"
#include "harness/plan_skeleton.hpp"
#include "parallel/costs.hpp"
#include "parallel/flops.hpp"
#include "parallel/mp/mesh_rows.hpp"

namespace shardcheck::harness {

namespace costs = parallel::costs;

parallel::TimingSpec skeleton_spec(const Scenario& s, const ParallelSpec& p, int dp,
                                   int global_batch, const comm::DType* reduce_dtype) {
  ParallelSpec q = p;
  q.mesh.dp = dp;
  parallel::TimingSpec k;
  k.model = s.model;
  k.train = s.train;
  k.mesh = planning_options(s, q);
  k.recipe = parallel::recipe_of(s.train.precision);
  k.param_dtype = s.train.precision == ref::Precision::kBf16
                      ? comm::DType::bf16
                      : parallel::numeric_dtype(s.train.precision);
  k.grad_dtype = reduce_dtype ? *reduce_dtype : parallel::numeric_dtype(s.train.precision);
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

namespace {

// Hybrid shard's shard groups must tile the DP ranks: checked before the engine's groups are
// split (their colours assume it).
parallel::TimingSpec checked(parallel::TimingSpec spec) {
  const parallel::DataParallelRules rules = parallel::data_parallel_rules(spec.mesh);
  const int g = rules.fsdp.shard_group_size;
  if (rules.hybrid_shard && (g < 1 || spec.dp % g != 0))
    throw ScenarioError(
        "$.parallel.fsdp.shard_group_size",
        std::to_string(g) + " does not divide the DP size " + std::to_string(spec.dp));
  return spec;
}

}  // namespace

Skeleton::Skeleton(parallel::TimingSpec spec) : timing_(checked(std::move(spec))) {
  shard_size_ = hybrid_shard() ? timing_.rules().fsdp.shard_group_size : timing_.spec().dp;
}

void Skeleton::run_replaying(sim::SymmetricClock& clock) const {
  const parallel::BlockMemo memo = [&clock](std::uint64_t key, const std::function<void()>& ops) {
    clock.memo_region(key, ops);
  };
  timing_.run(clock, &memo);
}

std::vector<sim::SplitRule> Skeleton::splits() const {
  std::vector<sim::SplitRule> out;
  for (const parallel::mesh_detail::GroupSplit& g : timing_.group_splits())
    out.push_back(sim::SplitRule{g.color, [](int r) { return r; }});
  return out;
}

std::string Skeleton::split_key() const {
  const comm::MeshShape& m = mesh().shape();
  return "mesh " + std::to_string(m.dp) + " " + std::to_string(m.tp) + " " + std::to_string(m.pp) +
         " " + std::to_string(m.cp) + " " + std::to_string(m.ep) + " " + mesh().order_string() +
         " kv " + std::to_string(kv_replicas()) + " parts " + std::to_string(expert_parts()) +
         " moe " + std::to_string(spec().model.moe.has_value()) + " hybrid " +
         std::to_string(hybrid_shard()) + " shard " + std::to_string(shard_size_) + " planted " +
         std::to_string(static_cast<int>(spec().mesh.planted));
}

std::vector<std::string> Skeleton::block_groups() {
  using comm::Axis;
  return {std::string(comm::name_of(Axis::tp)), parallel::mesh_detail::kTpKvGroup,
          std::string(comm::name_of(Axis::cp)), std::string(comm::name_of(Axis::ep))};
}

double Skeleton::model_flops_per_step() const {
  return 3.0 * parallel::model_forward_flops(spec().model, spec().model.seq_len) *
         static_cast<double>(spec().local_batch) * spec().dp;
}

bool Skeleton::core_recomputed() const {
  return spec().train.recompute == ref::Recompute::kFull ||
         (spec().train.recompute == ref::Recompute::kSelective && !flash_style_attention());
}

double Skeleton::executed_attention_core() const {
  const ref::ModelConfig& m = spec().model;
  const double per = 14 + 4 * (core_recomputed() ? 1 : 0);
  if (!ring_attention())
    return costs::causal_attention_flops(m.seq_len, m.heads, m.head_dim(), per);
  // The ring: whole blocks of chunk pairs, alike on every CP rank at each step (CP rank 0's).
  const int p = mesh().size(comm::Axis::cp);
  double pairs = 0;
  for (int step = 0; step < p; ++step)
    pairs +=
        costs::ring_run_pairs(layout().cp_chunks(0), layout().cp_chunks((p - step) % p), false);
  return per * pairs * p * m.heads * static_cast<double>(m.head_dim());
}

double Skeleton::hardware_flops_per_step() const {
  const ref::ModelConfig& m = spec().model;
  const double s = m.seq_len;
  double recompute = 0;  // full: each block's forward; selective: its attention core
  for (int i = 0; i < m.layers; ++i)
    if (spec().train.recompute == ref::Recompute::kFull)
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
    const double n = static_cast<double>(layout().row_count());
    const double holders = static_cast<double>(mesh().size(comm::Axis::cp)) * spec().tp;
    const double rows = parallel::routed_rows_per_peer(parallel::moe_spec(m), m.seq_len, n, ep(),
                                                       spec().moe_routing) *
                        ep() * holders;
    const double passes = 3 + (spec().train.recompute == ref::Recompute::kFull ? 1 : 0);
    for (int i = 0; i < m.layers; ++i)
      if (m.is_moe_layer(i))
        routed += (rows - s * m.moe->top_k) * 2.0 * m.mlp_matrices() * m.hidden * m.ffn * passes;
  }
  const double sequences = static_cast<double>(spec().local_batch) * spec().dp;
  return model_flops_per_step() +
         (recompute + routed + m.layers * (executed_attention_core() - convention)) * sequences;
}

}  // namespace shardcheck::harness
