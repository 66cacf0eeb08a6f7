// The symmetric two-stream clock of clock.hpp: its ops and their works (splits: clock_split.cpp;
// the stage world: stage_world.cpp). Its arithmetic mirrors sim/communicator.cpp (arrival = max
// of the two streams, end = arrival + op_seconds, the comm stream busy until the end, wait()
// joins) operation for operation, so that its step times equal a SimWorld meta run's to rounding;
// tests/sim/clock_test.cpp and tests/harness/plan_test.cpp check that they do.
#include "sim/clock.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string_view>
#include <tuple>

#include "sim/clock_state.hpp"

namespace shardcheck::sim {

namespace {

class ClockWork final : public comm::Work {
 public:
  // forced: the op's seconds when it is a collective (its wait may count in forced_busy), else 0;
  // listed: on a group of list_groups (it counts in forced_listed too).
  ClockWork(std::shared_ptr<ClockState> s, double end, double forced, bool listed)
      : state_(std::move(s)),
        end_(end),
        forced_(forced),
        events_(state_->events),
        listed_(listed) {}
  void wait() override {
    ClockState& s = *state_;
    s.compute = std::max(s.compute, end_);
    if (forced_ > 0 && s.events == events_ && !s.steps.empty()) {
      s.steps.back().forced_busy += forced_;
      if (listed_) s.steps.back().forced_listed += forced_;
    }
    forced_ = 0;  // once
  }
  bool is_completed() override { return true; }

 private:
  std::shared_ptr<ClockState> state_;
  double end_, forced_;
  std::uint64_t events_;
  bool listed_;
};

// A message between stages: its end is known once the peer has posted too.
class MeetWork final : public comm::Work {
 public:
  MeetWork(std::shared_ptr<ClockState> s, std::shared_ptr<StageHub::Meet> m, WaitSite what)
      : state_(std::move(s)), meet_(std::move(m)), what_(std::move(what)) {}
  void wait() override {
    state_->hub->await(*meet_, what_);
    const double start = meet_->start, end = meet_->end;
    state_->compute = std::max(state_->compute, end);
    if (!counted_ && !state_->steps.empty()) {
      state_->steps.back().comm_busy += end - start;
      ++state_->steps.back().comm_ops;
    }
    counted_ = true;
  }
  bool is_completed() override { return meet_->done; }

