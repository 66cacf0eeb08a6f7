// MeshEngine: the step of mesh_engine.hpp. Model math in tp_block.cpp, parameter slices in
// mesh_params.cpp, validation in mesh_validate.cpp.
#include "parallel/mp/mesh_engine.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <type_traits>

#include "comm/memory.hpp"
#include "parallel/flops.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/ledger.hpp"
#include "parallel/mp/mesh_bf16.hpp"
#include "parallel/mp/mesh_buckets.hpp"
#include "parallel/mp/mesh_memory.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/mesh_rows.hpp"
#include "parallel/mp/mesh_unit_reducer.hpp"
#include "parallel/mp/mesh_walk.hpp"
#include "parallel/mp/mesh_zero.hpp"
#include "parallel/mp/tp_block.hpp"
#include "parallel/testing.hpp"
#include "reference/bf16.hpp"
#include "reference/model.hpp"
#include "reference/optim.hpp"

namespace shardcheck::parallel {

struct MeshEngine::Impl {
  explicit Impl(comm::DeviceMesh m) : mesh(std::move(m)) {}
  virtual ~Impl() = default;
  virtual ref::StepRecord step(const ref::Batch& local) = 0;
  virtual ref::ParamMap<double> full_params() = 0;
  virtual std::vector<StatePiece> export_state() const = 0;
  virtual std::vector<StatePiece> held_params() const = 0;
  virtual void import_state(const StateReader& read) = 0;
  comm::DeviceMesh mesh;
  comm::MemoryBreakdown model_state;
  StepHealth health;
  int skipped = 0;
  int data_rank = 0, data_world = 1;
  testing::Mutation planted = testing::Mutation::kNone;
  std::size_t resident_params = 0;
};

namespace {

using mesh_detail::all_reduce_picked;
using mesh_detail::ChunkCache;
using mesh_detail::concat_rows;
using mesh_detail::HybridGroups;
using mesh_detail::MeshResidency;
using mesh_detail::scalar_piece;
using mesh_detail::split_over;
using mesh_detail::split_rows;
using ref::Tensor;

template <class T>
class MeshImpl final : public MeshEngine::Impl {
 public:
  MeshImpl(comm::Communicator& world, const ref::ModelConfig& model, const ref::TrainConfig& train,
           uint64_t seed, MeshOptions options)
      : Impl(comm::DeviceMesh(options.shape, options.order)),
        world_(world),
        model_(model),
        train_(train),
        seed_(seed),
        opt_(std::move(options)),
        mem_(world.memory()),
        recipe_(recipe_of(train.precision)),
        layout_(model.seq_len, opt_.shape.cp, opt_.shape.tp, opt_.sequence_parallel) {
    if (opt_.attention != AttentionKernel::engine)
      throw MeshConfigError("attention_kernel",
                            "the numeric engine computes attention with its own kernel; flash is "
                            "a planning input (plan.attention_kernel)");
    g_ = comm::build_groups(mesh, world);
    // The expert ranks are carved out of the dp x cp ranks: experts sum over edp (dp x cp / ep).
    using comm::Axis;
    const std::vector<Axis> dense = {Axis::dp, Axis::cp};
    const bool wrong = opt_.planted == testing::Mutation::kExpertSumOverDenseGroup;
    data_ = split_over(world, mesh, {Axis::dp}, "data");
    dense_ = split_over(world, mesh, dense, "dp-cp");
    expert_ = split_over(world, mesh, wrong ? dense : std::vector<Axis>{Axis::edp}, "expert-dp");
    if (opt_.shape.tp > model_.kv_heads) {  // TP ranks sharing one replicated kv head
      const int replicas = opt_.shape.tp / model_.kv_heads;
      kv_ =
          g_.tp->split(g_.tp->rank() / replicas, g_.tp->rank(), {.name = mesh_detail::kTpKvGroup});
    }
    if (train_.precision == ref::Precision::kBf16 && model_.moe) {
      experts_ = std::make_unique<mesh_detail::ExpertParts>(mesh_detail::expert_parts(world, mesh));
    }
    data_rank = data_->rank();
    data_world = data_->size();
    planted = opt_.planted;
    env_ = BlockEnv{&model_,  g_.tp.get(),  g_.cp.get(),  g_.ep.get(),
                    &layout_, opt_.cp_algo, opt_.planted, {}};
    if (experts_ && opt_.planted != testing::Mutation::kBf16ExpertsRoundedTogether)
      env_.ep_part_of_source = experts_->part_of_source;
    stage_ = g_.pp->rank();
    plan_ = stage_plan(model_, opt_.shape.pp, opt_.virtual_stages, stage_);
    specs_ = local_params(model_, mesh, world.rank(), opt_.virtual_stages, opt_.planted);
    for (const LocalParam& p : specs_) {
      Tensor<T>& t = params_.add(p.name, p.local_shape);
      for (int64_t i = 0; i < t.numel(); ++i) {
        t[i] = static_cast<T>(ref::init_value(model_, seed_, p.name, p.global_index(i)));
      }
    }
    grads_ = params_.zeros_like();
    buckets_ =
        mesh_detail::BucketFill({.tied_across_stages = model_.tie_embeddings && opt_.shape.pp > 1,
                                 .sequence_parallel = env_.sp(),
                                 .bucket_elems = opt_.bucket_elems});
    const FsdpOptions f = opt_.fsdp.value_or(FsdpOptions{.prefetch = 0});
    no_shard_ = opt_.fsdp && f.sharding == ShardingStrategy::no_shard;
    wrap_of_ = mesh_detail::wrap_map(model_, f);
    if (opt_.fsdp && f.sharding == ShardingStrategy::hybrid_shard) {
      const int s = f.shard_group_size * opt_.shape.cp;
      dense_h_ = mesh_detail::hybrid_split(world, mesh, {Axis::cp, Axis::dp}, s, "dp-cp");
      expert_h_ = mesh_detail::hybrid_split(world, mesh, {Axis::edp},
                                            std::gcd(s, mesh.size(Axis::edp)), "expert-dp");
    }
    typename MeshOptimizer<T>::Env env{
        .dense = dense_h_.shard ? dense_h_.shard.get() : dense_.get(),
        .expert = expert_h_.shard ? expert_h_.shard.get() : expert_.get(),
        .world = &world_,
        .dense_replicas = dense_h_.replicas.get(),
        .expert_replicas = expert_h_.replicas.get(),
        .unit_of = [this](const LocalParam& p) { return wrap_of_.at(unit_of(model_, p.name)); },
        .zero = opt_.zero,
        .bf16 = train_.precision == ref::Precision::kBf16,
        .tp_rank = g_.tp->rank(),
        .optimizer = train_.optimizer,
        .recipe = recipe_,
        .planted = opt_.planted};
    zopt_ = std::make_unique<MeshOptimizer<T>>(std::move(env), specs_, params_);
    units_ = std::make_unique<mesh_detail::UnitReducer<T>>(
        typename mesh_detail::UnitReducer<T>::Setup{.model = &model_,
                                                    .wrap_of = &wrap_of_,
                                                    .plan = &plan_,
                                                    .pp = opt_.shape.pp,
                                                    .virtual_stages = opt_.virtual_stages,
                                                    .stage = stage_,
                                                    .zero = opt_.zero,
                                                    .bytes_per_elem = recipe_.microbatch_grad,
                                                    .planted = opt_.planted},
        specs_, *zopt_, mem_);
    if (opt_.zero == 3) {
      const bool keep = f.sharding == ShardingStrategy::shard_grad_op || !f.reshard_after_forward;
      residency_ = std::make_unique<MeshResidency<T>>(
          mesh_detail::OptimizerGathers<T>{zopt_.get(), &params_}, mem_, recipe_.param,
          typename MeshResidency<T>::Options{.prefetch = f.prefetch, .keep_after_forward = keep});
    }
    resident_params = static_cast<std::size_t>(zopt_->resident_elems());
    params_held_ =
        comm::TrackedBytes(mem_, comm::MemCategory::params, resident_params * recipe_.param);
  }

