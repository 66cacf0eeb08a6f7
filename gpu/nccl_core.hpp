// Internal to gpu/: the state behind an NcclCommunicator (kept in a shared_ptr so Works outlive
// the communicator object), checked CUDA/NCCL calls, staging of host buffers, and the Work.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/errors.hpp"
#include "gpu/nccl_communicator.hpp"

namespace shardcheck::gpu::detail {

ncclDataType_t nccl_type(comm::DType t);
ncclRedOp_t nccl_op(comm::ReduceOp op);  // avg maps to sum (the division is done afterwards)

// Throws comm::CommError naming ctx and the call when e != cudaSuccess.
void cuda_check(cudaError_t e, const comm::OpContext& ctx, const char* call);

// A non-blocking communicator returns from init/split at once: poll until it is ready. On an
// error, or when `timeout` passes (a member never joined), abort it and throw comm::CommError /
// comm::PeerError naming ctx and the call; when `cancel` is raised (a sibling thread failed),
// abort it and throw comm::AbortedError.
void settle_comm(ncclComm_t c, const comm::OpContext& ctx, const char* call,
                 std::chrono::milliseconds timeout, const std::atomic<bool>* cancel = nullptr);

// Makes `device` current for its lifetime and restores the caller's device after (destructors and
// Works released on a thread that is not the rank's must not move that thread's device).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = -1;
};

// One launch of NCCL work: the event recorded after it. P2P works share a launch that stays
// unlaunched until the held group is flushed.
struct Launch {
  cudaEvent_t event = nullptr;
  bool launched = false;
  ~Launch();
};

// A device buffer from cudaMallocAsync on the communicator's stream; freed stream-ordered.
struct Scratch {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

// Host results to copy out once the op completed.
struct CopyOut {
  void* host = nullptr;
  const void* dev = nullptr;
  std::size_t bytes = 0;
};

// What one op needs besides its launch: scratch to free and host copies to make after it.
struct Staging {
  std::vector<Scratch> free_after_wait;
  std::vector<CopyOut> copy_out;
};

struct Core : std::enable_shared_from_this<Core> {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  int rank = 0;
  int size = 0;
  std::string name;
  std::vector<int> members;
  NcclOptions options;
  std::shared_ptr<RankBooks> books;
  std::shared_ptr<std::atomic<bool>> cancel;
  bool is_aborted = false;
  std::string abort_reason;
  std::uint64_t seq = 0;                                  // collectives (and split) of this group
  std::map<std::pair<int, bool>, std::uint64_t> p2p_seq;  // (peer, is_send), as the simulator
  void* one = nullptr;                                    // 1 float on the device, for barrier

  struct HeldP2P {
    bool is_send = false;
    const void* send = nullptr;
    void* recv = nullptr;
    std::size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    int peer = 0;
  };
  std::vector<HeldP2P> held;
  std::shared_ptr<Launch> held_launch;
  comm::OpContext held_ctx;
  // Scratch of held p2p ops whose Work was dropped before the launch: freed (stream-ordered) only
  // after flush() enqueued the ops that read or write it.
  std::vector<Scratch> held_scratch;

  ~Core();
  int world_rank() const { return members[static_cast<std::size_t>(rank)]; }

