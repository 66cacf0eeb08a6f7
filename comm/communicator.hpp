// The collective interface every backend implements (sim: threads; gpu: NCCL). Written only
// against typed buffer views with element counts; knows nothing of threads, CUDA or scenarios.
//
// In-place calls: pass the same storage as send and receive, with the layouts NCCL uses:
//   all_reduce / broadcast:  send.data == recv.data
//   reduce:                  send.data == recv.data on the root
//   reduce_scatter:          send.data == recv.data - rank*count   (recv is this rank's chunk of
//   send) all_gather:              send.data == recv.data + rank*count   (send is this rank's chunk
//   of recv) all_to_all(_v):          send.data == recv.data
// Each operation has a one-buffer overload that is the in-place form.
//
// Reductions: sum, avg (= sum / group size; integer avg truncates toward zero), max, min, prod.
// Integer sum and prod wrap modulo 2^bits. max/min propagate NaN. bf16 and f16 accumulate in f32,
// adding contributions in group-rank order, and round once to the 16-bit format at the end.
// Backends document whether they are bitwise deterministic (the simulator is: every element is
// reduced in group-rank order, whatever the thread interleaving).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/buffer.hpp"
#include "comm/memory.hpp"
#include "comm/work.hpp"

namespace shardcheck::comm {

enum class ReduceOp : std::uint8_t { sum, avg, max, min, prod };
std::string_view name_of(ReduceOp op);

struct ReduceOptions {
  ReduceOp op = ReduceOp::sum;
};
struct BroadcastOptions {
  int root = 0;  // group rank
};
struct P2POptions {
  int tag = 0;  // messages match in order per (sender, receiver, tag)
};
struct SplitOptions {
  std::string name;  // label of the new groups in messages and tables ("tp", "dp", ...)
};

// One matrix multiply of a compute report: an m x n output over an inner dimension k, 2mnk FLOPs.
struct Gemm {
  double m = 0, n = 0, k = 0;
};
// Local work a rank did (or, in a timing-only run, would have done) between collectives. The
// simulator advances the rank's virtual compute stream by its cost model (max of flops over the
// device rate and bytes over memory bandwidth; with a device of SMs, the GEMMs at whole tiles and
// waves); a real backend, whose time is real, only records it.
struct ComputeCost {
  std::string_view name;  // "forward layers.0", "adamw", ... (timeline label)
  double flops = 0;
  double bytes = 0;  // memory traffic
  // The GEMMs among `flops` (their 2mnk are part of it; unused entries zero): what a device model
  // of GEMM efficiency by shape reads (sim::Topology's device: whole tiles, whole waves).
  std::array<Gemm, 4> gemms{};
};

// What a rank is working on, for timelines and step phases only (no effect on any result): the
// pass, microbatch and model chunk (virtual pipeline stage index on this rank) of the pipeline
// action being run; none / -1 outside the pipeline (gradient sums, the optimizer). A forward
// computed inside a backward pass is a recomputation (full activation checkpointing).
struct WorkScope {
  enum class Pass : std::uint8_t { none, forward, backward };
  Pass pass = Pass::none;
  int microbatch = -1;
  int chunk = -1;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;  // rank in this group
  virtual int size() const = 0;  // members in this group
  virtual const std::string& name() const = 0;
  virtual const std::vector<int>& members() const = 0;  // world ranks, in group-rank order
  int world_rank() const { return members()[static_cast<std::size_t>(rank())]; }

  // recv[i] = op over ranks r (in rank order) of send_r[i]. send.count == recv.count.
  [[nodiscard]] WorkPtr all_reduce(ConstBuffer send, Buffer recv, ReduceOptions o = {}) {
    return do_all_reduce(send, recv, o);
  }
  [[nodiscard]] WorkPtr all_reduce(Buffer inout, ReduceOptions o = {}) {
    return do_all_reduce(inout, inout, o);
  }

  // recv[i] = op over r of send_r[rank*c + i], c = recv.count; send.count == c * size().
  [[nodiscard]] WorkPtr reduce_scatter(ConstBuffer send, Buffer recv, ReduceOptions o = {}) {
    return do_reduce_scatter(send, recv, o);
  }
  // In place: the result lands in inout[rank*c, (rank+1)*c), c = inout.count / size().
  [[nodiscard]] WorkPtr reduce_scatter(Buffer inout, ReduceOptions o = {});

  // recv[r*c + i] = send_r[i], c = send.count; recv.count == c * size().
  [[nodiscard]] WorkPtr all_gather(ConstBuffer send, Buffer recv) {
    return do_all_gather(send, recv);
  }
  // In place: this rank's contribution already sits at inout[rank*c, (rank+1)*c).
  [[nodiscard]] WorkPtr all_gather(Buffer inout);

  // recv = send of the root. send is read only on the root; counts must agree.
  [[nodiscard]] WorkPtr broadcast(ConstBuffer send, Buffer recv, BroadcastOptions o = {}) {
    return do_broadcast(send, recv, o);
  }
  [[nodiscard]] WorkPtr broadcast(Buffer inout, BroadcastOptions o = {}) {
    return do_broadcast(inout, inout, o);
  }

