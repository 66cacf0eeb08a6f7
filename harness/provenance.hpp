// Where a run comes from, for its manifest (DESIGN.md's report contract): a run id, the model
// manifest (the model block and its hash), the data manifest (the corpus parameters and a hash of
// the packed token stream), the checkpoint policy, and every configuration's rank -> group table,
// as JSON and as the lines `run` prints at start.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "harness/scenario.hpp"
#include "reference/data.hpp"

namespace shardcheck::harness {

// A new id for one invocation: UTC start time and 32 random bits ("20261207T230512Z-3f9a2c1b").
std::string new_run_id();

// {"config": the model block of the run's identity, "hash": "xxh3:<16 hex>"} over its JSON text.
nlohmann::json model_manifest(const Scenario& s);
// {"config": the data block of the run's identity, "seed", "documents", "sequences",
// "tokens" (non-padding), "hash": "xxh3:<16 hex>"} over every packed sequence's tokens, targets,
// loss mask, document ids and positions in dataset order: two runs with the same hash trained on
// the same stream.
nlohmann::json data_manifest(const Scenario& s, const ref::Dataset& ds);
// {"every", "keep", "restore_parallel" (label or null), "drills"}.
nlohmann::json checkpoint_policy(const Scenario& s);

// One entry per rank: {"rank", "dp", "tp", "pp", "cp", "ep", "edp"} with each group's members.
nlohmann::json groups_json(const ParallelSpec& p);
// The same as one line per configuration: "<label> (<n> ranks, order <order>): tp [0 1] [2 3];
// pp [0 2] [1 3]" listing the groups of every axis larger than 1 (and "one rank" for world 1).
std::string groups_line(const ParallelSpec& p);

}  // namespace shardcheck::harness
