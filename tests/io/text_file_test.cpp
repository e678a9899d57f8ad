#include "lowbit/io/text_file.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "lowbit/core/error.h"

namespace lowbit::io {
namespace {

namespace fs = std::filesystem;

class TextFileTest : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / fmt::format("lowbit-text-file-test-{}", ::getpid());
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }

  fs::path write(const std::string& name, const std::string& bytes) {
    const fs::path path = dir / name;
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
};

// `text` as one gzip member, written by zlib's deflate as gzip(1) would.
std::string gzip(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, text.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// Several hundred KiB of varied text: the reader goes through many input and output chunks.
std::string sample_text() {
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < 300000) text += fmt::format("line {} of the sample: {}\n", text.size(), rng());
  return text;
}

Errc read_error(const fs::path& path, uint64_t max_bytes, std::string* message = nullptr) {
  try {
    read_text_file(path, "test", max_bytes);
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "accepted " << path;
  return Errc::internal;
}

TEST_F(TextFileTest, ReadsPlainAndGzipAlike) {
  const std::string text = sample_text();
  EXPECT_EQ(read_text_file(write("a.txt", text), "test", 1 << 20), text);
  EXPECT_EQ(read_text_file(write("a.txt.gz", gzip(text)), "test", 1 << 20), text);
  // Recognized by content, not name.
  EXPECT_EQ(read_text_file(write("a.bin", gzip(text)), "test", 1 << 20), text);
  EXPECT_EQ(read_text_file(write("empty.txt", ""), "test", 1 << 20), "");
  EXPECT_EQ(read_text_file(write("empty.gz", gzip("")), "test", 1 << 20), "");
}

TEST_F(TextFileTest, ReadsConcatenatedMembers) {
  EXPECT_EQ(read_text_file(write("two.gz", gzip("first\n") + gzip("second\n")), "test", 100), "first\nsecond\n");
}

TEST_F(TextFileTest, RejectsCorruptGzipNamingTheFile) {
  const std::string packed = gzip(sample_text());
  std::string flipped = packed;
  flipped[packed.size() / 2] = static_cast<char>(flipped[packed.size() / 2] ^ 0x55);
  std::string message;
  const fs::path path = write("flipped.gz", flipped);
  EXPECT_EQ(read_error(path, 1 << 20, &message), Errc::format);
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("corrupt gzip data"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;

  std::string bad_crc = packed;
  bad_crc[packed.size() - 6] = static_cast<char>(bad_crc[packed.size() - 6] ^ 1);  // the CRC-32 in the trailer
  EXPECT_EQ(read_error(write("crc.gz", bad_crc), 1 << 20), Errc::format);
  std::string bad_method = packed;
  bad_method[2] = 7;  // compression method: only 8 (deflate) exists
  EXPECT_EQ(read_error(write("method.gz", bad_method), 1 << 20), Errc::format);
  EXPECT_EQ(read_error(write("garbage.gz", packed + "garbage"), 1 << 20), Errc::format);
}

TEST_F(TextFileTest, RejectsTruncatedGzip) {
  const std::string packed = gzip(sample_text());
  for (const size_t keep : {size_t{2}, size_t{10}, packed.size() / 2, packed.size() - 1})
    EXPECT_EQ(read_error(write("cut.gz", packed.substr(0, keep)), 1 << 20), Errc::truncated) << keep;
}

TEST_F(TextFileTest, BoundsTheDecompressedSize) {
  // 64 MiB of zeros packs into about 64 KiB: refused once the text passes the limit, not after inflating it all.
  const fs::path bomb = write("zeros.gz", gzip(std::string(64 << 20, '\0')));
  EXPECT_LT(fs::file_size(bomb), 100000u);
  std::string message;
  EXPECT_EQ(read_error(bomb, 1 << 20, &message), Errc::limit);
  EXPECT_NE(message.find("once decompressed"), std::string::npos) << message;
  EXPECT_EQ(read_error(write("big.txt", std::string(1001, 'x')), 1000), Errc::limit);
  EXPECT_EQ(read_text_file(write("fits.txt", std::string(1000, 'x')), "test", 1000).size(), 1000u);
}

TEST_F(TextFileTest, MissingFileIsAnIoError) {
  std::string message;
  EXPECT_EQ(read_error(dir / "absent.txt.gz", 100, &message), Errc::io);
  EXPECT_NE(message.find("absent.txt.gz"), std::string::npos) << message;
}

// lowbit quantize's default calibration text (debian-reference-en's gzip) is the text of ../shared's plain copy,
// on which docs/QUALITY.md's rows were calibrated.
TEST(DebianReference, InstalledTextEqualsSharedCopy) {
  const fs::path installed = "/usr/share/debian-reference/debian-reference.en.txt.gz";
  const fs::path shared = fs::path(LOWBIT_SHARED_DIR) / "data/calibration-debian-reference.en.txt";
  if (!fs::exists(installed)) GTEST_SKIP() << installed << " absent (debian-reference-en not installed)";
  if (!fs::exists(shared)) GTEST_SKIP() << shared << " absent (../shared not mounted)";
  const std::string text = read_text_file(installed, "test", 64 << 20);
  EXPECT_GT(text.size(), 100000u);
  EXPECT_TRUE(text == read_text_file(shared, "test", 64 << 20));
}

}  // namespace
}  // namespace lowbit::io
