// render_html on synthetic report.json documents: every section shows when its data is there, one
// timeline lane per rank (capped for huge runs), user strings escaped, old/minimal/mistyped reports
// render without throwing, the page is self-contained and byte-for-byte deterministic.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "harness/html.hpp"

namespace shardcheck::harness {

using nlohmann::json;

// A report with every section (also used by html_browser_test.cpp).
json sample_report(int ranks) {
  json groups = json::array(), memory = json::array(), events = json::array();
  const json top = {{"rank", 1},
                    {"config", "dp32-tp4-pp8-zero2-mb1"},
                    {"family", "TP + PP + DP"},
                    {"step_time_s", 3.279},
                    {"exposed_comm_s", 1.178},
                    {"memory_per_rank_bytes", 1.02e11},
                    {"mfu", 0.567},
                    {"hfu", 0.581},
                    {"reason", "fastest that fits"}};
  for (int r = 0; r < ranks; ++r) {
    groups.push_back({{"rank", r},
                      {"dp", json::array({r % 2, r % 2 + 2})},
                      {"tp", {r}},
                      {"pp", {r}},
                      {"cp", {r}},
                      {"ep", {r}}});
    const double act = (4 + r) * 1048576.0;
    memory.push_back({{"rank", r},
                      {"params", 8 * 1048576.0},
                      {"grads", 8 * 1048576.0},
                      {"optimizer", 32 * 1048576.0},
                      {"activations", act},
                      {"temporary", 2 * 1048576.0},
                      {"peak", 50 * 1048576.0 + act},
                      {"peak_phase", "backward"}});
    const double slow = r == ranks - 1 ? 1.5 : 1.0;  // the last rank straggles
    for (int step = 1; step <= 3; ++step) {
      const double t = (step - 1) * 0.012;
      events.push_back({{"rank", r},
                        {"stream", "compute"},
                        {"kind", "forward"},
                        {"name", "forward"},
                        {"step", step},
                        {"start", t},
                        {"end", t + 0.003 * slow}});
      events.push_back({{"rank", r},
                        {"stream", "compute"},
                        {"kind", "backward"},
                        {"name", "backward"},
                        {"step", step},
                        {"start", t + 0.003 * slow},
                        {"end", t + 0.009 * slow}});
      events.push_back({{"rank", r},
                        {"stream", "comm"},
                        {"kind", "all_reduce"},
                        {"name", "all_reduce bucket 0"},
                        {"step", step},
                        {"start", t + 0.0095 * slow},
                        {"end", t + 0.0095 * slow + 0.0015},
                        {"bytes", 4194304},
                        {"group", "dp0"},
                        {"seq", 2 * step}});
    }
  }
  json parity = json::array();
  parity.push_back({{"config", "dp2"},
                    {"strategy", "ddp"},
                    {"world_size", 2},
                    {"supported", true},
                    {"steps",
                     {{{"step", 1}, {"loss", 4.1}, {"ref_loss", 4.1}, {"max_rel_err", 3e-15}},
                      {{"step", 2}, {"loss", 3.9}, {"ref_loss", 3.9}, {"max_rel_err", 0.0}}}},
                    {"max_rel_err", 3e-15},
                    {"tolerance", 1e-10},
                    {"pass", true},
                    {"detail", ""},
                    {"wall_s", 0.25},
                    {"timing", {{"step_time_s", 0.011}, {"tokens_per_s", 1.2e5}}},
                    {"memory", {memory[0]}}});
  parity.push_back(
      {{"config", "dp2-zero3"},
       {"strategy", "zero3"},
       {"world_size", 2},
       {"supported", true},
       {"steps", {{{"step", 1}, {"loss", 4.2}, {"ref_loss", 4.1}, {"max_rel_err", 2e-2}}}},
       {"max_rel_err", 2e-2},
       {"tolerance", 1e-10},
       {"pass", false},
       {"detail", "loss differs at step 1"}});
  parity.push_back({{"config", "pp2"},
                    {"supported", false},
                    {"pass", false},
                    {"detail", "pipeline parallelism is not implemented yet"}});
  json flight = json::array();
  for (int r = 0; r < ranks; ++r) {
    json recs = json::array();
    for (int s = 0; s < 20; ++s)
      recs.push_back({{"seq", s},
                      {"group", "dp"},
                      {"op", "all_reduce"},
                      {"dtype", "f64"},
                      {"count", 1024},
                      {"root", -1},
                      {"state", r == 1 && s == 19 ? "issued" : "completed"},
                      {"start", 0.001 * s},
                      {"end", 0.001 * s + 0.0005},
                      {"step", 1 + s / 10}});
    flight.push_back({{"rank", r}, {"records", recs}});
  }
  return {
      {"pass", false},
      {"scenario", "dp-tp-sample"},
      {"description", "a synthetic report with every section"},
      {"backend", "sim"},
      {"world_size", ranks},
      {"manifest",
       {{"mesh",
         {{"dp", 2},
          {"tp", ranks / 2},
          {"pp", 1},
          {"cp", 1},
          {"ep", 1},
          {"order", "tp-cp-ep-dp-pp"},
          {"zero", 1},
          {"fsdp", nullptr}}},
        {"order", "tp-cp-ep-dp-pp"},
        {"groups", groups},
        {"seed", 1234},
        {"precision", "f64"},
        {"global_batch_sequences", 8},
        {"code_version", "0.1.0"}}},
      {"parity", parity},
      {"memory", memory},
      {"moe",
       {{"source", "the reference run's routing"},
        {"experts", 4},
        {"top_k", 2},
        {"capacity_factor", 1.0},
        {"steps",
         {{{"step", 1},
           {"aux", 0.0202},
           {"dropped", 6},
           {"layers",
            {{{"layer", 1},
              {"routed", {10, 14, 9, 15}},
              {"kept", {10, 12, 9, 11}},
              {"dropped", 6}}}}}}},
        {"total",
         {{"routed", {10, 14, 9, 15}},
          {"kept", {10, 12, 9, 11}},
          {"dropped", 6},
          {"drop_fraction", 0.125},
          {"max_over_mean", 1.25}}}}},
      {"timing",
       {{"step_time_s", 0.0165},
        {"rank_step_time_s", {{"p50", 0.011}, {"p95", 0.016}, {"max", 0.0165}}},
        {"tokens_per_s", 99300.0},
        {"mfu", 0.41},
        {"bubble_fraction", 0.0},
        {"scaling_efficiency", 0.93},
        {"mfu_formula", "6*N*T / (step_time * peak)"}}},
      {"timeline", {{"ranks", ranks}, {"events", events}}},
      {"faults",
       {{{"kind", "deadlock"},
         {"detected", true},
         {"ranks", {1}},
         {"op", "all_reduce"},
         {"group", "dp"},
         {"seq", 19},
         {"step", 2},
         {"message",
          "deadlock: rank 1 never arrived at all_reduce seq 19 of group dp\n  rank 0 waits"},
         {"flight_records", flight}}}},
      {"drills",
       {{{"name", "restore_same"}, {"pass", true}, {"detail", "bitwise equal"}},
        {{"name", "corrupt_shard"}, {"pass", false}, {"detail", "restore did not fail"}}}},
      {"plan",
       {{"candidates",
         {{{"mesh", {{"dp", 16}, {"tp", 8}, {"pp", 8}}},
           {"step_time_s", 9.5},
           {"memory_per_rank_bytes", 60e9},
           {"fits", true},
           {"tokens_per_s", 4.4e5},
           {"mfu", 0.45},
           {"placement",
            {{{"axis", "tp"}, {"size", 8}, {"link", "intra_node"}},
             {{"axis", "dp"}, {"size", 16}, {"link", "inter_node"}, {"nodes_spanned", 16}}}},
           {"note", "fastest that fits"}},
          {{"mesh", {{"dp", 128}, {"tp", 8}}},
           {"step_time_s", 7.0},
           {"memory_per_rank_bytes", 300e9},
           {"fits", false},
           {"note", "exceeds 141 GiB"}}}},
        {"scaling",
         {{"strong",
           {{{"world_size", 8}, {"step_time_s", 8.0}, {"efficiency", 1.0}},
            {{"world_size", 64}, {"step_time_s", 1.1}, {"efficiency", 0.91}},
            {{"world_size", 1024}, {"step_time_s", 0.09}, {"efficiency", 0.69}}}},
          {"weak",
           {{{"world_size", 8}, {"efficiency", 1.0}},
            {{"world_size", 1024}, {"efficiency", 0.88}}}}}},
        {"goodput", {{"tokens_per_s", 3.9e5}, {"fraction", 0.89}}}}},
      {"search",
       {{"world_size", 1024},
        {"global_batch", 1024},
        {"device_memory_bytes", 1.51e11},
        {"meshes", {{"considered", 506}, {"not_built", 218}}},
        {"candidates", {{"enumerated", 70728}, {"not_fitting", 32636}, {"timed", 12813}}},
        {"top", {top}},
        {"best", "dp32-tp4-pp8-zero2-mb1"},
        {"families",
         {{{"family", "DDP"},
           {"candidates", 12},
           {"fits", false},
           {"why", "nothing fits: the least memory needs 545 GiB of 141"},
           {"config",
            {{"config", "dp1024-zero1-mb1-rc_full"}, {"memory_per_rank_bytes", 5.85e11}}}},
          {{"family", "TP + PP + DP"},
           {"candidates", 20016},
           {"fits", true},
           {"why", "the best overall"},
           {"config", top}}}},
        {"wall_s", 2748.7},
        {"wall_split_s",
         {{"enumerate_and_ledger", 1491.7}, {"bounds", 18.5}, {"timing", 1238.3}}}}},
  };
}

namespace {

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

TEST(Html, EverySectionAppearsWhenItsDataIsPresent) {
  const std::string h = render_html(sample_report(4));
  for (const char* id :
       {"parity", "timing", "timeline", "memory", "moe", "faults", "drills", "plan", "search"})
    EXPECT_NE(h.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_NE(h.find("6 assignments dropped (12.50 %); the busiest expert took 1.25× the mean"),
            std::string::npos);
  EXPECT_NE(h.find("<svg id=\"timeline\" class=\"timeline\""), std::string::npos);
  EXPECT_NE(h.find("<svg id=\"memory\" class=\"memory\""), std::string::npos);
  EXPECT_NE(h.find("<svg id=\"scaling\" class=\"scaling\""), std::string::npos);
  EXPECT_EQ(count(h, "class=\"membar\""), 4u + 1u);  // 4 ranks + dp2's per-config memory
  EXPECT_NE(h.find("max peak"), std::string::npos);
  EXPECT_NE(h.find("<pre class=\"message\">deadlock: rank 1 never arrived"), std::string::npos);
  EXPECT_EQ(count(h, "<table class=\"flight culprit\">"), 1u);  // rank 1 only
  EXPECT_NE(h.find("last 12 of 20"), std::string::npos);
  EXPECT_NE(h.find("<tr class=\"fail\"><td>dp2-zero3</td>"), std::string::npos);
  EXPECT_NE(h.find("UNSUPPORTED"), std::string::npos);
  EXPECT_NE(h.find("class=\"spark\""), std::string::npos);
  // dp2's loss against the reference and its error per step
  EXPECT_NE(h.find("<svg id=\"cfg0-loss\" class=\"loss\""), std::string::npos);
  EXPECT_EQ(count(h, "class=\"run\" points="), 1u);
  EXPECT_NE(h.find("mfu_formula"), std::string::npos);  // unknown timing fields still shown
  EXPECT_NE(h.find("dp16 \xC3\x97 tp8 \xC3\x97 pp8"), std::string::npos);
  EXPECT_NE(h.find("<tr class=\"nofit\">"), std::string::npos);
  EXPECT_NE(h.find("<td>tp 8 intra, dp 16 inter (16 nodes)</td>"), std::string::npos);  // links
  EXPECT_NE(h.find("<details class=\"config\" id=\"cfg0\">"), std::string::npos);
  EXPECT_NE(h.find("step 3"), std::string::npos);            // step boundaries marked
  EXPECT_NE(h.find(">20.0 MiB</text>"), std::string::npos);  // byte axis in binary units
  EXPECT_NE(h.find("rank \xE2\x86\x92 group table (4 ranks)"), std::string::npos);
}

// A step timeline with step_timeline's `memory` draws the memory over the step under it.
// The search section: what was enumerated and not built, the fastest with their
// reasons, each family's best (a family where nothing fits marked so) and the search's time.
TEST(Html, SearchShowsTheRankingAndEachFamilysBest) {
  const std::string h = render_html(sample_report(2));
  const std::string sec = h.substr(h.find("<section id=\"search\">"));
  EXPECT_NE(sec.find("Every mesh of 1024 ranks, global batch 1024 sequences"), std::string::npos);
  EXPECT_NE(sec.find("Best: <code>dp32-tp4-pp8-zero2-mb1</code>"), std::string::npos);
  EXPECT_NE(sec.find("<th>not_built</th><td>218</td>"), std::string::npos);
  EXPECT_NE(sec.find("<th>not_fitting</th><td>32636</td>"), std::string::npos);
  EXPECT_NE(sec.find("<td class=\"num\">56.7%</td><td class=\"num\">58.1%</td>"),
            std::string::npos);
  EXPECT_NE(sec.find("fastest that fits"), std::string::npos);
  EXPECT_EQ(count(sec, "<tr class=\"nofit\"><td>DDP</td>"), 1u);
  EXPECT_NE(sec.find("nothing fits: the least memory needs 545 GiB of 141"), std::string::npos);
  EXPECT_NE(sec.find("<td>TP + PP + DP</td><td class=\"num\">20016</td><td class=\"fits\">yes"),
            std::string::npos);
  EXPECT_NE(sec.find("<th>clock</th><td class=\"num\">1238 s</td>"), std::string::npos);
  EXPECT_NE(sec.find("<th>lower bounds</th><td class=\"num\">18.5 s</td>"), std::string::npos);
  EXPECT_NE(h.find("<a href=\"#search\">search</a>"), std::string::npos);
  // A search without any fitting candidate says so; no search, no section and no nav entry.
  json none = sample_report(2);
  none["search"].erase("top");
  EXPECT_NE(render_html(none).find("No candidate fits."), std::string::npos);
  json plain = sample_report(2);
  plain.erase("search");
  EXPECT_EQ(render_html(plain).find("search"), std::string::npos);
}

TEST(Html, MemoryOverTheStepIsDrawnUnderItsTimeline) {
  json r = sample_report(2);
  json tl = r.at("timeline");
  tl["memory"] = {{"rank", 1},
                  {"peak", 3 << 20},
                  {"step", 2},
                  {"span_s", 0.01},
                  {"buckets", json::array({1 << 20, 3 << 20, 2 << 20})}};
  r["parity"][0]["timeline"] = tl;
  const std::string h = render_html(r);
  EXPECT_NE(h.find("class=\"memstep\""), std::string::npos);
  EXPECT_NE(h.find("tracked memory of rank 1 over step 2"), std::string::npos);
  EXPECT_NE(h.find(">3.00 MiB</text>"), std::string::npos);  // the axis' top: the highest bucket
  r["parity"][0]["timeline"].erase("memory");
  EXPECT_EQ(render_html(r).find("class=\"memstep\""), std::string::npos);
}

TEST(Html, OneLanePerRank) {
  for (int n : {1, 2, 4, 7, 8}) {
    json r = sample_report(n);
    r["parity"] = json::array();  // no per-configuration timelines on the page
    const std::string h = render_html(r);
    EXPECT_EQ(count(h, "class=\"lane\""), static_cast<std::size_t>(n)) << n;
    EXPECT_NE(h.find("data-rank=\"" + std::to_string(n - 1) + "\""), std::string::npos);
  }
  // Ranks without events still get their lane; "ranks" missing: taken from the events.
  const std::string idle = render_html({{"timeline", {{"ranks", 3}, {"events", json::array()}}}});
  EXPECT_EQ(count(idle, "class=\"lane\""), 3u);
  const std::string derived = render_html(
      {{"timeline",
        {{"events", {{{"rank", 5}, {"stream", "comm"}, {"start", 0}, {"end", 1e-3}}}}}}});
  EXPECT_EQ(count(derived, "class=\"lane\""), 6u);
}

TEST(Html, LargeRunsAreCappedAndSaySo) {
  json events = json::array();
  for (int i = 0; i < 40000; ++i)
    events.push_back({{"rank", i % 100},
                      {"stream", i % 2 ? "comm" : "compute"},
                      {"kind", "forward"},
                      {"start", i * 1e-6},
                      {"end", i * 1e-6 + 5e-7},
                      {"step", 1 + i / 10000}});
  const std::string h = render_html({{"timeline", {{"ranks", 100}, {"events", events}}}});
  EXPECT_EQ(count(h, "class=\"lane\""), 64u);
  EXPECT_NE(h.find("Showing ranks 0\xE2\x80\x93"
                   "63 of 100."),
            std::string::npos);
  EXPECT_NE(h.find("Showing the first 20000 of "), std::string::npos);
  EXPECT_LT(count(h, "<rect x="), 20001u);
  EXPECT_LT(h.size(), 16u << 20);
}

TEST(Html, EscapesEveryUserString) {
  const std::string evil = "<script>alert(1)</script>&\"";
  json r = sample_report(2);
  r["scenario"] = evil;
  r["description"] = evil;
  r["parity"][0]["config"] = evil;
  r["parity"][1]["detail"] = evil;
  r["faults"][0]["message"] = evil;
  r["faults"][0]["kind"] = evil;
  r["timeline"]["events"][0]["name"] = evil;
  r["memory"][0]["peak_phase"] = evil;
  r["drills"][0]["name"] = evil;
  r["plan"]["candidates"][0]["note"] = evil;
  r["search"]["top"][0]["reason"] = evil;
  r["search"]["families"][0]["why"] = evil;
  r["search"]["families"][1]["config"]["config"] = evil;
  r["manifest"]["order"] = evil;
  const std::string h = render_html(r);
  EXPECT_EQ(h.find("<script"), std::string::npos);
  EXPECT_EQ(h.find(evil), std::string::npos);
  EXPECT_GE(count(h, "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;"), 13u);
  // Attribute context and odd bytes: quotes, control characters and invalid UTF-8.
  EXPECT_EQ(html::escape("a'b\"c"), "a&#39;b&quot;c");
  EXPECT_EQ(html::escape(std::string("x\x01y\xFFz\xC3\xA9\n")),
            "x\xEF\xBF\xBDy\xEF\xBF\xBDz\xC3\xA9\n");
  EXPECT_EQ(html::escape("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
}

TEST(Html, MinimalAndOldReportsRender) {
  const std::string h = render_html({{"pass", true}, {"scenario", "tiny"}});
  EXPECT_NE(h.find("tiny"), std::string::npos);
  EXPECT_NE(h.find("badge pass"), std::string::npos);
  EXPECT_NE(h.find("<span class=\"absent\" title=\"not recorded in this report\">timeline</span>"),
            std::string::npos);
  EXPECT_EQ(h.find("<section"), std::string::npos);
  for (const json& j : {json(), json::object(), json::array(), json("x"), json(3), json(true)})
    EXPECT_NO_THROW(render_html(j)) << j.dump();
  json old = sample_report(2);  // a report from before timeline/memory/faults/plan existed
  for (const char* k : {"timeline", "memory", "faults", "plan", "timing", "drills"}) old.erase(k);
  const std::string o = render_html(old);
  EXPECT_NE(o.find("<section id=\"parity\">"), std::string::npos);
  EXPECT_EQ(o.find("<section id=\"timeline\">"), std::string::npos);
  EXPECT_EQ(o.find("<section id=\"faults\">"), std::string::npos);
}

// Every node of the sample replaced by each wrong type in turn: the page still renders.
TEST(Html, MistypedFieldsNeverThrow) {
  const json base = sample_report(2);
  const json wrong[] = {nullptr,        "s",  -1,
                        1e300,          -0.5, json::array(),
                        json::object(), true, std::numeric_limits<double>::quiet_NaN()};
  std::size_t renders = 0;
  std::function<void(const json::json_pointer&, const json&)> walk =
      [&](const json::json_pointer& p, const json& node) {
        if (node.is_array() && node.size() > 3) {  // a few elements of long arrays are enough
          for (std::size_t i = 0; i < 3; ++i) walk(p / i, node[i]);
        } else if (node.is_structured()) {
          for (const auto& [k, v] : node.items()) walk(p / k, v);
        }
        for (const json& w : wrong) {
          json m = base;
          m[p] = w;
          ++renders;
          ASSERT_NO_THROW(render_html(m)) << p.to_string() << " = " << w.dump();
        }
      };
  walk(json::json_pointer(), base);
  EXPECT_GT(renders, 1000u);
}

TEST(Html, SelfContainedAndDeterministic) {
  const json r = sample_report(4);
  const std::string a = render_html(r), b = render_html(r);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, render_html(json::parse(r.dump())));  // a round trip through text changes nothing
  for (const char* ref : {"http://", "https://", "src=", "<link", "@import", "url("})
    EXPECT_EQ(a.find(ref), std::string::npos) << ref;
  EXPECT_EQ(a.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(a.find("Content-Security-Policy"), std::string::npos);
}

TEST(Html, MatrixReportHasOneSectionPerScenario) {
  json a = sample_report(2), b = sample_report(3);
  a["parity"] = b["parity"] = json::array();
  b["scenario"] = "second";
  const std::string h = render_html({{"pass", false}, {"scenarios", {a, b}}});
  EXPECT_EQ(count(h, "<section class=\"scenario\">"), 2u);
  EXPECT_EQ(count(h, "class=\"lane\""), 5u);
  EXPECT_NE(h.find("id=\"s0-timeline\""), std::string::npos);
  EXPECT_NE(h.find("id=\"s1-timeline\""), std::string::npos);
  EXPECT_NE(h.find("href=\"#s1-top\">second</a>"), std::string::npos);
}

TEST(Html, Formats) {
  EXPECT_EQ(html::fmt_bytes(512), "512 B");
  EXPECT_EQ(html::fmt_bytes(1536), "1.50 KiB");
  EXPECT_EQ(html::fmt_bytes(3.0 * (1 << 30)), "3.00 GiB");
  EXPECT_EQ(html::fmt_seconds(0.0125), "12.5 ms");
  EXPECT_EQ(html::fmt_mesh(json{{"dp", 2}, {"tp", 4}, {"pp", 1}, {"zero", 3}}),
            "dp2 \xC3\x97 tp4 \xC2\xB7 ZeRO-3");
  EXPECT_EQ(html::colour_for("no-such-kind"), html::colour_for("no-such-kind"));
}

}  // namespace
}  // namespace shardcheck::harness
