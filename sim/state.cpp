// Deadlock detection and abort for the simulator. Detection is by global state under the world
// lock: a rank counts as active unless it is blocked or finished; when none is active and some are
// blocked, nobody can ever wake them, so every blocked rank gets a DeadlockError naming the
// picture.
#include "sim/state.hpp"

#include <algorithm>
#include <sstream>

namespace shardcheck::sim {

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) s += ",";
    s += std::to_string(ranks[i]);
    if (j >= i + 2)
      s += "-" + std::to_string(ranks[j]);
    else if (j == i + 1)
      s += "," + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s + "]";
}

std::string OpDesc::describe() const {
  std::ostringstream os;
  os << name_of(kind) << "(count=" << count << ", dtype=" << comm::name_of(dtype);
  if (comm::info(kind).reduces) os << ", op=" << comm::name_of(redop);
  if (comm::info(kind).rooted) os << ", root=" << root;
  os << ")";
  return os.str();
}

Slot::Slot(std::uint64_t s, int n, OpDesc d, int first)
    : seq(s), size(n), desc(d), first_rank(first) {
  const auto un = static_cast<std::size_t>(n);
  send.resize(un);
  recv.resize(un);
  send_counts.resize(un);
  recv_counts.resize(un);
  colors.resize(un);
  keys.resize(un);
  names.resize(un);
  split_result.resize(un);
  arrived_mask.resize(un);
  arrival.resize(un);
  checksum.resize(un);
  checksum_bytes.resize(un);
}

WorldState::WorldState(int n, const SimOptions& opts)
    : ranks_(static_cast<std::size_t>(n)), active_(n), opts_(opts) {
  for (int r = 0; r < n; ++r) {
    RankInfo& ri = ranks_[static_cast<std::size_t>(r)];
    ri.memory = comm::MemoryTracker(r);
    ri.local.faults = RankFaults(opts.faults, r);
    if (auto budget = ri.local.faults.memory_budget()) ri.memory.set_budget(*budget);
    // ranks_ is never resized, so the rank's clock stays where the tracker points
    if (opts.record_timeline) ri.memory.record_series(&ri.local.compute, &ri.local.step);
  }
}

void WorldState::wake(int rank) {
  RankInfo& r = ranks_[static_cast<std::size_t>(rank)];
  if (r.state == RunState::blocked) {
    r.state = RunState::running;
    ++active_;
  }
  r.cv.notify_one();
}

void WorldState::wake_all(const std::vector<int>& ranks) {
  for (int r : ranks) wake(r);
}

void WorldState::finish(int rank) {
  RankInfo& r = ranks_[static_cast<std::size_t>(rank)];
  if (r.state != RunState::blocked) --active_;
  r.state = RunState::finished;
  detect_deadlock();
}

void WorldState::abort(int failed_rank, const std::string& reason) {
  if (!aborted_) {
    aborted_ = true;
    failed_rank_ = failed_rank;
    failure_ = reason;
  }
  for (std::size_t r = 0; r < ranks_.size(); ++r) ranks_[r].cv.notify_one();
}

double WorldState::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void WorldState::mark(int rank, std::uint64_t record, OpState state) {
  FlightRecord* r = recorder(rank).find(record);
  if (!r) return;
  r->state = state;
  if (state == OpState::started)
    r->t_started = now();
  else if (state != OpState::issued)
    r->t_ended = now();
}

void WorldState::mark(int rank, std::uint64_t record, OpState state, double v_start, double v_end) {
  mark(rank, record, state);
  if (FlightRecord* r = recorder(rank).find(record)) {
    r->v_start = v_start;
    r->v_end = v_end;
  }
}

void WorldState::check_usable(const comm::OpContext& ctx) const {
  if (aborted_)
    throw comm::AbortedError(ctx, "communicator aborted after rank " +
                                      std::to_string(failed_rank_) + " failed: " + failure_);
}

std::shared_ptr<SimGroup> WorldState::named_group(const std::string& id,
                                                  const std::vector<int>& members) {
  auto [it, made] = named_groups_.try_emplace(id);
  if (made) {
    it->second = std::make_shared<SimGroup>();
    it->second->members = members;
    it->second->link = group_link(opts_.topology, members);
  }
  return it->second;
}

void WorldState::throw_for(RankInfo& me, int rank) {
  const comm::OpContext ctx{rank, me.wait.group, me.wait.op, me.wait.seq};
  if (me.state == RunState::blocked) {
    me.state = RunState::running;
    ++active_;
  }
  if (me.deadlock) std::rethrow_exception(me.deadlock);
  throw comm::PeerError(ctx, "peer rank " + std::to_string(failed_rank_) + " failed: " + failure_,
                        failed_rank_);
}

void WorldState::detect_deadlock() {
  if (active_ > 0 || aborted_) return;
  bool any_blocked = false;
  std::vector<std::vector<int>> missing(ranks_.size());
  std::vector<RankPicture> picture;
  // One line per distinct situation, with the ranks in it: a 1,024-rank hang reads in two lines.
  std::vector<std::pair<std::string, std::vector<int>>> lines;
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    const RankInfo& ri = ranks_[r];
    RankPicture p;
    p.rank = static_cast<int>(r);
    std::ostringstream line;
    if (ri.state == RunState::finished) {
      p.finished = true;
      line << "finished";
    } else if (ri.state == RunState::blocked) {
      any_blocked = true;
      missing[r] = ri.wait.missing ? ri.wait.missing() : std::vector<int>{};
      p.hung = ri.wait.hung;
      p.group = ri.wait.group;
      p.op = ri.wait.op;
      p.seq = ri.wait.seq;
      p.missing = missing[r];
      if (ri.wait.hung)
        line << "hung (injected fault) " << ri.wait.op;
      else
        line << "waits in " << ri.wait.op << " seq " << ri.wait.seq << " of group " << ri.wait.group
             << ", never arrived: " << rank_ranges(missing[r]);
    } else {
      continue;
    }
    const FlightRecord* last = ri.recorder.last_completed();
    line << "; last completed: " << (last ? last->describe() : "nothing");
    if (last) {
      p.has_last = true;
      p.last_completed = *last;
    }
    picture.push_back(std::move(p));
    std::string text = line.str();
    auto it =
        std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == text; });
    if (it == lines.end())
      lines.push_back({std::move(text), {static_cast<int>(r)}});
    else
      it->second.push_back(static_cast<int>(r));
  }
  if (!any_blocked) return;
  picture_ = std::move(picture);
  std::ostringstream os;
  os << "deadlock: every live rank is blocked and none can progress.";
  for (const auto& [text, who] : lines)
    os << "\n  "
       << (who.size() == 1 ? "rank " + std::to_string(who[0]) : "ranks " + rank_ranges(who)) << ": "
       << text;
  const std::string report = os.str();
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    RankInfo& ri = ranks_[r];
    if (ri.state != RunState::blocked) continue;
    const comm::OpContext ctx{static_cast<int>(r), ri.wait.group, ri.wait.op, ri.wait.seq};
    ri.deadlock = std::make_exception_ptr(comm::DeadlockError(ctx, report, missing[r]));
    ri.cv.notify_one();
  }
}

}  // namespace shardcheck::sim
