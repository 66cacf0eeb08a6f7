// Scenario loading: the DESIGN.md example and every committed scenario parse; each class of bad
// input is refused with the JSON path of the offending value and what was expected.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "harness/scenario.hpp"
#include "parallel/mp/mesh_engine.hpp"

namespace shardcheck::harness {
namespace {

nlohmann::json base() {
  return nlohmann::json::parse(R"({"name": "t", "model": {"vocab": 32, "hidden": 16, "layers": 2,
    "heads": 4, "kv_heads": 2, "ffn": 32, "seq_len": 8}, "train": {"global_batch": 8}})");
}

TEST(Scenario, DesignExampleParses) {
  const Scenario s =
      load_scenario(std::string(SHARDCHECK_SCENARIOS_DIR) + "/examples/dp2-tp2-moe.json");
  EXPECT_EQ(s.name, "dp2-tp2-moe");
  EXPECT_EQ(s.seed, 1234u);
  ASSERT_TRUE(s.model.moe.has_value());
  EXPECT_EQ(s.model.moe->experts, 4);
  EXPECT_DOUBLE_EQ(s.train.optimizer.beta2, 0.95);
  ASSERT_EQ(s.configs.size(), 2u);
  EXPECT_EQ(s.configs[0].label(), "dp4");
  EXPECT_EQ(s.configs[1].label(), "dp2-tp2-zero3");
  EXPECT_EQ(s.configs[1].mesh.world_size(), 4);
  ASSERT_TRUE(s.checkpoint.restore_parallel.has_value());
  EXPECT_EQ(s.checkpoint.restore_parallel->mesh.tp, 4);
  EXPECT_EQ(s.checkpoint.restore_parallel->mesh.dp, 1);
  EXPECT_EQ(s.drills.size(), 6u);
  EXPECT_FALSE(s.expect_fault.has_value());
}

TEST(Scenario, EveryCommittedScenarioParses) {
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(SHARDCHECK_SCENARIOS_DIR))
    if (e.path().extension() == ".json") {
      EXPECT_NO_THROW(load_scenario(e.path().string())) << e.path();
      ++n;
    }
  EXPECT_GT(n, 0);
}

TEST(Scenario, DefaultsFillWhatIsLeftOut) {
  const Scenario s = parse_scenario(nlohmann::json{{"name", "minimal"}});
  ASSERT_EQ(s.configs.size(), 1u);
  EXPECT_EQ(s.configs[0].label(), "single");
  EXPECT_EQ(s.model.kv_heads, s.model.heads);
  EXPECT_TRUE(s.expect_parity);
}

// The loader checks with the engine's own rules (parallel::validate_mesh): EP folded over CP loads,
// and a valid combination that is not built yet loads too (its row reports why, at run time).
TEST(Scenario, LoadsWhatTheEngineAcceptsAndWhatIsNotBuiltYet) {
  nlohmann::json j = base();
  j.merge_patch(nlohmann::json::parse(R"({"model": {"moe": {"experts": 4}},
    "parallel": {"dp": 2, "cp": 2, "ep": 4},
    "matrix": [{}, {"dp": 2, "tp": 2, "cp": 1, "ep": 1, "fsdp": "no_shard"}]})"));
  const Scenario s = parse_scenario(j);
  ASSERT_EQ(s.configs.size(), 2u);
  EXPECT_EQ(s.configs[0].mesh.world_size(), 4);
  EXPECT_NO_THROW(parallel::validate_mesh(s.model, s.train, mesh_options(s.configs[0], 8)));
  try {
    parallel::validate_mesh(s.model, s.train, mesh_options(s.configs[1], 8));
    ADD_FAILURE() << "no_shard on a TP mesh was accepted by the engine";
  } catch (const parallel::MeshConfigError& e) {
    EXPECT_TRUE(e.not_built()) << e.what();
    EXPECT_EQ(e.field(), "fsdp");
  }
}

