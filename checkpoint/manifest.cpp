// manifest.json writer and strict reader. The reader never trusts a field: each is type-checked,
// bounded and, for file names, restricted to one safe path component before anything uses it.
#include "checkpoint/manifest.hpp"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/shard_file.hpp"

namespace shardcheck::checkpoint {

using nlohmann::json;

namespace {

constexpr const char* kFormatName = "shardcheck-checkpoint";

json slice_json_impl(const Slice& s) {
  if (const auto* f = std::get_if<FlatRange>(&s))
    return {{"flat", {{"begin", f->begin}, {"count", f->count}}}};
  const Box& b = std::get<Box>(s);
  return {{"box", {{"offset", b.offset}, {"length", b.length}}}};
}

// Fails closed with the JSON path of the offending field.
[[noreturn]] void bad(const std::string& path, const std::string& why) {
  throw RestoreError(Reason::bad_manifest, path + ": " + why);
}

void only_keys(const json& j, const std::string& path, std::initializer_list<const char*> keys) {
  if (!j.is_object()) bad(path, "expected an object");
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    if (std::none_of(keys.begin(), keys.end(), [&](const char* x) { return k == x; }))
      bad(path + "." + k, "unknown key");
  }
}

const json& field(const json& j, const std::string& path, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) bad(path + "." + key, "missing");
  return *it;
}

std::uint64_t u64(const json& j, const std::string& path, std::uint64_t max = UINT64_MAX) {
  if (!j.is_number_unsigned()) bad(path, "expected a non-negative integer");
  const auto v = j.get<std::uint64_t>();
  if (v > max) bad(path, std::to_string(v) + " exceeds " + std::to_string(max));
  return v;
}

std::string str(const json& j, const std::string& path, std::size_t max) {
  if (!j.is_string()) bad(path, "expected a string");
  const auto& s = j.get_ref<const std::string&>();
  if (s.size() > max) bad(path, "string longer than " + std::to_string(max));
  return s;
}

std::vector<std::uint64_t> u64s(const json& j, const std::string& path, std::size_t max_len) {
  if (!j.is_array()) bad(path, "expected an array");
  if (j.size() > max_len) bad(path, "more than " + std::to_string(max_len) + " entries");
  std::vector<std::uint64_t> v;
  for (std::size_t i = 0; i < j.size(); ++i)
    v.push_back(u64(j[i], path + "[" + std::to_string(i) + "]"));
  return v;
}

Slice parse_slice(const json& j, const std::string& path, std::size_t ndim) {
  if (!j.is_object() || j.size() != 1) bad(path, "expected {\"flat\": ...} or {\"box\": ...}");
  if (j.contains("flat")) {
    const json& f = j["flat"];
    only_keys(f, path + ".flat", {"begin", "count"});
    return FlatRange{u64(field(f, path + ".flat", "begin"), path + ".flat.begin"),
                     u64(field(f, path + ".flat", "count"), path + ".flat.count")};
  }
  if (j.contains("box")) {
    const json& b = j["box"];
    only_keys(b, path + ".box", {"offset", "length"});
    Box box{u64s(field(b, path + ".box", "offset"), path + ".box.offset", kMaxDims),
            u64s(field(b, path + ".box", "length"), path + ".box.length", kMaxDims)};
    if (box.offset.size() != ndim || box.length.size() != ndim)
      bad(path + ".box", "rank differs from the tensor's shape");
    return box;
  }
  bad(path, "expected {\"flat\": ...} or {\"box\": ...}");
}

bool unsafe_path(const std::string& f) {
  return f.find("..") != std::string::npos || f.find('/') != std::string::npos ||
         f.find('\\') != std::string::npos || f.find('\0') != std::string::npos;
}

ShardRecord parse_shard(const json& j, const std::string& path, std::size_t ndim,
                        std::uint64_t world) {
  only_keys(j, path, {"file", "rank", "slice", "bytes", "xxh3"});
  ShardRecord s;
  s.file = str(field(j, path, "file"), path + ".file", 4096);
  if (unsafe_path(s.file) || !is_safe_file_name(s.file))
    throw RestoreError(Reason::unsafe_path,
                       path + ".file is not one plain file name inside the checkpoint", s.file);
  s.rank = static_cast<int>(u64(field(j, path, "rank"), path + ".rank", world - 1));
  s.slice = parse_slice(field(j, path, "slice"), path + ".slice", ndim);
  s.bytes = u64(field(j, path, "bytes"), path + ".bytes");
  if (!parse_hex64(str(field(j, path, "xxh3"), path + ".xxh3", 16), s.xxh3))
    bad(path + ".xxh3", "expected 16 lowercase hex digits");
  return s;
}

