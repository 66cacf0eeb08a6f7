// The two kinds of error in shardcheck. Typed exceptions a caller can act on (a collective that
// failed, with rank, group, op and sequence number), and SC_CHECK for broken invariants
// (file:line).
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardcheck::comm {

// Where a collective failure happened: the rank that saw it, the group, the op and its sequence
// number in that group (0-based, counted per group per rank).
struct OpContext {
  int rank = -1;
  std::string group;
  std::string op;
  std::uint64_t seq = 0;
  std::string describe() const;
};

class CommError : public std::runtime_error {
 public:
  CommError(OpContext ctx, const std::string& what);
  const OpContext& context() const { return ctx_; }

 private:
  OpContext ctx_;
};

// Arguments that can never work (wrong buffer size, dtype, root or peer out of range).
class InvalidArgument : public CommError {
 public:
  using CommError::CommError;
};

// Members of a group called different collectives (op, count, dtype, root, reduce op) at the same
// sequence number. `ranks` holds the two disagreeing group members as world ranks.
class MismatchError : public CommError {
 public:
  MismatchError(OpContext ctx, const std::string& what, std::vector<int> ranks)
      : CommError(std::move(ctx), what), ranks_(std::move(ranks)) {}
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  std::vector<int> ranks_;
};

// A peer failed (threw, crashed) or left without joining: the op can never complete.
class PeerError : public CommError {
 public:
  PeerError(OpContext ctx, const std::string& what, int peer)
      : CommError(std::move(ctx), what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// Every live rank is blocked and none can make progress. `missing` are the world ranks that never
// arrived at the op this rank waits in.
class DeadlockError : public CommError {
 public:
  DeadlockError(OpContext ctx, const std::string& what, std::vector<int> missing)
      : CommError(std::move(ctx), what), missing_(std::move(missing)) {}
  const std::vector<int>& missing() const { return missing_; }

 private:
  std::vector<int> missing_;
};

// A member's contribution arrived altered (its checksum at issue differs from the one verified
// before use). `source` is the world rank whose contribution was corrupted.
class CorruptionError : public CommError {
 public:
  CorruptionError(OpContext ctx, const std::string& what, int source)
      : CommError(std::move(ctx), what), source_(source) {}
  int source() const { return source_; }

 private:
  int source_;
};

// The communicator was aborted (by a failure elsewhere); every later op fails with this.
class AbortedError : public CommError {
 public:
  using CommError::CommError;
};

// A broken invariant inside shardcheck itself, with file:line.
class InvariantError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// "[0,2,5]": how rank lists appear in every message and table.
std::string rank_list(const std::vector<int>& ranks);

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expr,
                               const std::string& msg);
}

}  // namespace shardcheck::comm

// SC_CHECK(cond, "message " << value): throws InvariantError naming file, line and the condition.
#define SC_CHECK(cond, msg)                                                                    \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::ostringstream sc_check_os_;                                                         \
      sc_check_os_ << msg;                                                                     \
      ::shardcheck::comm::detail::check_failed(__FILE__, __LINE__, #cond, sc_check_os_.str()); \
    }                                                                                          \
  } while (false)