  // The context of a new collective at the current sequence number (taken by arrive(), after the
  // arguments were checked, so a rejected call uses none, as in the simulator). Throws
  // AbortedError when aborted; makes the device current and clears a stale CUDA error.
  comm::OpContext begin(const char* op);
  // The context of a send/recv: "send to rank w" / "recv from rank w", numbered per (peer,
  // direction) as the simulator does, so p2p traffic does not shift the collectives' numbers.
  comm::OpContext begin_p2p(bool is_send, int peer);
  // A checked collective arrives: takes its sequence number, then check_signature().
  void arrive(const comm::OpContext& ctx, std::size_t count, comm::DType t, int root, int redop);
  // Makes `device` current for this thread.
  void use_device(const comm::OpContext& ctx) const;
  // Checks an NCCL return; ncclInProgress is polled until done. Errors abort and throw.
  void nccl_check(ncclResult_t r, const comm::OpContext& ctx, const char* call, int peer = -1);
  // Polls ncclCommGetAsyncError until it is no longer ncclInProgress (or the timeout).
  void settle(const comm::OpContext& ctx, const char* call);
  // Blocks until ev has completed; polls the async error, the cancel flag and the timeout. A
  // raised cancel flag aborts only after a short grace during which ev may still complete (the
  // sibling that raised it may have seen the same op finish first, e.g. a mismatch every member
  // detects after the same exchange).
  void wait_event(cudaEvent_t ev, const comm::OpContext& ctx, int peer);
  // True once the cancel flag has been up for longer than the grace (cancel_since tracks it).
  bool cancelled(std::chrono::steady_clock::time_point& cancel_since) const;
  // Non-blocking: true when the event completed or the communicator has failed.
  bool poll_event(cudaEvent_t ev);
  // Records a new launched event on the stream.
  std::shared_ptr<Launch> record(const comm::OpContext& ctx);
  // Launches the held p2p ops in one group.
  void flush(const comm::OpContext& ctx);
  // Ends an NCCL group opened by ncclGroupStart after a call inside it failed (the group depth is
  // per thread: left open, every later NCCL call of this thread would be deferred), then fails.
  [[noreturn]] void fail_in_group(ncclResult_t r, const comm::OpContext& ctx, const char* call,
                                  int peer);
  // Aborts (ncclCommAbort) and remembers why; idempotent.
  void abort(const std::string& why);
  // Throws the typed error for a failed NCCL result r (after aborting).
  [[noreturn]] void fail(ncclResult_t r, const comm::OpContext& ctx, const char* call, int peer);

  // With options.check_signatures: all-gathers this call's signature and throws MismatchError
  // (after aborting) on every member when any two disagree.
  void check_signature(const comm::OpContext& ctx, std::size_t count, comm::DType t, int root,
                       int redop);
  // Synchronous all-gather of n int64 per member (counts, signatures, split colors): returns
  // size * n values in group-rank order. Its scratch is freed on every path.
  std::vector<std::int64_t> exchange(const std::int64_t* mine, std::size_t n,
                                     const comm::OpContext& ctx, const char* call);

  // Device pointers for buffers: host buffers are staged through scratch.
  const void* in(const comm::ConstBuffer& b, Staging& s, const comm::OpContext& ctx);
  void* out(const comm::Buffer& b, Staging& s, const comm::OpContext& ctx);
  void* scratch(std::size_t bytes, Staging& s, const comm::OpContext& ctx);
  void release(Staging& s) noexcept;  // frees s's scratch on the stream
};

class NcclWork final : public comm::Work {
 public:
  NcclWork(std::shared_ptr<Core> core, std::shared_ptr<Launch> launch, comm::OpContext ctx,
           Staging staging, int peer = -1)
      : core_(std::move(core)),
        launch_(std::move(launch)),
        ctx_(std::move(ctx)),
        staging_(std::move(staging)),
        peer_(peer) {}
  ~NcclWork() override;
  void wait() override;
  bool is_completed() override;

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<Launch> launch_;
  comm::OpContext ctx_;
  Staging staging_;
  int peer_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Kernels the communicator needs (comm_kernels.cu), enqueued on `stream`. Each returns the launch
// error of its own kernel (a stale error of an earlier call is cleared first).
cudaError_t widen_to_f32(const void* src, comm::DType t, float* dst, std::size_t n,
                         cudaStream_t stream);
cudaError_t narrow_from_f32(const float* src, void* dst, comm::DType t, std::size_t n,
                            cudaStream_t stream);
// x[i] /= divisor, in x's dtype (integers truncate toward zero).
cudaError_t divide_inplace(void* x, comm::DType t, std::size_t n, int divisor, cudaStream_t stream);

}  // namespace shardcheck::gpu::detail
