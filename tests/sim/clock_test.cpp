// sim::StageWorld against sim::SimWorld in meta mode: a two-stage program (collectives inside a
// stage, messages between the stages, a collective over the whole world) gives the same step
// times through one representative per stage as through every rank; stages whose programs do not
// match fail with a message instead of hanging; the clock's lower bound of a step (forced_busy)
// counts compute and the collectives waited at once, the same among the stages as alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/clock.hpp"
#include "sim/topology.hpp"
#include "sim/world.hpp"

namespace shardcheck {
namespace {

constexpr int kRanks = 8, kPerStage = 4;

sim::Topology topology() {
  sim::Topology t;
  t.ranks_per_node = 2;  // the dp groups span nodes, the pp pairs too
  return t;
}

comm::Buffer null(std::size_t n, comm::DType t) {
  return comm::Buffer{nullptr, n, t, {}};
}

// Stage s = rank / 4: compute, a dp all_reduce within the stage, an activation to the other stage
// and its gradient back, an overlapped async all_reduce, and a world all_reduce; two steps.
// `mismatch`: stage 1 never sends its gradient back.
void program(comm::Communicator& world, bool mismatch = false) {
  const int r = world.rank();
  const int stage = r / kPerStage;
  auto dp = world.split(stage, r, {.name = "dp"});
  auto pp = world.split(r % kPerStage, r, {.name = "pp"});
  for (int step = 1; step <= 2; ++step) {
    world.begin_step(step);
    if (stage == 0) {
      world.compute({.name = "forward", .flops = 2e12});
      comm::WorkPtr s = pp->send(null(1 << 20, comm::DType::f32), 1);
      comm::WorkPtr a = dp->all_reduce(null(1 << 22, comm::DType::f32));
      world.compute({.name = "other", .flops = 1e12, .bytes = 1e9});
      pp->recv(null(1 << 20, comm::DType::f32), 1)->wait();
      world.compute({.name = "backward", .flops = 4e12});
      a->wait();
      s->wait();
    } else {
      pp->recv(null(1 << 20, comm::DType::f32), 0)->wait();
      world.compute({.name = "forward and backward", .flops = 9e12});
      if (!mismatch) pp->send(null(1 << 20, comm::DType::f32), 0)->wait();
      dp->all_reduce(null(1 << 22, comm::DType::f32))->wait();
    }
    world.all_reduce(null(4, comm::DType::f64))->wait();
  }
}

std::vector<sim::SplitRule> rules() {
  return {sim::SplitRule{[](int r) { return r / kPerStage; }, [](int r) { return r; }},
          sim::SplitRule{[](int r) { return r % kPerStage; }, [](int r) { return r; }},
          sim::SplitRule{[](int r) { return r % kPerStage; }, [](int r) { return r; }}};
}

sim::StageWorld stage_world() {
  return sim::StageWorld(kRanks, topology(), rules(), [](int r) { return r / kPerStage; },
                         {0, kPerStage});
}

TEST(StageWorld, EqualsSimWorldMeta) {
  sim::SimOptions o;
  o.meta = true;
  o.topology = topology();
  sim::SimWorld w(kRanks, o);
  w.run([](comm::Communicator& c) { program(c); });
  const double want = sim::summarize(w.step_times()).step_time;
  sim::StageWorld s = stage_world();
  s.run([](comm::Communicator& c) { program(c); });
  const double got = sim::summarize(s.step_times()).step_time;
  EXPECT_GT(want, 0);
  EXPECT_NEAR(got, want, 1e-12 * want);
  ASSERT_EQ(s.stage_steps().size(), 2u);
  EXPECT_EQ(s.stage_steps()[0].size(), 2u);
  EXPECT_GT(s.stage_steps()[1][0].compute_busy, s.stage_steps()[0][0].compute_busy);
}

// The program of ForcedBusyIsComputeAndTheCollectivesWaitedAtOnce.
void forced_program(sim::SymmetricClock& c) {
  c.begin_step(1);
  c.compute({.name = "a", .flops = 1e12});
  c.all_reduce(null(1 << 22, comm::DType::f32))->wait();  // counted
  comm::WorkPtr overlapped = c.all_reduce(null(1 << 22, comm::DType::f32));
  c.compute({.name = "b", .flops = 1e12});
  overlapped->wait();  // a compute op ran meanwhile: left out
  comm::WorkPtr x = c.all_reduce(null(1 << 20, comm::DType::f32));
  comm::WorkPtr y = c.all_reduce(null(1 << 20, comm::DType::f32));
  x->wait();  // both counted: the comm stream runs them one after the other
  y->wait();
  y->wait();  // counted once
  comm::WorkPtr z = c.all_reduce(null(1 << 20, comm::DType::f32));
  comm::WorkPtr m = c.send(null(8, comm::DType::f32), 1);
  z->wait();  // a message was posted meanwhile: left out
  m->wait();
}

// forced_busy, the clock's lower bound of a step: compute plus the collectives waited with nothing
// between issue and wait; a collective that a compute op or a message overlaps is left out.
TEST(SymmetricClock, ForcedBusyIsComputeAndTheCollectivesWaitedAtOnce) {
  const sim::Topology t = topology();
  sim::SymmetricClock c(kPerStage, t);
  // A bound_only clock gives the same bounds with its messages untimed.
  sim::SymmetricClock b(kPerStage, t);
  b.bound_only();
  for (sim::SymmetricClock* x : {&b, &c}) forced_program(*x);
  const std::vector<int> members = {0, 1, 2, 3};
  const sim::LinkCost link = sim::group_link(t, members);
  const double want =
      2 * sim::compute_seconds(t, 1e12, 0) +
      sim::op_seconds(sim::OpKind::all_reduce, kPerStage, 4.0 * (1 << 22), link) +
      2 * sim::op_seconds(sim::OpKind::all_reduce, kPerStage, 4.0 * (1 << 20), link);
  const sim::ClockStep st = c.steps().at(0);
  EXPECT_NEAR(st.forced_busy, want, 1e-12 * want);
  EXPECT_GT(st.seconds(), st.forced_busy);
  EXPECT_EQ(b.steps().at(0).forced_busy, st.forced_busy);
  EXPECT_EQ(b.steps().at(0).forced_listed, st.forced_listed);
  EXPECT_LT(b.steps().at(0).comm_busy, st.comm_busy);  // the message is not timed
}

// A region memoised on a bound_only clock (SymmetricClock::memo_region) is run once per key and
// replayed after: the step's sums are those of running it every time, also with a collective
// pending from before the region (the region's compute leaves it out either way). A timed clock
// replays a region only from an idle comm stream, with the same times. A region with no compute
// op or message, or one crossing a step boundary, is refused.
TEST(SymmetricClock, AMemoisedRegionAddsWhatItAddedTheFirstTime) {
  const sim::Topology t = topology();
  const auto halves = [](int r) { return r / 2; };
  const auto same = [](int r) { return r; };
  int ran = 0;
  const auto program = [&](sim::SymmetricClock& c, bool memo) {
    c.list_groups({"in-block"});
    const auto tp = c.split(0, 0, {.name = "in-block"});
    c.begin_step(1);
    for (int i = 0; i < 4; ++i) {
      comm::WorkPtr pending = c.all_reduce(null(1 << 22, comm::DType::f32));
      const auto region = [&](int kind) {
        ++ran;
        tp->all_reduce(null(1 << 20, comm::DType::f32))->wait();
        c.compute({.name = "block", .flops = kind == 0 ? 1e12 : 3e12, .bytes = 1e9});
        c.all_reduce(null(1 << 18, comm::DType::f32))->wait();
        tp->send(null(8, comm::DType::f32), 1)->wait();
      };
      for (const int kind : {0, 1, 0})
        if (memo)
          c.memo_region(static_cast<std::uint64_t>(kind), [&] { region(kind); });
        else
          region(kind);
      pending->wait();
    }
  };
  sim::SymmetricClock plain(kPerStage, t, {{halves, same}});
  plain.bound_only();
  program(plain, false);
  ran = 0;
  sim::SymmetricClock memo(kPerStage, t, {{halves, same}});
  memo.bound_only();
  program(memo, true);
  EXPECT_EQ(ran, 2);  // each kind once
  const sim::ClockStep a = plain.steps().at(0), b = memo.steps().at(0);
  EXPECT_GT(a.forced_listed, 0);
  EXPECT_LT(a.forced_listed, a.forced_busy);
  EXPECT_NEAR(b.forced_busy, a.forced_busy, 1e-12 * a.forced_busy);
  EXPECT_NEAR(b.forced_listed, a.forced_listed, 1e-12 * a.forced_listed);
  EXPECT_NEAR(b.compute_busy, a.compute_busy, 1e-12 * a.compute_busy);
  EXPECT_EQ(b.comm_ops, a.comm_ops);
  // Timed: a region is replayed only when the comm stream is idle as it starts, so the first of
  // each round (the pending collective still on the stream) runs each time; the step's times and
  // sums are those of running every region.
  sim::SymmetricClock every(kPerStage, t, {{halves, same}});
  program(every, false);
  ran = 0;
  sim::SymmetricClock timed(kPerStage, t, {{halves, same}});
  program(timed, true);
  EXPECT_EQ(ran, 6);
  const sim::ClockStep x = every.steps().at(0), y = timed.steps().at(0);
  EXPECT_GT(x.seconds(), x.compute_busy);
  EXPECT_NEAR(y.seconds(), x.seconds(), 1e-12 * x.seconds());
  EXPECT_NEAR(y.comm_busy, x.comm_busy, 1e-12 * x.comm_busy);
  EXPECT_NEAR(y.forced_busy, x.forced_busy, 1e-12 * x.forced_busy);
  EXPECT_NEAR(y.compute_busy, x.compute_busy, 1e-12 * x.compute_busy);
  // No event inside, or a step boundary inside: refused.
  sim::SymmetricClock c(kPerStage, t);
  c.bound_only();
  c.begin_step(1);
  EXPECT_THROW(c.memo_region(0, [&] { c.all_reduce(null(8, comm::DType::f32))->wait(); }),
               std::logic_error);
  EXPECT_THROW(c.memo_region(1,
                             [&] {
                               c.compute({.name = "x", .flops = 1});
                               c.begin_step(2);
                             }),
               std::logic_error);
}

// forced_listed counts compute and the forced collectives of the groups split under a listed
// name only: the world's and an unlisted group's leave it, a listed group's stays.
TEST(SymmetricClock, ForcedListedCountsOnlyTheListedGroups) {
  const sim::Topology t = topology();
  const auto halves = [](int r) { return r / 2; };
  const auto same = [](int r) { return r; };
  sim::SymmetricClock c(kPerStage, t, {{halves, same}, {halves, same}});
  c.list_groups({"in-block"});
  const auto listed = c.split(0, 0, {.name = "in-block"});
  const auto other = c.split(0, 0, {.name = "data"});
  c.begin_step(1);
  c.compute({.name = "a", .flops = 1e12});
  c.all_reduce(null(1 << 20, comm::DType::f32))->wait();        // the world: forced only
  other->all_reduce(null(1 << 20, comm::DType::f32))->wait();   // unlisted: forced only
  listed->all_reduce(null(1 << 20, comm::DType::f32))->wait();  // listed: both
  const std::vector<int> world = {0, 1, 2, 3}, half = {0, 1};
  const double pair =
      sim::op_seconds(sim::OpKind::all_reduce, 2, 4.0 * (1 << 20), sim::group_link(t, half));
  const double compute = sim::compute_seconds(t, 1e12, 0);
  const double all = sim::op_seconds(sim::OpKind::all_reduce, kPerStage, 4.0 * (1 << 20),
                                     sim::group_link(t, world));
  const sim::ClockStep st = c.steps().at(0);
  EXPECT_NEAR(st.forced_listed, compute + pair, 1e-12 * st.forced_listed);
  EXPECT_NEAR(st.forced_busy, compute + all + 2 * pair, 1e-12 * st.forced_busy);
}

// Each stage's forced_busy among the stages is the one its representative has timed alone, and
// below the stage's step.
TEST(StageWorld, ForcedBusyIsTheRepresentativesAloneAndBelowTheStep) {
  sim::StageWorld s = stage_world();
  s.run([](comm::Communicator& c) { program(c); });
  for (std::size_t stage = 0; stage < 2; ++stage) {
    sim::SymmetricClock alone(kRanks, topology(), rules(), static_cast<int>(stage) * kPerStage);
    program(alone);
    for (std::size_t step = 0; step < 2; ++step) {
      const sim::ClockStep& st = s.stage_steps()[stage][step];
      EXPECT_GT(st.forced_busy, st.compute_busy) << stage;  // the dp all_reduce waited at once
      EXPECT_DOUBLE_EQ(st.forced_busy, alone.steps()[step].forced_busy) << stage;
      EXPECT_LE(st.forced_busy, st.seconds()) << stage;
    }
  }
}

TEST(StageWorld, StagesThatDoNotMatchFailInsteadOfHanging) {
  sim::StageWorld s = stage_world();
  try {
    s.run([](comm::Communicator& c) { program(c, true); });
    FAIL() << "no error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("StageWorld"), std::string::npos) << e.what();
  }
}

// Both stages wait to receive first: a true deadlock, named by the message the last one waits on.
TEST(StageWorld, ADeadlockNamesWhatTheLastStageWaitsOn) {
  sim::StageWorld s = stage_world();
  try {
    s.run([](comm::Communicator& c) {
      auto dp = c.split(c.rank() / kPerStage, c.rank(), {.name = "dp"});  // the world's rules
      auto pp = c.split(c.rank() % kPerStage, c.rank(), {.name = "pp"});
      pp->recv(null(8, comm::DType::f32), 1 - pp->rank())->wait();
    });
    FAIL() << "no error";
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("every stage representative is blocked"), std::string::npos) << what;
    EXPECT_NE(what.find("the last at recv from 0 in pp"), std::string::npos) << what;
  }
}

// A message between stages that no one receives (never waited for either) is an error too.
TEST(StageWorld, AMessageLeftUnmatchedIsAnError) {
  sim::StageWorld s = stage_world();
  try {
    s.run([](comm::Communicator& c) {
      program(c);
      auto pp = c.split(c.rank() % kPerStage, c.rank(), {.name = "pp again"});
      if (c.rank() / kPerStage == 1) (void)pp->send(null(8, comm::DType::f32), 0);
    });
    FAIL() << "no error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("unmatched"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardcheck
