// Deterministic synthetic data: a corpus of variable-length documents with learnable structure,
// packing into fixed-length sequences (doc ids, positions, targets, loss mask), and a distributed
// sampler with a resumable cursor. No file I/O and no tokenizer.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "reference/batch.hpp"
#include "reference/config.hpp"

namespace shardcheck::ref {

// Document d (0-based) of the corpus, tokens in [1, vocab) (0 is the padding token):
//   length  = min_len + RngStream::of(seed, "data/length").below(d, max_len - min_len + 1)
//   stride  = 1 + RngStream::of(seed, "data/stride").below(d, 3)
//   token 0 = 1 + RngStream::of(seed, "data/token").below(d << 32 | 0, vocab - 1)
//   token t = with probability 0.1 (RngStream::of(seed, "data/noise").uniform(d << 32 | t) < 0.1)
//             1 + RngStream::of(seed, "data/token").below(d << 32 | t, vocab - 1), otherwise
//             1 + (token[t-1] - 1 + stride) mod (vocab - 1).
// A model can learn the rule in context (infer the stride), so the loss falls clearly.
std::vector<int32_t> make_document(const DataConfig& data, int vocab, uint64_t seed, int64_t doc);

// Packing. packing = true: documents are concatenated into one token stream and sequence i is
// stream[i*S, (i+1)*S); the last sequence is padded. packing = false: each document starts its own
// sequence (truncated to S, padded). In both, doc_id = the document's corpus index, position = the
// token's offset inside its document, target = the next token of the same document with mask 1
// (it may lie in the next sequence), and mask 0 on a document's last token and on padding.
std::vector<Sequence> pack_documents(const std::vector<std::vector<int32_t>>& docs, int seq_len,
                                     bool packing);

struct Dataset {
  std::vector<Sequence> samples;
  int64_t documents = 0;
  int64_t tokens = 0;  // non-padding tokens
};

Dataset build_dataset(const DataConfig& data, const ModelConfig& model, uint64_t seed);

// Where the sampler stands: everything needed to resume exactly.
struct SamplerState {
  int64_t epoch = 0;
  int64_t offset = 0;     // samples of this epoch's permutation already consumed
  int64_t steps = 0;      // global batches produced
  int64_t padded = 0;     // wrap-around samples so far (pad policy)
  bool drop_last = true;  // the policy, recorded so a restore can refuse a different one
};

// Each epoch draws a permutation of [0, N) (Fisher-Yates with RngStream::of(seed,
// "sampler/shuffle", epoch).below(i, i + 1) for i = N-1 .. 1). Global batch b takes the next B
// entries. drop_last: a remainder shorter than B is skipped and the next epoch starts; otherwise
// the remainder is completed ("padded") from the start of the same permutation. DP rank r of D gets
// the contiguous slice [r*B/D, (r+1)*B/D) of each global batch, so ranks are disjoint and their
// union is the global batch whatever D is.
class DistributedSampler {
 public:
  DistributedSampler(int64_t num_samples, int64_t global_batch, uint64_t seed, bool drop_last);

  std::vector<int64_t> permutation(int64_t epoch) const;
  std::vector<int64_t> next_global_batch();
  static std::vector<int64_t> rank_slice(const std::vector<int64_t>& global_batch, int rank,
                                         int world);

  const SamplerState& state() const { return state_; }
  // Throws std::logic_error if the saved policy differs from this sampler's.
  void restore(const SamplerState& state);
  bool drop_last() const { return state_.drop_last; }
  int64_t padded_samples() const { return state_.padded; }

 private:
  int64_t n_;
  int64_t batch_;
  uint64_t seed_;
  SamplerState state_;
};

// Gathers the given samples; sample_ids[i] gets Sequence::index = first_index + i, its position in
// the step's global batch (it keys dropout). A DP rank gathering its slice
// (DistributedSampler::rank_slice) passes the slice's offset, rank * B / D, so its sequences keep
// their global indices; gathering the whole global batch uses first_index = 0.
Batch gather_batch(const Dataset& data, const std::vector<int64_t>& sample_ids,
                   int64_t first_index = 0);

// A batch source over a dataset and sampler (both must outlive it). The sampler is a cursor, not
// random access: the batch for step n is the sampler's global batch n (1-based, counted by
// SamplerState::steps, so a restored sampler continues a resumed Trainer), and asking for any other
// step than state().steps + 1 throws std::logic_error.
std::function<Batch(int)> sampler_batch_source(const Dataset& data, DistributedSampler& sampler);

}  // namespace shardcheck::ref
