// Complete-or-failed file writes for the CLI's outputs (see output.hpp): POSIX calls, each result
// checked, a temporary file renamed into place; inside a named directory, through files::Dir.
#include "harness/output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>

#include "harness/cli_commands.hpp"

namespace shardcheck::harness {
namespace {

[[noreturn]] void fail(std::string_view what, const std::filesystem::path& file, const char* step,
                       int err) {
  throw OutputError(std::string(what) + ": could not " + step + " '" + file.string() + "' (" +
                    std::strerror(err) + "); the output is incomplete");
}

void write_in_place(const std::filesystem::path& file, std::string_view text, std::string_view what,
                    bool fifo) {
  // A FIFO opened for writing blocks until a reader opens it; O_NONBLOCK makes that ENXIO.
  // O_APPEND: /dev/stdout redirected to a file must not overwrite what was printed before.
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
  if (fd < 0) fail(what, file, fifo && errno == ENXIO ? "find a reader of" : "open", errno);
  if (fifo) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (!files::write_all(fd, text)) {
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
  const bool written = files::write_all(fd, text);
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

namespace {

// The file a path names, for "is it the same file" (symlinks the user wrote resolved).
std::filesystem::path identity_of(const std::filesystem::path& p) {
  std::error_code ec;
  std::filesystem::path c = std::filesystem::weakly_canonical(p, ec);
  return ec ? std::filesystem::absolute(p, ec).lexically_normal() : c;
}

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (std::filesystem::equivalent(a, b, ec)) return true;
  return identity_of(a) == identity_of(b);
}

}  // namespace

files::Dir open_output_dir(std::string_view option, const std::string& dir) {
  if (dir.empty()) throw BadInput(std::string(option) + ": an empty path names no directory");
  try {
    return files::Dir::open(dir, true);
  } catch (const files::Error& e) {
    throw BadInput(std::string(option) + ": " + e.what());
  }
}

void check_output_files(const files::Dir& dir, std::span<const std::filesystem::path> rels,
                        std::span<const std::string> inputs, std::string_view option) {
  std::set<std::filesystem::path> seen;
  for (const std::filesystem::path& rel : rels) {
    const std::filesystem::path full = dir.path() / rel;
    if (!seen.insert(rel.lexically_normal()).second)
      throw BadInput(std::string(option) + ": two outputs would be written to the same file '" +
                     full.string() + "'");
    try {
      const files::Dir parent =
          rel.has_parent_path() ? dir.sub(rel.parent_path(), true) : dir.sub(".", false);
      const files::Kind k = parent.kind(rel.filename().string());
      if (k == files::Kind::symlink)
        throw BadInput(std::string(option) + ": refusing '" + full.string() +
                       "': it is a symlink; shardcheck writes only inside the directory you "
                       "named and follows no link below it");
      if (k != files::Kind::absent && k != files::Kind::regular)
        throw BadInput(std::string(option) + ": '" + full.string() +
                       "' exists and is not a file; shardcheck would write a file there");
    } catch (const files::Error& e) {
      throw BadInput(std::string(option) + ": " + e.what());
    }
    for (const std::string& in : inputs)
      if (same_file(full, in))
        throw BadInput(std::string(option) + ": '" + full.string() + "' is the input '" + in +
                       "'; writing the output there would overwrite it");
  }
}

void write_output_in(const files::Dir& dir, const std::filesystem::path& rel, std::string_view text,
                     std::string_view what) {
  try {
    const files::Dir parent =
        rel.has_parent_path() ? dir.sub(rel.parent_path(), true) : dir.sub(".", false);
    parent.write_file(rel.filename().string(), text);
  } catch (const files::Error& e) {
    throw OutputError(std::string(what) + ": " + e.what() + "; the output is incomplete");
  }
}

void refuse_output_over_input(const std::string& output, std::span<const std::string> inputs,
                              std::string_view option) {
  if (output.empty()) return;
  for (const std::string& in : inputs)
    if (same_file(output, in))
      throw BadInput(std::string(option) + ": '" + output + "' is the input '" + in +
                     "'; writing the output there would overwrite it");
}

}  // namespace shardcheck::harness
