// Internal to the mesh engine (mesh_engine.cpp): ZeRO-3 / FSDP parameter residency. A pipeline
// callback (one microbatch's forward or backward of one chunk) uses wrap units in an order known
// when it begins. Each unit is all_gathered before its use, the next `prefetch` distinct units of
// the callback are issued right after it (their gathers overlap its compute), and a unit is freed
// after its last use in the callback, unless kept: with keep_after_forward (FSDP shard_grad_op,
// or reshard_after_forward off) the units a forward gathered stay until the same microbatch's
// backward of the chunk ends, which then gathers none of them again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "comm/memory.hpp"
#include "parallel/mp/mesh_zero.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel::mesh_detail {

// The wrap units (wrap_of: layerwise unit -> wrap unit) a chunk of layers [first, last) uses: in
// forward the embedding (first virtual stage), its layers, the head and tied embedding (last);
// in backward the head and tied embedding, its layers in reverse (the embedding's backward needs
// no parameters). In order, repeats kept.
inline std::vector<int> chunk_uses(const ref::ModelConfig& model, const std::map<int, int>& wrap_of,
                                   std::pair<int, int> layers, bool first_stage, bool last_stage,
                                   bool forward) {
  std::vector<int> uses;
  const auto add_head = [&] {
    if (!last_stage) return;
    uses.push_back(wrap_of.at(model.layers + 1));
    if (model.tie_embeddings) uses.push_back(wrap_of.at(0));
  };
  if (forward) {
    if (first_stage) uses.push_back(wrap_of.at(0));
    for (int layer = layers.first; layer < layers.second; ++layer)
      uses.push_back(wrap_of.at(layer + 1));
    add_head();
  } else {
    add_head();
    for (int layer = layers.second - 1; layer >= layers.first; --layer)
      uses.push_back(wrap_of.at(layer + 1));
  }
  return uses;
}

template <class T>
class MeshResidency {
 public:
  struct Options {
    int prefetch = 0;
    bool keep_after_forward = false;
  };
  MeshResidency(MeshOptimizer<T>& opt, ref::ParamMap<T>& params, comm::MemoryTracker& mem,
                std::size_t param_bytes, Options o)
      : opt_(opt), params_(params), mem_(mem), param_bytes_(param_bytes), o_(o) {}

  // A callback of microbatch mb, chunk that uses these wrap units in this order.
  void begin(int mb, int chunk, bool forward, std::vector<int> uses) {
    key_ = {mb, chunk};
    forward_ = forward;
    uses_ = std::move(uses);
    at_ = 0;
  }
  // Before the callback's next `count` uses (used together, as the tied head's two units): the
  // previous ones are retired, these gathered (or their prefetch waited for), and the prefetch
  // of the units after them issued.
  void next(std::size_t count = 1) {
    retire();
    first_ = at_;
    for (std::size_t i = 0; i < count; ++i) ensure(uses_.at(at_++));
    std::set<int> seen(uses_.begin() + static_cast<std::ptrdiff_t>(first_),
                       uses_.begin() + static_cast<std::ptrdiff_t>(at_));
    int issued = 0;
    for (std::size_t j = at_; j < uses_.size() && issued < o_.prefetch; ++j) {
      if (!seen.insert(uses_[j]).second) continue;
      issue(uses_[j]);
      ++issued;
    }
  }
  // After the callback: its units are freed unless kept; a backward also ends what the same
  // microbatch's forward of the chunk kept.
  void end() {
    retire();
    if (!forward_) {
      std::vector<int> units;
      for (auto& [u, h] : held_) {
        h.kept.erase(key_);
        units.push_back(u);
      }
      for (const int u : units) free_if_unused(u);
    }
    uses_.clear();
    at_ = first_ = 0;
  }

 private:
  struct Held {
    typename MeshOptimizer<T>::UnitGather pending;
    bool ready = false;
    comm::TrackedBytes bytes;
    std::set<std::pair<int, int>> kept;  // the (microbatch, chunk) forwards that keep it
  };

  void issue(int u) {
    if (held_.count(u) > 0) return;
    Held& h = held_[u];
    h.bytes = comm::TrackedBytes(mem_, comm::MemCategory::params,
                                 static_cast<std::size_t>(opt_.unit_elems(u)) * param_bytes_);
    h.pending = opt_.issue_gather(u, params_);
  }
  void ensure(int u) {
    issue(u);
    Held& h = held_.at(u);
    if (!h.ready) {
      opt_.complete_gather(h.pending, params_);
      h.ready = true;
    }
  }
  // The uses [first_, at_) are done: each unit not used again in this callback is kept (a
  // forward under keep_after_forward) or freed.
  void retire() {
    for (std::size_t i = first_; i < at_; ++i) {
      const int u = uses_[i];
      if (std::find(uses_.begin() + static_cast<std::ptrdiff_t>(at_), uses_.end(), u) !=
          uses_.end())
        continue;
      if (forward_ && o_.keep_after_forward) held_.at(u).kept.insert(key_);
      free_if_unused(u);
    }
    first_ = at_;
  }
  void free_if_unused(int u) {
    const auto it = held_.find(u);
    if (it == held_.end() || !it->second.kept.empty()) return;
    if (std::find(uses_.begin() + static_cast<std::ptrdiff_t>(at_), uses_.end(), u) != uses_.end())
      return;
    if (!it->second.ready) opt_.complete_gather(it->second.pending, params_);
    opt_.release_unit(u, params_);
    held_.erase(it);
  }

  MeshOptimizer<T>& opt_;
  ref::ParamMap<T>& params_;
  comm::MemoryTracker& mem_;
  std::size_t param_bytes_;
  Options o_;
  std::map<int, Held> held_;
  std::pair<int, int> key_{};
  bool forward_ = true;
  std::vector<int> uses_;
  std::size_t at_ = 0, first_ = 0;
};

}  // namespace shardcheck::parallel::mesh_detail
