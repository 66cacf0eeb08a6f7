// The optimizer's collectives over its flat buffers (ShardedClass, mesh_classes.hpp), written once
// and run with data or without: MeshOptimizer<T> (mesh_zero.cpp) runs them on its packed
// gradients and parameters, the planner's timing-only run (mesh_timing.cpp) on null
// buffers of the same counts (NullClassData). Which class, which collective on which of its
// groups, over which flat ranges, in which order:
//   issue            zero 0/1, DDP's buckets: per class, one all_reduce of the bucket's gradients
//                    not issued yet, in flight until reduce.
//   reduce           the step's end. zero 0/1: per class of more than one rank, one all_reduce of
//                    what issue left, then its issued buckets waited. zero 2/3: per class not
//                    reduced every microbatch, one reduce_scatter of the padded buffer, the
//                    rank's shard then summed over its replicas (hybrid_shard).
//   issue_unit / complete_unit    zero 3: one class's reduce_scatter during the backward
//                    (mesh_grad_units.hpp says which and when), its shard accumulated.
//   share            zero 1/2, after the update: the owned shard all_gathered.
//   update           the optimizer step around each class's AdamW: share, then one compute
//                    report of every owned element.
//   issue_gather / complete_gather    zero 3: a wrap unit's all_gathers before its use.
// The planted bugs that change what is reduced (tests: kSkipBucket, kWrongShardOffset,
// kSkipReplicaSum, kGradAveragedNotSummed) are applied here; the timing-only run plants none.
//
// D, the data, packs and unpacks (what each collective moves is D::view of a D::Buf):
//   Buf pack(c, ranges, padded_to)   the gradient's ranges in order, zero-padded to padded_to
//   Buf take(c)                      the whole padded gradient, which is then zeroed
//   void unpack(c, ranges, buf)      reduced elements written back into the gradient
//   Buf slice(buf, at, n)            elements [at, at + n) of buf
//   void keep(c, shard, accumulate)  the rank's reduced shard kept (accumulate: added)
//   Buf owned_padded(c, temporary)   the padded parameter buffer (in the dtype all_gathers move)
//                                    holding this rank's owned range at its place; temporary:
//                                    counted as temporary memory (share); a gather's buffer is the
//                                    unit's resident parameters, only its staging counted (below)
//   std::size_t staged_bytes(buf)    a gather buffer's staging beside the parameters (bf16)
//   Held hold(bytes)                 those bytes counted as temporary memory, for one unit's
//                                    gathers together, until they complete
//   void unpack_full(c, buf)         a gathered parameter buffer written into the parameters
//   comm::Buffer view(buf)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/costs.hpp"
#include "parallel/mp/mesh_classes.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::parallel {

// Flat ranges [begin, end) of a buffer, in order.
using FlatRanges = std::vector<std::pair<int64_t, int64_t>>;

// The flat ranges of c's parameters whose spec index pick keeps, contiguous ones merged.
template <class Pick>
FlatRanges flat_ranges(const FlatClass& c, const std::vector<LocalParam>& specs, const Pick& pick) {
  FlatRanges out;
  for (std::size_t k = 0; k < c.specs.size(); ++k) {
    if (!pick(c.specs[k])) continue;
    const int64_t a = c.base[k], b = a + ref::numel_of(specs[c.specs[k]].local_shape);
    if (!out.empty() && out.back().second == a) {
      out.back().second = b;
    } else if (a < b) {
      out.emplace_back(a, b);
    }
  }
  return out;
}

inline int64_t flat_count(const FlatRanges& r) {
  int64_t n = 0;
  for (const auto& [a, b] : r) n += b - a;
  return n;
}

template <class D>
class ClassComm {
 public:
  using Buf = typename D::Buf;
  struct Options {
    int zero = 0;
    comm::ReduceOptions sum;  // the gradient reductions' operation
    testing::Mutation planted = testing::Mutation::kNone;
  };
  ClassComm(const std::vector<LocalParam>* specs, Options o) : specs_(specs), o_(o) {}

  // zero 3: the classes reduced every microbatch (issue_unit); reduce() leaves them out.
  void reduce_each_microbatch(std::vector<bool> classes) { each_ = std::move(classes); }
  bool each_microbatch(std::size_t ci) const { return !each_.empty() && each_[ci]; }

