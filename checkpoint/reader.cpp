// Fail-closed validation and resharding reads. Order of checks: marker -> manifest (checksum from
// the marker, schema, layout) -> each shard's presence, file type, header, size -> payload hashes.
// Every size comes from a bounded header or manifest before anything is allocated from it.
#include "checkpoint/reader.hpp"

#include <algorithm>

#include "checkpoint/io.hpp"
#include "checkpoint/shard_file.hpp"
#include "comm/errors.hpp"

namespace shardcheck::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::uint64_t kMaxMarkerBytes = 4096;
constexpr std::size_t kHashChunk = std::size_t{1} << 20;

// io:: raises plain CheckpointError(io_error); on the restore side every error is a RestoreError.
template <class F>
auto as_restore(F&& f, const std::string& file = {}, const std::string& tensor = {}) {
  try {
    return f();
  } catch (const RestoreError&) {
    throw;
  } catch (const CheckpointError& e) {
    throw RestoreError(e.reason(), e.detail(), e.file().empty() ? file : e.file(),
                       e.tensor().empty() ? tensor : e.tensor());
  } catch (const fs::filesystem_error& e) {
    throw RestoreError(Reason::io_error, e.what(), file, tensor);
  }
}

void require_regular(const fs::path& p, const std::string& name, Reason when_absent,
                     const std::string& tensor = {}) {
  switch (io::kind_of(p)) {
    case io::Kind::regular:
      return;
    case io::Kind::absent:
      throw RestoreError(when_absent, "file not found", name, tensor);
    case io::Kind::symlink:
      throw RestoreError(Reason::unsafe_path, "a symlink; checkpoint files must be regular files",
                         name, tensor);
    case io::Kind::other:
      throw RestoreError(Reason::unsafe_path, "not a regular file", name, tensor);
  }
}

struct Marker {
  std::uint64_t step = 0;
  std::uint64_t manifest_xxh3 = 0;
};

Marker read_marker(const fs::path& dir) {
  require_regular(dir / "SUCCESS", "SUCCESS", Reason::missing_marker);
  std::string text;
  try {
    text = io::read_small_file(dir / "SUCCESS", kMaxMarkerBytes, "SUCCESS");
  } catch (const CheckpointError& e) {
    throw RestoreError(Reason::bad_marker, e.detail(), "SUCCESS");
  }
  Marker m;
  try {
    const json j = json::parse(text);
    if (!j.is_object() || j.size() != 3 || j.at("format") != "shardcheck-checkpoint" ||
        !j.at("step").is_number_unsigned() ||
        !parse_hex64(j.at("manifest_xxh3").get<std::string>(), m.manifest_xxh3))
      throw std::invalid_argument("expected {format, step, manifest_xxh3}");
    m.step = j.at("step").get<std::uint64_t>();
  } catch (const std::exception& e) {
    throw RestoreError(Reason::bad_marker, std::string("unreadable: ") + e.what(), "SUCCESS");
  }
  return m;
}

bool same_slice(const Slice& a, const Slice& b) {
  return a == b;
}

}  // namespace

