// Fibers: cooperative tasks on the calling thread, for the planner's StageWorld (sim/clock.hpp),
// whose stage representatives block on each other at every message between stages. As threads,
// each such meet cost a futex wake and a trip through the kernel's scheduler (most of a 32-stage
// plan's wall time); as fibers, it is a user-space context switch (POSIX ucontext), and the run is
// one thread, so a search can time one candidate per core. The switches are annotated for
// AddressSanitizer and ThreadSanitizer, which otherwise lose track of the stacks.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace shardcheck::sim {

class Fibers {
 public:
  // Each fiber gets a stack of stack_bytes (reserved, touched as used) below a guard page.
  explicit Fibers(std::size_t stack_bytes = std::size_t{4} << 20);
  ~Fibers();
  Fibers(const Fibers&) = delete;
  Fibers& operator=(const Fibers&) = delete;

  // Adds a fiber that will run body (which must not throw: catch inside). Before run() only.
  void spawn(std::function<void()> body);
  // Runs the fibers until every one has returned: the current one until it suspends or returns,
  // then the next runnable one in spawn order after it. When none is runnable and some have not
  // returned, calls stuck() (which must make one runnable, e.g. by failing the world); throws
  // std::logic_error if it does not.
  void run(const std::function<void()>& stuck);

  // From inside a fiber of a running Fibers: suspends it until ready() is true (checked by the
  // scheduler, without switching to it). Returns at once when ready() already is.
  static void wait_until(const std::function<bool()>& ready);
  // True on a thread that is running a fiber now.
  static bool inside();

 private:
  struct Fiber;
  static void entry();
  void switch_to(Fiber& f);  // from the scheduler into f, until it suspends or returns
  void suspend(Fiber& f);    // from f back to the scheduler
  std::size_t stack_bytes_;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  struct Scheduler;
  std::unique_ptr<Scheduler> sched_;
};

}  // namespace shardcheck::sim
