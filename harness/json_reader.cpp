// ObjectReader: typed, range-checked access to JSON objects with paths in every message.
#include "harness/json_reader.hpp"

#include <cmath>
#include <sstream>

#include "comm/text.hpp"

namespace shardcheck::harness {

namespace {
const nlohmann::json& empty_object() {
  static const nlohmann::json e = nlohmann::json::object();
  return e;
}
}  // namespace

std::string describe_json(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

ObjectReader::ObjectReader(const nlohmann::json& j, std::string path)
    : j_(j.is_null() ? empty_object() : j), path_(std::move(path)) {
  if (!j_.is_object()) throw ScenarioError(path_, "expected an object, got " + describe_json(j_));
}

std::string ObjectReader::at(const std::string& key) const {
  return path_ + "." + comm::printable(key);
}

bool ObjectReader::has(const std::string& key) const {
  return j_.contains(key);
}

bool ObjectReader::is_null(const std::string& key) const {
  return !j_.contains(key) || j_.at(key).is_null();
}

const nlohmann::json* ObjectReader::value(const std::string& key) {
  known_.insert(key);
  auto it = j_.find(key);
  return it == j_.end() ? nullptr : &*it;
}

int ObjectReader::integer(const std::string& key, int fallback, int min, int max) {
  const nlohmann::json* v = value(key);
  if (!v) return fallback;
  const std::string expected = "expected an integer in [" + std::to_string(min) + ", " +
                               std::to_string(max) + "], got " + describe_json(*v);
  // Integers are JSON integers everywhere (2.0 and 2e0 are refused, as for "seed").
  if (!v->is_number_integer()) throw ScenarioError(at(key), expected);
  const auto x = v->get<long long>();
  if (x < min || x > max) throw ScenarioError(at(key), expected);
  return static_cast<int>(x);
}

int ObjectReader::integer_required(const std::string& key, int min, int max) {
  if (!has(key))
    throw ScenarioError(at(key), "missing; expected an integer in [" + std::to_string(min) + ", " +
                                     std::to_string(max) + "]");
  return integer(key, 0, min, max);
}

double ObjectReader::number(const std::string& key, double fallback, double min, double max) {
  const nlohmann::json* v = value(key);
  if (!v) return fallback;
  if (!v->is_number() || !(v->get<double>() >= min && v->get<double>() <= max)) {
    std::ostringstream os;
    os << "expected a number in [" << min << ", " << max << "], got " << describe_json(*v);
    throw ScenarioError(at(key), os.str());
  }
  return v->get<double>();
}

bool ObjectReader::boolean(const std::string& key, bool fallback) {
  const nlohmann::json* v = value(key);
  if (!v) return fallback;
  if (!v->is_boolean())
    throw ScenarioError(at(key), "expected true or false, got " + describe_json(*v));
  return v->get<bool>();
}

std::string ObjectReader::text(const std::string& key, const std::string& fallback) {
  const nlohmann::json* v = value(key);
  if (!v) return fallback;
  if (!v->is_string()) throw ScenarioError(at(key), "expected a string, got " + describe_json(*v));
  return v->get<std::string>();
}

std::string ObjectReader::choice(const std::string& key, const std::string& fallback,
                                 std::initializer_list<const char*> choices) {
  const std::string s = text(key, fallback);
  std::string list;
  for (const char* c : choices) {
    if (s == c) return s;
    list += std::string(list.empty() ? "" : ", ") + "\"" + c + "\"";
  }
  throw ScenarioError(at(key), "expected one of " + list + ", got " + describe_json(s));
}

ObjectReader ObjectReader::object(const std::string& key) {
  const nlohmann::json* v = value(key);
  if (v && !v->is_object() && !v->is_null())
    throw ScenarioError(at(key), "expected an object, got " + describe_json(*v));
  return ObjectReader(v ? *v : empty_object(), at(key));
}

const nlohmann::json& ObjectReader::array(const std::string& key) {
  static const nlohmann::json empty = nlohmann::json::array();
  const nlohmann::json* v = value(key);
  if (!v || v->is_null()) return empty;
  if (!v->is_array()) throw ScenarioError(at(key), "expected an array, got " + describe_json(*v));
  return *v;
}

void ObjectReader::finish() const {
  for (const auto& [k, v] : j_.items()) {
    if (known_.count(k)) continue;
    std::string list;
    for (const auto& name : known_) list += (list.empty() ? "" : ", ") + name;
    throw ScenarioError(at(k), "unknown key; expected one of: " + list);
  }
}

}  // namespace shardcheck::harness
