// manifest.json: what a committed checkpoint holds (every tensor's dtype, logical shape and shards
// with slice, size and checksum) and the training state needed to resume (step, consumed samples
// and tokens, data cursor, sampler, per-rank RNG, LR schedule, configs as opaque JSON). The parser
// is strict and fail-closed: unknown keys, wrong types, unsafe file names, bad layouts are refused.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/errors.hpp"
#include "checkpoint/layout.hpp"
#include "comm/dtype.hpp"

namespace shardcheck::checkpoint {

inline constexpr std::uint64_t kMaxManifestBytes = std::uint64_t{1} << 28;
// What the parsed JSON tree of a manifest may take in memory, estimated by a streaming pass before
// the tree is built: small values cost nlohmann's tree up to ~20x their text, so the byte limit
// alone would admit a 256 MiB file that needs gigabytes. A real manifest's tree is ~5x its text.
inline constexpr std::uint64_t kMaxManifestTreeBytes = std::uint64_t{1} << 30;
// Records a manifest may list, counted while the text is streamed (before the tree is built): a
// 400k-tensor manifest is refused in a fraction of a second instead of after building ~1 GB of
// records. Generous for real models: one tensor per parameter and state kind (param, master,
// exp_avg, exp_avg_sq), so a 61-layer model of 256 experts lists under 200k.
inline constexpr std::uint64_t kMaxManifestTensors = std::uint64_t{1} << 18;
inline constexpr int kMaxJsonDepth = 64;
inline constexpr std::uint64_t kMaxWorldSize = std::uint64_t{1} << 20;

struct ShardRecord {
  std::string file;  // one safe path component inside the step directory
  int rank = 0;      // the rank that wrote it (diagnosis only)
  Slice slice;
  std::uint64_t bytes = 0;  // payload bytes (the file adds its header)
  std::uint64_t xxh3 = 0;   // of the payload
};

struct TensorRecord {
  std::string name;
  comm::DType dtype = comm::DType::f32;
  Shape shape;
  std::vector<ShardRecord> shards;
};

// The training state a save records and a resume needs. Scalars are typed; everything whose schema
// belongs to another module is opaque JSON, stored and returned verbatim (null when not given).
struct RunState {
  std::uint64_t step = 0;
  std::uint64_t consumed_samples = 0;
  std::uint64_t consumed_tokens = 0;
  nlohmann::json mesh{};  // e.g. {"dp":4,"tp":2}
  std::string order{};    // e.g. "tp-cp-ep-dp-pp"
  std::string code_version{};
  std::string code_commit{};  // the writer's git commit; "unknown" when not recorded
  nlohmann::json data_cursor{}, sampler{}, lr_schedule{}, loss_scaler{}, optimizer{}, model{},
      training{}, extra{};
};

struct Manifest {
  std::uint32_t format_version = 0;
  std::uint64_t world_size = 0;
  RunState state;
  std::vector<nlohmann::json> rank_states;  // index = rank: that rank's RNG state and the like
  std::vector<TensorRecord> tensors;        // sorted by name; shards in slice order
};

std::string dump_manifest(const Manifest& m);
// Strict parse + check_layout(). Throws RestoreError: bad_manifest, version_mismatch, unsafe_path,
// and the layout reasons (naming the tensor and shard file). A streaming pass first refuses text
// that is not JSON, nests deeper than kMaxJsonDepth, lists more than kMaxManifestTensors tensors or
// whose tree would exceed max_tree_bytes (the estimated memory ceiling; tests lower it), stopping
// at the first limit crossed, before the tree is built.
Manifest parse_manifest(std::string_view text,
                        std::uint64_t max_tree_bytes = kMaxManifestTreeBytes);
// The streaming estimate of the bytes nlohmann's tree of `text` would allocate (nullopt when the
// text is not valid JSON or nests deeper than kMaxJsonDepth); the tree is never built.
std::optional<std::uint64_t> json_tree_bytes(std::string_view text);

// The layout rules shared by the save coordinator and the reader: names valid and unique, dtype
// sizes consistent, every slice inside its tensor, every element covered exactly once.
struct LayoutProblem {
  Reason reason;
  std::string tensor, file, detail;
};
std::optional<LayoutProblem> check_layout(const std::vector<TensorRecord>& tensors);

// The slice's JSON form ({"flat": {begin, count}} or {"box": {offset, length}}) and its strict
// parse (RestoreError(bad_manifest) naming `path`).
nlohmann::json slice_to_json(const Slice& s);
Slice slice_from_json(const nlohmann::json& j, const std::string& path, std::size_t ndim);

const TensorRecord* find_tensor(const Manifest& m, std::string_view name);

}  // namespace shardcheck::checkpoint