  ref::StepRecord step(const ref::Batch& local) override {
    ++steps_;
    world_.begin_step(steps_);
    prefix_ = "step " + std::to_string(steps_);
    mem_.set_phase(prefix_ + " begin");
    comm::TrackedBytes grads_held(
        mem_, comm::MemCategory::grads,
        static_cast<std::size_t>(zopt_->accumulated_grad_elems()) * recipe_.grad);
    comm::TrackedBytes mb_held;
    buckets_.clear(specs_.size());
    zopt_->begin_accumulation();
    if (microbatch_grads()) {
      mb_grads_ = params_.zeros_like();
      expert_parts_.assign(env_.ep_part_of_source.empty() ? 0 : experts_->parts, {});
      std::size_t part_elems = 0;
      for (ref::ParamMap<T>& part : expert_parts_)
        for (const LocalParam& p : specs_)
          if (p.expert)
            part_elems += static_cast<std::size_t>(part.add(p.name, p.local_shape).numel());
      // ZeRO-3: the buffers reduced every microbatch are held one at a time (units_).
      mb_held =
          comm::TrackedBytes(mem_, comm::MemCategory::grads,
                             (units_->deferred_elems() + part_elems) * recipe_.microbatch_grad);
    }
    for (auto& e : grads_) e.value.fill(T{0});

    // 1. Global denominators, before any backward.
    LossCounts den = local_counts(local);
    const LossCounts mine = den;
    data_->all_reduce(std::span<int64_t>(den))->wait();
    ctx_ = step_context(seed_, steps_, den, train_);
    if (opt_.planted == testing::Mutation::kMeanOfRankMeans) {  // the mean of data ranks' means
      ctx_ = step_context(seed_, steps_, mine, train_);
      ctx_.token_weight /= data_world;
      ctx_.sequence_weight /= data_world;
    }
    const int64_t local_sequences = mine[1];
    if (opt_.planted == testing::Mutation::kAuxPerRankMean)
      ctx_.sequence_weight = local_sequences > 0 ? 1.0 / static_cast<double>(local_sequences) : 0.0;
    health = {};
    nonfinite_ = false;

    // 2. The pipeline over the microbatches.
    batch_ = &local;
    counted_ = {0.0, 0.0, 0.0};
    const int mbs = train_.micro_batch;
    const int microbatches = static_cast<int>(local.size()) / mbs;
    microbatches_ = microbatches;
    PipeStage<T> stage;
    stage.forward = [&](int mb, int chunk, Tensor<T> in) {
      return forward(mb, chunk, std::move(in));
    };
    stage.backward = [&](int mb, int chunk, Tensor<T> d) {
      return backward(mb, chunk, std::move(d));
    };
    stage.activation_shape = [&](int, int) {
      return ref::Shape{int64_t{mbs} * layout_.row_count(), model_.hidden};
    };
    run_pipeline(*g_.pp, opt_.schedule, microbatches, opt_.virtual_stages, stage);
    caches_.clear();
    mb_held.reset();

    // 3. Gradient sums (zero 2: reduce_scatter, this rank keeps its shards).
    mem_.set_phase(prefix_ + " reduce");
    sync_gradients();
    if (opt_.zero >= 2) {
      grads_held.reset();  // the full accumulator goes, the reduced shards stay
      grads_held =
          comm::TrackedBytes(mem_, comm::MemCategory::grads,
                             static_cast<std::size_t>(zopt_->reduced_grad_elems()) * recipe_.grad);
    }

    // 4. Norm and numerators.
    const double sq = zopt_->sum_squares(grads_);
    std::vector<double> sums = {sq, counted_[0], counted_[1], counted_[2]};
    if (opt_.planted == testing::Mutation::kLocalNormClip) {
      std::vector<double> rest = {counted_[0], counted_[1], counted_[2]};
      world_.all_reduce(std::span<double>(rest))->wait();
      sums = {sq, rest[0], rest[1], rest[2]};
    } else {
      world_.all_reduce(std::span<double>(sums))->wait();
    }
    ref::StepRecord rec = step_record(steps_, den, sums[1], sums[2], sums[0], train_);
    if (opt_.health.check) health = agree_health(world_, nonfinite_);

    // 5. Clip and update (each rank its owned range; zero >= 1 then all_gather), unless skipped.
    mem_.set_phase(prefix_ + " optimizer");
    model_state = mem_.current();
    if (health.skipped)
      ++skipped;
    else
      zopt_->update(grads_, rec.clip_factor, rec.lr, params_);
    grads_held.reset();
    mem_.set_phase(prefix_ + " end");
    enforce_health(health, opt_.health, steps_);
    return rec;
  }

