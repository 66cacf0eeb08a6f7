// The training loop, templated on the master type: f64 (T = double), f32 (T = float) and the bf16
// recipe (T = float master weights and moments; forward/backward on bf16-rounded weights, each
// microbatch's gradients rounded to bf16 before they are accumulated in f32).
#include "reference/trainer.hpp"

#include <optional>
#include <string>

#include "reference/bf16.hpp"
#include "reference/model.hpp"
#include "reference/ops.hpp"
#include "reference/optim.hpp"

namespace shardcheck::ref {

struct Trainer::Engine {
  virtual ~Engine() = default;
  virtual StepRecord step(const Batch& batch) = 0;
  virtual ParamMap<double> params() const = 0;
  virtual ParamMap<double> grads() const = 0;
  virtual TrainerState save() const = 0;
  virtual void load(const TrainerState& state) = 0;
  TensorObserver observer;
  bool tied_uses_apart = false;  // Trainer::round_tied_uses_apart
  int steps_done = 0;
  int total_steps = 0;
  std::vector<MoeLoad> moe_load;  // the last step's
};

namespace {

HostArray batch_field(std::span<const Sequence> mb, std::vector<int32_t> Sequence::*field) {
  std::vector<int32_t> data;
  for (const Sequence& s : mb) data.insert(data.end(), (s.*field).begin(), (s.*field).end());
  const auto len = mb.empty() ? int64_t{0} : static_cast<int64_t>((mb.front().*field).size());
  return {{static_cast<int64_t>(mb.size()), len}, std::move(data)};
}

template <class T>
class EngineImpl final : public Trainer::Engine {
 public:
  EngineImpl(const ModelConfig& model, const TrainConfig& train, uint64_t seed)
      : model_(model),
        train_(train),
        seed_(seed),
        master_(init_params<T>(model, seed)),
        grads_(master_.zeros_like()),
        adam_(train.optimizer, master_) {
    total_steps = train.steps;
  }

  StepRecord step(const Batch& batch) override {
    REF_CHECK(static_cast<int>(batch.size()) == train_.global_batch,
              "batch size != train.global_batch");
    // Sequence::index keys dropout: it must be the position in this global batch, or the masks
    // would depend on how the batch was gathered (e.g. rank-local indices from a DP slice).
    for (size_t i = 0; i < batch.size(); ++i)
      REF_CHECK(batch[i].index == static_cast<int64_t>(i),
                "batch[" + std::to_string(i) + "].index = " + std::to_string(batch[i].index) +
                    ", expected its position in the global batch (gather_batch first_index?)");
    const int n = ++steps_done;
    if (n == 1 && observer)
      for (const auto& e : master_) observer("init/param/" + e.name, HostArray::of(e.value));

    StepContext ctx;
    ctx.seed = seed_;
    ctx.step = static_cast<uint32_t>(n);
    ctx.recompute = train_.recompute;
    int64_t tokens = 0;
    for (const Sequence& s : batch) tokens += s.mask_count();
    ctx.token_weight = tokens > 0 ? 1.0 / static_cast<double>(tokens) : 0.0;
    ctx.sequence_weight = 1.0 / static_cast<double>(batch.size());

    const bool bf16 = train_.precision == Precision::kBf16;
    ParamMap<T> working;
    if (bf16) {
      working = master_.template cast<T>();
      if constexpr (std::is_same_v<T, float>) round_to_bf16(working);
    }
    const ParamMap<T>& weights = bf16 ? working : master_;

    grads_ = master_.zeros_like();
    LossParts parts;
    const std::span<const Sequence> all(batch);
    for (size_t k = 0; k * static_cast<size_t>(train_.micro_batch) < batch.size(); ++k) {
      const auto mb = all.subspan(k * static_cast<size_t>(train_.micro_batch),
                                  static_cast<size_t>(train_.micro_batch));
      if (n == 1 && observer) observe_batch(k, mb);
      if (bf16) {
        ParamMap<T> mb_grads = master_.zeros_like();
        std::optional<Tensor<T>> head_use;  // the tied embedding's use by the head, apart
        if (tied_uses_apart && model_.tie_embeddings)
          head_use.emplace(master_["embed.weight"].shape());
        parts.merge(
            forward_backward(model_, weights, mb, ctx, &mb_grads, head_use ? &*head_use : nullptr));
        if constexpr (std::is_same_v<T, float>) {
          round_to_bf16(mb_grads);
          if (head_use)
            for (T& v : head_use->vec()) v = round_to_bf16(v);
        }
        for (auto& e : grads_) add_inplace(e.value, mb_grads[e.name]);
        if (head_use) add_inplace(grads_["embed.weight"], *head_use);
      } else {
        parts.merge(forward_backward(model_, weights, mb, ctx, &grads_));
      }
    }

    StepRecord rec;
    rec.step = n;
    rec.loss = parts.loss();
    rec.loss_sum = parts.loss_sum;
    rec.tokens = parts.tokens;
    rec.sequences = parts.sequences;
    for (const Sequence& seq : batch)
      for (int32_t id : seq.doc_ids) rec.non_padding_tokens += id >= 0;
    rec.aux = parts.sequences > 0 ? parts.aux_sum / static_cast<double>(parts.sequences) : 0.0;
    for (const MoeLoad& l : parts.moe_load) rec.moe_dropped += l.dropped();
    this->moe_load = std::move(parts.moe_load);
    rec.grad_norm = global_grad_norm(grads_);
    rec.lr = lr_at(train_.optimizer, n, train_.steps);
    if (observer) {
      observer("step" + std::to_string(n) + "/loss", {{}, std::vector<double>{rec.loss}});
      for (const auto& e : grads_)
        observer("step" + std::to_string(n) + "/grad/" + e.name, HostArray::of(e.value));
    }
    ParamMap<T> clipped = grads_;
    rec.clip_factor = clip_grad_norm(clipped, rec.grad_norm, train_.clip_grad_norm);
    adam_.step(master_, clipped, rec.lr);
    if (observer)
      for (const auto& e : master_)
        observer("step" + std::to_string(n) + "/param/" + e.name, HostArray::of(e.value));
    return rec;
  }

