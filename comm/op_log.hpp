// The op log of one rank: every collective, point-to-point op, wait, compute report and step start
// a program issued through comm::Communicator, in issue order, with what a cost model reads (op,
// group members, dtype, counts, reduction, root or peer and tag; compute name, FLOPs and bytes).
// RecordingCommunicator writes it as a decorator over any backend (the simulator, NCCL, a timing
// clock), wrapping the groups split from it, so the same program can be recorded on a numeric run
// and on a timing-only run and the two logs compared (conformance(): the planner's guard that it
// times what the engine issues). One log per rank, written by that rank's thread only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/ops.hpp"

namespace shardcheck::comm {

struct OpRecord {
  // The op table's kinds (comm/ops.hpp): the ops, and compute, wait (the first wait() on the
  // Work of record `op`) and begin_step.
  using Kind = Op;
  Kind kind = Kind::barrier;
  int group = -1;  // index into OpLog::groups (communication ops, split)
  DType dtype = DType::u8;
  std::size_t send_count = 0, recv_count = 0;  // elements
  ReduceOp redop = ReduceOp::sum;
  int root_or_peer = -1;  // broadcast / reduce root, send / recv peer (group ranks)
  int tag = 0;
  std::vector<std::size_t> send_counts, recv_counts;  // all_to_all_v
  std::string name;                                   // compute
  double flops = 0, bytes = 0;                        // compute
  std::array<Gemm, 4> gemms{};                        // compute
  std::size_t op = 0;                                 // wait: the index of the waited record
  int step = 0;                                       // begin_step: the step; others: current
};

struct OpLog {
  struct Group {
    std::string name;
    std::vector<int> members;  // world ranks, in group-rank order
  };
  std::vector<Group> groups;
  std::vector<OpRecord> records;
  // "all_reduce f32 x 1024 sum over dp [0 1 2 3]", "compute forward layers.0 1.2e+06 flop", ...
  std::string describe(const OpRecord& r) const;
};

// Passes every call to `inner` and appends it to `log` (shared with the groups split from it).
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, OpLog& log);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int>& members() const override { return inner_->members(); }

 protected:
  WorkPtr do_all_reduce(ConstBuffer send, Buffer recv, ReduceOptions o) override;
  WorkPtr do_reduce_scatter(ConstBuffer send, Buffer recv, ReduceOptions o) override;
  WorkPtr do_all_gather(ConstBuffer send, Buffer recv) override;
  WorkPtr do_broadcast(ConstBuffer send, Buffer recv, BroadcastOptions o) override;
  WorkPtr do_reduce(ConstBuffer send, Buffer recv, int root, ReduceOptions o) override;
  WorkPtr do_all_to_all(ConstBuffer send, Buffer recv) override;
  WorkPtr do_all_to_all_v(ConstBuffer send, std::span<const std::size_t> send_counts, Buffer recv,
                          std::span<const std::size_t> recv_counts) override;
  WorkPtr do_send(ConstBuffer buf, int peer, P2POptions o) override;
  WorkPtr do_recv(Buffer buf, int peer, P2POptions o) override;
  WorkPtr do_barrier() override;
  std::unique_ptr<Communicator> do_split(int color, int key, const SplitOptions& o) override;
  void do_compute(const ComputeCost& c) override;
  void do_begin_step(int step) override;
  MemoryTracker& do_memory() override { return inner_->memory(); }
  void do_set_scope(const WorkScope& s) override { inner_->set_scope(s); }

 private:
  RecordingCommunicator(std::unique_ptr<Communicator> owned, OpLog& log, std::shared_ptr<int> step);
  // Appends r (over this group) and returns its index.
  std::size_t record(OpRecord r);
  WorkPtr recorded(WorkPtr w, std::size_t index);

  std::unique_ptr<Communicator> owned_;  // a split's group
  Communicator* inner_;
  OpLog* log_;
  int group_ = -1;
  std::shared_ptr<int> step_;  // the rank's current step, shared with its splits
};

// Issues the ops of `log` again, in order, on `groups` (groups[i] for the log's group i): null
// buffers of the recorded dtypes and counts, the same reductions, roots, peers and tags, the
// compute reports (their names point into the log: consumers copy what they keep), each wait
// where the recording first waited (every Work held until the replay returns). A program whose
// ops do not depend on its data (the planner's
// timing-only block) replays what it issued. Throws std::invalid_argument on a split or a step
// start (a replay makes no groups and stays inside a step) or a group index out of range.
void replay(const OpLog& log, std::span<Communicator* const> groups);

// What a cost model sees of a log: communication ops on groups of more than one rank (a group of
// one moves nothing), each wait kept only where it waits on a kept op (renumbered), every compute
// report, steps from `first_step` on; splits (group construction) and group names dropped (groups
// are compared by their members).
OpLog cost_view(const OpLog& log, int first_step = 1);

struct CompareOptions {
  double rel_tol = 1e-9;  // relative, for FLOPs and bytes
  // Compute reports whose FLOPs depend on the data (MoE experts: what the router kept), where the
  // second log states an assumption that bounds the first from above.
  std::vector<std::string> upper_bounds;
  // Compute reports whose FLOPs depend on other ranks' data and are not compared record by record
  // (MoE experts under expert parallelism: the rows a rank's experts receive depend on its EP
  // peers' routing); the caller compares their totals (flops_named).
  std::vector<std::string> unchecked_flops;
  // all_to_all_v's splits depend on the data (MoE dispatch and combine): the number of peers
  // must agree, the counts and their totals need not.
  bool routed_splits = false;
};
// The first difference between two cost views, "" when equal: communication ops must agree in
// kind, members, dtype, counts, reduction, root or peer and tag; waits in what they wait on;
// compute in name, and FLOPs and bytes within rel_tol (an upper_bounds name: b's FLOPs at least
// a's; an unchecked_flops name: bytes only). Each side is described with a few records around it.
std::string first_difference(const OpLog& a, const OpLog& b, const CompareOptions& o = {});

// The FLOPs of the log's compute reports with this name, added up.
double flops_named(const OpLog& log, const std::string& name);

}  // namespace shardcheck::comm
