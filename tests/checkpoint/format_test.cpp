// The shard header (round trip, and every malformation refused with bad_header / version_mismatch)
// and the manifest (round trip, strict schema, unsafe paths, bad layouts, hostile JSON).
#include <gtest/gtest.h>

#include <chrono>

#include "tests/checkpoint/support.hpp"

namespace shardcheck::testing {
namespace {

using ck::Reason;

ck::ShardHeader sample_header() {
  return {
      "param/layers.0.attn.wq", comm::DType::bf16, {8, 6}, ck::Box{{2, 0}, {3, 6}}, 36, 0x1234, 0};
}

template <class F>
Reason reason_of(F&& f) {
  try {
    f();
  } catch (const ck::RestoreError& e) {
    return e.reason();
  }
  ADD_FAILURE() << "no RestoreError";
  return Reason::io_error;
}

std::vector<std::byte> reseal(std::vector<std::byte> h) {
  // Recompute the trailing header checksum so a test reaches the check after it.
  const std::uint64_t sum = ck::xxh3(std::span(h).first(h.size() - 8));
  for (int i = 0; i < 8; ++i)
    h[h.size() - 8 + static_cast<std::size_t>(i)] = std::byte(sum >> (8 * i));
  return h;
}

TEST(ShardHeader, RoundTrips) {
  for (const ck::Slice& s : {ck::Slice(ck::Box{{2, 0}, {3, 6}}), ck::Slice(ck::FlatRange{5, 18})}) {
    auto h = sample_header();
    h.slice = s;
    const auto bytes = ck::encode_shard_header(h);
    const auto back = ck::parse_shard_header(bytes);
    EXPECT_EQ(back.tensor, h.tensor);
    EXPECT_EQ(back.dtype, h.dtype);
    EXPECT_EQ(back.shape, h.shape);
    EXPECT_EQ(back.slice, h.slice);
    EXPECT_EQ(back.payload_bytes, h.payload_bytes);
    EXPECT_EQ(back.payload_xxh3, h.payload_xxh3);
    EXPECT_EQ(back.header_bytes, bytes.size());
    EXPECT_EQ(ck::shard_header_size(bytes), bytes.size());
  }
}

TEST(ShardHeader, RefusesEveryMalformation) {
  const auto good = ck::encode_shard_header(sample_header());
  auto parse = [](std::vector<std::byte> b) { return [b] { ck::parse_shard_header(b, "x"); }; };
  auto with = [&](std::size_t at, std::uint8_t v) {
    auto b = good;
    b[at] = std::byte{v};
    return reseal(b);
  };
  EXPECT_EQ(reason_of(parse({})), Reason::bad_header);
  EXPECT_EQ(reason_of(parse(std::vector<std::byte>(good.begin(), good.end() - 1))),
            Reason::bad_header);                                             // truncated
  EXPECT_EQ(reason_of(parse(with(0, 'X'))), Reason::bad_header);             // magic
  EXPECT_EQ(reason_of(parse(with(8, 2))), Reason::version_mismatch);         // version
  EXPECT_EQ(reason_of(parse(with(12, 99))), Reason::bad_header);             // header size
  EXPECT_EQ(reason_of(parse(with(16, 0))), Reason::bad_header);              // dtype code
  EXPECT_EQ(reason_of(parse(with(17, 7))), Reason::bad_header);              // slice kind
  EXPECT_EQ(reason_of(parse(with(18, 17))), Reason::bad_header);             // ndim > 16
  EXPECT_EQ(reason_of(parse(with(21, 0x10))), Reason::bad_header);           // name length 4096+
  EXPECT_EQ(reason_of(parse(with(24, 37))), Reason::bad_header);             // payload size
  EXPECT_EQ(reason_of(parse(with(40 + 8 + 8 * 2, 7))), Reason::bad_header);  // box outside shape
  auto flipped = good;
  flipped[50] ^= std::byte{1};
  EXPECT_EQ(reason_of(parse(flipped)), Reason::bad_header);  // header checksum
}

TEST(ShardHeader, FileNamesAreSafeAndDistinct) {
  const std::string weird = "../../etc/passwd\\..x";
  const auto a = ck::shard_file_name(weird, ck::FlatRange{0, 4});
  EXPECT_TRUE(ck::is_safe_file_name(a)) << a;
  EXPECT_EQ(a.find(".."), std::string::npos);
  EXPECT_NE(ck::shard_file_name("a/b", ck::FlatRange{0, 4}),
            ck::shard_file_name("a_b", ck::FlatRange{0, 4}));
  const ck::Box big{std::vector<std::uint64_t>(16, 1ull << 50), std::vector<std::uint64_t>(16, 1)};
  EXPECT_TRUE(ck::is_safe_file_name(ck::shard_file_name(std::string(5000, 'x'), big)));
  for (const char* bad : {"", ".hidden", "a/b", "..", "a\\b", "x y"})
    EXPECT_FALSE(ck::is_safe_file_name(bad)) << bad;
}

ck::Manifest sample_manifest() {
  ck::Manifest m;
  m.format_version = ck::kFormatVersion;
  m.world_size = 2;
  m.state = run_state(3);
  m.rank_states = {{{"rng", 1}}, {{"rng", 2}}};
  ck::TensorRecord t{"param/w", comm::DType::f32, {4, 5}, {}};
  t.shards.push_back(
      {ck::shard_file_name("param/w", ck::FlatRange{0, 12}), 0, ck::FlatRange{0, 12}, 48, 1});
  t.shards.push_back(
      {ck::shard_file_name("param/w", ck::FlatRange{12, 8}), 1, ck::FlatRange{12, 8}, 32, 2});
  m.tensors.push_back(t);
  m.tensors.push_back({"empty", comm::DType::i64, {0, 3}, {}});
  m.tensors.push_back({"scalar", comm::DType::f64, {}, {{"s.shard", 0, ck::Box{}, 8, 3}}});
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return m;
}

TEST(Manifest, RoundTrips) {
  const auto m = sample_manifest();
  const auto back = ck::parse_manifest(ck::dump_manifest(m));
  EXPECT_EQ(ck::dump_manifest(back), ck::dump_manifest(m));
  EXPECT_EQ(back.state.data_cursor, m.state.data_cursor);
  EXPECT_EQ(back.rank_states[1]["rng"], 2);
  ASSERT_NE(ck::find_tensor(back, "param/w"), nullptr);
  EXPECT_EQ(ck::find_tensor(back, "param/w")->shards[1].slice, ck::Slice(ck::FlatRange{12, 8}));
}

// A manifest whose JSON tree would not fit is refused by a streaming estimate before the tree is
// built: tiny values cost the tree up to 20x their text, so the byte limit alone is not enough.
TEST(Manifest, ATreeTooLargeForMemoryIsRefusedBeforeItIsBuilt) {
  const std::string text = ck::dump_manifest(sample_manifest());
  const auto tree = ck::json_tree_bytes(text);
  ASSERT_TRUE(tree.has_value());
  EXPECT_GT(*tree, text.size());
  EXPECT_LT(*tree, 40 * text.size());
  EXPECT_NO_THROW(ck::parse_manifest(text, *tree));
  try {
    ck::parse_manifest(text, *tree - 1);
    ADD_FAILURE() << "a manifest over the tree budget was parsed";
  } catch (const ck::RestoreError& e) {
    EXPECT_EQ(e.reason(), Reason::bad_manifest);
    EXPECT_NE(std::string(e.what()).find("JSON tree"), std::string::npos) << e.what();
  }
  // 1 MiB of `[{},{},...]`: ~20 MiB of tree, refused against a 16 MiB budget.
  std::string many = "[";
  for (int i = 0; i < (1 << 19) - 1; ++i) many += "{},";
  many += "{}]";
  EXPECT_GT(*ck::json_tree_bytes(many), 16 * many.size());
  try {
    ck::parse_manifest(many, std::uint64_t{16} << 20);
    ADD_FAILURE() << "parsed";
  } catch (const ck::RestoreError& e) {
    EXPECT_NE(std::string(e.what()).find("JSON tree"), std::string::npos) << e.what();
  }
  // Invalid or too deep text has no estimate; the parser then names what is wrong.
  EXPECT_FALSE(ck::json_tree_bytes("{").has_value());
  EXPECT_FALSE(ck::json_tree_bytes(std::string(100000, '[')).has_value());
}

// A manifest listing 400 000 tensors (one flat shard each, ~100 MiB of text) is refused by count
// while it is streamed: before the tree or any record is built, in well under a second, naming the
// limit. The largest real models list far fewer (kMaxManifestTensors).
TEST(Manifest, FourHundredThousandTensorsAreRefusedByCountWhileStreamed) {
  auto j = nlohmann::json::parse(ck::dump_manifest(sample_manifest()));
  j["tensors"] = "@";
  const std::string outer = j.dump();
  const std::size_t at = outer.find("\"@\"");
  ASSERT_NE(at, std::string::npos);
  std::string text = outer.substr(0, at) + "[";
  for (int i = 0; i < 400000; ++i) {
    const std::string name = "param/t" + std::to_string(i);
    text += (i ? ",{\"name\":\"" : "{\"name\":\"") + name +
            "\",\"dtype\":\"f32\",\"shape\":[4],\"shards\":[{\"file\":\"" +
            ck::shard_file_name(name, ck::FlatRange{0, 4}) +
            "\",\"rank\":0,\"slice\":{\"flat\":{\"begin\":0,\"count\":4}},\"bytes\":16,"
            "\"xxh3\":\"0000000000000001\"}]}";
  }
  text += "]" + outer.substr(at + 3);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ck::parse_manifest(text);
    ADD_FAILURE() << "a manifest of 400000 tensors was accepted";
  } catch (const ck::RestoreError& e) {
    EXPECT_EQ(e.reason(), Reason::bad_manifest);
    EXPECT_NE(std::string(e.what()).find("$.tensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(ck::kMaxManifestTensors)),
              std::string::npos)
        << e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0) << "refused after " << s << " s";
}

// The writer's commit round-trips; a manifest from before it was recorded reads as "unknown", and a
// commit that is not a string is refused.
TEST(Manifest, CodeCommitRoundTripsAndIsOptional) {
  auto m = sample_manifest();
  m.state.code_commit = "0123456789abcdef0123456789abcdef01234567";
  auto j = nlohmann::json::parse(ck::dump_manifest(m));
  EXPECT_EQ(ck::parse_manifest(j.dump()).state.code_commit, m.state.code_commit);
  j.erase("code_commit");
  EXPECT_EQ(ck::parse_manifest(j.dump()).state.code_commit, "unknown");
  j["code_commit"] = 7;
  EXPECT_EQ(reason_of([&] { ck::parse_manifest(j.dump()); }), Reason::bad_manifest);
}

Reason manifest_reason(const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(ck::dump_manifest(sample_manifest()));
  edit(j);
  return reason_of([&] { ck::parse_manifest(j.dump()); });
}

TEST(Manifest, RefusesSchemaViolations) {
  EXPECT_EQ(reason_of([] { ck::parse_manifest("{"); }), Reason::bad_manifest);
  EXPECT_EQ(reason_of([] { ck::parse_manifest(std::string(100000, '[')); }), Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j["surprise"] = 1; }), Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j.erase("step"); }), Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j["step"] = -1; }), Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j["step"] = 1.5; }), Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j["format_version"] = 2; }), Reason::version_mismatch);
  EXPECT_EQ(manifest_reason([](auto& j) { j["ranks"].erase(1); }), Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j["tensors"][1]["dtype"] = "f8"; }),
            Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j["tensors"][1]["shards"][0]["xxh3"] = "XYZ"; }),
            Reason::bad_manifest);
  EXPECT_EQ(manifest_reason([](auto& j) { j["tensors"][1]["shards"][0]["rank"] = 2; }),
            Reason::bad_manifest);
}

