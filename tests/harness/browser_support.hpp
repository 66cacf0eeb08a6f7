// Loading a page in a real headless browser (Debian's chromium) from tests: finding the binary,
// dumping the rendered DOM and the console log, bounded by a timeout so a stuck browser fails the
// test instead of hanging ctest. Used by the HTML report's browser test and the main job's test.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace shardcheck::testing {

// $CHROMIUM, else the first of chromium, chromium-browser, google-chrome on PATH; "" if none.
inline std::string find_chromium() {
  if (const char* env = std::getenv("CHROMIUM"); env && *env) return env;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::vector<std::string> list;
  for (std::string d; std::getline(dirs, d, ':');) list.push_back(d);
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    for (const auto& d : list) {
      const std::filesystem::path p = std::filesystem::path(d.empty() ? "." : d) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  return "";
}

struct BrowserRun {
  int exit_code = -1;
  std::string dom, log;
  double seconds = 0;  // wall time of the whole browser process: start, load, layout, dump
};

// Loads the page at `page` (a file) in a fresh profile under `scratch` (created, then removed).
inline BrowserRun load_page(const std::string& chromium, const std::filesystem::path& page,
                            const std::filesystem::path& scratch) {
  namespace fs = std::filesystem;
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  const std::string cmd = "timeout 60 '" + chromium +
                          "' --headless=new --disable-gpu --no-sandbox --no-first-run "
                          "--user-data-dir='" +
                          (scratch / "profile").string() +
                          "' --enable-logging=stderr --v=0 --dump-dom 'file://" +
                          fs::absolute(page).string() + "' >'" + (scratch / "dom.html").string() +
                          "' 2>'" + (scratch / "log.txt").string() + "'";
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  BrowserRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const auto read = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  r.dom = read(scratch / "dom.html");
  r.log = read(scratch / "log.txt");
  fs::remove_all(scratch);
  return r;
}

// Console messages (chromium logs them as "INFO:CONSOLE:<line>]" or "CONSOLE(<line>)") and
// uncaught exceptions. The report has no script, so any console message is a defect.
inline std::vector<std::string> console_errors(const std::string& log) {
  std::vector<std::string> out;
  std::stringstream s(log);
  for (std::string line; std::getline(s, line);)
    if (line.find(":CONSOLE") != std::string::npos || line.find("CONSOLE(") != std::string::npos ||
        line.find("Uncaught") != std::string::npos)
      out.push_back(line);
  return out;
}

inline std::size_t occurrences(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace shardcheck::testing
