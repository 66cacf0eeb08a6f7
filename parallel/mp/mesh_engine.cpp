// MeshEngine (mesh_engine.hpp): MeshImpl's construction, the phases of its step (in the order of
// mesh_step.hpp), the tied embedding's sum and the state (mesh_impl.hpp); a chunk's forward and
// backward are in mesh_chunks.cpp.
#include "parallel/mp/mesh_engine.hpp"

#include "parallel/mp/mesh_impl.hpp"

namespace shardcheck::parallel {

namespace mesh_detail {

template <class T>
MeshImpl<T>::MeshImpl(comm::Communicator& world, const ref::ModelConfig& model,
                      const ref::TrainConfig& train, uint64_t seed, MeshOptions options)
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
  // The groups (mesh_groups.hpp). The expert ranks are carved out of the dp x cp ranks: experts
  // sum over edp (dp x cp / ep).
  MeshGroupSet groups(world, mesh, group_splits(mesh, model_, train_.precision, opt_));
  g_.dp = groups.take(Group::dp);
  g_.tp = groups.take(Group::tp);
  g_.pp = groups.take(Group::pp);
  g_.cp = groups.take(Group::cp);
  g_.ep = groups.take(Group::ep);
  data_ = groups.take(Group::data);
  dense_ = groups.take(Group::dense);
  expert_ = groups.take(Group::expert);
  kv_ = groups.take(Group::kv);  // TP ranks sharing one replicated kv head
  if (groups.get(Group::parts) != nullptr)
    experts_ =
        std::make_unique<ExpertParts>(expert_parts(mesh, world.rank(), groups.take(Group::parts)));
  dense_h_ = {groups.take(Group::dense_shard), groups.take(Group::dense_replicas)};
  expert_h_ = {groups.take(Group::expert_shard), groups.take(Group::expert_replicas)};
  data_rank = data_->rank();
  data_world = data_->size();
  planted = opt_.planted;
  env_ = BlockEnv{.model = &model_,
                  .tp = g_.tp.get(),
                  .cp = g_.cp.get(),
                  .ep = g_.ep.get(),
                  .layout = &layout_,
                  .cp_algo = opt_.cp_algo,
                  .attention = AttentionKernel::engine,
                  .moe_routing = MoeRouting::uniform,
                  .planted = opt_.planted,
                  .ep_part_of_source = {}};
  if (experts_ && opt_.planted != testing::Mutation::kBf16ExpertsRoundedTogether)
    env_.ep_part_of_source = experts_->part_of_source;
  stage_ = g_.pp->rank();
  plan_ = stage_plan(model_, opt_.shape.pp, opt_.virtual_stages, stage_);
  specs_ = local_params(model_, mesh, world.rank(), opt_.virtual_stages, opt_.planted);
  for (const LocalParam& p : specs_) {
    Tensor<T>& t = params_.add(p.name, p.local_shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int64_t g = p.global_index(i);  // -1: vocabulary padding, zero
      t[i] = g < 0 ? T{0} : static_cast<T>(ref::init_value(model_, seed_, p.name, g));
    }
  }
  grads_ = params_.zeros_like();
  buckets_ = BucketFill({.tied_across_stages = model_.tie_embeddings && opt_.shape.pp > 1,
                         .sequence_parallel = env_.sp(),
                         .bucket_elems = opt_.bucket_elems});
  const DataParallelRules rules = data_parallel_rules(opt_);
  const FsdpOptions& f = rules.fsdp;
  wrap_of_ = wrap_map(model_, f);
  this->set_order({.model = &model_,
                   .wrap_of = &wrap_of_,
                   .plan = &plan_,
                   .pp = opt_.shape.pp,
                   .virtual_stages = opt_.virtual_stages,
                   .stage = stage_,
                   .micro_batch = train_.micro_batch,
                   .precision = train_.precision,
                   .recompute = train_.recompute,
                   .no_shard = rules.no_shard,
                   .ddp_overlap = rules.ddp_overlap,
                   .sp_tp = env_.sp() ? g_.tp.get() : nullptr,
                   .kv = kv_.get(),
                   .dense = dense_.get(),
                   .expert = expert_.get()});
  typename MeshOptimizer<T>::Env env{
      .dense = dense_h_.shard ? dense_h_.shard.get() : dense_.get(),
      .expert = expert_h_.shard ? expert_h_.shard.get() : expert_.get(),
      .world = &world_,
      .dense_replicas = dense_h_.replicas.get(),
      .expert_replicas = expert_h_.replicas.get(),
      .unit_of = [this](const LocalParam& p) { return wrap_of_.at(p.unit); },
      .zero = opt_.zero,
      .bf16 = train_.precision == ref::Precision::kBf16,
      .tp_rank = g_.tp->rank(),
      .optimizer = train_.optimizer,
      .recipe = recipe_,
      .planted = opt_.planted};
  zopt_ = std::make_unique<MeshOptimizer<T>>(std::move(env), specs_, params_);
  units_ = std::make_unique<UnitReducer<OptimizerUnits<T>>>(
      typename UnitReducer<OptimizerUnits<T>>::Setup{.model = &model_,
                                                     .wrap_of = &wrap_of_,
                                                     .plan = &plan_,
                                                     .pp = opt_.shape.pp,
                                                     .virtual_stages = opt_.virtual_stages,
                                                     .stage = stage_,
                                                     .zero = opt_.zero,
                                                     .bytes_per_elem = recipe_.microbatch_grad,
                                                     .planted = opt_.planted},
      specs_, OptimizerUnits<T>{zopt_.get(), &mb_grads_}, mem_);
  if (opt_.zero == 3) {
    residency_ = std::make_unique<MeshResidency<T>>(
        OptimizerGathers<T>{zopt_.get(), &params_}, mem_, recipe_.param,
        typename MeshResidency<T>::Options{.prefetch = f.prefetch,
                                           .keep_after_forward = rules.keep_after_forward});
  }
  resident_params = static_cast<std::size_t>(zopt_->resident_elems());
  params_held_ =
      comm::TrackedBytes(mem_, comm::MemCategory::params, resident_params * recipe_.param);
}

template <class T>
ref::StepRecord MeshImpl<T>::step(const ref::Batch& local) {
  batch_ = &local;
  this->run_step();
  return record_;
}

template <class T>
void MeshImpl<T>::count() {
  ++steps_;
  world_.begin_step(steps_);
  prefix_ = "step " + std::to_string(steps_);
  mem_.set_phase(prefix_ + " begin");
  grads_held_.reset();  // what a step that threw left held
  mb_held_.reset();
  grads_held_ =
      comm::TrackedBytes(mem_, comm::MemCategory::grads,
                         static_cast<std::size_t>(zopt_->accumulated_grad_elems()) * recipe_.grad);
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
    mb_held_ =
        comm::TrackedBytes(mem_, comm::MemCategory::grads,
                           (units_->deferred_elems() + part_elems) * recipe_.microbatch_grad);
  }
  for (auto& e : grads_) e.value.fill(T{0});