  ref::ParamMap<double> full_params() override {
    ref::ParamMap<double> full;
    for (const auto& [name, shape] : ref::param_shapes(model_)) full.add(name, shape);
    zopt_->for_each_counted(params_, [&](const LocalParam& p, int64_t i, T v) {
      full[p.name][p.global_index(i)] = static_cast<double>(v);
    });
    std::vector<double> flat;
    flat.reserve(static_cast<std::size_t>(full.numel()));
    for (const auto& e : full) flat.insert(flat.end(), e.value.vec().begin(), e.value.vec().end());
    world_.all_reduce(std::span<double>(flat))->wait();
    std::size_t at = 0;
    for (auto& e : full) {
      std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), e.value.numel(), e.value.data());
      at += static_cast<std::size_t>(e.value.numel());
    }
    return full;
  }

  std::vector<StatePiece> export_state() const override {
    std::vector<StatePiece> out;
    zopt_->export_pieces(params_, out);
    if (world_.rank() == 0) {
      out.push_back(scalar_piece("train/step", steps_));
      out.push_back(scalar_piece("optimizer/step", zopt_->steps_taken()));
    }
    return out;
  }

  std::vector<StatePiece> held_params() const override {
    std::vector<StatePiece> out;
    zopt_->export_held(params_, out);
    return out;
  }