  // bucket: indices into the specs of the gradients DDP's bucket holds.
  template <class C>
  void issue(const std::vector<C>& cs, D& d, const std::vector<std::size_t>& bucket) {
    if (o_.zero >= 2) return;  // reduce_scatter once per step, after the pipeline flush
    if (issued_spec_.empty()) issued_spec_.assign(specs_->size(), false);
    std::vector<bool> in(specs_->size(), false);
    for (const std::size_t i : bucket) in.at(i) = true;
    for (std::size_t ci = 0; ci < cs.size(); ++ci) {
      const C& c = cs[ci];
      if (c.numel == 0 || c.group->size() == 1) continue;
      const auto fresh = [&](std::size_t i) { return in[i] && !issued_spec_[i]; };
      FlatRanges ranges = flat_ranges(c, *specs_, fresh);
      if (ranges.empty()) continue;
      for (const std::size_t i : c.specs)
        if (fresh(i)) issued_spec_[i] = true;
      Buf buf = d.pack(c, ranges, 0);
      comm::WorkPtr work = c.group->all_reduce(d.view(buf), o_.sum);
      issued_.push_back(Issued{ci, std::move(ranges), std::move(buf), std::move(work)});
    }
  }

  template <class C>
  void reduce(std::vector<C>& cs, D& d) {
    for (std::size_t ci = 0; ci < cs.size(); ++ci) {
      C& c = cs[ci];
      comm::Communicator& g = *c.group;
      if (c.numel == 0) continue;
      if (o_.zero >= 2) {
        if (each_microbatch(ci)) continue;
        Buf flat = d.pack(c, FlatRanges{{0, c.numel}}, c.padded());
        if (g.size() > 1 && !skipped(cs, ci)) g.reduce_scatter(d.view(flat), o_.sum)->wait();
        keep_shard(c, d, flat, false);
        continue;
      }
      if (g.size() == 1) continue;
      // What issue has not sent yet, in flat order.
      const FlatRanges rest = flat_ranges(
          c, *specs_, [&](std::size_t i) { return issued_spec_.empty() || !issued_spec_[i]; });
      // kSkipBucket (tests): the first bucket issued during backward, or without one the rest,
      // is left unreduced.
      const bool skip = o_.planted == testing::Mutation::kSkipBucket && ci == 0;
      const auto first = std::find_if(issued_.begin(), issued_.end(),
                                      [&](const Issued& is) { return is.cls == ci; });
      if (!rest.empty() && !(skip && first == issued_.end())) {
        Buf flat = d.pack(c, rest, 0);
        g.all_reduce(d.view(flat), o_.sum)->wait();
        d.unpack(c, rest, flat);
      }
      for (auto it = issued_.begin(); it != issued_.end(); ++it) {
        if (it->cls != ci) continue;
        it->work->wait();
        if (!(skip && it == first)) d.unpack(c, it->ranges, it->buf);
      }
    }
    issued_.clear();
    issued_spec_.clear();
  }

  // One class's reduce_scatter in flight (zero 3).
  struct UnitReduce {
    std::size_t cls = 0;
    Buf flat{};
    comm::WorkPtr work;
  };
  template <class C>
  UnitReduce issue_unit(const std::vector<C>& cs, D& d, std::size_t ci) {
    const C& c = cs.at(ci);
    UnitReduce r{ci, d.take(c), {}};
    if (c.group->size() > 1 && !skipped(cs, ci))
      r.work = c.group->reduce_scatter(d.view(r.flat), o_.sum);
    return r;
  }
  template <class C>
  void complete_unit(std::vector<C>& cs, D& d, UnitReduce& r) {
    if (r.work) r.work->wait();
    keep_shard(cs.at(r.cls), d, r.flat, true);
    r = UnitReduce{};
  }

  // zero 1/2 after the update: every rank updated its shard of the working parameters.
  template <class C>
  void share(const C& c, D& d) const {
    comm::Communicator& g = *c.group;
    if (o_.zero == 0 || o_.zero == 3 || g.size() == 1 || c.numel == 0) return;
    Buf full = d.owned_padded(c, true);
    g.all_gather(d.view(full))->wait();
    d.unpack_full(c, full);
  }

  // The optimizer step (MeshOptimizer::update): for each class, adam(c) (AdamW on its owned range;
  // the timing-only run has none to do) then share(c, d); then one AdamW compute report on world
  // over every owned element.
  template <class C, class Adam>
  void update(std::vector<C>& cs, D& d, const Adam& adam, comm::Communicator& world,
              const Recipe& recipe) const {
    int64_t owned = 0;
    for (C& c : cs) {
      adam(c);
      owned += c.own_end - c.own_begin;
      share(c, d);
    }
    world.compute(costs::adamw(static_cast<double>(owned), recipe));
  }

