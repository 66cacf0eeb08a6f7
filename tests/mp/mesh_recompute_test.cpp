// Activation recomputation on the mesh engine (train.recompute): selective (the attention core)
// and full (each block from its input, its TP/CP/EP collectives again) give the same bits as none
// on 3-D meshes with dropout, and the tracker's activation peak shows each mode's saving.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/mp/mesh_support.hpp"

namespace shardcheck::parallel {
namespace {

using namespace mesh_test;  // NOLINT

struct RecomputeCase {
  const char* name;
  MeshOptions options;
  bool moe;
  // The attention core keeps probabilities to drop: Ulysses, or one CP rank (the reference's
  // attention); the ring (flash-style) keeps none.
  bool selective_saves;
};

std::vector<RecomputeCase> recompute_cases() {
  MeshOptions ulysses = mesh({.dp = 2, .pp = 2, .cp = 2});
  ulysses.cp_algo = CpAlgo::ulysses;
  MeshOptions sp = mesh({.dp = 2, .tp = 2, .pp = 2});
  sp.sequence_parallel = true;
  return {{"dp2-pp2-cp2 ulysses", ulysses, false, true},
          {"dp2-pp2-cp2 ring", mesh({.dp = 2, .pp = 2, .cp = 2}), false, false},
          {"dp2-tp2-pp2 sp", sp, false, true},
          {"dp2-ep2-pp2 moe zero1", zero(mesh({.dp = 2, .pp = 2, .ep = 2}), 1), true, true}};
}

TEST(MeshRecompute, EveryModeGivesTheBitsOfNoneAndSavesActivations) {
  for (const RecomputeCase& c : recompute_cases()) {
    std::vector<test::DpRun> runs;
    std::vector<std::size_t> peaks;
    for (const ref::Recompute mode :
         {ref::Recompute::kNone, ref::Recompute::kSelective, ref::Recompute::kFull}) {
      Scenario s = c.moe ? mesh_moe() : mesh_dense();
      s.model.dropout = 0.1;
      s.train.recompute = mode;
      runs.push_back(mesh_run(s, c.options));
      std::size_t peak = 0;
      for (const RankMemory& m : mesh_memory(s, c.options))
        peak = std::max(peak, of(m.peaks, comm::MemCategory::activations));
      peaks.push_back(peak);
    }
    for (std::size_t m = 1; m < runs.size(); ++m)
      for (std::size_t r = 0; r < runs[0].ranks.size(); ++r) {
        const test::Trace& want = runs[0].ranks[r];
        const test::Trace& got = runs[m].ranks[r];
        ASSERT_EQ(got.steps.size(), want.steps.size());
        for (std::size_t k = 0; k < want.steps.size(); ++k) {
          EXPECT_EQ(got.steps[k].loss, want.steps[k].loss) << c.name << " mode " << m;
          EXPECT_EQ(got.steps[k].grad_norm, want.steps[k].grad_norm) << c.name << " mode " << m;
          for (const auto& p : want.params[k])
            EXPECT_EQ(got.params[k][p.name].vec(), p.value.vec())
                << c.name << " mode " << m << " rank " << r << " " << p.name;
        }
      }
    std::printf("%-24s activation peak none %zu  selective %zu  full %zu B\n", c.name, peaks[0],
                peaks[1], peaks[2]);
    EXPECT_LT(peaks[2], peaks[1]) << c.name;
    if (c.selective_saves)
      EXPECT_LT(peaks[1], peaks[0]) << c.name;
    else
      EXPECT_EQ(peaks[1], peaks[0]) << c.name;  // nothing to drop
  }
}

// Recomputation is checked against the reference too (not only against none).
TEST(MeshRecompute, FullRecomputeKeepsParity) {
  Scenario s = mesh_dense();
  s.train.recompute = ref::Recompute::kFull;
  const Parity p = parity(s, mesh({.dp = 2, .tp = 2, .pp = 2}));
  EXPECT_LE(p.max(), test::kF64Tolerance) << p.worst;
}

}  // namespace
}  // namespace shardcheck::parallel
