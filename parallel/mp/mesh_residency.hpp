// ZeRO-3 / FSDP parameter residency of the mesh engine (mesh_engine.cpp), shared with its ledger
// (mesh_ledger.hpp), which replays it without data. A pipeline callback (one microbatch's forward
// or backward of one chunk) uses wrap units in an order known when it begins. Each unit is
// all_gathered before its use, the next `prefetch` distinct units of the callback are issued right
// after it (their gathers overlap its compute), and a unit is freed after its last use in the
// callback, unless kept: with keep_after_forward (FSDP shard_grad_op, or reshard_after_forward off)
// the units a forward gathered stay until the same microbatch's backward of the chunk ends, which
// then gathers none of them again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/memory.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/mp/mesh_zero.hpp"
#include "reference/config.hpp"

namespace shardcheck::parallel::mesh_detail {

// Layerwise unit (layerwise.hpp: 0 embedding, 1..L blocks, L+1 head) -> FSDP wrap unit.
inline std::map<int, int> wrap_map(const ref::ModelConfig& model, const FsdpOptions& f) {
  std::map<int, int> out;
  const std::vector<std::vector<int>> units = wrap_units(model, f.wrap, f.blocks_per_unit);
  for (std::size_t w = 0; w < units.size(); ++w)
    for (const int lu : units[w]) out[lu] = static_cast<int>(w);
  return out;
}

// The residency policy over Ops, which moves the data: Ops::Pending issue(unit) starts a unit's
// gathers, complete(Pending&) finishes them, release(unit) frees the unit, elems(unit) is its
// unsharded size. Held units are reported to mem (category params, bytes_per_elem each).
template <class Ops>
class Residency {
 public:
  struct Options {
    int prefetch = 0;
    bool keep_after_forward = false;
  };
  Residency(Ops ops, comm::MemoryTracker& mem, std::size_t bytes_per_elem, Options o)
      : ops_(std::move(ops)), mem_(mem), bytes_(bytes_per_elem), o_(o) {}

  // A callback of microbatch mb, chunk that uses these groups of wrap units in this order (read
  // until end(): the caller keeps them).
  void begin(int mb, int chunk, bool forward, const std::vector<std::vector<int>>& uses) {
    key_ = {mb, chunk};
    forward_ = forward;
    uses_ = &uses;
    at_ = 0;
    int units = 0;
    for (const std::vector<int>& g : uses)
      for (const int u : g) units = std::max(units, u + 1);
    last_use_.assign(static_cast<std::size_t>(units), 0);
    for (std::size_t j = 0; j < uses.size(); ++j)
      for (const int u : uses[j]) last_use_[static_cast<std::size_t>(u)] = j + 1;
  }
  // Before the callback's next group: the previous group is retired, this one gathered (or its
  // prefetch waited for), and the gathers of the next `prefetch` distinct units after it issued.
  void next() {
    retire();
    const std::vector<int>& now = uses_->at(at_++);
    for (const int u : now) ensure(u);
    if (o_.prefetch == 0) return;
    std::vector<int>& seen = scratch_;
    seen.assign(now.begin(), now.end());
    int issued = 0;
    for (std::size_t j = at_; j < uses_->size() && issued < o_.prefetch; ++j)
      for (const int u : (*uses_)[j]) {
        if (issued == o_.prefetch || std::find(seen.begin(), seen.end(), u) != seen.end()) continue;
        seen.push_back(u);
        issue(u);
        ++issued;
      }
  }
  // After the callback: its units are freed unless kept; a backward also ends what the same
  // microbatch's forward of the chunk kept.
  void end() {
    retire();
    if (!forward_) {
      if (const auto it = kept_by_.find(key_); it != kept_by_.end()) {
        for (const int u : it->second) --held(u)->kept;
        kept_by_.erase(it);
      }
      for (std::size_t u = 0; u < held_.size(); ++u)
        if (held_[u]) free_if_unused(static_cast<int>(u));
    }
    uses_ = &kNoUses;
    last_use_.clear();
    at_ = 0;
  }
  // No unit is held (gathered, prefetched or kept): a callback begun now does the same, byte for
  // byte, as any other begun idle with the same uses.
  bool idle() const { return held_count_ == 0; }

