// The mesh ledger (parallel/mp/mesh_ledger.hpp) against the tracker of the engine it describes:
// on every rank of model-parallel meshes (TP with and without SP, PP schedules, CP ring and
// Ulysses, ZeRO and FSDP on the DP axis, FSDP units kept from forward to backward in a pipeline)
// and for each recompute mode, the model state, the gathered-unit peak and the activation peak
// are the ledger's to the byte (dense model). The parameters a search remembers per rank are the
// rank's own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "parallel/mp/mesh_ledger.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "tests/mp/mesh_support.hpp"

namespace shardcheck::parallel {
namespace {

using namespace mesh_test;  // NOLINT

std::vector<Case> ledger_cases() {
  MeshOptions sp = mesh({.dp = 2, .tp = 2});
  sp.sequence_parallel = true;
  MeshOptions inter = zero(mesh({.dp = 2, .pp = 2}), 1);
  inter.schedule = PipeSchedule::interleaved;
  inter.virtual_stages = 2;
  MeshOptions gpipe = mesh({.tp = 2, .pp = 2});
  gpipe.schedule = PipeSchedule::gpipe;
  MeshOptions ulysses = mesh({.dp = 2, .cp = 2});
  ulysses.cp_algo = CpAlgo::ulysses;
  MeshOptions hybrid = mesh({.dp = 4, .tp = 2});
  hybrid.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard,
                            .reshard_after_forward = false,
                            .prefetch = 0,
                            .shard_group_size = 2};
  MeshOptions groups = mesh({.dp = 2, .tp = 2, .pp = 2});
  groups.fsdp = FsdpOptions{.wrap = WrapPolicy::layer_group, .blocks_per_unit = 2, .prefetch = 2};
  MeshOptions keep = mesh({.dp = 2, .pp = 2});
  keep.schedule = PipeSchedule::interleaved;
  keep.virtual_stages = 2;
  keep.fsdp = FsdpOptions{.sharding = ShardingStrategy::shard_grad_op, .prefetch = 1};
  MeshOptions sp_fsdp = sp;
  sp_fsdp.fsdp = FsdpOptions{.prefetch = 1};
  return {{"dp4 zero3 tied", zero(mesh({.dp = 4}), 3)},
          {"dp2-tp2 sp fsdp", sp_fsdp},
          {"tp2", mesh({.tp = 2})},
          {"dp2-tp2 sp", sp},
          {"dp2-pp2 interleaved zero1", inter},
          {"tp2-pp2 gpipe", gpipe},
          {"dp2-cp2 ring zero2", zero(mesh({.dp = 2, .cp = 2}), 2)},
          {"dp2-cp2 ulysses", ulysses},
          {"dp4-tp2 hybrid keep", hybrid},
          {"dp2-tp2-pp2 fsdp groups pf2", groups},
          {"dp2-pp2 interleaved shard_grad_op", keep}};
}

TEST(MeshLedger, EqualsTheTrackerOnEveryRank) {
  for (const ref::Recompute mode :
       {ref::Recompute::kNone, ref::Recompute::kSelective, ref::Recompute::kFull}) {
    for (const Case& c : ledger_cases()) {
      Scenario s = mesh_dense();
      s.train.recompute = mode;
      const std::vector<RankMemory> got = mesh_memory(s, c.options);
      const std::vector<LedgerRow> want = mesh_ledger_ranks(s.model, s.train, c.options);
      ASSERT_EQ(got.size(), want.size());
      const std::string what = std::string(c.name) + " " + ref::to_string(mode);
      for (std::size_t r = 0; r < got.size(); ++r) {
        using comm::MemCategory;
        const RankMemory& m = got[r];
        const LedgerRow& l = want[r];
        EXPECT_EQ(of(m.model_state, MemCategory::params), l.params) << what << " rank " << r;
        EXPECT_EQ(of(m.model_state, MemCategory::grads), l.grads) << what << " rank " << r;
        EXPECT_EQ(of(m.model_state, MemCategory::optimizer), l.optimizer) << what << " rank " << r;
        EXPECT_EQ(of(m.peaks, MemCategory::grads), l.grad_peak) << what << " rank " << r;
        EXPECT_EQ(of(m.peaks, MemCategory::params) - l.params, l.gather_peak)
            << what << " rank " << r;
        EXPECT_EQ(of(m.peaks, MemCategory::activations), l.activation_peak)
            << what << " rank " << r;
      }
      std::printf("%-30s %-9s rank 0: state %zu B, gather peak %zu B, activations %zu B\n", c.name,
                  ref::to_string(mode).c_str(), want[0].model_state(), want[0].gather_peak,
                  want[0].activation_peak);
    }
  }
}

// MoE layers: model state exact (experts sharded over expert DP, also with EP folded over CP and
// hybrid shard groups), and the ledger bounds the data-dependent expert buffers from above.
TEST(MeshLedger, BoundsMoeActivations) {
  const Scenario s = mesh_moe();
  MeshOptions folded = mesh({.dp = 4, .cp = 2, .ep = 2});
  folded.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 2};
  for (const MeshOptions& o : {mesh({.dp = 4, .ep = 2}), mesh({.dp = 2, .tp = 2, .ep = 2}),
                               zero(mesh({.dp = 2, .cp = 2, .ep = 4}), 3), folded}) {
    const std::vector<RankMemory> got = mesh_memory(s, o);
    const std::vector<LedgerRow> want = mesh_ledger_ranks(s.model, s.train, o);
    for (std::size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(of(got[r].model_state, comm::MemCategory::params), want[r].params) << r;
      EXPECT_EQ(of(got[r].model_state, comm::MemCategory::grads), want[r].grads) << r;
      EXPECT_EQ(of(got[r].model_state, comm::MemCategory::optimizer), want[r].optimizer);
      EXPECT_LE(of(got[r].peaks, comm::MemCategory::activations), want[r].activation_peak);
    }
  }
}

