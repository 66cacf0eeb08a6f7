// index.html in a real headless browser (Debian's chromium): it loads and exits 0, the rendered DOM
// holds the timeline SVG with one lane per rank, and the console stays silent (no script errors, no
// blocked network loads). Skips with a message where no chromium is installed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "harness/html.hpp"

namespace shardcheck::harness {

nlohmann::json sample_report(int ranks);  // html_test.cpp

namespace {

namespace fs = std::filesystem;

// $CHROMIUM, else the first of chromium, chromium-browser, google-chrome on PATH; "" if none.
std::string find_chromium() {
  if (const char* env = std::getenv("CHROMIUM"); env && *env) return env;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::vector<std::string> list;
  for (std::string d; std::getline(dirs, d, ':');) list.push_back(d);
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    for (const auto& d : list) {
      const fs::path p = fs::path(d.empty() ? "." : d) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  return "";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct BrowserRun {
  int exit_code = -1;
  std::string dom, log;
  double seconds = 0;
};

// Loads `html` from a file in a fresh profile, bounded by `timeout 60` so a stuck browser fails
// the test instead of hanging ctest.
BrowserRun load(const std::string& chromium, const std::string& html, const std::string& tag) {
  const fs::path dir =
      fs::temp_directory_path() / ("shardcheck_html_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "index.html") << html;
  const std::string cmd = "timeout 60 '" + chromium +
                          "' --headless=new --disable-gpu --no-sandbox --no-first-run "
                          "--user-data-dir='" +
                          (dir / "profile").string() +
                          "' --enable-logging=stderr --v=0 --dump-dom 'file://" +
                          (dir / "index.html").string() + "' >'" + (dir / "dom.html").string() +
                          "' 2>'" + (dir / "log.txt").string() + "'";
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  BrowserRun r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.dom = slurp(dir / "dom.html");
  r.log = slurp(dir / "log.txt");
  fs::remove_all(dir);
  return r;
}

// Console messages (chromium logs them as "INFO:CONSOLE:<line>]" or "CONSOLE(<line>)") and
// uncaught exceptions. Our page has no script, so any console message is a defect.
std::vector<std::string> console_errors(const std::string& log) {
  std::vector<std::string> out;
  std::stringstream s(log);
  for (std::string line; std::getline(s, line);)
    if (line.find(":CONSOLE") != std::string::npos || line.find("CONSOLE(") != std::string::npos ||
        line.find("Uncaught") != std::string::npos)
      out.push_back(line);
  return out;
}

std::size_t occurrences(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

TEST(HtmlBrowser, RendersWithOneLanePerRankAndNoConsoleErrors) {
  const std::string chromium = find_chromium();
  if (chromium.empty())
    GTEST_SKIP() << "no chromium found ($CHROMIUM, chromium, chromium-browser, google-chrome); "
                    "install Debian's chromium (scripts/setup) to run the browser check";
  nlohmann::json report = sample_report(4);
  report["parity"].erase(0);  // keep only the top-level timeline (4 lanes)
  const std::string html = render_html(report);
  if (const char* keep = std::getenv("SHARDCHECK_HTML_SAMPLE")) std::ofstream(keep) << html;
  const BrowserRun r = load(chromium, html, "report");
  ASSERT_EQ(r.exit_code, 0) << "chromium failed or timed out after " << r.seconds << " s\n"
                            << r.log;
  ASSERT_NE(r.dom.find("</html>"), std::string::npos) << "no DOM dumped\n" << r.log;
  // The DOM is the browser's parse of the page: SVG elements in the SVG namespace survive as <svg>.
  EXPECT_NE(r.dom.find("<svg id=\"timeline\" class=\"timeline\""), std::string::npos);
  EXPECT_EQ(occurrences(r.dom, "class=\"lane\""), 4u);
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.dom.find("data-rank=\"" + std::to_string(rank) + "\""), std::string::npos);
  EXPECT_EQ(occurrences(r.dom, "<section id="),
            7u);  // parity timing timeline memory faults drills plan
  const auto errors = console_errors(r.log);
  std::string all;
  for (const auto& e : errors) all += e + "\n";
  EXPECT_TRUE(errors.empty()) << errors.size() << " console message(s):\n" << all;
  std::cerr << "[ chromium ] " << chromium << " rendered the report in " << r.seconds << " s\n";
}

// The console check can fail: a page with a script error is caught.
TEST(HtmlBrowser, ConsoleCheckCatchesAFaultyPage) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "no chromium found (see the test above)";
  const BrowserRun r = load(chromium,
                            "<!DOCTYPE html><html><body><script>no_such_function();</script>"
                            "</body></html>",
                            "faulty");
  ASSERT_EQ(r.exit_code, 0) << r.log;
  EXPECT_FALSE(console_errors(r.log).empty()) << r.log;
}

}  // namespace
}  // namespace shardcheck::harness
