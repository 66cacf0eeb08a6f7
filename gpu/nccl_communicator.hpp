// NcclCommunicator: comm::Communicator over NCCL on one CUDA device and one CUDA stream.
//
// - Buffers with Device{cuda, d} are device pointers on this rank's device d. Host buffers are
//   accepted too and staged through device scratch (copied in at issue, copied out in wait()), so
//   the parallel/ strategies, written against host spans, run unchanged; device buffers avoid it.
// - Every call enqueues on the communicator's stream and returns at once; the Work records a CUDA
//   event after the op. wait() polls that event and ncclCommGetAsyncError; past the timeout it
//   calls ncclCommAbort, so a hung or dead peer becomes a typed comm::CommError, not a frozen job.
// - Communicators are non-blocking (ncclConfig_t::blocking = 0): an ncclInProgress return is
//   polled to completion under the same timeout.
// - Every CUDA and NCCL return code is checked; errors name rank, group, op and sequence number,
//   numbered as the simulator does: collectives and split by one counter per group, taken once the
//   arguments are accepted; send/recv ("send to rank w", "recv from rank w") per (peer, direction).
//   After any failure the communicator is aborted and every later call throws AbortedError.
// - send/recv are rendezvous as the interface says. Posted p2p ops are held and launched together
//   in one ncclGroupStart/End when a p2p Work is waited on (or polled) or another op is issued, so
//   "post both sides, then wait" works as in the simulator. NCCL has no tags: messages match in
//   posting order per (sender, receiver); the tag is ignored. One stream carries everything, so a
//   held p2p op runs before any collective issued after it: a rank that posts a recv, then joins a
//   collective whose peer sends only after that collective, waits until the timeout (PeerError)
//   where the simulator would complete.
// - Reductions: NCCL chooses the order (ring/tree), so results are not bitwise equal to the
//   simulator's rank order; avg is sum then one division by the group size (integers truncate);
//   bf16/f16 are widened to f32, reduced in f32 and rounded once (NcclOptions::exact_half).
// - all_to_all_v exchanges the counts first and checks recv_counts against the peers' send_counts
//   (MismatchError), then moves the data with grouped ncclSend/ncclRecv.
// - compute() is recorded, not modelled (real time is real); begin_step() records the step;
//   memory() is this world rank's books, shared by every communicator split from it.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace shardcheck::gpu {

struct NcclOptions {
  // How long wait() (or an ncclInProgress poll) lets an op run before aborting the communicator.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Reduce bf16/f16 in f32 and round once, as the interface specifies (costs 2x the traffic).
  bool exact_half = true;
  // Exchange all_to_all_v counts first and raise MismatchError when they disagree.
  bool check_all_to_all_v = true;
  // Before every collective, all-gather (op, count, dtype, root, reduce op) and raise
  // MismatchError naming both ranks when members disagree (as the simulator does). Costs one small
  // synchronous collective per op: a debugging mode. Without it a mismatch hangs until the timeout
  // (PeerError) or corrupts silently, as with plain NCCL. Environment SHARDCHECK_NCCL_CHECK=1 turns
  // it on too.
  bool check_signatures = false;
};

// What every communicator of one world rank shares: its books and the record of its compute.
struct RankBooks {
  explicit RankBooks(int world_rank) : memory(world_rank) {}
  comm::MemoryTracker memory;
  struct Compute {
    std::string name;
    double flops = 0;
    double bytes = 0;
    int step = 0;
  };
  std::vector<Compute> computes;  // compute() calls in order (bounded: the last kMaxComputes)
  static constexpr std::size_t kMaxComputes = 4096;
  int step = 0;
};

namespace detail {
struct Core;  // the NCCL communicator, its stream and its state (nccl_core.cpp)
}

class NcclCommunicator final : public comm::Communicator {
 public:
  // Takes ownership of an initialised (non-blocking) NCCL communicator on `device`. `members` are
  // the world ranks in group-rank order. `cancel`, when set, is a flag another thread may raise to
  // make pending and later ops fail with AbortedError (single-process mode: a sibling failed).
  NcclCommunicator(void* nccl_comm, int device, std::string name, std::vector<int> members,
                   std::shared_ptr<RankBooks> books, NcclOptions options,
                   std::shared_ptr<std::atomic<bool>> cancel = nullptr);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  const std::vector<int>& members() const override;

  int device() const;
  void* stream() const;  // cudaStream_t: ops here run on it; kernels that feed them may too
  void* nccl_comm() const;
  const NcclOptions& options() const;
  const RankBooks& books() const;
  // Aborts the NCCL communicator (ncclCommAbort); later calls throw AbortedError(why).
  void abort(const std::string& why);
  bool aborted() const;
  comm::Device buffer_device() const { return {comm::DeviceKind::cuda, device()}; }

 protected:
  comm::WorkPtr do_all_reduce(comm::ConstBuffer send, comm::Buffer recv,
                              comm::ReduceOptions o) override;
  comm::WorkPtr do_reduce_scatter(comm::ConstBuffer send, comm::Buffer recv,
                                  comm::ReduceOptions o) override;
  comm::WorkPtr do_all_gather(comm::ConstBuffer send, comm::Buffer recv) override;
  comm::WorkPtr do_broadcast(comm::ConstBuffer send, comm::Buffer recv,
                             comm::BroadcastOptions o) override;
  comm::WorkPtr do_reduce(comm::ConstBuffer send, comm::Buffer recv, int root,
                          comm::ReduceOptions o) override;
  comm::WorkPtr do_all_to_all(comm::ConstBuffer send, comm::Buffer recv) override;
  comm::WorkPtr do_all_to_all_v(comm::ConstBuffer send, std::span<const std::size_t> send_counts,
                                comm::Buffer recv,
                                std::span<const std::size_t> recv_counts) override;
  comm::WorkPtr do_send(comm::ConstBuffer buf, int peer, comm::P2POptions o) override;
  comm::WorkPtr do_recv(comm::Buffer buf, int peer, comm::P2POptions o) override;
  comm::WorkPtr do_barrier() override;
  std::unique_ptr<comm::Communicator> do_split(int color, int key,
                                               const comm::SplitOptions& o) override;
  void do_compute(const comm::ComputeCost& c) override;
  void do_begin_step(int step) override;
  comm::MemoryTracker& do_memory() override;

 private:
  comm::WorkPtr reduce_common(const char* op, comm::ConstBuffer send, comm::Buffer recv,
                              comm::ReduceOptions o, bool scatter);
  std::shared_ptr<detail::Core> core_;
};

}  // namespace shardcheck::gpu