 private:
  struct Held {
    typename Ops::Pending pending;
    bool ready = false;
    comm::TrackedBytes bytes;
    int kept = 0;  // the (microbatch, chunk) forwards that keep it (kept_by_)
  };

  // Whether a group at or after at_ uses u (the last group using each unit, from begin()).
  bool used_later(int u) const {
    const auto i = static_cast<std::size_t>(u);
    return i < last_use_.size() && last_use_[i] > at_;  // last group + 1 > at_
  }
  void issue(int u) {
    if (held(u)) return;
    const auto i = static_cast<std::size_t>(u);
    if (i >= held_.size()) held_.resize(i + 1);
    Held& h = held_[i].emplace();
    ++held_count_;
    h.bytes = comm::TrackedBytes(mem_, comm::MemCategory::params,
                                 static_cast<std::size_t>(ops_.elems(u)) * bytes_);
    h.pending = ops_.issue(u);
  }
  void ensure(int u) {
    issue(u);
    Held& h = *held(u);
    if (!h.ready) {
      ops_.complete(h.pending);
      h.ready = true;
    }
  }
  // The group before at_ is done: each of its units not used again in this callback is kept (a
  // forward under keep_after_forward) or freed.
  void retire() {
    if (at_ == 0) return;
    for (const int u : (*uses_)[at_ - 1]) {
      if (used_later(u) || !held(u)) continue;
      if (forward_ && o_.keep_after_forward) {
        std::vector<int>& units = kept_by_[key_];
        if (std::find(units.begin(), units.end(), u) == units.end()) {
          units.push_back(u);
          ++held(u)->kept;
        }
      }
      free_if_unused(u);
    }
  }
  void free_if_unused(int u) {
    Held* h = held(u);
    if (!h || h->kept > 0 || used_later(u)) return;
    if (!h->ready) ops_.complete(h->pending);
    ops_.release(u);
    held_[static_cast<std::size_t>(u)].reset();
    --held_count_;
  }

  Ops ops_;
  comm::MemoryTracker& mem_;
  std::size_t bytes_;
  Options o_;
  // What unit u holds, if anything.
  Held* held(int u) {
    const auto i = static_cast<std::size_t>(u);
    return i < held_.size() && held_[i] ? &*held_[i] : nullptr;
  }

  std::vector<std::optional<Held>> held_;  // per unit (wrap units are 0, 1, ...)
  std::size_t held_count_ = 0;
  std::map<std::pair<int, int>, std::vector<int>> kept_by_;  // forward (mb, chunk) -> units kept
  std::pair<int, int> key_{};
  bool forward_ = true;
  static inline const std::vector<std::vector<int>> kNoUses;
  const std::vector<std::vector<int>>* uses_ = &kNoUses;
  std::vector<std::size_t> last_use_;  // per unit: its last group in the callback + 1, 0 if none
  std::size_t at_ = 0;
  std::vector<int> scratch_;  // next()'s units seen, kept to spare an allocation per group
};

// The engine's Ops: the optimizer's all_gathers into the working parameters.
template <class T>
struct OptimizerGathers {
  using Pending = typename MeshOptimizer<T>::UnitGather;
  MeshOptimizer<T>* opt = nullptr;
  ref::ParamMap<T>* params = nullptr;
  Pending issue(int u) { return opt->issue_gather(u, *params); }
  void complete(Pending& g) { opt->complete_gather(g, *params); }
  void release(int u) { opt->release_unit(u, *params); }
  int64_t elems(int u) const { return opt->unit_elems(u); }
};

template <class T>
using MeshResidency = Residency<OptimizerGathers<T>>;

}  // namespace shardcheck::parallel::mesh_detail