// The bf16 recipe with EP keeps each microbatch's expert gradients per data rank until it rounds
// them: the ledger's gradient peak counts those parts as the tracker does.
TEST(MeshLedger, Bf16ExpertPartsInTheGradientPeak) {
  Scenario s = mesh_moe();
  s.train.precision = ref::Precision::kBf16;
  for (const MeshOptions& o :
       {mesh({.dp = 2, .ep = 2}), mesh({.dp = 4, .ep = 4}), mesh({.dp = 2, .cp = 2, .ep = 2}),
        mesh({.dp = 2}), zero(mesh({.dp = 2, .ep = 2}), 3), zero(mesh({.dp = 4}), 3)}) {
    const std::vector<RankMemory> got = mesh_memory(s, o);
    const std::vector<LedgerRow> want = mesh_ledger_ranks(s.model, s.train, o);
    for (std::size_t r = 0; r < got.size(); ++r)
      EXPECT_EQ(of(got[r].peaks, comm::MemCategory::grads), want[r].grad_peak)
          << "dp" << o.shape.dp << " cp" << o.shape.cp << " ep" << o.shape.ep << " rank " << r;
  }
}

// ZeRO-3 / FSDP reduce-scatter each unit's microbatch gradient during the backward
// (mesh_grad_units.hpp): the gradient peak is the accumulated shards and the unsharded gradients
// of at most two units at once, far below ZeRO-2's full accumulator, in f64 and in bf16.
TEST(MeshLedger, Zero3HoldsAUnitsGradientNotTheModels) {
  Scenario s = mesh_dense();
  s.model.layers = 16;
  for (const ref::Precision precision : {ref::Precision::kF64, ref::Precision::kBf16}) {
    s.train.precision = precision;
    const LedgerRow z2 = mesh_ledger(s.model, s.train, zero(mesh({.dp = 4}), 2), 0);
    const LedgerRow z3 = mesh_ledger(s.model, s.train, zero(mesh({.dp = 4}), 3), 0);
    EXPECT_EQ(z3.grads, z2.grads);  // the reduced shards when the optimizer runs
    EXPECT_LT(z3.grad_peak, z2.grad_peak / 2) << ref::to_string(precision);
    std::printf("%s grad peak: zero2 %zu B, zero3 %zu B (shards %zu B)\n",
                ref::to_string(precision).c_str(), z2.grad_peak, z3.grad_peak, z3.grads);
  }
}

