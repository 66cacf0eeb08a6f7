// Hostile use of the CLI, one class per test group (issue "no input crashes, hangs or passes
// silently"): output that cannot be written completely, and the writer of every output file.
// Scenario-file limits are in scenario_test.cpp, thread-start failures in tests/sim.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>

#include "checkpoint/errors.hpp"
#include "cli_support.hpp"
#include "comm/text.hpp"
#include "harness/output.hpp"
#include "harness/report.hpp"

namespace shardcheck::harness {
namespace {

namespace fs = std::filesystem;
using shardcheck::testing::shardcheck;
using shardcheck::testing::small_scenario;
using shardcheck::testing::TempDir;

using shardcheck::testing::has;

using shardcheck::testing::slurp;

TEST(OutputFile, ReplacesTheFileWholeAndLeavesNoTemporary) {
  TempDir tmp("shardcheck_output_replace");
  const fs::path file = tmp.path() / "report.json";
  write_output(file, "old", "--report");
  write_output(file, "new content", "--report");
  EXPECT_EQ(slurp(file), "new content");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(tmp.path())) ++entries;
  EXPECT_EQ(entries, 1);  // no *.tmp.* left beside it
}

// A symlinked report (a CI workspace often links its artifacts) stays a link; the file it names,
// existing or not yet, is the one written whole.
TEST(OutputFile, ASymlinkStaysALinkAndItsTargetIsWritten) {
  TempDir tmp("shardcheck_output_symlink");
  fs::create_symlink("real.xml", tmp.path() / "link.xml");
  write_output(tmp.path() / "link.xml", "first", "--junit");
  write_output(tmp.path() / "link.xml", "second", "--junit");
  EXPECT_TRUE(fs::is_symlink(tmp.path() / "link.xml"));
  EXPECT_EQ(slurp(tmp.path() / "real.xml"), "second");
}

TEST(OutputFile, EveryFailureIsNamed) {
  TempDir tmp("shardcheck_output_fail");
  // Into a directory that does not exist, over a directory, and onto a full device.
  const auto message = [](const fs::path& file) {
    try {
      write_output(file, "x", "--junit");
    } catch (const OutputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string missing = message(tmp.path() / "no" / "junit.xml");
  EXPECT_TRUE(has(missing, "--junit") && has(missing, "junit.xml")) << missing;
  fs::create_directory(tmp.path() / "dir");
  EXPECT_TRUE(has(message(tmp.path() / "dir"), "directory")) << message(tmp.path() / "dir");
  if (fs::exists("/dev/full")) {
    const std::string full = message("/dev/full");
    EXPECT_TRUE(has(full, "/dev/full") && has(full, "could not write")) << full;
  }
}

TEST(OutputFile, AFifoNobodyReadsIsRefusedAtOnce) {
  TempDir tmp("shardcheck_output_fifo");
  const fs::path fifo = tmp.path() / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(write_output(fifo, "x", "--json"), OutputError);
  // Not a timing assertion on speed: a blocked open would never return at all.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// The CLI: a run whose JUnit file or report cannot be written completely fails (exit 3) and
// names the file, instead of exiting 0 with an empty or truncated file for a CI gate to read.
TEST(HostileOutput, ALostJunitOrReportFailsTheRun) {
  TempDir tmp("shardcheck_hostile_output");
  const fs::path scenario = tmp.write("s.json", small_scenario("lost", {{{"dp", 2}}}, 11, 1));
  if (fs::exists("/dev/full")) {
    const auto [code, out] = shardcheck("run " + scenario.string() + " --junit /dev/full");
    EXPECT_EQ(code, 3) << out;
    EXPECT_TRUE(has(out, "output lost") && has(out, "/dev/full")) << out;
  }
  // index.html cannot replace a directory of that name: known before the run, so it is refused
  // then (exit 2), and nothing is written — not a manifest.json without its report.json.
  const fs::path report = tmp.path() / "report";
  fs::create_directories(report / "index.html");
  const auto [code, out] = shardcheck("run " + scenario.string() + " --report " + report.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "index.html") && !has(out, "parity:")) << out;
  for (const auto& e : fs::directory_iterator(report))
    EXPECT_EQ(e.path().filename(), "index.html") << e.path();
}

TEST(HostileOutput, StandardOutputThatCannotBeWrittenFailsTheCommand) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  TempDir tmp("shardcheck_hostile_stdout");
  const fs::path scenario = tmp.write("s.json", small_scenario("stdout", {{{"dp", 2}}}, 11, 1));
  // shardcheck() appends 2>&1, so the message is lost with stdout; the exit code is not.
  const auto [code, out] = shardcheck("ledger " + scenario.string() + " >/dev/full");
  EXPECT_EQ(code, 3) << out;
}

// `drill checkpoint` trains one mesh and damages checkpoints itself: a matrix or faults in its
// scenario used to be ignored without a word.
TEST(HostileScenario, DrillRefusesWhatItWouldIgnore) {
  TempDir tmp("shardcheck_hostile_drill");
  nlohmann::json drill =
      shardcheck::testing::read_json(std::string(SHARDCHECK_SCENARIOS_DIR) + "/drills/ddp.json");
  nlohmann::json with_matrix = drill;
  with_matrix["matrix"] = {{{"dp", 2}}};
  nlohmann::json with_faults = drill;
  with_faults["faults"] = {{{"kind", "hang"}, {"rank", 0}, {"step", 1}}};
  for (const auto& [file, j, path] : {std::tuple{"m.json", with_matrix, "$.matrix"},
                                      std::tuple{"f.json", with_faults, "$.faults"}}) {
    const auto [code, out] = shardcheck("drill checkpoint " + tmp.write(file, j).string());
    EXPECT_EQ(code, 2) << out;
    EXPECT_TRUE(has(out, path)) << out;
  }
}

// Inputs that would allocate far past the machine are refused up front (exit 2, at once) naming
// the key, the estimate and the budget, instead of dying of bad_alloc after minutes.
TEST(HostileScenario, ResourceBombsAreRefusedAgainstTheMemoryBudget) {
  TempDir tmp("shardcheck_hostile_bombs");
  struct Bomb {
    const char* file;
    nlohmann::json patch;
    const char* names;
  };
  const Bomb bombs[] = {
      {"docs.json", {{"data", {{"documents", 1 << 30}}}}, "$.data.documents"},
      {"seq.json", {{"model", {{"seq_len", 1 << 30}}}}, "$.model.seq_len"},
      {"experts.json", {{"model", {{"moe", {{"experts", 100000}, {"top_k", 2}}}}}}, "$.model"},
  };
  for (const Bomb& b : bombs) {
    nlohmann::json j = small_scenario("bomb", {{{"dp", 2}}}, 11, 1);
    j.merge_patch(b.patch);
    const auto [code, out] =
        shardcheck("run " + tmp.write(b.file, j).string() + " --max-memory 2GB");
    EXPECT_EQ(code, 2) << b.file << ": " << out;
    EXPECT_TRUE(has(out, b.names) && has(out, "budget of 2.0 GiB")) << out;
  }
  // The same scenario fits a generous budget: the estimate is not a blanket refusal.
  const fs::path ok = tmp.write("ok.json", small_scenario("fits", {{{"dp", 2}}}, 11, 1));
  EXPECT_EQ(shardcheck("run " + ok.string() + " --max-memory 2GB").first, 0);
  // bench: a terabyte per buffer, and a negative size (which used to wrap to 2^64 - 5).
  const auto [big, big_out] = shardcheck("bench collectives --ranks 4 -e 1TB --max-memory 2GB");
  EXPECT_EQ(big, 2) << big_out;
  EXPECT_TRUE(has(big_out, "--max-bytes")) << big_out;
  for (const char* size : {"-5", "-5b", "-1kb"}) {
    const auto [neg, neg_out] = shardcheck(std::string("bench collectives --ranks 2 -e ") + size);
    EXPECT_EQ(neg, 2) << size << ": " << neg_out;
    EXPECT_TRUE(has(neg_out, "negative")) << size << ": " << neg_out;
  }
}

// Inputs that would compute for hours are refused up front against --max-time (default an hour)
// from a lower bound on their FLOPs or bytes, naming the keys that drive it; the memory budget is
// raised here so that only the time estimate can refuse.
TEST(HostileScenario, TimeBombsAreRefusedAgainstTheTimeBudget) {
  TempDir tmp("shardcheck_hostile_time");
  const fs::path many =
      tmp.write("steps.json", small_scenario("steps", {{{"dp", 2}}}, 11, 10000000));
  const auto [code, out] =
      shardcheck("run " + many.string() + " --max-memory 1000GB --max-time 60");
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(has(out, "$.train.steps") && has(out, "--max-time") && has(out, "FLOPs")) << out;
  nlohmann::json longseq = small_scenario("seq", {{{"dp", 2}}}, 11, 2000);
  longseq.merge_patch({{"model", {{"seq_len", 8192}}}, {"data", {{"documents", 200000}}}});
  const auto [seq_code, seq_out] = shardcheck("run " + tmp.write("seq.json", longseq).string() +
                                              " --max-memory 1000GB");  // default budget
  EXPECT_EQ(seq_code, 2) << seq_out;
  EXPECT_TRUE(has(seq_out, "--max-time")) << seq_out;
  const auto [bench, bench_out] =
      shardcheck("bench collectives --ranks 4 -b 1GB -e 1GB --iters 1000000 --max-memory 1000GB");
  EXPECT_EQ(bench, 2) << bench_out;
  EXPECT_TRUE(has(bench_out, "--iters 1000000") && has(bench_out, "--max-time")) << bench_out;
  // The same small scenario with a few steps runs under the default budget.
  EXPECT_EQ(
      shardcheck("run " + tmp.write("ok.json", small_scenario("ok", {{{"dp", 2}}}, 11, 2)).string())
          .first,
      0);
}

// Output a person reads cannot be forged or cut short by a name (issue 52, item 7): control
// characters are escaped where a name reaches the terminal. A scenario name holding a newline
// forged a "parity: 99 passed, 0 failed" line, ESC[2J cleared the screen; the loader refuses
// them (scenario_test.cpp), the summary escapes whatever it is given, and a checkpoint error
// keeps the whole of a tensor name holding a NUL.
TEST(HostileNames, ControlCharactersAreEscapedWherePrinted) {
  EXPECT_EQ(comm::printable(std::string("a\nb\x1b[2J\0c\x7f\xc2\x9b\t", 13)),
            "a\\nb\\x1b[2J\\0c\\x7f\\u009b\\t");
  EXPECT_EQ(comm::printable("caf\xc3\xa9 dp2-tp2"), "caf\xc3\xa9 dp2-tp2");  // UTF-8 kept
  EXPECT_EQ(comm::printable_lines("one\ntwo\r"), "one\ntwo\\r");

  RunResult r;
  r.scenario.name = "x\nparity: 99 passed, 0 failed\x1b[2J";
  ConfigResult c;
  c.config = "dp2\rforged";
  c.detail = "failed: tensor 'w\x1b]0;title\x07'\nsecond line";
  r.configs.push_back(c);
  std::ostringstream os;
  print_summary(os, r);
  const std::string out = os.str();
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_EQ(out.find('\x07'), std::string::npos) << out;
  EXPECT_EQ(out.find("\nparity: 99"), std::string::npos) << out;  // no line of its own
  EXPECT_TRUE(has(out, "# scenario x\\nparity: 99 passed, 0 failed\\x1b[2J: ")) << out;
  EXPECT_TRUE(has(out, "dp2\\rforged")) << out;
  EXPECT_TRUE(has(out, "\nsecond line")) << out;  // a message's own lines stay lines

  const std::string tensor("emb\0\nforged", 11);
  const checkpoint::CheckpointError e(checkpoint::Reason::bad_tensor, "shape\x1b[2J differs",
                                      "shard\n0.bin", tensor);
  const std::string what = e.what();  // a C string: a raw NUL would end it at "emb"
  EXPECT_EQ(what,
            "bad_tensor: shard 'shard\\n0.bin' of tensor 'emb\\0\\nforged': shape\\x1b[2J differs");
  EXPECT_EQ(e.tensor(), tensor);  // the accessor keeps the name as it was
  const checkpoint::RestoreError re(e, "step-\n3");
  EXPECT_EQ(std::string(re.what()).find('\n'), std::string::npos) << re.what();
}

// An empty path was ignored (`--report ""` wrote nothing and said nothing): refused, exit 2,
// naming the option, for every option that names a file or directory, before any work.
TEST(HostileOptions, EmptyPathsAreRefused) {
  TempDir tmp("shardcheck_hostile_empty_path");
  const std::string s = tmp.write("s.json", small_scenario("empty", {{{"dp", 2}}}, 11, 1)).string();
  const std::string cases[][2] = {
      {"run --report '' " + s, "--report"},
      {"run --junit '' " + s, "--junit"},
      {"run --dump-tensors '' " + s, "--dump-tensors"},
      {"run --checkpoint-dir '' " + s, "--checkpoint-dir"},
      {"run --resume '' " + s, "--resume"},
      {"run ''", "scenario"},
      {"matrix --report '' " + s, "--report"},
      {"matrix --junit '' " + s, "--junit"},
      {"plan --report '' " + s, "--report"},
      {"drill checkpoint --report '' " + s, "--report"},
      {"drill checkpoint --junit '' " + s, "--junit"},
      {"drill checkpoint --keep-dir '' " + s, "--keep-dir"},
      {"compare --report '' a b", "--report"},
      {"compare --junit '' a b", "--junit"},
      {"bench collectives --json ''", "--json"},
  };
  for (const auto& [args, option] : cases) {
    const auto [code, out] = shardcheck(args);
    EXPECT_EQ(code, 2) << args << "\n" << out;
    EXPECT_TRUE(has(out, option + ": an empty path")) << args << "\n" << out;
  }
  // plan's and ledger's --json are flags, not paths.
  EXPECT_EQ(shardcheck("ledger --json " + s).first, 0);
}

}  // namespace
}  // namespace shardcheck::harness
