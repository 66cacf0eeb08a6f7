// save(): the collective commit protocol. Every rank writes its shards into DIR/step-N.tmp/,
// reports them to the coordinator (rank 0) through the communicator, the coordinator checks the
// layout (every element of every tensor exactly once), writes manifest.json and SUCCESS, fsyncs and
// renames to DIR/step-N/, then applies retention. All ranks return the same verdict or throw the
// same SaveError. Does not know what the tensors mean: the caller exports generic shard pieces.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/layout.hpp"
#include "checkpoint/manifest.hpp"
#include "comm/communicator.hpp"

namespace shardcheck::checkpoint {

// One slice of one logical tensor held by this rank. `bytes` is a view of the caller's memory (the
// slice's elements in the slice's C order) and must stay valid during save(). A piece with no
// elements writes nothing but still declares the tensor (so zero-size tensors are recorded).
struct ShardPiece {
  std::string tensor{};  // e.g. "param/embed.weight", "exp_avg/layers.0.mlp.w_up"
  Shape shape{};         // logical shape of the whole tensor
  comm::DType dtype = comm::DType::f32;
  Slice slice{};
  std::span<const std::byte> bytes{};
};

// A tensor the checkpoint must contain, for completeness checks against the caller's layout.
struct TensorSpec {
  std::string name{};
  comm::DType dtype = comm::DType::f32;
  Shape shape{};
};

// Points of the protocol at which SaveOptions::on_stage runs (shards_written on every rank, the
// others on the coordinator only). A hook that throws makes that rank "die" there: drills use it
// to leave a step-N.tmp/ behind, as a crash between shard write and commit would.
enum class SaveStage { shards_written, manifest_written, marker_written, committed };

struct SaveOptions {
  std::size_t keep = 0;  // retention: committed checkpoints kept, the new one included (0 = all)
  // Checkpoint-storm knobs. Ranks write in waves of at most this many (0 = all at once) ...
  int max_concurrent_writers = 0;
  // ... and each rank writes at most this many bytes per second (0 = unlimited).
  double max_bytes_per_second = 0;
  bool durable = true;  // fsync files and directories (off only for throwaway test data)
  // When given (rank 0's copy counts), the checkpoint must hold exactly these tensors.
  std::optional<std::vector<TensorSpec>> expected{};
  std::function<void(SaveStage, int rank)> on_stage{};
};

struct SaveRequest {
  std::filesystem::path dir{};       // holds step-N/ directories
  RunState state{};                  // rank 0's copy is recorded (state.step names the directory)
  nlohmann::json rank_state{};       // this rank's own state (RNG streams, ...), recorded per rank
  std::vector<ShardPiece> pieces{};  // this rank's shards
};

struct SaveResult {
  std::filesystem::path path;  // DIR/step-N, committed
  std::uint64_t step = 0;
  std::uint64_t rank_bytes = 0;  // payload bytes this rank wrote
  std::size_t rank_files = 0;
  std::uint64_t total_bytes = 0;  // payload bytes of the whole checkpoint
  std::size_t total_files = 0;
  double blocked_s = 0;  // wall time this rank spent inside save(): what training waits for
  double write_s = 0;    // of which: writing this rank's own shards (incl. throttling)
  std::vector<std::filesystem::path> removed;  // by retention
  std::string retention_warning;  // retention failed after a good commit (the commit stands)
};

// Collective over `world`: every rank must call it with the same dir and step. Throws SaveError
// (the same on every rank) when the checkpoint cannot be committed; a CommError when a peer died.
SaveResult save(comm::Communicator& world, const SaveRequest& req, const SaveOptions& opts = {});

std::string step_dir_name(std::uint64_t step);  // "step-N"

}  // namespace shardcheck::checkpoint
