// Invariant checks for the reference: a broken precondition throws std::logic_error with file:line.
// Not for errors a caller can recover from; reference/ has none (inputs are validated upstream).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace shardcheck::ref::detail {
[[noreturn]] inline void check_failed(const char* expr, const char* file, int line,
                                      const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": check failed: " << expr;
  if (!msg.empty()) os << " (" << msg << ")";
  throw std::logic_error(os.str());
}
}  // namespace shardcheck::ref::detail

#define REF_CHECK(cond, ...)                                               \
  do {                                                                     \
    if (!(cond)) {                                                         \
      ::shardcheck::ref::detail::check_failed(#cond, __FILE__, __LINE__,   \
                                              ::std::string{__VA_ARGS__}); \
    }                                                                      \
  } while (0)