  void import_state(const StateReader& read) override {
    zopt_->import_pieces(read, params_);
    int64_t n = 0;
    read("train/step", comm::DType::i64, 0, 1, std::as_writable_bytes(std::span<int64_t>(&n, 1)));
    steps_ = static_cast<int>(n);
  }

 private:
  const ref::ParamMap<T>& weights() const { return params_; }
  // Whether the backward writes each microbatch's gradient apart (mb_grads_) before it is added
  // into the step's accumulator: the bf16 recipe's rounding, FSDP no_shard's per-microbatch sum,
  // ZeRO-3's per-microbatch reduce_scatter.
  bool microbatch_grads() const {
    return train_.precision == ref::Precision::kBf16 || no_shard_ || opt_.zero == 3;
  }
  ref::ParamMap<T>& grad_target() { return microbatch_grads() ? mb_grads_ : grads_; }

  // ZeRO-3 (mesh_unit_reducer.hpp): a buffer the step completes is rounded (the bf16 recipe) and
  // pre-summed as sync_gradients would (SP's TP-replicated, the replicated kv heads) before its
  // reduce_scatter.
  void unit_ready(int chunk, std::size_t step) {
    units_->ready(chunk, step, mb_grads_, [&](const std::vector<LocalParam>& specs) {
      if (train_.precision == ref::Precision::kBf16)
        mesh_detail::round_microbatch_gradient(specs, *g_.cp, kv_.get(),
                                               env_.sp() ? g_.tp.get() : nullptr, mb_grads_,
                                               experts_.get(), expert_parts_);
      if (env_.sp())
        all_reduce_picked(
            specs, *g_.tp, [](const LocalParam& p) { return p.tp_replicated; }, mb_grads_);
      if (kv_)
        all_reduce_picked(
            specs, *kv_, [](const LocalParam& p) { return p.kv_replicas > 1; }, mb_grads_);
    });
  }

  int virtual_stage(int chunk) const { return chunk * opt_.shape.pp + stage_; }
  int last_virtual_stage() const { return opt_.shape.pp * opt_.virtual_stages - 1; }

  // The steps of local chunk `chunk`'s forward or backward (mesh_walk.hpp).
  std::vector<mesh_detail::ChunkStep> chunk_steps(int chunk, bool forward) const {
    const int vs = virtual_stage(chunk);
    return mesh_detail::chunk_steps(model_, wrap_of_,
                                    plan_.chunk_layers[static_cast<std::size_t>(chunk)], vs == 0,
                                    vs == last_virtual_stage(), plan_.has_embed, forward);
  }
  void begin_uses(int mb, int chunk, bool forward,
                  const std::vector<mesh_detail::ChunkStep>& steps) {
    if (!residency_) return;
    callback_uses_ = mesh_detail::step_uses(steps);
    residency_->begin(mb, chunk, forward, callback_uses_);
  }
  // ZeRO-3: before each use of the callback's units, and after the callback.
  void use() {
    if (residency_) residency_->next();
  }
  void end_uses() {
    if (residency_) residency_->end();
  }

