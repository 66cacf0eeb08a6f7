// Dir (dir.hpp): every step is an *at() call on a held directory descriptor with O_NOFOLLOW, each
// result checked and turned into files::Error naming the path and the reason.
#include "files/dir.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace shardcheck::files {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& step, const std::string& path, int err) {
  throw Error("cannot " + step + " '" + path + "' (" + std::strerror(err) + ")", err);
}

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw Error("refusing '" + path + "': " + why, 0);
}

constexpr int kMaxDepth = 64;  // remove_tree's recursion bound

Kind kind_at(int dirfd, const char* name, const std::string& path) {
  struct stat st {};
  if (::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return Kind::absent;
    fail("inspect", path, errno);
  }
  if (S_ISLNK(st.st_mode)) return Kind::symlink;
  if (S_ISDIR(st.st_mode)) return Kind::directory;
  return S_ISREG(st.st_mode) ? Kind::regular : Kind::other;
}

void remove_tree_at(int dirfd, const std::string& name, const std::string& path, int depth) {
  if (depth > kMaxDepth) refuse(path, "nested more than 64 directories deep");
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return;
    if (errno == ELOOP || errno == ENOTDIR) {  // a link or a file: removed as an entry
      if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) fail("remove", path, errno);
      return;
    }
    fail("open", path, errno);
  }
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    fail("list", path, err);
  }
  std::vector<std::pair<std::string, bool>> entries;  // name, is a real directory
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    entries.emplace_back(n, kind_at(fd, n.c_str(), path + "/" + n) == Kind::directory);
  }
  const int read_err = errno;
  for (const auto& [n, is_dir] : entries) {
    if (is_dir)
      remove_tree_at(fd, n, path + "/" + n, depth + 1);
    else if (::unlinkat(fd, n.c_str(), 0) != 0 && errno != ENOENT)
      fail("remove", path + "/" + n, errno);
  }
  ::closedir(d);
  if (read_err != 0) fail("list", path, read_err);
  if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    fail("remove", path, errno);
}

}  // namespace

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

bool is_entry_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

Dir Dir::open(const fs::path& named, bool create) {
  if (named.empty()) refuse("", "an empty path names no directory");
  if (create) {
    std::error_code ec;
    fs::create_directories(named, ec);
    if (ec && !fs::is_directory(named)) fail("create the directory", named.string(), ec.value());
  }
  const int fd = ::open(named.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("open the directory", named.string(), errno);
  return Dir(fd, named);
}

Dir::Dir(Dir&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

Dir& Dir::operator=(Dir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

Dir::~Dir() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Dir::at(std::string_view name) const {
  return (path_ / std::string(name)).string();
}

Dir Dir::sub(const fs::path& rel, bool create) const {
  if (rel.empty() || rel.is_absolute()) refuse(at(rel.string()), "not a relative path");
  int cur = ::dup(fd_);
  if (cur < 0) fail("open the directory", path_.string(), errno);
  fs::path walked = path_;
  for (const fs::path& part : rel) {
    const std::string name = part.string();
    if (name.empty() || name == ".") continue;
    walked /= name;
    if (!is_entry_name(name)) {
      ::close(cur);
      refuse(walked.string(), "a path below the named directory may not leave it");
    }
    if (create && ::mkdirat(cur, name.c_str(), 0777) != 0 && errno != EEXIST) {
      const int err = errno;
      ::close(cur);
      fail("create the directory", walked.string(), err);
    }
    const int next = ::openat(cur, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = errno;
    if (next < 0) {
      const Kind k = err == ELOOP || err == ENOTDIR ? kind_at(cur, name.c_str(), walked.string())
                                                    : Kind::absent;
      ::close(cur);
      if (k == Kind::symlink)
        refuse(walked.string(),
               "it is a symlink; shardcheck writes only inside the directory you named and "
               "follows no link below it");
      if (k != Kind::absent) refuse(walked.string(), "it exists and is not a directory");
      fail("open the directory", walked.string(), err);
    }
    ::close(cur);
    cur = next;
  }
  return Dir(cur, walked);
}

Kind Dir::kind(std::string_view name) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  return kind_at(fd_, std::string(name).c_str(), at(name));
}

std::vector<std::string> Dir::list() const {
  const int fd = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("list", path_.string(), errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    fail("list", path_.string(), err);
  }
  std::vector<std::string> out;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) fail("list", path_.string(), err);
  std::sort(out.begin(), out.end());
  return out;
}

void Dir::write_file(std::string_view name, std::string_view text, bool durable) const {
  const Kind k = kind(name);
  if (k == Kind::symlink)
    refuse(at(name),
           "it is a symlink; shardcheck writes only inside the directory you named and follows "
           "no link below it");
  if (k != Kind::absent && k != Kind::regular) refuse(at(name), "it exists and is not a file");
  const std::string tmp = "." + std::string(name) + ".tmp." + std::to_string(::getpid());
  ::unlinkat(fd_, tmp.c_str(), 0);  // a leftover of a killed run with this pid
  const int fd =
      ::openat(fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) fail("create", at(tmp), errno);
  bool ok = write_all(fd, text);
  int err = errno;
  if (ok && durable && ::fsync(fd) != 0) ok = false, err = errno;
  if (::close(fd) != 0 && ok) ok = false, err = errno;
  if (!ok) {
    ::unlinkat(fd_, tmp.c_str(), 0);
    fail("write", at(name), err);
  }
  if (::renameat(fd_, tmp.c_str(), fd_, std::string(name).c_str()) != 0) {
    err = errno;
    ::unlinkat(fd_, tmp.c_str(), 0);
    fail("rename into place", at(name), err);
  }
  if (durable) fsync();
}

int Dir::create(std::string_view name, int mode) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  const int fd =
      ::openat(fd_, std::string(name).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
               static_cast<mode_t>(mode));
  if (fd < 0) fail("create", at(name), errno);
  return fd;
}

int Dir::open_rw(std::string_view name, int mode) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  const int fd = ::openat(fd_, std::string(name).c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC,
                          static_cast<mode_t>(mode));
  if (fd < 0) {
    if (errno == ELOOP)
      refuse(at(name), "it is a symlink; shardcheck follows no link below the named directory");
    fail("open", at(name), errno);
  }
  return fd;
}

int Dir::open_read(std::string_view name) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  const int fd = ::openat(fd_, std::string(name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) fail("open", at(name), errno);
  return fd;
}

void Dir::make_dir(std::string_view name) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  if (::mkdirat(fd_, std::string(name).c_str(), 0777) != 0)
    fail("create the directory", at(name), errno);
}

void Dir::remove_file(std::string_view name) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  if (::unlinkat(fd_, std::string(name).c_str(), 0) != 0 && errno != ENOENT)
    fail("remove", at(name), errno);
}

void Dir::remove_empty_dir(std::string_view name) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  if (::unlinkat(fd_, std::string(name).c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    fail("remove the directory", at(name), errno);
}

void Dir::remove_tree(std::string_view name) const {
  if (!is_entry_name(name)) refuse(at(name), "not one entry name");
  remove_tree_at(fd_, std::string(name), at(name), 0);
}

void Dir::rename(std::string_view from, std::string_view to) const {
  if (!is_entry_name(from) || !is_entry_name(to)) refuse(at(from), "not one entry name");
  if (::renameat(fd_, std::string(from).c_str(), fd_, std::string(to).c_str()) != 0)
    fail("rename", at(from) + "' to '" + std::string(to), errno);
}

void Dir::fsync() const {
  if (::fsync(fd_) != 0) fail("fsync the directory", path_.string(), errno);
}

}  // namespace shardcheck::files