// mesh_ledger_stages_modes computes one row per (stage, parameters, expert part count) for every
// recompute mode at once: each stage's fullest row under each mode is still the largest of its
// ranks' own ledgers under that mode, on dense and MoE meshes with CP, EP, hybrid shard and the
// bf16 recipe. Fails if mesh_ledger comes to read another coordinate of the rank, or a mode's
// activations leak into another's.
TEST(MeshLedger, StagesEqualTheFullestOfEveryRanksOwnLedger) {
  std::vector<std::pair<Scenario, MeshOptions>> cases;
  for (const Case& c : ledger_cases()) cases.emplace_back(mesh_dense(), c.options);
  Scenario bf16 = mesh_moe();
  bf16.train.precision = ref::Precision::kBf16;
  MeshOptions folded = mesh({.dp = 4, .cp = 2, .ep = 2});
  folded.fsdp = FsdpOptions{.sharding = ShardingStrategy::hybrid_shard, .shard_group_size = 2};
  for (const MeshOptions& o : {mesh({.dp = 4, .ep = 2}), mesh({.dp = 2, .tp = 2, .ep = 2}),
                               zero(mesh({.dp = 2, .cp = 2, .ep = 4}), 3), folded}) {
    cases.emplace_back(mesh_moe(), o);
    cases.emplace_back(bf16, o);
  }
  const ref::Recompute modes[] = {ref::Recompute::kFull, ref::Recompute::kNone,
                                  ref::Recompute::kSelective};
  for (const auto& [scenario, o] : cases) {
    const auto all = mesh_ledger_stages_modes(scenario.model, scenario.train, o, modes);
    ASSERT_EQ(all.size(), std::size(modes));
    for (std::size_t k = 0; k < all.size(); ++k) {
      Scenario s = scenario;
      s.train.recompute = modes[k];
      const std::vector<LedgerRow> every = mesh_ledger_ranks(s.model, s.train, o);
      const std::vector<RankLedger>& stages = all[k];
      EXPECT_EQ(mesh_ledger_stages(s.model, s.train, o)[0].row.total(), stages[0].row.total());
      const comm::DeviceMesh m(o.shape, o.order);
      std::vector<std::size_t> fullest(stages.size(), 0);
      for (std::size_t r = 0; r < every.size(); ++r) {
        auto& f = fullest[static_cast<std::size_t>(m.coord(static_cast<int>(r), comm::Axis::pp))];
        f = std::max(f, every[r].total());
      }
      for (std::size_t st = 0; st < stages.size(); ++st) {
        EXPECT_EQ(stages[st].row.total(), fullest[st])
            << "dp" << o.shape.dp << " tp" << o.shape.tp << " pp" << o.shape.pp << " cp"
            << o.shape.cp << " ep" << o.shape.ep << " stage " << st << " "
            << ref::to_string(modes[k]);
        EXPECT_EQ(every[static_cast<std::size_t>(stages[st].rank)].total(), stages[st].row.total());
      }
    }
  }
}

// A flash kernel (MeshOptions::attention, a planning input) keeps a log-sum-exp per row and local
// head instead of the s x s probabilities: the activations of one block without recompute drop by
// the probabilities and gain the log-sum-exp, without CP and under Ulysses; under selective
// recompute (no probabilities kept either way) and full recompute only the log-sum-exp differs
// or nothing; the ring is flash-style already. The numeric engine refuses it.
TEST(MeshLedger, AFlashKernelKeepsNoProbabilities) {
  const Scenario s = mesh_dense();
  const auto& m = s.model;
  MeshOptions ulysses = mesh({.dp = 2, .cp = 2});
  ulysses.cp_algo = CpAlgo::ulysses;
  for (const MeshOptions& engine : {mesh({.tp = 2}), ulysses}) {
    MeshOptions flash = engine;
    flash.attention = AttentionKernel::flash;
    const double heads = static_cast<double>(m.heads) / engine.shape.tp / engine.shape.cp;
    const double probs = heads * m.seq_len * m.seq_len, lse = heads * m.seq_len;
    const auto elems = [&](const MeshOptions& o, ref::Recompute r) {
      return mesh_block_activation_elems(m, o, 0, r);
    };
    using ref::Recompute;
    EXPECT_DOUBLE_EQ(elems(flash, Recompute::kNone), elems(engine, Recompute::kNone) - probs + lse);
    EXPECT_DOUBLE_EQ(elems(flash, Recompute::kSelective),
                     elems(engine, Recompute::kSelective) + lse);
    EXPECT_DOUBLE_EQ(elems(flash, Recompute::kFull), elems(engine, Recompute::kFull));
    EXPECT_LT(mesh_ledger(m, s.train, flash, 0).activation_peak,
              mesh_ledger(m, s.train, engine, 0).activation_peak);
  }
  MeshOptions ring = mesh({.dp = 2, .cp = 2});
  MeshOptions ring_flash = ring;
  ring_flash.attention = AttentionKernel::flash;
  EXPECT_EQ(mesh_block_activation_elems(m, ring_flash, 0, ref::Recompute::kNone),
            mesh_block_activation_elems(m, ring, 0, ref::Recompute::kNone));
  MeshOptions refused = mesh({.dp = 2});
  refused.attention = AttentionKernel::flash;
  try {
    mesh_run(s, refused);
    ADD_FAILURE() << "the engine ran a flash kernel it does not have";
  } catch (const std::exception& e) {  // the world names the rank that threw
    EXPECT_NE(std::string(e.what()).find("flash is a planning input"), std::string::npos)
        << e.what();
  }
}