  Tensor<T> forward(int mb, int chunk, Tensor<T> input) {
    const int mbs = train_.micro_batch;
    const int vs = virtual_stage(chunk);
    const auto [first, last] = plan_.chunk_layers[static_cast<std::size_t>(chunk)];
    mem_.set_phase(prefix_ + " microbatch " + std::to_string(mb) + " forward chunk " +
                   std::to_string(chunk));
    const std::vector<mesh_detail::ChunkStep> steps = chunk_steps(chunk, true);
    begin_uses(mb, chunk, true, steps);
    ChunkCache<T>& cc = caches_[{mb, chunk}];
    const auto layers = static_cast<std::size_t>(last - first);
    cc.blocks.assign(static_cast<std::size_t>(mbs), std::vector<MpBlockCache<T>>(layers));
    cc.heads.resize(vs == last_virtual_stage() ? static_cast<std::size_t>(mbs) : 0);
    std::vector<Tensor<T>> xs;
    if (vs != 0) xs = split_rows(input, mbs);
    // Layer by layer over the microbatch's sequences (one use of each wrap unit); the MoE sums
    // are added sequence by sequence, as one sequence at a time would add them.
    std::vector<MpSequenceLoss> moe(static_cast<std::size_t>(mbs) * layers);
    struct Walk {
      MeshImpl& e;
      int mb, first;
      std::size_t layers;
      ChunkCache<T>& cc;
      std::vector<Tensor<T>>& xs;
      std::vector<MpSequenceLoss>& moe;
      void use() { e.use(); }
      void forward(const mesh_detail::ChunkStep& s, int i) {
        const auto ui = static_cast<std::size_t>(i);
        switch (s.part) {
          case mesh_detail::ChunkStep::Part::embed:
            xs.push_back(mp_embed_forward(e.env_, e.weights(), e.seq(mb, i)));
            break;
          case mesh_detail::ChunkStep::Part::layer: {
            const auto l = static_cast<std::size_t>(s.layer - first);
            MpBlockCache<T>& bc = cc.blocks[ui][l];
            xs[ui] = mp_block_forward(e.env_, e.weights(), s.layer, e.seq(mb, i), e.ctx_, xs[ui],
                                      bc, &moe[ui * layers + l]);
            e.keep_for_backward(bc);
            break;
          }
          case mesh_detail::ChunkStep::Part::head: {
            MpSequenceLoss l;
            mp_head_forward(e.env_, e.weights(), e.seq(mb, i), xs[ui], cc.heads[ui], &l);
            if (e.g_.tp->rank() == 0) e.counted_[0] += l.loss_sum;
            break;
          }
        }
      }
    };
    mesh_detail::walk_forward(steps, mbs, Walk{*this, mb, first, layers, cc, xs, moe});
    if (g_.tp->rank() == 0 && g_.cp->rank() == 0) {
      for (const MpSequenceLoss& l : moe) {
        counted_[1] += l.aux;
        counted_[2] += static_cast<double>(l.dropped);
      }
    }
    std::size_t held = 0;
    for (const auto& blocks : cc.blocks)
      for (const MpBlockCache<T>& b : blocks) held += cache_elems(b);
    for (const MpHeadCache<T>& h : cc.heads) held += cache_elems(h);
    cc.held = comm::TrackedBytes(mem_, comm::MemCategory::activations, held * recipe_.activation);
    end_uses();
    if (vs != last_virtual_stage()) return concat_rows(xs);
    return {};
  }

