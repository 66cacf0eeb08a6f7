// The `plan` object of report.json (plan.hpp's plan_json): each candidate's timing, memory row
// and goodput, the scaling curves, and the formulas and assumptions behind them (the same words
// as harness/PLANNER.md).
#include <string>
#include <vector>

#include "harness/plan.hpp"
#include "harness/plan_text.hpp"

namespace shardcheck::harness {

namespace {

nlohmann::json eval_json(const StepEval& e) {
  return {{"step_time_s", e.step_time_s},
          {"compute_s", e.compute_s},
          {"comm_s", e.comm_s},
          {"exposed_comm_s", e.exposed_comm_s},
          {"comm_ops_per_step", e.comm_ops},
          {"upper_bound", e.asymmetric}};
}

nlohmann::json points_json(const std::vector<ScalePoint>& pts) {
  nlohmann::json a = nlohmann::json::array();
  for (const ScalePoint& p : pts) {
    nlohmann::json j{{"world_size", p.world_size}, {"global_batch", p.global_batch}};
    if (!p.valid) {
      j["valid"] = false;
      j["why_not"] = p.why_not;
    } else {
      j["step_time_s"] = p.eval.step_time_s;
      j["exposed_comm_s"] = p.eval.exposed_comm_s;
      j["tokens_per_s"] = p.tokens_per_s;
      j["efficiency"] = p.efficiency;
      j["memory_per_rank_bytes"] = p.memory_per_rank_bytes;
      j["fits"] = p.fits;
    }
    a.push_back(j);
  }
  return a;
}

nlohmann::json goodput_json(const Goodput& g) {
  nlohmann::json j{{"valid", g.valid},
                   {"failure_rate_per_s", g.failure_rate_per_s},
                   {"job_mtbf_s", g.job_mtbf_s},
                   {"young_interval_steps", g.young_interval_steps},
                   {"fraction_at_young", g.fraction_at_young}};
  if (g.valid) {
    j["interval_s"] = g.interval_s;
    j["fraction"] = g.fraction;
    j["effective_tokens_per_s"] = g.effective_tokens_per_s;
  } else {
    j["fraction"] = nullptr;
  }
  if (!g.note.empty()) j["note"] = g.note;
  return j;
}

nlohmann::json memory_json(int rank, const parallel::LedgerRow& l) {
  return {{"rank", rank},
          {"params", l.params},
          {"grads", l.grads},
          {"grad_peak", l.grads_at_peak()},
          {"optimizer", l.optimizer},
          {"gather_peak", l.gather_peak},
          {"activation_peak", l.activation_peak},
          {"total", l.total()}};
}

}  // namespace

nlohmann::json plan_json(const PlanResult& r) {
  nlohmann::json cands = nlohmann::json::array();
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    const ConfigPlan& c = r.configs[i];
    nlohmann::json j{{"config", c.config},
                     {"mesh", c.config},
                     {"world_size", c.world_size},
                     {"modelled", c.modelled},
                     {"note", c.note}};
    if (!c.not_built.empty()) {
      for (const char* k : {"step_time_s", "memory_per_rank_bytes", "memory", "fits", "placement",
                            "tokens_per_s", "mfu", "goodput"})
        j[k] = nullptr;
      cands.push_back(j);
      continue;
    }
    j["memory_per_rank_bytes"] = c.memory_per_rank_bytes;
    j["memory"] = memory_json(c.memory_rank, c.ledger);
    j["memory"]["source"] = "mesh engine ledger";
    if (!c.stages.empty()) {
      nlohmann::json st = nlohmann::json::array();
      for (std::size_t k = 0; k < c.stages.size(); ++k) {
        st.push_back(memory_json(c.stages[k].rank, c.stages[k].row));
        st.back()["stage"] = k;
      }
      j["memory_per_stage"] = st;
    }
    j["fits"] = c.fits;
    nlohmann::json place = nlohmann::json::array();
    for (const AxisPlacement& x : c.placement)
      place.push_back({{"axis", comm::name_of(x.axis)},
                       {"size", x.size},
                       {"groups", x.groups},
                       {"groups_crossing_nodes", x.crossing},
                       {"nodes_spanned", x.nodes_spanned},
                       {"link", x.inter_node() ? "inter_node" : "intra_node"},
                       {"bandwidth_gbps", x.bandwidth_gbps},
                       {"latency_us", x.latency_us}});
    j["placement"] = place;
    if (!c.modelled) {
      for (const char* k : {"step_time_s", "tokens_per_s", "mfu", "goodput"}) j[k] = nullptr;
      cands.push_back(j);
      continue;
    }
    j["strategy"] = c.strategy;
    j["best"] = static_cast<int>(i) == r.best;
    j.update(eval_json(c.eval));
    j["bubble_fraction"] = c.bubble_fraction;
    j["bubble_formula"] = c.bubble_formula;
    j["tokens_per_step"] = c.tokens_per_step;
    j["tokens_per_s"] = c.tokens_per_s;
    j["model_flops_per_step"] = c.model_flops_per_step;
    j["tflops_per_gpu"] = c.model_flops_per_step / c.eval.step_time_s / c.world_size / 1e12;
    j["mfu"] = c.mfu;
    j["hfu"] = c.hfu;
    j["goodput"] = c.goodput.valid ? nlohmann::json(c.goodput.fraction) : nlohmann::json(nullptr);
    j["effective_tokens_per_s"] = c.goodput.valid ? nlohmann::json(c.goodput.effective_tokens_per_s)
                                                  : nlohmann::json(nullptr);
    j["goodput_detail"] = goodput_json(c.goodput);
    if (c.simulated) {
      j["simulated_step_time_s"] = c.simulated->step_time_s;
      j["simulated_rel_diff"] = c.simulated_rel_diff;
      j["simulated_wall_s"] = c.simulated->wall_s;
    }
    j["scaling"] = {{"strong", points_json(c.strong)}, {"weak", points_json(c.weak)}};
    cands.push_back(j);
  }
  const auto label = [&](int i) {
    return i < 0 ? nlohmann::json(nullptr)
                 : nlohmann::json(r.configs[static_cast<std::size_t>(i)].config);
  };
  nlohmann::json out{{"candidates", cands}, {"best", label(r.best)}, {"fastest", label(r.fastest)}};
  if (r.scaling_config >= 0) {
    const ConfigPlan& c = r.configs[static_cast<std::size_t>(r.scaling_config)];
    out["scaling"] = {
        {"config", c.config}, {"strong", points_json(c.strong)}, {"weak", points_json(c.weak)}};
    nlohmann::json g = goodput_json(c.goodput);
    g["config"] = c.config;
    out["goodput"] = g;
  }
  out["formulas"] = {
      {"step_time",
       "mean over simulated steps of one step's virtual time (all ranks alike, so "
       "the max over ranks is any rank's)"},
      {"exposed_comm", "step time - compute-stream busy time"},
      {"bubble_fraction",
       "mean over pipeline stages of the compute stream's idle share of the step timed with "
       "communication free (the schedule's bubble, uneven stages included; one representative "
       "rank per stage); 0 without a pipeline; bubble_formula (p-1)/(v*m+p-1) beside it"},
      {"tokens_per_s",
       "train.global_batch * model.seq_len / step time (every token counted as "
       "non-padding)"},
      {"mfu",
       "3 * forward FLOPs of parallel/flops.hpp (matmuls + attention s^2, recompute not "
       "counted) * global batch / (step time * world * peak)"},
      {"hfu",
       "the FLOPs the kernels execute (activation-checkpointing recompute counted, each "
       "attention core as its kernel computes it: causal pairs, the ring's whole blocks) / (step "
       "time * world * peak); at most the compute efficiency"},
      {"scaling_efficiency",
       "T_n / (T_0 * n / n_0), T = tokens/s, n_0 the smallest valid world "
       "size; strong: global batch fixed; weak: per-rank batch fixed"},
      {"goodput",
       "tau/(tau+delta) * (1 - lambda*((tau+delta)/2 + R)), lambda = world / "
       "(mtbf_gpu_hours*3600), tau = checkpoint_every_steps * step time, delta = "
       "checkpoint_save_s, R = restart_s; Young's interval sqrt(2*delta/lambda)"},
      {"memory_per_rank",
       "the fullest rank's params + max(grads, gradient peak) + optimizer + all-gather peak + "
       "activation peak, from the mesh engine's ledger (parallel/mp/mesh_ledger.hpp)"},
      {"placement",
       "per axis, the groups of the order string's mesh against ranks_per_node; a group "
       "spanning two nodes is priced at the inter-node link"}};
  out["assumptions"] = {{"compute_efficiency", r.compute_efficiency},
                        {"gradient_reduce_dtype", r.reduce_dtype},
                        {"attention_kernel", r.attention_kernel},
                        {"moe_routing", r.moe_routing},
                        {"bf16_rounding", r.bf16_rounding},
                        {"gemm_model", r.gemm_model},
                        {"evaluation",
                         "symmetric clock: one representative rank with the "
                         "simulator's cost model (sim/topology.hpp)"}};
  out["wall_s"] = r.wall_s;
  return out;
}

}  // namespace shardcheck::harness
