// save() on sim::SimWorld and restore: the on-disk result of a commit, bitwise restores across
// world sizes, retention, storm knobs, refusals that every rank agrees on, collective open.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <functional>

#include "tests/checkpoint/support.hpp"

namespace shardcheck::testing {
namespace {

using ck::Reason;

// Runs a save that must fail; returns the reason, after checking every rank threw SaveError.
Reason failed_save(const fs::path& dir, std::uint64_t step, const std::vector<FullTensor>& tensors,
                   const Sharding& sh, const ck::SaveOptions& opts = {}) {
  const int n = static_cast<int>(sh.by_rank.size());
  const bool existed = fs::exists(dir / ck::step_dir_name(step));
  sim::SimWorld world(n);
  std::vector<std::optional<Reason>> reasons(static_cast<std::size_t>(n));
  EXPECT_THROW(world.run([&](comm::Communicator& c) {
    std::vector<std::vector<std::byte>> storage;
    ck::SaveRequest req{
        dir,
        run_state(step),
        {},
        pieces_for(tensors, sh.by_rank[static_cast<std::size_t>(c.rank())], storage)};
    try {
      ck::save(c, req, opts);
    } catch (const ck::SaveError& e) {
      reasons[static_cast<std::size_t>(c.rank())] = e.reason();
      throw;
    }
  }),
               sim::RankFailure);
  for (int r = 1; r < n; ++r) EXPECT_EQ(reasons[static_cast<std::size_t>(r)], reasons[0]) << r;
  EXPECT_EQ(fs::exists(dir / ck::step_dir_name(step)), existed);  // nothing committed
  return reasons[0].value_or(Reason::io_error);
}

class SaveRestore : public ::testing::TestWithParam<int> {};

TEST_P(SaveRestore, CommitsAndRestoresBitwise) {
  const int n = GetParam();
  TempDir tmp;
  const auto tensors = synthetic_state();
  const auto res =
      save_sharded(tmp.path(), 5, tensors, zero_sharding(tensors, static_cast<std::size_t>(n)));
  EXPECT_EQ(res.path, tmp.path() / "step-5");
  EXPECT_TRUE(fs::is_regular_file(res.path / "SUCCESS"));
  EXPECT_TRUE(fs::is_regular_file(res.path / "manifest.json"));
  EXPECT_FALSE(fs::exists(tmp.path() / "step-5.tmp"));
  EXPECT_GT(res.blocked_s, 0.0);
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  EXPECT_EQ(res.total_bytes, total);

  const auto c = ck::Checkpoint::open(res.path);
  expect_restores_exactly(c, tensors);
  const auto& m = c.manifest();
  EXPECT_EQ(m.world_size, static_cast<std::uint64_t>(n));
  EXPECT_EQ(m.state.step, 5u);
  EXPECT_EQ(m.state.consumed_tokens, 5u * 128);
  EXPECT_EQ(m.state.data_cursor["offset"], 40);
  EXPECT_EQ(m.state.order, "tp-cp-ep-dp-pp");
  ASSERT_EQ(m.rank_states.size(), static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(m.rank_states[static_cast<std::size_t>(r)]["rng"]["rank"], r);
  EXPECT_EQ(ck::latest_committed(tmp.path()), res.path);
  EXPECT_EQ(ck::open_latest(tmp.path()).path(), res.path);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SaveRestore, ::testing::Values(1, 2, 3, 4, 7, 8));

TEST(SaveRestore, ZeroSizeTensorsAreRecordedFromDeclarations) {
  TempDir tmp;
  std::vector<FullTensor> tensors{make_tensor("empty", comm::DType::f32, {0, 4}, 1),
                                  make_tensor("w", comm::DType::f32, {3}, 2)};
  const auto res = save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 2));
  const auto c = ck::Checkpoint::open(res.path);
  EXPECT_TRUE(c.tensor("empty").shards.empty());
  expect_restores_exactly(c, tensors);
}

TEST(SaveRestore, RetentionKeepsTheNewestAfterCommit) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  fs::create_directories(tmp.path() / "step-0.tmp");  // a crash leftover: removed once stale
  std::vector<fs::path> removed;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    const auto r = save_sharded(tmp.path(), step, tensors, zero_sharding(tensors, 2), {.keep = 2});
    removed.insert(removed.end(), r.removed.begin(), r.removed.end());
  }
  std::vector<std::uint64_t> left;
  for (const auto& s : ck::list_steps(tmp.path())) left.push_back(s.step);
  EXPECT_EQ(left, (std::vector<std::uint64_t>{3, 4}));
  EXPECT_FALSE(fs::exists(tmp.path() / "step-0.tmp"));
  EXPECT_EQ(removed.size(), 3u);  // step-0.tmp, step-1, step-2
}

