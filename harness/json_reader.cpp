// ObjectReader: typed, range-checked access to JSON objects with paths in every message.
#include "harness/json_reader.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
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

namespace {

// SAX handler of the streaming pass that parse_input_json makes before building the tree: the
// depth of each value as nlohmann's parser callback reported it (a key or value inside, or a
// container opened inside, a container kMaxJsonDepth deep is refused as soon as it is seen), the
// JSON path of every key, and the keys seen so far in each open object: a key given twice throws
// ScenarioError at its path. A parse error throws the parser's own exception (parse_error, or
// out_of_range for a number past double range). Linear in the text: nlohmann's callback parser
// rescans an array's elements at the end of each object in it (5.6 s for a 200 000-entry matrix).
class KeyPaths {
 public:
  using number_integer_t = nlohmann::json::number_integer_t;
  using number_unsigned_t = nlohmann::json::number_unsigned_t;
  using number_float_t = nlohmann::json::number_float_t;
  using string_t = nlohmann::json::string_t;
  using binary_t = nlohmann::json::binary_t;

  KeyPaths(const std::string& origin, const JsonInput& input) : origin_(origin), input_(input) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(number_integer_t) { return value(); }
  bool number_unsigned(number_unsigned_t) { return value(); }
  bool number_float(number_float_t, const string_t&) { return value(); }
  bool string(string_t&) { return value(); }
  bool binary(binary_t&) { return value(); }
  bool start_object(std::size_t) { return open(false); }
  bool start_array(std::size_t) { return open(true); }
  bool key(string_t& k) {
    check_depth();
    Frame& f = open_.back();
    ++f.members;
    const auto [it, fresh] = f.keys.emplace(k, f.members);
    if (!fresh)
      throw ScenarioError(origin_ + ": " + f.path + "." + comm::printable(k),
                          "duplicate key: " + f.path + "." + comm::printable(k) +
                              " is given twice in " + f.path + " (its members " +
                              std::to_string(it->second) + " and " + std::to_string(f.members) +
                              "); JSON readers differ on which one wins, so "
                              "give it once");
    f.last_key = k;
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;  // its static type: nlohmann::json::parse_error or out_of_range
  }

 private:
  struct Frame {
    std::string path;
    bool array = false;
    std::size_t members = 0;  // an array's elements so far; an object's keys so far
    std::map<std::string, std::size_t> keys;
    std::string last_key;
  };
  // The depth nlohmann's callback reported for a container's start, a key or a value: the number
  // of containers open around it.
  void check_depth() const {
    if (open_.size() > static_cast<std::size_t>(kMaxJsonDepth))
      throw ScenarioError(origin_, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                                       " levels; " + input_.noun + " needs at most a few");
  }
  bool value() {
    check_depth();
    element_done();
    return true;
  }
  bool open(bool array) {
    check_depth();
    open_.push_back({child(), array, 0, {}, {}});
    return true;
  }
  bool close() {
    open_.pop_back();
    element_done();
    return true;
  }
  // The path of the value about to start.
  std::string child() const {
    if (open_.empty()) return "$";
    const Frame& f = open_.back();
    return f.array ? f.path + "[" + std::to_string(f.members) + "]"
                   : f.path + "." + comm::printable(f.last_key);
  }
  void element_done() {
    if (!open_.empty() && open_.back().array) ++open_.back().members;
  }
  const std::string& origin_;
  const JsonInput& input_;
  std::vector<Frame> open_;
};

}  // namespace

std::string read_input_file(const std::string& file, const JsonInput& input) {
  const std::string shown = comm::printable(file);  // a file name may hold anything
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(file, ec);
  if (ec || !std::filesystem::exists(st))
    throw ScenarioError(shown, "cannot open " + input.file + " (" +
                                   (ec ? ec.message() : std::string("no such file")) + ")");
  if (!std::filesystem::is_regular_file(st))
    throw ScenarioError(shown,
                        "not a regular file; " + input.noun + " is read only from a regular file");
  const std::uintmax_t bytes = std::filesystem::file_size(file, ec);
  if (!ec && bytes > kMaxInputBytes)
    throw ScenarioError(shown, std::to_string(bytes) + " bytes; " + input.noun +
                                   " may have at most " + std::to_string(kMaxInputBytes));
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ScenarioError(shown, "cannot open " + input.file);
  std::string text;
  text.resize(static_cast<std::size_t>(ec ? 0 : bytes));
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (!in || in.peek() != std::ifstream::traits_type::eof())
    throw ScenarioError(shown, "could not read the whole file (it changed while being read)");
  return text;
}

nlohmann::json parse_input_json(std::string_view text, const std::string& origin,
                                const JsonInput& input) {
  if (text.size() > kMaxInputBytes)
    throw ScenarioError(origin, std::to_string(text.size()) + " bytes; " + input.noun +
                                    " may have at most " + std::to_string(kMaxInputBytes));
  // One streaming pass first (KeyPaths): deeper input than kMaxJsonDepth is refused as soon as
  // it is seen, before anything recurses over it, and a key given twice in one object (nlohmann
  // keeps the last) is refused, naming the object and both places of the key in it. Then the
  // tree, without a parser callback (nlohmann's callback parser is quadratic in an array's
  // length); the pass has already refused any text this parse would.
  try {
    KeyPaths keys(origin, input);
    nlohmann::json::sax_parse(text, &keys);
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ScenarioError(origin, std::string("not valid JSON: ") + e.what());
  } catch (const nlohmann::json::out_of_range& e) {  // a number past double range, e.g. 1e400
    throw ScenarioError(origin, std::string("a number out of range: ") + e.what());
  }
}

}  // namespace shardcheck::harness
