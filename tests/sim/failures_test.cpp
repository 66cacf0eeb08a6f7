// Failures must end the run with a typed error that names rank, group, op and seq — never a hang:
// mismatched collectives, skipped collectives (deadlock), cyclic sends, a rank that throws.
#include <gtest/gtest.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include "comm/errors.hpp"
#include "sim/rank_thread.hpp"
#include "sim/world.hpp"
#include "tests/sim/failure_support.hpp"

namespace shardcheck::testing {
namespace {

using comm::Communicator;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Failures, CountMismatchNamesBothRanksAndSeq) {
  auto [f, e] = expect_failure<comm::MismatchError>(3, [](Communicator& c) {
    std::vector<float> a(8, 1.0f);
    c.all_reduce(std::span<float>(a))->wait();  // seq 0 agrees
    std::vector<float> b(c.rank() == 2 ? 5 : 4, 1.0f);
    c.all_reduce(std::span<float>(b))->wait();  // seq 1: rank 2 passes 5 elements
  });
  std::vector<int> ranks = e.ranks();
  std::sort(ranks.begin(), ranks.end());
  EXPECT_TRUE(std::find(ranks.begin(), ranks.end(), 2) != ranks.end()) << e.what();
  EXPECT_EQ(e.context().seq, 1u);
  EXPECT_EQ(e.context().group, "world");
  EXPECT_TRUE(contains(e.what(), "count=5")) << e.what();
  EXPECT_TRUE(contains(e.what(), "count=4")) << e.what();
}

TEST(Failures, EveryKindOfDisagreementIsAMismatch) {
  using Call = std::function<void(Communicator&, bool odd)>;
  const std::vector<std::pair<std::string, Call>> cases = {
      {"op kind",
       [](Communicator& c, bool odd) {
         std::vector<float> v(4 * static_cast<std::size_t>(c.size()));
         if (odd)
           c.all_gather(comm::view(std::span<float>(v)))->wait();
         else
           c.all_reduce(comm::view(std::span<float>(v)))->wait();
       }},
      {"dtype",
       [](Communicator& c, bool odd) {
         std::vector<float> f(4);
         std::vector<std::int32_t> i(4);
         if (odd)
           c.all_reduce(comm::view(std::span<std::int32_t>(i)))->wait();
         else
           c.all_reduce(comm::view(std::span<float>(f)))->wait();
       }},
      {"reduce op",
       [](Communicator& c, bool odd) {
         std::vector<float> v(4);
         c.all_reduce(comm::view(std::span<float>(v)),
                      {.op = odd ? comm::ReduceOp::max : comm::ReduceOp::sum})
             ->wait();
       }},
      {"root",
       [](Communicator& c, bool odd) {
         std::vector<float> v(4);
         c.broadcast(comm::view(std::span<float>(v)), {.root = odd ? 1 : 0})->wait();
       }},
  };
  for (const auto& [what, call] : cases) {
    SCOPED_TRACE(what);
    auto [f, e] =
        expect_failure<comm::MismatchError>(4, [&](Communicator& c) { call(c, c.rank() == 3); });
    EXPECT_EQ(e.ranks().size(), 2u);
  }
}

TEST(Failures, ReduceToAnotherRootIsAMismatchNamingBothRanks) {
  auto [f, e] = expect_failure<comm::MismatchError>(4, [](Communicator& c) {
    std::vector<float> v(4, 1.0f);
    c.reduce(comm::view(std::span<float>(v)), c.rank() == 2 ? 1 : 0)->wait();
  });
  std::vector<int> ranks = e.ranks();
  std::sort(ranks.begin(), ranks.end());
  ASSERT_EQ(ranks.size(), 2u) << e.what();
  EXPECT_TRUE(std::find(ranks.begin(), ranks.end(), 2) != ranks.end()) << e.what();
  EXPECT_EQ(e.context().op, "reduce");
  EXPECT_TRUE(contains(e.what(), "root=1")) << e.what();
  EXPECT_TRUE(contains(e.what(), "root=0")) << e.what();
}

TEST(Failures, ARankThatSkipsAReduceIsADeadlockNamingIt) {
  auto [f, e] = expect_failure<comm::DeadlockError>(4, [](Communicator& c) {
    std::vector<double> v(16, 1.0);
    if (c.rank() == 1) return;  // never joins the reduce
    c.reduce(comm::view(std::span<double>(v)), 0)->wait();
  });
  EXPECT_EQ(e.missing(), std::vector<int>{1});
  EXPECT_EQ(e.context().op, "reduce");
  EXPECT_EQ(e.context().seq, 0u);
}

TEST(Failures, SplitSizesThatDisagreeAreAMismatch) {
  auto [f, e] = expect_failure<comm::MismatchError>(2, [](Communicator& c) {
    std::vector<float> send(4), recv(4);
    std::vector<std::size_t> sc{2, 2}, rc{2, c.rank() == 0 ? 1u : 2u};
    c.all_to_all_v(comm::view(std::span<float>(send)), sc, comm::view(std::span<float>(recv)), rc)
        ->wait();
  });
  EXPECT_TRUE(contains(e.what(), "expects 1 elements from rank 1")) << e.what();
}

TEST(Failures, SkippedCollectiveIsADeadlockNamingTheMissingRank) {
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(n);
    auto [f, e] = expect_failure<comm::DeadlockError>(n, [n](Communicator& c) {
      std::vector<double> v(16, 1.0);
      c.all_reduce(std::span<double>(v))->wait();
      if (c.rank() == n - 1) return;  // skips the second collective and leaves
      c.all_reduce(std::span<double>(v))->wait();
    });
    EXPECT_EQ(e.missing(), std::vector<int>{n - 1});
    EXPECT_EQ(e.context().op, "all_reduce");
    EXPECT_EQ(e.context().seq, 1u);
    EXPECT_TRUE(contains(e.what(), "rank " + std::to_string(n - 1) + ": finished")) << e.what();
  }
}

