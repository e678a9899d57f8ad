// lowbit quantize's calibration text: the installed Debian reference text by default (LOWBIT_DEFAULT_CALIB
// stands in for its path here), --calib FILE plain or gzip, plain rounding only with --no-calib, and a one-line
// error (exit 3) rather than a silent fall back to plain rounding when the default is absent.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "artifact/artifact_fixture.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/core/sha256.h"
#include "quant/quant_fixture.h"
#include "quant/tiny_gguf.h"

namespace lowbit::quant {
namespace {

namespace fs = std::filesystem;
using artifact::testing::CliResult;
using artifact::testing::run_cli;
using testing::artifact_tensor_bytes;
using testing::TempDir;
using testing::write_gguf;

constexpr const char* kInstalledDefault = "/usr/share/debian-reference/debian-reference.en.txt.gz";

// Sets LOWBIT_DEFAULT_CALIB for one scope (unset: the installed path).
class DefaultCalibration {
 public:
  explicit DefaultCalibration(const fs::path& path) { ::setenv("LOWBIT_DEFAULT_CALIB", path.c_str(), 1); }
  DefaultCalibration() { ::unsetenv("LOWBIT_DEFAULT_CALIB"); }
  ~DefaultCalibration() { ::unsetenv("LOWBIT_DEFAULT_CALIB"); }
  DefaultCalibration(const DefaultCalibration&) = delete;
  DefaultCalibration& operator=(const DefaultCalibration&) = delete;
};

// Text the tiny model's byte-fallback tokenizer turns into a few hundred tokens.
std::string calibration_text() {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "ab ba a b ab, line " + std::to_string(i) + " of the calibration text\n";
  return text;
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_gzip(const fs::path& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// The error the CLI printed, which must be its last line and the only one after "lowbit: error: ".
std::string error_line(const std::string& err) {
  const size_t at = err.find("lowbit: error: ");
  if (at == std::string::npos || err.find('\n', at) != err.size() - 1) {
    ADD_FAILURE() << "no one-line error at the end of: " << err;
    return {};
  }
  return err.substr(at);
}

std::string sha256_of(const std::string& text) { return sha256_hex(std::as_bytes(std::span(text))); }

class CalibrationText : public ::testing::Test {
 protected:
  TempDir tmp;
  fs::path model = write_gguf(tmp.path);
  fs::path out = tmp.path / "out";

  CliResult quantize(std::vector<std::string> extra) {
    std::vector<std::string> args{"quantize", model.string(), out.string(), "--preset", "affine4",
                                  "--calib-tokens", "256", "--force"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }
  std::optional<std::string> calibration_sha256() const {
    return artifact::Artifact::open(out).provenance().calibration_sha256;
  }
};

TEST_F(CalibrationText, DefaultIsFoundAndReadThroughGzip) {
  const std::string text = calibration_text();
  const fs::path gz = tmp.path / "default.txt.gz";
  write_gzip(gz, text);
  const DefaultCalibration scope(gz);
  const CliResult r = quantize({});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("calibrating on " + gz.string()), std::string::npos) << r.err;
  // The artifact records the decompressed text's hash: the gzip was read, and read whole.
  EXPECT_EQ(calibration_sha256(), sha256_of(text));
}

TEST_F(CalibrationText, GzipAndPlainCalibrateAlike) {
  const std::string text = calibration_text();
  write_file(tmp.path / "calib.txt", text);
  write_gzip(tmp.path / "calib.txt.gz", text);
  const DefaultCalibration scope(tmp.path / "absent");  // --calib needs no default
  ASSERT_EQ(quantize({"--calib", (tmp.path / "calib.txt").string()}).status, 0);
  const std::string plain = artifact_tensor_bytes(out);
  ASSERT_EQ(quantize({"--calib", (tmp.path / "calib.txt.gz").string()}).status, 0);
  EXPECT_TRUE(artifact_tensor_bytes(out) == plain) << "the same text, compressed, calibrated differently";
  EXPECT_EQ(calibration_sha256(), sha256_of(text));
}

TEST_F(CalibrationText, CorruptGzipIsRejectedNamingTheFile) {
  const fs::path gz = tmp.path / "calib.txt.gz";
  write_gzip(gz, calibration_text());
  std::string bytes;
  {
    std::ifstream in(gz, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x55);
  write_file(gz, bytes);
  const CliResult r = quantize({"--calib", gz.string()});
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_NE(error_line(r.err).find(gz.string() + ": corrupt gzip data"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(CalibrationText, MissingDefaultFailsInsteadOfPlainRounding) {
  const fs::path absent = tmp.path / "absent.txt.gz";
  const DefaultCalibration scope(absent);
  const CliResult r = quantize({});
  EXPECT_EQ(r.status, 3) << r.err;
  const std::string error = error_line(r.err);
  EXPECT_NE(error.find(absent.string()), std::string::npos) << r.err;
  for (const char* hint : {"install debian-reference-en", "--calib FILE", "--no-calib"})
    EXPECT_NE(error.find(hint), std::string::npos) << hint << " missing from: " << r.err;
  EXPECT_FALSE(fs::exists(out));

  // --no-calib asks for plain rounding: no default needed, none recorded.
  const CliResult plain = quantize({"--no-calib"});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(calibration_sha256(), std::nullopt);
  EXPECT_EQ(quantize({"--no-calib", "--calib", absent.string()}).status, 2);
}

// Without LOWBIT_DEFAULT_CALIB, the default is debian-reference-en's text where the package is installed.
TEST_F(CalibrationText, InstalledDebianReferenceIsTheDefault) {
  if (!fs::exists(kInstalledDefault)) GTEST_SKIP() << kInstalledDefault << " absent (debian-reference-en not installed)";
  const DefaultCalibration scope;
  const CliResult r = quantize({});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find(std::string("calibrating on ") + kInstalledDefault), std::string::npos) << r.err;
  EXPECT_TRUE(calibration_sha256().has_value());
}

}  // namespace
}  // namespace lowbit::quant
