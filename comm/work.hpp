// The handle every collective and point-to-point call returns.
// Contract of Work::wait(), the same for every backend:
//   - It blocks until the operation has completed *on this rank*: the receive buffer holds the
//     result and the send buffer may be reused or freed. Before wait() returns, touching either
//     buffer is undefined (as with NCCL and c10d).
//   - It is idempotent: a second call returns at once, or throws the same error again.
//   - On failure it throws a subclass of comm::CommError naming rank, group, op and sequence
//   number:
//     MismatchError (members disagree on the op), PeerError (a peer failed or left), DeadlockError
//     (no rank can progress), AbortedError (the communicator was aborted by a failure elsewhere),
//     CorruptionError (a member's payload failed its checksum, where the backend checks them).
//     After such an error the communicator is unusable: every later call throws AbortedError.
//   - A backend may also raise these errors from the issuing call itself (the simulator detects a
//     mismatch on arrival). Dropping a Work without waiting neither cancels nor completes the op.
#pragma once

#include <memory>

namespace shardcheck::comm {

class Work {
 public:
  virtual ~Work() = default;
  // Blocks until complete on this rank; throws CommError on failure (see the contract above).
  virtual void wait() = 0;
  // Non-blocking: true once wait() would return (or throw) without blocking.
  virtual bool is_completed() = 0;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is already finished: for backends that complete an op before returning.
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

}  // namespace shardcheck::comm
