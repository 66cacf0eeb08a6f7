// Synthetic data, packing and sampler: structure of packed sequences, loss-mask and padding
// invariance, packing invariance, and the distributed sampler's disjointness and resumability.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "reference/data.hpp"
#include "tests/reference/checks.hpp"

namespace shardcheck::ref {
namespace {

TEST(Corpus, DocumentsAreDeterministicAndInRange) {
  DataConfig data;
  for (int64_t d = 0; d < 50; ++d) {
    const auto doc = make_document(data, 32, 3, d);
    EXPECT_EQ(doc, make_document(data, 32, 3, d));
    EXPECT_GE(static_cast<int>(doc.size()), data.min_len);
    EXPECT_LE(static_cast<int>(doc.size()), data.max_len);
    for (int32_t t : doc) {
      EXPECT_GE(t, 1);
      EXPECT_LT(t, 32);
    }
  }
  EXPECT_NE(make_document(data, 32, 3, 0), make_document(data, 32, 4, 0));
}

TEST(Corpus, MostTransitionsFollowTheDocumentsStride) {
  DataConfig data;
  int follow = 0, total = 0;
  for (int64_t d = 0; d < 100; ++d) {
    const auto doc = make_document(data, 32, 3, d);
    std::map<int, int> strides;
    for (size_t t = 1; t < doc.size(); ++t) ++strides[((doc[t] - doc[t - 1]) % 31 + 31) % 31];
    int best = 0;
    for (auto [s, n] : strides) best = std::max(best, n);
    follow += best;
    total += static_cast<int>(doc.size()) - 1;
  }
  EXPECT_GT(static_cast<double>(follow) / total, 0.85);
}

TEST(Packing, TargetsMaskPositionsAndPadding) {
  const std::vector<std::vector<int32_t>> docs = {{5, 6, 7}, {9, 10, 11, 12, 13}, {2, 3}};
  const Batch seqs = pack_documents(docs, 4, true);
  ASSERT_EQ(seqs.size(), 3u);  // 10 tokens -> 4 + 4 + 2 (padded)
  EXPECT_EQ(seqs[0].tokens, (std::vector<int32_t>{5, 6, 7, 9}));
  EXPECT_EQ(seqs[0].targets, (std::vector<int32_t>{6, 7, 0, 10}));
  EXPECT_EQ(seqs[0].loss_mask, (std::vector<int32_t>{1, 1, 0, 1}));
  EXPECT_EQ(seqs[0].doc_ids, (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(seqs[0].positions, (std::vector<int32_t>{0, 1, 2, 0}));
  // Document 1 continues in sequence 1 with its true offsets; its last token has no target.
  EXPECT_EQ(seqs[1].tokens, (std::vector<int32_t>{10, 11, 12, 13}));
  EXPECT_EQ(seqs[1].positions, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(seqs[1].loss_mask, (std::vector<int32_t>{1, 1, 1, 0}));
  EXPECT_EQ(seqs[2].tokens, (std::vector<int32_t>{2, 3, 0, 0}));
  EXPECT_EQ(seqs[2].doc_ids, (std::vector<int32_t>{2, 2, -1, -1}));
  EXPECT_EQ(seqs[2].loss_mask, (std::vector<int32_t>{1, 0, 0, 0}));

  const Batch unpacked = pack_documents(docs, 4, false);
  ASSERT_EQ(unpacked.size(), 3u);
  EXPECT_EQ(unpacked[0].tokens, (std::vector<int32_t>{5, 6, 7, 0}));
  EXPECT_EQ(unpacked[1].tokens, (std::vector<int32_t>{9, 10, 11, 12}));
  EXPECT_EQ(unpacked[1].loss_mask, (std::vector<int32_t>{1, 1, 1, 1}));  // 12 -> 13 is in-document
}

TEST(Packing, TwoDocumentsInOneSequenceEqualEachAlone) {
  EXPECT_LT(test::packing_invariance_error(test::tiny_dense()), 1e-12);
  ModelConfig moe = test::tiny_moe();
  moe.moe->capacity_factor = 8.0;  // capacity couples tokens of a sequence; here it never binds
  EXPECT_LT(test::packing_invariance_error(moe), 1e-12);
}

TEST(Invariance, PaddingAndMaskedTargetsChangeNothing) {
  const ModelConfig cfg = test::tiny_moe();
  Batch batch = test::tiny_batch(cfg, 2);
  batch[1] = pack_documents({{3, 4, 5, 6, 7}}, cfg.seq_len, false)[0];  // mostly padding
  batch[1].index = 1;
  const ParamMap<double> params = test::random_params(cfg, 5);
  const StepContext ctx = test::global_context(batch);
  ParamMap<double> g1 = params.zeros_like(), g2 = params.zeros_like();
  const LossParts a = forward_backward(cfg, params, std::span<const Sequence>(batch), ctx, &g1);
  Batch changed = batch;
  for (size_t t = 5; t < changed[1].tokens.size(); ++t) changed[1].tokens[t] = 17;  // padding
  for (auto& s : changed)
    for (size_t t = 0; t < s.tokens.size(); ++t)
      if (!s.loss_mask[t]) s.targets[t] = 9;  // targets nobody should read
  const LossParts b = forward_backward(cfg, params, std::span<const Sequence>(changed), ctx, &g2);
  EXPECT_EQ(a.loss(), b.loss());
  for (const auto& e : g1) EXPECT_EQ(e.value.vec(), g2[e.name].vec()) << e.name;
}

TEST(Dataset, CountsTokensAndSamples) {
  ModelConfig model = test::tiny_dense();
  DataConfig data;
  data.documents = 40;
  const Dataset ds = build_dataset(data, model, 2);
  int64_t tokens = 0;
  for (int64_t d = 0; d < 40; ++d)
    tokens += static_cast<int64_t>(make_document(data, model.vocab, 2, d).size());
  EXPECT_EQ(ds.tokens, tokens);
  EXPECT_EQ(static_cast<int64_t>(ds.samples.size()), (tokens + model.seq_len - 1) / model.seq_len);
}

TEST(Sampler, EpochIsAPermutation) {
  const DistributedSampler s(37, 4, 9, true);
  auto p = s.permutation(0);
  EXPECT_NE(p, s.permutation(1));
  std::sort(p.begin(), p.end());
  for (int64_t i = 0; i < 37; ++i) EXPECT_EQ(p[static_cast<size_t>(i)], i);
}

RC_GTEST_PROP(Sampler, RanksAreDisjointAndCoverTheGlobalBatch, ()) {
  const int world = *rc::gen::element(1, 2, 3, 4, 6);
  const int per_rank = *rc::gen::inRange(1, 4);
  const int64_t n = *rc::gen::inRange<int64_t>(world * per_rank, 60);
  const bool drop_last = *rc::gen::arbitrary<bool>();
  DistributedSampler s(n, world * per_rank, 7, drop_last);
  for (int step = 0; step < 5; ++step) {
    const auto global = s.next_global_batch();
    std::set<int64_t> seen;
    for (int r = 0; r < world; ++r)
      for (int64_t id : DistributedSampler::rank_slice(global, r, world))
        RC_ASSERT(seen.insert(id).second);
    RC_ASSERT(seen == std::set<int64_t>(global.begin(), global.end()));
  }
}

TEST(Sampler, DropLastSkipsTheRemainderAndPadWrapsAround) {
  DistributedSampler drop(10, 4, 1, true);
  drop.next_global_batch();
  drop.next_global_batch();
  const auto third = drop.next_global_batch();  // only 2 left in epoch 0: skipped
  EXPECT_EQ(drop.state().epoch, 1);
  const auto p1 = drop.permutation(1);
  EXPECT_EQ(third, std::vector<int64_t>(p1.begin(), p1.begin() + 4));

  DistributedSampler pad(10, 4, 1, false);
  pad.next_global_batch();
  pad.next_global_batch();
  const auto last = pad.next_global_batch();  // 2 remaining + 2 from the start of epoch 0
  const auto p0 = pad.permutation(0);
  EXPECT_EQ(last, (std::vector<int64_t>{p0[8], p0[9], p0[0], p0[1]}));
  EXPECT_EQ(pad.padded_samples(), 2);
  EXPECT_EQ(pad.next_global_batch()[0], pad.permutation(1)[0]);
}

TEST(Sampler, RefusesAStateSavedUnderAnotherPolicy) {
  DistributedSampler pad(10, 4, 1, false);
  DistributedSampler drop(10, 4, 1, true);
  EXPECT_THROW(drop.restore(pad.state()), std::logic_error);
}

TEST(GatherBatch, DpSlicesKeepTheirGlobalIndices) {
  const ModelConfig cfg = test::tiny_dense();
  DataConfig data;
  data.documents = 40;
  const Dataset ds = build_dataset(data, cfg, 2);
  DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), 4, 2, true);
  const std::vector<int64_t> global = sampler.next_global_batch();
  const Batch full = gather_batch(ds, global);
  Batch split;
  for (int r = 0; r < 2; ++r) {
    const Batch part =
        gather_batch(ds, DistributedSampler::rank_slice(global, r, 2), int64_t{r} * 4 / 2);
    split.insert(split.end(), part.begin(), part.end());
  }
  ASSERT_EQ(split.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(full[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(split[i].index, full[i].index);
    EXPECT_EQ(split[i].sample, full[i].sample);
    EXPECT_EQ(split[i].tokens, full[i].tokens);
  }
  // The second half gathered without its offset would carry rank-local indices 0, 1: the trainer
  // refuses such a batch instead of keying dropout by them.
  Batch wrong = gather_batch(ds, DistributedSampler::rank_slice(global, 0, 2));
  const Batch local = gather_batch(ds, DistributedSampler::rank_slice(global, 1, 2));
  wrong.insert(wrong.end(), local.begin(), local.end());
  EXPECT_EQ(wrong[2].index, 0);
  TrainConfig train;
  train.steps = 1;
  train.global_batch = 4;
  train.micro_batch = 2;
  Trainer t(cfg, train, 3);
  EXPECT_THROW(t.step(wrong), std::logic_error);
  EXPECT_EQ(t.steps_done(), 0);
  EXPECT_NO_THROW(t.step(split));
}

TEST(GatherBatch, SamplerSourceServesStepsInOrderOnly) {
  const ModelConfig cfg = test::tiny_dense();
  DataConfig data;
  data.documents = 40;
  const Dataset ds = build_dataset(data, cfg, 2);
  DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), 4, 2, true);
  DistributedSampler twin(static_cast<int64_t>(ds.samples.size()), 4, 2, true);
  const auto source = sampler_batch_source(ds, sampler);
  EXPECT_THROW(source(2), std::logic_error);  // the cursor is at step 1
  EXPECT_EQ(source(1)[0].sample, gather_batch(ds, twin.next_global_batch())[0].sample);
  EXPECT_EQ(source(2)[3].sample, gather_batch(ds, twin.next_global_batch())[3].sample);
  EXPECT_THROW(source(2), std::logic_error);  // already served
  EXPECT_EQ(sampler.state().steps, 2);
}

RC_GTEST_PROP(Packing, EveryPackedSequenceIsConsistent, ()) {
  const int seq_len = *rc::gen::inRange(2, 20);
  const bool packing = *rc::gen::arbitrary<bool>();
  const auto docs = *rc::gen::container<std::vector<std::vector<int32_t>>>(
      rc::gen::nonEmpty(rc::gen::container<std::vector<int32_t>>(rc::gen::inRange(1, 50))));
  const Batch seqs = pack_documents(docs, seq_len, packing);
  int64_t real = 0, total = 0;
  for (const auto& d : docs) total += static_cast<int64_t>(d.size());
  for (const Sequence& s : seqs) {
    RC_ASSERT(static_cast<int>(s.tokens.size()) == seq_len);
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      const int32_t doc = s.doc_ids[t];
      if (doc < 0) {
        RC_ASSERT(s.loss_mask[t] == 0 && s.tokens[t] == 0);
        continue;
      }
      ++real;
      const auto& d = docs[static_cast<size_t>(doc)];
      const auto pos = static_cast<size_t>(s.positions[t]);
      RC_ASSERT(d.at(pos) == s.tokens[t]);  // position = offset inside its own document
      RC_ASSERT(s.loss_mask[t] == (pos + 1 < d.size() ? 1 : 0));
      if (s.loss_mask[t]) RC_ASSERT(s.targets[t] == d[pos + 1]);
      if (t > 0 && s.doc_ids[t - 1] == doc) RC_ASSERT(s.positions[t - 1] + 1 == s.positions[t]);
    }
  }
  if (packing) RC_ASSERT(real == total);  // nothing lost (unpacked mode truncates)
}

TEST(Sampler, ResumesFromItsState) {
  DistributedSampler a(23, 5, 4, true);
  for (int i = 0; i < 7; ++i) a.next_global_batch();
  const SamplerState saved = a.state();
  std::vector<std::vector<int64_t>> expect;
  for (int i = 0; i < 6; ++i) expect.push_back(a.next_global_batch());
  DistributedSampler b(23, 5, 4, true);
  b.restore(saved);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(b.next_global_batch(), expect[static_cast<size_t>(i)]);
}

}  // namespace
}  // namespace shardcheck::ref
