// The symmetric two-stream clock and the stage world of clock.hpp. Its arithmetic mirrors
// sim/communicator.cpp (arrival = max of the two streams, end = arrival + op_seconds, the comm
// stream busy until the end, wait() joins) operation for operation, so that its step times equal a
// SimWorld meta run's to rounding; tests/sim/clock_test.cpp and tests/harness/plan_test.cpp check
// that they do.
#include "sim/clock.hpp"

#include <algorithm>
#include <deque>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <tuple>

#include "sim/fiber.hpp"

namespace shardcheck::sim {

// Where the representatives of a StageWorld meet: the collectives of groups spanning stages and
// the point-to-point messages between stages, timed as sim/communicator.cpp and sim/p2p.cpp time
// them (a collective starts at the latest arrival, max of a rank's two streams; a message at the
// later of the two posts, on the compute stream). The representatives are fibers of one thread
// (sim/fiber.hpp): a representative suspends until its op is met; when every unfinished one is
// suspended, the program's stages do not match (a deadlock of the representatives), and every one
// of them throws.
// What a representative waits on, spelled out only when the world fails: built at every op, the
// words were most of a plan's allocations. The group's name is shared (a message's work may
// outlive the call that posted it); `detail` is read only while its caller waits.
struct WaitSite {
  std::string_view op;                       // "all_reduce", "send to", "split"
  std::shared_ptr<const std::string> group;  // the group's name
  int peer = -1;                             // a message's peer (world rank)
  std::string_view detail;                   // a split's name
  std::string text() const {
    std::string t(op);
    if (!detail.empty()) t += " " + std::string(detail);
    if (peer >= 0) return t + " " + std::to_string(peer) + " in " + *group;
    return t + " of " + *group;
  }
};

struct StageHub {
  std::function<int(int)> stage_of;
  std::vector<int> reps;
  std::string failure;     // set once: every waiter throws it
  WaitSite last_wait;      // what the last representative to suspend waits for
  int just_finished = -1;  // the stage that returned last, when none has suspended since
  struct Meet {
    int expected = 0, arrived = 0;
    double start = 0, end = 0;
    bool done = false;
  };
  std::map<std::tuple<std::string, std::vector<int>, std::uint64_t>, std::shared_ptr<Meet>> meets;
  int first_failed = -1;  // the stage whose own error the world failed on
  std::map<std::tuple<int, int, int, std::uint64_t>, std::shared_ptr<Meet>> pairs;

