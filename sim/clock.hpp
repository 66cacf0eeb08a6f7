// SymmetricClock: a comm::Communicator for one representative rank of a world in which every rank
// issues the same program with the same costs (data parallelism without stragglers). Each
// collective then starts when this rank arrives, because every member arrives at the same virtual
// time, so one rank's two-stream clock (compute, comm; async Work, wait joins) with the simulator's
// cost functions (sim::op_seconds, sim::group_link, sim::compute_seconds) gives the step times a
// sim::SimWorld meta run would give, without 1,024 threads. No data moves; buffers may be null.
// Not for programs whose ranks differ (stragglers, uneven groups): see `asymmetric()`. Pipelines,
// whose stages differ, run on a StageWorld: one representative clock per stage, each a fiber,
// alike ranks within a stage timed as here and the ops between stages (point to point, groups
// spanning stages) met across the representatives with the simulator's arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "comm/communicator.hpp"
#include "sim/timeline.hpp"
#include "sim/topology.hpp"

namespace shardcheck::sim {

// How a split divides a group: the member with group rank i passes color(i) and key(i). A
// representative rank only sees its own arguments, so the program states the rule for all members
// (the clock checks that the representative's own call agrees with it).
struct SplitRule {
  std::function<int(int group_rank)> color;
  std::function<int(int group_rank)> key;
};

// Per step of the representative rank: the SimWorld definition (begin_step to the next begin_step
// on the compute clock; the last step ends when both streams have drained), plus how busy each
// stream was inside it.
struct ClockStep {
  int step = 0;
  double start = 0, end = 0;
  double compute_busy = 0;  // seconds of compute ops
  double comm_busy = 0;     // seconds of communication ops (collectives and point to point)
  std::size_t comm_ops = 0;
  // A lower bound of seconds(), whatever the other stages do: compute_busy plus every collective
  // waited with no compute op, message or step boundary since it was issued.
  // Those collectives' intervals on the comm stream (which runs one collective at a time) lie
  // between the compute ops that bracket them, so none overlaps a compute op or another. It
  // depends only on the program's order and the ops' own costs, so a representative timed alone
  // (no StageWorld) gives the bound it would have among the stages.
  double forced_busy = 0;
  // forced_busy counting only the collectives of groups split under a name given to
  // SymmetricClock::list_groups (compute in full): a lower bound as well, of the part a program
  // fixes wherever its caller's schedule puts the waits of the other groups' collectives.
  double forced_listed = 0;
  double seconds() const { return end - start; }
};

struct ClockState;
struct SplitMemo;
// What the splits of one program made on one world and topology, for clocks that run that same
// program with the same SplitRules (SymmetricClock::share_splits): each rule is evaluated over a
// group's members once for all of them.
std::shared_ptr<SplitMemo> make_split_memo();
struct StageHub;
struct WaitSite;

class SymmetricClock final : public comm::Communicator {
 public:
  // A world of `ranks` ranks on `topology`; this communicator is world rank `rank`. `splits` are
  // the rules of the program's split calls, in call order (over any group).
  SymmetricClock(int ranks, const sim::Topology& topology, std::vector<SplitRule> splits = {},
                 int rank = 0);
  // A stage representative of a StageWorld (its hub meets the ops between stages).
  SymmetricClock(int ranks, const sim::Topology& topology, std::vector<SplitRule> splits, int rank,
                 std::shared_ptr<StageHub> hub);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::string& name() const override { return *name_; }
  const std::vector<int>& members() const override { return members_; }

