// --force and atomic replacement through the lowbit binary for the writers of the artifact layer: demo-artifact,
// import and quantize write through ArtifactWriter, export through the same StagedDirectory. A destination that is
// not the kind being written is refused and left exactly as it was; an export killed at any point leaves the old
// bundle or the complete new one, never an absent or partial destination, and the next run cleans up.
#include "artifact/artifact_fixture.h"
#include "lowbit/artifact/audio8_bundle.h"
#include "support/replace_check.h"

namespace lowbit::artifact::testing {
namespace {

using lowbit::testing::snapshot;

// A user's directory holding a manifest.json (here a real artifact's, the most convincing stray) among their files.
fs::path user_directory(const fs::path& root, const fs::path& artifact) {
  const fs::path dir = root / "mine";
  fs::create_directories(dir / "sub");
  fs::copy_file(artifact / kManifestName, dir / kManifestName);
  write_text(dir / "notes.txt", "my notes\n");
  write_text(dir / "sub" / "data.bin", "precious");
  return dir;
}

TEST(Force, DirectoryWithAStrayManifestIsRefusedAndUntouched) {
  TempDir tmp;
  write_exportable_artifact(tmp / "art");
  audio8::export_bundle(Artifact::open(tmp / "art"), tmp / "bundle");
  const fs::path mine = user_directory(tmp.path(), tmp / "art");
  const auto before = snapshot(mine);
  const std::string out = mine.string();
  const std::vector<std::vector<std::string>> commands = {
      {"demo-artifact", out, "--force"},
      {"import", (tmp / "bundle").string(), out, "--force"},
      {"export", (tmp / "art").string(), out, "--force"},
  };
  for (const auto& args : commands) {
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.status, 1) << args.front() << ": " << r.err;
    EXPECT_NE(r.err.find("refusing to replace it"), std::string::npos) << args.front() << ": " << r.err;
    EXPECT_TRUE(snapshot(mine) == before) << args.front() << " changed the user's directory";
  }
  // Nothing staged is left beside it.
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_TRUE(e.path().filename() == "art" || e.path().filename() == "bundle" || e.path().filename() == "mine")
        << "left behind: " << e.path();
  // A bundle with a user's file added is no longer only what export wrote: refused as well.
  write_text(tmp / "bundle" / "notes.txt", "mine");
  const auto bundle_before = snapshot(tmp / "bundle");
  EXPECT_EQ(run_cli({"export", (tmp / "art").string(), (tmp / "bundle").string(), "--force"}).status, 1);
  EXPECT_TRUE(snapshot(tmp / "bundle") == bundle_before);
}

TEST(Force, ReplacesWhatTheSameWriterWrote) {
  TempDir tmp;
  write_exportable_artifact(tmp / "a1", 1);
  write_exportable_artifact(tmp / "a2", 2);
  ASSERT_EQ(run_cli({"export", (tmp / "a1").string(), (tmp / "b").string()}).status, 0);
  const auto first = snapshot(tmp / "b");
  ASSERT_EQ(run_cli({"export", (tmp / "a2").string(), (tmp / "b").string(), "--force"}).status, 0);
  EXPECT_TRUE(snapshot(tmp / "b") != first);
  ASSERT_EQ(run_cli({"demo-artifact", (tmp / "d").string()}).status, 0);
  EXPECT_EQ(run_cli({"demo-artifact", (tmp / "d").string(), "--force", "--seed", "5"}).status, 0);
}

TEST(CrashConsistency, ExportKilledAtRandomPointsKeepsTheOldBundleOrWritesTheNewOne) {
  TempDir tmp;
  const fs::path dest = tmp / "bundle";
  // Two sources whose bundles differ; each run exports one of them over the other with --force.
  std::vector<std::map<std::string, std::string>> expected;
  for (int i = 0; i < 2; ++i) {
    write_exportable_artifact(tmp / fmt::format("a{}", i), 100 + i);
    ASSERT_EQ(
        run_cli({"export", (tmp / fmt::format("a{}", i)).string(), (tmp / fmt::format("ref{}", i)).string()}).status,
        0);
    expected.push_back(snapshot(tmp / fmt::format("ref{}", i)));
  }
  ASSERT_TRUE(expected[0] != expected[1]);
  const auto args_for = [&](int run) {
    return std::vector<std::string>{"export", (tmp / fmt::format("a{}", run % 2)).string(), dest.string(), "--force"};
  };
  fs::copy(tmp / "ref1", dest);
  const auto full = lowbit::testing::time_cli(args_for(0));  // ref0 over ref1
  ASSERT_TRUE(snapshot(dest) == expected[0]);
  int old_kept = 0, replaced = 0;
  const int finished = lowbit::testing::kill_at_random_points(24, 20261204, full, args_for, [&](int run) {
    const auto now = snapshot(dest);
    ASSERT_FALSE(now.empty()) << "run " << run << ": the destination is gone";
    const bool is_new = now == expected[run % 2], is_old = now == expected[1 - run % 2];
    EXPECT_TRUE(is_new || is_old) << "run " << run << ": a partial bundle";
    if (is_new) {
      ++replaced;
    } else if (is_old) {
      ++old_kept;
      // Keep the alternation: the next run replaces the other bundle.
      fs::remove_all(dest);
      fs::copy(tmp / fmt::format("ref{}", run % 2), dest);
    }
  });
  ASSERT_EQ(run_cli(args_for(0)).status, 0);  // the next run cleans what the killed ones left
  for (const auto& e : fs::directory_iterator(tmp.path())) {
    const std::string name = e.path().filename().string();
    EXPECT_FALSE(name.starts_with(".")) << "left behind: " << e.path();
  }
  std::cerr << "[crash] export: 24 kills, " << finished << " finished, " << replaced << " replaced, " << old_kept
            << " kept the old bundle\n";
}

}  // namespace
}  // namespace lowbit::artifact::testing
