// The search of plan_search.hpp: enumeration of the meshes and their settings, the engine's
// validation, the memory ledger, the compute bound, the planner's clock on a fixed-size batch of
// candidates at a time (threads), the ranking, and the best of each family with why it lost.
#include "harness/plan_search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <thread>

#include "harness/driver.hpp"
#include "harness/placement.hpp"
#include "harness/plan_skeleton.hpp"
#include "harness/plan_text.hpp"
#include "harness/workers.hpp"
#include "parallel/costs.hpp"
#include "parallel/flops.hpp"
#include "parallel/mp/mesh_ledger.hpp"
#include "parallel/mp/pipeline.hpp"

namespace shardcheck::harness {

namespace {

using Clock = std::chrono::steady_clock;
using plan_text::fmt;
using plan_text::gib;
using plan_text::kGiB;
// Candidates timed at once between two updates of the bound's threshold: fixed, so what is pruned
// does not depend on the machine's thread count.
constexpr std::size_t kBatch = 8;

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Rank orders tried: tensor parallelism innermost (the fastest link), then every arrangement of
// the context (with expert), data and pipeline axes. Orders that place every group alike give one
// candidate (the first).
const std::vector<std::string> kOrders = {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "tp-dp-cp-ep-pp",
                                          "tp-pp-cp-ep-dp", "tp-dp-pp-cp-ep", "tp-pp-dp-cp-ep"};

// The data-parallel settings of a mesh with dp ranks (pure: no model-parallel axis).
std::vector<parallel::DataParallel> dp_modes(int dp, bool pure, int ranks_per_node) {
  using parallel::Ddp, parallel::Zero, parallel::Fsdp, parallel::ShardingStrategy;
  if (dp == 1) return {Ddp{}};
  std::vector<parallel::DataParallel> m = {Ddp{},
                                           Zero{.stage = 1},
                                           Zero{.stage = 2},
                                           Zero{.stage = 3},
                                           Fsdp{},
                                           Fsdp{.sharding = ShardingStrategy::shard_grad_op}};
  if (pure) {
    m.push_back(Fsdp{.sharding = ShardingStrategy::no_shard});
    if (std::gcd(dp, ranks_per_node) < dp)
      m.push_back(Fsdp{.sharding = ShardingStrategy::hybrid_shard});
  }
  return m;
}

struct Schedule {
  parallel::PipeSchedule schedule;
  int virtual_stages;
};

std::vector<Schedule> schedules(int pp) {
  using parallel::PipeSchedule;
  if (pp == 1) return {{PipeSchedule::one_f_one_b, 1}};
  return {{PipeSchedule::one_f_one_b, 1},
          {PipeSchedule::gpipe, 1},
          {PipeSchedule::interleaved, 2},
          {PipeSchedule::interleaved, 4}};
}

std::string label_of(const ParallelSpec& p, int mb, ref::Recompute rc) {
  std::string l = p.label() + "-mb" + std::to_string(mb);
  if (rc != ref::Recompute::kNone) l += "-rc_" + ref::to_string(rc);
  return l;
}

// Scenario s with this micro batch and recompute (what the engine's options and ledger read).
Scenario with_train(const Scenario& s, int mb, ref::Recompute rc) {
  Scenario c = s;
  c.train.micro_batch = mb;
  c.train.recompute = rc;
  return c;
}

constexpr ref::Recompute kModes[] = {ref::Recompute::kNone, ref::Recompute::kSelective,
                                     ref::Recompute::kFull};

// The fullest rank under each of kModes (one residency replay for the three).
std::vector<parallel::RankLedger> fullest(const Scenario& s, const ParallelSpec& p) {
  const parallel::MeshOptions o = planning_options(s, p);
  std::vector<parallel::RankLedger> out;
  for (const auto& stages : parallel::mesh_ledger_stages_modes(s.model, s.train, o, kModes))
    out.push_back(parallel::fullest_of(stages));
  return out;
}

// What one candidate differs in from another, in words ("" when nothing).
std::string differences(const SearchCandidate& a, const SearchCandidate& b) {
  std::vector<std::string> d;
  const ParallelSpec &p = a.spec, &q = b.spec;
  for (comm::Axis x : comm::kAllAxes)
    if (p.mesh.size(x) != q.mesh.size(x))
      d.push_back(std::string(comm::name_of(x)) + " " + std::to_string(p.mesh.size(x)));
  if (p.data_parallel_words() != q.data_parallel_words()) d.push_back(p.data_parallel_words());
  if (p.sequence_parallel != q.sequence_parallel)
    d.push_back(p.sequence_parallel ? "sequence parallel" : "no sequence parallel");
  if (p.pp_schedule != q.pp_schedule || p.virtual_stages != q.virtual_stages)
    d.push_back(std::string(parallel::name_of(p.pp_schedule)) +
                (p.virtual_stages > 1 ? " x" + std::to_string(p.virtual_stages) : ""));
  if (a.micro_batch != b.micro_batch) d.push_back("micro batch " + std::to_string(a.micro_batch));
  if (a.recompute != b.recompute) d.push_back("recompute " + ref::to_string(a.recompute));
  if (p.order != q.order && p.label() != q.label()) d.push_back("order " + p.order);
  std::string s;
  for (const std::string& x : d) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Why a is slower than the best b: the step-time gap split into compute and the rest.
std::string behind(const SearchCandidate& a, const SearchCandidate& b) {
  const double gap = a.eval.step_time_s - b.eval.step_time_s;
  const double dc = a.eval.compute_s - b.eval.compute_s;
  const double dx = a.eval.exposed_comm_s - b.eval.exposed_comm_s;
  // Gaps in the unit of the best's step (s or ms), rounded to it: no 1e-19 s of float noise.
  const bool ms = b.eval.step_time_s < 1;
  const auto t = [&](double v, const char* spec) {
    const double u = ms ? v * 1e3 : v;
    return fmt(spec, std::fabs(u) < 5e-4 ? 0.0 : u) + (ms ? " ms" : " s");
  };
  std::string s = fmt("%.2f", a.eval.step_time_s / b.eval.step_time_s) + "x the best's step (" +
                  t(gap, "%+.3f") + ": compute " + t(dc, "%+.3f") +
                  ", exposed communication and bubble " + t(dx, "%+.3f") + ")";
  const std::string d = differences(a, b);
  if (!d.empty()) s += "; differs in " + d;
  return s;
}

// One order of a setting, its recompute modes lightest first (a heavier one that also fits only
// adds compute): those built but over device memory, then the first that fits, or why the rest is
// not built.
struct Tried {
  std::vector<SearchCandidate> over;
  std::optional<SearchCandidate> fit;
  std::size_t fit_at = 0;   // fit's recompute: 0 none, 1 selective, 2 full
  std::size_t refused = 0;  // recompute modes not built
  std::string not_built;
};

// A mesh's settings but the rank order and recompute (spec.order is the base's; every order of
// the mesh is tried), and what each order of them gives (tried, one per order).
struct Setting {
  ParallelSpec spec;
  int micro_batch = 1;
  std::string family;
  std::vector<Tried> tried;
};

struct MeshSettings {
  std::vector<std::pair<std::string, std::string>> refusals;  // family, why: the mesh refused
  std::vector<std::string> orders;                            // that place the groups apart
  std::vector<Setting> settings;
  ParallelSpec base;  // the mesh at its most permissive settings (its orders found from it)
};

// Tries every order of st: the engine's checks, then the ledger (one per recompute mode, shared
// by the orders: every order holds the same coordinates) against the device memory.
void try_setting(const Scenario& s, const std::vector<std::string>& orders, Setting& st,
                 double device_bytes) {
  std::vector<parallel::RankLedger> ledgers;  // per mode, once one is needed
  st.tried.assign(orders.size(), {});
  for (std::size_t o = 0; o < orders.size(); ++o) {
    Tried& t = st.tried[o];
    ParallelSpec p = st.spec;
    p.order = orders[o];
    for (std::size_t k = 0; k < 3; ++k) {
      const Scenario sc = with_train(s, st.micro_batch, kModes[k]);
      if (const std::string why = unsupported(sc, p); !why.empty()) {
        t.refused = 3 - k;
        t.not_built = why;
        break;
      }
      SearchCandidate c;
      c.spec = p;
      c.micro_batch = st.micro_batch;
      c.recompute = kModes[k];
      c.family = st.family;
      c.label = label_of(p, st.micro_batch, kModes[k]);
      if (ledgers.empty()) ledgers = fullest(sc, p);
      c.ledger = ledgers[k].row;
      c.memory_per_rank_bytes = c.ledger.total();
      if (static_cast<double>(c.memory_per_rank_bytes) > device_bytes) {
        t.over.push_back(std::move(c));
        continue;
      }
      t.fit = std::move(c);
      t.fit_at = k;
      break;
    }
  }
}

// Times `todo` on the workers (evaluate is independent per candidate).
void time_all(const std::vector<SearchCandidate*>& todo, const Scenario& s, const PlanOptions& po,
              Workers& workers) {
  workers.run(todo.size(), [&](std::size_t i) {
    SearchCandidate& c = *todo[i];
    const Scenario sc = with_train(s, c.micro_batch, c.recompute);
    c.eval = evaluate(sc, c.spec, c.spec.mesh.dp, s.train.global_batch, po, false, false);
    c.timed = true;
  });
}

}  // namespace

std::string family_of(const ParallelSpec& p) {
  if (p.mesh.ep > 1) return "+ EP";
  if (p.mesh.cp > 1) return "+ CP";
  if (p.mesh.pp > 1) return "TP + PP + DP";
  if (p.mesh.tp > 1) return p.shards_params() ? "FSDP + TP" : "TP + DP";
  return p.shards_params() ? "FSDP" : "DDP";
}

SearchResult search_plans(const Scenario& s, const SearchOptions& o) {
  const auto t0 = Clock::now();
  SearchResult r;
  r.scenario = s.name;
  r.attention_kernel = s.plan.attention_kernel;
  r.moe_routing = s.plan.moe_routing;
  r.bf16_rounding = s.plan.bf16_rounding;
  r.gemm_model = gemm_model_text(s.topology);
  r.world = o.world > 0 ? o.world : s.parallel.mesh.world_size();
  r.max_cp = o.max_cp;
  if (o.world < 0 || r.world < 1 || r.world > comm::kMaxWorldSize)
    throw ScenarioError("--world", "expected a world size from 1 to " +
                                       std::to_string(comm::kMaxWorldSize) + ", got " +
                                       std::to_string(o.world));
  if (o.top < 1) throw ScenarioError("--top", "expected at least 1 candidate");
  if (!(o.plan.compute_efficiency > 0 && o.plan.compute_efficiency <= 1))
    throw ScenarioError("--compute-efficiency", "expected a number in (0, 1]");
  r.top = o.top;
  r.global_batch = s.train.global_batch;
  r.device_memory_bytes = s.topology.memory_gib * kGiB;
  const ref::ModelConfig& m = s.model;
  const int rpn = s.topology.ranks_per_node;
  const std::vector<std::string> family_names = {"DDP",          "FSDP", "TP + DP", "FSDP + TP",
                                                 "TP + PP + DP", "+ CP", "+ EP"};
  std::map<std::string, FamilyBest> fam;
  std::map<std::string, std::string> fam_refusal;  // a family's first reason, when none is built
  for (const std::string& f : family_names) fam[f].family = f;
  std::vector<SearchCandidate> fitting;
  std::vector<MeshSettings> meshes;  // in enumeration order

  // A family's first refusal is what it says when none of its candidates is built.
  const auto refuse = [&](const std::string& family, const std::string& why) {
    if (fam_refusal[family].empty()) fam_refusal[family] = why;
  };
  // Every mesh of the world: tp x cp x pp x dp (ep among the dp*cp ranks), each CP algorithm.
  for (int tp : divisors(r.world))
    for (int cp : divisors(r.world / tp)) {
      if (cp > o.max_cp) continue;
      for (int pp : divisors(r.world / tp / cp)) {
        const int dp = r.world / tp / cp / pp;
        const std::vector<int> eps = m.moe ? divisors(dp * cp) : std::vector<int>{1};
        for (int ep : eps)
          for (const parallel::CpAlgo algo :
               cp > 1 ? std::vector<parallel::CpAlgo>{parallel::CpAlgo::ulysses,
                                                      parallel::CpAlgo::ring}
                      : std::vector<parallel::CpAlgo>{parallel::CpAlgo::ring}) {
            ++r.meshes;
            ParallelSpec base;
            base.mesh = comm::MeshShape{.dp = dp, .tp = tp, .pp = pp, .cp = cp, .ep = ep};
            base.cp_algo = algo;
            // The mesh's families: as it is, and with its parameters sharded (DDP and FSDP,
            // TP + DP and FSDP + TP are the same meshes).
            ParallelSpec sharded = base;
            sharded.data = parallel::Zero{.stage = 3};
            std::set<std::string> families = {family_of(base), family_of(sharded)};
            // The most permissive settings: a refusal here refuses every setting of the mesh.
            const Scenario plain = with_train(s, 1, ref::Recompute::kNone);
            MeshSettings& ms = meshes.emplace_back();
            if (const std::string why = unsupported(plain, base); !why.empty()) {
              ++r.meshes_not_built;
              for (const std::string& family : families)
                ms.refusals.emplace_back(family, "not built: " + why);
              continue;
            }
            ms.base = base;  // its orders: below, once the guard has seen a first count
            const bool pure = tp == 1 && pp == 1 && cp == 1 && ep == 1;
            for (const parallel::DataParallel& mode : dp_modes(dp, pure, rpn))
              for (const bool sp :
                   tp > 1 ? std::vector<bool>{true, false} : std::vector<bool>{false})
                for (const Schedule& sched : schedules(pp))
                  for (int mb : divisors(std::max(1, s.train.global_batch / dp))) {
                    if (mb > o.max_micro_batch) break;
                    Setting& st = ms.settings.emplace_back();
                    st.spec = base;
                    st.spec.data = mode;
                    st.spec.sequence_parallel = sp;
                    st.spec.pp_schedule = sched.schedule;
                    st.spec.virtual_stages = sched.virtual_stages;
                    st.micro_batch = mb;
                    st.family = family_of(st.spec);
                  }
          }
      }
    }

  // The guard sees the work twice: with one rank order per mesh (a lower bound, before placing
  // the groups of every order: that alone is seconds at a million ranks), then counted.
  SearchWork counted{r.world, r.meshes, r.meshes - r.meshes_not_built, 0, m.layers, false};
  for (const MeshSettings& ms : meshes) counted.candidates += 3 * ms.settings.size();
  if (o.check_work) o.check_work(counted);
  // Orders that place the groups differently.
  const Scenario plain = with_train(s, 1, ref::Recompute::kNone);
  for (MeshSettings& ms : meshes) {
    if (!ms.refusals.empty()) continue;
    std::set<std::string> placed;
    for (const std::string& order : kOrders) {
      ParallelSpec q = ms.base;
      q.order = order;
      if (!unsupported(plain, q).empty()) continue;
      if (placed.insert(placement_text(placement_of(plain, q))).second) ms.orders.push_back(order);
    }
  }
  counted.candidates = 0;
  counted.orders_counted = true;
  for (const MeshSettings& ms : meshes)
    counted.candidates += 3 * ms.orders.size() * ms.settings.size();
  if (o.check_work) o.check_work(counted);
  // Each setting's recompute modes in every order, on every thread: the ledger is the cost.
  std::vector<std::pair<const MeshSettings*, Setting*>> work;
  for (MeshSettings& ms : meshes)
    for (Setting& st : ms.settings) work.emplace_back(&ms, &st);
  Workers workers(std::max(1u, std::thread::hardware_concurrency()));
  workers.run(work.size(), [&](std::size_t i) {
    try_setting(s, work[i].first->orders, *work[i].second, r.device_memory_bytes);
  });
  // In enumeration order (mesh, order, setting), as one thread would have met them.
  for (const MeshSettings& ms : meshes) {
    for (const auto& [family, why] : ms.refusals) refuse(family, why);
    for (std::size_t k = 0; k < ms.orders.size(); ++k)
      for (const Setting& st : ms.settings) {
        const Tried& t = st.tried[k];
        FamilyBest& f = fam[st.family];
        r.candidates += 3;
        f.candidates += 3;
        for (const SearchCandidate& c : t.over) {
          ++r.not_fitting;
          if (!f.any_built || c.memory_per_rank_bytes < f.best.memory_per_rank_bytes) f.best = c;
          f.any_built = true;
        }
        if (t.fit) {
          f.any_built = true;
          r.recompute_pruned += 2 - t.fit_at;
          fitting.push_back(*t.fit);
        }
        if (!t.not_built.empty()) {
          r.not_built += t.refused;
          refuse(st.family, "not built: " + t.not_built);
        }
      }
  }

  r.enumerate_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // The bound of each fitting candidate, then timing in bound order. Candidates alike but for
  // their rank order first get one bound for all of them: the compute bound and the stage bound
  // of every order (stage_bound_any_order). A candidate's own order's stage bound is computed when
  // that does not rule it out (at once for a setting of one order, or when nothing is pruned).
  PlanOptions po = o.plan;
  po.steps = 1;
  const double peak = s.topology.peak_tflops * 1e12 * po.compute_efficiency;
  std::vector<std::vector<std::size_t>> alike;  // fitting's indices, alike but for the order
  {
    std::map<std::string, std::size_t> group;
    for (std::size_t i = 0; i < fitting.size(); ++i) {
      ParallelSpec q = fitting[i].spec;
      q.order = kOrders.front();
      const auto [it, fresh] =
          group.emplace(label_of(q, fitting[i].micro_batch, fitting[i].recompute), alike.size());
      if (fresh) alike.emplace_back();
      alike[it->second].push_back(i);
    }
  }
  const auto own_order_bound = [&](SearchCandidate& c) {
    const Scenario sc = with_train(s, c.micro_batch, c.recompute);
    c.bound_s = std::max(c.bound_s, stage_bound(sc, c.spec, s.train.global_batch, po));
    c.bound_own_order = true;
  };
  workers.run(alike.size(), [&](std::size_t g) {
    double any_order = 0;
    for (const std::size_t i : alike[g]) {
      SearchCandidate& c = fitting[i];
      const Scenario sc = with_train(s, c.micro_batch, c.recompute);
      const int dp = c.spec.mesh.dp;
      const Skeleton k(skeleton_spec(sc, c.spec, dp, s.train.global_batch,
                                     po.reduce_dtype ? &*po.reduce_dtype : nullptr));
      c.model_flops = k.model_flops_per_step();
      c.hardware_flops = k.hardware_flops_per_step();
      c.bound_s = c.hardware_flops / (r.world * peak);  // what the kernels execute, at peak
      if (c.spec.mesh.pp > 1)
        c.bubble_formula = parallel::bubble_formula(
            c.spec.mesh.pp, s.train.global_batch / dp / c.micro_batch, c.spec.virtual_stages);
      if (!o.prune || alike[g].size() == 1) {
        own_order_bound(c);
        continue;
      }
      if (i == alike[g].front())
        any_order = stage_bound_any_order(sc, c.spec, s.train.global_batch, po);
      c.bound_s = std::max(c.bound_s, any_order);
    }
  });
  std::sort(fitting.begin(), fitting.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
    return a.bound_s != b.bound_s ? a.bound_s < b.bound_s : a.label < b.label;
  });
  r.bound_wall_s = std::chrono::duration<double>(Clock::now() - t0).count() - r.enumerate_s;
  double own_order_s = 0;  // of the timing loop: own orders' stage bounds (counted in bounds)
  std::vector<double> best_times;  // sorted ascending, of the timed
  std::map<std::string, double> fam_best;
  for (std::size_t i = 0; i < fitting.size(); i += kBatch) {
    const double kth = best_times.size() >= static_cast<std::size_t>(o.top)
                           ? best_times[static_cast<std::size_t>(o.top) - 1]
                           : 1e300;
    // The bound and the step add the same seconds in other orders: where the step is all
    // compute and blocking collectives, the bound may exceed it by rounding (1e-15 relative).
    const auto ruled_out = [&](const SearchCandidate& c) {
      const auto fb = fam_best.find(c.family);
      const double threshold = std::max(kth, fb == fam_best.end() ? 1e300 : fb->second);
      return o.prune && c.bound_s > threshold * (1 + 1e-9);
    };
    std::vector<SearchCandidate*> todo, unplaced;
    for (std::size_t j = i; j < std::min(fitting.size(), i + kBatch); ++j) {
      SearchCandidate& c = fitting[j];
      if (ruled_out(c)) {
        ++r.bound_pruned;
        r.any_order_pruned += !c.bound_own_order;
      } else {
        (c.bound_own_order ? todo : unplaced).push_back(&c);
      }
    }
    const auto t1 = Clock::now();
    workers.run(unplaced.size(), [&](std::size_t k) { own_order_bound(*unplaced[k]); });
    own_order_s += std::chrono::duration<double>(Clock::now() - t1).count();
    for (SearchCandidate* c : unplaced) {
      if (ruled_out(*c))
        ++r.bound_pruned;
      else
        todo.push_back(c);
    }
    time_all(todo, s, po, workers);
    for (SearchCandidate* c : todo) {
      ++r.timed;
      const double t = c->eval.step_time_s;
      best_times.insert(std::upper_bound(best_times.begin(), best_times.end(), t), t);
      auto [it, fresh] = fam_best.emplace(c->family, t);
      if (!fresh) it->second = std::min(it->second, t);
    }
  }
  r.bound_wall_s += own_order_s;
  r.timing_s =
      std::chrono::duration<double>(Clock::now() - t0).count() - r.enumerate_s - r.bound_wall_s;
  for (SearchCandidate& c : fitting)
    if (c.timed) r.ranked.push_back(c);
  std::sort(
      r.ranked.begin(), r.ranked.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
        return a.eval.step_time_s != b.eval.step_time_s ? a.eval.step_time_s < b.eval.step_time_s
                                                        : a.label < b.label;
      });
  const double tokens = static_cast<double>(s.train.global_batch) * m.seq_len;
  for (SearchCandidate& c : r.ranked) {
    const double t = c.eval.step_time_s;
    c.tokens_per_s = tokens / t;
    c.mfu = c.model_flops / (t * r.world * s.topology.peak_tflops * 1e12);
    c.hfu = c.hardware_flops / (t * r.world * s.topology.peak_tflops * 1e12);
    const Goodput g = goodput_of(s.plan, r.world, t, c.tokens_per_s);
    c.goodput = g.valid ? g.fraction : 0;
  }
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    SearchCandidate& c = r.ranked[i];
    const double mem = static_cast<double>(c.memory_per_rank_bytes);
    const std::string fits =
        gib(mem) + " GiB of " + gib(r.device_memory_bytes) + ", exposed communication and bubble " +
        fmt("%.0f", 100 * c.eval.exposed_comm_s / c.eval.step_time_s) + "% of the step";
    c.reason =
        i == 0 ? "fastest that fits (" + fits + ")" : behind(c, r.ranked[0]) + " (" + fits + ")";
  }
  for (const std::string& name : family_names) {
    FamilyBest f = fam[name];
    if (name == "+ EP" && !m.moe) continue;
    const auto it = std::find_if(r.ranked.begin(), r.ranked.end(),
                                 [&](const SearchCandidate& c) { return c.family == name; });
    if (it != r.ranked.end()) {
      f.found = true;
      f.best = *it;
      const auto rank = it - r.ranked.begin();
      f.why = rank == 0 ? "the best overall"
                        : "rank " + std::to_string(rank + 1) + ": " + behind(*it, r.ranked[0]);
    } else if (f.any_built) {
      const parallel::LedgerRow& l = f.best.ledger;
      f.why = "nothing fits: the least memory, " + f.best.label + ", needs " +
              gib(static_cast<double>(f.best.memory_per_rank_bytes)) + " GiB of " +
              gib(r.device_memory_bytes) + " (" + plan_text::memory_parts(l) + ")";
    } else if (!fam_refusal[name].empty()) {
      f.why = fam_refusal[name];
    } else {
      f.why = "no mesh of this family on " + std::to_string(r.world) + " ranks";
    }
    r.families.push_back(f);
  }
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