  Tensor<T> backward(int mb, int chunk, Tensor<T> dout) {
    const int mbs = train_.micro_batch;
    const int vs = virtual_stage(chunk);
    const auto [first, last] = plan_.chunk_layers[static_cast<std::size_t>(chunk)];
    mem_.set_phase(prefix_ + " microbatch " + std::to_string(mb) + " backward chunk " +
                   std::to_string(chunk));
    const std::vector<mesh_detail::ChunkStep> steps = chunk_steps(chunk, false);
    begin_uses(mb, chunk, false, steps);
    ChunkCache<T>& cc = caches_.at({mb, chunk});
    ref::ParamMap<T>& grads = grad_target();
    // The gradients a step completes for this microbatch: the hook and the health flag see them,
    // then (f64/f32, DDP overlap, last microbatch) their all_reduce is issued. The bf16 recipe
    // rounds the whole chunk's microbatch gradient first, so it issues at the chunk's end.
    const bool bf16 = train_.precision == ref::Precision::kBf16;
    std::vector<Tensor<T>> dxs;
    if (vs != last_virtual_stage()) dxs = split_rows(dout, mbs);
    // Layer by layer (each over the microbatch's sequences), so a layer's gradient is complete as
    // early as possible; every parameter still adds its sequences' contributions in order.
    struct Walk {
      MeshImpl& e;
      int mb, chunk, first;
      bool bf16;
      ChunkCache<T>& cc;
      ref::ParamMap<T>& grads;
      std::vector<Tensor<T>>& dxs;
      MpBlockCache<T> again;  // full recompute: the block from its input, its collectives too
      comm::TrackedBytes recomputed;
      void use() { e.use(); }
      void begin(std::size_t step) { e.units_->begin(chunk, step); }
      MpBlockCache<T>& cache(const mesh_detail::ChunkStep& s, int i) {
        return cc.blocks[static_cast<std::size_t>(i)][static_cast<std::size_t>(s.layer - first)];
      }
      void recompute(const mesh_detail::ChunkStep& s, int i) {
        again = MpBlockCache<T>{};
        mp_block_forward(e.env_, e.weights(), s.layer, e.seq(mb, i), e.ctx_, cache(s, i).x_in,
                         again, nullptr);
        recomputed = comm::TrackedBytes(e.mem_, comm::MemCategory::activations,
                                        cache_elems(again) * e.recipe_.activation);
      }
      void backward(const mesh_detail::ChunkStep& s, int i) {
        const auto ui = static_cast<std::size_t>(i);
        switch (s.part) {
          case mesh_detail::ChunkStep::Part::head:
            dxs.push_back(mp_head_backward(e.env_, e.weights(), e.seq(mb, i), e.ctx_.token_weight,
                                           cc.heads[ui], grads));
            break;
          case mesh_detail::ChunkStep::Part::layer: {
            const bool full = e.train_.recompute == ref::Recompute::kFull;
            dxs[ui] =
                mp_block_backward(e.env_, e.weights(), s.layer, e.seq(mb, i), e.ctx_,
                                  full ? again : cache(s, i), dxs[ui], grads, &e.expert_parts_);
            again = MpBlockCache<T>{};
            recomputed.reset();
            break;
          }
          case mesh_detail::ChunkStep::Part::embed:
            mp_embed_backward(e.env_, e.seq(mb, i), dxs[ui], grads);
            break;
        }
      }
      void complete(const mesh_detail::ChunkStep& s, std::size_t step) {
        const auto pick = [&s](const LocalParam& p) { return s.completes(p); };
        e.check_gradients(mb, grads, pick);
        if (!bf16 && e.ddp_overlap() && mb == e.microbatches_ - 1) e.issue_bucket(pick, false);
        e.unit_ready(chunk, step);
      }
    };
    mesh_detail::walk_backward(steps, mbs, train_.recompute == ref::Recompute::kFull,
                               Walk{*this, mb, chunk, first, bf16, cc, grads, dxs, {}, {}});
    Tensor<T> result;
    if (vs != 0) result = concat_rows(dxs);
    caches_.erase({mb, chunk});
    end_uses();
    units_->finish();
    // What the step's end reduces (ZeRO-3: the buffers not reduced above) joins the accumulator.
    const std::vector<LocalParam>& whole = units_->deferred_specs();
    if (bf16) {
      mesh_detail::round_microbatch_gradient(whole, *g_.cp, kv_.get(),
                                             env_.sp() ? g_.tp.get() : nullptr, mb_grads_,
                                             experts_.get(), expert_parts_);
    }
    if (microbatch_grads()) {
      if (no_shard_) {  // FSDP no_shard: each microbatch's gradient summed after its backward
        const comm::ReduceOptions op = zopt_->sum();         // planted (tests): an average
        if (opt_.planted != testing::Mutation::kSkipBucket)  // planted: the dense unit left out
          all_reduce_picked(
              specs_, *dense_, [](const LocalParam& p) { return !p.expert; }, mb_grads_, op);
        all_reduce_picked(
            specs_, *expert_, [](const LocalParam& p) { return p.expert; }, mb_grads_, op);
      }
      for (const LocalParam& p : whole) {
        ref::add_inplace(grads_[p.name], mb_grads_[p.name]);
        mb_grads_[p.name].fill(T{0});
      }
    }
    if (ddp_overlap() && mb == microbatches_ - 1)
      issue_bucket([&](const LocalParam& p) { return chunk_writes(chunk, p); }, true);
    return result;
  }

  bool chunk_writes(int chunk, const LocalParam& p) const {
    return parallel::chunk_writes(model_, plan_, chunk, virtual_stage(chunk), last_virtual_stage(),
                                  p);
  }

