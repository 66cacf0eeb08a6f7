// A data-parallel gradient synchronisation written by a user against comm::Communicator, run on
// four simulated ranks (sim::SimWorld) and checked against the reference model (ref::) for parity:
//   1. the correct strategy: global loss denominators reduced first, gradients summed; parity
//      within f64 rounding;
//   2. the classic bug, a mean of rank means (each rank normalises by its own token count, then
//      averages): the same check fails;
//   3. a rank that skips the gradient all_reduce: the simulator stops the deadlock and names rank,
//      op and sequence number.
// Exits 0 when all three behave as stated.
#include <shardcheck/comm/communicator.hpp>
#include <shardcheck/parallel/parity.hpp>
#include <shardcheck/reference/data.hpp>
#include <shardcheck/reference/model.hpp>
#include <shardcheck/reference/trainer.hpp>
#include <shardcheck/sim/world.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace sc = shardcheck;

namespace {

constexpr int kRanks = 4;
constexpr std::uint64_t kSeed = 7;

enum class Variant { correct, mean_of_means, skips_a_collective };

// One rank's step: gradients of the global loss over this rank's slice of the global batch, then
// synchronised over every rank. Returns the synchronised gradients.
sc::ref::ParamMap<double> dp_step(sc::comm::Communicator& comm, const sc::ref::ModelConfig& model,
                                  const sc::ref::ParamMap<double>& params,
                                  const sc::ref::Batch& slice, Variant v) {
  // The loss is sum(token losses) / (global token count) + mean(aux): both denominators are
  // global, so they are reduced before any backward.
  std::array<double, 2> counts{0.0, static_cast<double>(slice.size())};
  for (const sc::ref::Sequence& s : slice) counts[0] += static_cast<double>(s.mask_count());
  const std::array<double, 2> local = counts;
  comm.all_reduce(std::span<double>(counts))->wait();

  sc::ref::StepContext ctx;
  ctx.seed = kSeed;
  ctx.step = 1;
  const std::array<double, 2>& denominators = v == Variant::mean_of_means ? local : counts;
  ctx.token_weight = 1.0 / denominators[0];
  ctx.sequence_weight = 1.0 / denominators[1];
  sc::ref::ParamMap<double> grads = params.zeros_like();
  sc::ref::forward_backward<double>(model, params, slice, ctx, &grads);

  // One flat buffer, one collective (a single bucket).
  std::vector<double> flat;
  for (const auto& e : grads) flat.insert(flat.end(), e.value.vec().begin(), e.value.vec().end());
  const sc::comm::ReduceOp op =
      v == Variant::mean_of_means ? sc::comm::ReduceOp::avg : sc::comm::ReduceOp::sum;
  // The third variant's bug: the last rank believes it has nothing to contribute and returns.
  if (!(v == Variant::skips_a_collective && comm.rank() == kRanks - 1))
    comm.all_reduce(std::span<double>(flat), {op})->wait();
  std::size_t at = 0;
  for (auto& e : grads) {
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(at), e.value.numel(), e.value.data());
    at += static_cast<std::size_t>(e.value.numel());
  }
  return grads;
}

// Runs the strategy on kRanks simulated ranks; returns the worst relative error of any rank's
// gradient against the reference's (infinity when the run stopped in a diagnosed deadlock, -1
// when it failed otherwise).
double run(Variant v, const sc::ref::ModelConfig& model, const sc::ref::Dataset& data,
           const std::vector<std::int64_t>& global, const sc::ref::ParamMap<double>& want) {
  const sc::ref::ParamMap<double> params = sc::ref::init_params<double>(model, kSeed);
  std::vector<double> worst(kRanks, 0.0);
  sc::sim::SimWorld world(kRanks);
  try {
    world.run([&](sc::comm::Communicator& comm) {
      const int r = comm.rank();
      const auto ids = sc::ref::DistributedSampler::rank_slice(global, r, kRanks);
      const std::int64_t first = static_cast<std::int64_t>(global.size()) * r / kRanks;
      const sc::ref::Batch slice = sc::ref::gather_batch(data, ids, first);
      const sc::ref::ParamMap<double> got = dp_step(comm, model, params, slice, v);
      for (const auto& e : want)
        worst[static_cast<std::size_t>(r)] = std::max(
            worst[static_cast<std::size_t>(r)], sc::parallel::tensor_rel_err(got[e.name], e.value));
    });
  } catch (const sc::sim::RankFailure& e) {
    const auto& d = world.diagnosis();
    if (!d) {
      std::printf("  the run failed without a diagnosis: %s\n", e.what());
      return -1.0;
    }
    std::printf("  %s: culprit rank(s)", std::string(name_of(d->kind)).c_str());
    for (int rank : d->ranks) std::printf(" %d", rank);
    std::printf(", op %s, group %s, seq %llu\n  %s\n", d->op.c_str(), d->group.c_str(),
                static_cast<unsigned long long>(d->seq), d->message.c_str());
    return d->kind == sc::sim::DiagnosisKind::deadlock ? INFINITY : -1.0;
  }
  return *std::max_element(worst.begin(), worst.end());
}

}  // namespace

int main() {
  sc::ref::ModelConfig model;  // the reference's small dense model
  sc::ref::TrainConfig train;
  train.steps = 1;
  train.global_batch = 8;
  sc::ref::DataConfig data_cfg;
  data_cfg.packing = false;  // one document per sequence, padded: ranks hold unequal token counts
  const sc::ref::Dataset data = sc::ref::build_dataset(data_cfg, model, kSeed);
  sc::ref::DistributedSampler sampler(static_cast<std::int64_t>(data.samples.size()),
                                      train.global_batch, kSeed, data_cfg.drop_last);
  const std::vector<std::int64_t> global = sampler.next_global_batch();

  // The single-device reference: one f64 step over the whole global batch.
  sc::ref::Trainer reference(model, train, kSeed);
  reference.step(sc::ref::gather_batch(data, global));
  const sc::ref::ParamMap<double> want = reference.last_grads();

  constexpr double kBound = 1e-12;  // f64: only the order of the sums differs
  int failures = 0;
  std::printf("1. data-parallel gradient sum on %d simulated ranks\n", kRanks);
  const double good = run(Variant::correct, model, data, global, want);
  std::printf("  worst gradient error %.3g (bound %.0e): %s\n", good, kBound,
              good <= kBound ? "parity" : "FAILED");
  failures += good <= kBound ? 0 : 1;

  std::printf("2. the same with a mean of rank means (a planted bug)\n");
  const double bad = run(Variant::mean_of_means, model, data, global, want);
  std::printf("  worst gradient error %.3g (bound %.0e): %s\n", bad, kBound,
              bad > kBound ? "caught" : "NOT CAUGHT");
  failures += bad > kBound ? 0 : 1;

  std::printf("3. rank %d skips the gradient all_reduce (a planted deadlock)\n", kRanks - 1);
  const double hung = run(Variant::skips_a_collective, model, data, global, want);
  failures += hung == INFINITY ? 0 : 1;

  std::printf(failures == 0 ? "custom_strategy: all three as expected\n"
                            : "custom_strategy: %d unexpected result(s)\n",
              failures);
  return failures == 0 ? 0 : 1;
}