TEST(Failures, CollectivesInDifferentOrderDeadlock) {
  auto [f, e] = expect_failure<comm::DeadlockError>(4, [](Communicator& c) {
    auto pair = c.split(c.rank() / 2, c.rank(), {.name = "pair"});
    std::vector<float> v(4);
    if (c.rank() == 0) {  // rank 0 enters the world op first; everyone else the pair op first
      c.all_reduce(comm::view(std::span<float>(v)))->wait();
      pair->all_reduce(comm::view(std::span<float>(v)))->wait();
    } else {
      pair->all_reduce(comm::view(std::span<float>(v)))->wait();
      c.all_reduce(comm::view(std::span<float>(v)))->wait();
    }
  });
  EXPECT_TRUE(contains(e.what(), "rank 0: waits in all_reduce seq 1 of group world")) << e.what();
  EXPECT_TRUE(contains(e.what(), "rank 1: waits in all_reduce seq 0 of group pair[0,1]"))
      << e.what();
}

TEST(Failures, CyclicBlockingSendsDeadlock) {
  auto [f, e] = expect_failure<comm::DeadlockError>(2, [](Communicator& c) {
    std::vector<float> out(4, 1.0f), in(4);
    const int peer = 1 - c.rank();
    c.send(comm::view(std::span<float>(out)), peer)->wait();  // both wait on a send: rendezvous
    c.recv(comm::view(std::span<float>(in)), peer)->wait();
  });
  EXPECT_EQ(e.missing().size(), 1u);
  EXPECT_TRUE(contains(e.what(), "send to rank")) << e.what();
}

TEST(Failures, AThrowingRankIsReportedAndReleasesTheOthers) {
  sim::SimWorld w(4);
  try {
    w.run([](Communicator& c) {
      std::vector<float> v(4);
      if (c.rank() == 1) throw std::runtime_error("planted failure");
      c.all_reduce(comm::view(std::span<float>(v)))->wait();
    });
    FAIL() << "the run did not fail";
  } catch (const sim::RankFailure& f) {
    EXPECT_EQ(f.rank(), 1);
    EXPECT_TRUE(contains(f.what(), "planted failure")) << f.what();
  }
  for (const auto& o : w.outcomes()) {
    EXPECT_FALSE(o.ok) << "rank " << o.rank;  // everyone ended; nobody was left waiting
    EXPECT_EQ(o.root_cause, o.rank == 1) << o.message;
  }
  // The world is reusable after a failed run.
  w.run([](Communicator& c) { c.barrier()->wait(); });
}

