// MemoryTracker: the per-rank tracked allocator's books. Strategies report every buffer they keep
// (parameters, gradients, optimizer state, activations, communication temporaries) as it is
// created and released; the tracker keeps current and peak bytes per category, the total peak and
// the step phase where it happened, and enforces an optional byte budget (a simulated OOM).
// Bookkeeping only: it does not allocate, and it is not thread-safe (one per rank thread).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/errors.hpp"

namespace shardcheck::comm {

enum class MemCategory : std::uint8_t { params, grads, optimizer, activations, temporary };
inline constexpr std::size_t kMemCategories = 5;
std::string_view name_of(MemCategory c);

struct MemoryBreakdown {
  std::array<std::size_t, kMemCategories> bytes{};
  std::size_t total() const;
  std::size_t operator[](MemCategory c) const { return bytes[static_cast<std::size_t>(c)]; }
  std::string describe() const;  // "params 1.2 KiB, grads ..., total ..."
};

// Thrown by MemoryTracker::allocate when the budget would be exceeded. `at_peak` is what the rank
// held just before the failing allocation (the OOM breakdown).
class OutOfMemoryError : public std::runtime_error {
 public:
  OutOfMemoryError(int rank, MemCategory category, std::size_t requested, std::size_t budget,
                   MemoryBreakdown held, std::string phase);
  int rank() const { return rank_; }
  MemCategory category() const { return category_; }
  std::size_t requested() const { return requested_; }
  std::size_t budget() const { return budget_; }
  const MemoryBreakdown& held() const { return held_; }
  const std::string& phase() const { return phase_; }

 private:
  int rank_;
  MemCategory category_;
  std::size_t requested_;
  std::size_t budget_;
  MemoryBreakdown held_;
  std::string phase_;
};

// The total a rank held just after one allocate or release, at the time and step its owner's clock
// gave (MemoryTracker::record_series).
struct MemorySample {
  double t = 0;
  int step = 0;
  std::size_t bytes = 0;
};

class MemoryTracker {
 public:
  static constexpr std::size_t kUnlimited = SIZE_MAX;
  explicit MemoryTracker(int rank = 0) : rank_(rank) {}

  int rank() const { return rank_; }
  void set_budget(std::size_t bytes) { budget_ = bytes; }
  std::size_t budget() const { return budget_; }
  // The step phase recorded with a new peak ("step 2 backward layers.1"). Free-form label.
  void set_phase(std::string phase) { phase_ = std::move(phase); }
  const std::string& phase() const { return phase_; }

  // Throws OutOfMemoryError (and changes nothing) when current + bytes would exceed the budget.
  void allocate(MemCategory c, std::size_t bytes);
  // SC_CHECKs that the category holds at least `bytes`.
  void release(MemCategory c, std::size_t bytes);

  const MemoryBreakdown& current() const { return current_; }
  // The breakdown at the moment the total peaked, and that peak's phase.
  const MemoryBreakdown& at_peak() const { return at_peak_; }
  std::size_t peak() const { return at_peak_.total(); }
  const std::string& peak_phase() const { return peak_phase_; }
  // Highest bytes each category reached on its own (not necessarily at the same moment).
  const MemoryBreakdown& category_peaks() const { return category_peaks_; }
  // Forgets peaks (not current holdings): a new measurement window.
  void reset_peaks();

  // Memory over time: from now on every allocate and release appends a sample stamped with *now
  // and *step (the owner's clock: the simulator's virtual compute clock of the rank). Both must
  // outlive the recording; stop_series() ends it and keeps the samples (for a copy that outlives
  // the clock).
  void record_series(const double* now, const int* step) {
    now_ = now;
    step_ = step;
  }
  void stop_series() { record_series(nullptr, nullptr); }
  const std::vector<MemorySample>& series() const { return series_; }

 private:
  void sample() {
    if (now_ != nullptr)
      series_.push_back({*now_, step_ != nullptr ? *step_ : 0, current_.total()});
  }
  int rank_;
  std::size_t budget_ = kUnlimited;
  std::string phase_;
  std::string peak_phase_;
  MemoryBreakdown current_;
  MemoryBreakdown at_peak_;
  MemoryBreakdown category_peaks_;
  const double* now_ = nullptr;
  const int* step_ = nullptr;
  std::vector<MemorySample> series_;
};

// RAII: holds `bytes` of category c in a tracker for its lifetime (a temporary buffer).
class TrackedBytes {
 public:
  TrackedBytes() = default;
  TrackedBytes(MemoryTracker& t, MemCategory c, std::size_t bytes) : t_(&t), c_(c), bytes_(bytes) {
    t.allocate(c, bytes);
  }
  ~TrackedBytes() { reset(); }
  TrackedBytes(TrackedBytes&& o) noexcept : t_(o.t_), c_(o.c_), bytes_(o.bytes_) { o.t_ = nullptr; }
  TrackedBytes& operator=(TrackedBytes&& o) noexcept {
    if (this != &o) {
      reset();
      t_ = o.t_;
      c_ = o.c_;
      bytes_ = o.bytes_;
      o.t_ = nullptr;
    }
    return *this;
  }
  TrackedBytes(const TrackedBytes&) = delete;
  TrackedBytes& operator=(const TrackedBytes&) = delete;
  void reset() {
    if (t_ != nullptr) t_->release(c_, bytes_);
    t_ = nullptr;
  }
  std::size_t bytes() const { return t_ != nullptr ? bytes_ : 0; }

 private:
  MemoryTracker* t_ = nullptr;
  MemCategory c_ = MemCategory::temporary;
  std::size_t bytes_ = 0;
};

}  // namespace shardcheck::comm