  // Suspends this representative until m is done or the world has failed.
  void await(Meet& m, const WaitSite& what) {
    if (!m.done && failure.empty()) {
      last_wait = what;
      just_finished = -1;
      Fibers::wait_until([&] { return m.done || !failure.empty(); });
    }
    if (!m.done) throw std::logic_error(failure);
  }
  // When every unfinished representative waits: fail the world (each waiter then throws).
  void stuck() {
    if (!failure.empty()) return;
    failure = just_finished >= 0
                  ? "StageWorld: stage " + std::to_string(just_finished) +
                        " finished while every other stage waits on it"
                  : "StageWorld: every stage representative is blocked (the stages' programs do "
                    "not match), the last at " +
                        last_wait.text();
  }
};

struct ClockState {
  sim::Topology topology;
  std::deque<SplitRule> splits;
  double compute = 0;    // compute stream: when the next compute op may start
  double comm_free = 0;  // comm stream: when the last collective ends
  // Compute ops, messages and step boundaries so far: a collective waited
  // while this is what it was at its issue counts in ClockStep::forced_busy.
  std::uint64_t events = 0;
  std::vector<ClockStep> steps;
  comm::MemoryTracker memory;
  std::string asymmetry;
  std::shared_ptr<StageHub> hub;    // StageWorld representatives only
  std::vector<std::string> listed;  // SymmetricClock::list_groups
  bool bound_only = false;          // SymmetricClock::bound_only
  // SymmetricClock::memo_region: per key, what the region added to its step; compute,
  // comm_free: the streams' ends after it, from the compute stream's time before it.
  struct Region {
    double compute_busy = 0, comm_busy = 0, forced_busy = 0, forced_listed = 0, compute = 0,
           comm_free = 0;
    std::size_t comm_ops = 0;
  };
  std::map<std::uint64_t, Region> regions;
  std::uint64_t stage_meets = 0;  // ops met with other stages' representatives so far
  std::size_t split_calls = 0;           // splits so far (their place in the program)
  std::shared_ptr<SplitMemo> split_memo;  // SymmetricClock::share_splits
  double now() const { return std::max(compute, comm_free); }
  ClockStep* current() { return steps.empty() ? nullptr : &steps.back(); }
};

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

bool same_link(const sim::LinkCost& a, const sim::LinkCost& b) {
  return a.alpha == b.alpha && a.beta == b.beta;
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
  s.regions.emplace(key, ClockState::Region{after.compute_busy - before.compute_busy,
                                            after.comm_busy - before.comm_busy,
                                            after.forced_busy - before.forced_busy,
                                            after.forced_listed - before.forced_listed,
                                            s.compute - mark.compute, s.comm_free - mark.compute,
                                            after.comm_ops - before.comm_ops});
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
  const double start = meet(s.now(), sim::name_of(k));
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

comm::WorkPtr SymmetricClock::do_send(comm::ConstBuffer buf, int peer, comm::P2POptions o) {
  return p2p(buf, peer, o.tag, true);
}
comm::WorkPtr SymmetricClock::do_recv(comm::Buffer buf, int peer, comm::P2POptions o) {
  return p2p(buf, peer, o.tag, false);
}

comm::WorkPtr SymmetricClock::do_barrier() {
  return collective(sim::OpKind::barrier, 0);
}

namespace {

// One split of a group: every member's colour, and per colour (ascending) its size and whether it
// crosses nodes (sim::group_link: a member on another node than its first).
struct SplitGroup {
  int color = 0;
  std::size_t size = 0;
  int node = 0;
  bool inter = false;
};

}  // namespace

struct SplitLayout {
  std::vector<int> colors;  // per member (group rank)
  std::vector<SplitGroup> groups;
  // Per colour asked for: its members' world ranks in key order, and the group's name.
  struct Own {
    std::vector<int> ranks;
    std::shared_ptr<const std::string> name;
  };
  std::map<int, Own> own;
  bool uneven = false;    // groups of different sizes or links
  sim::LinkCost worst{};  // the slowest group's link
  const SplitGroup* find(int color) const {
    const auto it = std::lower_bound(groups.begin(), groups.end(), color,
                                     [](const SplitGroup& g, int c) { return g.color < c; });
    return it != groups.end() && it->color == color ? &*it : nullptr;
  }
};

struct SplitMemo {
  // (the split's place in the program, the members of the group it splits)
  std::map<std::pair<std::size_t, std::vector<int>>, SplitLayout> layouts;
};

std::shared_ptr<SplitMemo> make_split_memo() {
  return std::make_shared<SplitMemo>();
}

namespace {

// The colours once per member, in one pass: a vector of groups by colour when every colour is
// below the member count (a mesh's splits: group indices), else a map. Either way by ascending
// colour.
SplitLayout split_layout(const SplitRule& rule, const std::vector<int>& members,
                         const sim::Topology& topology) {
  SplitLayout out;
  const auto n = static_cast<int>(members.size());
  out.colors.resize(members.size());
  bool small = true;
  for (int r = 0; r < n; ++r) {
    const int c = rule.color(r);
    out.colors[static_cast<std::size_t>(r)] = c;
    small = small && c < n;
  }
  std::vector<SplitGroup> by_index(small ? members.size() : 0);
  std::map<int, SplitGroup> by_map;
  for (int r = 0; r < n; ++r) {
    const int c = out.colors[static_cast<std::size_t>(r)];
    if (c < 0) continue;
    const int node = sim::node_of(topology, members[static_cast<std::size_t>(r)]);
    SplitGroup& g = small ? by_index[static_cast<std::size_t>(c)] : by_map[c];
    if (g.size++ == 0) {
      g.color = c;
      g.node = node;
    }
    g.inter = g.inter || node != g.node;
  }
  for (const SplitGroup& g : by_index)
    if (g.size > 0) out.groups.push_back(g);
  for (const auto& [c, g] : by_map) out.groups.push_back(g);
  for (std::size_t i = 0; i < out.groups.size(); ++i) {
    const SplitGroup& g = out.groups[i];
    const sim::LinkCost l = sim::link_cost(topology, g.inter);
    if (i == 0) {
      out.worst = l;
    } else if (!same_link(l, out.worst) || g.size != out.groups.front().size) {
      out.uneven = true;
      if (l.beta > out.worst.beta || (l.beta == out.worst.beta && l.alpha > out.worst.alpha))
        out.worst = l;
    }
  }
  return out;
}

}  // namespace

void SymmetricClock::share_splits(std::shared_ptr<SplitMemo> memo) {
  state_->split_memo = std::move(memo);
}

std::unique_ptr<comm::Communicator> SymmetricClock::do_split(int color, int key,
                                                             const comm::SplitOptions& o) {
  ClockState& s = *state_;
  if (s.splits.empty())
    throw std::logic_error("SymmetricClock: split called without a SplitRule for it");
  const SplitRule rule = std::move(s.splits.front());
  s.splits.pop_front();
  const std::size_t place = s.split_calls++;
  if (rule.color(rank_) != color || rule.key(rank_) != key)
    throw std::logic_error("SymmetricClock: split arguments differ from the stated rule");
  // A split synchronises (SimWorld: a zero-cost collective whose end the compute clock joins).
  const double end = meet(s.now(), "split", o.name);
  s.comm_free = end;
  s.compute = std::max(s.compute, end);
  std::optional<SplitLayout> own_layout;
  SplitLayout* layout = nullptr;
  if (s.split_memo) {
    const auto k = std::pair{place, members_};
    auto it = s.split_memo->layouts.find(k);
    if (it == s.split_memo->layouts.end())
      it = s.split_memo->layouts.emplace(k, split_layout(rule, members_, s.topology)).first;
    layout = &it->second;
  } else {
    layout = &own_layout.emplace(split_layout(rule, members_, s.topology));
  }
  if (layout->uneven && s.asymmetry.empty())
    s.asymmetry = "split \"" + o.name + "\" makes groups of different sizes or links";
  if (color < 0) return nullptr;
  const auto own_of = [&] {
    std::vector<std::pair<int, int>> own;  // (key, group rank) of this rank's colour
    const int n = size();
    for (int r = 0; r < n; ++r)
      if (layout->colors[static_cast<std::size_t>(r)] == color) own.push_back({rule.key(r), r});
    std::sort(own.begin(), own.end());
    SplitLayout::Own out;
    out.ranks.reserve(own.size());
    for (const auto& [k, r] : own) out.ranks.push_back(members_[static_cast<std::size_t>(r)]);
    out.name = std::make_shared<const std::string>((o.name.empty() ? "split" : o.name) +
                                                   comm::rank_list(out.ranks));
    return out;
  };
  std::optional<SplitLayout::Own> own_here;
  const SplitLayout::Own* own = nullptr;
  if (s.split_memo) {
    auto it = layout->own.find(color);
    if (it == layout->own.end()) it = layout->own.emplace(color, own_of()).first;
    own = &it->second;
  } else {
    own = &own_here.emplace(own_of());
  }
  // Ranks differ: charge the slowest group (an upper bound).
  const sim::LinkCost link =
      layout->uneven ? layout->worst : sim::link_cost(s.topology, layout->find(color)->inter);
  const int me = world_rank();
  const std::vector<int>& mine = own->ranks;
  const int r = static_cast<int>(std::find(mine.begin(), mine.end(), me) - mine.begin());
  const bool listed = std::find(s.listed.begin(), s.listed.end(), o.name) != s.listed.end();
  return std::unique_ptr<comm::Communicator>(
      new SymmetricClock(state_, mine, r, own->name, link, listed));
}

void SymmetricClock::do_compute(const comm::ComputeCost& c) {
  ClockState& s = *state_;
  const double dt = sim::compute_seconds(s.topology, c.flops, c.bytes);
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

namespace shardcheck::sim {

StageWorld::StageWorld(int ranks, const sim::Topology& topology, std::vector<SplitRule> splits,
                       std::function<int(int)> stage_of, std::vector<int> reps)
    : ranks_(ranks),
      topology_(topology),
      splits_(std::move(splits)),
      stage_of_(std::move(stage_of)),
      reps_(std::move(reps)) {}

StageWorld::~StageWorld() = default;

void StageWorld::run(const std::function<void(SymmetricClock&)>& program) {
  const std::size_t n = reps_.size();
  steps_.assign(n, {});
  times_.assign(n, {});
  hub_ = std::make_shared<StageHub>();  // every run starts from an empty hub
  hub_->stage_of = stage_of_;
  hub_->reps = reps_;
  std::vector<std::exception_ptr> errors(n);
  Fibers fibers;
  for (std::size_t i = 0; i < n; ++i)
    fibers.spawn([&, i] {
      try {
        SymmetricClock c(ranks_, topology_, splits_, reps_[i], hub_);
        program(c);
        steps_[i] = c.steps();
        times_[i] = c.step_times();
        if (c.asymmetric() && asymmetry_.empty()) asymmetry_ = c.asymmetry();
      } catch (const std::exception& e) {
        errors[i] = std::current_exception();
        if (hub_->failure.empty()) {
          hub_->failure = std::string("StageWorld: stage ") + std::to_string(i) + ": " + e.what();
          hub_->first_failed = static_cast<int>(i);
        }
      } catch (...) {
        errors[i] = std::current_exception();
        if (hub_->failure.empty())
          hub_->failure = "StageWorld: stage " + std::to_string(i) + " failed";
      }
      hub_->just_finished = static_cast<int>(i);
    });
  fibers.run([&] { hub_->stuck(); });
  // The error a stage raised itself (not another stage's "blocked" consequence) goes first.
  if (hub_->first_failed >= 0 && errors[static_cast<std::size_t>(hub_->first_failed)])
    std::rethrow_exception(errors[static_cast<std::size_t>(hub_->first_failed)]);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  if (!hub_->failure.empty()) throw std::logic_error(hub_->failure);
  if (!hub_->pairs.empty() || !hub_->meets.empty())
    throw std::logic_error("StageWorld: the program left " + std::to_string(hub_->pairs.size()) +
                           " message(s) and " + std::to_string(hub_->meets.size()) +
                           " collective(s) between stages unmatched");
}

std::vector<sim::StepTime> StageWorld::step_times() const {
  std::vector<sim::StepTime> out;
  for (const std::vector<sim::StepTime>& t : times_) out.insert(out.end(), t.begin(), t.end());
  return out;
}

}  // namespace shardcheck::sim
