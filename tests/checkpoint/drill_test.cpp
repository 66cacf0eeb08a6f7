// Fault drills on synthetic checkpoints: every kind of damage is refused with the right reason and
// the damaged shard named, open_latest names the previous good checkpoint, a crash before commit
// leaves an ignored step-N.tmp, and undamaged checkpoints restore bitwise.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/checkpoint/support.hpp"

namespace shardcheck::testing {
namespace {

using ck::Reason;
namespace drill = ck::drill;

// Two layouts the drills run on: ZeRO flat shards over 4 ranks, TP-style column boxes over 2.
Sharding layout(const std::vector<FullTensor>& tensors, bool tp) {
  if (!tp) return zero_sharding(tensors, 4);
  std::vector<std::vector<ck::Slice>> slices;
  for (const auto& t : tensors)
    slices.push_back(t.shape.empty() ? std::vector<ck::Slice>{ck::full_box(t.shape)}
                                     : box_split(t.shape, t.shape.size() - 1, 2));
  return assign(slices, 2);
}

struct Drill {
  const char* name;
  std::function<drill::Damage(const fs::path&)> damage;
};

const Drill kDrills[] = {
    {"missing_shard", [](const fs::path& d) { return drill::remove_shard(d, 3); }},
    {"corrupt_shard", [](const fs::path& d) { return drill::flip_payload_byte(d, 2, 5); }},
    {"truncated_shard", [](const fs::path& d) { return drill::truncate_shard(d, 4); }},
    {"stale_marker", [](const fs::path& d) { return drill::replace_with_stale_shard(d, 1); }},
};

class Drills : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Drills, DamagedCheckpointIsRefusedNamingTheShard) {
  const auto& [which, tp] = GetParam();
  const Drill& d = kDrills[which];
  TempDir tmp;
  const auto old_state = synthetic_state(1), state = synthetic_state(2);
  save_sharded(tmp.path(), 1, old_state, layout(old_state, tp));
  const auto res = save_sharded(tmp.path(), 2, state, layout(state, tp));
  const drill::Damage dmg = d.damage(res.path);
  SCOPED_TRACE(std::string(d.name) + ": " + dmg.what);
  try {
    ck::Checkpoint::open(res.path);
    FAIL() << "damaged checkpoint opened";
  } catch (const ck::RestoreError& e) {
    EXPECT_EQ(e.reason(), dmg.expect) << e.what();
    EXPECT_EQ(e.file(), dmg.file) << e.what();
    EXPECT_EQ(e.tensor(), dmg.tensor) << e.what();
    EXPECT_NE(std::string(e.what()).find(dmg.file), std::string::npos);
  }
  // The newest committed checkpoint is bad: refused, never skipped, the previous one suggested.
  try {
    ck::open_latest(tmp.path());
    FAIL() << "open_latest skipped or accepted a bad checkpoint";
  } catch (const ck::RestoreError& e) {
    EXPECT_EQ(e.reason(), dmg.expect);
    EXPECT_EQ(e.file(), dmg.file);
    EXPECT_EQ(e.previous_good(), (tmp.path() / "step-1").string());
    EXPECT_NE(std::string(e.what()).find("step-1"), std::string::npos) << e.what();
  }
  // The previous good one restores exactly.
  expect_restores_exactly(ck::Checkpoint::open(tmp.path() / "step-1"), old_state);
}

INSTANTIATE_TEST_SUITE_P(All, Drills, ::testing::Combine(::testing::Range(0, 4), ::testing::Bool()),
                         [](const auto& p) {
                           return std::string(kDrills[std::get<0>(p.param)].name) +
                                  (std::get<1>(p.param) ? "_tp" : "_zero");
                         });

TEST(Drills, CrashBeforeCommitLeavesAnIgnoredTmp) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 4));
  try {
    save_sharded(tmp.path(), 2, synthetic_state(9), zero_sharding(tensors, 4),
                 drill::crash_before_commit({}, 2));
    FAIL() << "the crash did not surface";
  } catch (const sim::RankFailure& f) {
    EXPECT_EQ(f.rank(), 2);
    EXPECT_THROW(f.rethrow_cause(), drill::SimulatedCrash);
  }
  EXPECT_TRUE(fs::is_directory(tmp.path() / "step-2.tmp"));
  EXPECT_FALSE(fs::exists(tmp.path() / "step-2.tmp" / "SUCCESS"));
  EXPECT_FALSE(fs::exists(tmp.path() / "step-2"));
  EXPECT_EQ(ck::latest_committed(tmp.path()), tmp.path() / "step-1");
  expect_restores_exactly(ck::open_latest(tmp.path()), tensors);
  // The next save of that step starts over and commits.
  const auto again = save_sharded(tmp.path(), 2, tensors, zero_sharding(tensors, 3));
  EXPECT_FALSE(fs::exists(tmp.path() / "step-2.tmp"));
  expect_restores_exactly(ck::open_latest(tmp.path()), tensors);
}

