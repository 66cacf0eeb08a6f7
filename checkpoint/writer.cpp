// The commit protocol of save(). Message flow over the world communicator: rank 0 prepares
// step-N.tmp (verdict broadcast) -> every rank writes its shards (in waves when asked) -> reports
// gathered to rank 0 -> rank 0 validates and commits -> verdict broadcast. Each rank takes part in
// every collective even after a local error, so one bad rank fails the save instead of hanging it.
#include "checkpoint/writer.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <thread>

#include "checkpoint/io.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/shard_file.hpp"

namespace shardcheck::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Carries an exception thrown by SaveOptions::on_stage past the coordinator's error handling: a
// hook that throws means "this rank dies here", not "the save failed cleanly".
struct HookThrew {
  std::exception_ptr error;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

json error_json(const CheckpointError& e) {
  return {{"reason", static_cast<int>(e.reason())},
          {"detail", e.detail()},
          {"file", e.file()},
          {"tensor", e.tensor()}};
}

[[noreturn]] void throw_save_error(const json& e) {
  throw SaveError(static_cast<Reason>(e.at("reason").get<int>()), e.at("detail").get<std::string>(),
                  e.at("file").get<std::string>(), e.at("tensor").get<std::string>());
}

// Rank 0's bytes on every rank: the size, then the bytes.
std::vector<std::uint8_t> broadcast_bytes(comm::Communicator& world, std::vector<std::uint8_t> b) {
  std::int64_t n = static_cast<std::int64_t>(b.size());
  world.broadcast(comm::Buffer{&n, 1, comm::DType::i64})->wait();
  b.resize(static_cast<std::size_t>(n));
  world.broadcast(comm::Buffer{b.data(), b.size(), comm::DType::u8})->wait();
  return b;
}

json broadcast_json(comm::Communicator& world, const json& j) {
  return json::from_cbor(
      broadcast_bytes(world, world.rank() == 0 ? json::to_cbor(j) : std::vector<std::uint8_t>{}));
}

// Every rank's bytes on rank 0 (one vector per rank); empty elsewhere.
std::vector<std::vector<std::uint8_t>> gather_to_root(comm::Communicator& world,
                                                      const std::vector<std::uint8_t>& mine) {
  const auto n = static_cast<std::size_t>(world.size());
  std::int64_t my_size = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> sizes(n);
  world
      .all_gather(comm::ConstBuffer{&my_size, 1, comm::DType::i64},
                  comm::Buffer{sizes.data(), n, comm::DType::i64})
      ->wait();
  std::vector<std::size_t> send_counts(n, 0), recv_counts(n, 0);
  send_counts[0] = mine.size();
  std::size_t total = 0;
  if (world.rank() == 0)
    for (std::size_t r = 0; r < n; ++r)
      total += recv_counts[r] = static_cast<std::size_t>(sizes[r]);
  std::vector<std::uint8_t> all(total);
  world
      .all_to_all_v(comm::ConstBuffer{mine.data(), mine.size(), comm::DType::u8}, send_counts,
                    comm::Buffer{all.data(), all.size(), comm::DType::u8}, recv_counts)
      ->wait();
  std::vector<std::vector<std::uint8_t>> out;
  if (world.rank() != 0) return out;
  std::size_t at = 0;
  for (std::size_t r = 0; r < n; ++r) {
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(at),
                     all.begin() + static_cast<std::ptrdiff_t>(at + recv_counts[r]));
    at += recv_counts[r];
  }
  return out;
}

void check_piece(const ShardPiece& p) {
  if (p.tensor.empty() || p.tensor.size() > kMaxNameBytes ||
      p.tensor.find('\0') != std::string::npos)
    throw SaveError(Reason::bad_tensor, "tensor name empty, too long or NUL", "", p.tensor);
  if (!checked_volume(p.shape))
    throw SaveError(Reason::bad_tensor, "logical shape too large", "", p.tensor);
  if (!within(p.shape, p.slice))
    throw SaveError(Reason::out_of_bounds, describe(p.slice) + " outside the logical shape", "",
                    p.tensor);
  const std::uint64_t want = element_count(p.slice) * comm::size_of(p.dtype);
  if (p.bytes.size() != want)
    throw SaveError(Reason::bad_tensor,
                    describe(p.slice) + " holds " + std::to_string(want) + " bytes, piece has " +
                        std::to_string(p.bytes.size()),
                    "", p.tensor);
}

