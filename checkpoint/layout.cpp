// Slice math. Every index computation here runs on shapes already bounded by kMaxElements, so
// products and sums of extents fit in 64 bits; within() and checked_volume() are the gates.
#include "checkpoint/layout.hpp"

#include <algorithm>
#include <cstring>

#include "comm/errors.hpp"

namespace shardcheck::checkpoint {

std::optional<std::uint64_t> checked_volume(const Shape& shape) {
  if (shape.size() > kMaxDims) return std::nullopt;
  std::uint64_t v = 1;
  // Each extent is bounded too, so strides stay meaningful even when another extent is 0.
  for (std::uint64_t e : shape) {
    if (e > kMaxElements || (e != 0 && v > kMaxElements / e)) return std::nullopt;
    v *= e;
  }
  return v;
}

std::uint64_t volume(const Box& box) {
  std::uint64_t v = 1;
  for (std::uint64_t e : box.length) v *= e;
  return v;
}

std::uint64_t element_count(const Slice& slice) {
  if (const auto* f = std::get_if<FlatRange>(&slice)) return f->count;
  return volume(std::get<Box>(slice));
}

bool within(const Shape& shape, const Slice& slice) {
  const auto total = checked_volume(shape);
  if (!total) return false;
  if (const auto* f = std::get_if<FlatRange>(&slice))
    return f->begin <= *total && f->count <= *total - f->begin;
  const Box& b = std::get<Box>(slice);
  if (b.offset.size() != shape.size() || b.length.size() != shape.size()) return false;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (b.offset[d] > shape[d] || b.length[d] > shape[d] - b.offset[d]) return false;
  return true;
}

Box full_box(const Shape& shape) {
  return Box{Shape(shape.size(), 0), shape};
}

std::string describe(const Slice& slice) {
  if (const auto* f = std::get_if<FlatRange>(&slice))
    return "flat[" + std::to_string(f->begin) + ",+" + std::to_string(f->count) + ")";
  const Box& b = std::get<Box>(slice);
  std::string s = "box[";
  for (std::size_t d = 0; d < b.offset.size(); ++d) {
    if (d) s += ',';
    s += std::to_string(b.offset[d]) + ':' + std::to_string(b.offset[d] + b.length[d]);
  }
  return s + ']';
}

namespace {

std::vector<std::uint64_t> strides_of(const Shape& shape) {
  std::vector<std::uint64_t> s(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

// Decomposes [b, e) of the sub-tensor spanned by dims >= d, whose outer coordinates are fixed in
// `prefix` (length-1 extents). Head partial rows recurse, full rows form one box, the tail
// recurses: at most 2*(ndim-d)-1 boxes.
void decompose(const Shape& shape, const std::vector<std::uint64_t>& strides, std::size_t d,
               Box prefix, std::uint64_t b, std::uint64_t e, std::vector<Box>& out) {
  if (b == e) return;
  const std::size_t nd = shape.size();
  auto emit = [&](std::uint64_t lo, std::uint64_t hi) {
    Box box = prefix;
    box.offset.push_back(lo);
    box.length.push_back(hi - lo);
    for (std::size_t k = d + 1; k < nd; ++k) {
      box.offset.push_back(0);
      box.length.push_back(shape[k]);
    }
    out.push_back(std::move(box));
  };
  const std::uint64_t inner = strides[d];
  if (d + 1 == nd) return emit(b, e);
  std::uint64_t i0 = b / inner;
  const std::uint64_t r0 = b % inner, i1 = e / inner, r1 = e % inner;
  auto row = [&](std::uint64_t i, std::uint64_t lo, std::uint64_t hi) {
    Box p = prefix;
    p.offset.push_back(i);
    p.length.push_back(1);
    decompose(shape, strides, d + 1, std::move(p), lo, hi, out);
  };
  if (i0 == i1) return row(i0, r0, r1);
  if (r0 != 0) row(i0++, r0, inner);
  if (i1 > i0) emit(i0, i1);
  if (r1 != 0) row(i1, 0, r1);
}

}  // namespace

std::vector<Box> flat_to_boxes(const Shape& shape, FlatRange range) {
  SC_CHECK(within(shape, range), describe(range) << " outside the tensor");
  std::vector<Box> out;
  if (range.count == 0) return out;
  if (shape.empty()) return {Box{}};
  decompose(shape, strides_of(shape), 0, Box{}, range.begin, range.begin + range.count, out);
  return out;
}

std::vector<FlatRange> box_to_flat(const Shape& shape, const Box& box) {
  SC_CHECK(within(shape, box), describe(box) << " outside the tensor");
  std::vector<FlatRange> out;
  if (volume(box) == 0) return out;
  const std::size_t nd = shape.size();
  if (nd == 0) return {FlatRange{0, 1}};
  const auto strides = strides_of(shape);
  // The trailing dims the box spans fully merge with the last partial one into one run.
  std::size_t k = nd;  // dims [k, nd) are full
  while (k > 0 && box.offset[k - 1] == 0 && box.length[k - 1] == shape[k - 1]) --k;
  std::size_t run_dim = k == 0 ? 0 : k - 1;  // the dim whose extent forms the run with [k, nd)
  const std::uint64_t run = box.length[run_dim] * strides[run_dim];
  std::vector<std::uint64_t> idx(run_dim, 0);  // odometer over dims [0, run_dim)
  while (true) {
    std::uint64_t start = box.offset[run_dim] * strides[run_dim];
    for (std::size_t d = 0; d < run_dim; ++d) start += (box.offset[d] + idx[d]) * strides[d];
    if (!out.empty() && out.back().begin + out.back().count == start)
      out.back().count += run;
    else
      out.push_back({start, run});
    std::size_t d = run_dim;
    while (d > 0 && ++idx[d - 1] == box.length[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

std::vector<Box> boxes_of(const Shape& shape, const Slice& slice) {
  if (const auto* f = std::get_if<FlatRange>(&slice)) return flat_to_boxes(shape, *f);
  return {std::get<Box>(slice)};
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  SC_CHECK(a.offset.size() == b.offset.size(), "boxes of different rank");
  Box r;
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    const std::uint64_t lo = std::max(a.offset[d], b.offset[d]);
    const std::uint64_t hi = std::min(a.offset[d] + a.length[d], b.offset[d] + b.length[d]);
    if (hi <= lo) return std::nullopt;
    r.offset.push_back(lo);
    r.length.push_back(hi - lo);
  }
  return r;
}

std::optional<CoverProblem> check_exact_cover(const Shape& shape, std::span<const Slice> slices) {
  const auto total = checked_volume(shape);
  if (!total) return CoverProblem{CoverProblem::out_of_bounds, 0, 0, "shape too large"};
  std::uint64_t sum = 0;
  struct Owned {
    Box box;
    std::size_t owner;
  };
  std::vector<Owned> boxes;
  for (std::size_t i = 0; i < slices.size(); ++i) {
    if (!within(shape, slices[i]))
      return CoverProblem{CoverProblem::out_of_bounds, i, 0, describe(slices[i]) + " outside"};
    const std::uint64_t n = element_count(slices[i]);
    if (n > *total - std::min(sum, *total))
      sum = *total + 1;  // more elements than the tensor holds: some overlap, found below
    else
      sum += n;
    for (Box& b : boxes_of(shape, slices[i]))
      if (volume(b) != 0) boxes.push_back({std::move(b), i});
  }
  // Sweep along dim 0: only boxes whose dim-0 extents meet can intersect.
  if (!shape.empty())
    std::sort(boxes.begin(), boxes.end(),
              [](const Owned& a, const Owned& b) { return a.box.offset[0] < b.box.offset[0]; });
  for (std::size_t i = 0; i < boxes.size(); ++i)
    for (std::size_t j = i + 1; j < boxes.size(); ++j) {
      if (!shape.empty() &&
          boxes[j].box.offset[0] >= boxes[i].box.offset[0] + boxes[i].box.length[0])
        break;
      if (auto x = intersect(boxes[i].box, boxes[j].box)) {
        const auto [a, b] = std::minmax(boxes[i].owner, boxes[j].owner);
        return CoverProblem{
            CoverProblem::overlap, a, b,
            describe(slices[a]) + " and " + describe(slices[b]) + " share " + describe(*x)};
      }
    }
  // Disjoint and inside: covering everything is now a matter of counting.
  if (sum != *total)
    return CoverProblem{
        CoverProblem::gap, 0, 0,
        std::to_string(sum) + " of " + std::to_string(*total) + " elements covered"};
  return std::nullopt;
}

Placement::Placement(const Shape& shape, const Slice& slice) {
  SC_CHECK(within(shape, slice), describe(slice) << " outside the tensor");
  if (const auto* f = std::get_if<FlatRange>(&slice)) {
    strides_ = strides_of(shape);
    for (Box& b : flat_to_boxes(shape, *f)) {
      std::uint64_t pos = 0;
      for (std::size_t d = 0; d < shape.size(); ++d) pos += b.offset[d] * strides_[d];
      parts_.push_back({std::move(b), pos - f->begin});
    }
  } else {
    const Box& b = std::get<Box>(slice);
    strides_ = strides_of(b.length);
    if (volume(b) != 0) parts_.push_back({b, 0});
  }
}

std::uint64_t Placement::copy_to(const Placement& dst, std::span<const std::byte> src,
                                 std::span<std::byte> dst_bytes, std::size_t elem_size,
                                 std::uint64_t src_shift) const {
  std::uint64_t copied = 0;
  for (const Part& p : parts_)
    for (const Part& q : dst.parts_) {
      const auto x = intersect(p.box, q.box);
      if (!x) continue;
      const std::size_t nd = x->offset.size();
      const std::uint64_t run = nd == 0 ? 1 : x->length[nd - 1];
      const std::size_t outer = nd == 0 ? 0 : nd - 1;
      std::vector<std::uint64_t> idx(outer, 0);
      while (true) {
        std::uint64_t s = p.corner, t = q.corner;
        for (std::size_t d = 0; d < nd; ++d) {
          const std::uint64_t c = x->offset[d] + (d < outer ? idx[d] : 0);
          s += (c - p.box.offset[d]) * strides_[d];
          t += (c - q.box.offset[d]) * dst.strides_[d];
        }
        SC_CHECK(s >= src_shift && (s - src_shift + run) * elem_size <= src.size() &&
                     (t + run) * elem_size <= dst_bytes.size(),
                 "region copy out of its buffers");
        std::memcpy(dst_bytes.data() + t * elem_size, src.data() + (s - src_shift) * elem_size,
                    run * elem_size);
        copied += run;
        std::size_t d = outer;
        while (d > 0 && ++idx[d - 1] == x->length[d - 1]) idx[--d] = 0;
        if (d == 0) break;
      }
    }
  return copied;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> Placement::span_overlapping(
    const Placement& other) const {
  std::optional<std::pair<std::uint64_t, std::uint64_t>> r;
  for (const Part& p : parts_)
    for (const Part& q : other.parts_) {
      const auto x = intersect(p.box, q.box);
      if (!x) continue;
      std::uint64_t lo = p.corner, hi = p.corner;
      for (std::size_t d = 0; d < x->offset.size(); ++d) {
        lo += (x->offset[d] - p.box.offset[d]) * strides_[d];
        hi += (x->offset[d] + x->length[d] - 1 - p.box.offset[d]) * strides_[d];
      }
      if (!r)
        r = {lo, hi + 1};
      else
        r = {std::min(r->first, lo), std::max(r->second, hi + 1)};
    }
  return r;
}

}  // namespace shardcheck::checkpoint