std::optional<std::uint64_t> parse_step_dir_name(const std::string& name) {
  if (name.size() < 6 || name.size() > 25 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  std::uint64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::vector<StepDir> list_steps(const fs::path& dir) {
  std::vector<StepDir> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto step = parse_step_dir_name(e.path().filename().string());
    if (!step || !e.is_directory() || e.is_symlink()) continue;
    out.push_back({*step, e.path(), io::kind_of(e.path() / "SUCCESS") != io::Kind::absent});
  }
  std::sort(out.begin(), out.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

std::optional<fs::path> latest_committed(const fs::path& dir) {
  const auto steps = list_steps(dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (it->committed) return it->path;
  return std::nullopt;
}

std::uint32_t check_shard_file(const fs::path& dir, const TensorRecord& t, const ShardRecord& s) {
  const fs::path p = dir / s.file;
  require_regular(p, s.file, Reason::missing_shard, t.name);
  return as_restore(
      [&] {
        io::File f(p);
        const std::uint64_t size = f.size();
        std::vector<std::byte> head(kHeaderFixedBytes);
        if (size < head.size() || !f.pread(0, head))
          throw RestoreError(Reason::truncated_shard, "shorter than a header", s.file, t.name);
        const std::uint32_t hsize = shard_header_size(head);
        if (size < hsize)
          throw RestoreError(Reason::truncated_shard, "ends inside its header", s.file, t.name);
        head.resize(hsize);
        if (!f.pread(0, head))
          throw RestoreError(Reason::truncated_shard, "ends inside its header", s.file, t.name);
        const ShardHeader h = parse_shard_header(head, s.file);
        if (h.tensor != t.name || h.dtype != t.dtype || h.shape != t.shape ||
            !same_slice(h.slice, s.slice) || h.payload_bytes != s.bytes)
          throw RestoreError(Reason::header_mismatch,
                             "header holds '" + h.tensor + "' " + describe(h.slice) +
                                 ", manifest says " + describe(s.slice),
                             s.file, t.name);
        if (h.payload_xxh3 != s.xxh3)
          throw RestoreError(Reason::stale_shard,
                             "header checksum " + hex64(h.payload_xxh3) + " is not the " +
                                 "committed " + hex64(s.xxh3) + ": the shard was replaced",
                             s.file, t.name);
        const std::uint64_t want = std::uint64_t{hsize} + s.bytes;
        if (size < want)
          throw RestoreError(Reason::truncated_shard,
                             std::to_string(size) + " bytes, expected " + std::to_string(want),
                             s.file, t.name);
        if (size > want)
          throw RestoreError(Reason::oversized_shard,
                             std::to_string(size) + " bytes, expected " + std::to_string(want),
                             s.file, t.name);
        return hsize;
      },
      s.file, t.name);
}

Checkpoint Checkpoint::open(const fs::path& step_dir, const OpenOptions& o) {
  Checkpoint c;
  c.dir_ = step_dir;
  as_restore([&] {
    const Marker marker = read_marker(step_dir);
    const auto named = parse_step_dir_name(step_dir.filename().string());
    if (named && *named != marker.step)
      throw RestoreError(Reason::bad_marker,
                         "marker says step " + std::to_string(marker.step) + ", directory " +
                             step_dir.filename().string(),
                         "SUCCESS");
    require_regular(step_dir / "manifest.json", "manifest.json", Reason::missing_manifest);
    const std::string text =
        io::read_small_file(step_dir / "manifest.json", kMaxManifestBytes, "manifest.json");
    if (xxh3(std::as_bytes(std::span(text))) != marker.manifest_xxh3)
      throw RestoreError(Reason::bad_marker, "manifest.json differs from the one committed",
                         "manifest.json");
    c.manifest_ = parse_manifest(text);
    if (c.manifest_.state.step != marker.step)
      throw RestoreError(Reason::bad_marker, "manifest and marker disagree on the step",
                         "manifest.json");
    for (const TensorRecord& t : c.manifest_.tensors) {
      auto& sizes = c.header_bytes_.emplace_back();
      for (const ShardRecord& s : t.shards) {
        sizes.push_back(check_shard_file(step_dir, t, s));
      }
    }
  });
  if (o.verify_checksums)
    for (std::size_t t = 0; t < c.manifest_.tensors.size(); ++t)
      for (std::size_t s = 0; s < c.manifest_.tensors[t].shards.size(); ++s) c.verify_shard(t, s);
  return c;
}

void Checkpoint::verify_shard(std::size_t t, std::size_t s) const {
  const TensorRecord& tr = manifest_.tensors[t];
  const ShardRecord& sr = tr.shards[s];
  as_restore(
      [&] {
        io::File f(dir_ / sr.file);
        Xxh3Stream h;
        std::vector<std::byte> buf(
            static_cast<std::size_t>(std::min<std::uint64_t>(kHashChunk, sr.bytes)));
        for (std::uint64_t at = 0; at < sr.bytes;) {
          const auto n =
              static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), sr.bytes - at));
          if (!f.pread(header_bytes_[t][s] + at, std::span(buf).first(n)))
            throw RestoreError(Reason::truncated_shard, "ended while hashing", sr.file, tr.name);
          h.update(std::span(buf).first(n));
          at += n;
        }
        if (h.digest() != sr.xxh3)
          throw RestoreError(Reason::checksum_mismatch,
                             "payload hashes to " + hex64(h.digest()) + ", header and manifest " +
                                 "say " + hex64(sr.xxh3) + ": corrupt bytes",
                             sr.file, tr.name);
      },
      sr.file, tr.name);
}

Checkpoint Checkpoint::open_collective(comm::Communicator& world, const fs::path& step_dir) {
  const int n = world.size(), rank = world.rank();
  std::optional<Checkpoint> c;
  std::exception_ptr mine;
  // {phase (0 structure, 1 payload, -1 none), global shard index, reason}
  std::int64_t status[3] = {-1, 0, 0};
  try {
    c = open(step_dir, {.verify_checksums = false});
  } catch (const RestoreError& e) {
    mine = std::current_exception();
    status[0] = 0;
    status[2] = static_cast<std::int64_t>(e.reason());
  }
  if (c) {
    std::int64_t index = 0;
    for (std::size_t t = 0; t < c->manifest_.tensors.size() && !mine; ++t)
      for (std::size_t s = 0; s < c->manifest_.tensors[t].shards.size() && !mine; ++s, ++index) {
        if (index % n != rank) continue;
        try {
          c->verify_shard(t, s);
        } catch (const RestoreError& e) {
          mine = std::current_exception();
          status[0] = 1;
          status[1] = index;
          status[2] = static_cast<std::int64_t>(e.reason());
        }
      }
  }
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(n));
  world
      .all_gather(comm::ConstBuffer{status, 3, comm::DType::i64},
                  comm::Buffer{all.data(), all.size(), comm::DType::i64})
      ->wait();
  int worst = -1;
  for (int r = 0; r < n; ++r) {
    const auto* s = &all[3 * static_cast<std::size_t>(r)];
    if (s[0] < 0) continue;
    const auto* w = worst < 0 ? nullptr : &all[3 * static_cast<std::size_t>(worst)];
    if (!w || s[0] < w[0] || (s[0] == w[0] && s[1] < w[1])) worst = r;
  }
  if (worst < 0) return std::move(*c);
  if (worst == rank || (mine && status[0] == 0)) std::rethrow_exception(mine);
  // Another rank found the problem: name the same shard from this rank's copy of the manifest.
  const auto* w = &all[3 * static_cast<std::size_t>(worst)];
  const auto reason = static_cast<Reason>(w[2]);
  const std::string by = "reported by rank " + std::to_string(worst);
  if (w[0] == 1 && c) {
    std::int64_t index = 0;
    for (const auto& t : c->manifest_.tensors)
      for (const auto& s : t.shards)
        if (index++ == w[1]) throw RestoreError(reason, by, s.file, t.name);
  }
  throw RestoreError(reason, by);
}

