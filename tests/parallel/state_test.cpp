// The non-finite-gradient health check (a NaN planted through the gradient hook on one rank:
// every rank skips the same step, or every rank stops with the same typed error), and checkpoint
// state export/import: resharding ZeRO-3 DP 4 -> DDP DP 2 keeps parity with an uninterrupted
// reference, and a same-topology round trip continues bitwise identically.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

// NaN into rank 1's local gradient of one parameter at step 2.
GradHook nan_on_rank1_step2(int rank) {
  return [rank](int step, int microbatch, const std::string& param, comm::Buffer g) {
    if (rank == 1 && step == 2 && microbatch == 0 && param == "layers.0.attn.wq")
      static_cast<double*>(g.data)[0] = std::numeric_limits<double>::quiet_NaN();
  };
}

TEST(GradHealth, SkipStepOnEveryRankNamingTheRank) {
  const Scenario s = dense_setup();
  const ref::Dataset ds = dataset_of(s);
  for (Strategy st : {Strategy::ddp, Strategy::zero2, Strategy::fsdp}) {
    sim::SimWorld(4).run([&](comm::Communicator& c) {
      DataParallelOptions o{.strategy = st, .bucket_elems = 500};
      o.health = {.check = true, .policy = NonFinitePolicy::skip_step};
      o.grad_hook = nan_on_rank1_step2(c.rank());
      MeshEngine e(c, s.model, s.train, s.seed, dp_mesh(c.size(), o));
      ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                      s.seed, true);
      ref::ParamMap<double> before;
      for (int n = 1; n <= 3; ++n) {
        e.step(rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size()));
        const ref::ParamMap<double> now = e.full_params();
        if (n == 2) {
          EXPECT_TRUE(e.last_step_health().skipped);
          EXPECT_EQ(e.last_step_health().nonfinite_ranks, std::vector<int>{1});
          for (const auto& p : before) EXPECT_EQ(now[p.name].vec(), p.value.vec()) << p.name;
        } else {
          EXPECT_FALSE(e.last_step_health().skipped) << "step " << n;
          for (const auto& p : now)
            for (double x : p.value.vec()) ASSERT_TRUE(std::isfinite(x)) << p.name;
        }
        before = now;
      }
      EXPECT_EQ(e.skipped_steps(), 1);
    });
  }
}

TEST(GradHealth, StopThrowsTheSameTypedErrorOnEveryRank) {
  const Scenario s = dense_setup();
  const ref::Dataset ds = dataset_of(s);
  std::mutex mu;
  std::vector<std::string> messages;
  sim::SimWorld(3).run([&](comm::Communicator& c) {
    DataParallelOptions o{.strategy = Strategy::zero3};
    o.health = {.check = true, .policy = NonFinitePolicy::stop};
    o.grad_hook = nan_on_rank1_step2(c.rank());
    MeshEngine e(c, s.model, s.train, s.seed, dp_mesh(c.size(), o));
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    e.step(rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size()));
    try {
      e.step(rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size()));
      ADD_FAILURE() << "step 2 did not stop";
    } catch (const NonFiniteGradientError& err) {
      EXPECT_EQ(err.step(), 2);
      EXPECT_EQ(err.ranks(), std::vector<int>{1});
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(err.what());
    }
  });
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[0], "non-finite gradient at step 2 on rank(s) 1");
}

// Logical tensors assembled from every rank's pieces; each element written exactly once.
struct StateStore {
  struct Entry {
    ref::Shape shape;
    comm::DType dtype;
    std::vector<std::byte> bytes;
    std::vector<int> writes;  // per element
  };
  std::map<std::string, Entry> tensors;
  std::mutex mu;

  void add(const std::vector<StatePiece>& pieces) {
    std::lock_guard<std::mutex> lock(mu);
    for (const StatePiece& p : pieces) {
      Entry& e = tensors[p.tensor];
      const auto n = static_cast<std::size_t>(ref::numel_of(p.shape));
      const std::size_t w = comm::size_of(p.dtype);
      if (e.bytes.empty())
        e = {p.shape, p.dtype, std::vector<std::byte>(n * w), std::vector<int>(n)};
      ASSERT_EQ(p.bytes.size(), p.count * w);
      std::memcpy(e.bytes.data() + p.begin * w, p.bytes.data(), p.bytes.size());
      for (std::size_t i = 0; i < p.count; ++i) ++e.writes[p.begin + i];
    }
  }
  void expect_complete() const {
    for (const auto& [name, e] : tensors)
      for (std::size_t i = 0; i < e.writes.size(); ++i)
        ASSERT_EQ(e.writes[i], 1) << name << " element " << i;
  }
  StateReader reader() const {
    return [this](const std::string& t, comm::DType dtype, std::size_t begin, std::size_t count,
                  std::span<std::byte> out) {
      const Entry& e = tensors.at(t);
      REF_CHECK(e.dtype == dtype, "dtype differs for " + t);
      const std::size_t w = comm::size_of(dtype);
      REF_CHECK(out.size() == count * w && (begin + count) * w <= e.bytes.size(), "range " + t);
      std::memcpy(out.data(), e.bytes.data() + begin * w, out.size());
    };
  }
};

