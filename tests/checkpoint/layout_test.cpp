// Slice math: flat range <-> box decomposition (examples and RapidCheck round trips), exact-cover
// checks (gap, overlap, out of bounds), and Placement copies against an element-by-element oracle.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "tests/checkpoint/support.hpp"

namespace shardcheck::testing {
namespace {

using ck::Box;
using ck::FlatRange;
using ck::Shape;
using ck::Slice;

// Every flat index a slice covers, ascending for flat ranges, box order for boxes.
std::vector<std::uint64_t> indices(const Shape& shape, const Slice& s) {
  std::vector<std::uint64_t> out;
  if (const auto* f = std::get_if<FlatRange>(&s)) {
    for (std::uint64_t i = 0; i < f->count; ++i) out.push_back(f->begin + i);
    return out;
  }
  for (const auto& r : ck::box_to_flat(shape, std::get<Box>(s)))
    for (std::uint64_t i = 0; i < r.count; ++i) out.push_back(r.begin + i);
  return out;
}

rc::Gen<Shape> gen_shape() {
  return rc::gen::mapcat(rc::gen::inRange<std::size_t>(0, 5), [](std::size_t nd) {
    return rc::gen::container<Shape>(nd, rc::gen::inRange<std::uint64_t>(0, 7));
  });
}

TEST(Layout, FlatToBoxesExample) {
  // [4,5]: elements 3..16 = row 0 cols 3-4, rows 1-2 whole, row 3 cols 0-1.
  const auto boxes = ck::flat_to_boxes({4, 5}, FlatRange{3, 14});
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0], (Box{{0, 3}, {1, 2}}));
  EXPECT_EQ(boxes[1], (Box{{1, 0}, {2, 5}}));
  EXPECT_EQ(boxes[2], (Box{{3, 0}, {1, 2}}));
  EXPECT_EQ(ck::flat_to_boxes({}, FlatRange{0, 1}).size(), 1u);  // a scalar
  EXPECT_TRUE(ck::flat_to_boxes({4, 5}, FlatRange{7, 0}).empty());
}

TEST(Layout, BoxToFlatMergesContiguousRows) {
  EXPECT_EQ(ck::box_to_flat({4, 5}, Box{{1, 0}, {2, 5}}), (std::vector<FlatRange>{{5, 10}}));
  EXPECT_EQ(ck::box_to_flat({4, 5}, Box{{0, 1}, {2, 2}}), (std::vector<FlatRange>{{1, 2}, {6, 2}}));
  EXPECT_EQ(ck::box_to_flat({2, 3, 4}, ck::full_box({2, 3, 4})), (std::vector<FlatRange>{{0, 24}}));
}

RC_GTEST_PROP(Layout, FlatToBoxesCoversTheRangeExactly, ()) {
  const Shape shape = *gen_shape();
  const std::uint64_t n = ck::checked_volume(shape).value();
  const auto b = *rc::gen::inRange<std::uint64_t>(0, n + 1);
  const auto c = *rc::gen::inRange<std::uint64_t>(0, n - b + 1);
  const auto boxes = ck::flat_to_boxes(shape, FlatRange{b, c});
  RC_ASSERT(boxes.size() <= (shape.empty() ? 1 : 2 * shape.size() - 1));
  std::vector<std::uint64_t> got;
  for (const auto& box : boxes) {
    RC_ASSERT(ck::within(shape, box));
    RC_ASSERT(ck::volume(box) > 0u);
    const auto idx = indices(shape, box);
    got.insert(got.end(), idx.begin(), idx.end());
  }
  RC_ASSERT(got == indices(shape, FlatRange{b, c}));  // in order, each once
}

RC_GTEST_PROP(Layout, BoxToFlatAndBackIsIdentity, ()) {
  const Shape shape = *gen_shape();
  Box box;
  for (auto e : shape) {
    const auto off = *rc::gen::inRange<std::uint64_t>(0, e + 1);
    box.offset.push_back(off);
    box.length.push_back(*rc::gen::inRange<std::uint64_t>(0, e - off + 1));
  }
  const auto ranges = ck::box_to_flat(shape, box);
  std::vector<std::uint64_t> via;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    RC_ASSERT(ranges[i].count > 0u);
    if (i) RC_ASSERT(ranges[i].begin > ranges[i - 1].begin + ranges[i - 1].count);  // maximal
    for (const auto& b : ck::flat_to_boxes(shape, ranges[i])) {
      RC_ASSERT(ck::intersect(b, box) == std::optional<Box>(b));  // inside the box
      const auto idx = indices(shape, b);
      via.insert(via.end(), idx.begin(), idx.end());
    }
  }
  auto want = indices(shape, box);
  RC_ASSERT(via == want);
}

