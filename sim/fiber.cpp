// The fibers of fiber.hpp: ucontext stacks mapped with a guard page, a round-robin scheduler on
// the calling thread, and the sanitizers' fiber-switch annotations around every switch.
#include "sim/fiber.hpp"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <system_error>
#include <utility>

#if defined(__SANITIZE_ADDRESS__)
#define SHARDCHECK_FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define SHARDCHECK_FIBER_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHARDCHECK_FIBER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define SHARDCHECK_FIBER_TSAN 1
#endif
#endif
#ifdef SHARDCHECK_FIBER_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef SHARDCHECK_FIBER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace shardcheck::sim {

struct Fibers::Fiber {
  std::function<void()> body;
  std::function<bool()> ready;  // set while suspended in wait_until
  ucontext_t ctx{};
  void* map = nullptr;  // the guard page, then the stack
  std::size_t map_bytes = 0;
  bool done = false;
  void* tsan = nullptr;
};

struct Fibers::Scheduler {
  ucontext_t ctx{};
  std::size_t current = 0;
  void* tsan = nullptr;
  const void* asan_bottom = nullptr;  // the scheduler's (the thread's) stack, for ASan
  std::size_t asan_size = 0;
};

namespace {
thread_local Fibers* t_running = nullptr;  // the Fibers whose run() this thread is in
thread_local bool t_inside = false;        // and a fiber of it is executing now

// Saves the running context in from and resumes to: swapcontext. Under AddressSanitizer it is
// spelled getcontext + setcontext, because ASan intercepts swapcontext only to print a warning
// (once, on stderr, which the CLI tests read as the command's output); the switches here carry
// ASan's own fiber annotations instead. ThreadSanitizer is told of the switch (to_tsan, the fiber
// resumed) here, in the frame that switches: TSan keeps a shadow call stack per fiber, and an
// instrumented frame between its switch and the context's would enter on one fiber's stack and
// return on another's.
void jump(ucontext_t& from, const ucontext_t& to, [[maybe_unused]] void* to_tsan) {
#ifdef SHARDCHECK_FIBER_TSAN
  __tsan_switch_to_fiber(to_tsan, 0);
#endif
#ifdef SHARDCHECK_FIBER_ASAN
  volatile bool resumed = false;
  if (getcontext(&from) != 0)
    throw std::system_error(errno, std::generic_category(), "Fibers: getcontext");
  if (resumed) return;  // a later setcontext(&from) lands here
  resumed = true;
  setcontext(&to);
  throw std::system_error(errno, std::generic_category(), "Fibers: setcontext");
#else
  if (swapcontext(&from, &to) != 0)
    throw std::system_error(errno, std::generic_category(), "Fibers: swapcontext");
#endif
}
}  // namespace

Fibers::Fibers(std::size_t stack_bytes)
    : stack_bytes_(stack_bytes), sched_(std::make_unique<Scheduler>()) {}

Fibers::~Fibers() {
  for (const std::unique_ptr<Fiber>& f : fibers_) {
#ifdef SHARDCHECK_FIBER_TSAN
    if (f->tsan) __tsan_destroy_fiber(f->tsan);
#endif
    if (f->map) munmap(f->map, f->map_bytes);
  }
}

void Fibers::spawn(std::function<void()> body) {
  if (t_running == this) throw std::logic_error("Fibers: spawn() while they run");
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto f = std::make_unique<Fiber>();
  f->body = std::move(body);
  f->map_bytes = page + (stack_bytes_ + page - 1) / page * page;
  void* m = mmap(nullptr, f->map_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "Fibers: mmap");
  f->map = m;
  if (mprotect(m, page, PROT_NONE) != 0)  // an overflow faults instead of writing over the heap
    throw std::system_error(errno, std::generic_category(), "Fibers: mprotect");
  if (getcontext(&f->ctx) != 0)
    throw std::system_error(errno, std::generic_category(), "Fibers: getcontext");
  f->ctx.uc_stack.ss_sp = static_cast<char*>(m) + page;
  f->ctx.uc_stack.ss_size = f->map_bytes - page;
  f->ctx.uc_link = nullptr;  // entry() never returns: it switches back itself
  makecontext(&f->ctx, &Fibers::entry, 0);
#ifdef SHARDCHECK_FIBER_TSAN
  f->tsan = __tsan_create_fiber(0);
#endif
  fibers_.push_back(std::move(f));
}

void Fibers::entry() {
  Fibers& g = *t_running;
  Fiber& f = *g.fibers_[g.sched_->current];
#ifdef SHARDCHECK_FIBER_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g.sched_->asan_bottom, &g.sched_->asan_size);
#endif
  f.body();
  f.done = true;
  // Back to the scheduler for good (ASan: nullptr frees this fiber's fake stack).
#ifdef SHARDCHECK_FIBER_ASAN
  __sanitizer_start_switch_fiber(nullptr, g.sched_->asan_bottom, g.sched_->asan_size);
#endif
#ifdef SHARDCHECK_FIBER_TSAN
  __tsan_switch_to_fiber(g.sched_->tsan, 0);
#endif
  setcontext(&g.sched_->ctx);
}

void Fibers::switch_to(Fiber& f) {
#ifdef SHARDCHECK_FIBER_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.ctx.uc_stack.ss_sp, f.ctx.uc_stack.ss_size);
#endif
  t_inside = true;
  jump(sched_->ctx, f.ctx, f.tsan);
  t_inside = false;
#ifdef SHARDCHECK_FIBER_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void Fibers::suspend(Fiber& f) {
#ifdef SHARDCHECK_FIBER_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, sched_->asan_bottom, sched_->asan_size);
#endif
  jump(f.ctx, sched_->ctx, sched_->tsan);
#ifdef SHARDCHECK_FIBER_ASAN
  __sanitizer_finish_switch_fiber(fake, &sched_->asan_bottom, &sched_->asan_size);
#endif
}

void Fibers::run(const std::function<void()>& stuck) {
  if (t_running) throw std::logic_error("Fibers: run() inside another run() on this thread");
  t_running = this;
  struct Reset {
    ~Reset() { t_running = nullptr; }
  } reset;
#ifdef SHARDCHECK_FIBER_TSAN
  sched_->tsan = __tsan_get_current_fiber();
#endif
  const std::size_t n = fibers_.size();
  std::size_t left = 0;
  for (const std::unique_ptr<Fiber>& f : fibers_) left += f->done ? 0 : 1;
  std::size_t next = 0;
  bool stuck_called = false;
  while (left > 0) {
    bool ran = false;
    for (std::size_t k = 0; k < n && !ran; ++k) {
      const std::size_t j = (next + k) % n;
      Fiber& f = *fibers_[j];
      if (f.done || (f.ready && !f.ready())) continue;
      sched_->current = j;
      switch_to(f);
      if (f.done) --left;
      next = j + 1;
      ran = true;
    }
    if (ran) {
      stuck_called = false;
      continue;
    }
    if (stuck_called)
      throw std::logic_error("Fibers: every fiber waits and stuck() released none of them");
    stuck();
    stuck_called = true;
  }
}

void Fibers::wait_until(const std::function<bool()>& ready) {
  if (ready()) return;
  if (!t_inside) throw std::logic_error("Fibers::wait_until outside a fiber");
  Fibers& g = *t_running;
  Fiber& f = *g.fibers_[g.sched_->current];
  f.ready = ready;
  g.suspend(f);
  f.ready = nullptr;
}

bool Fibers::inside() {
  return t_inside;
}

}  // namespace shardcheck::sim