  // Global denominators, before any backward.
  const LossCounts mine = local_counts(*batch_);
  den_ = global_counts(*data_, mine);
  ctx_ = step_context(seed_, steps_, den_, train_);
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
}

template <class T>
void MeshImpl<T>::pipeline() {
  counted_ = {0.0, 0.0, 0.0};
  const int mbs = train_.micro_batch;
  this->microbatches_ = static_cast<int>(batch_->size()) / mbs;
  PipeStage<T> stage;
  stage.forward = [&](int mb, int chunk, Tensor<T> in) {
    return forward(mb, chunk, std::move(in));
  };
  stage.backward = [&](int mb, int chunk, Tensor<T> d) {
    return backward(mb, chunk, std::move(d));
  };
  stage.activation_shape = [&](int, int) { return chunk_activation_shape(model_, layout_, mbs); };
  run_pipeline(*g_.pp, opt_.schedule, this->microbatches_, opt_.virtual_stages, stage);
  caches_.clear();
  mb_held_.reset();
  mem_.set_phase(prefix_ + " reduce");  // phase 3, the gradient sums, follows (run_step)
}

template <class T>
void MeshImpl<T>::reduced() {
  if (opt_.zero >= 2) {  // reduce_scatter: the full accumulator goes, the reduced shards stay
    grads_held_.reset();
    grads_held_ =
        comm::TrackedBytes(mem_, comm::MemCategory::grads,
                           static_cast<std::size_t>(zopt_->reduced_grad_elems()) * recipe_.grad);
  }
}

