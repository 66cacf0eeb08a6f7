// The chunk walk (parallel/mp/mesh_walk.hpp) that the engine, its ledger and the planner share:
// the steps' order and units, and that every gradient a chunk's backward writes is completed by
// exactly one of its steps, on every rank of pipelined meshes (tied and untied embeddings,
// interleaved stages, pp 1 with virtual stages, FSDP wrap groups).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "comm/mesh.hpp"
#include "parallel/layerwise.hpp"
#include "parallel/mp/mesh_params.hpp"
#include "parallel/mp/mesh_residency.hpp"
#include "parallel/mp/mesh_walk.hpp"
#include "tests/mp/mesh_support.hpp"

namespace shardcheck::parallel::mesh_detail {
namespace {

using Part = ChunkStep::Part;

std::map<int, int> layerwise(const ref::ModelConfig& m) {
  return wrap_map(m, FsdpOptions{});
}

TEST(MeshWalk, AForwardRunsEmbeddingLayersHeadAndABackwardTheReverse) {
  const ref::ModelConfig m = mesh_test::mesh_dense().model;  // 4 layers, tied
  const std::map<int, int> wrap = layerwise(m);
  const std::vector<ChunkStep> f = chunk_steps(m, wrap, {0, 4}, true, true, true, true);
  ASSERT_EQ(f.size(), 6U);
  EXPECT_EQ(f.front().part, Part::embed);
  EXPECT_EQ(f.front().units, std::vector<int>{wrap.at(0)});
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(f[static_cast<std::size_t>(l + 1)].layer, l);
    EXPECT_EQ(f[static_cast<std::size_t>(l + 1)].units, std::vector<int>{wrap.at(l + 1)});
  }
  EXPECT_EQ(f.back().part, Part::head);
  EXPECT_EQ(f.back().units, (std::vector<int>{wrap.at(5), wrap.at(0)}));  // with the tied table

  const std::vector<ChunkStep> b = chunk_steps(m, wrap, {0, 4}, true, true, true, false);
  ASSERT_EQ(b.size(), 6U);
  EXPECT_EQ(b.front().part, Part::head);
  for (int l = 0; l < 4; ++l) EXPECT_EQ(b[static_cast<std::size_t>(l + 1)].layer, 3 - l);
  EXPECT_EQ(b.back().part, Part::embed);
  EXPECT_TRUE(b.back().units.empty());  // the embedding's backward uses no parameters
  EXPECT_EQ(step_uses(b).size(), 5U);

  // A middle stage: its layers only.
  const std::vector<ChunkStep> mid = chunk_steps(m, wrap, {1, 3}, false, false, false, false);
  ASSERT_EQ(mid.size(), 2U);
  EXPECT_EQ(mid[0].layer, 2);
  EXPECT_EQ(mid[1].layer, 1);
}

// Records what a walk calls, in order.
struct Recorder {
  std::vector<std::string> calls;
  void use() { calls.push_back("use"); }
  void begin(std::size_t k) { calls.push_back("begin " + std::to_string(k)); }
  static std::string name(const ChunkStep& s) {
    return s.part == Part::layer ? "layer " + std::to_string(s.layer)
                                 : (s.part == Part::embed ? "embed" : "head");
  }
  void forward(const ChunkStep& s, int i) {
    calls.push_back("fwd " + name(s) + " #" + std::to_string(i));
  }
  void recompute(const ChunkStep& s, int i) {
    calls.push_back("again " + name(s) + " #" + std::to_string(i));
  }
  void backward(const ChunkStep& s, int i) {
    calls.push_back("bwd " + name(s) + " #" + std::to_string(i));
  }
  void complete(const ChunkStep& s, std::size_t k) {
    calls.push_back("done " + name(s) + " " + std::to_string(k));
  }
};

TEST(MeshWalk, FullRecomputeRunsEachLayersForwardAgainBeforeItsBackward) {
  ref::ModelConfig m = mesh_test::mesh_dense().model;
  m.layers = 1;
  const std::map<int, int> wrap = layerwise(m);
  const std::vector<ChunkStep> b = chunk_steps(m, wrap, {0, 1}, true, true, true, false);
  Recorder none, full;
  walk_backward(b, 2, false, none);
  walk_backward(b, 2, true, full);
  const std::vector<std::string> want_none = {
      "use",     "begin 0",      "bwd head #0",    "bwd head #1",    "done head 0",
      "use",     "begin 1",      "bwd layer 0 #0", "bwd layer 0 #1", "done layer 0 1",
      "begin 2", "bwd embed #0", "bwd embed #1",   "done embed 2"};
  EXPECT_EQ(none.calls, want_none);
  const std::vector<std::string> want_full = {"use",
                                              "begin 0",
                                              "bwd head #0",
                                              "bwd head #1",
                                              "done head 0",
                                              "use",
                                              "begin 1",
                                              "again layer 0 #0",
                                              "bwd layer 0 #0",
                                              "again layer 0 #1",
                                              "bwd layer 0 #1",
                                              "done layer 0 1",
                                              "begin 2",
                                              "bwd embed #0",
                                              "bwd embed #1",
                                              "done embed 2"};
  EXPECT_EQ(full.calls, want_full);
  Recorder fwd;
  walk_forward(chunk_steps(m, wrap, {0, 1}, true, true, true, true), 1, fwd);
  EXPECT_EQ(fwd.calls, (std::vector<std::string>{"use", "fwd embed #0", "use", "fwd layer 0 #0",
                                                 "use", "fwd head #0"}));
}

// Every parameter a rank's chunk writes (chunk_writes) is completed by exactly one step of that
// chunk's backward, and no step completes a parameter the chunk does not write. Both read the
// parameter's unit (LocalParam::unit): it is unit_of's for its name.
void expect_each_write_completed_once(const ref::ModelConfig& m, int pp, int v) {
  const comm::DeviceMesh mesh(comm::MeshShape{.pp = pp});  // rank = stage
  const std::map<int, int> wrap = layerwise(m);
  const int last_vs = pp * v - 1;
  for (int stage = 0; stage < pp; ++stage) {
    const StagePlan plan = stage_plan(m, pp, v, stage);
    for (int c = 0; c < v; ++c) {
      const int vs = c * pp + stage;
      const std::vector<ChunkStep> b =
          chunk_steps(m, wrap, plan.chunk_layers[static_cast<std::size_t>(c)], vs == 0,
                      vs == last_vs, plan.has_embed, false);
      for (const LocalParam& p : local_params(m, mesh, stage, v)) {
        EXPECT_EQ(p.unit, unit_of(m, p.name)) << p.name;
        int by = 0;
        for (const ChunkStep& s : b) by += s.completes(p) ? 1 : 0;
        EXPECT_EQ(by, chunk_writes(m, plan, c, vs, last_vs, p) ? 1 : 0)
            << p.name << " pp " << pp << " v " << v << " stage " << stage << " chunk " << c;
      }
    }
  }
}

TEST(MeshWalk, EachGradientAChunkWritesIsCompletedByOneOfItsSteps) {
  ref::ModelConfig tied = mesh_test::mesh_dense().model;
  ref::ModelConfig untied = mesh_test::mesh_moe().model;
  for (const ref::ModelConfig& m : {tied, untied}) {
    expect_each_write_completed_once(m, 1, 1);
    expect_each_write_completed_once(m, 2, 1);
    expect_each_write_completed_once(m, 4, 1);
    expect_each_write_completed_once(m, 2, 2);
    expect_each_write_completed_once(m, 1, 2);
  }
}

}  // namespace
}  // namespace shardcheck::parallel::mesh_detail