TensorRecord parse_tensor(const json& j, const std::string& path, std::uint64_t world) {
  only_keys(j, path, {"name", "dtype", "shape", "shards"});
  TensorRecord t;
  t.name = str(field(j, path, "name"), path + ".name", kMaxNameBytes);
  const auto dt = comm::parse_dtype(str(field(j, path, "dtype"), path + ".dtype", 16));
  if (!dt) bad(path + ".dtype", "unknown dtype");
  t.dtype = *dt;
  t.shape = u64s(field(j, path, "shape"), path + ".shape", kMaxDims);
  const json& shards = field(j, path, "shards");
  if (!shards.is_array()) bad(path + ".shards", "expected an array");
  for (std::size_t i = 0; i < shards.size(); ++i)
    t.shards.push_back(
        parse_shard(shards[i], path + ".shards[" + std::to_string(i) + "]", t.shape.size(), world));
  return t;
}

json opaque(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() ? json() : *it;
}

}  // namespace

std::string dump_manifest(const Manifest& m) {
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    json shards = json::array();
    for (const auto& s : t.shards)
      shards.push_back({{"file", s.file},
                        {"rank", s.rank},
                        {"slice", slice_json_impl(s.slice)},
                        {"bytes", s.bytes},
                        {"xxh3", hex64(s.xxh3)}});
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(comm::name_of(t.dtype))},
                       {"shape", t.shape},
                       {"shards", std::move(shards)}});
  }
  json ranks = json::array();
  for (std::size_t r = 0; r < m.rank_states.size(); ++r)
    ranks.push_back({{"rank", r}, {"state", m.rank_states[r]}});
  const RunState& s = m.state;
  const json j = {{"format", kFormatName},
                  {"format_version", m.format_version},
                  {"step", s.step},
                  {"world_size", m.world_size},
                  {"mesh", s.mesh},
                  {"order", s.order},
                  {"code_version", s.code_version},
                  {"code_commit", s.code_commit},
                  {"consumed_samples", s.consumed_samples},
                  {"consumed_tokens", s.consumed_tokens},
                  {"data_cursor", s.data_cursor},
                  {"sampler", s.sampler},
                  {"lr_schedule", s.lr_schedule},
                  {"loss_scaler", s.loss_scaler},
                  {"optimizer", s.optimizer},
                  {"model", s.model},
                  {"training", s.training},
                  {"extra", s.extra},
                  {"ranks", std::move(ranks)},
                  {"tensors", std::move(tensors)}};
  return j.dump(1) + "\n";
}

namespace {

// SAX handler of the streaming pass (scan): adds what each event makes nlohmann's tree allocate
// (with allocator overhead): a value is 16 bytes in its parent's vector (counted twice for the
// vector's spare capacity), an object member a map node of ~96 bytes, a container its heap
// object, a string or key past the small-string buffer its characters. It also counts the
// entries of the top-level "tensors" array, and stops at the first limit crossed, so a hostile
// manifest costs the time to stream up to its limit, not to its end.
struct TreeCost {
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  // The container each open level is: the root object, the top-level "tensors" array, one of its
  // entries, anything else.
  enum Kind : char { root, tensors_array, other };

  std::uint64_t max_bytes = UINT64_MAX, max_tensors = UINT64_MAX;
  std::uint64_t bytes = 0, tensors = 0;
  bool too_deep = false, too_big = false, too_many = false;
  std::string error;  // the parser's message when the text is not valid JSON
  std::vector<Kind> open_kinds;
  bool tensors_key = false;  // the last key read was the root object's "tensors"

  static std::uint64_t chars(const std::string& s) { return s.size() > 15 ? s.size() + 17 : 0; }
  bool value() {
    bytes += 32;
    if (bytes > max_bytes) too_big = true;
    return !too_big;
  }
  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(number_integer_t) { return value(); }
  bool number_unsigned(number_unsigned_t) { return value(); }
  bool number_float(number_float_t, const string_t&) { return value(); }
  bool string(string_t& s) {
    bytes += chars(s) + 48;
    return value();
  }
  bool binary(binary_t&) { return value(); }
  bool open(Kind kind) {
    if (!open_kinds.empty() && open_kinds.back() == tensors_array && ++tensors > max_tensors)
      too_many = true;
    open_kinds.push_back(kind);
    tensors_key = false;
    bytes += 64;
    if (open_kinds.size() > static_cast<std::size_t>(kMaxJsonDepth)) too_deep = true;
    return !too_deep && !too_many && value();
  }
  bool start_object(std::size_t) { return open(open_kinds.empty() ? root : other); }
  bool start_array(std::size_t) {
    return open(tensors_key && open_kinds.size() == 1 ? tensors_array : other);
  }
  bool key(string_t& k) {
    tensors_key = open_kinds.size() == 1 && open_kinds.back() == root && k == "tensors";
    bytes += 96 + chars(k);
    return true;
  }
  bool close() {
    open_kinds.pop_back();
    tensors_key = false;
    return true;
  }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error = e.what();
    return false;
  }
};

