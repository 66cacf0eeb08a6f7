// harness/workers.hpp: every index runs once per call on the same threads call after call (so a
// thread's cache stays warm), an exception from any index reaches the caller after the others
// finish, and the workers are reusable after it. Runs under TSan in CI (label sim).
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "harness/workers.hpp"

namespace shardcheck::harness {
namespace {

TEST(Workers, EveryIndexRunsOnceOnTheSameThreadsEachCall) {
  Workers w(4);
  std::mutex mu;
  std::set<std::thread::id> all;
  for (int call = 0; call < 50; ++call) {
    const std::size_t n = static_cast<std::size_t>(call) * 7;
    std::vector<std::atomic<int>> hits(n);
    w.run(n, [&](std::size_t i) {
      hits[i].fetch_add(1);
      const std::lock_guard<std::mutex> lock(mu);
      all.insert(std::this_thread::get_id());
    });
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << call << " " << i;
  }
  EXPECT_LE(all.size(), 4U);  // the caller and three workers, never a new thread
  EXPECT_GE(all.size(), 1U);
}

TEST(Workers, AnExceptionReachesTheCallerAndTheWorkersGoOn) {
  Workers w(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(w.run(100,
                     [&](std::size_t i) {
                       ran.fetch_add(1);
                       if (i == 17) throw std::runtime_error("index 17");
                     }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 100);  // the other indices still ran
  std::atomic<int> again{0};
  w.run(10, [&](std::size_t) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 10);
}

TEST(Workers, OneThreadIsTheCaller) {
  Workers w(1);
  std::set<std::thread::id> ids;
  w.run(5, [&](std::size_t) { ids.insert(std::this_thread::get_id()); });
  EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
}

}  // namespace
}  // namespace shardcheck::harness
