// Internal to the mesh engine (mesh_chunks.cpp): ZeRO-3 / FSDP's per-microbatch reduce_scatter of
// each flat buffer during the backward (which buffers and when: mesh_grad_units.hpp), driving
// MeshOptimizer's issue_unit_reduce / complete_unit_reduce and holding each buffer's unsharded
// microbatch gradient in the tracker from the step that starts it until its reduction completes.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm/memory.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_grad_units.hpp"
#include "parallel/mp/mesh_zero.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::parallel::mesh_detail {

template <class T>
class UnitReducer {
 public:
  struct Setup {
    const ref::ModelConfig* model = nullptr;
    const std::map<int, int>* wrap_of = nullptr;  // layerwise unit -> wrap unit
    const StagePlan* plan = nullptr;
    int pp = 1, virtual_stages = 1, stage = 0, zero = 0;
    std::size_t bytes_per_elem = 0;                        // of a microbatch gradient
    testing::Mutation planted = testing::Mutation::kNone;  // kUnitReducedEarly (tests)
  };
  // Does nothing unless zero == 3 (every parameter is then reduced at the step's end).
  UnitReducer(const Setup& s, const std::vector<LocalParam>& specs, MeshOptimizer<T>& opt,
              comm::MemoryTracker& mem)
      : opt_(opt), mem_(mem), bytes_(s.bytes_per_elem) {
    const auto unit = [&](const LocalParam& p) { return s.wrap_of->at(unit_of(*s.model, p.name)); };
    const std::vector<FlatClass> classes = flat_classes(specs, s.zero, unit);
    const std::vector<int> chunk_of = unit_reduce_chunks(*s.model, *s.plan, s.pp, s.virtual_stages,
                                                         s.stage, s.zero, specs, classes);
    std::vector<bool> each(classes.size(), false);
    for (std::size_t ci = 0; ci < classes.size(); ++ci) {
      each[ci] = chunk_of[ci] >= 0;
      class_specs_.emplace_back();
      for (const std::size_t k : classes[ci].specs) {
        class_specs_.back().push_back(specs[k]);
        if (each[ci]) reduced_.insert(specs[k].name);
      }
      if (!each[ci]) deferred_elems_ += static_cast<std::size_t>(classes[ci].numel);
      class_elems_.push_back(classes[ci].numel);
    }
    for (const LocalParam& p : specs)
      if (deferred(p)) deferred_specs_.push_back(p);
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
    opt_.reduce_each_microbatch(std::move(each));
  }

  // Reduced at the step's end: the rest (every parameter unless zero == 3), and their elements.
  bool deferred(const LocalParam& p) const { return reduced_.count(p.name) == 0; }
  const std::vector<LocalParam>& deferred_specs() const { return deferred_specs_; }
  std::size_t deferred_elems() const { return deferred_elems_; }

  // Step `step` of a chunk's backward begins: the unsharded gradients it starts are held.
  void begin(int chunk, std::size_t step) {
    if (schedules_.empty()) return;
    for (const std::size_t ci : schedules_[static_cast<std::size_t>(chunk)].alloc[step])
      held_[ci] = comm::TrackedBytes(mem_, comm::MemCategory::grads,
                                     static_cast<std::size_t>(class_elems_[ci]) * bytes_);
  }
  // Step `step` has written the buffers it completes: prepare(their parameters) readies each
  // (the bf16 rounding, the sums sync_gradients would make first), then its reduce_scatter goes
  // once the one in flight has completed.
  template <class Prepare>
  void ready(int chunk, std::size_t step, ref::ParamMap<T>& grads, const Prepare& prepare) {
    if (schedules_.empty()) return;
    for (const std::size_t ci : schedules_[static_cast<std::size_t>(chunk)].ready[step]) {
      prepare(class_specs_[ci]);
      finish();
      in_flight_ = opt_.issue_unit_reduce(ci, grads);
    }
  }
  // The reduction in flight completes (the end of a chunk's backward).
  void finish() {
    if (!in_flight_) return;
    const std::size_t ci = in_flight_->cls;
    opt_.complete_unit_reduce(*in_flight_);
    in_flight_.reset();
    held_.erase(ci);
  }

 private:
  MeshOptimizer<T>& opt_;
  comm::MemoryTracker& mem_;
  std::size_t bytes_;
  std::vector<std::vector<LocalParam>> class_specs_;
  std::vector<int64_t> class_elems_;
  std::set<std::string> reduced_;
  std::vector<LocalParam> deferred_specs_;
  std::size_t deferred_elems_ = 0;
  std::vector<UnitReduceSchedule> schedules_;
  std::optional<typename MeshOptimizer<T>::UnitReduce> in_flight_;
  std::map<std::size_t, comm::TrackedBytes> held_;
};

}  // namespace shardcheck::parallel::mesh_detail
