// sim::StageWorld (clock.hpp): one representative clock per pipeline stage, each a fiber of the
// calling thread, their ops between stages met through a StageHub.
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/clock.hpp"
#include "sim/clock_state.hpp"
#include "sim/fiber.hpp"

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