// The bf16 recipe rounds an expert's gradient once per data rank: a mesh whose EP groups read
// overlapping but different data ranks (dp 2 x cp 3 with ep 2: groups read {0}, {0,1}, {1}) is
// reported as not built there, and runs in f32.
TEST(Scenario, Bf16ExpertsRefuseEpGroupsThatSplitADataRank) {
  nlohmann::json j = base();
  j.merge_patch(nlohmann::json::parse(R"({"model": {"moe": {"experts": 4}, "seq_len": 12},
    "parallel": {"dp": 2, "cp": 3, "ep": 2}})"));
  for (const char* precision : {"bf16", "f32"}) {
    j["train"]["precision"] = precision;
    const Scenario s = parse_scenario(j);
    const auto o = mesh_options(s.configs[0], 8);
    if (std::string(precision) == "f32") {
      EXPECT_NO_THROW(parallel::validate_mesh(s.model, s.train, o));
      continue;
    }
    try {
      parallel::validate_mesh(s.model, s.train, o);
      ADD_FAILURE() << "accepted";
    } catch (const parallel::MeshConfigError& e) {
      EXPECT_TRUE(e.not_built()) << e.what();
      EXPECT_NE(std::string(e.what()).find("overlapping but different data ranks"),
                std::string::npos)
          << e.what();
    }
  }
  // EP over the CP ranks of each data rank (ep a multiple of cp) is fine.
  j["parallel"] = {{"dp", 2}, {"cp", 2}, {"ep", 2}};
  j["model"]["seq_len"] = 16;
  j["train"]["precision"] = "bf16";
  const Scenario ok = parse_scenario(j);
  EXPECT_NO_THROW(parallel::validate_mesh(ok.model, ok.train, mesh_options(ok.configs[0], 8)));
}

// train.activation_checkpointing: false, true (= full), or the mode by name.
// A matrix entry inherits "zero", "fsdp" (with its details) and "bucket_elems" from "parallel" key
// by key, and becomes one typed configuration (parallel/config.hpp).
TEST(Scenario, MatrixEntriesBecomeTypedConfigurations) {
  nlohmann::json j = base();
  j.merge_patch(nlohmann::json::parse(R"({"parallel": {"dp": 4, "bucket_elems": 500,
      "fsdp": {"sharding": "hybrid_shard", "shard_group_size": 2, "prefetch": 0}},
    "matrix": [{}, {"fsdp": "shard_grad_op"}, {"fsdp": null}, {"fsdp": null, "zero": 1},
               {"fsdp": null, "zero": 3, "pp": 2, "dp": 2, "pp_schedule": "gpipe"}]})"));
  const Scenario s = parse_scenario(j);
  ASSERT_EQ(s.configs.size(), 5u);
  ASSERT_TRUE(s.configs[0].fsdp());
  EXPECT_EQ(s.configs[0].label(), "dp4-fsdp_hybrid_shard-pf0-sg2");
  EXPECT_TRUE(s.configs[0].hybrid());
  ASSERT_TRUE(s.configs[1].fsdp());
  EXPECT_EQ(s.configs[1].fsdp()->sharding, parallel::ShardingStrategy::shard_grad_op);
  EXPECT_EQ(s.configs[1].fsdp()->prefetch, 0);  // the details stay the base's
  EXPECT_TRUE(s.configs[1].keeps_params_after_forward());
  ASSERT_TRUE(s.configs[2].ddp());
  EXPECT_EQ(s.configs[2].ddp()->bucket_elems, 500u);
  EXPECT_EQ(s.configs[2].strategy_name(), "ddp");
  ASSERT_TRUE(s.configs[3].zero());
  EXPECT_EQ(s.configs[3].zero()->stage, 1);
  EXPECT_EQ(s.configs[3].bucket_elems(), 500u);
  EXPECT_EQ(s.configs[4].label(), "dp2-pp2-zero3-gpipe");
  EXPECT_EQ(s.configs[4].pp_schedule, parallel::PipeSchedule::gpipe);
  EXPECT_TRUE(s.configs[4].shards_params());
}

TEST(Scenario, ActivationCheckpointingTakesABooleanOrTheMode) {
  const std::pair<nlohmann::json, ref::Recompute> cases[] = {
      {false, ref::Recompute::kNone},
      {true, ref::Recompute::kFull},
      {"none", ref::Recompute::kNone},
      {"selective", ref::Recompute::kSelective},
      {"full", ref::Recompute::kFull}};
  for (const auto& [value, want] : cases) {
    const Scenario s = parse_scenario(
        nlohmann::json{{"name", "ac"}, {"train", {{"activation_checkpointing", value}}}});
    EXPECT_EQ(s.train.recompute, want) << value.dump();
  }
  EXPECT_EQ(parse_scenario(nlohmann::json{{"name", "ac"}}).train.recompute, ref::Recompute::kNone);
}

