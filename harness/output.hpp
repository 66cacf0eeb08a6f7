// Every file the CLI leaves behind (report.json, index.html, manifests, JUnit, bench and plan
// JSON) is written through write_output: complete, or an OutputError naming the file and the
// system's reason. A CI gate must never read a report that silently lost its end.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string_view>

namespace shardcheck::harness {

// A file that could not be written completely (open, write, close or rename failed). The CLI
// reports it and exits 3: the run's result did not reach its reader.
class OutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writes `text` to `file` whole. A regular file (or a new one) is written to a temporary file
// beside it and renamed over it once every byte is written and the file is closed, so a reader
// sees the old content or the new, never half of either (a symlink's target is the file
// replaced). A name for an open descriptor (/dev/stdout, /dev/fd/N) or a target that is not a
// regular file (a terminal, a pipe) is written in place, appending, with every write checked; a
// FIFO nobody reads is refused instead of waited on. `what` names the option (e.g. "--junit").
void write_output(const std::filesystem::path& file, std::string_view text, std::string_view what);

}  // namespace shardcheck::harness
