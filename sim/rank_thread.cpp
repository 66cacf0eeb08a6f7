// RankThread (rank_thread.hpp): pthread_create with a stack-size attribute.
#include "sim/rank_thread.hpp"

#include <algorithm>
#include <climits>
#include <system_error>
#include <utility>

namespace shardcheck::sim {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

void* trampoline(void* arg) {
  (*static_cast<std::function<void()>*>(arg))();
  return nullptr;
}

}  // namespace

std::size_t rank_stack_bytes(int ranks) {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  constexpr std::size_t kMax = 8 * kMiB, kMin = 2 * kMiB, kTotal = 1024 * kMiB;
  if (kSanitized || ranks <= 0) return kMax;
  return std::clamp(kTotal / static_cast<std::size_t>(ranks), kMin, kMax);
}

RankThread::RankThread(std::function<void()> body, std::size_t stack_bytes)
    : body_(std::make_unique<std::function<void()>>(std::move(body))) {
  pthread_attr_t attr;
  if (int e = pthread_attr_init(&attr); e != 0) throw std::system_error(e, std::generic_category());
  int e = pthread_attr_setstacksize(
      &attr, std::max(stack_bytes, static_cast<std::size_t>(PTHREAD_STACK_MIN)));
  if (e == 0) e = pthread_create(&thread_, &attr, trampoline, body_.get());
  pthread_attr_destroy(&attr);
  if (e != 0) throw std::system_error(e, std::generic_category(), "pthread_create");
  joinable_ = true;
}

RankThread::RankThread(RankThread&& other) noexcept
    : thread_(other.thread_),
      joinable_(std::exchange(other.joinable_, false)),
      body_(std::move(other.body_)) {}

RankThread::~RankThread() {
  if (joinable_) join();
}

void RankThread::join() {
  if (!joinable_) return;
  pthread_join(thread_, nullptr);
  joinable_ = false;
}

}  // namespace shardcheck::sim
