// lowbit convert: --force replaces only a directory an earlier convert wrote, and a convert killed at any point
// leaves the old directory or the complete new one (the StagedDirectory every writer shares).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lowbit/model/hf.h"
#include "model/tiny_model.h"
#include "support/replace_check.h"

namespace lowbit {
namespace {

namespace fs = std::filesystem;
using testing::snapshot;

struct TempDir {
  fs::path path = fs::temp_directory_path() / fmt::format("lowbit-convert-{}", ::getpid());
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Runs lowbit and returns its exit status.
int run(const std::vector<std::string>& args) {
  std::string cmd = LOWBIT_CLI;
  for (const auto& a : args) cmd += " '" + a + "'";
  const int raw = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
}

// Two HF sources that convert to different directories.
void write_sources(const fs::path& root) {
  for (int i = 0; i < 2; ++i)
    model::write_hf(*model::testing::tiny_model(model::testing::tiny_config(), 10 + i), root / fmt::format("src{}", i));
}

TEST(Convert, ForceRefusesADirectoryConvertDidNotWrite) {
  TempDir tmp;
  write_sources(tmp.path);
  const fs::path mine = tmp.path / "mine";
  fs::create_directories(mine);
  fs::copy_file(tmp.path / "src0/config.json", mine / "config.json");
  fs::copy_file(tmp.path / "src0/model.safetensors", mine / "model.safetensors");
  std::ofstream(mine / "notes.txt") << "my notes\n";
  std::ofstream(mine / "manifest.json") << "{}";
  const auto before = snapshot(mine);
  EXPECT_EQ(run({"convert", (tmp.path / "src1").string(), mine.string()}), 1);
  EXPECT_EQ(run({"convert", (tmp.path / "src1").string(), mine.string(), "--force"}), 1);
  EXPECT_TRUE(snapshot(mine) == before);
  // What convert wrote, it may replace.
  ASSERT_EQ(run({"convert", (tmp.path / "src0").string(), (tmp.path / "out").string()}), 0);
  ASSERT_EQ(run({"convert", (tmp.path / "src1").string(), (tmp.path / "out").string(), "--force"}), 0);
  ASSERT_EQ(run({"convert", (tmp.path / "src1").string(), (tmp.path / "ref").string()}), 0);
  EXPECT_TRUE(snapshot(tmp.path / "out") == snapshot(tmp.path / "ref"));
}

TEST(Convert, KilledAtRandomPointsKeepsTheOldDirectoryOrWritesTheNewOne) {
  TempDir tmp;
  write_sources(tmp.path);
  const fs::path dest = tmp.path / "out";
  std::vector<std::map<std::string, std::string>> expected;
  for (int i = 0; i < 2; ++i) {
    const fs::path ref = tmp.path / fmt::format("ref{}", i);
    ASSERT_EQ(run({"convert", (tmp.path / fmt::format("src{}", i)).string(), ref.string()}), 0);
    expected.push_back(snapshot(ref));
  }
  ASSERT_TRUE(expected[0] != expected[1]);
  const auto args_for = [&](int r) {
    return std::vector<std::string>{"convert", (tmp.path / fmt::format("src{}", r % 2)).string(), dest.string(),
                                    "--force"};
  };
  fs::copy(tmp.path / "ref1", dest);
  const auto full = testing::time_cli(args_for(0));
  ASSERT_TRUE(snapshot(dest) == expected[0]);
  int kept = 0, replaced = 0;
  const int finished = testing::kill_at_random_points(24, 20261205, full, args_for, [&](int r) {
    const auto now = snapshot(dest);
    ASSERT_FALSE(now.empty()) << "run " << r << ": the destination is gone";
    const bool is_new = now == expected[r % 2], is_old = now == expected[1 - r % 2];
    EXPECT_TRUE(is_new || is_old) << "run " << r << ": a partial directory";
    if (is_new) ++replaced;
    if (is_old) {
      ++kept;
      fs::remove_all(dest);
      fs::copy(tmp.path / fmt::format("ref{}", r % 2), dest);  // keep the alternation
    }
  });
  ASSERT_EQ(run(args_for(0)), 0);  // the next run cleans what the killed ones left
  for (const auto& e : fs::directory_iterator(tmp.path))
    EXPECT_FALSE(e.path().filename().string().starts_with(".")) << "left behind: " << e.path();
  std::cerr << "[crash] convert: 24 kills, " << finished << " finished, " << replaced << " replaced, " << kept
            << " kept the old directory\n";
}

}  // namespace
}  // namespace lowbit
