// The collective benchmark's #wrong column: zero on a correct backend for every op and dtype, and
// non-zero when a bug is planted in the simulator (so the column can fail); its size list, its
// flushed output and its time guard (a per-op cost that grows with the ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/bench_collectives.hpp"
#include "harness/budget.hpp"
#include "sim/testing.hpp"
#include "sim/world.hpp"

namespace shardcheck::harness {
namespace {

BenchResult small_bench(int ranks, BenchOp op, comm::DType dt, comm::ReduceOp redop,
                        sim::testing::Mutation planted = sim::testing::Mutation::none) {
  sim::SimOptions so;
  so.planted = planted;
  sim::SimWorld w(ranks, so);
  BenchOptions o;
  o.op = op;
  o.dtype = dt;
  o.redop = redop;
  o.min_bytes = 64;
  o.max_bytes = 8192;
  o.warmup = 1;
  o.iters = 2;
  return bench_collectives([&w](const auto& fn) { w.run(fn); }, "sim", ranks, o);
}

TEST(BenchCollectives, NoWrongElementsOnEveryOpAndDtype) {
  for (BenchOp op : {BenchOp::all_reduce, BenchOp::all_gather, BenchOp::reduce_scatter,
                     BenchOp::all_to_all, BenchOp::broadcast, BenchOp::reduce})
    for (comm::DType dt : comm::kAllDTypes)
      for (comm::ReduceOp redop : {comm::ReduceOp::sum, comm::ReduceOp::avg, comm::ReduceOp::prod,
                                   comm::ReduceOp::max, comm::ReduceOp::min}) {
        const BenchResult r = small_bench(3, op, dt, redop);
        ASSERT_EQ(r.rows.size(), 8u);
        EXPECT_EQ(r.total_wrong(), 0u)
            << name_of(op) << " " << comm::name_of(dt) << " " << comm::name_of(redop);
        for (const auto& row : r.rows) {
          EXPECT_EQ(row.bytes, row.count * comm::size_of(dt));
          EXPECT_GT(row.out_of_place.time_us, 0.0);
          EXPECT_NEAR(row.in_place.busbw_gbps, row.in_place.algbw_gbps * bus_factor(op, 3), 1e-9);
        }
      }
}

TEST(BenchCollectives, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::reduce_scatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::all_to_all, 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::broadcast, 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor(BenchOp::reduce, 8), 1.0);
}

TEST(BenchCollectives, EveryOpTheCommandAcceptsRunsAndIsChecked) {
  // An op the op table makes a bench op (parse_bench_op accepts its name) must be run and checked:
  // `bench collectives --op reduce` once timed an empty loop with #wrong 0.
  int ops = 0;
  for (int i = 0; i <= static_cast<int>(comm::Op::begin_step); ++i) {
    const auto op = static_cast<BenchOp>(i);
    BenchOp parsed{};
    if (!parse_bench_op(comm::name_of(op), parsed)) continue;
    ++ops;
    EXPECT_EQ(parsed, op);
    EXPECT_NO_THROW((void)small_bench(2, op, comm::DType::f32, comm::ReduceOp::sum))
        << comm::name_of(op);
  }
  EXPECT_EQ(ops, 6);
}

TEST(BenchCollectives, PlantedBugsShowUpAsWrongElements) {
  const auto planted = sim::testing::Mutation::skip_last_element_of_chunk;
  EXPECT_GT(small_bench(4, BenchOp::all_reduce, comm::DType::f32, comm::ReduceOp::sum, planted)
                .total_wrong(),
            0u);
  EXPECT_GT(small_bench(4, BenchOp::reduce_scatter, comm::DType::i32, comm::ReduceOp::max, planted)
                .total_wrong(),
            0u);
  EXPECT_GT(
      small_bench(4, BenchOp::reduce, comm::DType::f64, comm::ReduceOp::sum, planted).total_wrong(),
      0u);
  EXPECT_EQ(
      small_bench(4, BenchOp::all_reduce, comm::DType::f32, comm::ReduceOp::sum).total_wrong(), 0u);
}

// A size range that holds no element of the dtype runs no row: bench_counts says so (the command
// refuses it, exit 2, saying why), and the ops that split the buffer need a multiple of the ranks.
TEST(BenchCollectives, CountsOfEverySizeAndEmptyRanges) {
  BenchOptions o;
  o.dtype = comm::DType::f64;
  o.min_bytes = 3;
  o.max_bytes = 7;
  EXPECT_TRUE(bench_counts(o, 4).empty());
  o.max_bytes = 24;  // 3, 6, 12, 24 bytes: 1 and 3 doubles
  EXPECT_EQ(bench_counts(o, 4), (std::vector<std::size_t>{1, 3}));
  o.op = BenchOp::all_gather;  // 4 ranks: whole multiples of 4 elements only
  EXPECT_TRUE(bench_counts(o, 4).empty());
  o.max_bytes = 64;
  EXPECT_EQ(bench_counts(o, 4), (std::vector<std::size_t>{4}));
}

// A stream buffer that records the text it held at each flush.
class FlushLog : public std::stringbuf {
 public:
  std::vector<std::string> flushed;

 protected:
  int sync() override {
    flushed.push_back(str());
    return 0;
  }
};

// The header is flushed as soon as it is written (a run killed before its first row used to
// leave stdout empty), and each row as it finishes.
TEST(BenchCollectives, HeaderAndRowsAreFlushedAsWritten) {
  FlushLog buf;
  std::ostream os(&buf);
  BenchOptions o;
  print_header(os, "sim", 512, o);
  ASSERT_EQ(buf.flushed.size(), 1u);
  EXPECT_NE(buf.flushed[0].find("(elements)"), std::string::npos) << buf.flushed[0];
  print_row(os, o, BenchRow{4096, 1024, {}, {}});
  ASSERT_EQ(buf.flushed.size(), 2u);
  EXPECT_NE(buf.flushed[1].find("4096"), std::string::npos) << buf.flushed[1];
}

// The time estimate counts a fixed cost per collective that grows with the ranks (thread
// wake-ups), measured at 21-27 ms per op at 512 ranks on a 2-core VM: 512 ranks x 1,000,000
// iterations of 4 KiB is over an hour on 2 cores (it was estimated at 52 s, accepted, and ran
// ~13 h); the command refuses it under --max-time (cli_test.cpp).
TEST(BenchCollectives, PerOpCostRefusesRunsPastMaxTime) {
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const TimeEstimate big = estimate_bench_time(512, {4096}, 2, 1000000);
  EXPECT_GT(big.seconds * cores / 2, 3600.0);  // as on 2 cores
  EXPECT_NE(big.driver.find("--iters 1000000"), std::string::npos) << big.driver;
  // A lower bound of what was measured: 512 ranks, 10 iterations, 0.79 s wall on 2 cores.
  EXPECT_LT(estimate_bench_time(512, {4096}, 0, 10).seconds * cores / 2, 0.79);
  EXPECT_GT(sim_collective_seconds(512, 4096), 4 * sim_collective_seconds(128, 4096));
}

}  // namespace
}  // namespace shardcheck::harness