struct Bad {
  const char* patch;  // JSON merge-patch applied to base()
  const char* path;
  const char* says;
};

TEST(Scenario, BadInputNamesThePathAndTheExpectation) {
  const Bad cases[] = {
      {R"({"name": null})", "$.name", "missing"},
      {R"({"modle": {}})", "$.modle", "unknown key"},
      {R"({"model": {"heads": "four"}})", "$.model.heads", "expected an integer"},
      {R"({"model": {"hidden": 30}})", "$.model.hidden", "not divisible by model.heads (4)"},
      {R"({"model": {"kv_heads": 3}})", "$.model.kv_heads", "does not divide model.heads"},
      // The reference's own rules, checked by the loader (they used to exit 3 with no path).
      {R"({"model": {"hidden": 12}})", "$.model.hidden", "= 3 must be even for RoPE"},
      {R"({"model": {"vocab": 2}})", "$.model.vocab", "need model.vocab >= 3"},
      {R"({"data": {"min_len": 1}})", "$.data.min_len", "data.min_len 1 must be >= 2"},
      {R"({"model": {"moe": {"experts": 4, "top_k": 5}}})", "$.model.moe.top_k",
       "expected an integer in [1, 4]"},
      {R"({"train": {"micro_batch": 3}})", "$.train.micro_batch",
       "does not divide train.global_batch"},
      {R"({"train": {"precision": "fp8"}})", "$.train.precision",
       R"(expected one of "f64", "f32", "bf16")"},
      {R"({"train": {"optimizer": {"betas": [0.9]}}})", "$.train.optimizer.betas", "two numbers"},
      {R"({"train": {"activation_checkpointing": "partial"}})", "$.train.activation_checkpointing",
       R"(expected one of "none", "selective", "full")"},
      {R"({"train": {"activation_checkpointing": 3}})", "$.train.activation_checkpointing",
       R"(expected false, true, "none", "selective" or "full", got 3)"},
      {R"({"train": {"optimizer": {"lr": -1}}})", "$.train.optimizer.lr", "expected a number"},
      {R"({"data": {"min_len": 8, "max_len": 4}})", "$.data.max_len", "expected an integer in [8,"},
      {R"({"parallel": {"tpp": 2}})", "$.parallel.tpp", "unknown key"},
      {R"({"parallel": {"tp": 3}})", "$.parallel.tp", "does not divide model.heads (4)"},
      {R"({"parallel": {"tp": 0}})", "$.parallel.tp", "expected an integer in [1,"},
      {R"({"parallel": {"dp": 2, "ep": 2}})", "$.parallel.ep", "needs a model with moe experts"},
      {R"({"model": {"moe": {"experts": 4}}, "parallel": {"dp": 3, "ep": 3}})", "$.parallel.ep",
       "does not divide model.moe.experts (4)"},
      {R"({"model": {"moe": {"experts": 4}}, "parallel": {"ep": 2}})", "$.parallel.ep",
       "does not divide dp*cp (1*1): the expert-parallel ranks are carved out of the data- and"},
      {R"({"parallel": {"pp": 4}})", "$.parallel.pp", "fewer than the pipeline stages"},
      {R"({"parallel": {"cp": 3}})", "$.parallel.cp", "divisible by 2*cp"},
      {R"({"model": {"vocab_pad_multiple": 0}})", "$.model.vocab_pad_multiple",
       "expected an integer in [1, 65536]"},
      {R"({"model": {"vocab_pad_multiple": 65537}})", "$.model.vocab_pad_multiple",
       "expected an integer in [1, 65536]"},
      {R"({"model": {"ffn": 31}, "parallel": {"tp": 2}})", "$.parallel.tp",
       "does not divide model.ffn (31)"},
      {R"({"model": {"mlp": "geglu"}})", "$.model.mlp", "expected one of"},
      {R"({"model": {"mlp": "swiglu", "ffn": 31}, "parallel": {"tp": 2}})", "$.parallel.tp",
       "does not divide model.ffn (31)"},
      {R"({"model": {"rope": {"layout": "neox"}}})", "$.model.rope.layout", "expected one of"},
      {R"({"model": {"rope": {"theta": 1}}})", "$.model.rope.theta", "expected a number in"},
      {R"({"model": {"rope": {"scaling": {"rope_type": "yarn"}}}})",
       "$.model.rope.scaling.rope_type", "expected one of"},
      {R"({"model": {"rope": {"scaling": {"low_freq_factor": 4, "high_freq_factor": 1}}}})",
       "$.model.rope.scaling.high_freq_factor", "greater than low_freq_factor"},
      {R"({"model": {"rope": {"scaling": {"factor": 8, "beta": 1}}}})", "$.model.rope.scaling.beta",
       "unknown key"},
      {R"({"model": {"kv_heads": 4, "seq_len": 12}, "parallel": {"tp": 4, "cp": 2,
          "sequence_parallel": true}})",
       "$.parallel.sequence_parallel", "6 rows per CP rank"},
      {R"({"parallel": {"tp": 2, "cp": 2, "cp_algo": "ulysses"}})", "$.parallel.cp_algo",
       "cp_algo \"ulysses\" needs the heads per TP rank (2 query, 1 kv) divisible by cp (2)"},
      {R"({"model": {"layers": 4}, "parallel": {"pp": 2, "virtual_stages": 2}})",
       "$.parallel.virtual_stages", "needs pp_schedule"},
      {R"({"parallel": {"pp": 2}, "train": {"micro_batch": 8}})", "$.parallel.pp",
       "1 microbatches per step"},
      {R"({"parallel": {"dp": 3}})", "$.parallel.dp", "not divisible by dp*micro_batch"},
      {R"({"parallel": {"dp": 2, "world_size": 8}})", "$.parallel.world_size",
       "is not dp*tp*pp*cp = 2"},
      {R"({"parallel": {"dp": 2, "order": "tp-pp"}})", "$.parallel.order", "leaves out axis dp"},
      // Products of sizes are checked in 64 bits: 65536 x 65536 would wrap a 32-bit world to 0.
      {R"({"parallel": {"dp": 65536, "tp": 65536}})", "$.parallel.world_size",
       "dp*tp*pp*cp = 4294967296 is over the ceiling of 1048576 ranks"},
      {R"({"model": {"moe": {"experts": 4}}, "parallel": {"dp": 65536, "cp": 65536, "ep": 2}})",
       "$.parallel.world_size", "is over the ceiling"},
      {R"({"matrix": [{"dp": 1024, "pp": 1024, "cp": 2}]})", "$.matrix[0].world_size",
       "2097152 is over the ceiling"},
      {R"({"parallel": {"zero": 2, "fsdp": "full_shard"}})", "$.parallel.fsdp", "either zero"},
      {R"({"parallel": {"zero": 3, "fsdp": "full_shard"}})", "$.parallel.fsdp",
       "choose either zero (stage 3) or fsdp (\"full_shard\"), not both"},
      {R"({"parallel": {"dp": 2, "fsdp": "full_shard"}, "matrix": [{"zero": 1}]})",
       "$.matrix[0].fsdp", "either zero (stage 1)"},
      {R"({"parallel": {"zero": 4}})", "$.parallel.zero", "expected an integer in [0, 3]"},
      {R"({"matrix": [{"dp": 2}, {"tp": 3}]})", "$.matrix[1].tp", "does not divide model.heads"},
      {R"({"matrix": {"dp": 2}})", "$.matrix", "expected an array"},
      {R"({"matrix": [{"fsdp": {"sharding": "hybrid_shard", "shard_group_size": 3}, "dp": 2}]})",
       "$.matrix[0].fsdp.shard_group_size", "must be >= 1 and divide dp (2)"},
      {R"({"parallel": {"pp": 2, "pp_schedule": "interleaved"}})", "$.parallel.virtual_stages",
       "needs virtual_stages >= 2"},
      {R"({"model": {"moe": {"experts": 8}}, "parallel": {"cp": 2, "ep": 4}})", "$.parallel.ep",
       "does not divide dp*cp (1*2)"},
      {R"({"model": {"moe": {"experts": 4}}, "parallel": {"dp": 2, "tp": 2, "cp": 2, "ep": 2,
          "order": "cp-tp-ep-dp-pp"}})",
       "$.parallel.order", "tp and pp may not lie between cp, ep and dp"},
      {R"({"faults": [{"kind": "meteor", "rank": 0}]})", "$.faults[0].kind", "expected one of"},
      {R"({"faults": [{"kind": "hang", "rank": 4}]})", "$.faults[0].rank",
       "expected an integer in [0, 0]"},
      {R"({"faults": [{"kind": "memory_budget", "rank": 0}]})", "$.faults[0].bytes", "missing"},
      // A fault past the last step would never fire, and the run would pass.
      {R"({"train": {"steps": 3}, "faults": [{"kind": "hang", "rank": 0, "step": 4}]})",
       "$.faults[0].step", "expected an integer in [1, 3]"},
      {R"({"train": {"steps": 3}, "faults": [{"kind": "straggler", "rank": 0, "from_step": 9}]})",
       "$.faults[0].from_step", "expected an integer in [1, 3]"},
      {R"({"drills": ["restore_same", "bogus"]})", "$.drills[1]", "expected one of"},
      {R"({"expect": {"fault": "boom"}})", "$.expect.fault", "expected one of"},
      {R"({"seed": -1})", "$.seed", "expected an integer >= 0"},
      {R"({"checkpoint": {"restore_parallel": {"tp": 3}}})", "$.checkpoint.restore_parallel.tp",
       "does not divide"},
      // Two configurations with one label would share their outputs (issue 52, item 2).
      {R"({"matrix": [{"dp": 2, "zero": 1}, {"dp": 2}, {"dp": 2, "zero": 1}]})", "$.matrix[2]",
       "configuration label 'dp2-zero1' is also $.matrix[0]'s"},
      // Integers are integers everywhere: 2.0 is refused as "seed": 2.0 always was (item 8).
      {R"({"parallel": {"dp": 2.0}})", "$.parallel.dp",
       "expected an integer in [1, 65536], got 2.0"},
      {R"({"train": {"steps": 3.0}})", "$.train.steps", "expected an integer"},
      {R"({"seed": 2.0})", "$.seed", "expected an integer >= 0"},
      // A fault at an op the rank never issues would never fire and the run would pass (item 5):
      // the single rank issues no communication op at all.
      {R"({"faults": [{"kind": "crash", "rank": 0, "op_index": 1000000000}]})",
       "$.faults[0].op_index", "op 1000000000 is never reached"},
      {R"({"parallel": {"dp": 2}, "faults": [{"kind": "mismatch", "rank": 1, "step": 1,
          "op_index": 1000000000}]})",
       "$.faults[0].op_index", "rank 1 issues"},
      {R"({"train": {"global_batch": 2048}, "parallel": {"dp": 2048},
          "faults": [{"kind": "crash", "rank": 0, "op_index": 0}]})",
       "$.faults[0].op_index", "done for configurations of at most 1024 ranks"},
      {R"({"faults": [{"kind": "skip_collective", "rank": 0, "step": 1}]})", "$.faults[0].op_index",
       "missing"},
      {R"({"faults": [{"kind": "nan_gradient", "rank": 0, "op_index": 3}]})",
       "$.faults[0].op_index", "unknown key"},
      // A name is printed: a newline would forge a line, ESC[2J clear the screen (item 7).
      {R"({"name": "x\nparity: 99 passed, 0 failed"})", "$.name",
       "control character (\\n at byte 1)"},
      {R"({"name": "\u001b[2J"})", "$.name", "control character (\\x1b at byte 0)"},
      // A key with control characters is named escaped.
      {R"({"mo\u001bdel": {}})", "$.mo\\x1bdel", "unknown key"},
  };
  for (const Bad& b : cases) {
    nlohmann::json j = base();
    j.merge_patch(nlohmann::json::parse(b.patch));
    if (std::string(b.patch) == R"({"name": null})") j.erase("name");
    try {
      parse_scenario(j);
      ADD_FAILURE() << "accepted: " << b.patch;
    } catch (const ScenarioError& e) {
      EXPECT_EQ(e.path(), b.path) << b.patch << " -> " << e.what();
      EXPECT_NE(std::string(e.what()).find(b.says), std::string::npos)
          << b.patch << " -> " << e.what();
    }
  }
}