TEST(Manifest, RefusesUnsafePaths) {
  for (const char* f : {"../x.shard", "/etc/passwd", "a/b.shard", "..", ".hidden", "a\\b"})
    EXPECT_EQ(manifest_reason([&](auto& j) { j["tensors"][1]["shards"][0]["file"] = f; }),
              Reason::unsafe_path)
        << f;
}

TEST(Manifest, RefusesBadLayouts) {
  // tensors sorted: empty, param/w, scalar
  EXPECT_EQ(manifest_reason([](auto& j) { j["tensors"][1]["shards"].erase(1); }),
            Reason::incomplete_coverage);
  EXPECT_EQ(manifest_reason([](auto& j) {
              j["tensors"][1]["shards"][1]["slice"]["flat"]["begin"] = 11;
              j["tensors"][1]["shards"][1]["slice"]["flat"]["count"] = 9;
              j["tensors"][1]["shards"][1]["bytes"] = 36;
            }),
            Reason::overlapping_shards);
  EXPECT_EQ(manifest_reason([](auto& j) {
              j["tensors"][1]["shards"][1]["file"] = j["tensors"][1]["shards"][0]["file"];
            }),
            Reason::duplicate_shard);
  EXPECT_EQ(manifest_reason([](auto& j) { j["tensors"][1]["shards"][1]["bytes"] = 33; }),
            Reason::bad_tensor);
  EXPECT_EQ(
      manifest_reason([](auto& j) { j["tensors"][1]["shards"][1]["slice"]["flat"]["count"] = 9; }),
      Reason::out_of_bounds);
  EXPECT_EQ(manifest_reason([](auto& j) { j["tensors"][2]["name"] = "param/w"; }),
            Reason::bad_tensor);
  EXPECT_EQ(manifest_reason([](auto& j) {
              j["tensors"][1]["shape"] = {1ull << 40, 1ull << 40};
            }),
            Reason::bad_tensor);
}

}  // namespace
}  // namespace shardcheck::testing
