// Synthetic corpus, packing and sampler exactly as data.hpp specifies; every draw is counter-based
// so a rank can build any document or any epoch's permutation without the others.
#include "reference/data.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "reference/check.hpp"
#include "reference/rng.hpp"

namespace shardcheck::ref {

std::vector<int32_t> make_document(const DataConfig& data, int vocab, uint64_t seed, int64_t doc) {
  REF_CHECK(vocab >= 3, "vocab too small for synthetic data");
  const auto d = static_cast<uint64_t>(doc);
  const auto span = static_cast<uint64_t>(data.max_len - data.min_len + 1);
  const int64_t len =
      data.min_len + static_cast<int64_t>(RngStream::of(seed, "data/length").below(d, span));
  const auto stride = static_cast<int32_t>(1 + RngStream::of(seed, "data/stride").below(d, 3));
  const RngStream token = RngStream::of(seed, "data/token");
  const RngStream noise = RngStream::of(seed, "data/noise");
  const auto v1 = static_cast<uint64_t>(vocab - 1);
  std::vector<int32_t> out(static_cast<size_t>(len));
  for (int64_t t = 0; t < len; ++t) {
    const uint64_t idx = (d << 32) | static_cast<uint64_t>(t);
    if (t == 0 || noise.uniform(idx) < 0.1) {
      out[static_cast<size_t>(t)] = 1 + static_cast<int32_t>(token.below(idx, v1));
    } else {
      out[static_cast<size_t>(t)] =
          1 + (out[static_cast<size_t>(t - 1)] - 1 + stride) % (vocab - 1);
    }
  }
  return out;
}

namespace {
struct StreamToken {
  int32_t token, doc, pos, target, mask;
};

Sequence padded_sequence(int seq_len) {
  Sequence s;
  const auto n = static_cast<size_t>(seq_len);
  s.tokens.assign(n, 0);
  s.targets.assign(n, 0);
  s.loss_mask.assign(n, 0);
  s.doc_ids.assign(n, -1);
  s.positions.assign(n, 0);
  return s;
}

void put(Sequence& s, size_t i, const StreamToken& t) {
  s.tokens[i] = t.token;
  s.targets[i] = t.target;
  s.loss_mask[i] = t.mask;
  s.doc_ids[i] = t.doc;
  s.positions[i] = t.pos;
}

std::vector<StreamToken> document_stream(const std::vector<int32_t>& doc, int32_t id) {
  std::vector<StreamToken> out;
  for (size_t t = 0; t < doc.size(); ++t) {
    const bool last = t + 1 == doc.size();
    out.push_back({doc[t], id, static_cast<int32_t>(t), last ? 0 : doc[t + 1], last ? 0 : 1});
  }
  return out;
}
}  // namespace

std::vector<Sequence> pack_documents(const std::vector<std::vector<int32_t>>& docs, int seq_len,
                                     bool packing) {
  std::vector<Sequence> out;
  const auto s = static_cast<size_t>(seq_len);
  if (packing) {
    std::vector<StreamToken> stream;
    for (size_t d = 0; d < docs.size(); ++d) {
      auto part = document_stream(docs[d], static_cast<int32_t>(d));
      stream.insert(stream.end(), part.begin(), part.end());
    }
    for (size_t begin = 0; begin < stream.size(); begin += s) {
      Sequence seq = padded_sequence(seq_len);
      for (size_t i = 0; i < s && begin + i < stream.size(); ++i) put(seq, i, stream[begin + i]);
      out.push_back(std::move(seq));
    }
  } else {
    for (size_t d = 0; d < docs.size(); ++d) {
      const auto part = document_stream(docs[d], static_cast<int32_t>(d));
      Sequence seq = padded_sequence(seq_len);
      for (size_t i = 0; i < s && i < part.size(); ++i) put(seq, i, part[i]);
      out.push_back(std::move(seq));
    }
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].sample = static_cast<int64_t>(i);
  return out;
}

Dataset build_dataset(const DataConfig& data, const ModelConfig& model, uint64_t seed) {
  data.validate(model.vocab);
  std::vector<std::vector<int32_t>> docs;
  Dataset ds;
  for (int64_t d = 0; d < data.documents; ++d) {
    docs.push_back(make_document(data, model.vocab, seed, d));
  }
  ds.samples = pack_documents(docs, model.seq_len, data.packing);
  ds.documents = data.documents;
  for (const auto& s : ds.samples)
    for (int32_t id : s.doc_ids) ds.tokens += id >= 0;
  return ds;
}

DistributedSampler::DistributedSampler(int64_t num_samples, int64_t global_batch, uint64_t seed,
                                       bool drop_last)
    : n_(num_samples), batch_(global_batch), seed_(seed) {
  state_.drop_last = drop_last;
  REF_CHECK(global_batch > 0 && global_batch <= num_samples,
            "global batch must be in [1, number of samples]");
}

std::vector<int64_t> DistributedSampler::permutation(int64_t epoch) const {
  std::vector<int64_t> p(static_cast<size_t>(n_));
  std::iota(p.begin(), p.end(), int64_t{0});
  const RngStream rng = RngStream::of(seed_, "sampler/shuffle", static_cast<uint32_t>(epoch));
  for (int64_t i = n_ - 1; i > 0; --i) {
    const auto j =
        static_cast<int64_t>(rng.below(static_cast<uint64_t>(i), static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

std::vector<int64_t> DistributedSampler::next_global_batch() {
  if (state_.offset >= n_ || (state_.drop_last && state_.offset + batch_ > n_)) {
    ++state_.epoch;
    state_.offset = 0;
  }
  const std::vector<int64_t> perm = permutation(state_.epoch);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < batch_; ++i) {
    const int64_t at = state_.offset + i;
    if (at < n_) {
      out.push_back(perm[static_cast<size_t>(at)]);
    } else {
      out.push_back(perm[static_cast<size_t>(at - n_)]);
      ++state_.padded;
    }
  }
  state_.offset += batch_;
  ++state_.steps;
  return out;
}

void DistributedSampler::restore(const SamplerState& state) {
  REF_CHECK(state.drop_last == state_.drop_last, "sampler state was saved with another policy");
  state_ = state;
}

std::vector<int64_t> DistributedSampler::rank_slice(const std::vector<int64_t>& global_batch,
                                                    int rank, int world) {
  const auto b = static_cast<int64_t>(global_batch.size());
  REF_CHECK(world > 0 && b % world == 0, "global batch must divide evenly over DP ranks");
  const int64_t per = b / world;
  return {global_batch.begin() + rank * per, global_batch.begin() + (rank + 1) * per};
}

Batch gather_batch(const Dataset& data, const std::vector<int64_t>& sample_ids,
                   int64_t first_index) {
  REF_CHECK(first_index >= 0, "first_index must be >= 0");
  Batch b;
  for (size_t i = 0; i < sample_ids.size(); ++i) {
    Sequence s = data.samples.at(static_cast<size_t>(sample_ids[i]));
    s.index = first_index + static_cast<int64_t>(i);
    b.push_back(std::move(s));
  }
  return b;
}

std::function<Batch(int)> sampler_batch_source(const Dataset& data, DistributedSampler& sampler) {
  return [&data, &sampler](int step) {
    REF_CHECK(step == sampler.state().steps + 1,
              "sampler_batch_source: step " + std::to_string(step) +
                  " requested, but the sampler's next global batch is step " +
                  std::to_string(sampler.state().steps + 1));
    return gather_batch(data, sampler.next_global_batch());
  };
}

}  // namespace shardcheck::ref
