// Checks shared by the invariant tests and the mutation tests: each returns an error that is ~0 on
// a correct reference, so mutation_test.cpp can assert that a planted bug makes it large.
#pragma once

#include <cmath>
#include <numbers>

#include "reference/attention.hpp"
#include "reference/trainer.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref::test {

// Two documents packed in one sequence vs each document alone (padded): max |per-token loss
// difference| over the loss positions.
inline double packing_invariance_error(const ModelConfig& cfg_in) {
  ModelConfig cfg = cfg_in;
  cfg.seq_len = 12;
  DataConfig data;
  data.min_len = 5;
  data.max_len = 6;
  const std::vector<int32_t> a = make_document(data, cfg.vocab, 21, 0);
  const std::vector<int32_t> b = make_document(data, cfg.vocab, 21, 1);
  const Batch packed = pack_documents({a, b}, cfg.seq_len, true);
  const Batch alone = pack_documents({a, b}, cfg.seq_len, false);
  const ParamMap<double> params = random_params(cfg, 31);
  const StepContext ctx;
  const LossParts lp = forward_backward(cfg, params, std::span<const Sequence>(packed), ctx);
  const LossParts la = forward_backward(cfg, params, std::span<const Sequence>(alone), ctx);
  const auto& p = lp.per_sequence.at(0).token_loss;
  double err = 0.0;
  for (size_t t = 0; t < a.size(); ++t)
    err = std::max(err, std::abs(p[t] - la.per_sequence[0].token_loss[t]));
  for (size_t t = 0; t < b.size(); ++t)
    err = std::max(err, std::abs(p[a.size() + t] - la.per_sequence[1].token_loss[t]));
  return err;
}

// RoPE against the rotation written out by hand (pair j of position p rotates by p *
// 10000^(-2j/d)).
inline double rope_hand_error() {
  Tensor<double> x({2, 4}, std::vector<double>{1, 0, 1, 0, 0.5, -2, 3, 1});
  const std::vector<int32_t> pos = {0, 5};
  const Tensor<double> in = x;
  rope_apply(x, std::span<const int32_t>(pos), 1, false, RopeConfig{});
  double err = 0.0;
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t j = 0; j < 2; ++j) {
      const double ang = pos[static_cast<size_t>(t)] * std::pow(10000.0, -2.0 * j / 4.0);
      const double x0 = in.at(t, 2 * j), x1 = in.at(t, 2 * j + 1);
      err = std::max(err, std::abs(x.at(t, 2 * j) - (x0 * std::cos(ang) - x1 * std::sin(ang))));
      err = std::max(err, std::abs(x.at(t, 2 * j + 1) - (x0 * std::sin(ang) + x1 * std::cos(ang))));
    }
  return err;
}

// The trainer's step-1 loss vs sum(token losses) / sum(mask) over the global batch, computed from
// the per-token losses of a plain forward; sequences have different mask counts on purpose.
inline double global_mean_error() {
  const ModelConfig cfg = tiny_dense();
  Batch batch = tiny_batch(cfg, 4);
  for (int t = 0; t < 8; ++t) batch[1].loss_mask[static_cast<size_t>(t)] = 0;  // unequal counts
  TrainConfig train;
  train.steps = 1;
  train.global_batch = 4;
  train.micro_batch = 2;
  Trainer trainer(cfg, train, 8);
  const ParamMap<double> init = trainer.params();
  const double loss = trainer.step(batch).loss;
  double sum = 0.0;
  int64_t count = 0;
  for (const Sequence& s : batch) {
    const LossParts lp =
        forward_backward(cfg, init, std::span<const Sequence>(&s, 1), StepContext{});
    for (size_t t = 0; t < s.tokens.size(); ++t)
      if (s.loss_mask[t]) {
        sum += lp.per_sequence[0].token_loss[t];
        ++count;
      }
  }
  return std::abs(loss - sum / static_cast<double>(count)) / (sum / static_cast<double>(count));
}

}  // namespace shardcheck::ref::test