  // DDP overlap: the chunk's gradients are complete after its last microbatch; those summed only
  // over their class's group go now (the tied embedding, SP's TP-replicated and the replicated kv
  // heads need another sum first, in sync_gradients).
  // Buckets fill in completion order and go once they hold bucket_elems elements; what a chunk's
  // backward leaves goes at its end (flush).
  void issue_bucket(const typename MeshOptimizer<T>::Pick& pick, bool flush) {
    const std::vector<std::size_t>* bucket = buckets_.add(specs_, pick, flush);
    if (bucket == nullptr) return;
    std::set<std::string> names;
    for (const std::size_t i : *bucket) names.insert(specs_[i].name);
    zopt_->issue_reduce(grads_, [&](const LocalParam& p) { return names.count(p.name) > 0; });
  }
  bool ddp_overlap() const { return opt_.overlap && opt_.zero <= 1 && !no_shard_; }

  // The grad hook and the health flag on this rank's local gradients of the picked parameters,
  // complete for this microbatch, before any reduction over another rank (the bf16 recipe: before
  // the rounding).
  void check_gradients(int mb, ref::ParamMap<T>& grads,
                       const typename MeshOptimizer<T>::Pick& pick) {
    if (!opt_.grad_hook && !opt_.health.check) return;
    for (const LocalParam& p : specs_) {
      if (!pick(p)) continue;
      Tensor<T> summed;  // an expert's gradient kept in parts: their sum
      if (p.expert && !expert_parts_.empty()) {
        summed = Tensor<T>(p.local_shape);
        for (ref::ParamMap<T>& part : expert_parts_) ref::add_inplace(summed, part[p.name]);
      }
      Tensor<T>& g = summed.numel() > 0 ? summed : grads[p.name];
      if (opt_.grad_hook) {
        const Tensor<T> before = summed;
        opt_.grad_hook(steps_, mb, p.name, comm::view(g.span()));
        // what the hook wrote into the sum goes into the first part, so it reaches the gradient
        for (int64_t i = 0; i < summed.numel(); ++i)
          if (std::memcmp(&summed[i], &before[i], sizeof(T)) != 0)
            expert_parts_.front()[p.name][i] += summed[i] - before[i];
      }
      if (opt_.health.check && !nonfinite_) nonfinite_ = any_nonfinite(std::span<const T>(g.vec()));
    }
  }

  // What a block keeps from its forward for its backward (ref::Recompute): selective drops the
  // attention core's probabilities (Ulysses keeps them; the ring, flash-style, never does), full
  // everything but the block input.
  void keep_for_backward(MpBlockCache<T>& c) const {
    if (train_.recompute == ref::Recompute::kSelective) c.attn.probs = Tensor<T>{};
    if (train_.recompute == ref::Recompute::kFull) {
      MpBlockCache<T> input_only;
      input_only.x_in = std::move(c.x_in);
      c = std::move(input_only);
    }
  }

  const ref::Sequence& seq(int mb, int i) const {
    return (*batch_)[static_cast<std::size_t>(mb * train_.micro_batch + i)];
  }

  void sync_tied_embedding() {
    const int pp = opt_.shape.pp;
    if (pp == 1 || !model_.tie_embeddings) return;
    if (!(plan_.has_embed || plan_.has_head)) return;
    if (opt_.planted == testing::Mutation::kSkipTiedEmbeddingSync) return;
    Tensor<T>& mine = grads_["embed.weight"];
    Tensor<T> peer(mine.shape());
    const int other = plan_.has_embed ? pp - 1 : 0;
    comm::WorkPtr s = g_.pp->send(comm::cview(std::span<const T>(mine.span())), other, {.tag = 7});
    g_.pp->recv(comm::view(peer.span()), other, {.tag = 7})->wait();
    s->wait();
    // first stage's gradient + last stage's, in that order on both.
    for (int64_t i = 0; i < mine.numel(); ++i) {
      mine[i] = plan_.has_embed ? mine[i] + peer[i] : peer[i] + mine[i];
    }
  }

  void sync_gradients() {
    sync_tied_embedding();
    // ZeRO-3's buffers reduced every microbatch had these sums then (unit_ready).
    if (env_.sp())
      all_reduce_picked(
          specs_, *g_.tp,
          [&](const LocalParam& p) { return p.tp_replicated && units_->deferred(p); }, grads_);
    if (kv_)
      all_reduce_picked(
          specs_, *kv_,
          [&](const LocalParam& p) { return p.kv_replicas > 1 && units_->deferred(p); }, grads_);
    if (!no_shard_) zopt_->reduce(grads_);
  }