  // Steps so far; the last one ends at the current drained time (max of both streams).
  std::vector<ClockStep> steps() const;
  // The same as sim::StepTime rows for this rank (for sim::summarize).
  std::vector<sim::StepTime> step_times() const;
  // True when some split made groups of different sizes or links, so ranks are not alike and the
  // representative's times are not exact (the clock then charges the slowest group's link).
  bool asymmetric() const;
  const std::string& asymmetry() const;
  // The split names (comm::SplitOptions::name) whose groups' collectives count in
  // ClockStep::forced_listed; called before the program splits (none listed by default).
  void list_groups(std::vector<std::string> names);
  // Keeps ClockStep::forced_busy and forced_listed exact and nothing else: a message only marks
  // its event (it is not timed), so step times and comm_busy leave messages out. Called before
  // the program runs; not on a stage representative.
  void bound_only();
  // Splits as recorded in (or recorded into) `memo`, shared with the other clocks of the same
  // world, topology and SplitRules (make_split_memo); called before the program splits.
  void share_splits(std::shared_ptr<SplitMemo> memo);
  // Runs `ops` (a region of this clock's program) and returns, or adds what a region under the
  // same key added the first time: to the step (compute_busy, comm_busy, comm_ops, forced_busy,
  // forced_listed), to the streams' ends from the compute stream's, and one event. Exact when every
  // region under one key issues the same ops with the same costs (the caller's keys), waits every
  // work it issues and none issued before it, and meets no other stage: its ops then start where
  // the compute stream is (sums: a collective's forced seconds are its own, and one pending from
  // before is not forced across the region's compute op or message). Timed (not bound_only), a
  // region is replayed or recorded only when the comm stream is idle as it starts, and one that
  // met another stage's representative is not recorded. Throws std::logic_error when a region
  // holds no compute op or message, or spans a step boundary.
  template <class Ops>
  void memo_region(std::uint64_t key, Ops&& ops) {
    if (replay_region(key)) return;
    const RegionMark mark = region_mark();
    ops();
    record_region(key, mark);
  }

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
  SymmetricClock(std::shared_ptr<ClockState> state, std::vector<int> members, int rank,
                 std::shared_ptr<const std::string> name, sim::LinkCost link, bool listed);
  // memo_region's parts: adds the region recorded under key (false: none, or not now); the
  // clock before a region; records what the region since `mark` added.
  struct RegionMark {
    bool record = false;
    ClockStep step;
    std::size_t steps = 0;
    std::uint64_t events = 0, stage_meets = 0;
    double compute = 0;
  };
  bool replay_region(std::uint64_t key);
  RegionMark region_mark() const;
  void record_region(std::uint64_t key, const RegionMark& mark);
  // A collective on this group whose cost-formula S is `bytes` (sim/README.md's table).
  comm::WorkPtr collective(sim::OpKind k, double bytes);
  comm::WorkPtr collective(sim::OpKind k, std::size_t count, comm::DType t);  // the table's bytes
  comm::WorkPtr p2p(const comm::ConstBuffer& b, int peer, int tag, bool send);
  // The stages this group's members are in (1 without a hub).
  int stages_spanned() const;
  // The start of this group's next op for a member arriving at `arrival`: the arrival itself
  // within one stage, else the latest representative's (blocks until all have arrived).
  double meet(double arrival, std::string_view op, std::string_view detail = {});

  std::shared_ptr<ClockState> state_;
  std::vector<int> members_;
  int rank_;
  std::shared_ptr<const std::string> name_;  // shared with the works waiting on this group
  bool listed_ = false;                      // split under a name of list_groups
  sim::LinkCost link_;
  std::uint64_t seq_ = 0;
  std::map<std::tuple<int, int, bool>, std::uint64_t> p2p_seq_;  // (peer, tag, send)
  mutable int stages_ = 0;                                       // stages_spanned(), once known
  // Under share_splits: which of the memo's groups this is (null: the world), what the memo's
  // layouts are keyed by.
  const void* group_id_ = nullptr;
};

// The world of a pipelined mesh through one representative rank per stage: run(program) runs
// the program on each representative (a SymmetricClock on the world with `splits`) as a fiber of
// the calling thread (sim/fiber.hpp), and step_times() are the representatives' rows
// (sim::summarize: the step time).
// Every rank of a stage must issue what its representative issues (tp, dp, cp alike), and a
// group spanning stages must hold the representative of each stage it spans (the pp group of
// the representatives, the world).
class StageWorld {
 public:
  // stage_of: the pipeline stage of each world rank; reps: the representative of each stage.
  StageWorld(int ranks, const sim::Topology& topology, std::vector<SplitRule> splits,
             std::function<int(int world_rank)> stage_of, std::vector<int> reps);
  ~StageWorld();
  // Throws the first error a stage raised (std::logic_error when the stages do not match, or
  // when messages or collectives between stages were left unmatched).
  void run(const std::function<void(SymmetricClock&)>& program);
  std::vector<sim::StepTime> step_times() const;
  // Per stage representative: its steps (compute and communication busy times).
  const std::vector<std::vector<ClockStep>>& stage_steps() const { return steps_; }
  bool asymmetric() const { return !asymmetry_.empty(); }

 private:
  int ranks_;
  sim::Topology topology_;
  std::vector<SplitRule> splits_;
  std::function<int(int)> stage_of_;
  std::shared_ptr<StageHub> hub_;
  std::vector<int> reps_;
  std::vector<std::vector<ClockStep>> steps_;
  std::vector<std::vector<sim::StepTime>> times_;
  std::string asymmetry_;
};

}  // namespace shardcheck::sim
