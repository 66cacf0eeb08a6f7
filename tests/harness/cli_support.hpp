// Running the built `shardcheck` binary from tests: its exit code and everything it printed
// (stdout and stderr), and reading the JSON files it writes. Tests compare fields, never text.
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

}  // namespace shardcheck::testing
