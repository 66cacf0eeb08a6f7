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
#include "parallel/flops.hpp"
#include "parallel/testing.hpp"
#include "reference/bf16.hpp"

namespace shardcheck::parallel {

using comm::MemCategory;

template <class T>
MeshOptimizer<T>::MeshOptimizer(Env env, const std::vector<LocalParam>& specs,
                                ref::ParamMap<T>& params)
    : env_(std::move(env)),
      specs_(specs),
      comm_(&specs_, {.zero = env_.zero, .sum = sum(), .planted = env_.planted}),
      mem_(&env_.world->memory()) {
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
  Data d{.o = this, .grads = &grads, .grads_out = &grads};
  comm_.reduce(classes_, d);
}

template <class T>
void MeshOptimizer<T>::reduce_each_microbatch(std::vector<bool> classes) {
  comm_.reduce_each_microbatch(std::move(classes));
}

template <class T>
void MeshOptimizer<T>::begin_accumulation() {
  for (std::size_t ci = 0; ci < classes_.size(); ++ci)
    if (comm_.each_microbatch(ci))
      classes_[ci].grad.assign(static_cast<std::size_t>(classes_[ci].shard), T{0});
}

template <class T>
typename MeshOptimizer<T>::UnitReduce MeshOptimizer<T>::issue_unit_reduce(std::size_t cls,
                                                                          ref::ParamMap<T>& grads) {
  Data d{.o = this, .grads = &grads, .grads_out = &grads};
  return comm_.issue_unit(classes_, d, cls);
}

template <class T>
void MeshOptimizer<T>::complete_unit_reduce(UnitReduce& r) {
  Data d{.o = this};
  comm_.complete_unit(classes_, d, r);
}

template <class T>
void MeshOptimizer<T>::issue_reduce(const ref::ParamMap<T>& grads,
                                    const std::vector<std::size_t>& bucket) {
  Data d{.o = this, .grads = &grads};
  comm_.issue(classes_, d, bucket);
}

template <class T>
int64_t MeshOptimizer<T>::accumulated_grad_elems() const {
  int64_t n = 0;
  for (std::size_t ci = 0; ci < classes_.size(); ++ci)
    n += comm_.each_microbatch(ci) ? classes_[ci].shard : classes_[ci].numel;
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
  std::vector<std::pair<std::string, std::vector<T>>> stale;  // kReplicaNotUpdated (tests)
  if (env_.planted == testing::Mutation::kReplicaNotUpdated && env_.tp_rank != 0)
    for (const LocalParam& p : specs_)
      if (p.tp_replicated) stale.emplace_back(p.name, params[p.name].vec());
  const auto adam_class = [&](Class& c) {
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
    c.grad = std::vector<T>{};
  };
  Data d{.o = this, .params = &params, .params_out = &params};
  comm_.update(classes_, d, adam_class, *env_.world, env_.recipe);
  for (auto& [name, v] : stale) params[name].vec() = std::move(v);
}

template <class T>
typename MeshOptimizer<T>::Data::Buf MeshOptimizer<T>::Data::pack(const Class& c,
                                                                  const FlatRanges& r,
                                                                  int64_t padded_to) const {
  Buf b;
  for (const auto& [x, y] : r) {
    const std::vector<T> part = o->pack(c, *grads, x, y);
    b.flat.insert(b.flat.end(), part.begin(), part.end());
  }
  if (static_cast<int64_t>(b.flat.size()) < padded_to)
    b.flat.resize(static_cast<std::size_t>(padded_to), T{0});
  b.tmp = comm::TrackedBytes(*o->mem_, MemCategory::temporary, b.flat.size() * sizeof(T));
  return b;
}

template <class T>
typename MeshOptimizer<T>::Data::Buf MeshOptimizer<T>::Data::take(const Class& c) const {
  Buf b = pack(c, FlatRanges{{0, c.numel}}, c.padded());
  for (const std::size_t k : c.specs) (*grads_out)[o->specs_[k].name].fill(T{0});
  return b;
}

template <class T>
void MeshOptimizer<T>::Data::unpack(const Class& c, const FlatRanges& r, const Buf& b) const {
  std::size_t at = 0;
  for (const auto& [x, y] : r) {
    const auto n = static_cast<std::size_t>(y - x);
    o->unpack(c, std::span<const T>(b.flat).subspan(at, n), x, *grads_out);
    at += n;
  }
}

template <class T>
typename MeshOptimizer<T>::Data::Buf MeshOptimizer<T>::Data::slice(const Buf& b, int64_t at,
                                                                   int64_t n) {
  Buf s;
  s.flat.assign(b.flat.begin() + at, b.flat.begin() + at + n);
  return s;
}

template <class T>
void MeshOptimizer<T>::Data::keep(Class& c, Buf& shard, bool accumulate) {
  if (!accumulate) {
    c.grad = std::move(shard.flat);
    return;
  }
  for (std::size_t i = 0; i < shard.flat.size(); ++i) c.grad[i] += shard.flat[i];
}

// The padded buffer with this rank's updated shard at its place (bf16: staged in bf16, the
// recipe's traffic).
template <class T>
typename MeshOptimizer<T>::Data::Buf MeshOptimizer<T>::Data::owned_padded(const Class& c,
                                                                          bool temporary) const {
  const auto padded = static_cast<std::size_t>(c.padded());
  const auto at = static_cast<std::size_t>(c.shard * c.group->rank());
  const std::vector<T> mine = o->pack(c, *params, c.own_begin, c.own_end);
  Buf b;
  if (o->env_.bf16) {
    b.staging.assign(padded, comm::bf16{});
    for (std::size_t i = 0; i < mine.size(); ++i)
      b.staging[at + i] = comm::bf16(static_cast<float>(mine[i]));
    if (temporary) b.tmp = comm::TrackedBytes(*o->mem_, MemCategory::temporary, padded * 2);
  } else {
    b.flat.assign(padded, T{0});
    std::copy(mine.begin(), mine.end(), b.flat.begin() + static_cast<std::ptrdiff_t>(at));
    if (temporary) b.tmp = comm::TrackedBytes(*o->mem_, MemCategory::temporary, padded * sizeof(T));
  }
  return b;
}

template <class T>
void MeshOptimizer<T>::Data::unpack_full(const Class& c, Buf& b) const {
  if (!b.staging.empty()) {
    b.flat.resize(b.staging.size());
    for (std::size_t i = 0; i < b.staging.size(); ++i)
      b.flat[i] = static_cast<T>(static_cast<float>(b.staging[i]));
  }
  o->unpack(c, std::span<const T>(b.flat).first(static_cast<std::size_t>(c.numel)), 0, *params_out);
}

template <class T>
comm::Buffer MeshOptimizer<T>::Data::view(Buf& b) {
  if (!b.staging.empty()) return comm::view(std::span<comm::bf16>(b.staging));
  return comm::view(std::span<T>(b.flat));
}

// ZeRO-3: the unit's padded flat buffer of each class holding it, every rank's shard in place.
template <class T>
typename MeshOptimizer<T>::UnitGather MeshOptimizer<T>::issue_gather(
    int unit, const ref::ParamMap<T>& params) {
  Data d{.o = this, .params = &params};
  return comm_.issue_gather(classes_, d, unit);
}

template <class T>
void MeshOptimizer<T>::complete_gather(UnitGather& g, ref::ParamMap<T>& params) const {
  Data d{.o = this, .params_out = &params};
  comm_.complete_gather(classes_, d, g);
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
  return ClassComm<Data>::unit_elems(classes_, unit);
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
