// Running the built `shardcheck` binary from tests: its exit code and everything it printed
// (stdout and stderr), reading the JSON files it writes, and scratch directories. Tests compare
// fields, never text.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace shardcheck::testing {

// {exit code (-1 if it did not exit normally), combined output} of `shardcheck ARGS`.
inline std::pair<int, std::string> shardcheck(const std::string& args) {
  FILE* p = popen((std::string(SHARDCHECK_BIN) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// A scratch directory under the system temp dir, emptied on creation and removed at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& name) : dir_(std::filesystem::temp_directory_path() / name) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() { std::filesystem::remove_all(dir_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return dir_; }
  // Writes j as DIR/file and returns its path.
  std::filesystem::path write(const std::string& file, const nlohmann::json& j) const {
    std::ofstream(dir_ / file) << j.dump(2);
    return dir_ / file;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace shardcheck::testing
