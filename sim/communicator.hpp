// SimCommunicator: comm::Communicator over shared memory between rank threads of one SimWorld.
// Every collective is a rendezvous at a per-group sequence number: members register their buffers,
// then each rank does its share of the data movement (reduce-scatter-then-gather style: rank i
// reduces chunk i of every input in rank order and writes it to every output), then all depart.
// Results are bitwise identical whatever the interleaving. Ops complete numerically before the
// call returns; the returned Work carries the op's end on the virtual clock, and wait() joins it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "comm/communicator.hpp"
#include "sim/state.hpp"

namespace shardcheck::sim {

// The Work of a simulated collective. The data is already in place when it is returned (so
// is_completed() is true); wait() joins the rank's compute stream to the op's virtual end:
// compute clock = max(compute clock, virtual_end()). A Work never waited on still occupied the
// comm stream, so later compute overlaps it. Wait on the issuing rank's thread only.
class SimWork final : public comm::Work {
 public:
  SimWork(std::shared_ptr<WorldState> world, int world_rank, double virtual_end)
      : world_(std::move(world)), rank_(world_rank), end_(virtual_end) {}
  void wait() override;
  bool is_completed() override { return true; }
  double virtual_end() const { return end_; }

 private:
  std::shared_ptr<WorldState> world_;
  int rank_;
  double end_;
};

class SimCommunicator final : public comm::Communicator {
 public:
  SimCommunicator(std::shared_ptr<WorldState> world, std::shared_ptr<SimGroup> group, int rank);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_->members.size()); }
  const std::string& name() const override { return group_->name; }
  const std::vector<int>& members() const override { return group_->members; }

  // A communicator over `members` (world ranks, in group-rank order, this rank among them) that
  // needs no collective over this group: each member calls it on its own with the same `id`, as
  // with NCCL's ncclCommInitRank and a shared unique id (torch.distributed's new_group, where
  // ranks outside the group take no part). Members that never call it are missing from the
  // group's first op and the deadlock detector names them. InvalidArgument when this rank is not
  // among `members`, a member is outside the world or repeated, or another rank registered `id`
  // with other members (naming both lists). `name` labels the group in messages ("tp", "dp").
  std::unique_ptr<SimCommunicator> group(const std::string& id, const std::vector<int>& members,
                                         const std::string& name) const;

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
  void do_set_scope(const comm::WorkScope& s) override;

 private:
  using Register = std::function<void(Slot&)>;
  using Data = std::function<void(const Slot&)>;
  using Complete = std::function<void(Slot&)>;  // run once, by the last arriving rank, lock held
  // Arrive at the next sequence number, wait for every member, run `data`, depart. `payload` is
  // what the other members read of this rank (checksummed, and corrupted by a fault). Returns
  // nullptr when a skip_collective fault made this rank leave without joining.
  std::shared_ptr<Slot> collective(const OpDesc& desc, comm::ConstBuffer payload,
                                   const Register& reg, const Data& data,
                                   const Complete& complete = {});
  comm::WorkPtr work(const std::shared_ptr<Slot>& slot) const;
  bool meta() const { return world_->options().meta; }
  RankLocal& local() const { return world_->local(world_rank()); }
  // Counts this rank's next communication op of the step and returns the fault that fires on it
  // (recorded as fired); throws InjectedCrash for a crash fault.
  std::optional<Fault> next_op(const std::string& op, std::uint64_t seq);
  // An injected hang: blocks this rank until the deadlock detector (or an abort) ends the run.
  [[noreturn]] void hang_here(std::unique_lock<std::mutex>& lk, const std::string& where);
  // Virtual start, end and cost bytes of a slot whose members have all arrived (lock held).
  void time_slot(Slot& s) const;
  // CorruptionError for the first contribution whose checksum differs, or nullptr (lock held).
  std::exception_ptr verify_payloads(const Slot& s) const;
  comm::OpContext context(OpKind k) const;
  comm::OpContext p2p_context(OpKind k, int peer, int tag) const;
  [[noreturn]] void invalid(OpKind k, const std::string& what) const;
  void check_buffer(OpKind k, const comm::ConstBuffer& b, const char* which) const;
  comm::WorkPtr post_p2p(OpKind k, comm::ConstBuffer send, comm::Buffer recv, int peer, int tag);

  std::shared_ptr<WorldState> world_;
  std::shared_ptr<SimGroup> group_;
  int rank_;
  std::uint64_t seq_ = 0;
  std::map<std::tuple<int, int, bool>, std::uint64_t> p2p_seq_;  // (peer, tag, is_send)
};

}  // namespace shardcheck::sim
