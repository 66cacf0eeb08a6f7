// Each planted bug (testing::Mutation) must make the check aimed at it fail, while gradient checks
// that cannot see it keep passing: proof that the invariant tests can fail.
#include <gtest/gtest.h>

#include "reference/testing.hpp"
#include "tests/reference/checks.hpp"

namespace shardcheck::ref {
namespace {

using testing::Mutation;
using testing::ScopedMutation;

TEST(Mutation, NoneByDefaultAndChecksPass) {
  EXPECT_EQ(testing::mutation(), Mutation::kNone);
  EXPECT_LT(test::packing_invariance_error(test::tiny_dense()), 1e-12);
  EXPECT_LT(test::rope_hand_error(), 1e-12);
  EXPECT_LT(test::global_mean_error(), 1e-12);
}

TEST(Mutation, MissingDocumentMaskBreaksPackingInvariance) {
  const ScopedMutation m(Mutation::kNoDocumentMask);
  EXPECT_GT(test::packing_invariance_error(test::tiny_dense()), 1e-3);
}

TEST(Mutation, RopeOffByOneBreaksTheHandComputedRotation) {
  const ScopedMutation m(Mutation::kRopeOffByOne);
  EXPECT_GT(test::rope_hand_error(), 1e-3);
  // RoPE is relative, so a uniform shift is invisible to packing invariance (within rounding):
  // only the hand-computed value catches it.
  EXPECT_LT(test::packing_invariance_error(test::tiny_dense()), 1e-9);
}

TEST(Mutation, MeanOfSequenceMeansBreaksTheGlobalTokenMean) {
  const ScopedMutation m(Mutation::kMeanOfSequenceMeans);
  EXPECT_GT(test::global_mean_error(), 1e-4);
}

TEST(Mutation, MeanOfSequenceMeansStillPassesGradientChecks) {
  // The mutated loss is self-consistent, so finite differences cannot see it.
  const ScopedMutation m(Mutation::kMeanOfSequenceMeans);
  const ModelConfig cfg = test::tiny_dense();
  Batch batch = test::tiny_batch(cfg, 2);
  for (int t = 0; t < 6; ++t) batch[0].loss_mask[static_cast<size_t>(t)] = 0;
  ParamMap<double> params = test::random_params(cfg, 3);
  const StepContext ctx = test::global_context(batch);
  ParamMap<double> grads = params.zeros_like();
  forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, &grads);
  auto loss = [&] {
    return forward_backward(cfg, params, std::span<const Sequence>(batch), ctx).loss();
  };
  EXPECT_LT(test::fd_rel_error(params["embed.weight"], grads["embed.weight"], loss, 32), 1e-6);
  EXPECT_LT(test::fd_rel_error(params["layers.1.attn.wq"], grads["layers.1.attn.wq"], loss, 32),
            1e-6);
}

TEST(Mutation, ScopeRestoresThePreviousSetting) {
  {
    const ScopedMutation m(Mutation::kRopeOffByOne);
    EXPECT_TRUE(testing::mutated(Mutation::kRopeOffByOne));
  }
  EXPECT_EQ(testing::mutation(), Mutation::kNone);
}

}  // namespace
}  // namespace shardcheck::ref