// The rank order moves ranks, not coordinates: every stage's fullest row is the same under another
// order (the search computes a mesh's ledger once for all its orders).
TEST(MeshLedger, TheFullestRowDoesNotDependOnTheRankOrder) {
  for (const Case& c : ledger_cases()) {
    MeshOptions other = c.options;
    other.order = "pp-dp-cp-ep-tp";
    const Scenario s = mesh_dense();
    const std::vector<RankLedger> a = mesh_ledger_stages(s.model, s.train, c.options);
    const std::vector<RankLedger> b = mesh_ledger_stages(s.model, s.train, other);
    ASSERT_EQ(a.size(), b.size()) << c.name;
    for (std::size_t st = 0; st < a.size(); ++st)
      EXPECT_EQ(a[st].row.total(), b[st].row.total()) << c.name << " stage " << st;
  }
}

// shared_local_params remembers a rank's parameters by what local_params reads (tp, ep and pp
// sizes and coordinates, virtual stages), so one entry serves every order and dp x cp split: on
// every rank of meshes of every order, met in one thread after one another, it gives that rank's
// own local_params (dense and MoE, tied embedding, kv heads replicated over TP).
TEST(MeshParams, SharedLocalParamsAreEveryRanksOwn) {
  int ranks = 0;
  for (const bool moe : {false, true}) {
    ref::ModelConfig model = moe ? mesh_moe().model : mesh_dense().model;
    for (const comm::MeshShape shape :
         {comm::MeshShape{.dp = 2, .tp = 2, .pp = 2}, comm::MeshShape{.dp = 4, .tp = 2},
          comm::MeshShape{.dp = 2, .tp = 4, .cp = 2}, comm::MeshShape{.dp = 2, .pp = 2, .cp = 2},
          comm::MeshShape{.dp = 2, .tp = 2, .pp = 2, .ep = 2}, comm::MeshShape{.dp = 4, .ep = 4}})
      for (const std::string order : {"tp-cp-ep-dp-pp", "tp-pp-cp-ep-dp", "pp-dp-ep-cp-tp"})
        for (const int vs : {1, 2}) {
          if (shape.ep > 1 && !moe) continue;
          if (vs > 1 && shape.pp == 1) continue;
          const comm::DeviceMesh mesh(shape, order);
          for (int r = 0; r < shape.world_size(); ++r) {
            const std::vector<LocalParam> want = local_params(model, mesh, r, vs);
            const std::vector<LocalParam>& got = *shared_local_params(model, mesh, r, vs);
            ASSERT_EQ(got.size(), want.size()) << order << " rank " << r;
            for (std::size_t i = 0; i < want.size(); ++i) {
              const std::string where = order + " rank " + std::to_string(r) + " " + want[i].name;
              EXPECT_EQ(got[i].name, want[i].name) << where;
              EXPECT_EQ(got[i].unit, want[i].unit) << where;
              EXPECT_EQ(got[i].local_shape, want[i].local_shape) << where;
              EXPECT_EQ(got[i].offset, want[i].offset) << where;
              EXPECT_EQ(got[i].split, want[i].split) << where;
              EXPECT_EQ(got[i].expert, want[i].expert) << where;
              EXPECT_EQ(got[i].tp_replicated, want[i].tp_replicated) << where;
              EXPECT_EQ(got[i].tied_copy, want[i].tied_copy) << where;
              EXPECT_EQ(got[i].kv_replicas, want[i].kv_replicas) << where;
            }
            ++ranks;
          }
        }
  }
  EXPECT_GT(ranks, 300);
}

}  // namespace
}  // namespace shardcheck::parallel
