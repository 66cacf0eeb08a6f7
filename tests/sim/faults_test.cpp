// One test per injected fault kind, at world sizes 2, 4, 8 and 64: the run ends (never hangs), the
// failure is typed, and the Diagnosis names the injected rank, the op, its seq and step.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "comm/errors.hpp"
#include "sim/world.hpp"

namespace shardcheck::sim {
namespace {

using comm::Communicator;

// Detection is by global state, never a timeout, so these tests assert no wall-clock bound (the
// machine is shared and noisy): a missed detection would hang and hit ctest's timeout instead.
// The wall time of a 64-rank hang diagnosis is recorded (RecordProperty) and reported in
// reports/2026-11-29-sim-scaling-cpu.md.

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Two steps of: all_gather (op 0), compute, reduce_scatter (op 1), all_reduce (op 2).
// Checks its own results, so a silent corruption shows as wrong elements.
struct SelfCheckingProgram {
  std::vector<int> wrong;
  explicit SelfCheckingProgram(int n) : wrong(static_cast<std::size_t>(n), 0) {}
  void operator()(Communicator& c) {
    const std::size_t shard = 8, p = static_cast<std::size_t>(c.size());
    for (int step = 1; step <= 2; ++step) {
      c.begin_step(step);
      std::vector<double> mine(shard, c.rank() + 1.0), full(shard * p);
      c.all_gather(comm::cview(std::span<const double>(mine)), comm::view(std::span<double>(full)))
          ->wait();
      c.compute({.name = "layer", .flops = 1e9});
      std::vector<double> out(shard);
      c.reduce_scatter(comm::cview(std::span<const double>(full)),
                       comm::view(std::span<double>(out)))
          ->wait();
      // out[i] = p * (rank + 1): every rank contributed the gathered chunk of this rank.
      for (double x : out)
        wrong[static_cast<std::size_t>(c.rank())] += x != double(p) * (c.rank() + 1);
      std::vector<double> g(shard, 1.0);
      c.all_reduce(std::span<double>(g))->wait();
      for (double x : g) wrong[static_cast<std::size_t>(c.rank())] += x != double(p);
    }
  }
};

// Runs the program with one fault, expects a failure, returns the diagnosis.
Diagnosis fail_with(int n, Fault f, bool checksums = false) {
  SimWorld w(n, {.faults = {.seed = 7, .faults = {f}}, .checksum_payloads = checksums});
  SelfCheckingProgram prog(n);
  EXPECT_THROW(w.run(std::ref(prog)), RankFailure);
  EXPECT_TRUE(w.diagnosis().has_value());
  if (!w.diagnosis()) return {};
  const Diagnosis& d = *w.diagnosis();
  EXPECT_EQ(d.flight_records.size(), static_cast<std::size_t>(n));
  EXPECT_EQ(w.fired_faults().size(), 1u);
  return d;
}

class Faults : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(WorldSizes, Faults, ::testing::Values(2, 4, 8, 64),
                         [](const auto& i) { return "n" + std::to_string(i.param); });

TEST_P(Faults, HangIsDiagnosedAsAHangOfThatRank) {
  const int n = GetParam(), r = n - 1;
  const Diagnosis d = fail_with(n, {.kind = FaultKind::hang, .rank = r, .step = 2, .op_index = 1});
  EXPECT_EQ(d.kind, DiagnosisKind::hang);
  EXPECT_EQ(d.ranks, std::vector<int>{r});
  EXPECT_EQ(d.op, "reduce_scatter");
  EXPECT_EQ(d.group, "world");
  EXPECT_EQ(d.seq, 4u);  // step 1 had seqs 0-2; step 2: all_gather 3, reduce_scatter 4
  EXPECT_EQ(d.step, 2);
  EXPECT_TRUE(contains(d.message, "Rank " + std::to_string(r) + " hung")) << d.message;
  EXPECT_TRUE(
      contains(d.message, "in reduce_scatter seq 4 of group world for [" + std::to_string(r) + "]"))
      << d.message;
  EXPECT_TRUE(contains(
      d.message, "rank " + std::to_string(r) + " last completed all_gather seq 3 of group world"))
      << d.message;
}

TEST_P(Faults, HangAtTheStepStart) {
  const int n = GetParam();
  const Diagnosis d = fail_with(n, {.kind = FaultKind::hang, .rank = 0, .step = 2, .op_index = -1});
  EXPECT_EQ(d.kind, DiagnosisKind::hang);
  EXPECT_EQ(d.ranks, std::vector<int>{0});
  EXPECT_EQ(d.step, 2);
  EXPECT_EQ(d.op, "step start");
  EXPECT_TRUE(contains(d.message, "at the start of step 2")) << d.message;
  if (n > 1) {
    EXPECT_TRUE(contains(d.message, "in all_gather seq 3 of group world for [0]")) << d.message;
  }
}

TEST_P(Faults, CrashReleasesEveryoneWithPeerErrorsNamingTheDeadRank) {
  const int n = GetParam(), r = n / 2;
  SimWorld w(
      n, {.faults = {.faults = {{.kind = FaultKind::crash, .rank = r, .step = 1, .op_index = 2}}}});
  SelfCheckingProgram prog(n);
  try {
    w.run(std::ref(prog));
    FAIL() << "the run did not fail";
  } catch (const RankFailure& f) {
    EXPECT_EQ(f.rank(), r);
    EXPECT_THROW(f.rethrow_cause(), InjectedCrash);
  }
  for (const RankOutcome& o : w.outcomes()) {
    ASSERT_FALSE(o.ok) << "rank " << o.rank;
    if (o.rank == r) continue;
    EXPECT_FALSE(o.root_cause);
    try {
      std::rethrow_exception(o.error);
    } catch (const comm::PeerError& e) {
      EXPECT_EQ(e.peer(), r);
    } catch (const comm::AbortedError& e) {
      EXPECT_TRUE(contains(e.what(), "rank " + std::to_string(r) + " failed")) << e.what();
    }
  }
  const Diagnosis& d = *w.diagnosis();
  EXPECT_EQ(d.kind, DiagnosisKind::crash);
  EXPECT_EQ(d.ranks, std::vector<int>{r});
  EXPECT_EQ(d.op, "all_reduce");
  EXPECT_EQ(d.seq, 2u);
  EXPECT_EQ(d.step, 1);
  EXPECT_TRUE(contains(d.message, "last completed reduce_scatter seq 1")) << d.message;
}

TEST_P(Faults, SkippedCollectiveIsTracedToTheSkippingRank) {
  const int n = GetParam(), r = 1 % n;
  const Diagnosis d =
      fail_with(n, {.kind = FaultKind::skip_collective, .rank = r, .step = 1, .op_index = 0});
  // Rank r's reduce_scatter meets everyone else's all_gather: a mismatch, traced to rank r.
  EXPECT_EQ(d.kind, DiagnosisKind::mismatch);
  EXPECT_EQ(d.ranks, std::vector<int>{r});
  EXPECT_EQ(d.seq, 0u);
  ASSERT_TRUE(d.fault.has_value());
  EXPECT_EQ(d.fault->fault.kind, FaultKind::skip_collective);
  EXPECT_TRUE(contains(d.message, "skip_collective")) << d.message;
}

TEST_P(Faults, SkippedLastCollectiveIsADeadlockTracedToTheSkippingRank) {
  const int n = GetParam(), r = n - 1;
  const Diagnosis d =
      fail_with(n, {.kind = FaultKind::skip_collective, .rank = r, .step = 2, .op_index = 2});
  EXPECT_EQ(d.kind, DiagnosisKind::deadlock);
  EXPECT_EQ(d.ranks, std::vector<int>{r});
  EXPECT_EQ(d.op, "all_reduce");
  EXPECT_EQ(d.seq, 5u);
  EXPECT_TRUE(contains(d.message, "rank " + std::to_string(r) + " had finished")) << d.message;
}

TEST_P(Faults, MismatchNamesBothSidesAndTheInjectedRank) {
  const int n = GetParam(), r = n - 1;
  for (MismatchWhat what : {MismatchWhat::count, MismatchWhat::dtype, MismatchWhat::op}) {
    SCOPED_TRACE(std::string(name_of(what)));
    const Diagnosis d = fail_with(
        n, {.kind = FaultKind::mismatch, .rank = r, .step = 2, .op_index = 2, .what = what});
    EXPECT_EQ(d.kind, DiagnosisKind::mismatch);
    EXPECT_EQ(d.ranks, std::vector<int>{r});
    EXPECT_EQ(d.seq, 5u);
    EXPECT_EQ(d.step, 2);
    EXPECT_TRUE(contains(d.message, "collective mismatch in group world at seq 5")) << d.message;
    EXPECT_TRUE(contains(d.message, "rank " + std::to_string(r) + " called")) << d.message;
  }
}

TEST_P(Faults, CorruptPayloadWithChecksumsIsACorruptionErrorNamingRankOpSeq) {
  const int n = GetParam(), r = n / 2;
  const Diagnosis d =
      fail_with(n, {.kind = FaultKind::corrupt_payload, .rank = r, .step = 2, .op_index = 1}, true);
  EXPECT_EQ(d.kind, DiagnosisKind::corruption);
  EXPECT_EQ(d.ranks, std::vector<int>{r});
  EXPECT_EQ(d.op, "reduce_scatter");
  EXPECT_EQ(d.seq, 4u);
  EXPECT_EQ(d.step, 2);
  EXPECT_TRUE(contains(d.message, "flipped")) << d.message;
}

TEST_P(Faults, CorruptPayloadWithoutChecksumsIsSilentButRecorded) {
  const int n = GetParam(), r = n / 2;
  SimWorld w(
      n,
      {.faults = {
           .faults = {{.kind = FaultKind::corrupt_payload, .rank = r, .step = 1, .op_index = 2}}}});
  SelfCheckingProgram prog(n);
  w.run(std::ref(prog));  // no error: nothing checks
  EXPECT_FALSE(w.diagnosis().has_value());
  int wrong = 0;
  for (int x : prog.wrong) wrong += x;
  EXPECT_GT(wrong, 0) << "the corrupted all_reduce must give wrong results";
  ASSERT_EQ(w.fired_faults().size(), 1u);
  const FiredFault& f = w.fired_faults()[0];
  EXPECT_EQ(f.fault.rank, r);
  EXPECT_EQ(f.op, "all_reduce");
  EXPECT_EQ(f.seq, 2u);
  EXPECT_EQ(f.group, "world");
}

TEST_P(Faults, MemoryBudgetIsAnOomOfThatRank) {
  const int n = GetParam(), r = n - 1;
  SimWorld w(
      n, {.faults = {.faults = {{.kind = FaultKind::memory_budget, .rank = r, .bytes = 1000}}}});
  EXPECT_THROW(w.run([](Communicator& c) {
    c.begin_step(1);
    c.memory().set_phase("step 1 forward");
    comm::TrackedBytes params(c.memory(), comm::MemCategory::params, 600);
    comm::TrackedBytes acts(c.memory(), comm::MemCategory::activations, 600);
    c.barrier()->wait();
  }),
               RankFailure);
  const Diagnosis& d = *w.diagnosis();
  EXPECT_EQ(d.kind, DiagnosisKind::oom);
  EXPECT_EQ(d.ranks, std::vector<int>{r});
  EXPECT_EQ(d.step, 1);
  EXPECT_TRUE(contains(d.message, "params 600 B")) << d.message;
  EXPECT_TRUE(contains(d.message, "step 1 forward")) << d.message;
}

TEST_P(Faults, WithoutFaultsTheProgramIsCorrect) {
  const int n = GetParam();
  SimWorld w(n);
  SelfCheckingProgram prog(n);
  w.run(std::ref(prog));
  for (int x : prog.wrong) EXPECT_EQ(x, 0);
  EXPECT_TRUE(w.fired_faults().empty());
}

TEST(FaultPlan, BadFaultsAreRefusedWithTheirIndex) {
  EXPECT_THROW(SimWorld(4, {.faults = {.faults = {{.kind = FaultKind::hang, .rank = 4}}}}),
               std::invalid_argument);
  try {
    SimWorld w(4,
               {.faults = {.faults = {{.kind = FaultKind::straggler, .rank = 1},
                                      {.kind = FaultKind::straggler, .rank = 1, .slowdown = 0}}}});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "faults[1] (straggler)")) << e.what();
  }
  Topology t;
  t.ranks_per_node = 0;
  EXPECT_THROW(SimWorld(2, {.topology = t}), std::invalid_argument);
}