  // zero 3: one wrap unit's all_gathers (one per class holding it), in flight.
  struct Gather {
    struct Part {
      std::size_t cls = 0;
      Buf buf{};
      comm::WorkPtr work;
    };
    std::vector<Part> parts;
    typename D::Held staging{};  // the parts' staging, counted until they complete
  };
  template <class C>
  Gather issue_gather(const std::vector<C>& cs, D& d, int unit) const {
    Gather out;
    if (o_.zero != 3) return out;
    if (by_unit_classes_ != cs.size()) {  // the classes of each unit, in order
      by_unit_.clear();
      for (std::size_t ci = 0; ci < cs.size(); ++ci) {
        const auto u = static_cast<std::size_t>(cs[ci].unit);
        if (by_unit_.size() <= u) by_unit_.resize(u + 1);
        by_unit_[u].push_back(ci);
      }
      by_unit_classes_ = cs.size();
    }
    if (unit < 0 || static_cast<std::size_t>(unit) >= by_unit_.size()) return out;
    for (const std::size_t ci : by_unit_[static_cast<std::size_t>(unit)]) {
      const C& c = cs[ci];
      if (c.group->size() == 1 || c.numel == 0) continue;
      typename Gather::Part part{ci, d.owned_padded(c, false), {}};
      part.work = c.group->all_gather(d.view(part.buf));
      out.parts.push_back(std::move(part));
    }
    std::size_t staged = 0;
    for (const typename Gather::Part& part : out.parts) staged += d.staged_bytes(part.buf);
    if (staged > 0) out.staging = d.hold(staged);
    return out;
  }
  template <class C>
  void complete_gather(const std::vector<C>& cs, D& d, Gather& g) const {
    for (typename Gather::Part& part : g.parts) {
      part.work->wait();
      d.unpack_full(cs[part.cls], part.buf);
    }
    g = Gather{};
  }
  // The unit's unsharded (padded) elements on this rank: what a gather makes resident.
  template <class C>
  static int64_t unit_elems(const std::vector<C>& cs, int unit) {
    int64_t n = 0;
    for (const C& c : cs)
      if (c.unit == unit && c.group->size() > 1) n += c.padded();
    return n;
  }

 private:
  struct Issued {
    std::size_t cls = 0;
    FlatRanges ranges;  // flat ranges of the class, packed in order
    Buf buf;
    comm::WorkPtr work;
  };
  // planted kSkipBucket (zero >= 2): the class left unreduced.
  template <class C>
  bool skipped(const std::vector<C>& cs, std::size_t ci) const {
    return o_.planted == testing::Mutation::kSkipBucket && ci == cs.size() / 2;
  }
  // zero >= 2: the rank's shard of a reduce_scattered (padded) buffer, summed over the replicas
  // (hybrid_shard), kept; planted kWrongShardOffset / kSkipReplicaSum (tests).
  template <class C>
  void keep_shard(C& c, D& d, const Buf& flat, bool accumulate) const {
    const comm::Communicator& g = *c.group;
    int64_t at = c.shard * g.rank();
    if (o_.planted == testing::Mutation::kWrongShardOffset) at = g.rank() * (c.numel / g.size());
    Buf shard = d.slice(flat, at, c.shard);
    if (c.replicas != nullptr && c.replicas->size() > 1 &&
        o_.planted != testing::Mutation::kSkipReplicaSum)
      c.replicas->all_reduce(d.view(shard))->wait();
    d.keep(c, shard, accumulate);
  }

  const std::vector<LocalParam>* specs_;
  Options o_;
  std::vector<Issued> issued_;
  std::vector<bool> issued_spec_;  // by spec index: summed by an issued bucket
  std::vector<bool> each_;         // by class: reduced by issue_unit
  mutable std::vector<std::vector<std::size_t>> by_unit_;  // issue_gather's index of the classes
  mutable std::size_t by_unit_classes_ = 0;                // ... built over this many
};

// The data of a timing-only run: null buffers of the counts the optimizer's would hold, gradients
// in `grad`, parameters all_gathered in `param`.
struct NullClassData {
  using Buf = comm::Buffer;
  struct Held {};
  comm::DType grad = comm::DType::f32;
  comm::DType param = comm::DType::f32;
  static Buf null(int64_t n, comm::DType t) {
    return comm::Buffer{nullptr, static_cast<std::size_t>(n), t, {}};
  }
  Buf pack(const FlatClass&, const FlatRanges& r, int64_t padded_to) const {
    return null(std::max(flat_count(r), padded_to), grad);
  }
  Buf take(const ShardedClass& c) const { return null(c.padded(), grad); }
  void unpack(const FlatClass&, const FlatRanges&, const Buf&) const {}
  Buf slice(const Buf&, int64_t, int64_t n) const { return null(n, grad); }
  void keep(const ShardedClass&, const Buf&, bool) const {}
  Buf owned_padded(const ShardedClass& c, bool) const { return null(c.padded(), param); }
  static std::size_t staged_bytes(const Buf&) { return 0; }
  static Held hold(std::size_t) { return {}; }
  void unpack_full(const ShardedClass&, const Buf&) const {}
  static comm::Buffer view(const Buf& b) { return b; }
};

}  // namespace shardcheck::parallel
