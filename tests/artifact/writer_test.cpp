// ArtifactWriter: sharding, what it refuses, atomic publication and replacement, cleanup of its own and of stale
// staging directories.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>

#include "artifact/artifact_fixture.h"
#include "lowbit/core/staged_dir.h"
#include "lowbit/io/safetensors.h"

namespace lowbit::artifact::testing {
namespace {

TensorBuffer f32_tensor(Shape shape, float start = 0.0f) {
  TensorBuffer t = make_buffer(DType::F32, std::move(shape));
  float* p = t.as<float>();
  for (size_t i = 0; i < t.bytes.size() / 4; ++i) p[i] = start + static_cast<float>(i);
  return t;
}

std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

size_t payload_count(const Manifest& m) {
  return static_cast<size_t>(
      std::count_if(m.files.begin(), m.files.end(), [](const FileEntry& f) { return f.role == FileRole::payload; }));
}

// A pid that certainly belonged to a process that has exited.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(Writer, CutsShardsAtTheLimit) {
  TempDir tmp;
  ArtifactWriter w(tmp / "a", {.shard_bytes = 1000});
  for (int i = 0; i < 10; ++i) w.add_dense(fmt::format("t{}", i), f32_tensor({100}).view());  // 400 bytes each
  const Manifest& m = w.commit();
  EXPECT_EQ(payload_count(m), 5u);  // two tensors (800 bytes) per shard: a third would pass 1000
  for (const FileEntry& f : m.files) EXPECT_LT(f.size, 1000u + 512u) << f.name;
  EXPECT_NO_THROW(Artifact::open(tmp / "a"));
}

TEST(Writer, GivesAnOversizedTensorItsOwnShard) {
  TempDir tmp;
  ArtifactWriter w(tmp / "a", {.shard_bytes = 100});
  w.add_dense("small", f32_tensor({4}).view());
  w.add_dense("big", f32_tensor({1000}).view());
  w.add_dense("small2", f32_tensor({4}).view());
  const Manifest& m = w.commit();
  EXPECT_EQ(payload_count(m), 3u);
  EXPECT_NE(m.find_tensor("big")->arrays[0].file, m.find_tensor("small")->arrays[0].file);
}

TEST(Writer, PayloadsAreOrdinarySafetensorsFiles) {
  TempDir tmp;
  {
    ArtifactWriter w(tmp / "a");
    w.add_dense("model.embed_tokens.weight", f32_tensor({4, 3}, 1.0f).view());
    w.commit();
  }
  const auto file = io::SafetensorsFile::open(tmp / "a" / "model-00001.safetensors");
  const TensorView t = file.tensor("model.embed_tokens.weight");
  EXPECT_EQ(t.shape, (Shape{4, 3}));
  EXPECT_EQ(t.as<float>()[5], 6.0f);
  EXPECT_EQ(file.header().data_start % 8, 0u);
}

TEST(Writer, RefusesInvalidTensorsAndLeavesNothingBehind) {
  TempDir tmp;
  {
    ArtifactWriter w(tmp / "a");
    TensorBuffer t = f32_tensor({4});
    t.as<float>()[2] = std::nanf("");
    EXPECT_EQ(error_of([&] { w.add_dense("nan", t.view()); }), Errc::non_finite);
    w.add_dense("ok", f32_tensor({4}).view());
    EXPECT_EQ(error_of([&] { w.add_dense("ok", f32_tensor({4}).view()); }), Errc::duplicate);
    EXPECT_EQ(error_of([&] { w.add_dense("i32", make_buffer(DType::I32, {4}).view()); }), Errc::dtype);
    EXPECT_EQ(error_of([&] { w.add_file_contents("../evil", FileRole::other, "x"); }), Errc::unsafe_path);
    EXPECT_EQ(error_of([&] { w.add_file_contents("manifest.json", FileRole::other, "x"); }), Errc::usage);
    EXPECT_TRUE(fs::exists(w.staging_dir()));
  }  // destroyed without commit
  EXPECT_TRUE(entries_of(tmp.path()).empty());
}

TEST(Writer, RefusesAnExistingDestinationWithoutForce) {
  TempDir tmp;
  write_valid_artifact(tmp / "a", 1);
  const std::string before = read_text(tmp / "a" / kManifestName);
  EXPECT_EQ(error_of([&] { ArtifactWriter w(tmp / "a"); }), Errc::exists);
  EXPECT_EQ(read_text(tmp / "a" / kManifestName), before);
  EXPECT_EQ(entries_of(tmp.path()), std::vector<std::string>{"a"});
}

TEST(Writer, ForceReplacesAnArtifactAndLeavesNoLeftovers) {
  TempDir tmp;
  write_valid_artifact(tmp / "a", 1);
  write_valid_artifact(tmp / "a", 2, {.shard_bytes = 3000, .force = true});
  const Artifact a = Artifact::open(tmp / "a");
  EXPECT_EQ(a.provenance().seeds.at("rng"), 2u);
  EXPECT_EQ(entries_of(tmp.path()), std::vector<std::string>{"a"});
}

TEST(Writer, ForceRefusesToReplaceSomethingThatIsNotAnArtifact) {
  TempDir tmp;
  fs::create_directory(tmp / "home");
  write_text(tmp / "home" / "thesis.tex", "precious");
  EXPECT_EQ(error_of([&] { ArtifactWriter w(tmp / "home", {.force = true}); }), Errc::exists);
  write_text(tmp / "file", "precious");
  EXPECT_EQ(error_of([&] { ArtifactWriter w(tmp / "file", {.force = true}); }), Errc::exists);
  EXPECT_EQ(read_text(tmp / "home" / "thesis.tex"), "precious");
}

TEST(Writer, DestinationAppearingDuringTheWriteIsNotOverwritten) {
  TempDir tmp;
  ArtifactWriter w(tmp / "a");
  w.add_dense("t", f32_tensor({4}).view());
  fs::create_directory(tmp / "a");
  write_text(tmp / "a" / "mine", "x");
  EXPECT_EQ(error_of([&] { w.commit(); }), Errc::exists);
  EXPECT_EQ(read_text(tmp / "a" / "mine"), "x");
}

TEST(Writer, CleansStagingDirectoriesOfDeadWritersOnly) {
  TempDir tmp;
  const pid_t dead = dead_pid();
  const fs::path stale = tmp / fmt::format(".a.lowbit-staging-{}-0123456789abcdef", dead);
  const fs::path live = tmp / fmt::format(".b.lowbit-staging-{}-0123456789abcdef", ::getpid());
  const fs::path unrelated = tmp / fmt::format(".c.lowbit-staging-{}-xyz", dead);
  for (const fs::path& d : {stale, live, unrelated}) {
    fs::create_directory(d);
    write_text(d / "payload-00001.safetensors", "partial");
  }
  write_valid_artifact(tmp / "a", 3);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(unrelated));
}

