// FlatLayout: the model's parameters laid end to end in canonical order (ref::param_shapes), padded
// to a multiple of the DP size and cut into equal shards, plus DDP's gradient buckets. Pure
// bookkeeping shared by every data-parallel strategy: no communication, no numerics.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "reference/tensor.hpp"

namespace shardcheck::parallel {

// Elements [begin, end) of a flat buffer.
struct Range {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

struct FlatParam {
  std::string name;
  ref::Shape shape;
  std::size_t offset = 0;  // first element in the flat buffer
  std::size_t numel = 0;
  bool decay = false;  // AdamW weight decay applies: rank-2 tensors (reference/README.md, item 5)
};

// The part of one parameter that falls inside a flat range.
struct Segment {
  const FlatParam* param = nullptr;
  std::size_t param_begin = 0;  // first element inside the parameter (flat C order)
  std::size_t flat_begin = 0;   // the same element's position in the flat buffer
  std::size_t count = 0;
};

class FlatLayout {
 public:
  // shapes in canonical order; shards = DP size (>= 1).
  FlatLayout(const std::vector<std::pair<std::string, ref::Shape>>& shapes, int shards);

  const std::vector<FlatParam>& params() const { return params_; }
  int shards() const { return shards_; }
  std::size_t numel() const { return numel_; }              // N: real elements
  std::size_t shard_numel() const { return shard_numel_; }  // S = ceil(N / shards)
  std::size_t padded_numel() const { return shard_numel_ * static_cast<std::size_t>(shards_); }
  std::size_t padding() const { return padded_numel() - numel_; }  // zeros at the end
  // Shard r of the padded buffer: [r*S, (r+1)*S). The last shards may be (partly) padding.
  Range shard(int r) const;

  // The parameter pieces inside r (padding contributes none), in flat order.
  std::vector<Segment> segments(Range r) const;

  // Gradient buckets in reverse parameter order (as PyTorch DDP fills them during backward): whole
  // parameters are added from the last one backwards until a bucket holds >= bucket_elems
  // elements; a parameter larger than that gets a bucket of its own. Buckets are contiguous
  // ranges of the flat buffer (consecutive parameters), listed in the order they are reduced.
  std::vector<Range> buckets(std::size_t bucket_elems) const;

  // Copies parameters into flat (size >= N; elements past N are left alone) and back.
  template <class T>
  void pack(const ref::ParamMap<T>& map, std::span<T> flat) const {
    REF_CHECK(flat.size() >= numel_, "flat buffer too small");
    for (const FlatParam& p : params_) {
      const ref::Tensor<T>& t = map[p.name];
      REF_CHECK(static_cast<std::size_t>(t.numel()) == p.numel, "shape mismatch: " + p.name);
      std::copy(t.vec().begin(), t.vec().end(),
                flat.begin() + static_cast<std::ptrdiff_t>(p.offset));
    }
  }
  template <class T>
  void unpack(std::span<const T> flat, ref::ParamMap<T>& map) const {
    REF_CHECK(flat.size() >= numel_, "flat buffer too small");
    for (const FlatParam& p : params_) {
      ref::Tensor<T>& t = map[p.name];
      REF_CHECK(static_cast<std::size_t>(t.numel()) == p.numel, "shape mismatch: " + p.name);
      const auto first = flat.begin() + static_cast<std::ptrdiff_t>(p.offset);
      std::copy(first, first + static_cast<std::ptrdiff_t>(p.numel), t.vec().begin());
    }
  }
  // A zero-filled map with every parameter's full shape, in canonical order.
  template <class T>
  ref::ParamMap<T> zeros() const {
    ref::ParamMap<T> out;
    for (const FlatParam& p : params_) out.add(p.name, p.shape);
    return out;
  }

 private:
  std::vector<FlatParam> params_;
  int shards_;
  std::size_t numel_ = 0;
  std::size_t shard_numel_ = 0;
};

}  // namespace shardcheck::parallel
