// The state behind sim/clock.hpp's communicators, shared by its parts (clock.cpp: the ops and
// their works; clock_split.cpp: splits; stage_world.cpp: the stage representatives' world). Not
// for use outside sim/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "comm/memory.hpp"
#include "sim/clock.hpp"
#include "sim/fiber.hpp"
#include "sim/topology.hpp"

namespace shardcheck::sim {

// Where the representatives of a StageWorld meet: the collectives of groups spanning stages and
// the point-to-point messages between stages, timed as sim/communicator.cpp and sim/p2p.cpp time
// them (a collective starts at the latest arrival, max of a rank's two streams; a message at the
// later of the two posts, on the compute stream). The representatives are fibers of one thread
// (sim/fiber.hpp): a representative suspends until its op is met; when every unfinished one is
// suspended, the program's stages do not match (a deadlock of the representatives), and every one
// of them throws.
// What a representative waits on, spelled out only when the world fails: built at every op, the
// words were most of a plan's allocations. The group's name is shared (a message's work may
// outlive the call that posted it); `detail` is read only while its caller waits.
struct WaitSite {
  std::string_view op;                       // "all_reduce", "send to", "split"
  std::shared_ptr<const std::string> group;  // the group's name
  int peer = -1;                             // a message's peer (world rank)
  std::string_view detail;                   // a split's name
  std::string text() const {
    std::string t(op);
    if (!detail.empty()) t += " " + std::string(detail);
    if (peer >= 0) return t + " " + std::to_string(peer) + " in " + *group;
    return t + " of " + *group;
  }
};

struct StageHub {
  std::function<int(int)> stage_of;
  std::vector<int> reps;
  std::string failure;     // set once: every waiter throws it
  WaitSite last_wait;      // what the last representative to suspend waits for
  int just_finished = -1;  // the stage that returned last, when none has suspended since
  struct Meet {
    int expected = 0, arrived = 0;
    double start = 0, end = 0;
    bool done = false;
  };
  std::map<std::tuple<std::string, std::vector<int>, std::uint64_t>, std::shared_ptr<Meet>> meets;
  int first_failed = -1;  // the stage whose own error the world failed on
  std::map<std::tuple<int, int, int, std::uint64_t>, std::shared_ptr<Meet>> pairs;

  // Suspends this representative until m is done or the world has failed.
  void await(Meet& m, const WaitSite& what) {
    if (!m.done && failure.empty()) {
      last_wait = what;
      just_finished = -1;
      Fibers::wait_until([&] { return m.done || !failure.empty(); });
    }
    if (!m.done) throw std::logic_error(failure);
  }
  // When every unfinished representative waits: fail the world (each waiter then throws).
  void stuck() {
    if (!failure.empty()) return;
    failure = just_finished >= 0
                  ? "StageWorld: stage " + std::to_string(just_finished) +
                        " finished while every other stage waits on it"
                  : "StageWorld: every stage representative is blocked (the stages' programs do "
                    "not match), the last at " +
                        last_wait.text();
  }
};

struct ClockState {
  sim::Topology topology;
  std::deque<SplitRule> splits;
  double compute = 0;    // compute stream: when the next compute op may start
  double comm_free = 0;  // comm stream: when the last collective ends
  // Compute ops, messages and step boundaries so far: a collective waited
  // while this is what it was at its issue counts in ClockStep::forced_busy.
  std::uint64_t events = 0;
  std::vector<ClockStep> steps;
  comm::MemoryTracker memory;
  std::string asymmetry;
  std::shared_ptr<StageHub> hub;    // StageWorld representatives only
  std::vector<std::string> listed;  // SymmetricClock::list_groups
  bool bound_only = false;          // SymmetricClock::bound_only
  // SymmetricClock::memo_region: per key, what the region added to its step; compute,
  // comm_free: the streams' ends after it, from the compute stream's time before it.
  struct Region {
    double compute_busy = 0, comm_busy = 0, forced_busy = 0, forced_listed = 0, compute = 0,
           comm_free = 0;
    std::size_t comm_ops = 0;
  };
  std::map<std::uint64_t, Region> regions;
  std::uint64_t stage_meets = 0;  // ops met with other stages' representatives so far
  std::size_t split_calls = 0;           // splits so far (their place in the program)
  std::shared_ptr<SplitMemo> split_memo;  // SymmetricClock::share_splits
  double now() const { return std::max(compute, comm_free); }
  ClockStep* current() { return steps.empty() ? nullptr : &steps.back(); }
};

}  // namespace shardcheck::sim
