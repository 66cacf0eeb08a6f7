// Test support for checkpoint tests: a self-removing temporary directory, synthetic tensors with
// known bytes, ZeRO-style flat and TP-style box shardings, and a SimWorld save of given shardings.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "sim/world.hpp"

namespace shardcheck::testing {

namespace ck = checkpoint;
namespace fs = std::filesystem;

// A unique directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("shardcheck-ckpt-" + std::to_string(rd()) + "-" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A logical tensor with deterministic contents.
struct FullTensor {
  std::string name;
  comm::DType dtype = comm::DType::f32;
  ck::Shape shape;
  std::vector<std::byte> bytes;
  std::size_t elem() const { return comm::size_of(dtype); }
};

inline FullTensor make_tensor(std::string name, comm::DType dtype, ck::Shape shape,
                              std::uint64_t seed) {
  FullTensor t{std::move(name), dtype, std::move(shape), {}};
  const std::uint64_t n = ck::checked_volume(t.shape).value();
  std::mt19937_64 g(seed);
  t.bytes.resize(static_cast<std::size_t>(n * t.elem()));
  for (auto& b : t.bytes) b = std::byte(static_cast<std::uint8_t>(g()));
  return t;
}

// The slice's elements of the full tensor, in the slice's own C order (the oracle: element by
// element through box_to_flat, independent of Placement).
inline std::vector<std::byte> extract(const FullTensor& t, const ck::Slice& s) {
  std::vector<std::byte> out;
  auto take = [&](ck::FlatRange r) {
    out.insert(out.end(), t.bytes.begin() + static_cast<std::ptrdiff_t>(r.begin * t.elem()),
               t.bytes.begin() + static_cast<std::ptrdiff_t>((r.begin + r.count) * t.elem()));
  };
  if (const auto* f = std::get_if<ck::FlatRange>(&s))
    take(*f);
  else
    for (const auto& r : ck::box_to_flat(t.shape, std::get<ck::Box>(s))) take(r);
  return out;
}

// ZeRO-style: `parts` equal flat chunks of ceil(n/parts) elements, the last ones short or empty.
inline std::vector<ck::Slice> zero_split(std::uint64_t n, std::uint64_t parts) {
  std::vector<ck::Slice> out;
  const std::uint64_t chunk = (n + parts - 1) / parts;
  for (std::uint64_t p = 0; p < parts; ++p) {
    const std::uint64_t b = std::min(n, p * chunk), e = std::min(n, b + chunk);
    out.push_back(ck::FlatRange{b, e - b});
  }
  return out;
}

// TP-style: `parts` boxes along `dim` (sizes as even as possible), full extent elsewhere.
inline std::vector<ck::Slice> box_split(const ck::Shape& shape, std::size_t dim,
                                        std::uint64_t parts) {
  std::vector<ck::Slice> out;
  std::uint64_t at = 0;
  for (std::uint64_t p = 0; p < parts; ++p) {
    const std::uint64_t len = shape[dim] / parts + (p < shape[dim] % parts ? 1 : 0);
    ck::Box b = ck::full_box(shape);
    b.offset[dim] = at;
    b.length[dim] = len;
    at += len;
    out.push_back(b);
  }
  return out;
}

// Per rank: which (tensor, slice) it saves. Payload views point into `storage`, kept alive here.
struct Sharding {
  std::vector<std::vector<std::pair<std::size_t, ck::Slice>>> by_rank;  // tensor index, slice
};

inline std::vector<ck::ShardPiece> pieces_for(
    const std::vector<FullTensor>& tensors,
    const std::vector<std::pair<std::size_t, ck::Slice>>& mine,
    std::vector<std::vector<std::byte>>& storage) {
  std::vector<ck::ShardPiece> pieces;
  storage.reserve(mine.size());
  for (const auto& [ti, slice] : mine) {
    const FullTensor& t = tensors[ti];
    storage.push_back(extract(t, slice));
    pieces.push_back({t.name, t.shape, t.dtype, slice, storage.back()});
  }
  return pieces;
}

inline ck::RunState run_state(std::uint64_t step) {
  ck::RunState s;
  s.step = step;
  s.consumed_samples = step * 8;
  s.consumed_tokens = step * 128;
  s.mesh = {{"dp", 2}};
  s.order = "tp-cp-ep-dp-pp";
  s.code_version = "test";
  s.data_cursor = {{"epoch", 0}, {"offset", step * 8}};
  s.lr_schedule = {{"step", step}};
  return s;
}

// Saves `tensors` with `sharding` on a SimWorld of by_rank.size() ranks. Returns rank 0's result.
inline ck::SaveResult save_sharded(const fs::path& dir, std::uint64_t step,
                                   const std::vector<FullTensor>& tensors, const Sharding& sharding,
                                   const ck::SaveOptions& opts = {}) {
  const int n = static_cast<int>(sharding.by_rank.size());
  std::vector<ck::SaveResult> results(static_cast<std::size_t>(n));
  sim::SimWorld world(n);
  world.run([&](comm::Communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    std::vector<std::vector<std::byte>> storage;
    ck::SaveRequest req{dir,
                        run_state(step),
                        {{"rng", {{"rank", c.rank()}, {"counter", 7}}}},
                        pieces_for(tensors, sharding.by_rank[r], storage)};
    results[r] = ck::save(c, req, opts);
  });
  return results[0];
}

// Round-robin assignment of slices (per tensor) to n ranks.
inline Sharding assign(const std::vector<std::vector<ck::Slice>>& slices_per_tensor,
                       std::size_t n) {
  Sharding s;
  s.by_rank.resize(n);
  std::size_t next = 0;
  for (std::size_t t = 0; t < slices_per_tensor.size(); ++t)
    for (const auto& sl : slices_per_tensor[t]) s.by_rank[next++ % n].push_back({t, sl});
  return s;
}

// A small synthetic "model + optimizer": 2-d, 1-d, 0-d and zero-size tensors of several dtypes.
inline std::vector<FullTensor> synthetic_state(std::uint64_t seed = 1) {
  return {make_tensor("exp_avg/embed.weight", comm::DType::f32, {10, 6}, seed + 1),
          make_tensor("param/embed.weight", comm::DType::f32, {10, 6}, seed + 2),
          make_tensor("param/final_norm.weight", comm::DType::bf16, {6}, seed + 3),
          make_tensor("param/layers.0.mlp.w_up", comm::DType::f64, {6, 13}, seed + 4),
          make_tensor("scaler/scale", comm::DType::f32, {}, seed + 5)};
}

// Every tensor ZeRO-split across n ranks (flat chunks; rank r gets chunk r of every tensor).
inline Sharding zero_sharding(const std::vector<FullTensor>& tensors, std::size_t n) {
  Sharding s;
  s.by_rank.resize(n);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto parts = zero_split(ck::checked_volume(tensors[t].shape).value(), n);
    for (std::size_t r = 0; r < n; ++r) s.by_rank[r].push_back({t, parts[r]});
  }
  return s;
}

// Restores every tensor whole from the checkpoint and compares bitwise.
inline void expect_restores_exactly(const ck::Checkpoint& c,
                                    const std::vector<FullTensor>& tensors) {
  ASSERT_EQ(c.manifest().tensors.size(), tensors.size());
  for (const auto& t : tensors) {
    const auto got = c.read(t.name, ck::full_box(t.shape));
    EXPECT_TRUE(got == t.bytes) << t.name;
  }
}

}  // namespace shardcheck::testing
