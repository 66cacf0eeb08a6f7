// Vocab-parallel embedding, LM head and cross-entropy on the simulator (tp 1, 2, 4; tied and
// untied; f64 and f32) against the reference on the full vocabulary, also over a padded vocabulary
// (tp not dividing V, a rank holding padding only), the planted bugs of a target logit that is not
// summed over TP and of padded logits left in the softmax, and the TP slicing helpers as a
// round-trip property.
#include "parallel/mp/vocab_parallel.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "parallel/testing.hpp"
#include "reference/ops.hpp"
#include "sim/world.hpp"

namespace shardcheck::parallel {
namespace {

constexpr int64_t kV = 32, kH = 8, kN = 6;
// Targets across every shard at tp 4 (8 ids each of V = 32); row 2 is masked with an out-of-range
// target (never read), row 5 is masked with a valid one.
std::vector<int32_t> targets_for(int64_t vocab) {
  const auto v = static_cast<int32_t>(vocab);
  return {3, v - 1, -1, 17, 8, v - 7};
}
const std::vector<int32_t> kTargets = targets_for(kV);
const std::vector<int32_t> kMask = {1, 1, 0, 1, 1, 0};

// A vocabulary and its padding for TP (ModelConfig::vocab and vocab_pad_multiple).
struct Vocab {
  int64_t v = kV;
  int pad_multiple = 1;
};

template <class T>
ref::Tensor<T> random_tensor(ref::Shape shape, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> d(0.0, 1.0);
  ref::Tensor<T> t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(d(gen));
  return t;
}

template <class T>
double max_rel_err(const std::vector<T>& got, const std::vector<T>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return err / std::max(scale, 1e-300);
}

std::vector<double> row_weights() {
  const double tokens = static_cast<double>(std::count(kMask.begin(), kMask.end(), 1));
  std::vector<double> w(kMask.size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = kMask[i] ? 1.0 / tokens : 0.0;
  return w;
}

template <class T>
struct HeadRun {
  std::vector<std::vector<double>> loss;  // per TP rank
  std::vector<ref::Tensor<T>> dy;         // per TP rank
  ref::Tensor<T> dweight;                 // gathered from the shards, padding left out
  int64_t nonzero_padding = 0;            // padded entries of the gathered gradient that are not 0
};

// The full weight: tied -> embed.weight [V, h]; untied -> lm_head.weight [h, V].
template <class T>
ref::Tensor<T> full_weight(bool tied, int64_t vocab = kV) {
  return tied ? random_tensor<T>({vocab, kH}, 11) : random_tensor<T>({kH, vocab}, 12);
}

// `full` [V, h] (rows) or [h, V] (columns) with zero vocabulary entries up to vp, and back.
template <class T>
ref::Tensor<T> padded(const ref::Tensor<T>& full, bool tied, int64_t vp) {
  const int64_t v = tied ? full.dim(0) : full.dim(1);
  ref::Tensor<T> out(tied ? ref::Shape{vp, kH} : ref::Shape{kH, vp});
  for (int64_t i = 0; i < v; ++i)
    for (int64_t c = 0; c < kH; ++c)
      (tied ? out.at(i, c) : out.at(c, i)) = tied ? full.at(i, c) : full.at(c, i);
  return out;
}
// The logical part; counts the padding entries that are not zero.
template <class T>
ref::Tensor<T> unpadded(const ref::Tensor<T>& p, bool tied, int64_t v, int64_t& nonzero_padding) {
  ref::Tensor<T> out(tied ? ref::Shape{v, kH} : ref::Shape{kH, v});
  const int64_t vp = tied ? p.dim(0) : p.dim(1);
  for (int64_t i = 0; i < vp; ++i) {
    for (int64_t c = 0; c < kH; ++c) {
      const T x = tied ? p.at(i, c) : p.at(c, i);
      if (i >= v) {
        nonzero_padding += x != T{0};
      } else {
        (tied ? out.at(i, c) : out.at(c, i)) = x;
      }
    }
  }
  return out;
}

template <class T>
HeadRun<T> run_head(int tp, bool tied, testing::Mutation planted = testing::Mutation::kNone,
                    Vocab vocab = {}) {
  const ref::Tensor<T> y = random_tensor<T>({kN, kH}, 7);
  const int64_t vp = ref::padded_vocab(vocab.v, int64_t{tp} * vocab.pad_multiple);
  const ref::Tensor<T> w = padded(full_weight<T>(tied, vocab.v), tied, vp);
  const std::vector<int32_t> targets = targets_for(vocab.v);
  const std::vector<double> weights = row_weights();
  const TpSplit split = tied ? TpSplit::rows : TpSplit::columns;
  HeadRun<T> out{.loss = std::vector<std::vector<double>>(static_cast<std::size_t>(tp)),
                 .dy = std::vector<ref::Tensor<T>>(static_cast<std::size_t>(tp)),
                 .dweight = ref::Tensor<T>(w.shape())};
  std::vector<ref::Tensor<T>> dw_local(static_cast<std::size_t>(tp));
  sim::SimWorld(tp).run([&](comm::Communicator& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    const VocabShard shard = vocab_shard(vocab.v, tp, g.rank(), vocab.pad_multiple);
    const ref::Tensor<T> w_local = tp_slice(w, split, tp, g.rank());
    VocabHeadCache<T> cache;
    out.loss[r] = vocab_head_forward(g, y, w_local, tied, shard, targets, kMask, cache, planted);
    dw_local[r] = ref::Tensor<T>(w_local.shape());
    out.dy[r] = vocab_head_backward(g, y, w_local, tied, cache, weights, dw_local[r]);
  });
  for (int r = 0; r < tp; ++r) {
    tp_unslice(dw_local[static_cast<std::size_t>(r)], split, tp, r, out.dweight);
  }
  out.dweight = unpadded(out.dweight, tied, vocab.v, out.nonzero_padding);
  return out;
}

template <class T>
void check_head(int tp, bool tied, double tol, Vocab vocab = {}) {
  SCOPED_TRACE("tp " + std::to_string(tp) + (tied ? " tied" : " untied") + ", V " +
               std::to_string(vocab.v) + " padded to a multiple of tp x " +
               std::to_string(vocab.pad_multiple));
  const ref::Tensor<T> y = random_tensor<T>({kN, kH}, 7);
  const ref::Tensor<T> w = full_weight<T>(tied, vocab.v);
  const std::vector<int32_t> targets = targets_for(vocab.v);
  const ref::Tensor<T> logits = tied ? ref::linear_t_forward(y, w) : ref::linear_forward(y, w);
  const std::vector<double> want_loss = ref::cross_entropy_forward(logits, targets, kMask);
  const ref::Tensor<T> dlogits = ref::cross_entropy_backward(logits, targets, row_weights());
  ref::Tensor<T> want_dw(w.shape());
  const ref::Tensor<T> want_dy = tied ? ref::linear_t_backward(dlogits, y, w, want_dw)
                                      : ref::linear_backward(dlogits, y, w, want_dw);

  const HeadRun<T> got = run_head<T>(tp, tied, testing::Mutation::kNone, vocab);
  for (int r = 0; r < tp; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    // Identical on every TP rank.
    EXPECT_EQ(got.loss[ur], got.loss[0]) << "rank " << r;
    EXPECT_EQ(got.dy[ur].vec(), got.dy[0].vec()) << "rank " << r;
    EXPECT_LE(max_rel_err(got.loss[ur], want_loss), tol) << "rank " << r;
    EXPECT_LE(max_rel_err(got.dy[ur].vec(), want_dy.vec()), tol) << "rank " << r;
  }
  for (std::size_t i = 0; i < kMask.size(); ++i) {
    if (kMask[i]) {
      EXPECT_GT(got.loss[0][i], 0.0) << "row " << i;
    } else {
      EXPECT_EQ(got.loss[0][i], 0.0) << "masked row " << i;
    }
  }
  EXPECT_LE(max_rel_err(got.dweight.vec(), want_dw.vec()), tol);
  EXPECT_EQ(got.nonzero_padding, 0) << "the padding got a gradient";
}

TEST(VocabHead, ParallelCrossEntropyEqualsReferenceF64) {
  for (const int tp : {1, 2, 4}) {
    for (const bool tied : {true, false}) check_head<double>(tp, tied, 1e-12);
  }
}

TEST(VocabHead, ParallelCrossEntropyEqualsReferenceF32) {
  for (const int tp : {1, 2, 4}) {
    for (const bool tied : {true, false}) check_head<float>(tp, tied, 2e-6);
  }
}

// V = 23: tp 2 and 3 pad to 24; tp 4 x 8 pads to 32, rank 3 holding padding only (ids 24..31).
TEST(VocabHead, PaddedVocabularyEqualsTheUnpaddedReference) {
  for (const Vocab vocab : {Vocab{23, 1}, Vocab{23, 8}, Vocab{kV, 8}}) {
    for (const int tp : {1, 2, 3, 4}) {
      for (const bool tied : {true, false}) {
        check_head<double>(tp, tied, 1e-12, vocab);
        check_head<float>(tp, tied, 2e-6, vocab);
      }
    }
  }
}

// Planted bug: the padded (zero) logits enter the softmax: exp(0 - max) joins every row's sum,
// the loss moves, and the padded weights get a gradient.
TEST(VocabHead, UnmaskedPaddingIsCaught) {
  const Vocab vocab{23, 8};
  const ref::Tensor<double> y = random_tensor<double>({kN, kH}, 7);
  const std::vector<double> want = ref::cross_entropy_forward(
      ref::linear_t_forward(y, full_weight<double>(true, vocab.v)), targets_for(vocab.v), kMask);
  EXPECT_LE(max_rel_err(run_head<double>(2, true, testing::Mutation::kNone, vocab).loss[0], want),
            1e-12);
  const HeadRun<double> bad =
      run_head<double>(2, true, testing::Mutation::kVocabPadNotMasked, vocab);
  EXPECT_GT(max_rel_err(bad.loss[0], want), 1e-3);
  EXPECT_GT(bad.nonzero_padding, 0);
}

TEST(VocabHead, AtTpOneItIsBitwiseTheReference) {
  const ref::Tensor<double> y = random_tensor<double>({kN, kH}, 7);
  const ref::Tensor<double> w = full_weight<double>(true);
  const std::vector<double> want =
      ref::cross_entropy_forward(ref::linear_t_forward(y, w), kTargets, kMask);
  EXPECT_EQ(run_head<double>(1, true).loss[0], want);
}

// Planted bug: each rank keeps its own (mostly zero) target logit. The loss then depends on the
// rank and differs from the reference wherever the target lives on another shard; the parity check
// above must catch it.
TEST(VocabHead, TargetLogitNotReducedIsCaught) {
  const ref::Tensor<double> y = random_tensor<double>({kN, kH}, 7);
  const ref::Tensor<double> w = full_weight<double>(true);
  const std::vector<double> want =
      ref::cross_entropy_forward(ref::linear_t_forward(y, w), kTargets, kMask);
  {
    const testing::Mutation planted = testing::Mutation::kVocabTargetNotReduced;
    const HeadRun<double> bad = run_head<double>(2, true, planted);
    EXPECT_GT(max_rel_err(bad.loss[0], want), 1e-3);  // rank 0 lacks targets 17, 31
    EXPECT_GT(max_rel_err(bad.loss[1], want), 1e-3);  // rank 1 lacks targets 3, 8
    EXPECT_NE(bad.loss[0], bad.loss[1]);
    EXPECT_EQ(run_head<double>(1, true, planted).loss[0], want);  // tp 1: nothing to reduce
  }
  EXPECT_LE(max_rel_err(run_head<double>(2, true).loss[0], want), 1e-12);
}

TEST(VocabHead, ReportsTheHeadMatmulAsCompute) {
  sim::SimWorld world(2);
  const ref::Tensor<double> y = random_tensor<double>({kN, kH}, 7);
  const ref::Tensor<double> w = full_weight<double>(true);
  world.run([&](comm::Communicator& g) {
    const VocabShard shard = vocab_shard(kV, 2, g.rank());
    const ref::Tensor<double> w_local = tp_slice(w, TpSplit::rows, 2, g.rank());
    VocabHeadCache<double> cache;
    (void)vocab_head_forward(g, y, w_local, true, shard, kTargets, kMask, cache);
    ref::Tensor<double> dw(w_local.shape());
    (void)vocab_head_backward(g, y, w_local, true, cache, row_weights(), dw);
  });
  int forward = 0, backward = 0;
  for (const sim::TimelineEvent& e : world.timeline()) {
    forward += e.name == "vocab head forward";
    backward += e.name == "vocab head backward";
  }
  EXPECT_EQ(forward, 2);
  EXPECT_EQ(backward, 2);
  EXPECT_GT(world.virtual_time(), 0.0);
}

template <class T>
void check_embedding(int tp) {
  SCOPED_TRACE("tp " + std::to_string(tp));
  const ref::Tensor<T> table = random_tensor<T>({kV, kH}, 21);
  const std::vector<int32_t> tokens = {0, 31, 8, 8, 16, 23, 7, 24};  // shard edges, a repeat
  const auto n = static_cast<int64_t>(tokens.size());
  const ref::Tensor<T> dy = random_tensor<T>({n, kH}, 22);
  const ref::Tensor<T> want_y = ref::embedding_forward(table, tokens);
  ref::Tensor<T> want_dtable(table.shape());
  ref::embedding_backward(dy, tokens, want_dtable);

  std::vector<ref::Tensor<T>> ys(static_cast<std::size_t>(tp)), dts(static_cast<std::size_t>(tp));
  sim::SimWorld(tp).run([&](comm::Communicator& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    const VocabShard shard = vocab_shard(kV, tp, g.rank());
    const ref::Tensor<T> local = tp_slice(table, TpSplit::rows, tp, g.rank());
    ys[r] = vocab_embed_forward(local, shard, tokens);
    all_reduce_sum(g, ys[r]);
    dts[r] = ref::Tensor<T>(local.shape());
    vocab_embed_backward(dy, shard, tokens, dts[r]);
  });
  ref::Tensor<T> dtable(table.shape());
  for (int r = 0; r < tp; ++r) {
    // A sum of one row and zeros: exact.
    EXPECT_EQ(ys[static_cast<std::size_t>(r)].vec(), want_y.vec()) << "rank " << r;
    tp_unslice(dts[static_cast<std::size_t>(r)], TpSplit::rows, tp, r, dtable);
  }
  EXPECT_EQ(dtable.vec(), want_dtable.vec());
}

TEST(VocabEmbed, ReducedForwardAndShardedBackwardEqualReference) {
  for (const int tp : {1, 2, 4}) {
    check_embedding<double>(tp);
    check_embedding<float>(tp);
  }
}

TEST(VocabEmbed, PartialSumHasZeroRowsOutsideTheShard) {
  const ref::Tensor<double> local = random_tensor<double>({8, kH}, 3);
  const std::vector<int32_t> tokens = {7, 8, 15, 16};
  const ref::Tensor<double> y =
      vocab_embed_forward(local, {.offset = 8, .size = 8, .real = 8}, tokens);
  for (int64_t c = 0; c < kH; ++c) {
    EXPECT_EQ(y.at(0, c), 0.0);
    EXPECT_EQ(y.at(1, c), local.at(0, c));
    EXPECT_EQ(y.at(2, c), local.at(7, c));
    EXPECT_EQ(y.at(3, c), 0.0);
  }
}

TEST(VocabLayout, AnIndivisibleVocabIsPaddedAsMegatronPadsIt) {
  EXPECT_THROW(tp_slice(random_tensor<double>({kV, kH}, 1), TpSplit::rows, 3, 1), LayoutError);
  EXPECT_THROW(vocab_shard(kV, 0, 0), LayoutError);
  EXPECT_THROW(vocab_shard(kV, 2, 0, 0), LayoutError);
  auto shard = [](int64_t v, int tp, int rank, int multiple) {
    const VocabShard s = vocab_shard(v, tp, rank, multiple);
    return std::vector<int64_t>{s.offset, s.size, s.real};
  };
  EXPECT_EQ(shard(kV, 4, 3, 1), (std::vector<int64_t>{24, 8, 8}));    // divisible: no padding
  EXPECT_EQ(shard(kV, 3, 2, 1), (std::vector<int64_t>{22, 11, 10}));  // 32 -> 33
  EXPECT_EQ(shard(23, 4, 2, 8), (std::vector<int64_t>{16, 8, 7}));    // 23 -> 32
  EXPECT_EQ(shard(23, 4, 3, 8), (std::vector<int64_t>{24, 8, 0}));    // padding only
  // Llama 3 under Megatron's default (make-vocab-size-divisible-by 128) at tp 8: 129,024 ids.
  EXPECT_EQ(shard(128256, 8, 7, 128), (std::vector<int64_t>{112896, 16128, 15360}));
}

// Tokens past V (in the padding) read no row: the embedding of a rank holding padding is zero.
TEST(VocabEmbed, PaddingRowsAreNeverRead) {
  const ref::Tensor<double> local = random_tensor<double>({8, kH}, 3);
  const std::vector<int32_t> tokens = {16, 22, 23, 31};
  const ref::Tensor<double> y =
      vocab_embed_forward(local, {.offset = 16, .size = 8, .real = 7}, tokens);
  for (int64_t c = 0; c < kH; ++c) {
    EXPECT_EQ(y.at(0, c), local.at(0, c));
    EXPECT_EQ(y.at(1, c), local.at(6, c));
    EXPECT_EQ(y.at(2, c), 0.0);
    EXPECT_EQ(y.at(3, c), 0.0);
  }
}

RC_GTEST_PROP(TpSlice, SlicesTileTheTensorAndUnsliceInvertsThem, ()) {
  const int tp = *rc::gen::inRange(1, 5);
  const int64_t rows = tp * *rc::gen::inRange<int64_t>(1, 5);
  const int64_t cols = tp * *rc::gen::inRange<int64_t>(1, 5);
  const auto split = *rc::gen::element(TpSplit::replicated, TpSplit::rows, TpSplit::columns);
  const bool one_d = split != TpSplit::columns && *rc::gen::arbitrary<bool>();
  const ref::Shape shape = one_d ? ref::Shape{rows} : ref::Shape{rows, cols};
  const auto full = random_tensor<float>(shape, *rc::gen::arbitrary<unsigned>());
  ref::Tensor<float> back(shape);
  int64_t elements = 0;
  for (int r = 0; r < tp; ++r) {
    const ref::Tensor<float> local = tp_slice(full, split, tp, r);
    elements += local.numel();
    if (split == TpSplit::rows) RC_ASSERT(local.dim(0) == rows / tp);
    if (split == TpSplit::columns) RC_ASSERT(local.dim(1) == cols / tp);
    for (int64_t i = 0; i < local.numel(); ++i) {  // element (i) of the slice in the full tensor
      const int64_t c = split == TpSplit::columns ? i % (cols / tp) + r * (cols / tp) : 0;
      const int64_t at = split == TpSplit::columns ? (i / (cols / tp)) * cols + c
                         : split == TpSplit::rows  ? r * local.numel() + i
                                                   : i;
      RC_ASSERT(local[i] == full[at]);
    }
    tp_unslice(local, split, tp, r, back);
  }
  RC_ASSERT(elements == (split == TpSplit::replicated ? tp : 1) * full.numel());
  RC_ASSERT(back.vec() == full.vec());
  RC_ASSERT(back.shape() == full.shape());
}

TEST(TpSlice, ShapeMismatchesAreErrors) {
  const ref::Tensor<double> full({4, 6});
  EXPECT_THROW(tp_slice(full, TpSplit::columns, 4, 0), LayoutError);  // 6 % 4
  EXPECT_THROW(tp_slice(ref::Tensor<double>({8}), TpSplit::columns, 2, 0), LayoutError);
  EXPECT_THROW(tp_slice(full, TpSplit::rows, 2, 2), LayoutError);  // rank outside tp
  ref::Tensor<double> target({4, 6});
  EXPECT_THROW(tp_unslice(ref::Tensor<double>({4, 2}), TpSplit::rows, 2, 0, target), LayoutError);
  tp_unslice(ref::Tensor<double>({4, 3}, 1.0), TpSplit::columns, 2, 1, target);
  EXPECT_EQ(target.at(0, 2), 0.0);
  EXPECT_EQ(target.at(3, 3), 1.0);
}

}  // namespace
}  // namespace shardcheck::parallel
