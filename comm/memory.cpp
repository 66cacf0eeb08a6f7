// MemoryTracker bookkeeping (see memory.hpp).
#include "comm/memory.hpp"

#include <sstream>

namespace shardcheck::comm {

std::string_view name_of(MemCategory c) {
  switch (c) {
    case MemCategory::params:
      return "params";
    case MemCategory::grads:
      return "grads";
    case MemCategory::optimizer:
      return "optimizer";
    case MemCategory::activations:
      return "activations";
    case MemCategory::temporary:
      return "temporary";
  }
  return "?";
}

std::size_t MemoryBreakdown::total() const {
  std::size_t t = 0;
  for (std::size_t b : bytes) t += b;
  return t;
}

std::string MemoryBreakdown::describe() const {
  std::ostringstream os;
  for (std::size_t i = 0; i < kMemCategories; ++i) {
    os << name_of(static_cast<MemCategory>(i)) << ' ' << bytes[i] << " B, ";
  }
  os << "total " << total() << " B";
  return os.str();
}

namespace {
std::string oom_message(int rank, MemCategory c, std::size_t requested, std::size_t budget,
                        const MemoryBreakdown& held, const std::string& phase) {
  std::ostringstream os;
  os << "rank " << rank << " out of memory in " << (phase.empty() ? "(no phase)" : phase)
     << ": allocating " << requested << " B of " << name_of(c) << " over a budget of " << budget
     << " B while holding " << held.describe();
  return os.str();
}
}  // namespace

OutOfMemoryError::OutOfMemoryError(int rank, MemCategory category, std::size_t requested,
                                   std::size_t budget, MemoryBreakdown held, std::string phase)
    : std::runtime_error(oom_message(rank, category, requested, budget, held, phase)),
      rank_(rank),
      category_(category),
      requested_(requested),
      budget_(budget),
      held_(held),
      phase_(std::move(phase)) {}

void MemoryTracker::allocate(MemCategory c, std::size_t bytes) {
  const std::size_t total = current_.total();
  if (budget_ != kUnlimited && (bytes > budget_ || total > budget_ - bytes)) {
    throw OutOfMemoryError(rank_, c, bytes, budget_, current_, phase_);
  }
  const auto i = static_cast<std::size_t>(c);
  current_.bytes[i] += bytes;
  if (current_.bytes[i] > category_peaks_.bytes[i]) category_peaks_.bytes[i] = current_.bytes[i];
  if (current_.total() > at_peak_.total()) {
    at_peak_ = current_;
    peak_phase_ = phase_;
  }
  sample();
}

void MemoryTracker::release(MemCategory c, std::size_t bytes) {
  const auto i = static_cast<std::size_t>(c);
  SC_CHECK(current_.bytes[i] >= bytes, "releasing " << bytes << " B of " << name_of(c)
                                                    << " while holding " << current_.bytes[i]);
  current_.bytes[i] -= bytes;
  sample();
}

void MemoryTracker::reset_peaks() {
  at_peak_ = current_;
  category_peaks_ = current_;
  peak_phase_ = phase_;
}

}  // namespace shardcheck::comm
