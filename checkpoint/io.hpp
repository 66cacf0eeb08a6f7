// POSIX file helpers for the checkpoint module (internal): durable writes (write + fsync),
// directory fsync, bounded whole-file reads, positioned reads. Errors become
// CheckpointError(io_error) of the requested type, naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "files/dir.hpp"

namespace shardcheck::checkpoint::io {

namespace fs = std::filesystem;

// Called with the bytes written so far after each chunk (for bandwidth limiting).
using Progress = std::function<void(std::uint64_t written)>;

// Creates `path` exclusively, writes the pieces in order (chunked), fsyncs when durable.
void write_file(const fs::path& path, std::span<const std::span<const std::byte>> pieces,
                bool durable, std::size_t chunk = std::size_t{1} << 20,
                const Progress& progress = {});
void write_file(const fs::path& path, const std::string& text, bool durable);
// The same, creating entry `name` of `dir` (files/dir.hpp: a symlink there is refused).
void write_file(const files::Dir& dir, std::string_view name,
                std::span<const std::span<const std::byte>> pieces, bool durable,
                std::size_t chunk = std::size_t{1} << 20, const Progress& progress = {});
void write_file(const files::Dir& dir, std::string_view name, const std::string& text,
                bool durable);
void fsync_dir(const fs::path& dir);

// What is at `path`, without following a symlink.
enum class Kind { absent, regular, symlink, other };
Kind kind_of(const fs::path& path);
// The whole file, refusing one larger than max_bytes before allocating (io_error naming `what`).
std::string read_small_file(const fs::path& path, std::uint64_t max_bytes, const char* what);
std::string read_small_file(const files::Dir& dir, std::string_view name, std::uint64_t max_bytes,
                            const char* what);
// Runs `fn`, turning a files::Error into CheckpointError(io_error) with the same message.
template <class Fn>
decltype(auto) confined(Fn&& fn);

// An open read-only file.
class File {
 public:
  explicit File(const fs::path& path);  // throws CheckpointError(io_error)
  File(int fd, const fs::path& path);     // takes ownership of an open descriptor
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  std::uint64_t size() const;
  // Reads exactly out.size() bytes at offset; false if the file ends first.
  bool pread(std::uint64_t offset, std::span<std::byte> out) const;

 private:
  int fd_ = -1;
  std::string path_;
};

[[noreturn]] void rethrow_files_error(const files::Error& e);
template <class Fn>
decltype(auto) confined(Fn&& fn) {
  try {
    return fn();
  } catch (const files::Error& e) {
    rethrow_files_error(e);
  }
}

}  // namespace shardcheck::checkpoint::io