// Writes one shard file, sleeping as needed to stay under the bandwidth cap.
std::uint64_t write_shard(const files::Dir& dir, const std::string& file, const ShardPiece& p,
                          std::uint64_t checksum, const SaveOptions& o, Clock::time_point t0,
                          std::uint64_t& done) {
  ShardHeader h{p.tensor, p.dtype, p.shape, p.slice, p.bytes.size(), checksum, 0};
  const std::vector<std::byte> header = encode_shard_header(h);
  const std::span<const std::byte> parts[] = {header, p.bytes};
  const std::uint64_t before = done;
  io::Progress throttle;
  std::size_t chunk = std::size_t{1} << 20;
  if (o.max_bytes_per_second > 0) {
    chunk =
        std::clamp<std::size_t>(static_cast<std::size_t>(o.max_bytes_per_second / 20), 4096, chunk);
    throttle = [&](std::uint64_t written) {
      done = before + written;
      const double due = static_cast<double>(done) / o.max_bytes_per_second;
      const double ahead = due - seconds_since(t0);
      if (ahead > 0) std::this_thread::sleep_for(std::chrono::duration<double>(ahead));
    };
  }
  io::write_file(dir, file, parts, o.durable, chunk, throttle);
  done = before + header.size() + p.bytes.size();
  return p.bytes.size();
}

json report_shard(const ShardPiece& p, const std::string& file, std::uint64_t sum) {
  return {{"tensor", p.tensor}, {"dtype", std::string(comm::name_of(p.dtype))},
          {"shape", p.shape},   {"slice", slice_to_json(p.slice)},
          {"file", file},       {"bytes", p.bytes.size()},
          {"xxh3", hex64(sum)}};
}

std::uint64_t flat_start(const Shape& shape, const Slice& s) {
  if (const auto* f = std::get_if<FlatRange>(&s)) return f->begin;
  const auto r = box_to_flat(shape, std::get<Box>(s));
  return r.empty() ? 0 : r.front().begin;
}

