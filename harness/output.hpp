// Every file the CLI leaves behind (report.json, index.html, manifests, traces, JUnit, bench and
// plan JSON) is written through write_output or write_output_in: complete, or an OutputError naming
// the file and the system's reason. A CI gate must never read a report that silently lost its end.
// Files inside a directory the user named (--report DIR) are written through files::Dir: nothing
// below DIR is followed if it is a symlink, and nothing leaves DIR.
#pragma once

#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "files/dir.hpp"

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

// The directory an output option names (--report, --checkpoint-dir, --dump-tensors, --keep-dir),
// created now so that a typo fails before a long run. Throws BadInput (exit 2) naming the option.
files::Dir open_output_dir(std::string_view option, const std::string& dir);

// Before anything runs: each of `rels` (relative paths below `dir`, e.g. "report.json",
// "traces/s/00-dp2.json") can be written — every directory on the way is made and is a real
// directory, the file is absent or a regular file, and none is a symlink — and no two of them,
// and none of them and an input file (`inputs`), are the same file. Throws BadInput naming the
// path and why.
void check_output_files(const files::Dir& dir, std::span<const std::filesystem::path> rels,
                        std::span<const std::string> inputs, std::string_view option);

// Writes `rel` below `dir` whole (its directories made, each confined). OutputError on failure.
void write_output_in(const files::Dir& dir, const std::filesystem::path& rel,
                     std::string_view text, std::string_view what);

// A file option (--junit FILE, --json FILE) naming one of the inputs: BadInput, before anything
// runs, instead of overwriting the input with the output.
void refuse_output_over_input(const std::string& output, std::span<const std::string> inputs,
                              std::string_view option);

}  // namespace shardcheck::harness
