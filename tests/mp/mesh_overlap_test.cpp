// DDP overlap on the mesh engine (MeshOptions::overlap): each pipeline chunk's gradient all_reduce
// is issued during the last microbatch's backward, so on the virtual timeline it starts before the
// rank's backward is over; without overlap every sum waits for the pipeline. The bits are the
// same either way, on PP meshes with TP + SP, the tied embedding, ZeRO-1 and MoE.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "tests/mp/mesh_support.hpp"

namespace shardcheck::parallel {
namespace {

using namespace mesh_test;  // NOLINT

struct OverlapRun {
  test::DpRun result;
  std::vector<sim::TimelineEvent> timeline;
};

OverlapRun run(const Scenario& s, const MeshOptions& o) {
  OverlapRun out;
  out.result = mesh_run(s, o);
  const ref::Dataset ds = test::dataset_of(s);
  sim::SimWorld world(o.shape.world_size());
  world.run([&](comm::Communicator& c) {
    MeshEngine e(c, s.model, s.train, s.seed, o);
    ref::DistributedSampler sampler(static_cast<int64_t>(ds.samples.size()), s.train.global_batch,
                                    s.seed, true);
    e.step(rank_batch(ds, sampler.next_global_batch(), e.data_rank(), e.data_world()));
  });
  out.timeline = world.timeline();
  return out;
}

// On world rank 0 (the first stage): when its first data-parallel gradient all_reduce starts and
// when its last backward compute ends.
std::pair<double, double> first_sum_and_last_backward(const std::vector<sim::TimelineEvent>& t) {
  double sum = std::numeric_limits<double>::infinity(), backward = 0;
  for (const sim::TimelineEvent& e : t) {
    if (e.rank != 0) continue;
    if (e.kind == "all_reduce" && e.group.find("dp-cp") != std::string::npos)
      sum = std::min(sum, e.start);
    if (e.kind == "compute" && e.name.find("backward") != std::string::npos)
      backward = std::max(backward, e.end);
  }
  return {sum, backward};
}

struct OverlapCase {
  const char* name;
  MeshOptions options;
  bool moe;
  ref::Precision precision = ref::Precision::kF64;
};

TEST(MeshOverlap, GradientSumsOverlapTheBackwardWithTheSameBits) {
  MeshOptions sp = mesh({.dp = 2, .tp = 2, .pp = 2});
  sp.sequence_parallel = true;
  MeshOptions interleaved = mesh({.dp = 2, .pp = 2});
  interleaved.schedule = PipeSchedule::interleaved;
  interleaved.virtual_stages = 2;
  const OverlapCase cases[] = {
      {"dp2-pp2", mesh({.dp = 2, .pp = 2}), false},
      {"dp2-tp2-pp2 sp", sp, false},
      {"dp4-ep2-pp2 zero1 moe", zero(mesh({.dp = 4, .pp = 2, .ep = 2}), 1), true},
      // bf16 issues each chunk's sums at its end, after the rounding.
      {"dp2-pp2 interleaved bf16", interleaved, false, ref::Precision::kBf16}};
  for (const OverlapCase& c : cases) {
    Scenario s = c.moe ? mesh_moe() : mesh_dense();
    s.train.steps = 2;
    s.train.precision = c.precision;
    MeshOptions on = c.options, off = c.options;
    on.overlap = true;
    off.overlap = false;
    const OverlapRun a = run(s, on), b = run(s, off);
    for (std::size_t r = 0; r < a.result.ranks.size(); ++r)
      for (std::size_t k = 0; k < a.result.ranks[r].steps.size(); ++k) {
        EXPECT_EQ(a.result.ranks[r].steps[k].loss, b.result.ranks[r].steps[k].loss) << c.name;
        for (const auto& p : b.result.ranks[r].params[k])
          EXPECT_EQ(a.result.ranks[r].params[k][p.name].vec(), p.value.vec())
              << c.name << " rank " << r << " " << p.name;
      }
    const auto [sum_on, bwd_on] = first_sum_and_last_backward(a.timeline);
    const auto [sum_off, bwd_off] = first_sum_and_last_backward(b.timeline);
    EXPECT_LT(sum_on, bwd_on) << c.name << ": no gradient sum overlapped the backward";
    EXPECT_GE(sum_off, bwd_off) << c.name << ": a gradient sum started before the backward ended";
  }
}

}  // namespace
}  // namespace shardcheck::parallel
