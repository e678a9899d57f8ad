// Artifact::open on valid artifacts: what it exposes, hash options, the paranoid re-check.
#include <fcntl.h>
#include <sys/stat.h>

#include "artifact/artifact_fixture.h"

namespace lowbit::artifact::testing {
namespace {

TEST(Reader, ExposesWhatTheWriterWrote) {
  TempDir tmp;
  std::mt19937_64 rng(7);
  const Shape shape{5, 70};
  const auto values = random_values(rng, 5 * 70);
  const auto encoded = encode("offset_scale", {{"precision", "q4"}}, shape, values);
  const auto expected = codec::decode_all({codec::find_codec("offset_scale"), encoded.params, shape, encoded.views()});
  {
    ArtifactWriter w(tmp / "a");
    w.add("w", shape, "offset_scale", encoded);
    w.add("d", {3}, "dense", encode("dense", {{"dtype", "f32"}}, {3}, {1.0f, 2.0f, 3.0f}));
    w.add_file_contents("config.json", FileRole::config, R"({"hidden_size": 70})");
    w.set_config({{"hidden_size", 70}});
    w.commit();
  }
  const Artifact a = Artifact::open(tmp / "a");
  EXPECT_EQ(a.tensor_names(), (std::vector<std::string>{"w", "d"}));
  EXPECT_TRUE(a.contains("w"));
  EXPECT_FALSE(a.contains("x"));
  EXPECT_EQ(error_of([&] { a.tensor("x"); }), Errc::format);
  const codec::TensorRef& w = a.tensor("w");
  EXPECT_EQ(w.codec->id, "offset_scale");
  EXPECT_EQ(w.shape, shape);
  EXPECT_EQ(codec::decode_all(w), expected);
  EXPECT_EQ(codec::decode_all(a.tensor("d")), (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(a.config()["hidden_size"], 70);
  EXPECT_TRUE(a.quality().is_null());  // none written
  EXPECT_TRUE(a.recipe().is_null());
  EXPECT_EQ(a.provenance().tool, "lowbit " LOWBIT_VERSION);
  EXPECT_EQ(read_text(a.file_path("config.json")), R"({"hidden_size": 70})");
  EXPECT_EQ(error_of([&] { a.file_path("tokenizer.json"); }), Errc::missing_file);
  EXPECT_EQ(a.files_with_role(FileRole::config), std::vector<fs::path>{tmp / "a" / "config.json"});
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(tmp / "a")) on_disk += e.file_size();
  EXPECT_EQ(a.total_bytes(), on_disk);
}

TEST(Reader, ManifestRoundTripsThroughSerialize) {
  TempDir tmp;
  write_valid_artifact(tmp / "a", 11);
  const std::string text = read_text(tmp / "a" / kManifestName);
  const Manifest m = Manifest::parse(text);
  EXPECT_EQ(m.serialize(), text);
  EXPECT_EQ(Manifest::parse(m.serialize()).to_json(), m.to_json());
  EXPECT_EQ(m.provenance.calibration_sha256, std::string(64, 'b'));
  EXPECT_EQ(m.provenance.sources.at(0).size, 1234u);
}

TEST(Reader, SkipsHashesOnlyWhenAsked) {
  TempDir tmp;
  write_valid_artifact(tmp / "a", 12);
  json m = read_manifest(tmp / "a");
  const std::string config_sha = file_entry(m, "config.json")["sha256"];
  file_entry(m, "config.json")["sha256"] = std::string(64, 'f');
  write_manifest(tmp / "a", m);
  EXPECT_EQ(error_of([&] { Artifact::open(tmp / "a"); }), Errc::hash_mismatch);
  EXPECT_NO_THROW(Artifact::open(tmp / "a", {.verify_hash = false}));
}

TEST(Reader, ParanoidRecheckCatchesAnEditThatKeptSizeAndTimes) {
  TempDir tmp;
  write_valid_artifact(tmp / "a", 13);
  const fs::path config = tmp / "a" / "config.json";
  const auto rewrite_keeping_times = [config] {
    struct stat st {};
    ::stat(config.c_str(), &st);
    std::string text = read_text(config);
    text[0] = ' ';  // still the same size
    std::fstream f(config, std::ios::in | std::ios::out | std::ios::binary);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    const timespec times[2] = {st.st_atim, st.st_mtim};
    ::utimensat(AT_FDCWD, config.c_str(), times, 0);
  };
  EXPECT_NO_THROW(Artifact::open(tmp / "a", {.before_recheck = rewrite_keeping_times}));
  write_valid_artifact(tmp / "a", 13, {.shard_bytes = 3000, .force = true});
  EXPECT_EQ(error_of([&] { Artifact::open(tmp / "a", {.paranoid = true, .before_recheck = rewrite_keeping_times}); }),
            Errc::changed);
}

TEST(Reader, RefusesWhatIsNotAnArtifactDirectory) {
  TempDir tmp;
  EXPECT_EQ(error_of([&] { Artifact::open(tmp / "absent"); }), Errc::missing_file);
  write_text(tmp / "file", "x");
  EXPECT_EQ(error_of([&] { Artifact::open(tmp / "file"); }), Errc::missing_file);
  EXPECT_EQ(error_of([&] { Artifact::open(tmp.path()); }), Errc::missing_file);  // no manifest.json
}

TEST(Manifest, AcceptsTheMinimalDocument) {
  const Manifest m = Manifest::parse(R"({"format": "lowbit-artifact", "version": 2, "tensors": [], "files": [],
    "config": {}, "provenance": {"tool": "t", "sources": [], "calibration_sha256": null, "seeds": {}}})");
  EXPECT_TRUE(m.tensors.empty());
  EXPECT_TRUE(m.unverified.empty());
  EXPECT_FALSE(m.provenance.calibration_sha256);
}

TEST(Manifest, NamesTheFieldInErrors) {
  std::string message;
  EXPECT_EQ(error_of([] { Manifest::parse(R"({"format": "lowbit-artifact", "version": 1})", "m.json"); }, &message),
            Errc::format);
  EXPECT_NE(message.find("m.json"), std::string::npos) << message;
  EXPECT_NE(message.find("files"), std::string::npos) << message;
}

TEST(Manifest, ChecksFileNames) {
  for (const char* ok : {"payload-00001.safetensors", "config.json", "tokenizer.model", "a..b"})
    EXPECT_NO_THROW(check_file_name(ok, "test")) << ok;
  for (const char* bad : {"", ".", "..", "../x", "a/b", "/etc/passwd", "a\\b", ".hidden", "tab\tname"})
    EXPECT_EQ(error_of([&] { check_file_name(bad, "test"); }), Errc::unsafe_path) << bad;
  EXPECT_EQ(error_of([] { check_file_name(std::string(256, 'x'), "test"); }), Errc::unsafe_path);
}

}  // namespace
}  // namespace lowbit::artifact::testing
