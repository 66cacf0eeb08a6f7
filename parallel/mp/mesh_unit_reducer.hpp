// ZeRO-3 / FSDP's per-microbatch reduce_scatter of each flat buffer during the backward (which
// buffers and when: mesh_grad_units.hpp), one at a time in flight, holding each buffer's
// unsharded microbatch gradient in the tracker from the step that starts it until its reduction
// completes. Run by the mesh engine (mesh_chunks.cpp) on MeshOptimizer (mesh_impl.hpp's
// OptimizerUnits) and by the planner's timing-only run on null buffers. Units, the reductions'
// owner, provides:
//   Pending issue(std::size_t cls)        the class's reduce_scatter, in flight
//   void complete(Pending&)               it completes (its shard accumulated)
//   void reduce_each_microbatch(std::vector<bool>)   the classes reduced here (by class)
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "comm/memory.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_classes.hpp"
#include "parallel/mp/mesh_grad_units.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::parallel::mesh_detail {

template <class Units>
class UnitReducer {
 public:
  struct Setup {
    const ref::ModelConfig* model = nullptr;
    const std::map<int, int>* wrap_of = nullptr;  // layerwise unit -> wrap unit
    const StagePlan* plan = nullptr;
    int pp = 1, virtual_stages = 1, stage = 0, zero = 0;
    std::size_t bytes_per_elem = 0;  // of a microbatch gradient (0: nothing held, timing only)
    testing::Mutation planted = testing::Mutation::kNone;  // kUnitReducedEarly (tests)
    const std::vector<FlatClass>* classes = nullptr;       // flat_classes' (null: computed here)
  };
  // Does nothing unless zero == 3 (every parameter is then reduced at the step's end). specs
  // outlives the reducer.
  UnitReducer(const Setup& s, const std::vector<LocalParam>& specs, Units units,
              comm::MemoryTracker& mem)
      : units_(std::move(units)), mem_(mem), bytes_(s.bytes_per_elem), specs_(&specs) {
    const auto unit = [&](const LocalParam& p) { return s.wrap_of->at(p.unit); };
    std::vector<FlatClass> computed;
    if (s.classes == nullptr) computed = flat_classes(specs, s.zero, unit);
    const std::vector<FlatClass>& classes = s.classes != nullptr ? *s.classes : computed;
    const std::vector<int> chunk_of = unit_reduce_chunks(*s.model, *s.plan, s.pp, s.virtual_stages,
                                                         s.stage, s.zero, specs, classes);
    std::vector<bool> each(classes.size(), false);
    reduced_.assign(specs.size(), false);
    for (std::size_t ci = 0; ci < classes.size(); ++ci) {
      each[ci] = chunk_of[ci] >= 0;
      class_index_.push_back(classes[ci].specs);
      for (const std::size_t k : classes[ci].specs) reduced_[k] = each[ci];
      if (!each[ci]) deferred_elems_ += static_cast<std::size_t>(classes[ci].numel);
      class_elems_.push_back(classes[ci].numel);
    }
    if (s.zero != 3) return;
    const int last_vs = s.pp * s.virtual_stages - 1;
    for (int c = 0; c < s.virtual_stages; ++c) {
      schedules_.push_back(unit_reduce_schedule(
          *s.model, *s.wrap_of, *s.plan, c, c * s.pp + s.stage, last_vs, specs, classes, chunk_of));
      auto& ready = schedules_.back().ready;
      if (s.planted == testing::Mutation::kUnitReducedEarly)
        for (std::size_t j = 1; j < ready.size(); ++j) {
          ready[j - 1].insert(ready[j - 1].end(), ready[j].begin(), ready[j].end());
          ready[j].clear();
        }
    }
    units_.reduce_each_microbatch(std::move(each));
  }

  // Reduced at the step's end (every parameter unless zero == 3): by spec index, the parameters
  // themselves, and their elements.
  bool deferred(std::size_t spec) const { return !reduced_.at(spec); }
  const std::vector<LocalParam>& deferred_specs() const {
    if (!deferred_specs_) {
      deferred_specs_.emplace();
      for (std::size_t k = 0; k < specs_->size(); ++k)
        if (deferred(k)) deferred_specs_->push_back((*specs_)[k]);
    }
    return *deferred_specs_;
  }
  std::size_t deferred_elems() const { return deferred_elems_; }
  // The parameters of class ci (flat_classes' order), by spec index.
  const std::vector<std::size_t>& class_specs(std::size_t ci) const { return class_index_[ci]; }

  // Step `step` of a chunk's backward begins: the unsharded gradients it starts are held.
  void begin(int chunk, std::size_t step) {
    if (schedules_.empty() || bytes_ == 0) return;
    for (const std::size_t ci : schedules_[static_cast<std::size_t>(chunk)].alloc[step])
      held_[ci] = comm::TrackedBytes(mem_, comm::MemCategory::grads,
                                     static_cast<std::size_t>(class_elems_[ci]) * bytes_);
  }
  // Step `step` has written the buffers it completes: prepare(class index) readies each (the bf16
  // rounding, the sums sync_gradients would make first), then its reduce_scatter goes once the
  // one in flight has completed.
  template <class Prepare>
  void ready(int chunk, std::size_t step, const Prepare& prepare) {
    if (schedules_.empty()) return;
    for (const std::size_t ci : schedules_[static_cast<std::size_t>(chunk)].ready[step]) {
      prepare(ci);
      finish();
      in_flight_.emplace(ci, units_.issue(ci));
    }
  }
  // The reduction in flight completes (the end of a chunk's backward).
  void finish() {
    if (!in_flight_) return;
    units_.complete(in_flight_->second);
    if (bytes_ > 0) held_.erase(in_flight_->first);
    in_flight_.reset();
  }

 private:
  Units units_;
  comm::MemoryTracker& mem_;
  std::size_t bytes_;
  const std::vector<LocalParam>* specs_;
  std::vector<std::vector<std::size_t>> class_index_;
  std::vector<int64_t> class_elems_;
  std::vector<bool> reduced_;  // by spec index: reduced every microbatch
  mutable std::optional<std::vector<LocalParam>> deferred_specs_;  // built on first use
  std::size_t deferred_elems_ = 0;
  std::vector<UnitReduceSchedule> schedules_;
  std::optional<std::pair<std::size_t, typename Units::Pending>> in_flight_;  // class, reduction
  std::map<std::size_t, comm::TrackedBytes> held_;
};

}  // namespace shardcheck::parallel::mesh_detail
