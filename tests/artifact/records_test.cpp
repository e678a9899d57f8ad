// quality.json and recipe.json: hashed like every file, parsed strictly, and every fact they restate checked against
// the manifest and the codecs (docs/FORMAT.md, "Records").
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "artifact_fixture.h"
#include "lowbit/artifact/records.h"

namespace lowbit::artifact::testing {
namespace {

uint64_t artifact_bytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) total += e.file_size();
  return total;
}

// Edits a record, re-declares its size and hash in the manifest and, unless the edit is about it, settles the size
// quality.json states, so that only the content check under test can catch it. Returns the error opening the
// artifact gives, with its message.
Errc edited_record(const fs::path& dir, std::string_view file, const std::function<void(json&)>& edit,
                   std::string* message) {
  json doc = json::parse(read_text(dir / file));
  edit(doc);
  const bool settle = file == kQualityFileName &&
                      doc["quantize"]["artifact_bytes"] == json::parse(read_text(dir / file))["quantize"]["artifact_bytes"];
  for (uint64_t stated = 0;;) {
    write_text(dir / file, doc.dump(2));
    refresh_file_entry(dir, file);
    if (!settle || artifact_bytes(dir) == stated) break;
    stated = artifact_bytes(dir);
    doc["quantize"]["artifact_bytes"] = stated;
  }
  return error_of([&] { Artifact::open(dir); }, message);
}

struct RecordsTest : ::testing::Test {
  TempDir tmp;
  fs::path dir = tmp / "a";
  void SetUp() override { write_valid_artifact(dir, 7); }

  // On a fresh artifact: the error must be `code` and its message name the file and the field. The previous case
  // left a tampered artifact, which --force rightly refuses to replace (it no longer opens as one): removed first.
  void expect_rejected(std::string_view file, const std::function<void(json&)>& edit, Errc code, std::string_view field) {
    fs::remove_all(dir);
    write_valid_artifact(dir, 7, {.shard_bytes = 3000});
    std::string message;
    EXPECT_EQ(edited_record(dir, file, edit, &message), code) << message;
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find(field), std::string::npos) << message;
  }
};

json& first_tensor(json& q) { return q["quantize"]["tensors"][0]; }

TEST_F(RecordsTest, WrittenAsHashedFilesAndReadBackChecked) {
  const Artifact a = Artifact::open(dir);
  const FileEntry* quality = a.manifest().find_role(FileRole::quality);
  const FileEntry* recipe = a.manifest().find_role(FileRole::recipe);
  ASSERT_TRUE(quality && recipe);
  EXPECT_EQ(quality->name, kQualityFileName);
  EXPECT_EQ(recipe->name, kRecipeFileName);
  EXPECT_EQ(quality->sha256, sha256_file(dir / kQualityFileName));
  EXPECT_EQ(a.quality()["quantize"]["artifact_bytes"].get<uint64_t>(), a.total_bytes());
  EXPECT_EQ(a.quality()["quantize"]["tensors"].size(), a.manifest().tensors.size());
  EXPECT_EQ(a.recipe(), test_recipe());
  const json manifest = read_manifest(dir);
  EXPECT_FALSE(manifest.contains("quality"));
  EXPECT_FALSE(manifest["provenance"].contains("recipe"));
}

TEST_F(RecordsTest, EditedContentIsAHashMismatch) {
  const std::pair<std::string_view, std::string> edits[] = {{kQualityFileName, "0.25"}, {kRecipeFileName, "test"}};
  for (const auto& [file, from] : edits) {
    const std::string original = read_text(dir / file);
    std::string text = original;
    ASSERT_NE(text.find(from), std::string::npos) << file;
    text.replace(text.find(from), from.size(), std::string(from.size(), '9'));
    write_text(dir / file, text);
    std::string message;
    EXPECT_EQ(error_of([&] { Artifact::open(dir); }, &message), Errc::hash_mismatch) << message;
    EXPECT_NE(message.find(file), std::string::npos) << message;
    write_text(dir / file, original);
  }
  Artifact::open(dir);  // restored
}

