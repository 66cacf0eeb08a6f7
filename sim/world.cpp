// SimWorld: one thread per rank, a fresh WorldState per run, and the choice of which rank's error
// to report (the earliest root cause, not the follow-on PeerError/AbortedError of its peers).
#include "sim/world.hpp"

#include <climits>
#include <thread>

#include "comm/errors.hpp"
#include "sim/communicator.hpp"
#include "sim/state.hpp"

namespace shardcheck::sim {

SimWorld::SimWorld(int ranks) : ranks_(ranks) {
  if (ranks < 1)
    throw std::invalid_argument("SimWorld needs at least one rank, got " + std::to_string(ranks));
}

SimWorld::~SimWorld() = default;

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
}  // namespace

void SimWorld::run(const std::function<void(comm::Communicator&)>& fn) {
  auto state = std::make_shared<WorldState>(ranks_);
  auto world = std::make_shared<SimGroup>();
  world->name = "world";
  for (int r = 0; r < ranks_; ++r) world->members.push_back(r);

  outcomes_.assign(static_cast<std::size_t>(ranks_), RankOutcome{});
  std::vector<int> order(static_cast<std::size_t>(ranks_), INT_MAX);
  int next_order = 0;

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    threads.emplace_back([&, r] {
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
  for (auto& t : threads) t.join();
  records_.clear();
  for (int r = 0; r < ranks_; ++r) records_.push_back(state->recorder(r).snapshot());

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
    const RankOutcome& o = outcomes_[static_cast<std::size_t>(chosen)];
    throw RankFailure(chosen, o.message, o.error);
  }
}

}  // namespace shardcheck::sim
