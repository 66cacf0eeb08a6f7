// The shared step rules of step.hpp.
#include "parallel/step.hpp"

#include "reference/optim.hpp"

namespace shardcheck::parallel {

namespace {
std::string nonfinite_message(int step, const std::vector<int>& ranks) {
  std::string m = "non-finite gradient at step " + std::to_string(step) + " on rank(s)";
  for (int r : ranks) m += " " + std::to_string(r);
  return m;
}
}  // namespace

NonFiniteGradientError::NonFiniteGradientError(int step, std::vector<int> ranks)
    : std::runtime_error(nonfinite_message(step, ranks)), step_(step), ranks_(std::move(ranks)) {}

ref::Batch rank_batch(const ref::Dataset& data, const std::vector<int64_t>& global_ids, int rank,
                      int world, testing::Mutation planted) {
  const int source = planted == testing::Mutation::kSameSamples ? 0 : rank;
  const auto ids = ref::DistributedSampler::rank_slice(global_ids, source, world);
  const int64_t first = static_cast<int64_t>(global_ids.size()) / world * rank;
  return ref::gather_batch(data, ids, first);
}

LossCounts local_counts(const ref::Batch& local) {
  LossCounts c{0, static_cast<int64_t>(local.size()), 0};
  for (const ref::Sequence& s : local) {
    c[0] += s.mask_count();
    for (const int32_t id : s.doc_ids) c[2] += id >= 0;
  }
  return c;
}

ref::StepContext step_context(uint64_t seed, int step, const LossCounts& global,
                              const ref::TrainConfig& train) {
  ref::StepContext ctx;
  ctx.seed = seed;
  ctx.step = static_cast<uint32_t>(step);
  ctx.recompute = train.recompute;
  ctx.token_weight = global[0] > 0 ? 1.0 / static_cast<double>(global[0]) : 0.0;
  ctx.sequence_weight = global[1] > 0 ? 1.0 / static_cast<double>(global[1]) : 0.0;
  return ctx;
}

ref::StepRecord step_record(int step, const LossCounts& global, double loss_sum, double aux_sum,
                            double squared_norm, const ref::TrainConfig& train) {
  ref::StepRecord rec;
  rec.step = step;
  rec.tokens = global[0];
  rec.sequences = global[1];
  rec.non_padding_tokens = global[2];
  rec.loss_sum = loss_sum;
  rec.aux = global[1] > 0 ? aux_sum / static_cast<double>(global[1]) : 0.0;
  rec.loss = (global[0] > 0 ? loss_sum / static_cast<double>(global[0]) : 0.0) + rec.aux;
  rec.grad_norm = std::sqrt(squared_norm);
  rec.clip_factor = ref::clip_factor(rec.grad_norm, train.clip_grad_norm);
  rec.lr = ref::lr_at(train.optimizer, step, train.steps);
  return rec;
}

LossCounts global_counts(comm::Communicator& data, LossCounts local) {
  data.all_reduce(std::span<int64_t>(local))->wait();
  return local;
}

StepSums global_sums(comm::Communicator& world, StepSums local) {
  world.all_reduce(std::span<double>(local))->wait();
  return local;
}

StepHealth agree_health(comm::Communicator& group, bool nonfinite) {
  std::vector<int32_t> flags(static_cast<std::size_t>(group.size()), 0);
  flags[static_cast<std::size_t>(group.rank())] = nonfinite ? 1 : 0;
  group.all_gather(comm::view(std::span<int32_t>(flags)))->wait();
  StepHealth h;
  for (int r = 0; r < group.size(); ++r)
    if (flags[static_cast<std::size_t>(r)] != 0) h.nonfinite_ranks.push_back(r);
  h.skipped = !h.nonfinite_ranks.empty();
  return h;
}

void enforce_health(const StepHealth& h, const GradHealthOptions& o, int step) {
  if (h.skipped && o.policy == NonFinitePolicy::stop)
    throw NonFiniteGradientError(step, h.nonfinite_ranks);
}

}  // namespace shardcheck::parallel
