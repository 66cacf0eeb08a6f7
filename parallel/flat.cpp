// FlatLayout bookkeeping: offsets, padded shards, per-range parameter segments and reverse-order
// buckets. Numbers only; the strategies in data_parallel.cpp decide what to communicate.
#include "parallel/flat.hpp"

#include <algorithm>

namespace shardcheck::parallel {

FlatLayout::FlatLayout(const std::vector<std::pair<std::string, ref::Shape>>& shapes, int shards)
    : shards_(shards) {
  REF_CHECK(shards >= 1, "shards must be >= 1");
  for (const auto& [name, shape] : shapes) {
    const auto n = static_cast<std::size_t>(ref::numel_of(shape));
    params_.push_back({name, shape, numel_, n, shape.size() == 2});
    numel_ += n;
  }
  const auto d = static_cast<std::size_t>(shards);
  shard_numel_ = (numel_ + d - 1) / d;
}

Range FlatLayout::shard(int r) const {
  REF_CHECK(r >= 0 && r < shards_, "shard index out of range");
  const std::size_t b = static_cast<std::size_t>(r) * shard_numel_;
  return {b, b + shard_numel_};
}

std::vector<Segment> FlatLayout::segments(Range r) const {
  std::vector<Segment> out;
  for (const FlatParam& p : params_) {
    const std::size_t b = std::max(r.begin, p.offset), e = std::min(r.end, p.offset + p.numel);
    if (b < e) out.push_back({&p, b - p.offset, b, e - b});
  }
  return out;
}

std::vector<Range> FlatLayout::buckets(std::size_t bucket_elems) const {
  std::vector<Range> out;
  std::size_t end = numel_;  // the open bucket is [begin, end)
  std::size_t begin = numel_;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    begin = it->offset;
    if (end - begin >= bucket_elems) {
      out.push_back({begin, end});
      end = begin;
    }
  }
  if (end > 0) out.push_back({0, end});
  return out;
}

}  // namespace shardcheck::parallel