  comm::Communicator& world_;
  ref::ModelConfig model_;
  ref::TrainConfig train_;
  uint64_t seed_;
  MeshOptions opt_;
  comm::MemoryTracker& mem_;
  Recipe recipe_;
  TokenLayout layout_;
  comm::MeshGroups g_;
  std::unique_ptr<comm::Communicator> data_, dense_, expert_, kv_;
  HybridGroups dense_h_, expert_h_;          // hybrid_shard: shard and replica groups
  std::map<int, int> wrap_of_;               // layerwise unit -> wrap unit
  bool no_shard_ = false;                    // FSDP no_shard: gradients summed per microbatch
  mesh_detail::BucketFill buckets_;          // DDP overlap
  BlockEnv env_;
  int stage_ = 0;
  StagePlan plan_;
  std::vector<LocalParam> specs_;
  // params_: the forward weights (f64/f32: the master; bf16: the rounded working copy).
  ref::ParamMap<T> params_, grads_, mb_grads_;
  // The bf16 recipe with MoE: who rounds which expert gradients together; with parts, the
  // microbatch's expert gradients per part until they are rounded (mesh_bf16.hpp).
  std::unique_ptr<mesh_detail::ExpertParts> experts_;
  std::vector<ref::ParamMap<T>> expert_parts_;
  comm::TrackedBytes params_held_;
  std::unique_ptr<MeshOptimizer<T>> zopt_;
  std::unique_ptr<MeshResidency<T>> residency_;         // zero 3
  std::vector<std::vector<int>> callback_uses_;         // what residency_'s callback uses
  std::unique_ptr<mesh_detail::UnitReducer<T>> units_;  // zero 3: per-microbatch reductions
  std::string prefix_;
  int steps_ = 0;
  ref::StepContext ctx_;
  const ref::Batch* batch_ = nullptr;
  std::vector<double> counted_;  // loss_sum, aux_sum, dropped this rank counts
  bool nonfinite_ = false;       // this step's local gradients held a NaN or infinity
  int microbatches_ = 0;         // this step's, per rank
  std::map<std::pair<int, int>, ChunkCache<T>> caches_;
};

}  // namespace

MeshEngine::MeshEngine(comm::Communicator& world, const ref::ModelConfig& model,
                       const ref::TrainConfig& train, uint64_t seed, MeshOptions options) {
  validate_mesh(model, train, options);
  // FSDP shards parameters, gradients and optimizer state (no_shard: none of them).
  if (options.fsdp && options.fsdp->sharding != ShardingStrategy::no_shard) options.zero = 3;
  if (train.precision == ref::Precision::kF64) {
    impl_ = std::make_unique<MeshImpl<double>>(world, model, train, seed, std::move(options));
  } else {
    impl_ = std::make_unique<MeshImpl<float>>(world, model, train, seed, std::move(options));
  }
}
MeshEngine::~MeshEngine() = default;
const comm::DeviceMesh& MeshEngine::mesh() const {
  return impl_->mesh;
}
int MeshEngine::data_rank() const {
  return impl_->data_rank;
}
int MeshEngine::data_world() const {
  return impl_->data_world;
}
ref::Batch MeshEngine::local_batch(const ref::Dataset& data,
                                   const std::vector<int64_t>& global_ids) const {
  return rank_batch(data, global_ids, impl_->data_rank, impl_->data_world, impl_->planted);
}
ref::StepRecord MeshEngine::step(const ref::Batch& local) {
  return impl_->step(local);
}
const comm::MemoryBreakdown& MeshEngine::last_model_state() const {
  return impl_->model_state;
}
std::size_t MeshEngine::resident_param_elems() const {
  return impl_->resident_params;
}
const StepHealth& MeshEngine::last_step_health() const {
  return impl_->health;
}
int MeshEngine::skipped_steps() const {
  return impl_->skipped;
}
ref::ParamMap<double> MeshEngine::full_params() {
  return impl_->full_params();
}
std::vector<StatePiece> MeshEngine::export_state() const {
  return impl_->export_state();
}
std::vector<StatePiece> MeshEngine::held_params() const {
  return impl_->held_params();
}
void MeshEngine::import_state(const StateReader& read) {
  impl_->import_state(read);
}

}  // namespace shardcheck::parallel
