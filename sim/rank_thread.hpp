// The thread a simulated rank runs on: a POSIX thread with a stack sized for the world, because
// the simulator runs up to 2^20 ranks in one process and the default stack (8 MiB, ulimit -s)
// reserves 8 GiB of address space for 1,024 ranks, more than an address-space cap often allows.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <functional>
#include <memory>

namespace shardcheck::sim {

// Stack bytes per rank thread for a world of `ranks`: 8 MiB each while 1 GiB covers them all,
// then 1 GiB shared out, at least 2 MiB (sanitizer builds keep 8 MiB: their frames are larger).
std::size_t rank_stack_bytes(int ranks);

class RankThread {
 public:
  // Starts body on a new thread with that stack; throws std::system_error when it cannot start.
  RankThread(std::function<void()> body, std::size_t stack_bytes);
  RankThread(RankThread&& other) noexcept;
  RankThread& operator=(RankThread&&) = delete;
  RankThread(const RankThread&) = delete;
  RankThread& operator=(const RankThread&) = delete;
  ~RankThread();  // joins a thread that was not joined
  void join();

 private:
  pthread_t thread_{};
  bool joinable_ = false;
  std::unique_ptr<std::function<void()>> body_;
};

}  // namespace shardcheck::sim