// A kill during retention leaves step-M.deleting (renamed, no longer a checkpoint); the next
// save finishes the deletion. A step without a marker is not a retention victim: never touched.
TEST(SaveRestore, AnInterruptedRetentionIsFinishedByTheNextSave) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 2), {.keep = 1});
  fs::rename(tmp.path() / "step-1", tmp.path() / "step-1.deleting");  // the kill, mid-retention
  EXPECT_TRUE(ck::list_steps(tmp.path()).empty());
  const auto r = save_sharded(tmp.path(), 2, tensors, zero_sharding(tensors, 2), {.keep = 1});
  EXPECT_FALSE(fs::exists(tmp.path() / "step-1.deleting"));
  ASSERT_EQ(r.removed.size(), 1u);
  EXPECT_EQ(r.removed[0].filename(), "step-1.deleting");
  save_sharded(tmp.path(), 3, tensors, zero_sharding(tensors, 2), {.keep = 1});
  EXPECT_FALSE(fs::exists(tmp.path() / "step-2"));  // retention itself leaves nothing behind
  EXPECT_FALSE(fs::exists(tmp.path() / "step-2.deleting"));
}

// The commit re-checks step-N.tmp/ against the ranks' reports before the marker: a file that
// another writer replaced, removed or added is refused (changed_during_save), nothing commits.
TEST(SaveRestore, TheCommitRefusesATemporaryDirectoryThatChanged) {
  const auto tensors = synthetic_state();
  const Sharding sh = zero_sharding(tensors, 2);
  using Tamper = std::function<void(const fs::path&)>;
  const auto first_shard = [](const fs::path& tmp) {
    for (const auto& e : fs::directory_iterator(tmp))
      if (e.path().extension() == ".shard") return e.path();
    return fs::path();
  };
  const Tamper tampers[] = {
      [&](const fs::path& tmp) { fs::remove(first_shard(tmp)); },
      [&](const fs::path& tmp) { std::ofstream(first_shard(tmp), std::ios::app) << "x"; },
      [&](const fs::path& tmp) { std::ofstream(tmp / "other-run.r0.shard") << "y"; },
  };
  for (const Tamper& tamper : tampers) {
    TempDir tmp;
    ck::SaveOptions o;
    o.on_stage = [&](ck::SaveStage st, int) {
      if (st == ck::SaveStage::manifest_written) tamper(tmp.path() / "step-1.tmp");
    };
    EXPECT_EQ(failed_save(tmp.path(), 1, tensors, sh, o), Reason::changed_during_save);
    EXPECT_FALSE(fs::exists(tmp.path() / "step-1.tmp" / "SUCCESS"));
  }
}

