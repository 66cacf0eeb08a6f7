// Writes and deletions stay inside the directory the user named (files/dir.hpp): a symlink at any
// level below it is refused or removed as a link, never followed; no name leaves it. The
// checkpoint writer on top of it: a symlinked step, temporary or lock is refused and its target
// untouched; retention deletes only what a checkpoint's own manifest lists and leaves (and names)
// anything else it finds.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <string>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/lock.hpp"
#include "files/dir.hpp"
#include "tests/checkpoint/support.hpp"

namespace {

using namespace shardcheck::testing;
namespace files = shardcheck::files;

void put(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

std::string get(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(Confined, SubRefusesASymlinkAtEveryLevelAndNamesThatLeaveIt) {
  TempDir tmp, elsewhere;
  fs::create_directories(tmp.path() / "a");
  fs::create_symlink(elsewhere.path(), tmp.path() / "a" / "link");
  const files::Dir root = files::Dir::open(tmp.path(), false);
  EXPECT_NO_THROW((void)root.sub("a", false));
  for (const char* rel : {"a/link", "a/link/b", "../x", "a/../../x"}) {
    try {
      (void)root.sub(rel, true);
      ADD_FAILURE() << rel << " was opened";
    } catch (const files::Error& e) {
      EXPECT_NE(std::string(e.what()).find("refusing"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::is_empty(elsewhere.path()));  // nothing made through the link
  EXPECT_THROW((void)root.sub("/tmp", true), files::Error);
}

TEST(Confined, WriteFileRefusesALinkAndRemoveTreeRemovesLinksNotTargets) {
  TempDir tmp, elsewhere;
  put(elsewhere.path() / "victim", "keep");
  fs::create_symlink(elsewhere.path() / "victim", tmp.path() / "out.json");
  const files::Dir root = files::Dir::open(tmp.path(), false);
  EXPECT_THROW(root.write_file("out.json", "new"), files::Error);
  EXPECT_EQ(get(elsewhere.path() / "victim"), "keep");
  root.write_file("fresh.json", "text");
  EXPECT_EQ(get(tmp.path() / "fresh.json"), "text");

  fs::create_directories(tmp.path() / "tree" / "deep");
  fs::create_symlink(elsewhere.path(), tmp.path() / "tree" / "deep" / "dirlink");
  fs::create_symlink(elsewhere.path() / "victim", tmp.path() / "tree" / "filelink");
  root.remove_tree("tree");
  EXPECT_FALSE(fs::exists(tmp.path() / "tree"));
  EXPECT_EQ(get(elsewhere.path() / "victim"), "keep");
}

TEST(Confined, ALockFileThatIsASymlinkIsRefused) {
  TempDir tmp, elsewhere;
  put(elsewhere.path() / "victim", "keep");
  fs::create_symlink(elsewhere.path() / "victim", tmp.path() / ".lock");
  EXPECT_THROW(ck::DirLock lock(tmp.path()), ck::CheckpointError);
  EXPECT_EQ(get(elsewhere.path() / "victim"), "keep");
}

// step-N or step-N.tmp planted as a link to another directory: the save is refused (or the link
// removed as a link), and the other directory keeps every file.
TEST(Confined, ASaveNeverWritesThroughASymlinkedStepDirectory) {
  const auto tensors = synthetic_state();
  for (const char* planted : {"step-1", "step-1.tmp"}) {
    TempDir tmp, elsewhere;
    put(elsewhere.path() / "SUCCESS", "theirs");
    put(elsewhere.path() / "data", "theirs");
    fs::create_symlink(elsewhere.path(), tmp.path() / planted);
    try {
      save_sharded(tmp.path(), 1, tensors, zero_sharding(tensors, 2), {.keep = 1});
    } catch (const std::exception& e) {  // the world rethrows rank 0's refusal
      EXPECT_NE(std::string(e.what()).find("step-1"), std::string::npos) << planted << ": "
                                                                        << e.what();
    }
    EXPECT_EQ(get(elsewhere.path() / "SUCCESS"), "theirs") << planted;
    EXPECT_EQ(get(elsewhere.path() / "data"), "theirs") << planted;
    EXPECT_EQ(std::distance(fs::directory_iterator(elsewhere.path()), fs::directory_iterator{}), 2)
        << planted;
  }
}

// Retention removes a checkpoint by its manifest: a file it did not write stays, with the
// directory, and the warning names it; a step directory that is a link to a committed checkpoint
// elsewhere is not this directory's checkpoint and is never touched.
TEST(Confined, RetentionDeletesOnlyWhatTheManifestListsAndNeverFollowsALink) {
  TempDir tmp, elsewhere;
  const auto tensors = synthetic_state();
  save_sharded(elsewhere.path(), 1, tensors, zero_sharding(tensors, 2));
  fs::create_symlink(elsewhere.path() / "step-1", tmp.path() / "step-1");
  save_sharded(tmp.path(), 2, tensors, zero_sharding(tensors, 2));
  put(tmp.path() / "step-2" / "notes.txt", "mine, not the checkpoint's");
  const auto r = save_sharded(tmp.path(), 3, tensors, zero_sharding(tensors, 2), {.keep = 1});
  EXPECT_TRUE(r.removed.empty());
  EXPECT_NE(r.retention_warning.find("notes.txt"), std::string::npos) << r.retention_warning;
  EXPECT_EQ(get(tmp.path() / "step-2.deleting" / "notes.txt"), "mine, not the checkpoint's");
  EXPECT_FALSE(fs::exists(tmp.path() / "step-2.deleting" / "manifest.json"));
  EXPECT_TRUE(fs::is_symlink(tmp.path() / "step-1"));
  EXPECT_TRUE(ck::Checkpoint::open(elsewhere.path() / "step-1").manifest().tensors.size() > 0);
}

}  // namespace