// Runs steps [from, to] of s at DP `world`, importing `in` first when given and exporting the
// state after the last step into `out` when given.
Trace run_steps(const Scenario& s, int world, DataParallelOptions o, int from, int to,
                const StateStore* in, StateStore* out) {
  const ref::Dataset ds = dataset_of(s);
  Trace trace;
  std::mutex mu;
  sim::SimWorld(world).run([&](comm::Communicator& c) {
    MeshEngine e(c, s.model, s.train, s.seed, dp_mesh(c.size(), o));
    if (in != nullptr) e.import_state(in->reader());
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    for (int n = 1; n < from; ++n) sampler.next_global_batch();
    Trace mine;
    for (int n = from; n <= to; ++n) {
      mine.steps.push_back(e.step(rank_batch(ds, sampler.next_global_batch(), c.rank(), c.size())));
      mine.params.push_back(e.full_params());
    }
    if (out != nullptr) out->add(e.export_state());
    if (c.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      trace = std::move(mine);
    }
  });
  return trace;
}

TEST(StateExport, Zero3Dp4ToDdpDp2KeepsParity) {
  for (const Scenario& s : {dense_setup(), moe_setup()}) {
    const Trace want = reference_run(s);
    StateStore store;
    run_steps(s, 4, {.strategy = Strategy::zero3}, 1, 1, nullptr, &store);
    store.expect_complete();
    EXPECT_TRUE(store.tensors.contains("exp_avg_sq/embed.weight"));
    const Trace got = run_steps(s, 2, {.strategy = Strategy::ddp}, 2, 3, &store, nullptr);
    Trace tail{{want.steps.begin() + 1, want.steps.end()},
               {want.params.begin() + 1, want.params.end()}};
    const Parity p = compare(tail, DpRun{.ranks = {got}});
    std::printf("resume %s zero3 dp4 -> ddp dp2: loss %.2e params %.2e\n", s.name.c_str(), p.loss,
                p.params);
    EXPECT_LE(p.max(), kF64Tolerance) << p.worst;
  }
}

TEST(StateExport, SameTopologyContinuesBitwise) {
  Scenario s = moe_setup();
  DataParallelOptions o{.strategy = Strategy::fsdp};
  o.fsdp = {.sharding = ShardingStrategy::hybrid_shard, .prefetch = 1, .shard_group_size = 2};
  const Trace whole = run_steps(s, 4, o, 1, 3, nullptr, nullptr);
  StateStore store;
  run_steps(s, 4, o, 1, 1, nullptr, &store);
  store.expect_complete();
  const Trace resumed = run_steps(s, 4, o, 2, 3, &store, nullptr);
  for (std::size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(resumed.steps[k].loss, whole.steps[k + 1].loss);
    for (const auto& e : whole.params[k + 1])
      EXPECT_EQ(resumed.params[k][e.name].vec(), e.value.vec());
  }
}

TEST(StateExport, Bf16ReshardsZero2Dp2ToFsdpDp4Bitwise) {
  Scenario s = dense_setup();
  s.train.precision = ref::Precision::kBf16;
  const Trace whole = run_steps(s, 4, {.strategy = Strategy::fsdp}, 1, 3, nullptr, nullptr);
  StateStore store;
  run_steps(s, 2, {.strategy = Strategy::zero2}, 1, 1, nullptr, &store);
  store.expect_complete();
  EXPECT_EQ(store.tensors.at("param/embed.weight").dtype, comm::DType::bf16);
  EXPECT_EQ(store.tensors.at("master/embed.weight").dtype, comm::DType::f32);
  const Trace resumed = run_steps(s, 4, {.strategy = Strategy::fsdp}, 2, 3, &store, nullptr);
  const Parity p = compare(Trace{{whole.steps.begin() + 1, whole.steps.end()},
                                 {whole.params.begin() + 1, whole.params.end()}},
                           DpRun{.ranks = {resumed}});
  EXPECT_LE(p.max(), 1e-6) << p.worst;
}

}  // namespace
}  // namespace shardcheck::parallel::test