TEST(Layout, ExactCoverFindsGapOverlapAndOutOfBounds) {
  const Shape s{4, 5};
  EXPECT_FALSE(ck::check_exact_cover(s, zero_split(20, 3)));
  EXPECT_FALSE(ck::check_exact_cover(s, box_split(s, 1, 3)));
  const std::vector<Slice> mixed{FlatRange{0, 10}, Box{{2, 0}, {2, 5}}};
  EXPECT_FALSE(ck::check_exact_cover(s, mixed));

  const std::vector<Slice> gap{FlatRange{0, 10}, FlatRange{11, 9}};
  EXPECT_EQ(ck::check_exact_cover(s, gap)->kind, ck::CoverProblem::gap);
  const std::vector<Slice> overlap{FlatRange{0, 10}, Box{{1, 4}, {3, 1}}, FlatRange{10, 10}};
  const auto p = ck::check_exact_cover(s, overlap);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->kind, ck::CoverProblem::overlap);
  EXPECT_EQ(p->first, 0u);
  EXPECT_EQ(p->second, 1u);
  const std::vector<Slice> oob{FlatRange{15, 6}};
  EXPECT_EQ(ck::check_exact_cover(s, oob)->kind, ck::CoverProblem::out_of_bounds);
  const std::vector<Slice> twice{Box{{}, {}}, FlatRange{0, 1}};  // a scalar saved twice
  EXPECT_TRUE(ck::check_exact_cover({}, twice));
}

TEST(Layout, CheckedVolumeRefusesOverflow) {
  EXPECT_FALSE(ck::checked_volume({1ull << 40, 1ull << 40}));
  EXPECT_EQ(ck::checked_volume({0, 1ull << 60, 1ull << 60}), std::nullopt);  // extents bounded too
  EXPECT_EQ(ck::checked_volume({}), 1u);
  EXPECT_FALSE(ck::checked_volume(Shape(17, 1)));
  EXPECT_FALSE(ck::within({4}, FlatRange{UINT64_MAX, 2}));
  EXPECT_FALSE(ck::within({4, 4}, Box{{UINT64_MAX, 0}, {2, 4}}));
}

RC_GTEST_PROP(Layout, PlacementCopyMatchesElementOracle, ()) {
  const Shape shape = *gen_shape();
  const std::uint64_t n = ck::checked_volume(shape).value();
  const FullTensor t =
      make_tensor("t", comm::DType::i32, shape, *rc::gen::arbitrary<std::uint32_t>());
  auto gen_slice = [&]() -> Slice {
    if (*rc::gen::arbitrary<bool>()) {
      const auto b = *rc::gen::inRange<std::uint64_t>(0, n + 1);
      return FlatRange{b, *rc::gen::inRange<std::uint64_t>(0, n - b + 1)};
    }
    Box box;
    for (auto e : shape) {
      const auto off = *rc::gen::inRange<std::uint64_t>(0, e + 1);
      box.offset.push_back(off);
      box.length.push_back(*rc::gen::inRange<std::uint64_t>(0, e - off + 1));
    }
    return box;
  };
  const Slice src = gen_slice(), dst = gen_slice();
  const auto src_bytes = extract(t, src);
  std::vector<std::byte> out(static_cast<std::size_t>(ck::element_count(dst) * t.elem()));
  const ck::Placement ps(shape, src), pd(shape, dst);
  ps.copy_to(pd, src_bytes, out, t.elem());
  // Every element of dst that src holds now equals the tensor; the others stay zero.
  const auto want = extract(t, dst);
  const auto dst_idx = indices(shape, dst), src_idx = indices(shape, src);
  for (std::size_t k = 0; k < dst_idx.size(); ++k) {
    const bool held = std::find(src_idx.begin(), src_idx.end(), dst_idx[k]) != src_idx.end();
    for (std::size_t b = 0; b < t.elem(); ++b) {
      const std::byte expect = held ? want[k * t.elem() + b] : std::byte{0};
      RC_ASSERT(out[k * t.elem() + b] == expect);
    }
  }
}

}  // namespace
}  // namespace shardcheck::testing