TEST_F(RecordsTest, RestatedFactsMustBeTheManifests) {
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["shape"] = {32, 17}; }, Errc::shape,
                  "quantize.tensors[0].shape");
}
TEST_F(RecordsTest, RestatedBitsPerWeight) {
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["bits_per_weight"] = 4.0; }, Errc::format,
                  "quantize.tensors[0].bits_per_weight");
}
TEST_F(RecordsTest, RestatedCodec) {
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["codec"] = "affine"; }, Errc::format,
                  "quantize.tensors[0].codec");
}
TEST_F(RecordsTest, RestatedBytes) {
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["bytes"] = 1; }, Errc::size_mismatch,
                  "quantize.tensors[0].bytes");
}
TEST_F(RecordsTest, RestatedTotals) {
  expect_rejected(kQualityFileName, [](json& q) { q["quantize"]["bits_per_weight"] = 3.5; }, Errc::format,
                  "quantize.bits_per_weight");
}
TEST_F(RecordsTest, RestatedArtifactSize) {
  expect_rejected(kQualityFileName, [](json& q) { q["quantize"]["artifact_bytes"] = 1; }, Errc::size_mismatch,
                  "quantize.artifact_bytes");
}
TEST_F(RecordsTest, TensorsMustExist) {
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["name"] = "ghost.weight"; }, Errc::format,
                  "quantize.tensors[0].name");
}
TEST_F(RecordsTest, TensorsReportedOnce) {
  expect_rejected(kQualityFileName, [](json& q) { q["quantize"]["tensors"][1] = first_tensor(q); }, Errc::duplicate,
                  "quantize.tensors[1].name");
}
TEST_F(RecordsTest, UnknownKeys) {
  expect_rejected(kQualityFileName, [](json& q) { q["quantize"]["wikitext2_ppl"] = 3.0; }, Errc::format,
                  "quantize.wikitext2_ppl");
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["verdict"] = "lossless"; }, Errc::format,
                  "quantize.tensors[0].verdict");
  expect_rejected(kRecipeFileName, [](json& r) { r["quantize"]["note"] = "x"; }, Errc::format, "quantize.note");
}
TEST_F(RecordsTest, WrongTypes) {
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["guard_tripped"] = "no"; }, Errc::format,
                  "quantize.tensors[0].guard_tripped");
  expect_rejected(kQualityFileName, [](json& q) { first_tensor(q)["proxy_loss"] = -1.0; }, Errc::format,
                  "quantize.tensors[0].proxy_loss");
}
TEST_F(RecordsTest, NonFiniteNumbers) {
  // JSON has no literal for NaN or infinity; a number too large for a double is the nearest thing, refused while
  // parsing (the schema's finiteness check stands behind it).
  std::string text = read_text(dir / kQualityFileName);
  const size_t at = text.find("\"wall_seconds\": ") + 16;
  text.replace(at, text.find_first_of(",\n", at) - at, "1e999");
  write_text(dir / kQualityFileName, text);
  refresh_file_entry(dir, kQualityFileName);
  std::string message;
  EXPECT_EQ(error_of([&] { Artifact::open(dir); }, &message), Errc::format) << message;
  EXPECT_NE(message.find("quality.json"), std::string::npos) << message;
  EXPECT_NE(message.find("1e999"), std::string::npos) << message;
}
TEST_F(RecordsTest, RecipeChecked) {
  expect_rejected(kRecipeFileName, [](json& r) { r["quantize"]["rotate"] = true; }, Errc::format, "quantize.rotate");
  expect_rejected(kRecipeFileName, [](json& r) { r["quantize"]["default"]["codec"] = "magic"; }, Errc::unknown_codec,
                  "quantize.default.codec");
  expect_rejected(kRecipeFileName, [](json& r) { r = {{"free", "form"}}; }, Errc::format, "import");
}
TEST_F(RecordsTest, ImportHashesMustBeTheProvenances) {
  expect_rejected(kRecipeFileName,
                  [](json& r) {
                    r = {{"import",
                          {{"source_format", "audio8-mixed-bundle-v2"}, {"weights_file", "weights.bin"},
                           {"manifest_sha256", std::string(64, 'c')}, {"weights_sha256", std::string(64, 'c')},
                           {"source_payload_sha_verified", true}, {"source_revision", "r"}, {"profile", "p"},
                           {"language_model_prefix", "language_model."}}}};
                  },
                  Errc::format, "import.manifest_sha256");
}

TEST_F(RecordsTest, VerifyExitsThreeNamingTheFileAndField) {
  std::string message;
  edited_record(dir, kQualityFileName, [](json& q) { first_tensor(q)["shape"] = {1}; }, &message);
  const CliResult r = run_cli({"verify", dir.string()});
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(r.err.find("quality.json"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("quantize.tensors[0].shape"), std::string::npos) << r.err;
}

TEST_F(RecordsTest, InspectShowsTheCheckedRecords) {
  const CliResult table = run_cli({"inspect", dir.string()});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("quality.quantize (quality.json, checked)"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("recipe.quantize (recipe.json, checked)"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("unverified"), std::string::npos) << table.out;
  const CliResult doc = run_cli({"inspect", "--json", dir.string()});
  ASSERT_EQ(doc.status, 0) << doc.err;
  const json j = json::parse(doc.out);
  EXPECT_EQ(j["quality"], Artifact::open(dir).quality());
  EXPECT_EQ(j["recipe"], test_recipe());
  EXPECT_FALSE(j.contains("unverified"));
}

// A version 1 artifact (free-form provenance.recipe and quality in the manifest) stays loadable; inspect shows those
// fields as unverified. Version 2 refuses them.
TEST_F(RecordsTest, VersionOneFreeFormFieldsAreShownUnverified) {
  json m = read_manifest(dir);
  json files = json::array();
  for (const json& f : m["files"])
    if (f["role"] != "quality" && f["role"] != "recipe") files.push_back(f);
  m["files"] = files;
  fs::remove(dir / kQualityFileName);
  fs::remove(dir / kRecipeFileName);
  m["provenance"]["recipe"] = {{"default", "offset_scale q4"}};
  m["quality"] = {{"wikitext2_ppl", 12.5}};
  write_manifest(dir, m);
  std::string message;
  EXPECT_EQ(error_of([&] { Artifact::open(dir); }, &message), Errc::format) << message;
  EXPECT_NE(message.find("provenance.recipe"), std::string::npos) << message;

  m["version"] = 1;
  write_manifest(dir, m);
  const Artifact a = Artifact::open(dir);
  EXPECT_EQ(a.manifest().version, 1);
  EXPECT_EQ(a.manifest().unverified["quality"]["wikitext2_ppl"], 12.5);
  EXPECT_TRUE(a.quality().is_null());
  const CliResult table = run_cli({"inspect", dir.string()});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("unverified quality (format version 1, not checked)"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("(quality.json, checked)"), std::string::npos) << table.out;
}

}  // namespace
}  // namespace lowbit::artifact::testing