// One streaming pass over the text with the given limits (the tree is never built).
TreeCost scan(std::string_view text, std::uint64_t max_bytes, std::uint64_t max_tensors) {
  TreeCost cost;
  cost.max_bytes = max_bytes;
  cost.max_tensors = max_tensors;
  try {
    json::sax_parse(text, &cost);
  } catch (const json::exception& e) {
    if (cost.error.empty()) cost.error = e.what();
  }
  return cost;
}

std::string size_text(std::uint64_t bytes) {
  return bytes >= (std::uint64_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB"
                                           : std::to_string(bytes) + " bytes";
}

}  // namespace

std::optional<std::uint64_t> json_tree_bytes(std::string_view text) {
  const TreeCost cost = scan(text, UINT64_MAX, UINT64_MAX);
  if (!cost.error.empty() || cost.too_deep) return std::nullopt;
  return cost.bytes;
}

Manifest parse_manifest(std::string_view text, std::uint64_t max_tree_bytes) {
  if (text.size() > kMaxManifestBytes) bad("$", "manifest larger than the limit");
  // Streamed first, stopping at the first limit crossed: the text is valid JSON, nests at most
  // kMaxJsonDepth deep (so no walk of the tree can exhaust a stack), lists at most
  // kMaxManifestTensors tensors and its tree fits max_tree_bytes, all before the tree is built.
  const TreeCost cost = scan(text, max_tree_bytes, kMaxManifestTensors);
  if (cost.too_many)
    bad("$.tensors", "more than " + std::to_string(kMaxManifestTensors) +
                         " tensors listed; a manifest may list at most " +
                         std::to_string(kMaxManifestTensors));
  if (cost.too_deep)
    bad("$", "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  if (cost.too_big)
    bad("$", "its JSON tree would take more than " + size_text(max_tree_bytes) +
                 " in memory; a manifest may take at most " + size_text(max_tree_bytes));
  if (!cost.error.empty()) bad("$", "not valid JSON: " + cost.error);
  json j;
  try {
    // Without a parser callback: nlohmann's callback parser rescans an array's elements at the end
    // of each object in it, quadratic in the number of tensors (50 s for 400k).
    j = json::parse(text);
  } catch (const std::exception& e) {
    bad("$", std::string("not valid JSON: ") + e.what());
  }
  only_keys(j, "$", {"format",          "format_version", "step",
                     "world_size",      "mesh",           "order",
                     "code_version",    "code_commit",    "consumed_samples",
                     "consumed_tokens", "data_cursor",    "sampler",
                     "lr_schedule",     "loss_scaler",    "optimizer",
                     "model",           "training",       "extra",
                     "ranks",           "tensors"});
  if (str(field(j, "$", "format"), "$.format", 64) != kFormatName)
    bad("$.format", std::string("expected \"") + kFormatName + "\"");
  Manifest m;
  const auto version = u64(field(j, "$", "format_version"), "$.format_version");
  if (version != kFormatVersion)
    throw RestoreError(Reason::version_mismatch,
                       "manifest format_version " + std::to_string(version) +
                           ", this reader knows " + std::to_string(kFormatVersion));
  m.format_version = kFormatVersion;
  m.world_size = u64(field(j, "$", "world_size"), "$.world_size", kMaxWorldSize);
  if (m.world_size == 0) bad("$.world_size", "must be at least 1");
  RunState& s = m.state;
  s.step = u64(field(j, "$", "step"), "$.step");
  s.consumed_samples = u64(field(j, "$", "consumed_samples"), "$.consumed_samples");
  s.consumed_tokens = u64(field(j, "$", "consumed_tokens"), "$.consumed_tokens");
  s.order = str(field(j, "$", "order"), "$.order", 256);
  s.code_version = str(field(j, "$", "code_version"), "$.code_version", 256);
  // Informational, so a manifest written before it was recorded still opens.
  s.code_commit =
      j.contains("code_commit") ? str(j["code_commit"], "$.code_commit", 256) : "unknown";
  s.mesh = opaque(j, "mesh");
  s.data_cursor = opaque(j, "data_cursor");
  s.sampler = opaque(j, "sampler");
  s.lr_schedule = opaque(j, "lr_schedule");
  s.loss_scaler = opaque(j, "loss_scaler");
  s.optimizer = opaque(j, "optimizer");
  s.model = opaque(j, "model");
  s.training = opaque(j, "training");
  s.extra = opaque(j, "extra");
  const json& ranks = field(j, "$", "ranks");
  if (!ranks.is_array() || ranks.size() != m.world_size)
    bad("$.ranks", "expected one entry per rank of world_size");
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::string p = "$.ranks[" + std::to_string(r) + "]";
    only_keys(ranks[r], p, {"rank", "state"});
    if (u64(field(ranks[r], p, "rank"), p + ".rank") != r) bad(p + ".rank", "out of order");
    m.rank_states.push_back(opaque(ranks[r], "state"));
  }
  const json& tensors = field(j, "$", "tensors");
  if (!tensors.is_array()) bad("$.tensors", "expected an array");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    m.tensors.push_back(
        parse_tensor(tensors[i], "$.tensors[" + std::to_string(i) + "]", m.world_size));
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const TensorRecord& a, const TensorRecord& b) { return a.name < b.name; });
  if (auto p = check_layout(m.tensors))
    throw RestoreError(p->reason, p->detail, p->file, p->tensor);
  return m;
}

