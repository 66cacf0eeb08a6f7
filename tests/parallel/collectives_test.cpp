// The gradient and parameter collectives of one step on a data-parallel mesh, per strategy (the
// table of parallel/README.md), read from the simulator's timeline and checked against counts
// built here from the flat buffer sizes alone: DDP / ZeRO-1 all_reduce every gradient element
// once (in buckets), ZeRO-2 reduce_scatters the padded buffer once per step and ZeRO-1/2
// all_gather the updated parameters; ZeRO-3 all_gathers each wrap unit before each use (forward
// and backward of every microbatch) and reduce_scatters each unit's gradient every microbatch.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/layerwise.hpp"
#include "reference/model.hpp"
#include "tests/parallel/parity_support.hpp"

namespace shardcheck::parallel::test {
namespace {

struct Seen {
  int all_reduce = 0, reduce_scatter = 0, all_gather = 0;
  std::size_t all_reduce_elems = 0, reduce_scatter_elems = 0, all_gather_elems = 0;
};

// Rank 0's step-1 collectives on the gradient-sum group ("dp-cp[members]"), in f64 elements.
Seen step_collectives(const Scenario& s, int world, const DataParallelOptions& o) {
  const ref::Dataset ds = dataset_of(s);
  sim::SimWorld w(world);
  w.run([&](comm::Communicator& c) {
    MeshEngine e(c, s.model, s.train, s.seed, dp_mesh(world, o));
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    e.step(e.local_batch(ds, sampler.next_global_batch()));
  });
  Seen seen;
  for (const sim::TimelineEvent& ev : w.timeline()) {
    if (ev.rank != 0 || ev.step != 1 || ev.stream != sim::Stream::comm ||
        ev.group.rfind("dp-cp[", 0) != 0)
      continue;
    const std::size_t elems = ev.bytes / sizeof(double);
    if (ev.kind == "all_reduce") {
      ++seen.all_reduce;
      seen.all_reduce_elems += elems;
    } else if (ev.kind == "reduce_scatter") {
      ++seen.reduce_scatter;
      seen.reduce_scatter_elems += elems;
    } else if (ev.kind == "all_gather") {
      ++seen.all_gather;
      seen.all_gather_elems += elems;
    }
  }
  return seen;
}

std::size_t padded(std::size_t n, std::size_t d) {
  return (n + d - 1) / d * d;
}

TEST(DataParallelMesh, CollectivesPerStep) {
  const Scenario s = dense_setup();  // 2 layers, tied embedding
  constexpr int kWorld = 3;
  std::size_t n = 0;
  for (const auto& [name, shape] : ref::param_shapes(s.model))
    n += static_cast<std::size_t>(ref::numel_of(shape));
  const int microbatches = s.train.global_batch / kWorld / s.train.micro_batch;

  const Seen ddp = step_collectives(s, kWorld, {.strategy = Strategy::ddp, .bucket_elems = 500});
  EXPECT_EQ(ddp.all_reduce_elems, n);
  EXPECT_GE(ddp.all_reduce, 3);  // buckets of >= 500 elements
  EXPECT_EQ(ddp.reduce_scatter + ddp.all_gather, 0);

  const Seen z1 = step_collectives(s, kWorld, {.strategy = Strategy::zero1});
  EXPECT_EQ(z1.all_reduce_elems, n);
  EXPECT_EQ(z1.all_gather, 1);
  EXPECT_EQ(z1.all_gather_elems, padded(n, kWorld));

  const Seen z2 = step_collectives(s, kWorld, {.strategy = Strategy::zero2});
  EXPECT_EQ(z2.all_reduce, 0);
  EXPECT_EQ(z2.reduce_scatter, 1);
  EXPECT_EQ(z2.reduce_scatter_elems, padded(n, kWorld));
  EXPECT_EQ(z2.all_gather, 1);

  // ZeRO-3, one unit per block plus the embedding and the head (final norm; the LM head is tied),
  // each microbatch's gradient of each unit reduce_scattered during its backward.
  std::size_t units = 0;
  for (int u = 0; u < unit_count(s.model); ++u) {
    std::size_t e = 0;
    for (const auto& [name, shape] : unit_shapes(s.model, u))
      e += static_cast<std::size_t>(ref::numel_of(shape));
    units += padded(e, kWorld);
  }
  const Seen z3 = step_collectives(s, kWorld, {.strategy = Strategy::zero3});
  const int layers = s.model.layers;
  EXPECT_EQ(z3.reduce_scatter, microbatches * (layers + 2));
  EXPECT_EQ(z3.reduce_scatter_elems, microbatches * units);
  EXPECT_EQ(z3.all_reduce, 0);
  // Per microbatch: forward the embedding, each block and the head (the tied head reuses the
  // embedding's gather); backward the head and the embedding again, then each block.
  EXPECT_EQ(z3.all_gather, microbatches * (2 * layers + 4));
}

}  // namespace
}  // namespace shardcheck::parallel::test