// Input limits, checked before parsing: only regular files (a FIFO would block forever), at most
// 16 MiB, JSON nested at most 64 levels (100 000 levels overflowed the stack); brackets inside
// strings do not count.
TEST(Scenario, HostileFilesAreRefusedBeforeParsing) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("shardcheck-hostile-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto refused = [&](const std::filesystem::path& f, const char* says) {
    try {
      load_scenario(f.string());
      ADD_FAILURE() << "accepted: " << f;
    } catch (const ScenarioError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(f.string()), std::string::npos) << e.what();
    }
  };
  const auto fifo = dir / "fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  refused(fifo, "not a regular file");
  refused(dir, "not a regular file");
  const auto deep = dir / "deep.json";
  std::ofstream(deep) << std::string(100000, '[') << std::string(100000, ']');
  refused(deep, "nested deeper than 64 levels");
  const auto big = dir / "big.json";
  std::ofstream(big) << R"({"name": "x"})" << std::string((std::size_t{16} << 20), ' ');
  refused(big, "bytes; a scenario may have at most 16777216");
  const auto quoted = dir / "quoted.json";
  std::ofstream(quoted) << R"({"name": ")" << std::string(1000, '[') << R"(\"{"})";
  EXPECT_EQ(load_scenario(quoted.string()).name, std::string(1000, '[') + "\"{");
  std::filesystem::remove_all(dir);
}

