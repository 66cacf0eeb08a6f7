// The planner's conformance check: one configuration's op logs (comm/op_log.hpp), recorded on
// every rank of the numeric run (the mesh engine built and driven as `run` does, on the
// simulator) and of the planner's timing-only run (the step skeleton on a meta SimWorld, the
// scenario's own model and batch), compared in their cost views. Equal logs mean the planner
// times what the engine issues: the same ops on the same groups with the same counts, in the same
// order, waited on at the same points, with the same compute between them.
#pragma once

#include <string>
#include <vector>

#include "comm/op_log.hpp"
#include "harness/scenario.hpp"
#include "parallel/testing.hpp"

namespace shardcheck::harness {

// One log per world rank of p's mesh: the engine trained s.train.steps steps (faults off).
// `planted` (tests): a known bug planted in the engine, so a test can show the check fails.
std::vector<comm::OpLog> engine_op_logs(
    const Scenario& s, const ParallelSpec& p,
    parallel::testing::Mutation planted = parallel::testing::Mutation::kNone);
// The same for the planner's timing-only run of p.
std::vector<comm::OpLog> planner_op_logs(const Scenario& s, const ParallelSpec& p);

// "" when every rank's cost views agree, else the first rank's first difference (engine first).
// MoE experts' FLOPs follow the engine's routing: the planner's (every assignment kept) must be at
// least the engine's, on each rank or (EP) over the world, and under EP the dispatch's splits are
// the planner's routing assumption (compared by group, dtype and peers).
std::string conformance(const Scenario& s, const ParallelSpec& p,
                        parallel::testing::Mutation planted = parallel::testing::Mutation::kNone);

}  // namespace shardcheck::harness
