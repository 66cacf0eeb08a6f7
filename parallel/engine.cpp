// The data-parallel step for every strategy (engine.hpp): global loss denominators first, then
// each microbatch unit by unit (parameters acquired per unit; each unit's gradient accumulated or
// reduced as soon as it is complete), the loss numerators, the health check, the global norm,
// clipping and AdamW on the range this rank owns, and the updated parameters shared.
#include "parallel/engine.hpp"

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "parallel/adamw.hpp"
#include "parallel/flops.hpp"
#include "parallel/testing.hpp"
#include "reference/bf16.hpp"
#include "reference/model.hpp"
#include "reference/optim.hpp"

namespace shardcheck::parallel {

using comm::MemCategory;
using testing::Mutation;

namespace {
template <class T>
double ref_sum_squares(std::span<const T> v) {
  double sq = 0.0;
  for (const T g : v) sq += static_cast<double>(g) * static_cast<double>(g);
  return sq;
}
}  // namespace

template <class T>
EngineImpl<T>::EngineImpl(comm::Communicator& dp, const ref::ModelConfig& model,
                          const ref::TrainConfig& train, uint64_t seed, DataParallelOptions options)
    : dp_(dp),
      shard_(&dp),
      mem_(dp.memory()),
      model_(model),
      train_(train),
      seed_(seed),
      options_(std::move(options)),
      recipe_(recipe_of(train.precision)),
      bf16_(train.precision == ref::Precision::kBf16),
      rank_(dp.rank()),
      size_(dp.size()) {
  layout = FlatLayout(ref::param_shapes(model), size_);
  strategy = options_.strategy;
  const int units = unit_count(model_);
  group_of_.assign(static_cast<std::size_t>(units), 0);
  std::vector<int> all(static_cast<std::size_t>(units));
  for (int u = 0; u < units; ++u) all[static_cast<std::size_t>(u)] = u;
  FsdpOptions f = options_.fsdp;
  if (strategy == Strategy::zero3)
    f = {.sharding = ShardingStrategy::full_shard,
         .wrap = options_.zero3_gather == Zero3Gather::per_layer ? WrapPolicy::block
                                                                 : WrapPolicy::whole_model,
         .reshard_after_forward = true,
         .prefetch = 0};
  switch (strategy) {
    case Strategy::ddp:
    case Strategy::zero1:
      mode_ = GradMode::full_buckets;
      add_group(all, size_, rank_, false, strategy == Strategy::ddp);
      buckets_ = layout.buckets(options_.bucket_elems);
      for (const Range& b : buckets_) {
        bucket_units_.emplace_back();
        for (const Segment& s : layout.segments(b))
          bucket_units_.back().push_back(unit_of(model_, s.param->name));
      }
      break;
    case Strategy::zero2:
      mode_ = GradMode::per_microbatch;
      sharded_grads_ = true;
      add_group(all, size_, rank_, false, false);
      break;
    case Strategy::zero3:
    case Strategy::fsdp: {
      mode_ = GradMode::per_microbatch;
      const auto wraps = wrap_units(model_, f.wrap, f.blocks_per_unit);
      if (f.sharding == ShardingStrategy::no_shard) {
        no_shard_ = true;
        for (const auto& w : wraps) add_group(w, 1, 0, false, true);
        break;
      }
      sharded_grads_ = true;
      if (f.sharding == ShardingStrategy::hybrid_shard) {
        const int s = f.shard_group_size;
        if (s < 1 || size_ % s != 0)
          throw std::invalid_argument("fsdp.shard_group_size must divide the DP size");
        shard_own_ = dp_.split(rank_ / s, rank_, {.name = "dp_shard"});
        replicate_ = dp_.split(rank_ % s, rank_, {.name = "dp_replicate"});
        shard_ = shard_own_.get();
      }
      for (const auto& w : wraps) add_group(w, shard_->size(), shard_->rank(), true, false);
      plan_ = std::make_unique<ResidencyPlan>(residency_plan(model_, f));
      break;
    }
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi)
    for (const FlatParam& p : groups_[gi].layout.params())
      param_index_[p.name] = {static_cast<int>(gi), &p};
  work_.resize(static_cast<std::size_t>(units));
  for (int u = 0; u < units; ++u)
    for (const auto& [name, shape] : unit_shapes(model_, u))
      work_[static_cast<std::size_t>(u)].add(name, shape);
  mb_grads_.resize(static_cast<std::size_t>(units));
  mb_grads_live_.assign(static_cast<std::size_t>(units), false);
  for (Group<T>& g : groups_) {
    track(MemCategory::params, g.params.size() * recipe_.param);
    track(MemCategory::optimizer, g.owned.size() * recipe_.optimizer());
    if (!g.sharded) unpack_units(g, std::span<const T>(g.params));
  }
}

template <class T>
EngineImpl<T>::~EngineImpl() {
  for (Group<T>& g : groups_) {
    untrack(MemCategory::params, g.params.size() * recipe_.param);
    untrack(MemCategory::optimizer, g.owned.size() * recipe_.optimizer());
  }
}

template <class T>
void EngineImpl<T>::add_group(std::vector<int> units, int shards, int shard_rank, bool sharded,
                              bool own_all) {
  std::vector<std::pair<std::string, ref::Shape>> shapes;
  for (int u : units) {
    group_of_[static_cast<std::size_t>(u)] = static_cast<int>(groups_.size());
    for (auto& e : unit_shapes(model_, u)) shapes.push_back(std::move(e));
  }
  Group<T> g(FlatLayout(shapes, shards), std::move(units));
  g.sharded = sharded;
  g.owned = own_all ? Range{0, g.layout.numel()} : g.layout.shard(shard_rank);
  init_group(g);
  groups_.push_back(std::move(g));
}

template <class T>
void EngineImpl<T>::init_group(Group<T>& g) {
  std::vector<T> owned(g.owned.size(), T{0});
  for (const Segment& s : g.layout.segments(g.owned))
    ref::init_param_slice<T>(model_, seed_, s.param->name, static_cast<int64_t>(s.param_begin),
                             std::span<T>(owned).subspan(s.flat_begin - g.owned.begin, s.count));
  if (g.sharded) {
    g.params = owned;
  } else {
    g.params.assign(g.layout.padded_numel(), T{0});
    for (const FlatParam& p : g.layout.params())
      ref::init_param_slice<T>(model_, seed_, p.name, 0,
                               std::span<T>(g.params).subspan(p.offset, p.numel));
  }
  if (bf16_) {
    g.master = owned;
    for (T& x : g.params) x = static_cast<T>(ref::round_to_bf16(static_cast<float>(x)));
  }
  g.m.assign(g.owned.size(), T{0});
  g.v.assign(g.owned.size(), T{0});
  g.decay.assign(g.owned.size(), 0);
  for (const Segment& s : g.layout.segments(g.owned))
    std::fill_n(g.decay.begin() + static_cast<std::ptrdiff_t>(s.flat_begin - g.owned.begin),
                s.count, s.param->decay ? 1 : 0);
}

template <class T>
void EngineImpl<T>::unpack_units(const Group<T>& g, std::span<const T> full) {
  for (const FlatParam& p : g.layout.params()) {
    ref::Tensor<T>& t = work_[static_cast<std::size_t>(unit_of(model_, p.name))][p.name];
    std::copy_n(full.begin() + static_cast<std::ptrdiff_t>(p.offset), p.numel, t.vec().begin());
  }
}

template <class T>
template <class U>
comm::WorkPtr EngineImpl<T>::issue(const char* op, const char* what, comm::Communicator& c,
                                   std::span<U> s) {
  calls.push_back({op, what, s.size(), comm::dtype_v<U>});
  const std::string_view o(op);
  if (o == "all_reduce") return c.all_reduce(comm::view(s));
  if (o == "reduce_scatter") return c.reduce_scatter(comm::view(s));
  return c.all_gather(comm::view(s));
}

// ---- one step ------------------------------------------------------------------------------

template <class T>
ref::StepRecord EngineImpl<T>::step(const ref::Batch& local) {
  REF_CHECK(local.size() * static_cast<std::size_t>(size_) ==
                static_cast<std::size_t>(train_.global_batch),
            "local batch must be train.global_batch / DP size sequences");
  calls.clear();
  health = {};
  const int n = ++steps_;
  dp_.begin_step(n);
  const std::string prefix = "step " + std::to_string(n);
  mem_.set_phase(prefix + " begin");
  const auto d = static_cast<double>(size_);

  // 1. Global loss denominators, before any backward (reference/README.md checklist item 1).
  const LossCounts local_n = local_counts(local);
  LossCounts counts = local_n;
  issue("all_reduce", "mask tokens, sequences, non-padding tokens", dp_, std::span<int64_t>(counts))
      ->wait();
  const bool rank_means = planted(Mutation::kMeanOfRankMeans);
  ref::StepContext ctx = step_context(seed_, n, rank_means ? local_n : counts, train_);
  if (rank_means) {  // the planted bug: each rank's mean, then the mean of rank means
    ctx.token_weight /= d;
    ctx.sequence_weight /= d;
  }

  // 2. Microbatches, unit by unit; gradients accumulated (DDP/ZeRO-1) or reduced per microbatch.
  for (Group<T>& g : groups_) {
    g.acc.assign(
        mode_ == GradMode::full_buckets || no_shard_ ? g.layout.padded_numel() : g.owned.size(),
        T{0});
    track(MemCategory::grads, g.acc.size() * recipe_.grad);
  }
  nonfinite_ = false;
  next_bucket_ = 0;
  bucket_work_.clear();
  unit_done_.assign(work_.size(), false);
  const bool local_norm = planted(Mutation::kLocalNormClip);
  const bool overlap = options_.overlap && !(local_norm && mode_ == GradMode::full_buckets);
  UnitHooks<T> hooks;
  hooks.acquire = [this](int u) -> const ref::ParamMap<T>& { return acquire(u); };
  hooks.release = [this](int u) { release(u); };
  hooks.grads = [this](int u) -> ref::ParamMap<T>& { return grads(u); };
  hooks.grads_ready = [this, overlap](int u) {
    grads_ready(u);
    if (mode_ == GradMode::full_buckets && last_microbatch_ && overlap) issue_ready_buckets(false);
  };
  hooks.memory = &mem_;
  hooks.compute = [this](const comm::ComputeCost& c) { dp_.compute(c); };
  hooks.activation_bytes = recipe_.activation;
  const std::span<const ref::Sequence> all(local);
  const auto mb = static_cast<std::size_t>(train_.micro_batch);
  ref::LossParts parts;
  for (std::size_t k = 0; k < local.size(); k += mb) {
    microbatch_ = static_cast<int>(k / mb);
    last_microbatch_ = k + mb >= local.size();
    acquire_cursor_ = release_cursor_ = 0;
    hooks.phase_prefix = prefix + " microbatch " + std::to_string(microbatch_);
    parts.merge(layerwise_forward_backward<T>(model_, hooks, all.subspan(k, mb), ctx));
    mem_.set_phase(prefix + " reduce");
    complete_reductions();
  }
  double sq = 0.0;
  if (mode_ == GradMode::full_buckets) {
    const std::span<const T> acc(groups_.front().acc);
    if (local_norm) sq = ref_sum_squares(acc.first(layout.numel()));
    issue_ready_buckets(true);
    for (const comm::WorkPtr& w : bucket_work_) w->wait();
    bucket_work_.clear();
    // Replicated gradients: every rank holds the full reduced set, each element counted once.
    if (!local_norm) sq = ref_sum_squares(acc.first(layout.numel()));
  } else {
    for (const Group<T>& g : groups_)
      sq += ref_sum_squares(
          std::span<const T>(g.acc).first(no_shard_ ? g.layout.numel() : g.acc.size()));
    // Sharded gradients: the global square norm is the sum of the owners' shard squares (one
    // shard group holds every element once; replicas of a hybrid shard are equal).
    if (sharded_grads_ && !local_norm)
      issue("all_reduce", "squared gradient norm", *shard_, std::span<double>(&sq, 1))->wait();
  }
  mem_.set_phase(prefix + " optimizer");
  model_state = mem_.current();

  // 3. Global loss numerators (kept apart from the denominators).
  std::array<double, 2> sums{parts.loss_sum, parts.aux_sum};
  if (rank_means)
    sums = {local_n[0] > 0 ? parts.loss_sum / static_cast<double>(local_n[0]) / d : 0.0,
            parts.aux_sum / static_cast<double>(local_n[1]) / d};
  issue("all_reduce", "loss sum, aux sum", dp_, std::span<double>(sums))->wait();
  ref::StepRecord rec = step_record(n, counts, sums[0], sums[1], sq, train_);
  if (rank_means) {
    rec.aux = sums[1];
    rec.loss = sums[0] + sums[1];
  }

  // 4. Health: every rank learns which ranks had non-finite local gradients, in the same step.
  if (options_.health.check) {
    calls.push_back({"all_gather", "non-finite gradient flags", static_cast<std::size_t>(size_),
                     comm::DType::i32});
    health = agree_health(dp_, nonfinite_);
  }
  if (health.skipped)
    ++skipped;
  else
    optimizer_step(rec.clip_factor, rec.lr);
  for (Group<T>& g : groups_) {
    untrack(MemCategory::grads, g.acc.size() * recipe_.grad);
    g.acc = std::vector<T>{};
  }
  mem_.set_phase(prefix + " end");
  enforce_health(health, options_.health, n);
  return rec;
}

// ---- microbatch hooks ------------------------------------------------------------------------

template <class T>
const ref::ParamMap<T>& EngineImpl<T>::acquire(int unit) {
  Group<T>& g = group_of(unit);
  if (g.sharded) {
    const std::size_t i = acquire_cursor_++;
    const int w = group_of_[static_cast<std::size_t>(unit)];
    REF_CHECK(i < plan_->uses().size() && plan_->uses()[i] == w, "acquire out of plan order");
    if (!g.held) {
      if (!g.pending) issue_gather(w);
      finish_gather(w);
    }
    for (int p : plan_->prefetch_after(i)) {
      const Group<T>& q = groups_[static_cast<std::size_t>(p)];
      if (!q.held && !q.pending) issue_gather(p);
    }
  }
  return work_[static_cast<std::size_t>(unit)];
}

template <class T>
void EngineImpl<T>::release(int unit) {
  if (!group_of(unit).sharded) return;
  const std::size_t i = release_cursor_++;
  if (plan_->free_after(i)) free_gather(group_of_[static_cast<std::size_t>(unit)]);
}

template <class T>
void EngineImpl<T>::issue_gather(int w) {
  Group<T>& g = groups_[static_cast<std::size_t>(w)];
  const std::size_t p = g.layout.padded_numel();
  track(MemCategory::params, p * recipe_.param);
  const auto at = static_cast<std::ptrdiff_t>(g.owned.begin);
  if (bf16_) {
    g.staging.assign(p, comm::bf16{});
    for (std::size_t i = 0; i < g.params.size(); ++i)
      g.staging[g.owned.begin + i] = comm::bf16(static_cast<float>(g.params[i]));
    g.pending =
        issue("all_gather", "parameters (one unit)", *shard_, std::span<comm::bf16>(g.staging));
  } else {
    g.full.assign(p, T{0});
    std::copy(g.params.begin(), g.params.end(), g.full.begin() + at);
    g.pending = issue("all_gather", "parameters (one unit)", *shard_, std::span<T>(g.full));
  }
}

template <class T>
void EngineImpl<T>::finish_gather(int w) {
  Group<T>& g = groups_[static_cast<std::size_t>(w)];
  g.pending->wait();
  g.pending = nullptr;
  if (bf16_) {
    g.full.resize(g.staging.size());
    for (std::size_t i = 0; i < g.staging.size(); ++i)
      g.full[i] = static_cast<T>(static_cast<float>(g.staging[i]));
    g.staging = {};
  }
  unpack_units(g, std::span<const T>(g.full));
  g.full = {};
  g.held = true;
}

template <class T>
void EngineImpl<T>::free_gather(int w) {
  Group<T>& g = groups_[static_cast<std::size_t>(w)];
  if (!g.held) return;
  untrack(MemCategory::params, g.layout.padded_numel() * recipe_.param);
  g.held = false;
  // Poison the freed copy: a use after free shows up as NaN in parity, not as stale numbers.
  for (int u : g.units)
    for (auto& e : work_[static_cast<std::size_t>(u)])
      e.value.fill(std::numeric_limits<T>::quiet_NaN());
}

template <class T>
ref::ParamMap<T>& EngineImpl<T>::grads(int unit) {
  const auto u = static_cast<std::size_t>(unit);
  if (!mb_grads_live_[u]) {
    ref::ParamMap<T> m;
    for (const auto& e : work_[u]) m.add(e.name, e.value.shape());
    mb_grads_[u] = std::move(m);
    mb_grads_live_[u] = true;
    track(MemCategory::grads,
          static_cast<std::size_t>(mb_grads_[u].numel()) * recipe_.microbatch_grad);
  }
  return mb_grads_[u];
}

template <class T>
void EngineImpl<T>::grads_ready(int unit) {
  const auto u = static_cast<std::size_t>(unit);
  ref::ParamMap<T>& mg = grads(unit);
  for (auto& e : mg) {
    if (options_.grad_hook)
      options_.grad_hook(steps_, microbatch_, e.name, comm::view(e.value.span()));
    if (options_.health.check && !nonfinite_)
      nonfinite_ = any_nonfinite(std::span<const T>(e.value.vec()));
  }
  if constexpr (std::is_same_v<T, float>)
    if (bf16_) ref::round_to_bf16(mg);  // the recipe: each microbatch's gradient rounded to bf16
  const auto drop = [&](std::size_t v) {
    untrack(MemCategory::grads,
            static_cast<std::size_t>(mb_grads_[v].numel()) * recipe_.microbatch_grad);
    mb_grads_[v] = ref::ParamMap<T>{};
    mb_grads_live_[v] = false;
  };
  Group<T>& g = group_of(unit);
  if (mode_ == GradMode::full_buckets) {
    for (const auto& e : mg) {
      const FlatParam* p = param_index_.at(e.name).second;
      T* dst = g.acc.data() + p->offset;
      for (std::size_t i = 0; i < p->numel; ++i) dst[i] += e.value.vec()[i];
    }
    drop(u);
    if (last_microbatch_) unit_done_[u] = true;
    return;
  }
  if (++g.ready < static_cast<int>(g.units.size())) return;
  g.ready = 0;
  PendingReduce<T> pr;
  pr.group = group_of_[u];
  pr.tracked =
      comm::TrackedBytes(mem_, MemCategory::temporary, g.layout.padded_numel() * recipe_.grad);
  pr.buffer.assign(g.layout.padded_numel(), T{0});
  for (int v : g.units) {
    for (const auto& e : mb_grads_[static_cast<std::size_t>(v)]) {
      const FlatParam* p = param_index_.at(e.name).second;
      std::copy(e.value.vec().begin(), e.value.vec().end(),
                pr.buffer.begin() + static_cast<std::ptrdiff_t>(p->offset));
    }
    drop(static_cast<std::size_t>(v));
  }
  const bool skip =
      planted(Mutation::kSkipBucket) && pr.group == static_cast<int>(groups_.size() / 2);
  if (!skip)
    pr.work = no_shard_ ? issue("all_reduce", "gradients (one unit)", dp_, std::span<T>(pr.buffer))
                        : issue("reduce_scatter", "gradients to owners", *shard_,
                                std::span<T>(pr.buffer));
  pending_.push_back(std::move(pr));
}

template <class T>
void EngineImpl<T>::complete_reductions() {
  for (PendingReduce<T>& pr : pending_) {
    if (pr.work) pr.work->wait();  // null: kSkipBucket left this unit unreduced
    Group<T>& g = groups_[static_cast<std::size_t>(pr.group)];
    if (no_shard_) {
      for (std::size_t i = 0; i < g.acc.size(); ++i) g.acc[i] += pr.buffer[i];
      continue;
    }
    std::size_t begin = g.owned.begin;
    if (planted(Mutation::kWrongShardOffset))
      begin = static_cast<std::size_t>(shard_->rank()) *
              (g.layout.numel() / static_cast<std::size_t>(g.layout.shards()));
    const std::span<T> chunk = std::span<T>(pr.buffer).subspan(begin, g.owned.size());
    if (replicate_)
      issue("all_reduce", "gradient shard across replicas", *replicate_, chunk)->wait();
    for (std::size_t i = 0; i < chunk.size(); ++i) g.acc[i] += chunk[i];
  }
  pending_.clear();
}

template <class T>
void EngineImpl<T>::issue_ready_buckets(bool all) {
  const std::size_t skip = buckets_.size() / 2;
  std::vector<T>& acc = groups_.front().acc;
  while (next_bucket_ < buckets_.size()) {
    const std::size_t b = next_bucket_;
    if (!all)
      for (int u : bucket_units_[b])
        if (!unit_done_[static_cast<std::size_t>(u)]) return;
    ++next_bucket_;
    if (planted(Mutation::kSkipBucket) && b == skip) continue;
    bucket_work_.push_back(issue("all_reduce", "gradient bucket", dp_,
                                 std::span<T>(acc).subspan(buckets_[b].begin, buckets_[b].size())));
  }
}

// ---- optimizer -------------------------------------------------------------------------------

template <class T>
std::span<T> EngineImpl<T>::master_of(Group<T>& g) {
  if (bf16_) return std::span<T>(g.master);
  return g.sharded ? std::span<T>(g.params)
                   : std::span<T>(g.params).subspan(g.owned.begin, g.owned.size());
}

template <class T>
void EngineImpl<T>::optimizer_step(double clip_factor, double lr) {
  ++adam_t_;
  std::size_t owned = 0;
  for (Group<T>& g : groups_) {
    std::span<T> grad;
    if (mode_ == GradMode::full_buckets) {
      std::size_t begin = g.owned.begin;
      if (strategy != Strategy::ddp && planted(Mutation::kWrongShardOffset))
        begin =
            static_cast<std::size_t>(rank_) * (g.layout.numel() / static_cast<std::size_t>(size_));
      grad = std::span<T>(g.acc).subspan(begin, g.owned.size());
    } else {
      grad = std::span<T>(g.acc).first(g.owned.size());
    }
    if (clip_factor != 1.0)
      for (T& x : grad) x = static_cast<T>(static_cast<double>(x) * clip_factor);
    const std::span<T> master = master_of(g);
    adam(g, master, grad, lr);
    owned += g.owned.size();
    if (bf16_) {
      const std::span<T> working =
          g.sharded ? std::span<T>(g.params)
                    : std::span<T>(g.params).subspan(g.owned.begin, g.owned.size());
      for (std::size_t i = 0; i < working.size(); ++i)
        working[i] = static_cast<T>(ref::round_to_bf16(static_cast<float>(master[i])));
    }
    share_updated(g);
  }
  dp_.compute({"adamw", adamw_flops(static_cast<double>(owned)),
               static_cast<double>(owned * (recipe_.param + recipe_.grad + recipe_.optimizer()))});
}

// ZeRO-1/2: every rank updated its shard of a replicated buffer; all_gather the result (bf16:
// the working copy in bf16, so the traffic is the recipe's).
template <class T>
void EngineImpl<T>::share_updated(Group<T>& g) {
  if (g.sharded || g.owned.size() == g.layout.numel()) {
    if (!g.sharded) unpack_units(g, std::span<const T>(g.params));
    return;
  }
  if (bf16_) {
    comm::TrackedBytes t(mem_, MemCategory::temporary, g.params.size() * 2);
    std::vector<comm::bf16> staging(g.params.size());
    for (std::size_t i = g.owned.begin; i < g.owned.end; ++i)
      staging[i] = comm::bf16(static_cast<float>(g.params[i]));
    issue("all_gather", "updated parameters", dp_, std::span<comm::bf16>(staging))->wait();
    for (std::size_t i = 0; i < staging.size(); ++i)
      g.params[i] = static_cast<T>(static_cast<float>(staging[i]));
  } else {
    issue("all_gather", "updated parameters", dp_, std::span<T>(g.params))->wait();
  }
  unpack_units(g, std::span<const T>(g.params));
}

// AdamW of reference/optim.cpp, element by element in the same order and types, over a flat
// range whose per-element decay flags come from the layout.
template <class T>
void EngineImpl<T>::adam(Group<T>& grp, std::span<T> p, std::span<const T> g, double lr) {
  adamw_range(train_.optimizer, adam_t_, lr, p, g, std::span<T>(grp.m), std::span<T>(grp.v),
              std::span<const std::uint8_t>(grp.decay));
}

template class EngineImpl<double>;
template class EngineImpl<float>;

}  // namespace shardcheck::parallel
