// Number formatting shared by the planner's texts (plan.cpp's reasons, plan_search.cpp's): one
// printf-style rendering of a double and one GiB rendering, so the two speak the same units.
#pragma once

#include <cstdio>
#include <string>

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

}  // namespace shardcheck::harness::plan_text
