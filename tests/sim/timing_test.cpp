// The virtual clock: each op's time equals its stated alpha-beta formula, a collective starts when
// its last member arrives, un-waited collectives overlap compute and wait() joins, a group that
// spans nodes uses the inter-node link, stragglers slow the step, meta mode times the same program
// without data, and timelines are identical run to run whatever the real thread timing.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "sim/communicator.hpp"
#include "sim/world.hpp"

namespace shardcheck::sim {
namespace {

using comm::Communicator;

// One node of 8 ranks on a round-number link, so expected times are easy to write down.
Topology simple_topology() {
  Topology t;
  t.ranks_per_node = 8;
  t.intra_node = {100, 2};     // 100 GB/s, 2 us
  t.inter_node = {10, 20};     // 10 GB/s, 20 us
  t.device = {100, 1000, 80};  // 100 TFLOP/s, 1000 GB/s
  t.compute_efficiency = 0.5;
  return t;
}

void expect_time(double got, double want) {
  EXPECT_NEAR(got, want, 1e-12 + 1e-9 * want) << "got " << got << " want " << want;
}

std::vector<TimelineEvent> events_of(const SimWorld& w, int rank, Stream s) {
  std::vector<TimelineEvent> out;
  for (const auto& e : w.timeline())
    if (e.rank == rank && e.stream == s) out.push_back(e);
  return out;
}

TEST(CostModel, FormulasAsStated) {
  const LinkCost l{2e-6, 1.0 / 100e9, false};
  const double S = 1 << 20;
  expect_time(op_seconds(OpKind::all_reduce, 4, S, l), 2 * 3 * 2e-6 + 2.0 * 3 / 4 * S / 100e9);
  expect_time(op_seconds(OpKind::all_gather, 4, S, l), 3 * 2e-6 + 3.0 / 4 * S / 100e9);
  expect_time(op_seconds(OpKind::reduce_scatter, 4, S, l), 3 * 2e-6 + 3.0 / 4 * S / 100e9);
  expect_time(op_seconds(OpKind::broadcast, 4, S, l), 3 * 2e-6 + S / 100e9);
  expect_time(op_seconds(OpKind::all_to_all, 4, S, l), 3 * 2e-6 + S / 100e9);
  expect_time(op_seconds(OpKind::send, 2, S, l), 2e-6 + S / 100e9);
  expect_time(op_seconds(OpKind::barrier, 4, 0, l), 2 * 3 * 2e-6);
  expect_time(op_seconds(OpKind::all_reduce, 1, S, l), 0);
  const Topology t = simple_topology();
  // 1e12 flops at 100 TFLOP/s * 0.5 = 20 ms; 1e9 bytes at 1000 GB/s = 1 ms: the larger wins.
  expect_time(compute_seconds(t, 1e12, 1e9), 0.02);
  expect_time(compute_seconds(t, 1e9, 1e10), 0.01);
}

// GEMM efficiency by shape: whole tiles (either orientation, the better), whole waves of one tile
// per SM; off without SMs; a report's other FLOPs as counted.
TEST(CostModel, GemmsRunInWholeTilesAndWaves) {
  Topology t = simple_topology();
  const comm::Gemm even{.m = 2048, .n = 6912, .k = 2304};    // 16 x 27 = 432 tiles: 4 waves of 108
  const comm::Gemm ragged{.m = 2048, .n = 4608, .k = 3072};  // 288 tiles: 3 waves, 36 idle SMs
  const comm::Gemm small{.m = 100, .n = 100, .k = 10};       // one tile, mostly padding
  const auto counted = [](const comm::Gemm& g) { return 2 * g.m * g.n * g.k; };
  for (const comm::Gemm& g : {even, ragged, small})
    EXPECT_EQ(gemm_spent_flops(t.device, g), counted(g));  // not modelled: 0 SMs
  t.device.sms = 108;
  EXPECT_DOUBLE_EQ(gemm_spent_flops(t.device, even), counted(even));
  EXPECT_DOUBLE_EQ(gemm_spent_flops(t.device, ragged), counted(ragged) * 324 / 288);
  EXPECT_DOUBLE_EQ(gemm_spent_flops(t.device, small), 2.0 * 128 * 256 * 108 * 10);
  t.device.gemm_tile_m = 100;  // a 100 x 100 tile fits the small one exactly, one SM of 108
  t.device.gemm_tile_n = 100;
  EXPECT_DOUBLE_EQ(gemm_spent_flops(t.device, small), counted(small) * 108);
  t.device.gemm_tile_m = 128;
  t.device.gemm_tile_n = 256;
  // A report: its GEMMs at what they take, the rest of its FLOPs (1e9) as counted.
  const comm::ComputeCost c{.name = "mlp",
                            .flops = counted(even) + counted(ragged) + 1e9,
                            .bytes = 0,
                            .gemms = {even, ragged}};
  expect_time(compute_seconds(t, c),
              (counted(even) + counted(ragged) * 324 / 288 + 1e9) / (100e12 * 0.5));
  t.device.sms = 0;
  expect_time(compute_seconds(t, c), c.flops / (100e12 * 0.5));
}

TEST(CostModel, GroupSpanningNodesUsesTheInterNodeLink) {
  Topology t = simple_topology();
  t.ranks_per_node = 2;
  const std::vector<int> same{0, 1}, spans{1, 2};
  EXPECT_FALSE(group_link(t, same).inter_node);
  EXPECT_TRUE(group_link(t, spans).inter_node);
  expect_time(group_link(t, spans).alpha, 20e-6);
}

TEST(VirtualTime, RingAllReduceTakesItsFormula) {
  for (int p : {2, 4, 8}) {
    SCOPED_TRACE(p);
    SimWorld w(p, {.topology = simple_topology()});
    const std::size_t count = 1 << 16;
    w.run([&](Communicator& c) {
      std::vector<float> v(count, 1.0f);
      c.all_reduce(std::span<float>(v))->wait();
    });
    const double S = count * 4.0;
    const double want = 2 * (p - 1) * 2e-6 + 2.0 * (p - 1) / p * S / 100e9;
    expect_time(w.virtual_time(), want);
    for (int r = 0; r < p; ++r) {
      const auto ev = events_of(w, r, Stream::comm);
      ASSERT_EQ(ev.size(), 1u);
      EXPECT_EQ(ev[0].kind, "all_reduce");
      EXPECT_EQ(ev[0].bytes, count * 4);
      EXPECT_EQ(ev[0].group, "world");
      expect_time(ev[0].start, 0);
      expect_time(ev[0].end, want);
    }
  }
}

TEST(VirtualTime, ACollectiveStartsWhenItsLastMemberArrives) {
  SimWorld w(4, {.topology = simple_topology()});
  w.run([](Communicator& c) {
    // 1e9 flops at 50 TFLOP/s effective = 20 us, times (rank + 1).
    c.compute({.name = "work", .flops = 1e9 * (c.rank() + 1)});
    std::vector<double> v(1000, 1.0);
    c.all_reduce(std::span<double>(v))->wait();
  });
  const double want_start = 4 * 20e-6;
  const double want_end = want_start + 2 * 3 * 2e-6 + 2.0 * 3 / 4 * 8000 / 100e9;
  for (int r = 0; r < 4; ++r) {
    const auto ev = events_of(w, r, Stream::comm);
    ASSERT_EQ(ev.size(), 1u);
    expect_time(ev[0].start, want_start);
    expect_time(ev[0].end, want_end);
    expect_time(w.rank_end_times()[static_cast<std::size_t>(r)], want_end);
  }
  // The flight recorder carries the same virtual times.
  const auto& rec = w.flight_records()[0].back();
  expect_time(rec.v_issued, 20e-6);
  expect_time(rec.v_start, want_start);
  expect_time(rec.v_end, want_end);
}

TEST(VirtualTime, AnUnwaitedCollectiveOverlapsLaterComputeAndWaitJoins) {
  SimWorld w(2, {.topology = simple_topology()});
  const std::size_t count = 1 << 20;  // 4 MiB: 2 us + 4 MiB / 100 GB/s = 43.9 us
  const double ar = 2 * 2e-6 + 1.0 * count * 4 / 100e9;
  std::vector<double> clock_after_wait(2);
  w.run([&](Communicator& c) {
    std::vector<float> v(count, 1.0f);
    auto work = c.all_reduce(std::span<float>(v));    // a gradient bucket, not waited yet
    c.compute({.name = "backward", .flops = 1e9});    // 20 us, overlapping it
    auto second = c.all_reduce(std::span<float>(v));  // queues behind the first on the comm stream
    auto* sw = dynamic_cast<SimWork*>(second.get());
    ASSERT_NE(sw, nullptr);
    expect_time(sw->virtual_end(), 2 * ar);
    work->wait();
    c.compute({.name = "optimizer", .flops = 1e9});  // starts when the first all_reduce ended
    second->wait();
  });
  for (int r = 0; r < 2; ++r) {
    const auto comp = events_of(w, r, Stream::compute);
    const auto comm = events_of(w, r, Stream::comm);
    ASSERT_EQ(comp.size(), 2u);
    ASSERT_EQ(comm.size(), 2u);
    expect_time(comp[0].start, 0);  // overlapped: did not wait for the all_reduce
    expect_time(comp[0].end, 20e-6);
    expect_time(comm[1].start, ar);  // the comm stream was busy until the first ended
    expect_time(comp[1].start, ar);  // wait() joined the compute stream to it
    expect_time(w.rank_end_times()[static_cast<std::size_t>(r)], 2 * ar);
  }
}

TEST(VirtualTime, AGroupSpanningNodesUsesTheSlowLink) {
  Topology t = simple_topology();
  t.ranks_per_node = 2;
  SimWorld w(4, {.topology = t});
  w.run([](Communicator& c) {
    auto same_node = c.split(c.rank() / 2, c.rank(), {.name = "node"});
    auto across = c.split(c.rank() % 2, c.rank(), {.name = "across"});
    std::vector<float> v(2500, 1.0f);  // 10 kB
    same_node->all_reduce(std::span<float>(v))->wait();
    across->all_reduce(std::span<float>(v))->wait();
  });
  const auto ev = events_of(w, 0, Stream::comm);
  ASSERT_EQ(ev.size(), 4u);  // two splits, two all_reduces
  expect_time(ev[2].end - ev[2].start, 2 * 2e-6 + 1e4 / 100e9);
  expect_time(ev[3].end - ev[3].start, 2 * 20e-6 + 1e4 / 10e9);
  EXPECT_EQ(ev[3].group, "across[0,2]");
}

TEST(VirtualTime, PointToPointTakesAlphaPlusBytesOverBandwidth) {
  SimWorld w(2, {.topology = simple_topology()});
  w.run([](Communicator& c) {
    std::vector<double> buf(1000, 1.0);
    if (c.rank() == 0) {
      c.compute({.name = "produce", .flops = 1e9});  // 20 us
      c.send(comm::view(std::span<double>(buf)), 1)->wait();
    } else {
      c.recv(comm::view(std::span<double>(buf)), 0)->wait();
    }
  });
  for (int r = 0; r < 2; ++r) {
    const auto ev = events_of(w, r, Stream::comm);
    ASSERT_EQ(ev.size(), 1u);
    expect_time(ev[0].start, 20e-6);
    expect_time(ev[0].end, 20e-6 + 2e-6 + 8000 / 100e9);
  }
}

// Steps of compute then an all_reduce; rank 3 is a straggler (x3) from step 2.
void step_program(Communicator& c) {
  std::vector<float> g(1000, 1.0f);
  for (int step = 1; step <= 3; ++step) {
    c.begin_step(step);
    c.compute({.name = "fwd+bwd", .flops = 5e9});  // 100 us
    c.all_reduce(std::span<float>(g))->wait();
  }
}

TEST(VirtualTime, AStragglerSlowsTheStepForEveryone) {
  SimWorld plain(4, {.topology = simple_topology()});
  plain.run(step_program);
  SimWorld slow(
      4, {.topology = simple_topology(),
          .faults = {
              .faults = {
                  {.kind = FaultKind::straggler, .rank = 3, .slowdown = 3.0, .from_step = 2}}}});
  slow.run(step_program);
  ASSERT_EQ(plain.step_times().size(), 12u);
  ASSERT_EQ(slow.step_times().size(), 12u);
  const double ar = 2 * 3 * 2e-6 + 2.0 * 3 / 4 * 4000 / 100e9;
  for (const StepTime& s : plain.step_times()) expect_time(s.seconds(), 100e-6 + ar);
  for (const StepTime& s : slow.step_times()) {
    SCOPED_TRACE(::testing::Message() << "rank " << s.rank << " step " << s.step);
    // Every rank waits for the straggler in the step's all_reduce.
    expect_time(s.seconds(), s.step == 1 ? 100e-6 + ar : 300e-6 + ar);
  }
  const StepSummary sum = slow.step_times().empty() ? StepSummary{} : summarize(slow.step_times());
  expect_time(sum.max, 300e-6 + ar);
  expect_time(sum.p50, 300e-6 + ar);
  EXPECT_EQ(summarize(plain.step_times()).p95, summarize(plain.step_times()).max);
  // The slow rank is the one whose compute took longer (its peers only idled).
  const auto comp = events_of(slow, 3, Stream::compute);
  expect_time(comp[1].end - comp[1].start, 300e-6);
  expect_time(
      events_of(slow, 2, Stream::compute)[1].end - events_of(slow, 2, Stream::compute)[1].start,
      100e-6);
}

// A layer-wise sharded program: all_gather, compute, reduce_scatter per layer, with an async
// gradient all_reduce on a sub-group, over a few steps.
void layered_program(Communicator& c, bool meta, int jitter_seed) {
  std::mt19937 delay(static_cast<unsigned>(jitter_seed * 7919 + c.rank()));
  auto jitter = [&] {
    if (jitter_seed >= 0) std::this_thread::sleep_for(std::chrono::microseconds(delay() % 200));
  };
  auto pair = c.split(c.rank() / 2, c.rank(), {.name = "pair"});
  const std::size_t shard = 64;
  const std::size_t full = shard * static_cast<std::size_t>(c.size());
  std::vector<float> a(meta ? 0 : full, 1.0f), b(meta ? 0 : shard, 1.0f);
  auto buf = [&](std::vector<float>& v, std::size_t n) {
    return comm::Buffer{meta ? nullptr : v.data(), n, comm::DType::f32, {}};
  };
  for (int step = 1; step <= 2; ++step) {
    c.begin_step(step);
    for (int layer = 0; layer < 3; ++layer) {
      jitter();
      c.all_gather(buf(b, shard), buf(a, full))->wait();
      c.compute({.name = "layer", .flops = 1e8 * (1 + c.rank() % 3), .bytes = 1e6});
      auto w = pair->all_reduce(buf(b, shard));
      jitter();
      c.reduce_scatter(buf(a, full), buf(b, shard))->wait();
      w->wait();
    }
  }
}

TEST(VirtualTime, TimelinesAreIdenticalAcrossRunsWithRandomDelays) {
  std::vector<TimelineEvent> first;
  for (int run = 0; run < 4; ++run) {
    SimWorld w(6, {.topology = simple_topology()});
    w.run([&](Communicator& c) { layered_program(c, false, run); });
    if (run == 0) {
      first = w.timeline();
      EXPECT_GT(first.size(), 50u);
      continue;
    }
    ASSERT_EQ(w.timeline().size(), first.size());
    for (std::size_t i = 0; i < first.size(); ++i) {
      const auto& a = first[i];
      const auto& b = w.timeline()[i];
      ASSERT_TRUE(a.rank == b.rank && a.kind == b.kind && a.name == b.name && a.step == b.step &&
                  a.start == b.start && a.end == b.end && a.group == b.group && a.seq == b.seq)
          << "run " << run << " event " << i;
    }
  }
}

TEST(VirtualTime, MetaModeTimesTheSameProgramWithoutData) {
  SimWorld real(8, {.topology = simple_topology()});
  real.run([](Communicator& c) { layered_program(c, false, -1); });
  SimWorld meta(8, {.topology = simple_topology(), .meta = true});
  meta.run([](Communicator& c) { layered_program(c, true, -1); });
  ASSERT_EQ(meta.timeline().size(), real.timeline().size());
  for (std::size_t i = 0; i < real.timeline().size(); ++i)
    EXPECT_EQ(meta.timeline()[i].end, real.timeline()[i].end) << i;
  EXPECT_EQ(meta.virtual_time(), real.virtual_time());
  EXPECT_EQ(meta.step_times().size(), 16u);
}

TEST(VirtualTime, MetaModeStillChecksDescriptors) {
  SimWorld w(4, {.meta = true});
  EXPECT_THROW(w.run([](Communicator& c) {
    c.all_reduce(comm::Buffer{nullptr, c.rank() == 1 ? 5u : 4u, comm::DType::f32, {}})->wait();
  }),
               RankFailure);
  ASSERT_TRUE(w.diagnosis().has_value());
  EXPECT_EQ(w.diagnosis()->kind, DiagnosisKind::mismatch);
}

}  // namespace
}  // namespace shardcheck::sim