TEST(Failures, BadArgumentsAreInvalidArgumentOnTheCallingRank) {
  auto [f, e] = expect_failure<comm::InvalidArgument>(2, [](Communicator& c) {
    std::vector<float> a(4), b(c.rank() == 0 ? 3 : 4);
    c.all_reduce(comm::cview(std::span<const float>(a)), comm::view(std::span<float>(b)))->wait();
  });
  EXPECT_EQ(f.rank(), 0);
  std::vector<float> dev(4);
  comm::Buffer on_gpu{dev.data(), 4, comm::DType::f32, {comm::DeviceKind::cuda, 0}};
  auto [f2, e2] = expect_failure<comm::InvalidArgument>(
      1, [&](Communicator& c) { c.all_reduce(on_gpu)->wait(); });
  EXPECT_TRUE(contains(e2.what(), "host buffers")) << e2.what();
  auto [f3, e3] = expect_failure<comm::InvalidArgument>(2, [&](Communicator& c) {
    std::vector<float> v(4);
    c.broadcast(comm::view(std::span<float>(v)), {.root = 2})->wait();
  });
  EXPECT_TRUE(contains(e3.what(), "root 2")) << e3.what();
}

// A rank thread that cannot start (the system's thread limit, injected here through
// SimOptions::thread_limit) is an error naming how many started, never std::terminate or a hang:
// the started ranks, blocked on peers that never come, are aborted and joined. The world runs
// again afterwards.
TEST(SimFailures, ThreadsThatCannotStartAreNamedNotFatal) {
  sim::SimWorld w(8, {.thread_limit = 5});
  const auto fn = [](Communicator& c) {
    std::vector<double> v(4, 1.0);
    c.all_reduce(std::span<double>(v))->wait();
  };
  try {
    w.run(fn);
    ADD_FAILURE() << "8 ranks ran with 5 threads";
  } catch (const sim::ThreadStartError& e) {
    EXPECT_TRUE(contains(e.what(), "could start only 5 of 8 rank threads")) << e.what();
  }
  sim::SimWorld ok(8);
  EXPECT_NO_THROW(ok.run(fn));
}

// 1,024 ranks at the default 8 MiB stack reserve 8 GiB of address space: the rank threads' stacks
// shrink with the world (1 GiB in all, at least 2 MiB each), so a large world runs under an
// address-space cap. Every rank of a 512-rank world checks the stack it was given.
TEST(SimFailures, RankStacksShrinkWithTheWorld) {
  EXPECT_EQ(sim::rank_stack_bytes(8), std::size_t{8} << 20);
  const std::size_t want = sim::rank_stack_bytes(512);
  EXPECT_LE(want, std::size_t{8} << 20);
  sim::SimWorld w(512);
  std::atomic<int> wrong{0}, larger{0};
  w.run([&](Communicator& c) {
    pthread_attr_t attr;
    std::size_t got = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstacksize(&attr, &got);
      pthread_attr_destroy(&attr);
    }
    if (got < want) ++wrong;
    if (got > want + (std::size_t{1} << 20)) ++larger;
    std::vector<double> v(2, 1.0);
    c.all_reduce(std::span<double>(v))->wait();
    if (v[0] != 512.0) ++wrong;
  });
  EXPECT_EQ(wrong.load(), 0);
  // glibc hands a new thread a cached stack of a finished one when it is large enough (its cache
  // holds about 40 MiB): a few ranks may run on an earlier test's 8 MiB stack, not hundreds.
  EXPECT_LE(larger.load(), 8);
}

}  // namespace
}  // namespace shardcheck::testing
