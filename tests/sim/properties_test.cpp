// RapidCheck properties: each collective equals its plain serial definition for random world
// sizes, counts, dtypes, values and sub-group splits; all_gather(reduce_scatter) == all_reduce; and
// results are bitwise identical across runs with random per-rank delays. Mutations must be caught.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "sim/testing.hpp"
#include "sim/world.hpp"
#include "tests/sim/support.hpp"

namespace shardcheck::testing {
namespace {

using comm::Communicator;
using comm::DType;

// Random values of every scale (floats) or full range (integers), reproducible from a seed.
template <class T>
std::vector<T> random_values(std::uint64_t seed, std::size_t count) {
  std::mt19937_64 g(seed);
  std::vector<T> v(count);
  for (auto& x : v) {
    if constexpr (std::is_integral_v<T>) {
      x = static_cast<T>(g());
    } else {
      const double mant = std::uniform_real_distribution<double>(-1.0, 1.0)(g);
      const int exp = std::uniform_int_distribution<int>(-8, 8)(g);
      x = from_acc<T>(static_cast<typename OracleAcc<T>::type>(std::ldexp(mant, exp)));
    }
  }
  return v;
}

// all_reduce on n ranks of random data; returns the number of elements, over all ranks, that differ
// bitwise from the serial definition.
template <class T>
std::size_t all_reduce_wrong(int n, std::size_t count, ReduceOp op, bool in_place,
                             std::uint64_t seed,
                             sim::testing::Mutation planted = sim::testing::Mutation::none) {
  std::vector<std::vector<T>> in;
  for (int r = 0; r < n; ++r)
    in.push_back(random_values<T>(seed + static_cast<std::uint64_t>(r), count));
  const std::vector<T> want = serial_reduce(in, op);
  std::vector<std::size_t> wrong(static_cast<std::size_t>(n));
  sim::SimOptions so;
  so.planted = planted;
  sim::SimWorld w(n, so);
  w.run([&](Communicator& c) {
    std::vector<T> mine = in[static_cast<std::size_t>(c.rank())], out(count);
    if (in_place) {
      c.all_reduce(comm::view(std::span<T>(mine)), {.op = op})->wait();
      out = mine;
    } else {
      c.all_reduce(comm::cview(std::span<const T>(mine)), comm::view(std::span<T>(out)), {.op = op})
          ->wait();
    }
    wrong[static_cast<std::size_t>(c.rank())] = count_bitwise_diff(out.data(), want.data(), count);
  });
  std::size_t total = 0;
  for (auto x : wrong) total += x;
  return total;
}

RC_GTEST_PROP(Properties, AllReduceEqualsSerialDefinition, ()) {
  const int n = *rc::gen::inRange(1, 10);
  const auto count = static_cast<std::size_t>(*rc::gen::inRange(0, 400));
  const DType dt = *rc::gen::elementOf(
      std::vector<DType>(std::begin(comm::kAllDTypes), std::end(comm::kAllDTypes)));
  const ReduceOp op = *rc::gen::elementOf(
      std::vector<ReduceOp>(std::begin(kAllReduceOps), std::end(kAllReduceOps)));
  const bool in_place = *rc::gen::arbitrary<bool>();
  const auto seed = *rc::gen::arbitrary<std::uint32_t>();
  const std::size_t wrong = comm::visit_dtype(
      dt, [&](auto tag) { return all_reduce_wrong<decltype(tag)>(n, count, op, in_place, seed); });
  RC_ASSERT(wrong == 0u);
}

RC_GTEST_PROP(Properties, AllGatherOfReduceScatterEqualsAllReduce, ()) {
  const int n = *rc::gen::inRange(1, 10);
  const auto per_rank = static_cast<std::size_t>(*rc::gen::inRange(0, 50));
  const auto seed = *rc::gen::arbitrary<std::uint32_t>();
  const std::size_t count = per_rank * static_cast<std::size_t>(n);
  sim::SimWorld w(n);
  std::vector<int> ok(static_cast<std::size_t>(n), 0);
  w.run([&](Communicator& c) {
    const auto in = random_values<float>(seed + static_cast<std::uint64_t>(c.rank()), count);
    std::vector<float> ar(count), shard(per_rank), ag(count);
    c.all_reduce(std::span<const float>(in), std::span<float>(ar))->wait();
    c.reduce_scatter(comm::cview(std::span<const float>(in)), comm::view(std::span<float>(shard)))
        ->wait();
    c.all_gather(comm::cview(std::span<const float>(shard)), comm::view(std::span<float>(ag)))
        ->wait();
    ok[static_cast<std::size_t>(c.rank())] = count_bitwise_diff(ar.data(), ag.data(), count) == 0;
  });
  for (int x : ok) RC_ASSERT(x == 1);
}

RC_GTEST_PROP(Properties, SubGroupCollectivesEqualSerialDefinitions, ()) {
  const int n = *rc::gen::inRange(1, 10);
  const auto colors =
      *rc::gen::container<std::vector<int>>(static_cast<std::size_t>(n), rc::gen::inRange(-1, 3));
  const auto count = static_cast<std::size_t>(*rc::gen::inRange(0, 40));
  const auto root_pick = *rc::gen::inRange(0, 100);
  const auto seed = *rc::gen::arbitrary<std::uint32_t>();
  std::vector<std::vector<double>> in;
  for (int r = 0; r < n; ++r)
    in.push_back(random_values<double>(seed + static_cast<std::uint64_t>(r), count));
  std::vector<int> bad(static_cast<std::size_t>(n), 0);
  sim::SimWorld w(n);
  w.run([&](Communicator& c) {
    auto g = c.split(colors[static_cast<std::size_t>(c.rank())], c.rank());
    if (!g) return;
    std::vector<std::vector<double>> group_in;
    for (int m : g->members()) group_in.push_back(in[static_cast<std::size_t>(m)]);
    std::vector<double> v = in[static_cast<std::size_t>(c.rank())];
    g->all_reduce(std::span<double>(v), {.op = ReduceOp::max})->wait();
    bad[static_cast<std::size_t>(c.rank())] +=
        count_bitwise_diff(v.data(), serial_reduce(group_in, ReduceOp::max).data(), count) != 0;
    const int root = root_pick % g->size();
    std::vector<double> b = in[static_cast<std::size_t>(c.rank())];
    g->broadcast(comm::view(std::span<double>(b)), {.root = root})->wait();
    bad[static_cast<std::size_t>(c.rank())] += b != group_in[static_cast<std::size_t>(root)];
    std::vector<double> all(count * static_cast<std::size_t>(g->size())), want;
    g->all_gather(comm::cview(std::span<const double>(in[static_cast<std::size_t>(c.rank())])),
                  comm::view(std::span<double>(all)))
        ->wait();
    for (const auto& x : group_in) want.insert(want.end(), x.begin(), x.end());
    bad[static_cast<std::size_t>(c.rank())] += all != want;
  });
  for (int x : bad) RC_ASSERT(x == 0);
}

RC_GTEST_PROP(Properties, AllToAllVEqualsItsDefinition, ()) {
  const int n = *rc::gen::inRange(1, 8);
  const auto splits = *rc::gen::container<std::vector<int>>(static_cast<std::size_t>(n * n),
                                                            rc::gen::inRange(0, 6));
  auto s = [&](int src, int dst) {
    return static_cast<std::size_t>(splits[static_cast<std::size_t>(src * n + dst)]);
  };
  auto val = [](int src, int dst, std::size_t i) {
    return std::int64_t{src} * 1000000 + dst * 1000 + static_cast<std::int64_t>(i);
  };
  std::vector<int> bad(static_cast<std::size_t>(n), 0);
  sim::SimWorld w(n);
  w.run([&](Communicator& c) {
    const int r = c.rank();
    std::vector<std::size_t> sc, rc_;
    std::vector<std::int64_t> send, want;
    for (int j = 0; j < n; ++j) {
      sc.push_back(s(r, j));
      rc_.push_back(s(j, r));
      for (std::size_t i = 0; i < s(r, j); ++i) send.push_back(val(r, j, i));
      for (std::size_t i = 0; i < s(j, r); ++i) want.push_back(val(j, r, i));
    }
    std::vector<std::int64_t> out(want.size() + 3, -1);
    c.all_to_all_v(comm::cview(std::span<const std::int64_t>(send)), sc,
                   comm::view(std::span<std::int64_t>(out)), rc_)
        ->wait();
    bad[static_cast<std::size_t>(r)] =
        !std::equal(want.begin(), want.end(), out.begin()) || out.back() != -1;
  });
  for (int x : bad) RC_ASSERT(x == 0);
}

TEST(Determinism, BitwiseIdenticalAcrossRunsWithRandomDelays) {
  const int n = 6;
  const std::size_t count = 4099;
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 20; ++run) {
    std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
    sim::SimWorld w(n);
    w.run([&](Communicator& c) {
      std::mt19937 delay(static_cast<unsigned>(run * 131 + c.rank()));
      auto jitter = [&] { std::this_thread::sleep_for(std::chrono::microseconds(delay() % 300)); };
      auto v = random_values<float>(static_cast<std::uint64_t>(c.rank()), count);
      auto sub = c.split(c.rank() % 2, c.rank());
      for (int i = 0; i < 3; ++i) {
        jitter();
        c.all_reduce(std::span<float>(v))->wait();
        jitter();
        sub->all_reduce(std::span<float>(v), {.op = ReduceOp::avg})->wait();
        for (auto& x : v) x = x * 0.37f + 0.11f;  // keep values moving so any order change shows
      }
      results[static_cast<std::size_t>(c.rank())] = v;
    });
    if (run == 0) {
      first = results;
      continue;
    }
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(count_bitwise_diff(results[static_cast<std::size_t>(r)].data(),
                                   first[static_cast<std::size_t>(r)].data(), count),
                0u)
          << "run " << run << " rank " << r;
  }
}

// The checks above must be able to fail: plant each bug and require that it is caught.
TEST(Mutations, ReversedReductionOrderIsCaught) {
  ASSERT_EQ(all_reduce_wrong<float>(4, 1000, ReduceOp::sum, false, 7), 0u);
  EXPECT_GT(all_reduce_wrong<float>(4, 1000, ReduceOp::sum, false, 7,
                                    sim::testing::Mutation::reverse_order_on_odd_chunks),
            0u);
}

TEST(Mutations, ChunkBoundaryBugIsCaught) {
  ASSERT_EQ(all_reduce_wrong<double>(3, 13, ReduceOp::sum, true, 11), 0u);
  EXPECT_GT(all_reduce_wrong<double>(3, 13, ReduceOp::sum, true, 11,
                                     sim::testing::Mutation::skip_last_element_of_chunk),
            0u);
}

}  // namespace
}  // namespace shardcheck::testing
