// index.html in a real headless browser (Debian's chromium): it loads and exits 0, the rendered DOM
// holds the timeline SVG with one lane per rank, and the console stays silent (no script errors, no
// blocked network loads). Skips with a message where no chromium is installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "harness/html.hpp"
#include "tests/harness/browser_support.hpp"

namespace shardcheck::harness {

nlohmann::json sample_report(int ranks);  // html_test.cpp

namespace {

namespace fs = std::filesystem;

using shardcheck::testing::BrowserRun;
using shardcheck::testing::console_errors;
using shardcheck::testing::find_chromium;
using shardcheck::testing::occurrences;

// Writes `html` to a scratch directory and loads it there.
BrowserRun load(const std::string& chromium, const std::string& html, const std::string& tag) {
  const fs::path dir =
      fs::temp_directory_path() / ("shardcheck_html_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "index.html") << html;
  BrowserRun r = shardcheck::testing::load_page(chromium, dir / "index.html", dir / "browser");
  fs::remove_all(dir);
  return r;
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
            9u);  // parity timing timeline memory moe faults drills plan search
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