// The coordinator: reports -> tensors -> layout checks -> manifest. Throws SaveError.
Manifest build_manifest(const std::vector<json>& reports, const SaveRequest& req,
                        const SaveOptions& o, std::uint64_t world_size) {
  Manifest m;
  m.format_version = kFormatVersion;
  m.world_size = world_size;
  m.state = req.state;
  std::map<std::string, TensorRecord> tensors;
  for (const json& rep : reports) {
    const int rank = rep.at("rank").get<int>();
    if (!rep.at("error").is_null()) {
      const json& e = rep.at("error");
      throw SaveError(Reason::rank_failed,
                      "rank " + std::to_string(rank) + ": " +
                          std::string(name_of(static_cast<Reason>(e.at("reason").get<int>()))) +
                          ": " + e.at("detail").get<std::string>(),
                      e.at("file").get<std::string>(), e.at("tensor").get<std::string>());
    }
    m.rank_states.push_back(rep.at("state"));
    for (const json& d : rep.at("declared")) {
      const auto name = d.at("tensor").get<std::string>();
      const auto dtype = *comm::parse_dtype(d.at("dtype").get<std::string>());
      const auto shape = d.at("shape").get<Shape>();
      auto [it, fresh] = tensors.try_emplace(name, TensorRecord{name, dtype, shape, {}});
      if (!fresh && (it->second.dtype != dtype || it->second.shape != shape))
        throw SaveError(
            Reason::bad_tensor,
            "ranks disagree on dtype or logical shape (rank " + std::to_string(rank) + ")", "",
            name);
    }
    for (const json& s : rep.at("shards")) {
      TensorRecord& t = tensors.at(s.at("tensor").get<std::string>());
      ShardRecord r;
      r.file = s.at("file").get<std::string>();
      r.rank = rank;
      r.slice = slice_from_json(s.at("slice"), "slice", t.shape.size());
      r.bytes = s.at("bytes").get<std::uint64_t>();
      parse_hex64(s.at("xxh3").get<std::string>(), r.xxh3);
      t.shards.push_back(std::move(r));
    }
  }
  if (o.expected) {
    for (const TensorSpec& e : *o.expected) {
      auto it = tensors.find(e.name);
      if (it == tensors.end()) {
        if (checked_volume(e.shape).value_or(1) != 0)
          throw SaveError(Reason::incomplete_coverage, "expected tensor has no shards", "", e.name);
        it = tensors.emplace(e.name, TensorRecord{e.name, e.dtype, e.shape, {}}).first;
      }
      if (it->second.dtype != e.dtype || it->second.shape != e.shape)
        throw SaveError(Reason::bad_tensor, "dtype or shape differs from the expected layout", "",
                        e.name);
    }
    for (const auto& entry : tensors) {
      const std::string& name = entry.first;
      if (std::none_of(o.expected->begin(), o.expected->end(),
                       [&](const TensorSpec& e) { return e.name == name; }))
        throw SaveError(Reason::unexpected_tensor, "not in the expected layout", "", name);
    }
  }
  // What the reader refuses is never committed: a checkpoint that could not be restored.
  if (tensors.size() > kMaxManifestTensors)
    throw SaveError(Reason::bad_tensor, std::to_string(tensors.size()) +
                                            " tensors, more than a manifest may list (" +
                                            std::to_string(kMaxManifestTensors) + ")");
  for (auto& entry : tensors) {
    TensorRecord& t = entry.second;
    std::sort(t.shards.begin(), t.shards.end(), [&](const ShardRecord& a, const ShardRecord& b) {
      return flat_start(t.shape, a.slice) < flat_start(t.shape, b.slice);
    });
    m.tensors.push_back(std::move(t));
  }
  if (auto p = check_layout(m.tensors)) throw SaveError(p->reason, p->detail, p->file, p->tensor);
  return m;
}

// The commit's last look, before the marker: step-N.tmp/ holds exactly manifest.json and the
// shards the ranks reported, each passing the reader's own file check (header, checksum in the
// header, size). Another writer in the same directory (DirLock refuses one; a file system without
// working locks might not) shows as a missing, extra, resized or replaced file.
void recheck_tmp(const files::Dir& tmp, const Manifest& m) {
  std::set<std::string> expected{"manifest.json"};
  for (const TensorRecord& t : m.tensors)
    for (const ShardRecord& s : t.shards) {
      expected.insert(s.file);
      try {
        (void)check_shard_file(tmp.path(), t, s);
      } catch (const CheckpointError& e) {
        throw SaveError(Reason::changed_during_save,
                        "the shard is no longer the one its rank wrote (" +
                            std::string(name_of(e.reason())) + ": " + e.detail() +
                            "); is another run writing into this directory?",
                        s.file, t.name);
      }
    }
  for (const std::string& name : io::confined([&] { return tmp.list(); }))
    if (expected.count(name) == 0)
      throw SaveError(Reason::changed_during_save,
                      "a file no rank wrote appeared in " + tmp.path().string() +
                          "; is another run writing into this directory?",
                      name);
}

constexpr std::string_view kDeleting = ".deleting";

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The step of "step-N<tail>", if `name` is one.
std::optional<std::uint64_t> step_of(const std::string& name, std::string_view tail) {
  if (!ends_with(name, tail)) return std::nullopt;
  return parse_step_dir_name(name.substr(0, name.size() - tail.size()));
}