TEST(Drills, CoordinatorCrashesBeforeRenameNeverCommit) {
  for (auto stage : {ck::SaveStage::manifest_written, ck::SaveStage::marker_written}) {
    TempDir tmp;
    const auto tensors = synthetic_state();
    ck::SaveOptions o;
    o.on_stage = [stage](ck::SaveStage s, int) {
      if (s == stage) throw std::runtime_error("coordinator died");
    };
    EXPECT_THROW(save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 2), o),
                 sim::RankFailure);
    EXPECT_EQ(ck::latest_committed(tmp.path()), std::nullopt);
    try {
      ck::open_latest(tmp.path());
      FAIL();
    } catch (const ck::RestoreError& e) {
      EXPECT_EQ(e.reason(), Reason::no_checkpoint);
    }
  }
}

TEST(Drills, MissingMarkerIsNotACheckpoint) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 2));
  const auto res = save_sharded(tmp.path(), 2, tensors, zero_sharding(tensors, 2));
  const auto dmg = drill::remove_marker(res.path);
  try {
    ck::Checkpoint::open(res.path);
    FAIL();
  } catch (const ck::RestoreError& e) {
    EXPECT_EQ(e.reason(), dmg.expect);
    EXPECT_EQ(e.file(), "SUCCESS");
  }
  EXPECT_EQ(ck::open_latest(tmp.path()).path(), tmp.path() / "step-1");
}

// Damage no drill helper makes, but a reader must still refuse.
TEST(Drills, OtherTamperingIsRefused) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  auto fresh = [&] {
    fs::remove_all(tmp.path() / "step-1");
    return save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 2)).path;
  };
  auto reason = [](const fs::path& p) {
    try {
      ck::Checkpoint::open(p);
    } catch (const ck::RestoreError& e) {
      return e.reason();
    }
    return Reason::io_error;
  };
  auto shards = [](const fs::path& p) {
    std::vector<fs::path> v;
    for (const auto& e : fs::directory_iterator(p))
      if (e.path().extension() == ".shard") v.push_back(e.path());
    std::sort(v.begin(), v.end());
    return v;
  };
  // Bytes appended to a shard.
  auto p = fresh();
  std::ofstream(shards(p)[0], std::ios::app) << "tail";
  EXPECT_EQ(reason(p), Reason::oversized_shard);
  // One shard's file copied over another: its header names another slice.
  p = fresh();
  fs::copy_file(shards(p)[1], shards(p)[0], fs::copy_options::overwrite_existing);
  EXPECT_EQ(reason(p), Reason::header_mismatch);
  // A symlink pointing out of the checkpoint in place of a shard.
  p = fresh();
  const auto victim = shards(p)[0];
  fs::copy_file(victim, tmp.path() / "outside.shard");
  fs::remove(victim);
  fs::create_symlink(tmp.path() / "outside.shard", victim);
  EXPECT_EQ(reason(p), Reason::unsafe_path);
  // manifest.json edited after commit.
  p = fresh();
  std::ofstream(p / "manifest.json", std::ios::app) << " ";
  EXPECT_EQ(reason(p), Reason::bad_marker);
  // A marker of another step.
  p = fresh();
  std::ofstream(p / "SUCCESS", std::ios::trunc)
      << "{\"format\":\"shardcheck-checkpoint\",\"step\":7}";
  EXPECT_EQ(reason(p), Reason::bad_marker);
  // manifest.json gone.
  p = fresh();
  fs::remove(p / "manifest.json");
  EXPECT_EQ(reason(p), Reason::missing_manifest);
}

}  // namespace
}  // namespace shardcheck::testing
