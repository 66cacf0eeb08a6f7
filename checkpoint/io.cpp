// POSIX I/O for checkpoints: the only file in checkpoint/ that touches file descriptors (through
// files::Dir for everything written below a checkpoint directory).
#include "checkpoint/io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/errors.hpp"

namespace shardcheck::checkpoint::io {

namespace {
[[noreturn]] void fail(const std::string& what, const fs::path& p) {
  throw CheckpointError(Reason::io_error, what + " " + p.string() + ": " + std::strerror(errno));
}
}  // namespace

namespace {

// Writes the pieces to the open `fd` (chunked), fsyncs when durable, closes it; `path` names it.
void write_fd(int fd, const fs::path& path, std::span<const std::span<const std::byte>> pieces,
              bool durable, std::size_t chunk, const Progress& progress) {
  std::uint64_t written = 0;
  auto close_fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    errno = e;
    fail(what, path);
  };
  for (auto piece : pieces) {
    while (!piece.empty()) {
      const std::size_t n = std::min(piece.size(), chunk);
      const ssize_t w = ::write(fd, piece.data(), n);
      if (w < 0) {
        if (errno == EINTR) continue;
        close_fail("cannot write");
      }
      piece = piece.subspan(static_cast<std::size_t>(w));
      written += static_cast<std::uint64_t>(w);
      if (progress) progress(written);
    }
  }
  if (durable && ::fsync(fd) != 0) close_fail("cannot fsync");
  if (::close(fd) != 0) fail("cannot close", path);
}

std::span<const std::span<const std::byte>> one_piece(const std::string& text,
                                                      std::span<const std::byte>& one) {
  one = std::as_bytes(std::span(text.data(), text.size()));
  return std::span(&one, 1);
}

}  // namespace

void rethrow_files_error(const files::Error& e) {
  throw CheckpointError(Reason::io_error, e.what());
}

void write_file(const fs::path& path, std::span<const std::span<const std::byte>> pieces,
                bool durable, std::size_t chunk, const Progress& progress) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create", path);
  write_fd(fd, path, pieces, durable, chunk, progress);
}

void write_file(const fs::path& path, const std::string& text, bool durable) {
  std::span<const std::byte> one;
  write_file(path, one_piece(text, one), durable);
}

void write_file(const files::Dir& dir, std::string_view name,
                std::span<const std::span<const std::byte>> pieces, bool durable,
                std::size_t chunk, const Progress& progress) {
  const int fd = confined([&] { return dir.create(name); });
  write_fd(fd, dir.path() / std::string(name), pieces, durable, chunk, progress);
}

void write_file(const files::Dir& dir, std::string_view name, const std::string& text,
                bool durable) {
  std::span<const std::byte> one;
  write_file(dir, name, one_piece(text, one), durable);
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory", dir);
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    fail("cannot fsync directory", dir);
  }
  ::close(fd);
}

Kind kind_of(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Kind::absent;
    fail("cannot stat", path);
  }
  if (S_ISLNK(st.st_mode)) return Kind::symlink;
  return S_ISREG(st.st_mode) ? Kind::regular : Kind::other;
}

namespace {
std::string read_whole(const File& f, std::uint64_t max_bytes, const char* what) {
  const std::uint64_t n = f.size();
  if (n > max_bytes)
    throw CheckpointError(Reason::io_error, std::string(what) + " is " + std::to_string(n) +
                                                " bytes, more than the limit " +
                                                std::to_string(max_bytes));
  std::string s(static_cast<std::size_t>(n), '\0');
  if (!f.pread(0, std::as_writable_bytes(std::span(s.data(), s.size()))))
    throw CheckpointError(Reason::io_error, std::string(what) + " shrank while read");
  return s;
}
}  // namespace

std::string read_small_file(const fs::path& path, std::uint64_t max_bytes, const char* what) {
  return read_whole(File(path), max_bytes, what);
}

std::string read_small_file(const files::Dir& dir, std::string_view name, std::uint64_t max_bytes,
                            const char* what) {
  const int fd = confined([&] { return dir.open_read(name); });
  return read_whole(File(fd, dir.path() / std::string(name)), max_bytes, what);
}

File::File(int fd, const fs::path& path) : fd_(fd), path_(path.string()) {}

File::File(const fs::path& path) : path_(path.string()) {
  // O_NOFOLLOW: a symlink planted after validation is refused rather than followed.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd_ < 0) fail("cannot open", path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

std::uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("cannot stat", path_);
  return static_cast<std::uint64_t>(st.st_size);
}

bool File::pread(std::uint64_t offset, std::span<std::byte> out) const {
  while (!out.empty()) {
    const ssize_t r = ::pread(fd_, out.data(), out.size(), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("cannot read", path_);
    }
    if (r == 0) return false;
    out = out.subspan(static_cast<std::size_t>(r));
    offset += static_cast<std::uint64_t>(r);
  }
  return true;
}

}  // namespace shardcheck::checkpoint::io
