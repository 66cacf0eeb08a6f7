// Complete-or-failed file writes for the CLI's outputs (see output.hpp): POSIX calls, each result
// checked, a temporary file renamed into place.
#include "harness/output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace shardcheck::harness {
namespace {

[[noreturn]] void fail(std::string_view what, const std::filesystem::path& file, const char* step,
                       int err) {
  throw OutputError(std::string(what) + ": could not " + step + " '" + file.string() + "' (" +
                    std::strerror(err) + "); the output is incomplete");
}

// Writes all of `text` to `fd`, retrying short writes and interruptions; false with errno set.
bool write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void write_in_place(const std::filesystem::path& file, std::string_view text, std::string_view what,
                    bool fifo) {
  // A FIFO opened for writing blocks until a reader opens it; O_NONBLOCK makes that ENXIO.
  // O_APPEND: /dev/stdout redirected to a file must not overwrite what was printed before.
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (fd < 0) fail(what, file, fifo && errno == ENXIO ? "find a reader of" : "open", errno);
  if (fifo) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (!write_all(fd, text)) {
    const int err = errno;
    ::close(fd);
    fail(what, file, "write", err);
  }
  if (::close(fd) != 0) fail(what, file, "close", errno);
}

// A name for an open descriptor (/dev/stdout, /dev/fd/N, /proc/self/fd/N): written through, never
// replaced, whatever the descriptor is (a terminal, a pipe, a redirected file).
bool names_a_descriptor(const std::string& p) {
  return p == "/dev/stdout" || p == "/dev/stderr" || p.rfind("/dev/fd/", 0) == 0 ||
         p.rfind("/proc/self/fd/", 0) == 0;
}

}  // namespace

void write_output(const std::filesystem::path& given, std::string_view text,
                  std::string_view what) {
  if (names_a_descriptor(given.string())) {
    struct stat st {};
    write_in_place(given, text, what, ::stat(given.c_str(), &st) == 0 && S_ISFIFO(st.st_mode));
    return;
  }
  // A symlinked report stays a symlink: the file it names (existing or not yet) is the one
  // replaced.
  std::filesystem::path file = given;
  std::error_code ec;
  for (int hops = 0; hops < 8 && std::filesystem::is_symlink(file, ec); ++hops) {
    const std::filesystem::path target = std::filesystem::read_symlink(file, ec);
    if (ec) break;
    file = target.is_absolute() ? target : file.parent_path() / target;
  }
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) fail(what, given, "write a file over the directory", EISDIR);
    write_in_place(file, text, what, S_ISFIFO(st.st_mode));
    return;
  }
  std::filesystem::path tmp = file;
  tmp += ".tmp." + std::to_string(::getpid());
  ::unlink(
      tmp.c_str());  // a leftover of a killed run with this pid (a link is removed, not followed)
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) fail(what, given, "create", errno);
  const bool written = write_all(fd, text);
  int err = errno;
  const bool closed = ::close(fd) == 0;
  if (written && !closed) err = errno;
  if (!written || !closed) {
    ::unlink(tmp.c_str());
    fail(what, given, written ? "close" : "write", err);
  }
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    fail(what, given, "rename into place", err);
  }
}

}  // namespace shardcheck::harness
