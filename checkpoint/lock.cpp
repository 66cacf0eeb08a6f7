// DirLock (lock.hpp): flock(LOCK_EX | LOCK_NB) on DIR/.lock, holder details written into it.
#include "checkpoint/lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string>

#include "checkpoint/errors.hpp"
#include "checkpoint/io.hpp"

namespace shardcheck::checkpoint {
namespace {

std::string holder_text() {
  char host[256] = "unknown";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  host[sizeof host - 1] = '\0';
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32] = "";
  std::tm tm{};
  if (::gmtime_r(&now, &tm) != nullptr) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + "\n";
}

// What the holder wrote (at most one short line), for the refusal message.
std::string read_holder(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "another process (it has not written its details yet)";
  std::string s(buf, static_cast<std::size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

DirLock::DirLock(const std::filesystem::path& dir)
    : DirLock(io::confined([&] { return files::Dir::open(dir, true); })) {}

DirLock::DirLock(const files::Dir& d) {
  const std::filesystem::path dir = d.path();
  const std::filesystem::path file = dir / kFile;
  try {
    fd_ = d.open_rw(kFile);
  } catch (const files::Error& e) {
    throw CheckpointError(Reason::io_error, std::string("cannot open the lock file: ") + e.what(),
                          file.string());
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? read_holder(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw CheckpointError(Reason::locked,
                            "'" + dir.string() + "' is in use by another run (" + holder +
                                "); one writer per checkpoint directory",
                            file.string());
    throw CheckpointError(Reason::io_error, "cannot lock (" + std::string(std::strerror(err)) + ")",
                          file.string());
  }
  const std::string text = holder_text();
  // Best effort: the details only make the refusal message of a second run more useful.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, text.data(), text.size(), 0);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

}  // namespace shardcheck::checkpoint
