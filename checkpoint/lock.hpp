// One writer per checkpoint directory: DirLock holds an exclusive lock on DIR/.lock (flock) from
// the moment a run takes the directory until the run ends. A second run on the same directory is
// refused at once, naming the holder, instead of committing steps whose shards are partly the
// other run's. The lock dies with its process, so a killed run never leaves the directory stuck.
#pragma once

#include <filesystem>

#include "files/dir.hpp"

namespace shardcheck::checkpoint {

class DirLock {
 public:
  // Creates `dir` if needed and locks it; throws CheckpointError(Reason::locked) naming the holder
  // (process id, host, start time, as it wrote them into DIR/.lock) when another writer holds it,
  // or CheckpointError(Reason::io_error) when the lock file cannot be made.
  explicit DirLock(const std::filesystem::path& dir);
  // The same on an open directory: its .lock is opened without following a symlink.
  explicit DirLock(const files::Dir& dir);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  static constexpr const char* kFile = ".lock";

 private:
  int fd_ = -1;
};

}  // namespace shardcheck::checkpoint
