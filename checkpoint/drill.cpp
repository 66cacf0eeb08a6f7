// Checkpoint damage for drills. Each works on the committed files in place (no validation first:
// the manifest is only parsed to find the shard), and uses plain std::filesystem and fstream.
#include "checkpoint/drill.hpp"

#include <fstream>

#include "checkpoint/io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/shard_file.hpp"

namespace shardcheck::checkpoint::drill {

namespace fs = std::filesystem;

namespace {

struct Target {
  fs::path path;
  std::string file, tensor;
  std::uint64_t payload_bytes = 0;
};

Target pick(const fs::path& step_dir, std::size_t index) {
  const Manifest m = parse_manifest(
      io::read_small_file(step_dir / "manifest.json", kMaxManifestBytes, "manifest.json"));
  std::vector<Target> all;
  for (const auto& t : m.tensors)
    for (const auto& s : t.shards) all.push_back({step_dir / s.file, s.file, t.name, s.bytes});
  if (all.empty()) throw RestoreError(Reason::bad_request, "checkpoint has no shards to damage");
  return all[index % all.size()];
}

std::vector<char> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void overwrite(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw CheckpointError(Reason::io_error, "cannot rewrite " + p.string());
}

}  // namespace

Damage remove_shard(const fs::path& step_dir, std::size_t shard_index) {
  const Target t = pick(step_dir, shard_index);
  fs::remove(t.path);
  return {t.file, t.tensor, Reason::missing_shard, "removed shard " + t.file};
}

Damage flip_payload_byte(const fs::path& step_dir, std::size_t shard_index, std::uint64_t byte) {
  const Target t = pick(step_dir, shard_index);
  auto bytes = slurp(t.path);
  const std::uint64_t header = bytes.size() - t.payload_bytes;
  const std::uint64_t at = header + byte % t.payload_bytes;
  bytes[at] = static_cast<char>(~bytes[at]);
  overwrite(t.path, bytes);
  return {t.file, t.tensor, Reason::checksum_mismatch,
          "flipped payload byte " + std::to_string(at - header) + " of " + t.file};
}

Damage truncate_shard(const fs::path& step_dir, std::size_t shard_index) {
  const Target t = pick(step_dir, shard_index);
  const std::uint64_t size = fs::file_size(t.path);
  fs::resize_file(t.path, size - (t.payload_bytes + 1) / 2);
  return {t.file, t.tensor, Reason::truncated_shard,
          "truncated " + t.file + " from " + std::to_string(size) + " bytes"};
}

Damage replace_with_stale_shard(const fs::path& step_dir, std::size_t shard_index) {
  const Target t = pick(step_dir, shard_index);
  const auto bytes = slurp(t.path);
  ShardHeader h = parse_shard_header(std::as_bytes(std::span(bytes)), t.file);
  std::vector<std::byte> payload(reinterpret_cast<const std::byte*>(bytes.data()) + h.header_bytes,
                                 reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
  for (auto& b : payload) b = std::byte(std::to_integer<unsigned>(b) + 1);
  h.payload_xxh3 = xxh3(payload);
  const auto header = encode_shard_header(h);
  std::vector<char> out(reinterpret_cast<const char*>(header.data()),
                        reinterpret_cast<const char*>(header.data()) + header.size());
  out.insert(out.end(), reinterpret_cast<const char*>(payload.data()),
             reinterpret_cast<const char*>(payload.data()) + payload.size());
  overwrite(t.path, out);
  return {t.file, t.tensor, Reason::stale_shard,
          "replaced " + t.file + " by a valid-looking shard with other values"};
}

Damage remove_marker(const fs::path& step_dir) {
  fs::remove(step_dir / "SUCCESS");
  return {"SUCCESS", "", Reason::missing_marker, "removed the SUCCESS marker"};
}

SaveOptions crash_before_commit(SaveOptions base, int rank) {
  auto inner = base.on_stage;
  base.on_stage = [inner, rank](SaveStage stage, int r) {
    if (inner) inner(stage, r);
    if (stage == SaveStage::shards_written && r == rank) throw SimulatedCrash(r);
  };
  return base;
}

}  // namespace shardcheck::checkpoint::drill