  // Rooted reduction: on the root, recv[i] = op over ranks r (in rank order) of send_r[i], the
  // same values all_reduce gives; send.count == recv.count there. Other ranks only send: their
  // recv is neither checked nor written (pass an empty Buffer). root is a group rank.
  [[nodiscard]] WorkPtr reduce(ConstBuffer send, Buffer recv, int root, ReduceOptions o = {}) {
    return do_reduce(send, recv, root, o);
  }
  [[nodiscard]] WorkPtr reduce(Buffer inout, int root, ReduceOptions o = {}) {
    return do_reduce(inout, inout, root, o);
  }

  // Equal splits: recv[j*c + i] = send_j[rank*c + i], c = send.count / size(); counts equal.
  [[nodiscard]] WorkPtr all_to_all(ConstBuffer send, Buffer recv) {
    return do_all_to_all(send, recv);
  }
  [[nodiscard]] WorkPtr all_to_all(Buffer inout) { return do_all_to_all(inout, inout); }

  // Variable splits (MoE dispatch/combine): this rank sends send_counts[j] elements to rank j,
  // taken contiguously from send in rank order, and receives recv_counts[j] from rank j, placed
  // contiguously in recv in rank order. recv_counts[j] on rank i must equal send_counts[i] on rank
  // j (checked: MismatchError). Sums must not exceed the buffer counts.
  [[nodiscard]] WorkPtr all_to_all_v(ConstBuffer send, std::span<const std::size_t> send_counts,
                                     Buffer recv, std::span<const std::size_t> recv_counts) {
    return do_all_to_all_v(send, send_counts, recv, recv_counts);
  }

  // Point to point, matched in order per (sender, receiver, tag). Rendezvous: a send completes
  // only when the matching receive has taken the data, so two ranks that both wait on a send to
  // each other deadlock, as they may with NCCL.
  [[nodiscard]] WorkPtr send(ConstBuffer buf, int peer, P2POptions o = {}) {
    return do_send(buf, peer, o);
  }
  [[nodiscard]] WorkPtr recv(Buffer buf, int peer, P2POptions o = {}) {
    return do_recv(buf, peer, o);
  }

  [[nodiscard]] WorkPtr barrier() { return do_barrier(); }

  // Collective over this group: members with equal color form a new group, ordered by (key, rank).
  // color < 0 joins no group and gets nullptr (NCCL_SPLIT_NOCOLOR / MPI_UNDEFINED).
  std::unique_ptr<Communicator> split(int color, int key, const SplitOptions& o = {}) {
    return do_split(color, key, o);
  }

  // Not collectives: per-rank bookkeeping every strategy reports through its communicator.
  // compute(): see ComputeCost. begin_step(): training step `step` (1-based) starts on this rank
  // (faults and timelines are keyed by step). memory(): this rank's tracked-allocator books, one
  // per world rank, shared by every group the rank belongs to.
  void compute(const ComputeCost& c) { do_compute(c); }
  void begin_step(int step) { do_begin_step(step); }
  MemoryTracker& memory() { return do_memory(); }
  // set_scope(): this rank's WorkScope from now on, shared by every group the rank belongs to.
  // Backends without timelines ignore it.
  void set_scope(const WorkScope& s) { do_set_scope(s); }

  // Typed-span conveniences (element counts and dtype come from the span).
  template <class T>
  [[nodiscard]] WorkPtr all_reduce(std::span<const T> send, std::span<T> recv,
                                   ReduceOptions o = {}) {
    return all_reduce(cview(send), view(recv), o);
  }
  template <class T>
  [[nodiscard]] WorkPtr all_reduce(std::span<T> inout, ReduceOptions o = {}) {
    return all_reduce(view(inout), o);
  }

 protected:
  virtual WorkPtr do_all_reduce(ConstBuffer send, Buffer recv, ReduceOptions o) = 0;
  virtual WorkPtr do_reduce_scatter(ConstBuffer send, Buffer recv, ReduceOptions o) = 0;
  virtual WorkPtr do_all_gather(ConstBuffer send, Buffer recv) = 0;
  virtual WorkPtr do_broadcast(ConstBuffer send, Buffer recv, BroadcastOptions o) = 0;
  virtual WorkPtr do_reduce(ConstBuffer send, Buffer recv, int root, ReduceOptions o) = 0;
  virtual WorkPtr do_all_to_all(ConstBuffer send, Buffer recv) = 0;
  virtual WorkPtr do_all_to_all_v(ConstBuffer send, std::span<const std::size_t> send_counts,
                                  Buffer recv, std::span<const std::size_t> recv_counts) = 0;
  virtual WorkPtr do_send(ConstBuffer buf, int peer, P2POptions o) = 0;
  virtual WorkPtr do_recv(Buffer buf, int peer, P2POptions o) = 0;
  virtual WorkPtr do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, const SplitOptions& o) = 0;
  virtual void do_compute(const ComputeCost& c) = 0;
  virtual void do_begin_step(int step) = 0;
  virtual MemoryTracker& do_memory() = 0;
  virtual void do_set_scope(const WorkScope& /*s*/) {}
};

}  // namespace shardcheck::comm