const TensorRecord& Checkpoint::find(std::string_view name) const {
  const TensorRecord* t = find_tensor(manifest_, name);
  if (!t)
    throw RestoreError(Reason::bad_request, "no such tensor in the checkpoint", "",
                       std::string(name));
  return *t;
}

const TensorRecord& Checkpoint::tensor(std::string_view name) const {
  return find(name);
}

void Checkpoint::read(std::string_view name, const Slice& region, std::span<std::byte> out) const {
  const TensorRecord& t = find(name);
  const auto ti = static_cast<std::size_t>(&t - manifest_.tensors.data());
  if (!within(t.shape, region))
    throw RestoreError(Reason::bad_request, describe(region) + " is not inside the tensor", "",
                       t.name);
  const std::size_t es = comm::size_of(t.dtype);
  const std::uint64_t n = element_count(region);
  if (out.size() != n * es)
    throw RestoreError(Reason::bad_request,
                       "output holds " + std::to_string(out.size()) + " bytes, region needs " +
                           std::to_string(n * es),
                       "", t.name);
  const Placement dst(t.shape, region);
  std::uint64_t copied = 0;
  std::vector<std::byte> buf;
  for (std::size_t si = 0; si < t.shards.size(); ++si) {
    const ShardRecord& s = t.shards[si];
    const Placement src(t.shape, s.slice);
    const auto span = src.span_overlapping(dst);
    if (!span) continue;
    const std::uint64_t lo = span->first, hi = span->second;
    buf.resize(static_cast<std::size_t>((hi - lo) * es));
    as_restore(
        [&] {
          io::File f(dir_ / s.file);
          if (!f.pread(header_bytes_[ti][si] + lo * es, buf))
            throw RestoreError(Reason::truncated_shard, "shrank after validation", s.file, t.name);
        },
        s.file, t.name);
    if (lo == 0 && hi * es == s.bytes && xxh3(buf) != s.xxh3)
      throw RestoreError(Reason::checksum_mismatch, "changed after validation", s.file, t.name);
    copied += src.copy_to(dst, buf, out, es, lo);
  }
  SC_CHECK(copied == n,
           "validated cover left " << n - copied << " elements of " << t.name << " unread");
}

std::vector<std::byte> Checkpoint::read(std::string_view tensor, const Slice& region) const {
  const TensorRecord& t = find(tensor);
  if (!within(t.shape, region))
    throw RestoreError(Reason::bad_request, describe(region) + " is not inside the tensor", "",
                       t.name);
  std::vector<std::byte> out(
      static_cast<std::size_t>(element_count(region) * comm::size_of(t.dtype)));
  read(tensor, region, out);
  return out;
}

Checkpoint open_latest(const fs::path& dir, const OpenOptions& o) {
  auto steps = list_steps(dir);
  std::erase_if(steps, [](const StepDir& s) { return !s.committed; });
  if (steps.empty())
    throw RestoreError(Reason::no_checkpoint, "no committed step-N in " + dir.string());
  try {
    return Checkpoint::open(steps.back().path, o);
  } catch (const RestoreError& e) {
    std::string previous;
    for (auto it = steps.rbegin() + 1; it != steps.rend() && previous.empty(); ++it) {
      try {
        Checkpoint::open(it->path, o);
        previous = it->path.string();
      } catch (const RestoreError&) {
      }
    }
    throw RestoreError(
        RestoreError(e.reason(), steps.back().path.filename().string() + ": " + e.detail(),
                     e.file(), e.tensor()),
        previous);
  }
}

}  // namespace shardcheck::checkpoint
