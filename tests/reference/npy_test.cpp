// The .npy writer and the dump directory: header bytes as NumPy 1.0 defines them, data read back,
// and index.json listing every tensor the trainer observed.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "reference/npy.hpp"
#include "reference/trainer.hpp"
#include "tests/reference/test_util.hpp"

namespace shardcheck::ref {
namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::string out(static_cast<size_t>(std::filesystem::file_size(p)), '\0');
  f.read(out.data(), static_cast<std::streamsize>(out.size()));
  return out;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("shardcheck_ref_" + name + "_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::remove_all(d);
  return d;
}

TEST(Npy, HeaderIsVersion1AlignedTo64) {
  for (const Shape& shape : {Shape{}, Shape{7}, Shape{2, 3}, Shape{4, 5, 6}}) {
    const std::string h = npy_header("<f8", shape);
    ASSERT_EQ(h.size() % 64, 0u);
    EXPECT_EQ(h.substr(0, 6), "\x93NUMPY");
    EXPECT_EQ(h[6], '\x01');
    EXPECT_EQ(h[7], '\x00');
    const size_t len =
        static_cast<uint8_t>(h[8]) | (static_cast<size_t>(static_cast<uint8_t>(h[9])) << 8);
    EXPECT_EQ(len + 10, h.size());
    EXPECT_EQ(h.back(), '\n');
  }
  EXPECT_NE(
      npy_header("<f4", {2, 3}).find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"),
      std::string::npos);
  EXPECT_NE(npy_header("<i4", {7}).find("'shape': (7,), }"), std::string::npos);
  EXPECT_NE(npy_header("<i8", {}).find("'shape': (), }"), std::string::npos);
}

TEST(Npy, WritesLittleEndianCOrderData) {
  const auto dir = temp_dir("npy");
  std::filesystem::create_directories(dir);
  const HostArray a{{2, 2}, std::vector<double>{1.5, -2.0, 3.25, 4.0}};
  write_npy(dir / "a.npy", a);
  const std::string bytes = read_all(dir / "a.npy");
  const std::string h = npy_header("<f8", {2, 2});
  ASSERT_EQ(bytes.size(), h.size() + 4 * sizeof(double));
  EXPECT_EQ(bytes.substr(0, h.size()), h);
  double back[4];
  std::memcpy(back, bytes.data() + h.size(), sizeof(back));
  EXPECT_EQ(back[2], 3.25);
  const HostArray b{{3}, std::vector<int32_t>{1, 256, -1}};
  write_npy(dir / "b.npy", b);
  const std::string bb = read_all(dir / "b.npy");
  const size_t data_at = npy_header("<i4", {3}).size();
  ASSERT_EQ(bb.size(), data_at + 12);
  EXPECT_EQ(static_cast<uint8_t>(bb[data_at + 4]), 0u);  // 256 little-endian: 00 01 00 00
  EXPECT_EQ(static_cast<uint8_t>(bb[data_at + 5]), 1u);
  std::filesystem::remove_all(dir);
}

TEST(Dump, TrainerWritesEveryContractedTensorAndAnIndex) {
  ModelConfig cfg = test::tiny_dense();
  cfg.tie_embeddings = false;
  TrainConfig train;
  train.steps = 2;
  train.global_batch = 2;
  train.micro_batch = 1;
  const Batch batch = test::tiny_batch(cfg, 2);
  const auto dir = temp_dir("dump");
  train_and_dump(
      cfg, train, 1, [&](int) { return batch; }, dir.string());
  for (const char* f :
       {"init__param__embed.weight.npy", "init__param__lm_head.weight.npy", "batch__0__tokens.npy",
        "batch__1__positions.npy", "batch__1__doc_ids.npy", "batch__0__loss_mask.npy",
        "batch__0__targets.npy", "step1__loss.npy", "step2__grad__layers.1.attn.wq.npy",
        "step2__param__final_norm.weight.npy", "index.json"})
    EXPECT_TRUE(std::filesystem::exists(dir / f)) << f;
  const std::string index = read_all(dir / "index.json");
  EXPECT_NE(
      index.find(
          "{\"name\": \"step1/grad/layers.0.mlp.w_up\", \"file\": "
          "\"step1__grad__layers.0.mlp.w_up.npy\", \"shape\": [16, 32], \"dtype\": \"float64\"}"),
      std::string::npos);
  EXPECT_NE(
      index.find(
          "\"name\": \"batch/0/tokens\", \"file\": \"batch__0__tokens.npy\", \"shape\": [1, 12], "
          "\"dtype\": \"int32\""),
      std::string::npos);
  EXPECT_NE(index.find("\"name\": \"step2/loss\", \"file\": \"step2__loss.npy\", \"shape\": [], "),
            std::string::npos);
  EXPECT_EQ(index.front(), '[');
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardcheck::ref