// The document itself: a scenario is an object (null said "$.name: missing"); a key given twice
// in one object is refused with its path and both places (nlohmann kept the last silently).
TEST(Scenario, TheDocumentIsAnObjectWithEachKeyOnce) {
  const auto refused = [](const std::string& text, const std::string& path, const char* says) {
    try {
      parse_scenario_text(text, "t.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ScenarioError& e) {
      EXPECT_EQ(e.path(), "t.json: " + path) << text << " -> " << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << text << " -> " << e.what();
    }
  };
  refused("null", "$", "a scenario is a JSON object");
  refused("[1]", "$", "a scenario is a JSON object");
  refused(R"({"name": "a", "parallel": {"dp": 2, "tp": 1, "dp": 1}})", "$.parallel.dp",
          "is given twice in $.parallel (its members 1 and 3)");
  refused(R"({"name": "a", "name": "b"})", "$.name", "given twice in $ (its members 1 and 2)");
  refused(R"({"name": "a", "matrix": [{"dp": 2}, {"tp": 2, "zero": 1, "tp": 2}]})",
          "$.matrix[1].tp", "given twice in $.matrix[1]");
  refused(R"({"name": "a", "faults": [[], {"kind": "hang", "kind": "crash"}]})", "$.faults[1].kind",
          "given twice");
  // The same key in different objects, and in sibling objects of an array, is fine.
  EXPECT_NO_THROW(parse_scenario_text(
      R"({"name": "a", "matrix": [{"dp": 2}, {"dp": 1, "tp": 2}], "parallel": {"dp": 1}})", "t"));
  // A file name with control characters is named escaped.
  try {
    parse_scenario_text("{", "bad\nname.json");
    ADD_FAILURE();
  } catch (const ScenarioError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad\\nname.json"), std::string::npos) << e.what();
  }
}

// A fault's op_index is bounded by the ops its rank issues in that step, counted at load on the
// planner's skeleton (harness/plan_skeleton.hpp) in a meta SimWorld: the last op loads, the next
// is refused, for each configuration of a matrix the fault applies to.
TEST(Scenario, AFaultAtAnOpIsBoundedByTheOpsTheRankIssues) {
  const auto ops = [](const nlohmann::json& j) {
    try {
      parse_scenario(j);
    } catch (const ScenarioError& e) {
      const std::string w = e.what();
      const auto at = w.find(" issues ");
      if (at != std::string::npos) return std::stoi(w.substr(at + 8));
      ADD_FAILURE() << w;
    }
    return -1;
  };
  for (const char* par :
       {R"({"dp": 2})", R"({"tp": 2})", R"({"pp": 2})", R"({"dp": 2, "zero": 3})"}) {
    nlohmann::json j = base();
    j["parallel"] = nlohmann::json::parse(par);
    j["train"]["steps"] = 3;
    j["faults"] = {{{"kind", "crash"}, {"rank", 1}, {"step", 3}, {"op_index", 1 << 30}}};
    const int n = ops(j);
    ASSERT_GT(n, 0) << par;
    j["faults"][0]["op_index"] = n - 1;
    EXPECT_NO_THROW(parse_scenario(j)) << par;
    j["faults"][0]["op_index"] = n;
    EXPECT_EQ(ops(j), n) << par;
  }
  // In a matrix, the configuration that cannot reach it is named; one whose world leaves the
  // rank out is not asked.
  nlohmann::json j = base();
  j["matrix"] = nlohmann::json::parse(R"([{"tp": 2}, {"dp": 2}, {"dp": 1}])");
  j["faults"] = {{{"kind", "hang"}, {"rank", 1}, {"op_index", 50}}};
  try {
    parse_scenario(j);
    ADD_FAILURE() << "accepted";
  } catch (const ScenarioError& e) {
    EXPECT_EQ(e.path(), "$.faults[0].op_index");
    EXPECT_NE(std::string(e.what()).find("$.matrix[1] ('dp2')"), std::string::npos) << e.what();
  }
}

TEST(Scenario, FileErrorsNameTheFile) {
  const auto dir = std::filesystem::temp_directory_path();
  EXPECT_THROW(load_scenario((dir / "no-such-scenario.json").string()), ScenarioError);
  const auto bad = dir / "shardcheck-bad-scenario.json";
  std::ofstream(bad) << "{\"name\": \"x\", ";
  try {
    load_scenario(bad.string());
    ADD_FAILURE() << "invalid JSON accepted";
  } catch (const ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
  }
  std::ofstream(bad) << R"({"name": "x", "parallel": {"tp": 3}})";
  try {
    load_scenario(bad.string());
    ADD_FAILURE() << "tp 3 accepted";
  } catch (const ScenarioError& e) {
    EXPECT_EQ(e.path(), bad.string() + ": $.parallel.tp") << e.what();
  }
  // A number past double range is bad input too (it was a library exception: "the run broke").
  std::ofstream(bad) << R"({"name": "x", "seed": 1e400})";
  try {
    load_scenario(bad.string());
    ADD_FAILURE() << "1e400 accepted";
  } catch (const ScenarioError& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
  std::filesystem::remove(bad);
}

// A long matrix is streamed once (depth and duplicate keys) and then parsed without nlohmann's
// callback parser, which rescanned the array at the end of each entry: 200 000 entries took
// 5.6 s to refuse (16 MiB of them ~90 s), now ~0.5 s. Its duplicate key in the last entry is
// named with its index; without it, the repeated configuration is refused as before.
TEST(Scenario, ALongMatrixIsParsedInOnePass) {
  nlohmann::json j = base();
  j["matrix"] = nlohmann::json::array();
  for (int i = 0; i < 200000; ++i) j["matrix"].push_back({{"dp", 2}, {"zero", 1}});
  std::string text = j.dump();
  const auto refused = [](const std::string& t, const std::string& path, const char* says) {
    try {
      parse_scenario_text(t, "long.json");
      ADD_FAILURE() << "accepted";
    } catch (const ScenarioError& e) {
      EXPECT_EQ(e.path(), "long.json: " + path) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(text, "$.matrix[1]", "configuration label 'dp2-zero1' is also $.matrix[0]'s");
  const std::string entry = R"({"dp":2,"zero":1})";
  const std::size_t last = text.rfind(entry);  // the matrix's last entry (no other object has dp)
  ASSERT_NE(last, std::string::npos);
  text.replace(last, entry.size(), R"({"dp":2,"zero":1,"zero":1})");
  refused(text, "$.matrix[199999].zero",
          "duplicate key: $.matrix[199999].zero is given twice in $.matrix[199999] (its members 2 "
          "and 3)");
}

}  // namespace
}  // namespace shardcheck::harness
