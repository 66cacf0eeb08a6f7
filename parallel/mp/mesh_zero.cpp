// MeshOptimizer: see mesh_zero.hpp. AdamW element by element as reference/optim.cpp (same order
// and types), over flat owned ranges whose decay flags come from the parameters' ranks.
#include "parallel/mp/mesh_zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <type_traits>

#include "parallel/adamw.hpp"
#include "parallel/costs.hpp"
#include "parallel/flops.hpp"
#include "parallel/testing.hpp"
#include "reference/bf16.hpp"

namespace shardcheck::parallel {

using comm::MemCategory;

template <class T>
MeshOptimizer<T>::MeshOptimizer(Env env, const std::vector<LocalParam>& specs,
                                ref::ParamMap<T>& params)
    : env_(std::move(env)), specs_(specs), mem_(&env_.world->memory()) {
  for (ShardedClass& s : shard_classes(flat_classes(specs_, env_.zero, env_.unit_of), env_.zero,
                                       {.dense = env_.dense,
                                       .expert = env_.expert,
                                       .dense_replicas = env_.dense_replicas,
                                       .expert_replicas = env_.expert_replicas})) {
    Class c;
    static_cast<ShardedClass&>(c) = std::move(s);
    classes_.push_back(std::move(c));
  }
  for (Class& c : classes_) {
    const auto s = static_cast<std::size_t>(c.shard);
    c.m.assign(s, T{0});
    c.v.assign(s, T{0});
    c.decay.assign(s, 0);
    segments(c, c.own_begin, c.own_end, [&](const LocalParam& p, int64_t, int64_t n, int64_t f) {
      std::fill_n(c.decay.begin() + (f - c.own_begin), n, p.global_shape.size() == 2 ? 1 : 0);
    });
    if (env_.bf16) {
      c.master = pack(c, params, c.own_begin, c.own_end);
      c.master.resize(s, T{0});
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (env_.bf16 && env_.planted != testing::Mutation::kBf16WorkingLeftInF32)
      ref::round_to_bf16(params);
  }
  tracked_ = static_cast<std::size_t>(owned_elems()) * env_.recipe.optimizer();
  mem_->allocate(MemCategory::optimizer, tracked_);
  for (const Class& c : classes_) release_class(c, params);
}

template <class T>
MeshOptimizer<T>::~MeshOptimizer() {
  mem_->release(MemCategory::optimizer, tracked_);
}

template <class T>
int64_t MeshOptimizer<T>::owned_elems() const {
  int64_t n = 0;
  for (const Class& c : classes_) n += c.shard;
  return n;
}

template <class T>
int64_t MeshOptimizer<T>::resident_elems() const {
  if (env_.zero == 3) return owned_elems();
  int64_t n = 0;
  for (const Class& c : classes_) n += c.numel;
  return n;
}

template <class T>
void MeshOptimizer<T>::segments(const Class& c, int64_t begin, int64_t end,
                                const SegmentFn& fn) const {
  for (std::size_t k = 0; k < c.specs.size(); ++k) {
    const LocalParam& p = specs_[c.specs[k]];
    const int64_t lo = std::max(begin, c.base[k]);
    const int64_t hi = std::min(end, c.base[k] + ref::numel_of(p.local_shape));
    if (lo < hi) fn(p, lo - c.base[k], hi - lo, lo);
  }
}

template <class T>
std::vector<T> MeshOptimizer<T>::pack(const Class& c, const ref::ParamMap<T>& m, int64_t begin,
                                      int64_t end) const {
  std::vector<T> flat(static_cast<std::size_t>(end - begin));
  segments(c, begin, end, [&](const LocalParam& p, int64_t local, int64_t n, int64_t f) {
    std::copy_n(m[p.name].data() + local, n, flat.begin() + (f - begin));
  });
  return flat;
}

template <class T>
void MeshOptimizer<T>::unpack(const Class& c, std::span<const T> flat, int64_t begin,
                              ref::ParamMap<T>& m) const {
  const int64_t end = begin + static_cast<int64_t>(flat.size());
  segments(c, begin, std::min(end, c.numel),
           [&](const LocalParam& p, int64_t local, int64_t n, int64_t f) {
             std::copy_n(flat.begin() + (f - begin), n, m[p.name].data() + local);
           });
}

template <class T>
bool MeshOptimizer<T>::counts(const LocalParam& p, bool norm) const {
  const bool wrong_group = norm && env_.planted == testing::Mutation::kNormOverWrongGroup;
  return !p.tied_copy && !(p.tp_replicated && env_.tp_rank != 0 && !wrong_group) &&
         !(p.kv_replicas > 1 && env_.tp_rank % p.kv_replicas != 0);
}

template <class T>
void MeshOptimizer<T>::reduce(ref::ParamMap<T>& grads) {
  for (Class& c : classes_) {
    comm::Communicator& g = *c.group;
    if (c.numel == 0) continue;
    const auto ci = static_cast<std::size_t>(&c - classes_.data());
    if (env_.zero >= 2) {
      if (!each_microbatch_.empty() && each_microbatch_[ci]) continue;
      std::vector<T> flat = pack(c, grads, 0, c.numel);
      flat.resize(static_cast<std::size_t>(c.shard * g.size()), T{0});
      const comm::TrackedBytes tmp(*mem_, MemCategory::temporary, flat.size() * sizeof(T));
      if (g.size() > 1 && !skipped(c))
        g.reduce_scatter(comm::view(std::span<T>(flat)), sum())->wait();
      c.grad = own_shard(c, flat);
      continue;
    }
    if (g.size() == 1) continue;
    // What issue_reduce has not sent yet, in flat order.
    const auto rest = ranges(c, [&](const LocalParam& p) {
      return issued_spec_.empty() || !issued_spec_[static_cast<std::size_t>(&p - specs_.data())];
    });
    std::vector<T> flat;
    for (const auto& [a, b] : rest) {
      const std::vector<T> part = pack(c, grads, a, b);
      flat.insert(flat.end(), part.begin(), part.end());
    }
    // kSkipBucket (tests): the first bucket issued during backward, or without one the rest, is
    // left unreduced.
    bool skip = env_.planted == testing::Mutation::kSkipBucket && ci == 0;
    const auto first_issued = std::find_if(issued_.begin(), issued_.end(),
                                           [&](const Issued& is) { return is.cls == ci; });
    if (!flat.empty() && !(skip && first_issued == issued_.end())) {
      const comm::TrackedBytes tmp(*mem_, MemCategory::temporary, flat.size() * sizeof(T));
      g.all_reduce(std::span<T>(flat), sum())->wait();
      std::size_t at = 0;
      for (const auto& [a, b] : rest) {
        unpack(c, std::span<const T>(flat).subspan(at, static_cast<std::size_t>(b - a)), a, grads);
        at += static_cast<std::size_t>(b - a);
      }
    }
    for (auto it = issued_.begin(); it != issued_.end(); ++it) {
      Issued& is = *it;
      if (is.cls != ci) continue;
      is.work->wait();
      if (skip && it == first_issued) continue;
      std::size_t at = 0;
      for (const auto& [a, b] : is.ranges) {
        unpack(c, std::span<const T>(is.flat).subspan(at, static_cast<std::size_t>(b - a)), a,
               grads);
        at += static_cast<std::size_t>(b - a);
      }
    }
  }
  issued_.clear();
  issued_spec_.clear();
}

template <class T>
std::vector<T> MeshOptimizer<T>::own_shard(const Class& c, const std::vector<T>& flat) const {
  const comm::Communicator& g = *c.group;
  auto at = static_cast<std::ptrdiff_t>(c.shard * g.rank());
  if (env_.planted == testing::Mutation::kWrongShardOffset)
    at = static_cast<std::ptrdiff_t>(g.rank() * (c.numel / g.size()));
  std::vector<T> shard(flat.begin() + at, flat.begin() + at + c.shard);
  if (c.replicas != nullptr && c.replicas->size() > 1 &&
      env_.planted != testing::Mutation::kSkipReplicaSum)
    c.replicas->all_reduce(std::span<T>(shard))->wait();
  return shard;
}

template <class T>
void MeshOptimizer<T>::reduce_each_microbatch(std::vector<bool> classes) {
  each_microbatch_ = std::move(classes);
}

template <class T>
void MeshOptimizer<T>::begin_accumulation() {
  for (std::size_t ci = 0; ci < classes_.size(); ++ci)
    if (!each_microbatch_.empty() && each_microbatch_[ci])
      classes_[ci].grad.assign(static_cast<std::size_t>(classes_[ci].shard), T{0});
}

template <class T>
typename MeshOptimizer<T>::UnitReduce MeshOptimizer<T>::issue_unit_reduce(std::size_t cls,
                                                                          ref::ParamMap<T>& grads) {
  Class& c = classes_.at(cls);
  UnitReduce r;
  r.cls = cls;
  r.flat = pack(c, grads, 0, c.numel);
  for (const std::size_t k : c.specs) grads[specs_[k].name].fill(T{0});
  r.flat.resize(static_cast<std::size_t>(c.shard * c.group->size()), T{0});
  r.tmp = comm::TrackedBytes(*mem_, MemCategory::temporary, r.flat.size() * sizeof(T));
  if (c.group->size() > 1 && !skipped(c))
    r.work = c.group->reduce_scatter(comm::view(std::span<T>(r.flat)), sum());
  return r;
}

template <class T>
void MeshOptimizer<T>::complete_unit_reduce(UnitReduce& r) {
  if (r.work) r.work->wait();
  Class& c = classes_.at(r.cls);
  const std::vector<T> shard = own_shard(c, r.flat);
  for (std::size_t i = 0; i < shard.size(); ++i) c.grad[i] += shard[i];
  r = UnitReduce{};
}

template <class T>
void MeshOptimizer<T>::issue_reduce(const ref::ParamMap<T>& grads, const Pick& pick) {
  if (env_.zero >= 2) return;  // reduce_scatter once per step, after the pipeline flush
  if (issued_spec_.empty()) issued_spec_.assign(specs_.size(), false);
  for (std::size_t ci = 0; ci < classes_.size(); ++ci) {
    Class& c = classes_[ci];
    if (c.numel == 0 || c.group->size() == 1) continue;
    const auto fresh = [&](const LocalParam& p) {
      return pick(p) && !issued_spec_[static_cast<std::size_t>(&p - specs_.data())];
    };
    Issued is;
    is.cls = ci;
    is.ranges = ranges(c, fresh);
    if (is.ranges.empty()) continue;
    for (const auto& [a, b] : is.ranges) {
      const std::vector<T> part = pack(c, grads, a, b);
      is.flat.insert(is.flat.end(), part.begin(), part.end());
    }
    for (const std::size_t k : c.specs)
      if (fresh(specs_[k])) issued_spec_[k] = true;
    is.tmp = comm::TrackedBytes(*mem_, MemCategory::temporary, is.flat.size() * sizeof(T));
    is.work = c.group->all_reduce(comm::view(std::span<T>(is.flat)), sum());
    issued_.push_back(std::move(is));
  }
}

template <class T>
int64_t MeshOptimizer<T>::accumulated_grad_elems() const {
  int64_t n = 0;
  for (std::size_t ci = 0; ci < classes_.size(); ++ci)
    n +=
        !each_microbatch_.empty() && each_microbatch_[ci] ? classes_[ci].shard : classes_[ci].numel;
  return n;
}

template <class T>
int64_t MeshOptimizer<T>::reduced_grad_elems() const {
  int64_t n = 0;
  for (const Class& c : classes_) n += env_.zero >= 2 ? c.shard : c.numel;
  return n;
}

template <class T>
double MeshOptimizer<T>::sum_squares(const ref::ParamMap<T>& grads) const {
  double sq = 0.0;
  for (const Class& c : classes_) {
    segments(
        c, c.out_begin, c.out_end, [&](const LocalParam& p, int64_t local, int64_t n, int64_t f) {
          if (!counts(p, true)) return;
          const T* g =
              env_.zero >= 2 ? c.grad.data() + (f - c.own_begin) : grads[p.name].data() + local;
          for (int64_t i = 0; i < n; ++i)
            sq += static_cast<double>(g[i]) * static_cast<double>(g[i]);
        });
  }
  return sq;
}

template <class T>
double MeshOptimizer<T>::local_sum_squares(const ref::ParamMap<T>& grads) const {
  double sq = 0.0;
  for (const LocalParam& p : specs_) {
    if (!counts(p, true)) continue;
    for (const T g : grads[p.name].vec()) sq += static_cast<double>(g) * static_cast<double>(g);
  }
  return sq;
}

template <class T>
void MeshOptimizer<T>::adam(Class& c, std::span<T> p, std::span<const T> g, double lr) const {
  adamw_range(env_.optimizer, t_, lr, p, g, std::span<T>(c.m), std::span<T>(c.v),
              std::span<const std::uint8_t>(c.decay));
}

template <class T>
void MeshOptimizer<T>::update(const ref::ParamMap<T>& grads, double clip_factor, double lr,
                              ref::ParamMap<T>& params) {
  ++t_;
  int64_t owned = 0;
  std::vector<std::pair<std::string, std::vector<T>>> stale;  // kReplicaNotUpdated (tests)
  if (env_.planted == testing::Mutation::kReplicaNotUpdated && env_.tp_rank != 0)
    for (const LocalParam& p : specs_)
      if (p.tp_replicated) stale.emplace_back(p.name, params[p.name].vec());
  for (Class& c : classes_) {
    const int64_t len = c.own_end - c.own_begin;
    std::vector<T> g;
    if (env_.zero >= 2) {
      g.assign(c.grad.begin(), c.grad.begin() + len);
    } else {
      int64_t from = c.own_begin;
      if (env_.zero == 1 && env_.planted == testing::Mutation::kWrongShardOffset)
        from = c.group->rank() * (c.numel / c.group->size());
      g = pack(c, grads, from, from + len);
    }
    if (clip_factor != 1.0)
      for (T& x : g) x = static_cast<T>(static_cast<double>(x) * clip_factor);
    if (env_.bf16) {
      adam(c, std::span<T>(c.master).first(static_cast<std::size_t>(len)), g, lr);
      std::vector<T> working(c.master.begin(), c.master.begin() + len);
      if constexpr (std::is_same_v<T, float>)
        if (env_.planted != testing::Mutation::kBf16WorkingLeftInF32)
          for (T& x : working) x = ref::round_to_bf16(x);
      unpack(c, std::span<const T>(working), c.own_begin, params);
    } else {
      std::vector<T> p = pack(c, params, c.own_begin, c.own_end);
      adam(c, std::span<T>(p), g, lr);
      unpack(c, std::span<const T>(p), c.own_begin, params);
    }
    owned += len;
    c.grad = std::vector<T>{};
    share(c, params);
  }
  for (auto& [name, v] : stale) params[name].vec() = std::move(v);
  env_.world->compute(costs::adamw(static_cast<double>(owned), env_.recipe));
}

// ZeRO >= 1: every rank updated its shard of the replicated working parameters; all_gather them
// (bf16: in bf16, the recipe's traffic).
template <class T>
void MeshOptimizer<T>::share(Class& c, ref::ParamMap<T>& params) {
  comm::Communicator& g = *c.group;
  if (env_.zero == 0 || env_.zero == 3 || g.size() == 1 || c.numel == 0) return;
  const auto padded = static_cast<std::size_t>(c.shard * g.size());
  const std::vector<T> mine = pack(c, params, c.own_begin, c.own_end);
  const auto at = static_cast<std::size_t>(c.shard * g.rank());
  std::vector<T> full(padded, T{0});
  if (env_.bf16) {
    const comm::TrackedBytes tmp(*mem_, MemCategory::temporary, padded * 2);
    std::vector<comm::bf16> staging(padded);
    for (std::size_t i = 0; i < mine.size(); ++i)
      staging[at + i] = comm::bf16(static_cast<float>(mine[i]));
    g.all_gather(comm::view(std::span<comm::bf16>(staging)))->wait();
    for (std::size_t i = 0; i < padded; ++i)
      full[i] = static_cast<T>(static_cast<float>(staging[i]));
  } else {
    const comm::TrackedBytes tmp(*mem_, MemCategory::temporary, padded * sizeof(T));
    std::copy(mine.begin(), mine.end(), full.begin() + static_cast<std::ptrdiff_t>(at));
    g.all_gather(comm::view(std::span<T>(full)))->wait();
  }
  unpack(c, std::span<const T>(full).first(static_cast<std::size_t>(c.numel)), 0, params);
}

template <class T>
std::vector<std::pair<int64_t, int64_t>> MeshOptimizer<T>::ranges(const Class& c,
                                                                  const Pick& pick) const {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (std::size_t k = 0; k < c.specs.size(); ++k) {
    const LocalParam& p = specs_[c.specs[k]];
    if (!pick(p)) continue;
    const int64_t a = c.base[k], b = a + ref::numel_of(p.local_shape);
    if (!out.empty() && out.back().second == a) {
      out.back().second = b;
    } else if (a < b) {
      out.emplace_back(a, b);
    }
  }
  return out;
}

// ZeRO-3: the unit's padded flat buffer of each class holding it, every rank's shard in place.
template <class T>
typename MeshOptimizer<T>::UnitGather MeshOptimizer<T>::issue_gather(
    int unit, const ref::ParamMap<T>& params) {
  UnitGather out;
  if (env_.zero != 3) return out;
  std::size_t staged = 0;
  for (std::size_t ci = 0; ci < classes_.size(); ++ci) {
    const Class& c = classes_[ci];
    comm::Communicator& g = *c.group;
    if (c.unit != unit || g.size() == 1 || c.numel == 0) continue;
    const auto padded = static_cast<std::size_t>(c.shard * g.size());
    const auto at = static_cast<std::size_t>(c.shard * g.rank());
    const std::vector<T> mine = pack(c, params, c.own_begin, c.own_end);
    typename UnitGather::Part part;
    part.cls = ci;
    if (env_.bf16) {
      part.staging.assign(padded, comm::bf16{});
      for (std::size_t i = 0; i < mine.size(); ++i)
        part.staging[at + i] = comm::bf16(static_cast<float>(mine[i]));
      part.work = g.all_gather(comm::view(std::span<comm::bf16>(part.staging)));
      staged += padded * 2;
    } else {
      part.full.assign(padded, T{0});
      std::copy(mine.begin(), mine.end(), part.full.begin() + static_cast<std::ptrdiff_t>(at));
      part.work = g.all_gather(comm::view(std::span<T>(part.full)));
    }
    out.parts.push_back(std::move(part));
  }
  if (staged > 0) out.tmp = comm::TrackedBytes(*mem_, MemCategory::temporary, staged);
  return out;
}

template <class T>
void MeshOptimizer<T>::complete_gather(UnitGather& g, ref::ParamMap<T>& params) const {
  for (typename UnitGather::Part& part : g.parts) {
    part.work->wait();
    const Class& c = classes_[part.cls];
    if (env_.bf16) {
      part.full.resize(part.staging.size());
      for (std::size_t i = 0; i < part.staging.size(); ++i)
        part.full[i] = static_cast<T>(static_cast<float>(part.staging[i]));
    }
    unpack(c, std::span<const T>(part.full).first(static_cast<std::size_t>(c.numel)), 0, params);
  }
  g = UnitGather{};
}

template <class T>
void MeshOptimizer<T>::release_class(const Class& c, ref::ParamMap<T>& params) const {
  if (env_.zero != 3) return;
  const T poison = std::numeric_limits<T>::quiet_NaN();
  for (const auto& [x, y] : {std::pair{int64_t{0}, c.own_begin}, std::pair{c.own_end, c.numel}}) {
    if (x >= y) continue;
    segments(c, x, y, [&](const LocalParam& p, int64_t local, int64_t n, int64_t) {
      std::fill_n(params[p.name].data() + local, n, poison);
    });
  }
}

template <class T>
void MeshOptimizer<T>::release_unit(int unit, ref::ParamMap<T>& params) const {
  for (const Class& c : classes_)
    if (c.unit == unit) release_class(c, params);
}

template <class T>
int64_t MeshOptimizer<T>::unit_elems(int unit) const {
  int64_t n = 0;
  for (const Class& c : classes_)
    if (c.unit == unit && c.group->size() > 1) n += c.shard * c.group->size();
  return n;
}

template <class T>
void MeshOptimizer<T>::for_each_counted(
    const ref::ParamMap<T>& params,
    const std::function<void(const LocalParam&, int64_t, T)>& fn) const {
  for (const Class& c : classes_) {
    segments(c, c.out_begin, c.out_end,
             [&](const LocalParam& p, int64_t local, int64_t n, int64_t f) {
               if (!counts(p)) return;
               for (int64_t i = 0; i < n; ++i) {
                 const T v = env_.bf16 ? c.master[static_cast<std::size_t>(f - c.own_begin + i)]
                                       : params[p.name][local + i];
                 fn(p, local + i, v);
               }
             });
  }
}

namespace {

// Runs of p (contiguous in local and full tensor) intersected with local [lo, lo + n).
template <class F>
void runs_within(const LocalParam& p, int64_t lo, int64_t n, F&& fn) {
  for (const LocalParam::Run& r : p.runs()) {
    const int64_t a = std::max(lo, r.local), b = std::min(lo + n, r.local + r.count);
    if (a < b) fn(a, r.global + (a - r.local), b - a);
  }
}

template <class U, class T>
StatePiece piece_of(const std::string& name, const LocalParam& p, int64_t global, int64_t n,
                    const T* src) {
  StatePiece piece{name,
                   p.global_shape,
                   comm::dtype_v<U>,
                   static_cast<std::size_t>(global),
                   static_cast<std::size_t>(n),
                   {}};
  piece.bytes.resize(piece.count * sizeof(U));
  for (int64_t i = 0; i < n; ++i) {
    U v;
    if constexpr (std::is_same_v<U, comm::bf16>) {
      v = comm::bf16(static_cast<float>(src[i]));
    } else {
      v = static_cast<U>(src[i]);
    }
    std::memcpy(piece.bytes.data() + static_cast<std::size_t>(i) * sizeof(U), &v, sizeof(U));
  }
  return piece;
}

}  // namespace

template <class T>
void MeshOptimizer<T>::export_pieces(const ref::ParamMap<T>& params,
                                     std::vector<StatePiece>& out) const {
  for (const Class& c : classes_) {
    segments(c, c.out_begin, c.out_end,
             [&](const LocalParam& p, int64_t local, int64_t n, int64_t f) {
               if (!counts(p)) return;
               const int64_t shift = f - c.own_begin - local;  // owned index = local + shift
               runs_within(p, local, n, [&](int64_t a, int64_t global, int64_t k) {
                 const T* param = params[p.name].data() + a;
                 const auto o = static_cast<std::size_t>(a + shift);
                 if (env_.bf16) {
                   out.push_back(piece_of<comm::bf16>("param/" + p.name, p, global, k, param));
                   out.push_back(piece_of<T>("master/" + p.name, p, global, k, &c.master[o]));
                 } else {
                   out.push_back(piece_of<T>("param/" + p.name, p, global, k, param));
                 }
                 out.push_back(piece_of<T>("exp_avg/" + p.name, p, global, k, &c.m[o]));
                 out.push_back(piece_of<T>("exp_avg_sq/" + p.name, p, global, k, &c.v[o]));
               });
             });
  }
}

template <class T>
void MeshOptimizer<T>::export_held(const ref::ParamMap<T>& params,
                                   std::vector<StatePiece>& out) const {
  for (const Class& c : classes_) {
    const bool sharded = env_.zero == 3;  // the rest was released (release_class)
    segments(
        c, sharded ? c.own_begin : 0, sharded ? c.own_end : c.numel,
        [&](const LocalParam& p, int64_t local, int64_t n, int64_t) {
          runs_within(p, local, n, [&](int64_t a, int64_t global, int64_t k) {
            out.push_back(piece_of<T>("param/" + p.name, p, global, k, params[p.name].data() + a));
          });
        });
  }
}

template <class T>
void MeshOptimizer<T>::import_pieces(const StateReader& read, ref::ParamMap<T>& params) {
  const auto fetch = [&](const std::string& name, int64_t global, int64_t n, T* dst) {
    read(name, comm::dtype_v<T>, static_cast<std::size_t>(global), static_cast<std::size_t>(n),
         std::as_writable_bytes(std::span<T>(dst, static_cast<std::size_t>(n))));
  };
  const std::string source = env_.bf16 ? "master/" : "param/";
  for (const LocalParam& p : specs_) {
    runs_within(p, 0, ref::numel_of(p.local_shape), [&](int64_t a, int64_t global, int64_t k) {
      fetch(source + p.name, global, k, params[p.name].data() + a);
    });
  }
  for (Class& c : classes_) {
    std::fill(c.m.begin(), c.m.end(), T{0});
    std::fill(c.v.begin(), c.v.end(), T{0});
    if (env_.bf16) {
      c.master = pack(c, params, c.own_begin, c.own_end);
      c.master.resize(static_cast<std::size_t>(c.shard), T{0});
    }
    segments(
        c, c.own_begin, c.own_end, [&](const LocalParam& p, int64_t local, int64_t n, int64_t f) {
          const int64_t shift = f - c.own_begin - local;
          runs_within(p, local, n, [&](int64_t a, int64_t global, int64_t k) {
            fetch("exp_avg/" + p.name, global, k, &c.m[static_cast<std::size_t>(a + shift)]);
            fetch("exp_avg_sq/" + p.name, global, k, &c.v[static_cast<std::size_t>(a + shift)]);
          });
        });
  }
  if constexpr (std::is_same_v<T, float>) {
    if (env_.bf16 && env_.planted != testing::Mutation::kBf16WorkingLeftInF32)
      ref::round_to_bf16(params);
  }
  for (const Class& c : classes_) release_class(c, params);
  int64_t n = 0;
  read("optimizer/step", comm::DType::i64, 0, 1, std::as_writable_bytes(std::span<int64_t>(&n, 1)));
  t_ = static_cast<int>(n);
}

template class MeshOptimizer<double>;
template class MeshOptimizer<float>;

}  // namespace shardcheck::parallel
