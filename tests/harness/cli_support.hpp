// Running the built `shardcheck` binary from tests: its exit code and everything it printed
// (stdout and stderr), reading the JSON files it writes, and scratch directories. Tests compare
// fields, never text.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace shardcheck::testing {

// The committed scenarios (scenarios/ of the source tree).
inline const std::string kScenarios = SHARDCHECK_SCENARIOS_DIR;

// Whether `part` occurs in `s` (output and messages are checked by the fields they name).
inline bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// {exit code (-1 if it did not exit normally), combined output} of `shardcheck ARGS`.
inline std::pair<int, std::string> shardcheck(const std::string& args) {
  FILE* p = popen((std::string(SHARDCHECK_BIN) + " " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p)) out += buf;
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The whole file as text ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// A tiny dense scenario (f64, tied embedding, 2 layers, GQA) with the given matrix: what the
// backend and compute tests run; callers adjust fields (precision, steps, ...) on the result.
inline nlohmann::json small_scenario(const std::string& name, const nlohmann::json& matrix,
                                     unsigned seed = 11, int steps = 3) {
  return {{"name", name},
          {"seed", seed},
          {"model",
           {{"vocab", 24},
            {"hidden", 16},
            {"layers", 2},
            {"heads", 4},
            {"kv_heads", 2},
            {"ffn", 20},
            {"seq_len", 8},
            {"tie_embeddings", true}}},
          {"train",
           {{"steps", steps},
            {"global_batch", 8},
            {"micro_batch", 2},
            {"precision", "f64"},
            {"optimizer", {{"lr", 5e-3}}}}},
          {"data", {{"documents", 80}, {"min_len", 3}, {"max_len", 12}}},
          {"parallel", {{"dp", 1}}},
          {"matrix", matrix}};
}

// A scratch directory under the system temp dir, emptied on creation and removed at the end; the
// process id in its name keeps two test runs on one machine out of each other's way.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : dir_(std::filesystem::temp_directory_path() / (name + "." + std::to_string(getpid()))) {
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