template <class T>
void MeshImpl<T>::sum() {
  const double sq = zopt_->sum_squares(grads_);
  StepSums sums{};
  if (opt_.planted == testing::Mutation::kLocalNormClip) {
    std::vector<double> rest = {counted_[0], counted_[1], counted_[2]};
    world_.all_reduce(std::span<double>(rest))->wait();
    sums = {sq, rest[0], rest[1], rest[2]};
  } else {
    sums = global_sums(world_, {sq, counted_[0], counted_[1], counted_[2]});
  }
  record_ = step_record(steps_, den_, sums[1], sums[2], sums[0], train_);
  if (opt_.health.check) health = agree_health(world_, nonfinite_);
}

template <class T>
void MeshImpl<T>::update() {
  // Clip and update (each rank its owned range; zero >= 1 then all_gather), unless skipped.
  mem_.set_phase(prefix_ + " optimizer");
  model_state = mem_.current();
  if (health.skipped)
    ++skipped;
  else
    zopt_->update(grads_, record_.clip_factor, record_.lr, params_);
  grads_held_.reset();
  mem_.set_phase(prefix_ + " end");
  enforce_health(health, opt_.health, steps_);
}

template <class T>
ref::ParamMap<double> MeshImpl<T>::full_params() {
  ref::ParamMap<double> full;
  for (const auto& [name, shape] : ref::param_shapes(model_)) full.add(name, shape);
  zopt_->for_each_counted(params_, [&](const LocalParam& p, int64_t i, T v) {
    if (const int64_t g = p.global_index(i); g >= 0) full[p.name][g] = static_cast<double>(v);
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

template <class T>
std::vector<StatePiece> MeshImpl<T>::export_state() const {
  std::vector<StatePiece> out;
  zopt_->export_pieces(params_, out);
  if (world_.rank() == 0) {
    out.push_back(scalar_piece("train/step", steps_));
    out.push_back(scalar_piece("optimizer/step", zopt_->steps_taken()));
  }
  return out;
}

template <class T>
std::vector<StatePiece> MeshImpl<T>::held_params() const {
  std::vector<StatePiece> out;
  zopt_->export_held(params_, out);
  return out;
}

template <class T>
void MeshImpl<T>::import_state(const StateReader& read) {
  zopt_->import_pieces(read, params_);
  int64_t n = 0;
  read("train/step", comm::DType::i64, 0, 1, std::as_writable_bytes(std::span<int64_t>(&n, 1)));
  steps_ = static_cast<int>(n);
}

template <class T>
void MeshImpl<T>::sync_tied_embedding() {
  const int other = tied_embedding_peer(model_, plan_, opt_.shape.pp);
  if (other < 0 || opt_.planted == testing::Mutation::kSkipTiedEmbeddingSync) return;
  Tensor<T>& mine = grads_["embed.weight"];
  Tensor<T> peer(mine.shape());
  exchange_tied_embedding(*g_.pp, other, comm::cview(std::span<const T>(mine.span())),
                          comm::view(peer.span()));
  // first stage's gradient + last stage's, in that order on both.
  for (int64_t i = 0; i < mine.numel(); ++i) {
    mine[i] = plan_.has_embed ? mine[i] + peer[i] : peer[i] + mine[i];
  }
}

}  // namespace mesh_detail

MeshEngine::MeshEngine(comm::Communicator& world, const ref::ModelConfig& model,
                       const ref::TrainConfig& train, uint64_t seed, MeshOptions options) {
  validate_mesh(model, train, options);
  // FSDP shards parameters, gradients and optimizer state (no_shard: none of them).
  options.zero = data_parallel_rules(options).zero;
  if (train.precision == ref::Precision::kF64) {
    impl_ = std::make_unique<mesh_detail::MeshImpl<double>>(world, model, train, seed,
                                                            std::move(options));
  } else {
    impl_ = std::make_unique<mesh_detail::MeshImpl<float>>(world, model, train, seed,
                                                           std::move(options));
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