// One writer per directory: a second lock is refused at once naming the holder; the lock is
// free again once its holder is gone.
TEST(SaveRestore, ASecondWriterOfADirectoryIsRefusedNamingTheHolder) {
  TempDir tmp;
  {
    const ck::DirLock held(tmp.path());
    try {
      const ck::DirLock second(tmp.path());
      ADD_FAILURE() << "a second lock was granted";
    } catch (const ck::CheckpointError& e) {
      EXPECT_EQ(e.reason(), Reason::locked);
      EXPECT_NE(std::string(e.what()).find("pid " + std::to_string(::getpid())), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(const ck::DirLock again(tmp.path()));
}

TEST(SaveRestore, StormKnobsStaggerAndThrottle) {
  TempDir tmp;
  std::vector<FullTensor> tensors{make_tensor("big", comm::DType::f32, {4, 16384}, 3)};
  const auto sh = zero_sharding(tensors, 4);  // 64 KiB of payload per rank
  const double rate = 2.0 * (1 << 20);
  const auto r = save_sharded(tmp.path(), 1, tensors, sh,
                              {.max_concurrent_writers = 1, .max_bytes_per_second = rate});
  EXPECT_GE(r.write_s, 0.9 * static_cast<double>(r.rank_bytes) / rate);
  // One writer at a time: rank 0 waits for the three other waves before it can report.
  EXPECT_GE(r.blocked_s, 0.9 * 4 * static_cast<double>(r.rank_bytes) / rate);
  expect_restores_exactly(ck::Checkpoint::open(r.path), tensors);
}

TEST(SaveRestore, RefusesBadLayoutsOnEveryRank) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  auto sh = zero_sharding(tensors, 3);
  // Overlap: rank 1 also saves rank 0's chunk of tensor 0.
  auto overlap = sh;
  overlap.by_rank[1].push_back(sh.by_rank[0][0]);
  EXPECT_EQ(failed_save(tmp.path(), 1, tensors, overlap), Reason::overlapping_shards);
  // Gap: rank 2 forgets its chunk of tensor 1.
  auto gap = sh;
  gap.by_rank[2].erase(gap.by_rank[2].begin() + 1);
  EXPECT_EQ(failed_save(tmp.path(), 1, tensors, gap), Reason::incomplete_coverage);
  // Expected layout: an extra tensor, and a missing one.
  std::vector<ck::TensorSpec> expected;
  for (const auto& t : tensors) expected.push_back({t.name, t.dtype, t.shape});
  auto fewer = expected;
  fewer.pop_back();
  EXPECT_EQ(failed_save(tmp.path(), 1, tensors, sh, {.expected = fewer}),
            Reason::unexpected_tensor);
  auto more = expected;
  more.push_back({"param/missing", comm::DType::f32, {3}});
  EXPECT_EQ(failed_save(tmp.path(), 1, tensors, sh, {.expected = more}),
            Reason::incomplete_coverage);
  // Ranks disagreeing on a logical shape.
  auto other = tensors;
  other[0].shape = {6, 10};
  Sharding mixed = sh;
  std::vector<FullTensor> both = tensors;
  both.push_back(other[0]);
  mixed.by_rank[1][0].first = both.size() - 1;
  EXPECT_EQ(failed_save(tmp.path(), 1, both, mixed), Reason::bad_tensor);
  // The good save still works afterwards, and a second save of the same step is refused.
  EXPECT_NO_THROW(save_sharded(tmp.path(), 1, tensors, sh, {.expected = expected}));
  EXPECT_EQ(failed_save(tmp.path(), 1, tensors, sh), Reason::already_committed);
  EXPECT_TRUE(fs::exists(tmp.path() / "step-1" / "SUCCESS"));
}

TEST(SaveRestore, PieceOfWrongSizeFailsTheRank) {
  TempDir tmp;
  sim::SimWorld world(2);
  std::vector<float> data(7);
  std::vector<std::optional<ck::SaveError>> errors(2);
  EXPECT_THROW(world.run([&](comm::Communicator& c) {
    ck::SaveRequest req{tmp.path(), run_state(1), {}, {}};
    req.pieces.push_back({"w",
                          {10},
                          comm::DType::f32,
                          ck::FlatRange{c.rank() * 5u, 5},
                          std::as_bytes(std::span(data).first(c.rank() == 1 ? 7 : 5))});
    try {
      ck::save(c, req);
    } catch (const ck::SaveError& e) {
      errors[static_cast<std::size_t>(c.rank())] = e;
      throw;
    }
  }),
               sim::RankFailure);
  ASSERT_TRUE(errors[0]);
  EXPECT_EQ(errors[0]->reason(), Reason::rank_failed);
  EXPECT_NE(std::string(errors[0]->what()).find("rank 1"), std::string::npos) << errors[0]->what();
}

TEST(SaveRestore, CollectiveOpenAgreesOnEveryRank) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  const auto res = save_sharded(tmp.path(), 2, tensors, zero_sharding(tensors, 4));
  sim::SimWorld world(3);
  world.run([&](comm::Communicator& c) {
    const auto ckpt = ck::Checkpoint::open_collective(c, res.path);
    expect_restores_exactly(ckpt, tensors);
  });
  const auto damage = ck::drill::flip_payload_byte(res.path, 5, 3);
  std::vector<std::string> named(3);
  EXPECT_THROW(world.run([&](comm::Communicator& c) {
    try {
      ck::Checkpoint::open_collective(c, res.path);
    } catch (const ck::RestoreError& e) {
      EXPECT_EQ(e.reason(), Reason::checksum_mismatch) << e.what();
      named[static_cast<std::size_t>(c.rank())] = e.file();
      throw;
    }
  }),
               sim::RankFailure);
  for (const auto& f : named) EXPECT_EQ(f, damage.file);
}

TEST(SaveRestore, ReadsRefuseBadRequests) {
  TempDir tmp;
  const auto tensors = synthetic_state();
  const auto c =
      ck::Checkpoint::open(save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 2)).path);
  EXPECT_THROW(c.read("nope", ck::FlatRange{0, 1}), ck::RestoreError);
  EXPECT_THROW(c.read("param/embed.weight", ck::FlatRange{55, 6}), ck::RestoreError);
  std::vector<std::byte> small(3);
  EXPECT_THROW(c.read("param/embed.weight", ck::FlatRange{0, 1}, small), ck::RestoreError);
  EXPECT_EQ(c.read_flat("param/embed.weight", 7, 11), extract(tensors[1], ck::FlatRange{7, 11}));
}

// A save of more tensors than a manifest may list is refused before anything commits: the reader
// would refuse it, so it could never be restored. Zero-size tensors: declared, no shard files.
TEST(SaveRestore, MoreTensorsThanTheReaderAcceptsAreNeverCommitted) {
  TempDir tmp;
  std::vector<ck::ShardPiece> pieces(static_cast<std::size_t>(ck::kMaxManifestTensors) + 1);
  for (std::size_t i = 0; i < pieces.size(); ++i)
    pieces[i] = {"t/" + std::to_string(i), {0}, comm::DType::f32, ck::FlatRange{0, 0}, {}};
  sim::SimWorld world(1);
  EXPECT_THROW(world.run([&](comm::Communicator& c) {
    try {
      ck::save(c, ck::SaveRequest{tmp.path(), run_state(1), {}, pieces});
    } catch (const ck::SaveError& e) {
      EXPECT_NE(e.detail().find("more than a manifest may list"), std::string::npos) << e.what();
      throw;
    }
  }),
               sim::RankFailure);
  EXPECT_TRUE(ck::list_steps(tmp.path()).empty());
}

}  // namespace
}  // namespace shardcheck::testing
