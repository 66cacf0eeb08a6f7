// Test support for `compare` (compare_test.cpp, compare_noise_test.cpp): dumps as lists of named
// arrays with patterned values, written with ref::TensorDumper, and BadInput's message.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "harness/cli_commands.hpp"
#include "reference/npy.hpp"

namespace shardcheck::harness::compare_support {

using Tensors = std::vector<std::pair<std::string, ref::HostArray>>;

// n values of alternating sign that differ with `salt`.
inline std::vector<double> values(std::size_t n, int salt) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = (i % 2 ? -1.0 : 1.0) * (0.37 * static_cast<double>(i + 1) + 0.11 * salt);
  return v;
}

// The float64 data of tensor `name` (throws if there is none).
inline std::vector<double>& f64(Tensors& t, const std::string& name) {
  for (auto& [n, a] : t)
    if (n == name) return std::get<std::vector<double>>(a.data);
  throw std::runtime_error("no tensor " + name);
}

inline std::filesystem::path write_dump(const std::filesystem::path& dir, const Tensors& t) {
  ref::TensorDumper d(dir);
  for (const auto& [n, a] : t) d.add(n, a);
  d.write_index();
  return dir;
}

// The message of the BadInput `f` throws ("" when it throws none).
inline std::string bad_input(const std::function<void()>& f) {
  try {
    f();
  } catch (const BadInput& e) {
    return e.what();
  }
  return "";
}

}  // namespace shardcheck::harness::compare_support