 private:
  std::shared_ptr<ClockState> state_;
  std::shared_ptr<StageHub::Meet> meet_;
  WaitSite what_;
  bool counted_ = false;
};

// What bound_only's messages return: nothing to wait for.
class DoneWork final : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// Owned by no one (the aliasing constructor with an empty owner): copies and releases touch no
// count, which threads would otherwise share or pay for with atomic operations per message.
comm::WorkPtr done_work() {
  static DoneWork done;  // no state: the threads' calls do not race
  return comm::WorkPtr(std::shared_ptr<void>(), &done);
}

}  // namespace

SymmetricClock::SymmetricClock(int ranks, const sim::Topology& topology,
                               std::vector<SplitRule> splits, int rank)
    : state_(std::make_shared<ClockState>()),
      rank_(rank),
      name_(std::make_shared<const std::string>("world")) {
  if (ranks < 1) throw std::invalid_argument("SymmetricClock: ranks must be >= 1");
  if (rank < 0 || rank >= ranks) throw std::invalid_argument("SymmetricClock: rank out of range");
  topology.validate();
  state_->topology = topology;
  state_->splits.assign(splits.begin(), splits.end());
  state_->memory = comm::MemoryTracker(rank);
  members_.resize(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) members_[static_cast<std::size_t>(r)] = r;
  link_ = sim::group_link(topology, members_);
}

SymmetricClock::SymmetricClock(int ranks, const sim::Topology& topology,
                               std::vector<SplitRule> splits, int rank,
                               std::shared_ptr<StageHub> hub)
    : SymmetricClock(ranks, topology, std::move(splits), rank) {
  state_->hub = std::move(hub);
}

int SymmetricClock::stages_spanned() const {
  if (!state_->hub) return 1;
  if (stages_ > 0) return stages_;
  std::set<int> stages;
  for (const int m : members_) stages.insert(state_->hub->stage_of(m));
  for (const int st : stages)
    if (std::find(members_.begin(), members_.end(),
                  state_->hub->reps[static_cast<std::size_t>(st)]) == members_.end())
      throw std::logic_error("StageWorld: group " + *name_ + " spans stage " + std::to_string(st) +
                             " without that stage's representative");
  stages_ = static_cast<int>(stages.size());
  return stages_;
}

SymmetricClock::SymmetricClock(std::shared_ptr<ClockState> state, std::vector<int> members,
                               int rank, std::shared_ptr<const std::string> name,
                               sim::LinkCost link, bool listed)
    : state_(std::move(state)),
      members_(std::move(members)),
      rank_(rank),
      name_(std::move(name)),
      listed_(listed),
      link_(link) {}

std::vector<ClockStep> SymmetricClock::steps() const {
  std::vector<ClockStep> out = state_->steps;
  if (!out.empty()) out.back().end = state_->now();
  return out;
}

std::vector<sim::StepTime> SymmetricClock::step_times() const {
  std::vector<sim::StepTime> out;
  for (const ClockStep& s : steps()) out.push_back({world_rank(), s.step, s.start, s.end});
  return out;
}

bool SymmetricClock::asymmetric() const {
  return !state_->asymmetry.empty();
}
const std::string& SymmetricClock::asymmetry() const {
  return state_->asymmetry;
}
void SymmetricClock::list_groups(std::vector<std::string> names) {
  state_->listed = std::move(names);
}
void SymmetricClock::bound_only() {
  if (state_->hub) throw std::logic_error("SymmetricClock: bound_only on a stage representative");
  state_->bound_only = true;
}

bool SymmetricClock::replay_region(std::uint64_t key) {
  ClockState& s = *state_;
  if (s.steps.empty() || (!s.bound_only && s.comm_free > s.compute)) return false;
  const auto found = s.regions.find(key);
  if (found == s.regions.end()) return false;
  const ClockState::Region& g = found->second;
  ClockStep& st = s.steps.back();
  st.compute_busy += g.compute_busy;
  st.comm_busy += g.comm_busy;
  st.comm_ops += g.comm_ops;
  st.forced_busy += g.forced_busy;
  st.forced_listed += g.forced_listed;
  const double start = s.compute;
  s.compute = start + g.compute;
  s.comm_free = std::max(s.comm_free, start + g.comm_free);
  ++s.events;
  return true;
}

SymmetricClock::RegionMark SymmetricClock::region_mark() const {
  const ClockState& s = *state_;
  if (s.steps.empty() || (!s.bound_only && s.comm_free > s.compute)) return {};
  return {true, s.steps.back(), s.steps.size(), s.events, s.stage_meets, s.compute};
}

void SymmetricClock::record_region(std::uint64_t key, const RegionMark& mark) {
  ClockState& s = *state_;
  if (!mark.record) return;
  if (s.steps.size() != mark.steps)
    throw std::logic_error("SymmetricClock: a memoised region spans a step boundary");
  if (s.events == mark.events)
    throw std::logic_error("SymmetricClock: a memoised region holds no compute op or message");
  if (s.stage_meets != mark.stage_meets) return;  // its times depend on the other stages
  const ClockStep& before = mark.step;
  const ClockStep& after = s.steps.back();
  s.regions.emplace(
      key,
      ClockState::Region{after.compute_busy - before.compute_busy,
                         after.comm_busy - before.comm_busy, after.forced_busy - before.forced_busy,
                         after.forced_listed - before.forced_listed, s.compute - mark.compute,
                         s.comm_free - mark.compute, after.comm_ops - before.comm_ops});
}

double SymmetricClock::meet(double arrival, std::string_view op, std::string_view detail) {
  const std::uint64_t seq = seq_++;
  if (stages_spanned() == 1) return arrival;
  ++state_->stage_meets;
  const WaitSite what{op, name_, -1, detail};
  StageHub& hub = *state_->hub;
  const auto key = std::tuple{*name_, members_, seq};
  std::shared_ptr<StageHub::Meet>& slot = hub.meets[key];
  if (!slot) {
    slot = std::make_shared<StageHub::Meet>();
    slot->expected = stages_spanned();
    slot->start = arrival;
  }
  const std::shared_ptr<StageHub::Meet> m = slot;
  m->start = std::max(m->start, arrival);
  if (++m->arrived == m->expected) {
    m->done = true;
    hub.meets.erase(key);
  }
  hub.await(*m, what);
  return m->start;
}

comm::WorkPtr SymmetricClock::collective(sim::OpKind k, double bytes) {
  ClockState& s = *state_;
  // Every member of a stage arrives at this same time, so the op starts on arrival (SimWorld:
  // the max of the members' arrivals); a group spanning stages starts at the latest
  // representative's arrival.
  const double start = meet(s.now(), comm::name_of(k));
  const double end = start + sim::op_seconds(k, size(), bytes, link_);
  s.comm_free = end;
  if (ClockStep* st = s.current()) {
    st->comm_busy += end - start;
    ++st->comm_ops;
  }
  return std::make_shared<ClockWork>(state_, end, end - start, listed_);
}

comm::WorkPtr SymmetricClock::p2p(const comm::ConstBuffer& b, int peer, int tag, bool send) {
  if (peer < 0 || peer >= size()) throw std::invalid_argument("SymmetricClock: peer out of range");
  ClockState& s = *state_;
  ++s.events;  // a message may overlap a collective: it leaves the bound (forced_busy) out
  if (s.bound_only) return done_work();
  const int pair[2] = {world_rank(), members_[static_cast<std::size_t>(peer)]};
  if (s.hub && s.hub->stage_of(pair[0]) != s.hub->stage_of(pair[1])) {
    // Between stages: the representatives meet (sim/p2p.cpp: the later post starts it).
    StageHub& hub = *s.hub;
    ++s.stage_meets;
    const std::uint64_t seq = p2p_seq_[{peer, tag, send}]++;
    const auto key =
        send ? std::tuple{pair[0], pair[1], tag, seq} : std::tuple{pair[1], pair[0], tag, seq};
    if (std::find(hub.reps.begin(), hub.reps.end(), pair[1]) == hub.reps.end())
      throw std::logic_error("StageWorld: rank " + std::to_string(pair[0]) +
                             " exchanges with rank " + std::to_string(pair[1]) +
                             ", not a stage representative");
    std::shared_ptr<StageHub::Meet>& slot = hub.pairs[key];
    if (!slot) {
      slot = std::make_shared<StageHub::Meet>();
      slot->expected = 2;
      slot->start = s.compute;
    }
    const std::shared_ptr<StageHub::Meet> m = slot;
    m->start = std::max(m->start, s.compute);
    if (++m->arrived == 2) {
      m->end = m->start + sim::op_seconds(sim::OpKind::send, 2, static_cast<double>(b.bytes()),
                                          sim::group_link(s.topology, pair));
      m->done = true;
      hub.pairs.erase(key);
    }
    return std::make_shared<MeetWork>(state_, m,
                                      WaitSite{send ? "send to" : "recv from", name_, pair[1], {}});
  }
  // A matched pair starts at the later post; the peer, being alike, posts at this same time. Point
  // to point does not queue on the comm stream (sim/README.md).
  const double start = s.compute;
  const double end = start + sim::op_seconds(sim::OpKind::send, 2, static_cast<double>(b.bytes()),
                                             sim::group_link(s.topology, pair));
  if (ClockStep* st = s.current()) {
    st->comm_busy += end - start;
    ++st->comm_ops;
  }
  return std::make_shared<ClockWork>(state_, end, 0.0, false);
}

// Each op's bytes by the op table's rule (comm::cost_bytes), from its descriptor count.
comm::WorkPtr SymmetricClock::collective(sim::OpKind k, std::size_t count, comm::DType t) {
  return collective(k, comm::cost_bytes(k, static_cast<double>(count),
                                        static_cast<double>(comm::size_of(t)), size()));
}

comm::WorkPtr SymmetricClock::do_all_reduce(comm::ConstBuffer, comm::Buffer recv,
                                            comm::ReduceOptions) {
  return collective(sim::OpKind::all_reduce, recv.count, recv.dtype);
}

comm::WorkPtr SymmetricClock::do_reduce_scatter(comm::ConstBuffer, comm::Buffer recv,
                                                comm::ReduceOptions) {
  return collective(sim::OpKind::reduce_scatter, recv.count, recv.dtype);
}

comm::WorkPtr SymmetricClock::do_all_gather(comm::ConstBuffer send, comm::Buffer) {
  return collective(sim::OpKind::all_gather, send.count, send.dtype);
}

comm::WorkPtr SymmetricClock::do_broadcast(comm::ConstBuffer, comm::Buffer recv,
                                           comm::BroadcastOptions) {
  return collective(sim::OpKind::broadcast, recv.count, recv.dtype);
}

comm::WorkPtr SymmetricClock::do_reduce(comm::ConstBuffer send, comm::Buffer, int,
                                        comm::ReduceOptions) {
  return collective(sim::OpKind::reduce, send.count, send.dtype);
}

comm::WorkPtr SymmetricClock::do_all_to_all(comm::ConstBuffer send, comm::Buffer) {
  return collective(sim::OpKind::all_to_all, send.count, send.dtype);
}

// Alike ranks send and receive alike, so this rank's own largest direction is every member's.
comm::WorkPtr SymmetricClock::do_all_to_all_v(comm::ConstBuffer send,
                                              std::span<const std::size_t> send_counts,
                                              comm::Buffer,
                                              std::span<const std::size_t> recv_counts) {
  std::size_t out = 0, in = 0;
  for (std::size_t j = 0; j < send_counts.size(); ++j)
    if (static_cast<int>(j) != rank_) {
      out += send_counts[j];
      in += j < recv_counts.size() ? recv_counts[j] : 0;
    }
  return collective(sim::OpKind::all_to_all_v, std::max(out, in), send.dtype);
}

comm::WorkPtr SymmetricClock::do_send(comm::ConstBuffer buf, int peer, comm::P2POptions o) {
  return p2p(buf, peer, o.tag, true);
}
comm::WorkPtr SymmetricClock::do_recv(comm::Buffer buf, int peer, comm::P2POptions o) {
  return p2p(buf, peer, o.tag, false);
}

comm::WorkPtr SymmetricClock::do_barrier() {
  return collective(sim::OpKind::barrier, 0);
}

void SymmetricClock::do_compute(const comm::ComputeCost& c) {
  ClockState& s = *state_;
  const double dt = sim::compute_seconds(s.topology, c);
  s.compute += dt;
  ++s.events;
  if (ClockStep* st = s.current()) {
    st->compute_busy += dt;
    st->forced_busy += dt;
    st->forced_listed += dt;
  }
}

void SymmetricClock::do_begin_step(int step) {
  ClockState& s = *state_;
  if (ClockStep* st = s.current()) {
    if (st->step == step) return;
    st->end = s.compute;
  }
  ++s.events;
  s.steps.push_back({step, s.compute, s.compute, 0, 0, 0, 0});
}

comm::MemoryTracker& SymmetricClock::do_memory() {
  return state_->memory;
}

}  // namespace shardcheck::sim