nlohmann::json search_json(const SearchResult& r) {
  const auto cand = [&](const SearchCandidate& c) {
    const ParallelSpec& p = c.spec;
    nlohmann::json j{
        {"config", c.label},
        {"family", c.family},
        {"dp", p.mesh.dp},
        {"tp", p.mesh.tp},
        {"pp", p.mesh.pp},
        {"cp", p.mesh.cp},
        {"ep", p.mesh.ep},
        {"zero", p.zero_given()},
        {"fsdp", p.fsdp() ? nlohmann::json(std::string(parallel::name_of(p.fsdp()->sharding)))
                          : nlohmann::json(nullptr)},
        {"sequence_parallel", p.sequence_parallel},
        {"pp_schedule", std::string(parallel::name_of(p.pp_schedule))},
        {"virtual_stages", p.virtual_stages},
        {"cp_algo", p.mesh.cp > 1 ? nlohmann::json(std::string(parallel::name_of(p.cp_algo)))
                                  : nlohmann::json(nullptr)},
        {"order", p.order},
        {"micro_batch", c.micro_batch},
        {"activation_checkpointing", ref::to_string(c.recompute)},
        {"memory_per_rank_bytes", c.memory_per_rank_bytes}};
    if (c.timed) {
      j["step_time_s"] = c.eval.step_time_s;
      j["compute_s"] = c.eval.compute_s;
      j["exposed_comm_s"] = c.eval.exposed_comm_s;
      j["bubble_formula"] = c.bubble_formula;
      j["compute_bound_s"] = c.bound_s;
      j["tokens_per_s"] = c.tokens_per_s;
      j["mfu"] = c.mfu;
      j["hfu"] = c.hfu;
      j["goodput"] = c.goodput;
    }
    if (!c.reason.empty()) j["reason"] = c.reason;
    return j;
  };
  nlohmann::json top = nlohmann::json::array();
  for (std::size_t i = 0; i < r.ranked.size() && i < static_cast<std::size_t>(r.top); ++i) {
    top.push_back(cand(r.ranked[i]));
    top.back()["rank"] = i + 1;
  }
  nlohmann::json fams = nlohmann::json::array();
  for (const FamilyBest& f : r.families) {
    nlohmann::json j{
        {"family", f.family}, {"candidates", f.candidates}, {"fits", f.found}, {"why", f.why}};
    j["config"] = f.any_built || f.found ? cand(f.best) : nlohmann::json(nullptr);
    fams.push_back(j);
  }
  return {{"world_size", r.world},
          {"global_batch", r.global_batch},
          {"attention_kernel", r.attention_kernel},
          {"moe_routing", r.moe_routing},
          {"bf16_rounding", r.bf16_rounding},
          {"gemm_model", r.gemm_model},
          {"device_memory_bytes", r.device_memory_bytes},
          {"meshes",
           {{"considered", r.meshes}, {"not_built", r.meshes_not_built}, {"max_cp", r.max_cp}}},
          {"candidates",
           {{"enumerated", r.candidates},
            {"not_built", r.not_built},
            {"not_fitting", r.not_fitting},
            {"heavier_recompute_skipped", r.recompute_pruned},
            {"ruled_out_by_bound", r.bound_pruned},
            {"ruled_out_by_bound_of_every_order", r.any_order_pruned},
            {"timed", r.timed}}},
          {"top", top},
          {"best", r.ranked.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.ranked[0].label)},
          {"families", fams},
          {"wall_s", r.wall_s},
          {"wall_split_s",
           {{"enumerate_and_ledger", r.enumerate_s},
            {"bounds", r.bound_wall_s},
            {"timing", r.timing_s}}}};
}

}  // namespace shardcheck::harness