  ParamMap<double> params() const override { return master_.template cast<double>(); }
  ParamMap<double> grads() const override { return grads_.template cast<double>(); }

  TrainerState save() const override {
    return {steps_done, master_.template cast<double>(), adam_.exp_avg().template cast<double>(),
            adam_.exp_avg_sq().template cast<double>()};
  }

  void load(const TrainerState& state) override {
    for (const auto& e : master_)
      REF_CHECK(state.params.contains(e.name) && state.params[e.name].shape() == e.value.shape(),
                "saved parameters do not match " + e.name);
    master_ = state.params.template cast<T>();
    adam_.restore(state.exp_avg.template cast<T>(), state.exp_avg_sq.template cast<T>(),
                  state.steps_done);
    steps_done = state.steps_done;
  }

 private:
  void observe_batch(size_t k, std::span<const Sequence> mb) {
    const std::string p = "batch/" + std::to_string(k) + "/";
    observer(p + "tokens", batch_field(mb, &Sequence::tokens));
    observer(p + "targets", batch_field(mb, &Sequence::targets));
    observer(p + "loss_mask", batch_field(mb, &Sequence::loss_mask));
    observer(p + "doc_ids", batch_field(mb, &Sequence::doc_ids));
    observer(p + "positions", batch_field(mb, &Sequence::positions));
  }

  ModelConfig model_;
  TrainConfig train_;
  uint64_t seed_;
  ParamMap<T> master_;
  ParamMap<T> grads_;
  AdamW<T> adam_;
};

}  // namespace

Trainer::Trainer(const ModelConfig& model, const TrainConfig& train, uint64_t seed) {
  model.validate();
  train.validate();
  if (train.precision == Precision::kF64)
    engine_ = std::make_unique<EngineImpl<double>>(model, train, seed);
  else
    engine_ = std::make_unique<EngineImpl<float>>(model, train, seed);
}

Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;

void Trainer::set_observer(TensorObserver observer) {
  engine_->observer = std::move(observer);
}
void Trainer::round_tied_uses_apart(bool apart) {
  engine_->tied_uses_apart = apart;
}
StepRecord Trainer::step(const Batch& global_batch) {
  return engine_->step(global_batch);
}
ParamMap<double> Trainer::params() const {
  return engine_->params();
}
ParamMap<double> Trainer::last_grads() const {
  return engine_->grads();
}
const std::vector<MoeLoad>& Trainer::last_moe_load() const {
  return engine_->moe_load;
}
int Trainer::steps_done() const {
  return engine_->steps_done;
}
TrainerState Trainer::save() const {
  return engine_->save();
}
void Trainer::load(const TrainerState& state) {
  engine_->load(state);
}

TrainResult Trainer::run(const BatchSource& source) {
  TrainResult out;
  while (engine_->steps_done < engine_->total_steps) {
    out.steps.push_back(step(source(engine_->steps_done + 1)));
    out.moe_load.push_back(engine_->moe_load);
  }
  out.params = params();
  return out;
}

TrainResult train_and_dump(const ModelConfig& model, const TrainConfig& train, uint64_t seed,
                           const BatchSource& source, const std::string& dir) {
  TensorDumper dumper(dir);
  Trainer trainer(model, train, seed);
  trainer.set_observer([&](const std::string& name, const HostArray& a) { dumper.add(name, a); });
  TrainResult r = trainer.run(source);
  dumper.write_index();
  return r;
}

}  // namespace shardcheck::ref
