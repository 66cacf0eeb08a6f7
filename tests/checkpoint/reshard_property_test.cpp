// RapidCheck: tensors of random shape and dtype, saved under a random sharding (ZeRO flat chunks of
// any world size, random flat cuts, TP row/column boxes, 2-d box grids) from a random number of
// ranks, then read back under another random sharding: every piece equals the original bytes.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "tests/checkpoint/support.hpp"

namespace shardcheck::testing {
namespace {

// Sizes of `parts` pieces summing to n, random cut points (some pieces may be empty).
std::vector<std::uint64_t> random_cuts(std::uint64_t n, std::uint64_t parts) {
  std::vector<std::uint64_t> cuts{0, n};
  for (std::uint64_t i = 1; i < parts; ++i)
    cuts.push_back(*rc::gen::inRange<std::uint64_t>(0, n + 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::uint64_t> sizes;
  for (std::size_t i = 1; i < cuts.size(); ++i) sizes.push_back(cuts[i] - cuts[i - 1]);
  return sizes;
}

// Boxes splitting dim a at random cuts and (optionally) dim b too: a TP / TPxPP-like grid.
std::vector<ck::Slice> box_grid(const ck::Shape& shape) {
  const auto a = *rc::gen::inRange<std::size_t>(0, shape.size());
  const auto b = *rc::gen::inRange<std::size_t>(0, shape.size());
  const auto pa = random_cuts(shape[a], *rc::gen::inRange<std::uint64_t>(1, 5));
  const auto pb = a == b ? std::vector<std::uint64_t>{shape[b]}
                         : random_cuts(shape[b], *rc::gen::inRange<std::uint64_t>(1, 4));
  std::vector<ck::Slice> out;
  std::uint64_t oa = 0;
  for (auto la : pa) {
    std::uint64_t ob = 0;
    for (auto lb : pb) {
      ck::Box box = ck::full_box(shape);
      box.offset[a] = oa;
      box.length[a] = la;
      if (a != b) box.offset[b] = ob, box.length[b] = lb;
      if (ck::volume(box) > 0) out.push_back(box);
      ob += lb;
    }
    oa += la;
  }
  return out;
}

// A random exact cover of the tensor.
std::vector<ck::Slice> random_sharding(const ck::Shape& shape) {
  const std::uint64_t n = ck::checked_volume(shape).value();
  const int kind = shape.empty() ? 0 : *rc::gen::inRange(0, 3);
  if (kind == 2) return box_grid(shape);
  std::vector<ck::Slice> out;
  if (kind == 0) {
    for (auto& s : zero_split(n, *rc::gen::inRange<std::uint64_t>(1, 9)))
      if (ck::element_count(s) > 0) out.push_back(s);
    return out;
  }
  std::uint64_t at = 0;
  for (auto len : random_cuts(n, *rc::gen::inRange<std::uint64_t>(1, 6))) {
    if (len > 0) out.push_back(ck::FlatRange{at, len});
    at += len;
  }
  return out;
}

RC_GTEST_PROP(Reshard, WriteThenReadInAnotherShardingIsIdentity, ()) {
  const auto ntensors = *rc::gen::inRange<std::size_t>(1, 4);
  std::vector<FullTensor> tensors;
  std::vector<std::vector<ck::Slice>> source;
  for (std::size_t i = 0; i < ntensors; ++i) {
    const auto nd = *rc::gen::inRange<std::size_t>(0, 4);
    const auto shape = *rc::gen::container<ck::Shape>(nd, rc::gen::inRange<std::uint64_t>(1, 9));
    const auto dtype = *rc::gen::elementOf(
        std::vector<comm::DType>(std::begin(comm::kAllDTypes), std::end(comm::kAllDTypes)));
    tensors.push_back(make_tensor("t" + std::to_string(i) + "/w", dtype, shape,
                                  *rc::gen::arbitrary<std::uint32_t>()));
    source.push_back(random_sharding(shape));
  }
  const auto ranks = *rc::gen::inRange<std::size_t>(1, 6);
  TempDir tmp;
  const auto res = save_sharded(tmp.path(), 1, tensors, assign(source, ranks), {.durable = false});
  const auto c = ck::Checkpoint::open(res.path);
  for (const auto& t : tensors) {
    for (const auto& s : random_sharding(t.shape)) RC_ASSERT(c.read(t.name, s) == extract(t, s));
    RC_ASSERT(c.read(t.name, ck::full_box(t.shape)) == t.bytes);
  }
}

}  // namespace
}  // namespace shardcheck::testing
