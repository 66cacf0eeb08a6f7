// Writes and deletions confined to a directory the user named. The named directory is opened once,
// as given (a symlink the user wrote in that path is theirs to follow); everything below it is
// reached from the held descriptor with openat / mkdirat / unlinkat / renameat and O_NOFOLLOW, so a
// symlink anywhere below it is refused, never followed, and no name can leave it (absolute paths,
// "..", empty names refused). Every output and deletion of shardcheck (reports, traces,
// checkpoints, locks, retention, drill work directories) goes through a Dir.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace shardcheck::files {

// A refused or failed file-system step: what was tried, on which path (the named directory joined
// with the names below it), and the system's or the rule's reason.
class Error : public std::runtime_error {
 public:
  Error(const std::string& message, int err) : std::runtime_error(message), err_(err) {}
  int err() const { return err_; }  // errno, or 0 for a refusal by rule

 private:
  int err_;
};

enum class Kind { absent, regular, directory, symlink, other };

class Dir {
 public:
  // The directory the user named; with `create`, made with its parents first.
  static Dir open(const std::filesystem::path& named, bool create);
  Dir(Dir&& other) noexcept;
  Dir& operator=(Dir&& other) noexcept;
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  ~Dir();

  // The directory `rel` (one or more relative names) below this one, each a real directory,
  // made when `create`. A symlink or a non-directory on the way is refused, naming it.
  Dir sub(const std::filesystem::path& rel, bool create) const;
  // What `name` (one entry of this directory) is, without following a symlink.
  Kind kind(std::string_view name) const;
  std::vector<std::string> list() const;  // entry names, sorted, without "." and ".."

  // Replaces (or creates) `name` with `text` whole: a temporary written beside it and renamed over
  // it, so a reader sees the old content or the new. A symlink or non-regular `name` is refused.
  void write_file(std::string_view name, std::string_view text, bool durable = false) const;
  // Creates `name` exclusively (a symlink at `name` is refused) and returns its descriptor, which
  // the caller owns.
  int create(std::string_view name, int mode = 0644) const;
  // Opens or creates `name` read-write without following a symlink (lock files).
  int open_rw(std::string_view name, int mode = 0644) const;
  // Opens `name` read-only without following a symlink; the caller owns the descriptor.
  int open_read(std::string_view name) const;
  void make_dir(std::string_view name) const;  // fails if it exists
  // Removes entry `name`: a file or a symlink (the link itself, never its target).
  void remove_file(std::string_view name) const;
  void remove_empty_dir(std::string_view name) const;
  // Removes directory `name` and everything below it without following a symlink (a link inside
  // is removed as a link); a symlink at `name` itself is removed as a link.
  void remove_tree(std::string_view name) const;
  void rename(std::string_view from, std::string_view to) const;
  void fsync() const;

  const std::filesystem::path& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  Dir(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  std::string at(std::string_view name) const;  // path_/name, for messages
  int fd_ = -1;
  std::filesystem::path path_;
};

// True when `name` is one plain entry name: not empty, no '/', not "." or "..", no NUL.
bool is_entry_name(std::string_view name);

// Writes all of `text` to `fd`, retrying short writes and interruptions; false with errno set.
bool write_all(int fd, std::string_view text);

}  // namespace shardcheck::files