// Deletes checkpoint directory `name` of `dir` by what its own manifest and marker say it wrote:
// the shards the manifest lists, then SUCCESS, then manifest.json (last, so that a deletion a kill
// interrupted can be finished), then the directory if nothing else is left in it. Anything else
// (a file the checkpoint did not write, a directory, a link) is left, and named in the warning.
// Never follows a symlink (files::Dir). Returns false when something was left.
bool remove_checkpoint(const files::Dir& dir, const std::string& name, std::string& warning) {
  const files::Dir d = io::confined([&] { return dir.sub(name, false); });
  std::set<std::string> ours{"manifest.json", "SUCCESS"};
  if (d.kind("manifest.json") == files::Kind::regular) {
    const Manifest m =
        parse_manifest(io::read_small_file(d, "manifest.json", kMaxManifestBytes, "manifest.json"));
    for (const TensorRecord& t : m.tensors)
      for (const ShardRecord& sr : t.shards) ours.insert(sr.file);
  }
  std::vector<std::string> foreign;
  for (const std::string& entry : d.list())
    if (ours.count(entry) == 0 || d.kind(entry) != files::Kind::regular) foreign.push_back(entry);
  for (const std::string& entry : d.list())
    if (entry != "manifest.json" &&
        std::find(foreign.begin(), foreign.end(), entry) == foreign.end())
      io::confined([&] { d.remove_file(entry); });
  if (std::find(foreign.begin(), foreign.end(), "manifest.json") == foreign.end())
    io::confined([&] { d.remove_file("manifest.json"); });
  if (foreign.empty()) {
    io::confined([&] { dir.remove_empty_dir(name); });
    return true;
  }
  std::string listed;
  for (std::size_t i = 0; i < foreign.size() && i < 4; ++i) listed += (i ? ", " : "") + foreign[i];
  if (foreign.size() > 4) listed += ", ... (" + std::to_string(foreign.size()) + " in all)";
  warning += (warning.empty() ? "" : "; ") + std::string("left ") + d.path().string() +
             ": it holds what the checkpoint did not write (" + listed + ")";
  return false;
}

// A stale step-M.tmp (a save that never committed): its plain files are removed (links as links),
// then the directory if it is empty; a directory inside it is left and named.
bool remove_stale_tmp(const files::Dir& dir, const std::string& name, std::string& warning) {
  const files::Dir d = io::confined([&] { return dir.sub(name, false); });
  std::vector<std::string> left;
  for (const std::string& entry : d.list()) {
    if (d.kind(entry) == files::Kind::directory)
      left.push_back(entry);
    else
      io::confined([&] { d.remove_file(entry); });
  }
  if (left.empty()) {
    io::confined([&] { dir.remove_empty_dir(name); });
    return true;
  }
  warning += (warning.empty() ? "" : "; ") + std::string("left ") + d.path().string() +
             ": it holds directories no save writes (" + left.front() + ")";
  return false;
}

// Deletes committed checkpoints beyond `keep` (never `current`) and stale step-M.tmp with M < step.
// A victim is first renamed to step-M.deleting (one atomic step: it stops being a checkpoint at
// once), then removed by what its manifest lists; a deletion a kill interrupted is finished here,
// by the next save. Only real directories are touched: a symlink named like a step is never a
// checkpoint of this directory and is left alone.
std::vector<fs::path> retain(const files::Dir& dir, std::uint64_t step, std::size_t keep,
                             bool durable, std::string& warning) {
  std::vector<fs::path> removed;
  auto is_dir = [&](const std::string& name) { return dir.kind(name) == files::Kind::directory; };
  for (const std::string& name : dir.list())
    if (step_of(name, kDeleting) && is_dir(name) && remove_checkpoint(dir, name, warning))
      removed.push_back(dir.path() / name);
  std::vector<std::pair<std::uint64_t, std::string>> committed;
  for (const std::string& name : dir.list())
    if (const auto n = step_of(name, "");
        n && is_dir(name) &&
        io::confined([&] { return dir.sub(name, false); }).kind("SUCCESS") == files::Kind::regular)
      committed.emplace_back(*n, name);
  std::sort(committed.begin(), committed.end(), std::greater<>());
  std::size_t kept = 0;
  for (const auto& victim : committed) {
    const std::string& name = victim.second;  // a plain name: lambdas below capture it
    if (victim.first == step || keep == 0 || kept < keep) {
      ++kept;
      continue;
    }
    const std::string doomed = name + std::string(kDeleting);
    io::confined([&] { dir.rename(name, doomed); });
    if (durable) io::confined([&] { dir.fsync(); });
    if (remove_checkpoint(dir, doomed, warning)) removed.push_back(dir.path() / name);
  }
  for (const std::string& name : dir.list())
    if (const auto n = step_of(name, ".tmp");
        n && *n < step && is_dir(name) && remove_stale_tmp(dir, name, warning))
      removed.push_back(dir.path() / name);
  if (durable && !removed.empty()) io::confined([&] { dir.fsync(); });
  return removed;
}

}  // namespace

