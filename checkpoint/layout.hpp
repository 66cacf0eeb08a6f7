// Slices of a logical C-order tensor and the math between them: flat element ranges (ZeRO/FSDP
// flat shards), N-d boxes (TP rows/columns, PP/EP partitions), the decomposition of one into the
// other, exact-cover checks, and copying a region between two buffers laid out as different slices.
// Pure functions on element indices; knows nothing of files or dtypes beyond an element size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace shardcheck::checkpoint {

using Shape = std::vector<std::uint64_t>;

// Bounds every shape is checked against before any allocation or index arithmetic, so products
// of extents and byte sizes never overflow 64 bits.
inline constexpr std::size_t kMaxDims = 16;
inline constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 56;

// Elements [begin, begin + count) of the tensor in C order.
struct FlatRange {
  std::uint64_t begin = 0;
  std::uint64_t count = 0;
  friend bool operator==(const FlatRange&, const FlatRange&) = default;
};

// The sub-array offset[d] <= i_d < offset[d] + length[d] for every dim d. A 0-d tensor's only box
// has no dims and one element.
struct Box {
  std::vector<std::uint64_t> offset;
  std::vector<std::uint64_t> length;
  friend bool operator==(const Box&, const Box&) = default;
};

// What a shard holds. Its payload is the slice's elements in C order of the slice itself: for a
// flat range the logical order, for a box the box's own row-major order.
using Slice = std::variant<FlatRange, Box>;

// Product of extents, or nullopt when it exceeds kMaxElements (or ndim exceeds kMaxDims).
std::optional<std::uint64_t> checked_volume(const Shape& shape);
std::uint64_t volume(const Box& box);
std::uint64_t element_count(const Slice& slice);
// True when the slice has the tensor's rank and lies inside it (overflow-safe).
bool within(const Shape& shape, const Slice& slice);
Box full_box(const Shape& shape);
std::string describe(const Slice& slice);  // "flat[8,+4)", "box[0:2,3:5]"

// The flat range as at most 2*ndim-1 disjoint boxes, in C order (empty range -> no boxes).
std::vector<Box> flat_to_boxes(const Shape& shape, FlatRange range);
// The box as maximal contiguous flat ranges, ascending (a full box -> one range).
std::vector<FlatRange> box_to_flat(const Shape& shape, const Box& box);
// The boxes a slice covers (a box -> itself, a flat range -> flat_to_boxes).
std::vector<Box> boxes_of(const Shape& shape, const Slice& slice);
std::optional<Box> intersect(const Box& a, const Box& b);

// Exact cover: every element of `shape` lies in exactly one of `slices`. On failure says why and
// which slices (indices into `slices`) are involved.
struct CoverProblem {
  enum Kind { out_of_bounds, overlap, gap } kind;
  std::size_t first = 0, second = 0;  // second only for overlap
  std::string detail;
};
std::optional<CoverProblem> check_exact_cover(const Shape& shape, std::span<const Slice> slices);

// How a linear buffer holding `slice` maps logical coordinates to buffer positions (elements).
class Placement {
 public:
  Placement(const Shape& shape, const Slice& slice);
  // Copies every element of `want` that this placement and `dst` both hold from src to dst.
  // Positions are elements; src_shift is subtracted from every source position (for a source
  // buffer holding only part of the slice, starting at element src_shift). Returns elements copied.
  std::uint64_t copy_to(const Placement& dst, std::span<const std::byte> src,
                        std::span<std::byte> dst_bytes, std::size_t elem_size,
                        std::uint64_t src_shift = 0) const;
  // [lo, hi): the positions of this buffer that overlap `other`'s region; nullopt if none.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> span_overlapping(
      const Placement& other) const;

 private:
  struct Part {
    Box box;
    std::uint64_t corner = 0;  // buffer position of box's first element
  };
  std::vector<Part> parts_;
  std::vector<std::uint64_t> strides_;  // same for every part: element step per dim
};

}  // namespace shardcheck::checkpoint
