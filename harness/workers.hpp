// Workers: threads kept for the whole of a long computation (the planner's search), so that each
// call runs f(0) .. f(n - 1) on the same threads: no thread is started per call, and what a
// thread remembers (thread_local caches: shared_local_params) stays warm from one call to the
// next. The calling thread works too; the first exception a call raises is rethrown by run().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace shardcheck::harness {

class Workers {
 public:
  // threads: in all, the caller's included (at least 1).
  explicit Workers(unsigned threads) {
    for (unsigned k = 1; k < threads; ++k) threads_.emplace_back([this] { loop(); });
  }
  ~Workers() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // f(i) for every i in [0, n), each once, on every thread; returns when all are done.
  void run(std::size_t n, const std::function<void(std::size_t)>& f) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      job_ = &f;
      n_ = n;
      next_ = 0;
      error_ = nullptr;
      busy_ = threads_.size();
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return busy_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
      const std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_all();
    }
  }
  void work() {
    const std::function<void(std::size_t)>* job = nullptr;
    std::size_t n = 0;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      job = job_;
      n = n_;
    }
    for (std::size_t i; (i = next_.fetch_add(1)) < n;) {
      try {
        (*job)(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::size_t n_ = 0, busy_ = 0;
  std::atomic<std::size_t> next_{0};
  std::uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace shardcheck::harness
