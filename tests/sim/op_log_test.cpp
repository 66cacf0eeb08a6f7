// comm::RecordingCommunicator over the simulator: what it records (splits' groups included, waits
// once), the cost view (one-rank groups and splits dropped, waits renumbered), and
// first_difference finding a changed count, what it leaves to the data with routed splits, a
// replay of a recorded log issuing the same ops, and describe() of a rooted reduce.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "comm/op_log.hpp"
#include "sim/world.hpp"

namespace shardcheck {
namespace {

using K = comm::OpRecord::Kind;

// Every rank: step 1, a world all_reduce of `count` f32 waited twice, two computes, a split into
// one-rank groups and an all_reduce there, a send / recv ring.
std::vector<comm::OpLog> record(std::size_t count) {
  sim::SimOptions o;
  o.meta = true;
  sim::SimWorld w(2, o);
  std::vector<comm::OpLog> logs(2);
  w.run([&](comm::Communicator& c) {
    comm::RecordingCommunicator rec(c, logs[static_cast<std::size_t>(c.rank())]);
    rec.begin_step(1);
    comm::WorkPtr a = rec.all_reduce(comm::Buffer{nullptr, count, comm::DType::f32, {}});
    a->wait();
    a->wait();
    rec.compute({.name = "forward", .flops = 1e6});
    rec.compute({.name = "backward", .flops = 2e6, .bytes = 8});
    auto alone = rec.split(c.rank(), 0, {.name = "alone"});
    alone->all_reduce(comm::Buffer{nullptr, 4, comm::DType::f64, {}})->wait();
    const int peer = 1 - c.rank();
    comm::WorkPtr s = rec.send(comm::ConstBuffer{nullptr, 3, comm::DType::bf16}, peer);
    rec.recv(comm::Buffer{nullptr, 3, comm::DType::bf16, {}}, peer)->wait();
    s->wait();
  });
  return logs;
}

TEST(OpLog, RecordsEveryCallAndTheFirstWait) {
  const comm::OpLog l = record(16).front();
  std::vector<K> kinds;
  for (const comm::OpRecord& r : l.records) kinds.push_back(r.kind);
  EXPECT_EQ(kinds,
            (std::vector<K>{K::begin_step, K::all_reduce, K::wait, K::compute, K::compute, K::split,
                            K::all_reduce, K::wait, K::send, K::recv, K::wait, K::wait}));
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[1].name, "alone[0]");  // the simulator names a split group by its color
  EXPECT_EQ(l.groups[1].members, std::vector<int>{0});
  EXPECT_EQ(l.records[1].send_count, 16u);
  EXPECT_EQ(l.records[2].op, 1u);
  EXPECT_EQ(l.records[6].group, 1);
  EXPECT_EQ(l.records[8].root_or_peer, 1);
  EXPECT_EQ(l.records[11].op, 8u);
  EXPECT_EQ(l.records[4].step, 1);
}

TEST(OpLog, CostViewKeepsWhatACostModelReads) {
  const comm::OpLog v = comm::cost_view(record(16).front());
  std::vector<K> kinds;
  for (const comm::OpRecord& r : v.records) kinds.push_back(r.kind);
  EXPECT_EQ(kinds, (std::vector<K>{K::begin_step, K::all_reduce, K::wait, K::compute, K::compute,
                                   K::send, K::recv, K::wait, K::wait}));
  EXPECT_DOUBLE_EQ(v.records[4].flops, 2e6);
  EXPECT_DOUBLE_EQ(v.records[4].bytes, 8);
  EXPECT_EQ(v.records[8].op, 5u);  // renumbered: the send's index in the view
}

TEST(OpLog, FirstDifferenceNamesTheRecord) {
  const std::vector<comm::OpLog> a = record(16), b = record(17);
  EXPECT_EQ(comm::first_difference(comm::cost_view(a[0]), comm::cost_view(a[0])), "");
  const std::string d = comm::first_difference(comm::cost_view(a[0]), comm::cost_view(b[0]));
  EXPECT_NE(d.find("record 1 differs"), std::string::npos) << d;
  EXPECT_NE(d.find("f32 x 17"), std::string::npos) << d;
  // The two ranks' sends go to different peers.
  EXPECT_NE(comm::first_difference(comm::cost_view(a[0]), comm::cost_view(a[1])), "");
}

// A MoE dispatch (all_to_all_v) whose splits differ and an expert report whose FLOPs differ:
// different by default; the same with routed_splits and unchecked_flops, which still compare
// the group, the dtype and the number of peers; flops_named adds a name's FLOPs up.
TEST(OpLog, RoutedSplitsAndUncheckedFlopsCompareWhatTheDataDoesNotDecide) {
  const auto log = [](std::vector<std::size_t> splits, double flops, comm::DType t) {
    comm::OpLog l;
    l.groups.push_back({"ep", {0, 1}});
    comm::OpRecord a;
    a.kind = K::all_to_all_v;
    a.group = 0;
    a.dtype = t;
    a.send_counts = splits;
    a.recv_counts = splits;
    for (const std::size_t n : splits) a.send_count += n;
    a.recv_count = a.send_count;
    l.records.push_back(a);
    comm::OpRecord c;
    c.kind = K::compute;
    c.name = "moe experts forward";
    c.flops = flops;
    l.records.push_back(c);
    l.records.push_back(c);
    return l;
  };
  const comm::OpLog a = log({4, 6}, 100, comm::DType::f32), b = log({5, 5}, 80, comm::DType::f32);
  EXPECT_NE(comm::first_difference(a, b), "");
  comm::CompareOptions o;
  o.routed_splits = true;
  EXPECT_NE(comm::first_difference(a, b, o), "");  // the FLOPs still differ
  o.unchecked_flops = {"moe experts forward"};
  EXPECT_EQ(comm::first_difference(a, b, o), "");
  EXPECT_NE(comm::first_difference(a, log({5, 5}, 80, comm::DType::f64), o), "");
  EXPECT_NE(comm::first_difference(a, log({10}, 80, comm::DType::f32), o), "");
  EXPECT_DOUBLE_EQ(comm::flops_named(a, "moe experts forward"), 200);
  EXPECT_DOUBLE_EQ(comm::flops_named(a, "moe router"), 0);
}

// describe() of a reduce names its reduction and root, on the root (which receives) and off it.
TEST(OpLog, DescribesAReduceWithItsRoot) {
  sim::SimOptions o;
  o.meta = true;
  std::vector<comm::OpLog> logs(2);
  sim::SimWorld(2, o).run([&](comm::Communicator& c) {
    comm::RecordingCommunicator rec(c, logs[static_cast<std::size_t>(c.rank())]);
    rec.reduce(comm::ConstBuffer{nullptr, 8, comm::DType::f32},
               comm::Buffer{nullptr, c.rank() == 1 ? 8u : 0u, comm::DType::f32, {}}, 1,
               {.op = comm::ReduceOp::max})
        ->wait();
  });
  for (const comm::OpLog& l : logs) ASSERT_EQ(l.records.front().kind, K::reduce);
  EXPECT_EQ(logs[0].describe(logs[0].records.front()),
            "reduce f32 x 8 -> 0 max root 1 over world [0 1]");
  EXPECT_EQ(logs[1].describe(logs[1].records.front()),
            "reduce f32 x 8 -> 8 max root 1 over world [0 1]");
}

// Every op kind a block issues, on the world and a two-rank split, with waits out of issue order:
// recorded, then replayed (comm::replay) under a second recorder, the two logs are equal.
TEST(OpLog, ReplayIssuesTheRecordedOpsAgain) {
  sim::SimOptions o;
  o.meta = true;
  std::vector<comm::OpLog> recorded(2), replayed(2);
  const auto null = [](std::size_t n, comm::DType t) { return comm::Buffer{nullptr, n, t, {}}; };
  sim::SimWorld(2, o).run([&](comm::Communicator& c) {
    comm::OpLog& log = recorded[static_cast<std::size_t>(c.rank())];
    comm::RecordingCommunicator rec(c, log);
    const std::unique_ptr<comm::Communicator> pair = c.split(0, c.rank(), {.name = "pair"});
    comm::RecordingCommunicator rec_pair(*pair, log);
    comm::WorkPtr a = rec.all_reduce(null(8, comm::DType::f32), {.op = comm::ReduceOp::max});
    rec_pair.reduce_scatter(null(8, comm::DType::f64), null(4, comm::DType::f64))->wait();
    rec.compute({.name = "qkv", .flops = 3e6, .bytes = 12});
    rec_pair.all_gather(null(2, comm::DType::bf16), null(4, comm::DType::bf16))->wait();
    rec.all_to_all(null(6, comm::DType::f32), null(6, comm::DType::f32))->wait();
    rec.reduce(null(7, comm::DType::f32), null(c.rank() == 1 ? 7u : 0u, comm::DType::f32), 1,
               {.op = comm::ReduceOp::min})
        ->wait();
    const auto r0 = static_cast<std::size_t>(c.rank());
    const std::vector<std::size_t> splits{1 + r0, 2 + r0};  // receives what it sends
    rec_pair
        .all_to_all_v(null(splits[0] + splits[1], comm::DType::f32), splits,
                      null(splits[0] + splits[1], comm::DType::f32), splits)
        ->wait();
    const int peer = 1 - c.rank();
    comm::WorkPtr s = rec.send(null(5, comm::DType::f32), peer, {.tag = 72});
    comm::WorkPtr r = rec.recv(null(5, comm::DType::f32), peer, {.tag = 72});
    rec.compute({.name = "ring step", .flops = 1e6});
    r->wait();
    s->wait();
    a->wait();
  });
  EXPECT_THROW(comm::replay(recorded[0], {}), std::invalid_argument);  // no groups given
  sim::SimWorld(2, o).run([&](comm::Communicator& c) {
    const auto i = static_cast<std::size_t>(c.rank());
    comm::RecordingCommunicator rec(c, replayed[i]);
    const std::unique_ptr<comm::Communicator> pair = c.split(0, c.rank(), {.name = "pair"});
    comm::RecordingCommunicator rec_pair(*pair, replayed[i]);
    comm::Communicator* groups[] = {&rec, &rec_pair};
    comm::replay(recorded[i], groups);
  });
  for (std::size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(recorded[i].records.size(), 18u);
    EXPECT_EQ(comm::first_difference(recorded[i], replayed[i]), "") << "rank " << i;
  }
  // A log with a split or a step start is not replayed.
  EXPECT_THROW(comm::replay(record(16).front(), {}), std::invalid_argument);
}

}  // namespace
}  // namespace shardcheck