TEST(Writer, RestoresAnArtifactAnInterruptedReplacementMovedAside) {
  TempDir tmp;
  const pid_t dead = dead_pid();
  write_valid_artifact(tmp / "a", 4);
  // As if killed between the two renames of a replacement without RENAME_EXCHANGE.
  fs::rename(tmp / "a", tmp / fmt::format(".a.lowbit-old-{}-0123456789abcdef", dead));
  EXPECT_EQ(clean_stale_staging(tmp.path()), 1u);
  EXPECT_EQ(entries_of(tmp.path()), std::vector<std::string>{"a"});
  EXPECT_EQ(Artifact::open(tmp / "a").provenance().seeds.at("rng"), 4u);
}

TEST(Writer, RemovesAMovedAsideArtifactOnceTheReplacementIsInPlace) {
  TempDir tmp;
  const pid_t dead = dead_pid();
  write_valid_artifact(tmp / "a", 5);
  write_valid_artifact(tmp / "old", 6);
  fs::rename(tmp / "old", tmp / fmt::format(".a.lowbit-old-{}-0123456789abcdef", dead));
  EXPECT_EQ(clean_stale_staging(tmp.path()), 1u);
  EXPECT_EQ(entries_of(tmp.path()), std::vector<std::string>{"a"});
  EXPECT_EQ(Artifact::open(tmp / "a").provenance().seeds.at("rng"), 5u);
}

}  // namespace
}  // namespace lowbit::artifact::testing