std::optional<LayoutProblem> check_layout(const std::vector<TensorRecord>& tensors) {
  std::set<std::string_view> names, files;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name.size() > kMaxNameBytes || t.name.find('\0') != std::string::npos)
      return LayoutProblem{Reason::bad_tensor, t.name, "", "tensor name empty, too long or NUL"};
    if (!names.insert(t.name).second)
      return LayoutProblem{Reason::bad_tensor, t.name, "", "tensor listed twice"};
    if (!checked_volume(t.shape))
      return LayoutProblem{
          Reason::bad_tensor, t.name, "",
          "logical shape has more than " + std::to_string(kMaxDims) + " dims or 2^56 elements"};
    std::vector<Slice> slices;
    for (const auto& s : t.shards) {
      if (!is_safe_file_name(s.file))
        return LayoutProblem{Reason::unsafe_path, t.name, s.file, "not a plain file name"};
      if (!files.insert(s.file).second)
        return LayoutProblem{Reason::duplicate_shard, t.name, s.file, "file listed twice"};
      if (!within(t.shape, s.slice))
        return LayoutProblem{Reason::out_of_bounds, t.name, s.file,
                             describe(s.slice) + " outside the logical shape"};
      const std::uint64_t n = element_count(s.slice);
      if (n == 0) return LayoutProblem{Reason::bad_tensor, t.name, s.file, "empty shard"};
      if (s.bytes != n * comm::size_of(t.dtype))
        return LayoutProblem{Reason::bad_tensor, t.name, s.file,
                             std::to_string(s.bytes) + " bytes for " + std::to_string(n) +
                                 " elements of " + std::string(comm::name_of(t.dtype))};
      slices.push_back(s.slice);
    }
    if (auto p = check_exact_cover(t.shape, slices)) {
      const Reason r = p->kind == CoverProblem::overlap ? Reason::overlapping_shards
                                                        : Reason::incomplete_coverage;
      const std::string file = slices.empty() ? "" : t.shards[p->first].file;
      std::string detail = p->detail;
      if (p->kind == CoverProblem::overlap) detail += " (with '" + t.shards[p->second].file + "')";
      return LayoutProblem{r, t.name, p->kind == CoverProblem::gap ? "" : file, detail};
    }
  }
  return std::nullopt;
}

json slice_to_json(const Slice& s) {
  return slice_json_impl(s);
}

Slice slice_from_json(const json& j, const std::string& path, std::size_t ndim) {
  return parse_slice(j, path, ndim);
}

const TensorRecord* find_tensor(const Manifest& m, std::string_view name) {
  const auto it =
      std::lower_bound(m.tensors.begin(), m.tensors.end(), name,
                       [](const TensorRecord& t, std::string_view n) { return t.name < n; });
  return it != m.tensors.end() && it->name == name ? &*it : nullptr;
}

}  // namespace shardcheck::checkpoint
