// Number formatting shared by the planner's texts (plan.cpp's reasons, plan_search.cpp's): one
// printf-style rendering of a double and one GiB rendering, so the two speak the same units.
#pragma once

#include <cstdio>
#include <string>

#include "parallel/ledger.hpp"

namespace shardcheck::harness::plan_text {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// v rendered with one printf conversion spec ("%.1f", "%.3g", ...).
inline std::string fmt(const char* spec, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

// Bytes in GiB without the unit: whole numbers from 100 GiB up, one decimal below.
inline std::string gib(double bytes) {
  return fmt(bytes / kGiB >= 100 ? "%.0f" : "%.1f", bytes / kGiB);
}

// A ledger row's parts in GiB, for the "does not fit" reasons: "model state X with the gradients
// at their peak, all-gather peak Y, activations Z".
inline std::string memory_parts(const parallel::LedgerRow& l) {
  return "model state " + gib(static_cast<double>(l.model_state_at_peak())) +
         " with the gradients at their peak, all-gather peak " +
         gib(static_cast<double>(l.gather_peak)) + ", activations " +
         gib(static_cast<double>(l.activation_peak));
}

}  // namespace shardcheck::harness::plan_text
