// A configuration's timeline two ways: the whole run in the Chrome Trace Event Format (what
// PyTorch's profiler and Kineto write; Perfetto and chrome://tracing open it), one file per
// configuration beside report.json; and one step of it, merged to what a 1000-pixel lane can show,
// for index.html. report.json keeps only the link and the counts.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/runner.hpp"

namespace shardcheck::harness {

// "traces/<scenario>/<index>-<config>.json" for the index-th configuration of the scenario,
// relative to the report directory (names made file-safe; the index keeps two configurations
// whose labels read alike apart).
std::string trace_file(const std::string& scenario, std::size_t index, const std::string& config);

// The Trace Event Format document of c's run: a process per rank (named with its mesh
// coordinates), a thread per stream (compute, collectives, p2p), a complete ("X") event per
// timeline event with its op, group, seq, bytes, step, pipeline stage and, inside the pipeline
// schedule, its pass (forward / backward), microbatch and chunk; an instant event at each rank's
// step starts; the faults (and their ranks' unfinished flight records) as instant events. Times in
// microseconds of the simulator's virtual clock.
// Events after the scenario's `steps` (the harness's final gather of every rank's parameters) are
// marked as such.
nlohmann::json chrome_trace(const ConfigResult& c, const std::string& scenario, int steps);

// The last training step (`steps`) of c's timeline in report.json's old "timeline" shape
// ({"ranks", "lane_ranks", "events"}) for the HTML figure: one rank per pipeline stage (else ranks
// 0 and 1), at most `max_ranks`; each stream's neighbouring events of one kind merged where the
// gap between them is under two pixels of the figure (span / 500); at most `max_events` blocks
// (the earliest). Null without a timeline.
nlohmann::json step_timeline(const ConfigResult& c, const std::string& trace, int steps,
                             int max_ranks = 8, std::size_t max_events = 250);

}  // namespace shardcheck::harness
