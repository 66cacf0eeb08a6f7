// The pipeline bubble of a run, measured on the simulator's virtual timeline and set beside the
// textbook formula (p-1)/(v*m+p-1): per stage, the idle fraction of its compute stream between the
// step's start and the end of the step's last forward/backward on any rank (so the optimizer and
// the gradient reductions after the pipeline are not counted), averaged over steps and stages.
// With equal stage costs and free communication the two agree (tests/mp/pipeline_run_test.cpp);
// on a real model the embedding, the head and the sends show as extra bubble.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/scenario.hpp"
#include "sim/timeline.hpp"

namespace shardcheck::harness {

struct PipelineResult {
  std::string schedule;  // gpipe, 1f1b, interleaved
  int stages = 1;
  int virtual_stages = 1;
  int microbatches = 1;  // per data-parallel rank and step
  double formula = 0;
  double measured = 0;  // mean over stages and steps
  // The same measure on the run replayed with free links (RunOptions::schedule_bubble): the
  // schedule's own bubble, which is (p-1)/(v*m+p-1) for equal stage costs; measured - schedule is
  // the compute stream's wait on communication. Negative when not measured.
  double schedule_bubble = -1;
  std::vector<double> stage_bubble;  // per stage, mean over steps and its ranks
};

// nullopt without pipeline parallelism (pp == 1) or without a timeline.
std::optional<PipelineResult> pipeline_bubble(const Scenario& s, const ParallelSpec& p,
                                              const std::vector<sim::TimelineEvent>& timeline,
                                              const std::vector<sim::StepTime>& steps);

}  // namespace shardcheck::harness