std::string step_dir_name(std::uint64_t step) {
  return "step-" + std::to_string(step);
}

SaveResult save(comm::Communicator& world, const SaveRequest& req, const SaveOptions& o) {
  const auto t0 = Clock::now();
  const int rank = world.rank();
  SaveResult res;
  res.step = req.state.step;
  res.path = req.dir / step_dir_name(res.step);
  const std::string step_name = step_dir_name(res.step);
  const std::string tmp_name = step_name + ".tmp";

  // 1. The coordinator makes a fresh step-N.tmp/; nobody writes before it exists. Everything
  // below req.dir is reached through one open descriptor, never through a symlink (files::Dir).
  json verdict = nullptr;
  std::optional<files::Dir> dir;
  if (rank == 0) {
    try {
      dir.emplace(io::confined([&] { return files::Dir::open(req.dir, true); }));
      const files::Kind at_step = dir->kind(step_name);
      if (at_step == files::Kind::symlink || at_step == files::Kind::other ||
          at_step == files::Kind::regular)
        throw SaveError(Reason::io_error, res.path.string() +
                                              " exists and is not a directory this run wrote; "
                                              "refusing to replace it");
      if (at_step == files::Kind::directory && io::confined([&] {
                                                 return dir->sub(step_name, false);
                                               }).kind("SUCCESS") == files::Kind::regular)
        throw SaveError(Reason::already_committed, res.path.string() + " is already committed");
      // Uncommitted leftovers only (no marker): never a checkpoint.
      io::confined([&] {
        dir->remove_tree(step_name);
        dir->remove_tree(tmp_name);
        dir->make_dir(tmp_name);
      });
    } catch (const CheckpointError& e) {
      verdict = error_json(e);
    } catch (const std::exception& e) {
      verdict = error_json(CheckpointError(Reason::io_error, e.what()));
    }
  }
  verdict = broadcast_json(world, verdict);
  if (!verdict.is_null()) throw_save_error(verdict);

  // 2. This rank's shards, in its wave.
  json report = {{"rank", rank},
                 {"error", nullptr},
                 {"state", req.rank_state},
                 {"shards", json::array()},
                 {"declared", json::array()}};
  std::optional<files::Dir> tmp_dir;  // step-N.tmp, opened below req.dir by its first shard
  {
    std::uint64_t done = 0;
    const int n = world.size();
    const int k = o.max_concurrent_writers > 0 ? std::min(o.max_concurrent_writers, n) : n;
    const int waves = (n + k - 1) / k;
    for (int w = 0; w < waves; ++w) {
      if (w == rank / k && report["error"].is_null()) {
        const auto tw = Clock::now();  // the bandwidth cap counts from this rank's own start
        try {
          for (const ShardPiece& p : req.pieces) {
            check_piece(p);
            report["declared"].push_back({{"tensor", p.tensor},
                                          {"dtype", std::string(comm::name_of(p.dtype))},
                                          {"shape", p.shape}});
            if (p.bytes.empty()) continue;
            const std::string file = shard_file_name(p.tensor, p.slice, rank);
            const std::uint64_t sum = xxh3(p.bytes);
            if (!tmp_dir)
              tmp_dir.emplace(io::confined(
                  [&] { return files::Dir::open(req.dir, false).sub(tmp_name, false); }));
            res.rank_bytes += write_shard(*tmp_dir, file, p, sum, o, tw, done);
            ++res.rank_files;
            report["shards"].push_back(report_shard(p, file, sum));
          }
        } catch (const CheckpointError& e) {
          report["error"] = error_json(e);
        } catch (const std::exception& e) {
          report["error"] = error_json(CheckpointError(Reason::io_error, e.what()));
        }
        res.write_s = seconds_since(tw);
      }
      if (waves > 1) world.barrier()->wait();
    }
  }
  auto stage = [&](SaveStage st) {
    if (!o.on_stage) return;
    try {
      o.on_stage(st, rank);
    } catch (...) {
      throw HookThrew{std::current_exception()};
    }
  };
  try {
    stage(SaveStage::shards_written);
  } catch (const HookThrew& h) {
    std::rethrow_exception(h.error);
  }

  // 3. Reports to the coordinator.
  std::vector<std::uint8_t> mine;
  try {
    mine = json::to_cbor(report);
  } catch (const std::exception& e) {  // e.g. a tensor name that is not UTF-8
    report = {{"rank", rank},
              {"error", error_json(CheckpointError(Reason::bad_tensor, e.what()))},
              {"state", nullptr},
              {"shards", json::array()},
              {"declared", json::array()}};
    mine = json::to_cbor(report);
  }
  const auto reports = gather_to_root(world, mine);

  // 4. The coordinator validates, commits and applies retention.
  json outcome = nullptr;
  if (rank == 0) {
    outcome = {{"error", nullptr}};
    try {
      std::vector<json> parsed;
      for (const auto& r : reports) parsed.push_back(json::from_cbor(r));
      const Manifest m = build_manifest(parsed, req, o, static_cast<std::uint64_t>(world.size()));
      std::uint64_t total = 0;
      std::size_t files = 0;
      for (const auto& t : m.tensors)
        for (const auto& s : t.shards) total += s.bytes, ++files;
      const std::string text = dump_manifest(m);
      const files::Dir t = io::confined([&] { return dir->sub(tmp_name, false); });
      io::write_file(t, "manifest.json", text, o.durable);
      stage(SaveStage::manifest_written);
      recheck_tmp(t, m);
      const json marker = {{"format", "shardcheck-checkpoint"},
                           {"step", res.step},
                           {"manifest_xxh3", hex64(xxh3(std::as_bytes(std::span(text))))}};
      io::write_file(t, "SUCCESS", marker.dump() + "\n", o.durable);
      stage(SaveStage::marker_written);
      io::confined([&] {
        if (o.durable) t.fsync();
        dir->rename(tmp_name, step_name);
        if (o.durable) dir->fsync();
      });
      stage(SaveStage::committed);
      outcome["total_bytes"] = total;
      outcome["total_files"] = files;
      try {
        json removed = json::array();
        std::string left;
        for (const auto& p : retain(*dir, res.step, o.keep, o.durable, left))
          removed.push_back(p.string());
        outcome["removed"] = removed;
        if (!left.empty()) outcome["warning"] = "retention " + left;
      } catch (const std::exception& e) {
        outcome["warning"] = std::string("retention failed: ") + e.what();
      }
    } catch (const HookThrew& h) {
      std::rethrow_exception(h.error);
    } catch (const CheckpointError& e) {
      outcome["error"] = error_json(e);
    } catch (const comm::InvariantError&) {
      throw;
    } catch (const std::exception& e) {
      outcome["error"] = error_json(CheckpointError(Reason::io_error, e.what()));
    }
  }
  outcome = broadcast_json(world, outcome);
  if (!outcome.at("error").is_null()) throw_save_error(outcome.at("error"));
  res.total_bytes = outcome.at("total_bytes").get<std::uint64_t>();
  res.total_files = outcome.at("total_files").get<std::size_t>();
  if (outcome.contains("removed"))
    for (const auto& p : outcome.at("removed")) res.removed.emplace_back(p.get<std::string>());
  if (outcome.contains("warning")) res.retention_warning = outcome.at("warning").get<std::string>();
  res.blocked_s = seconds_since(t0);
  return res;
}

}  // namespace shardcheck::checkpoint
