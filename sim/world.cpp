// SimWorld: one thread per rank, a fresh WorldState per run, the choice of which rank's error to
// report (the earliest root cause, not the follow-on PeerError/AbortedError of its peers), and
// the collection of timelines, step times and the diagnosis once every thread has joined.
#include "sim/world.hpp"

#include <algorithm>
#include <climits>
#include <system_error>

#include "comm/errors.hpp"
#include "sim/communicator.hpp"
#include "sim/rank_thread.hpp"
#include "sim/state.hpp"

namespace shardcheck::sim {

SimWorld::SimWorld(int ranks, SimOptions opts) : ranks_(ranks), opts_(std::move(opts)) {
  if (ranks < 1)
    throw std::invalid_argument("SimWorld needs at least one rank, got " + std::to_string(ranks));
  opts_.topology.validate();
  validate(opts_.faults, ranks);
}

SimWorld::~SimWorld() = default;

double SimWorld::virtual_time() const {
  return end_times_.empty() ? 0 : *std::max_element(end_times_.begin(), end_times_.end());
}

namespace {
// Classifies an exception: message, and whether it is a root cause or caused by another failure.
std::pair<std::string, bool> classify(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const comm::PeerError& x) {
    return {x.what(), false};
  } catch (const comm::AbortedError& x) {
    return {x.what(), false};
  } catch (const std::exception& x) {
    return {x.what(), true};
  } catch (...) {
    return {"unknown exception (not derived from std::exception)", true};
  }
}
bool is_deadlock(const std::exception_ptr& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const comm::DeadlockError&) {
    return true;
  } catch (...) {
    return false;
  }
}

// The rank's events with its p2p placeholders filled in (or dropped, if never matched).
void collect_events(RankLocal& l, std::vector<TimelineEvent>& out) {
  std::vector<bool> drop(l.events.size(), false);
  for (const auto& op : l.p2p) {
    TimelineEvent& ev = l.events[op->event];
    if (op->done) {
      ev.start = op->v_start;
      ev.end = op->v_end;
    } else {
      drop[op->event] = true;
    }
  }
  for (std::size_t i = 0; i < l.events.size(); ++i)
    if (!drop[i]) out.push_back(std::move(l.events[i]));
}
}  // namespace

void SimWorld::run(const std::function<void(comm::Communicator&)>& fn) {
  auto state = std::make_shared<WorldState>(ranks_, opts_);
  auto world = std::make_shared<SimGroup>();
  world->name = "world";
  for (int r = 0; r < ranks_; ++r) world->members.push_back(r);
  world->link = group_link(opts_.topology, world->members);

  outcomes_.assign(static_cast<std::size_t>(ranks_), RankOutcome{});
  std::vector<int> order(static_cast<std::size_t>(ranks_), INT_MAX);
  int next_order = 0;

  std::vector<RankThread> threads;
  threads.reserve(static_cast<std::size_t>(ranks_));
  const std::size_t stack = rank_stack_bytes(ranks_);
  const auto start = [&](int r, auto body) {
    if (opts_.thread_limit > 0 && r >= opts_.thread_limit)
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again),
                              "thread_limit");
    threads.emplace_back(std::move(body), stack);
  };
  try {
    for (int r = 0; r < ranks_; ++r) {
      start(r, [&, r] {
        RankOutcome& out = outcomes_[static_cast<std::size_t>(r)];
        out.rank = r;
        try {
          SimCommunicator comm(state, world, r);
          fn(comm);
        } catch (...) {
          out.error = std::current_exception();
          out.ok = false;
          std::tie(out.message, out.root_cause) = classify(out.error);
          std::lock_guard lk(state->mu);
          order[static_cast<std::size_t>(r)] = next_order++;
          state->abort(r, out.message);
        }
        std::lock_guard lk(state->mu);
        state->finish(r);
      });
    }
  } catch (const std::exception& e) {  // system_error from pthread_create, or bad_alloc
    // The ranks that did start wait for peers that never will: abort them, join, and say so.
    const auto started = static_cast<int>(threads.size());
    {
      std::lock_guard lk(state->mu);
      state->abort(started, "rank " + std::to_string(started) + "'s thread could not start");
    }
    for (auto& t : threads) t.join();
    throw ThreadStartError("the simulator could start only " + std::to_string(started) + " of " +
                           std::to_string(ranks_) + " rank threads (" + e.what() +
                           "); run fewer ranks, or raise the thread limit (ulimit -u)");
  }
  for (auto& t : threads) t.join();

  records_.clear();
  fired_.clear();
  timeline_.clear();
  steps_.clear();
  end_times_.clear();
  memory_.clear();
  diagnosis_.reset();
  std::vector<int> last_step;
  for (int r = 0; r < ranks_; ++r) {
    records_.push_back(state->recorder(r).snapshot());
    RankLocal& l = state->local(r);
    if (!l.steps.empty()) l.steps.back().end = l.now();
    steps_.insert(steps_.end(), l.steps.begin(), l.steps.end());
    fired_.insert(fired_.end(), l.fired.begin(), l.fired.end());
    collect_events(l, timeline_);
    end_times_.push_back(l.now());
    last_step.push_back(l.step);
    memory_.push_back(state->memory(r));
    memory_.back().stop_series();  // the clock it read goes with the run's state
  }

  int chosen = -1;
  for (int pass = 0; pass < 2 && chosen < 0; ++pass)
    for (int r = 0; r < ranks_; ++r) {
      const RankOutcome& o = outcomes_[static_cast<std::size_t>(r)];
      if (o.ok || (pass == 0 && !o.root_cause)) continue;
      if (chosen < 0 ||
          order[static_cast<std::size_t>(r)] < order[static_cast<std::size_t>(chosen)])
        chosen = r;
    }
  if (chosen >= 0 && is_deadlock(outcomes_[static_cast<std::size_t>(chosen)].error)) {
    // Every blocked rank saw the same deadlock at once: report the lowest rank, deterministically.
    for (int r = 0; r < ranks_; ++r)
      if (is_deadlock(outcomes_[static_cast<std::size_t>(r)].error)) {
        chosen = r;
        break;
      }
  }
  if (chosen >= 0) {
    DiagnosisInput in;
    in.chosen = chosen;
    in.outcomes = &outcomes_;
    in.picture = &state->deadlock_picture();
    in.fired = fired_;
    in.steps = last_step;
    in.records = records_;
    diagnosis_ = diagnose(std::move(in));
    const RankOutcome& o = outcomes_[static_cast<std::size_t>(chosen)];
    throw RankFailure(chosen, o.message, o.error);
  }
}

}  // namespace shardcheck::sim
