// sim::Fibers (sim/fiber.hpp): the order they run in, suspension until a condition holds, the
// stuck() hook when every fiber waits, exceptions that stay inside a fiber, and deep stacks.
#include "sim/fiber.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace shardcheck::sim {
namespace {

TEST(Fibers, RunInSpawnOrderAndResumeWhenTheirConditionHolds) {
  Fibers fibers;
  std::vector<std::string> trace;
  int turn = 0;
  for (int i = 0; i < 3; ++i)
    fibers.spawn([&, i] {
      EXPECT_TRUE(Fibers::inside());
      trace.push_back("start " + std::to_string(i));
      Fibers::wait_until([&] { return turn == i; });  // fiber 0 goes on at once
      trace.push_back("go " + std::to_string(i));
      ++turn;
    });
  EXPECT_FALSE(Fibers::inside());
  fibers.run([] { FAIL() << "nobody is stuck"; });
  EXPECT_FALSE(Fibers::inside());
  EXPECT_EQ(trace,
            (std::vector<std::string>{"start 0", "go 0", "start 1", "go 1", "start 2", "go 2"}));
}

TEST(Fibers, ConditionsAreRecheckedUntilTheyHold) {
  // A ping-pong: each fiber waits for the other's count, so they alternate 1000 times.
  Fibers fibers;
  int a = 0, b = 0;
  fibers.spawn([&] {
    for (int k = 0; k < 1000; ++k) {
      Fibers::wait_until([&] { return b == a; });
      ++a;
    }
  });
  fibers.spawn([&] {
    for (int k = 0; k < 1000; ++k) {
      Fibers::wait_until([&] { return a == b + 1; });
      ++b;
    }
  });
  fibers.run([] { FAIL() << "a ping-pong never sticks"; });
  EXPECT_EQ(a, 1000);
  EXPECT_EQ(b, 1000);
}

TEST(Fibers, StuckIsCalledWhenEveryFiberWaitsAndMustReleaseOne) {
  Fibers fibers;
  bool failed = false;
  int released = 0, stuck_calls = 0;
  for (int i = 0; i < 2; ++i)
    fibers.spawn([&] {
      Fibers::wait_until([&] { return failed; });
      ++released;
    });
  fibers.run([&] {
    ++stuck_calls;
    failed = true;
  });
  EXPECT_EQ(stuck_calls, 1);
  EXPECT_EQ(released, 2);

  Fibers never;
  never.spawn([] { Fibers::wait_until([] { return false; }); });
  EXPECT_THROW(never.run([] {}), std::logic_error);  // a stuck() that releases nobody
}

TEST(Fibers, ExceptionsAreCaughtInsideTheirFiber) {
  Fibers fibers;
  std::string caught;
  bool other_ran = false;
  fibers.spawn([&] {
    try {
      Fibers::wait_until([&] { return other_ran; });
      throw std::runtime_error("from fiber 0");
    } catch (const std::exception& e) {
      caught = e.what();
    }
  });
  fibers.spawn([&] { other_ran = true; });
  fibers.run([] {});
  EXPECT_EQ(caught, "from fiber 0");
}

int fiber_recurse(int n) {
  volatile char frame[512] = {};  // ~1 MiB over 2000 frames: well inside the default stack
  frame[0] = static_cast<char>(n);
  return n == 0 ? frame[0] : fiber_recurse(n - 1) + 1 + frame[0] * 0;
}

TEST(Fibers, DeepCallsRunOnTheFiberStack) {
  Fibers fibers;
  int got = -1;
  fibers.spawn([&] { got = fiber_recurse(2000); });
  fibers.run([] {});
  EXPECT_EQ(got, 2000);
}

TEST(Fibers, MisuseIsALogicError) {
  EXPECT_THROW(Fibers::wait_until([] { return false; }), std::logic_error);  // not in a fiber
  EXPECT_NO_THROW(Fibers::wait_until([] { return true; }));                  // nothing to wait for
  Fibers outer;
  bool nested_threw = false;
  outer.spawn([&] {
    Fibers inner;
    inner.spawn([] {});
    try {
      inner.run([] {});
    } catch (const std::logic_error&) {
      nested_threw = true;
    }
  });
  bool spawn_threw = false;
  outer.spawn([&] {
    try {
      outer.spawn([] {});
    } catch (const std::logic_error&) {
      spawn_threw = true;
    }
  });
  outer.run([] {});
  EXPECT_TRUE(nested_threw);
  EXPECT_TRUE(spawn_threw);
}

}  // namespace
}  // namespace shardcheck::sim
