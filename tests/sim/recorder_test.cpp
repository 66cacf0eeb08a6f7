// Flight recorder: the ring keeps the newest ops; every op of a run is recorded with its final
// state; after a deadlock or mismatch the records show who completed what and where each failed.
#include <gtest/gtest.h>

#include <vector>

#include "sim/recorder.hpp"
#include "sim/world.hpp"

namespace shardcheck::sim {
namespace {

TEST(FlightRecorder, RingKeepsTheNewestRecords) {
  FlightRecorder rec(4);
  for (int i = 0; i < 6; ++i) {
    FlightRecord r;
    r.op = "op" + std::to_string(i);
    r.state = i == 3 ? OpState::completed : OpState::issued;
    EXPECT_EQ(rec.push(r), static_cast<std::uint64_t>(i));
  }
  const auto snap = rec.snapshot();
  ASSERT_EQ(snap.size(), 4u);
  EXPECT_EQ(snap.front().id, 2u);
  EXPECT_EQ(snap.back().op, "op5");
  EXPECT_EQ(rec.find(1), nullptr);
  ASSERT_NE(rec.find(4), nullptr);
  EXPECT_EQ(rec.find(4)->op, "op4");
  ASSERT_NE(rec.last_completed(), nullptr);
  EXPECT_EQ(rec.last_completed()->op, "op3");
}

TEST(FlightRecorder, EveryOpOfARunIsRecordedCompleted) {
  SimWorld w(3);
  w.run([](comm::Communicator& c) {
    std::vector<float> v(5);
    c.all_reduce(comm::view(std::span<float>(v)))->wait();
    c.broadcast(comm::view(std::span<float>(v)), {.root = 2})->wait();
    const int next = (c.rank() + 1) % 3, prev = (c.rank() + 2) % 3;
    std::vector<float> in(5);
    auto s = c.send(comm::view(std::span<float>(v)), next);
    auto r = c.recv(comm::view(std::span<float>(in)), prev);
    s->wait();
    r->wait();
  });
  for (const auto& records : w.flight_records()) {
    ASSERT_EQ(records.size(), 4u);
    EXPECT_EQ(records[0].op, "all_reduce");
    EXPECT_EQ(records[0].seq, 0u);
    EXPECT_EQ(records[1].op, "broadcast");
    EXPECT_EQ(records[1].seq, 1u);
    EXPECT_EQ(records[1].root, 2);
    EXPECT_EQ(records[2].op.rfind("send to rank", 0), 0u) << records[2].op;
    EXPECT_EQ(records[3].op.rfind("recv from rank", 0), 0u) << records[3].op;
    for (const auto& r : records) {
      EXPECT_EQ(r.state, OpState::completed) << r.describe();
      EXPECT_EQ(r.count, 5u);
      EXPECT_GE(r.t_ended, r.t_issued);
    }
  }
}

TEST(FlightRecorder, AfterADeadlockRecordsShowWhoCompletedWhat) {
  SimWorld w(4);
  EXPECT_THROW(w.run([](comm::Communicator& c) {
    std::vector<double> v(16, 1.0);
    c.all_reduce(std::span<double>(v))->wait();
    if (c.rank() == 3) return;
    c.all_reduce(std::span<double>(v))->wait();
  }),
               RankFailure);
  const auto& recs = w.flight_records();
  ASSERT_EQ(recs[3].size(), 1u);
  EXPECT_EQ(recs[3][0].state, OpState::completed);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(recs[static_cast<std::size_t>(r)].size(), 2u);
    EXPECT_EQ(recs[static_cast<std::size_t>(r)][1].seq, 1u);
    EXPECT_EQ(recs[static_cast<std::size_t>(r)][1].state, OpState::failed);
  }
  try {
    w.run([](comm::Communicator& c) {
      std::vector<double> v(16, 1.0);
      c.all_reduce(std::span<double>(v))->wait();
      if (c.rank() == 3) return;
      c.all_reduce(std::span<double>(v))->wait();
    });
  } catch (const RankFailure& f) {
    EXPECT_NE(std::string(f.what()).find(
                  "rank 3: finished; last completed: all_reduce seq 0 of group world (f64 x 16)"),
              std::string::npos)
        << f.what();
  }
}

}  // namespace
}  // namespace shardcheck::sim
