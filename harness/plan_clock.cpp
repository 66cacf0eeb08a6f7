// The symmetric two-stream clock of plan_clock.hpp. Its arithmetic mirrors sim/communicator.cpp
// (arrival = max of the two streams, end = arrival + op_seconds, the comm stream busy until the
// end, wait() joins) operation for operation, so that its step times equal a SimWorld meta run's
// to rounding; tests/harness/plan_test.cpp checks that they do.
#include "harness/plan_clock.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <stdexcept>

namespace shardcheck::harness {

struct ClockState {
  sim::Topology topology;
  std::deque<SplitRule> splits;
  double compute = 0;    // compute stream: when the next compute op may start
  double comm_free = 0;  // comm stream: when the last collective ends
  std::vector<ClockStep> steps;
  comm::MemoryTracker memory;
  std::string asymmetry;
  double now() const { return std::max(compute, comm_free); }
  ClockStep* current() { return steps.empty() ? nullptr : &steps.back(); }
};

namespace {

class ClockWork final : public comm::Work {
 public:
  ClockWork(std::shared_ptr<ClockState> s, double end) : state_(std::move(s)), end_(end) {}
  void wait() override { state_->compute = std::max(state_->compute, end_); }
  bool is_completed() override { return true; }

 private:
  std::shared_ptr<ClockState> state_;
  double end_;
};

bool same_link(const sim::LinkCost& a, const sim::LinkCost& b) {
  return a.alpha == b.alpha && a.beta == b.beta;
}

}  // namespace

SymmetricClock::SymmetricClock(int ranks, const sim::Topology& topology,
                               std::vector<SplitRule> splits, int rank)
    : state_(std::make_shared<ClockState>()), rank_(rank), name_("world") {
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

SymmetricClock::SymmetricClock(std::shared_ptr<ClockState> state, std::vector<int> members,
                               int rank, std::string name, sim::LinkCost link)
    : state_(std::move(state)),
      members_(std::move(members)),
      rank_(rank),
      name_(std::move(name)),
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

comm::WorkPtr SymmetricClock::collective(sim::OpKind k, double bytes) {
  ClockState& s = *state_;
  // Every member arrives at this same time, so the op starts on arrival (SimWorld: the max of
  // the members' arrivals).
  const double start = s.now();
  const double end = start + sim::op_seconds(k, size(), bytes, link_);
  s.comm_free = end;
  if (ClockStep* st = s.current()) {
    st->comm_busy += end - start;
    ++st->comm_ops;
  }
  return std::make_shared<ClockWork>(state_, end);
}

comm::WorkPtr SymmetricClock::p2p(const comm::ConstBuffer& b, int peer) {
  if (peer < 0 || peer >= size()) throw std::invalid_argument("SymmetricClock: peer out of range");
  ClockState& s = *state_;
  const int pair[2] = {world_rank(), members_[static_cast<std::size_t>(peer)]};
  // A matched pair starts at the later post; the peer, being alike, posts at this same time. Point
  // to point does not queue on the comm stream (sim/README.md).
  const double start = s.compute;
  const double end = start + sim::op_seconds(sim::OpKind::send, 2, static_cast<double>(b.bytes()),
                                             sim::group_link(s.topology, pair));
  if (ClockStep* st = s.current()) {
    st->comm_busy += end - start;
    ++st->comm_ops;
  }
  return std::make_shared<ClockWork>(state_, end);
}

comm::WorkPtr SymmetricClock::do_all_reduce(comm::ConstBuffer, comm::Buffer recv,
                                            comm::ReduceOptions) {
  return collective(sim::OpKind::all_reduce, static_cast<double>(recv.count) *
                                                 static_cast<double>(comm::size_of(recv.dtype)));
}

comm::WorkPtr SymmetricClock::do_reduce_scatter(comm::ConstBuffer, comm::Buffer recv,
                                                comm::ReduceOptions) {
  const double p = size();
  return collective(
      sim::OpKind::reduce_scatter,
      static_cast<double>(recv.count) * static_cast<double>(comm::size_of(recv.dtype)) * p);
}

comm::WorkPtr SymmetricClock::do_all_gather(comm::ConstBuffer send, comm::Buffer) {
  const double p = size();
  return collective(
      sim::OpKind::all_gather,
      static_cast<double>(send.count) * static_cast<double>(comm::size_of(send.dtype)) * p);
}

comm::WorkPtr SymmetricClock::do_broadcast(comm::ConstBuffer, comm::Buffer recv,
                                           comm::BroadcastOptions) {
  return collective(sim::OpKind::broadcast, static_cast<double>(recv.count) *
                                                static_cast<double>(comm::size_of(recv.dtype)));
}

comm::WorkPtr SymmetricClock::do_all_to_all(comm::ConstBuffer send, comm::Buffer) {
  const double p = size();
  return collective(sim::OpKind::all_to_all, static_cast<double>(send.count) *
                                                 static_cast<double>(comm::size_of(send.dtype)) *
                                                 (p - 1) / p);
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
  return collective(sim::OpKind::all_to_all_v, static_cast<double>(std::max(out, in)) *
                                                   static_cast<double>(comm::size_of(send.dtype)));
}

comm::WorkPtr SymmetricClock::do_send(comm::ConstBuffer buf, int peer, comm::P2POptions) {
  return p2p(buf, peer);
}
comm::WorkPtr SymmetricClock::do_recv(comm::Buffer buf, int peer, comm::P2POptions) {
  return p2p(buf, peer);
}

comm::WorkPtr SymmetricClock::do_barrier() {
  return collective(sim::OpKind::barrier, 0);
}

std::unique_ptr<comm::Communicator> SymmetricClock::do_split(int color, int key,
                                                             const comm::SplitOptions& o) {
  ClockState& s = *state_;
  if (s.splits.empty())
    throw std::logic_error("SymmetricClock: split called without a SplitRule for it");
  const SplitRule rule = s.splits.front();
  s.splits.pop_front();
  if (rule.color(rank_) != color || rule.key(rank_) != key)
    throw std::logic_error("SymmetricClock: split arguments differ from the stated rule");
  // A split synchronises (SimWorld: a zero-cost collective whose end the compute clock joins).
  const double end = s.now();
  s.comm_free = end;
  s.compute = std::max(s.compute, end);
  std::map<int, std::vector<std::pair<int, int>>> by_color;  // color -> (key, group rank)
  for (int r = 0; r < size(); ++r) {
    const int c = rule.color(r);
    if (c >= 0) by_color[c].push_back({rule.key(r), r});
  }
  std::vector<int> mine;
  sim::LinkCost link{}, worst{};
  std::size_t first_size = 0;
  bool first = true;
  for (auto& [c, v] : by_color) {
    std::sort(v.begin(), v.end());
    std::vector<int> m;
    for (auto [k, r] : v) m.push_back(members_[static_cast<std::size_t>(r)]);
    const sim::LinkCost l = sim::group_link(s.topology, m);
    if (first) {
      worst = l;
      first_size = m.size();
      first = false;
    } else if (!same_link(l, worst) || m.size() != first_size) {
      if (s.asymmetry.empty())
        s.asymmetry = "split \"" + o.name + "\" makes groups of different sizes or links";
      if (l.beta > worst.beta || (l.beta == worst.beta && l.alpha > worst.alpha)) worst = l;
    }
    if (c == color) {
      mine = std::move(m);
      link = l;
    }
  }
  if (color < 0) return nullptr;
  if (!s.asymmetry.empty())
    link = worst;  // ranks differ: charge the slowest group (an upper bound)
  const int me = world_rank();
  const int r = static_cast<int>(std::find(mine.begin(), mine.end(), me) - mine.begin());
  const std::string name = (o.name.empty() ? "split" : o.name) + comm::rank_list(mine);
  return std::unique_ptr<comm::Communicator>(
      new SymmetricClock(state_, std::move(mine), r, name, link));
}

void SymmetricClock::do_compute(const comm::ComputeCost& c) {
  ClockState& s = *state_;
  const double dt = sim::compute_seconds(s.topology, c.flops, c.bytes);
  s.compute += dt;
  if (ClockStep* st = s.current()) st->compute_busy += dt;
}

void SymmetricClock::do_begin_step(int step) {
  ClockState& s = *state_;
  if (ClockStep* st = s.current()) {
    if (st->step == step) return;
    st->end = s.compute;
  }
  s.steps.push_back({step, s.compute, s.compute, 0, 0, 0});
}

comm::MemoryTracker& SymmetricClock::do_memory() {
  return state_->memory;
}

}  // namespace shardcheck::harness
