// Helpers shared by the reference tests: random tensors, finite-difference gradient checks, tiny
// model configs. Test code only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "reference/config.hpp"
#include "reference/rng.hpp"
#include "reference/tensor.hpp"

namespace shardcheck::ref::test {

// Sanitizer builds are Debug and ~300x slower; long learning runs skip there (the code paths they
// use are covered by the shorter tests, which do run under the sanitizers).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

inline Tensor<double> random_tensor(Shape shape, uint64_t seed, double scale = 1.0,
                                    double offset = 0.0) {
  Tensor<double> t(std::move(shape));
  const RngStream rng = RngStream::of(seed, "test");
  for (int64_t i = 0; i < t.numel(); ++i)
    t[i] = offset + scale * rng.normal(static_cast<uint64_t>(i));
  return t;
}

inline double dot(const Tensor<double>& a, const Tensor<double>& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a[i] * b[i];
  return s;
}

// The flat indices a finite-difference check perturbs. All of them when numel <= max_elems;
// otherwise, viewing the tensor as [rows, cols] (cols = last dim): in row r the column
// (offset + 7 r) mod cols, in column c the row (offset + 5 c) mod rows, plus max_elems elements
// spread evenly from `offset`. So every row and every column is perturbed at least once, and
// tensors checked with different offsets sample different elements.
inline std::vector<int64_t> fd_sample(const Shape& shape, int64_t max_elems, int64_t offset = 0) {
  const int64_t n = numel_of(shape);
  std::vector<int64_t> out;
  if (n <= max_elems) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  const int64_t cols = shape.empty() ? 1 : shape.back();
  const int64_t rows = n / cols;
  std::vector<uint8_t> pick(static_cast<size_t>(n), 0);
  offset = ((offset % n) + n) % n;
  for (int64_t r = 0; r < rows; ++r)
    pick[static_cast<size_t>(r * cols + (offset + 7 * r) % cols)] = 1;
  for (int64_t c = 0; c < cols; ++c)
    pick[static_cast<size_t>(((offset + 5 * c) % rows) * cols + c)] = 1;
  const int64_t stride = std::max<int64_t>(1, n / std::max<int64_t>(1, max_elems));
  for (int64_t k = 0; k < max_elems; ++k) pick[static_cast<size_t>((offset + k * stride) % n)] = 1;
  for (int64_t i = 0; i < n; ++i)
    if (pick[static_cast<size_t>(i)]) out.push_back(i);
  return out;
}

// Central-difference check of `analytic` = d loss / d x. Returns
// max_i |analytic_i - numeric_i| / max_i |numeric_i| over the elements fd_sample picks (all of
// them when x has at most max_elems elements).
inline double fd_rel_error(Tensor<double>& x, const Tensor<double>& analytic,
                           const std::function<double()>& loss, int64_t max_elems = 1 << 30,
                           double h = 1e-5, int64_t offset = 0) {
  double max_diff = 0.0, max_num = 0.0;
  for (const int64_t i : fd_sample(x.shape(), max_elems, offset)) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double num = (up - down) / (2 * h);
    max_diff = std::max(max_diff, std::abs(num - analytic[i]));
    max_num = std::max(max_num, std::abs(num));
  }
  return max_num > 0 ? max_diff / max_num : max_diff;
}

inline ModelConfig tiny_dense() {
  ModelConfig c;
  c.vocab = 32;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 32;
  c.seq_len = 12;
  return c;
}

inline ModelConfig tiny_moe() {
  ModelConfig c = tiny_dense();
  c.moe = MoeConfig{.experts = 4, .top_k = 2, .capacity_factor = 1.0, .every = 2, .aux_loss = 0.01};
  return c;
}

}  // namespace shardcheck::ref::test

#include "reference/batch.hpp"
#include "reference/data.hpp"
#include "reference/model.hpp"

namespace shardcheck::ref::test {

// A few packed sequences of short documents (several documents per sequence, padding at the end).
inline Batch tiny_batch(const ModelConfig& cfg, int sequences, uint64_t seed = 5) {
  DataConfig data;
  data.min_len = 3;
  data.max_len = 9;
  std::vector<std::vector<int32_t>> docs;
  int64_t total = 0;
  for (int64_t d = 0; total < int64_t{sequences} * cfg.seq_len - 4; ++d) {
    docs.push_back(make_document(data, cfg.vocab, seed, d));
    total += static_cast<int64_t>(docs.back().size());
  }
  Batch b = pack_documents(docs, cfg.seq_len, true);
  b.resize(static_cast<size_t>(sequences));
  for (size_t i = 0; i < b.size(); ++i) b[i].index = static_cast<int64_t>(i);
  return b;
}

// Parameters far from their init scale, so every nonlinearity is exercised by gradient checks.
inline ParamMap<double> random_params(const ModelConfig& cfg, uint64_t seed) {
  ParamMap<double> p = init_params<double>(cfg, seed);
  uint64_t k = seed * 1000;
  for (auto& e : p) {
    const bool norm = e.value.rank() == 1;
    e.value = random_tensor(e.value.shape(), ++k, norm ? 0.2 : 0.4, norm ? 1.0 : 0.0);
  }
  return p;
}

inline StepContext global_context(std::span<const Sequence> batch) {
  StepContext ctx;
  int64_t tokens = 0;
  for (const auto& s : batch) tokens += s.mask_count();
  ctx.token_weight = 1.0 / static_cast<double>(tokens);
  ctx.sequence_weight = 1.0 / static_cast<double>(batch.size());
  return ctx;
}

}  // namespace shardcheck::ref::test