TEST(FaultPlan, PointToPointFaults) {
  // A skipped send leaves its receiver waiting: a deadlock traced to the sender.
  SimWorld w(
      2,
      {.faults = {
           .faults = {{.kind = FaultKind::skip_collective, .rank = 0, .step = 1, .op_index = 0}}}});
  EXPECT_THROW(w.run([](Communicator& c) {
    c.begin_step(1);
    std::vector<float> v(4, 1.0f);
    if (c.rank() == 0)
      c.send(comm::view(std::span<float>(v)), 1)->wait();
    else
      c.recv(comm::view(std::span<float>(v)), 0)->wait();
  }),
               RankFailure);
  EXPECT_EQ(w.diagnosis()->kind, DiagnosisKind::deadlock);
  EXPECT_EQ(w.diagnosis()->ranks, std::vector<int>{0});
  // A corrupted send with checksums on fails both sides with CorruptionError.
  SimWorld c2(
      2,
      {.faults =
           {.faults = {{.kind = FaultKind::corrupt_payload, .rank = 1, .step = 1, .op_index = 0}}},
       .checksum_payloads = true});
  EXPECT_THROW(c2.run([](Communicator& c) {
    c.begin_step(1);
    std::vector<float> v(4, 1.0f);
    if (c.rank() == 1)
      c.send(comm::view(std::span<float>(v)), 0)->wait();
    else
      c.recv(comm::view(std::span<float>(v)), 1)->wait();
  }),
               RankFailure);
  EXPECT_EQ(c2.diagnosis()->kind, DiagnosisKind::corruption);
  EXPECT_EQ(c2.diagnosis()->ranks, std::vector<int>{1});
}

TEST(Hang, A64RankHangIsDiagnosedNamingTheRank) {
  SimWorld w(
      64,
      {.faults = {.faults = {{.kind = FaultKind::hang, .rank = 37, .step = 3, .op_index = 0}}}});
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(w.run([](Communicator& c) {
    std::vector<float> v(256, 1.0f);
    for (int step = 1; step <= 4; ++step) {
      c.begin_step(step);
      c.compute({.name = "fwd", .flops = 1e9});
      c.all_reduce(std::span<float>(v))->wait();
    }
  }),
               RankFailure);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("wall_seconds", std::to_string(secs));
  const Diagnosis& d = *w.diagnosis();
  EXPECT_EQ(d.kind, DiagnosisKind::hang);
  EXPECT_EQ(d.ranks, std::vector<int>{37});
  EXPECT_EQ(d.seq, 2u);
  EXPECT_EQ(d.step, 3);
  EXPECT_TRUE(
      contains(d.message, "ranks [0-36,38-63] wait in all_reduce seq 2 of group world for [37]"))
      << d.message;
  std::cout << d.message << "\n";
}

}  // namespace
}  // namespace shardcheck::sim
