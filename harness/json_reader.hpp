// Strict reading of JSON objects with the path of every value, so a bad scenario is answered with
// "$.parallel.tp: expected an integer >= 1, got \"two\"". Unknown keys are errors, never ignored.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardcheck::harness {

// Unusable input: `path` is the JSON path ("$.train.steps"), the message says what was expected.
class ScenarioError : public std::runtime_error {
 public:
  ScenarioError(std::string path, const std::string& message)
      : std::runtime_error(path + ": " + message), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One JSON object being read. Every getter records the key as known; finish() rejects the rest.
class ObjectReader {
 public:
  ObjectReader(const nlohmann::json& j, std::string path);

  const std::string& path() const { return path_; }
  // The key's path; a key holding control characters is escaped (comm/text.hpp's printable).
  std::string at(const std::string& key) const;
  bool has(const std::string& key) const;
  bool is_null(const std::string& key) const;

  int integer(const std::string& key, int fallback, int min, int max);
  int integer_required(const std::string& key, int min, int max);
  double number(const std::string& key, double fallback, double min, double max);
  bool boolean(const std::string& key, bool fallback);
  std::string text(const std::string& key, const std::string& fallback);
  // One of `choices`; the error lists them.
  std::string choice(const std::string& key, const std::string& fallback,
                     std::initializer_list<const char*> choices);
  // A nested object (must be an object when present); nullptr-like empty reader when absent.
  ObjectReader object(const std::string& key);
  // An array (must be an array when present); empty when absent.
  const nlohmann::json& array(const std::string& key);

  // The raw value (nullptr when absent), marking the key as known: for values read by hand.
  const nlohmann::json* raw(const std::string& key) { return value(key); }

  // Throws for keys that no getter asked for, naming the first and the known keys.
  void finish() const;

 private:
  const nlohmann::json* value(const std::string& key);
  const nlohmann::json& j_;
  std::string path_;
  std::set<std::string> known_;
};

std::string describe_json(const nlohmann::json& v);  // short rendering for messages

// The input limits of scenarios/README.md for a JSON file a command reads (a scenario, a model
// configuration), checked before parsing: nlohmann's parser and the error messages recurse per
// level, and a FIFO or device would block or never end.
inline constexpr std::uintmax_t kMaxInputBytes = std::uintmax_t{16} << 20;
inline constexpr int kMaxJsonDepth = 64;
struct JsonInput {
  std::string file;  // for "cannot open <file>": "the scenario file"
  std::string noun;  // for "<noun> may have at most ...": "a scenario"
};
// The whole text of a regular file of at most kMaxInputBytes; ScenarioError naming the file (as
// comm::printable shows it) otherwise.
std::string read_input_file(const std::string& file, const JsonInput& input);
// The JSON tree of text, refused with ScenarioError at `origin` (a printable name) when it is over
// kMaxInputBytes, not JSON, holds a number past double range or is nested deeper than
// kMaxJsonDepth, and at "<origin>: <path>" for a key given twice in one object.
nlohmann::json parse_input_json(std::string_view text, const std::string& origin,
                                const JsonInput& input);

}  // namespace shardcheck::harness
