// Report writers: report.json (the fields of DESIGN.md that exist so far), JUnit XML (one testcase
// per configuration), and the human summary table. Only harness/ knows these formats.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "harness/runner.hpp"

namespace shardcheck::harness {

// The run manifest (DESIGN.md report contract): the run id (null when ""), mesh, order, every
// rank's groups (of the base configuration, and of each configuration), precision, batch, seed,
// the model and data manifests, the checkpoint policy (harness/provenance.hpp), code version and
// commit. Also the "manifest" field of report.json.
nlohmann::json manifest_json(const Scenario& s, const std::string& run_id = "");
nlohmann::json report_json(const RunResult& r, const std::string& backend,
                           const std::string& run_id = "");
// {tokens_processed, tokens_skipped, tokens_replayed, tokens_discarded, tokens_good, fraction,
// seconds, tokens_per_s, good_tokens_per_s}; null when not measured.
nlohmann::json goodput_json(const GoodputResult& g);
// Text for XML attributes and content (JUnit files): & < > " ' escaped, control characters other
// than tab and newlines replaced by spaces (XML 1.0 forbids them).
std::string xml_escape(const std::string& s);
// Writes JUnit XML; throws std::runtime_error naming the file when it cannot be written.
void write_junit(const std::vector<RunResult>& runs, const std::string& file);
void print_summary(std::ostream& os, const RunResult& r);

}  // namespace shardcheck::harness
