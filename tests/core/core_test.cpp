#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "lowbit/core/checked.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/core/progress.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/tensor.h"
#include "lowbit/core/thread_pool.h"
#include "support/fifo_guard.h"

namespace lowbit {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const char* name) {
  fs::path p = fs::temp_directory_path() / fmt::format("lowbit-core-{}-{}", name, ::getpid());
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(DType, TableMatchesSafetensorsNames) {
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("F8_E5M2"), DType::F8_E5M2);
  EXPECT_FALSE(parse_dtype("bf16").has_value());
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BOOL), 1u);
}

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << "f16 bits " << h;
  }
}

TEST(DType, F16KnownValuesAndRounding) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  // 1 + 2^-11 is exactly between 1 and the next f16: ties go to even (1.0).
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and the smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  const float tie = std::bit_cast<float>(0x3f808000u);  // halfway between 0x3f80 and 0x3f81
  EXPECT_EQ(f32_to_bf16(tie), 0x3f80);
  const float above = std::bit_cast<float>(0x3f808001u);
  EXPECT_EQ(f32_to_bf16(above), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(Checked, OverflowIsAnError) {
  EXPECT_EQ(checked_mul(1ull << 31, 1ull << 31, "x"), 1ull << 62);
  try {
    checked_mul(1ull << 32, 1ull << 32, "x");
    FAIL() << "expected overflow";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::overflow);
  }
  EXPECT_THROW(checked_add(~0ull, 1, "x"), Error);
  const Shape negative{4, -1};
  EXPECT_THROW(checked_numel(negative, "x"), Error);
}

TEST(Error, ExitCodes) {
  EXPECT_EQ(exit_code(Errc::usage), 2);
  EXPECT_EQ(exit_code(Errc::hash_mismatch), 3);
  EXPECT_EQ(exit_code(Errc::reserved_code), 3);
  EXPECT_EQ(exit_code(Errc::io), 1);
  EXPECT_EQ(exit_code(Errc::internal), 1);
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string abc = "abc";
  EXPECT_EQ(sha256_hex(std::as_bytes(std::span(abc))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 streaming;
  streaming.update("a", 1);
  streaming.update("bc", 2);
  EXPECT_EQ(streaming.hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(MappedFile, MapsAndRefusesSymlinks) {
  const fs::path dir = temp_dir("mmap");
  { std::ofstream(dir / "a.bin") << "hello"; }
  const MappedFile f = MappedFile::open(dir / "a.bin");
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(static_cast<char>(f.bytes()[4]), 'o');
  EXPECT_EQ(f.identity(), file_identity(dir / "a.bin"));
  EXPECT_EQ(sha256_file(dir / "a.bin"), sha256_hex(f.bytes()));

  fs::create_symlink(dir / "a.bin", dir / "link.bin");
  try {
    MappedFile::open(dir / "link.bin");
    FAIL() << "symlink accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsafe_path);
  }
  EXPECT_THROW(file_identity(dir / "link.bin"), Error);
  try {
    MappedFile::open(dir / "absent.bin");
    FAIL() << "missing file accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::missing_file);
  }
  fs::remove_all(dir);
}

TEST(MappedFile, RefusesFifosDevicesAndDirectoriesWithoutBlocking) {
  const fs::path dir = temp_dir("types");
  EXPECT_EQ(testing::read_fifo(dir / "fifo.bin", [&] { MappedFile::open(dir / "fifo.bin"); }), Errc::unsafe_path);
  EXPECT_EQ(testing::read_fifo(dir / "magic.bin", [&] { file_starts_with(dir / "magic.bin", "GGUF"); }),
            Errc::unsafe_path);
  for (const fs::path& not_a_file : {fs::path("/dev/zero"), dir}) {
    try {
      MappedFile::open(not_a_file);
      FAIL() << not_a_file << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::unsafe_path) << e.what();
    }
  }
  { std::ofstream(dir / "g.bin") << "GGUF rest"; }
  EXPECT_TRUE(file_starts_with(dir / "g.bin", "GGUF"));
  EXPECT_FALSE(file_starts_with(dir / "g.bin", "GGUFX rest, longer than the file"));
  fs::remove_all(dir);
}

TEST(Error, MessagesEscapeControlCharactersAndCutLongNames) {
  const std::string hostile = "name\n\x1b[31mred\x7f";
  try {
    fail(Errc::format, "[op] {}: tensor {} is bad", "file.bin", hostile);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[op] file.bin: tensor name\\n\\x1b[31mred\\x7f is bad");
  }
  const std::string long_name(100000, 'x');
  try {
    fail(Errc::format, "[op] {}: tensor {} is bad", "file.bin", long_name);
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), kMaxShownBytes + 100);
    EXPECT_NE(what.find("... (100000 bytes) is bad"), std::string::npos) << what;
  }
  // An Error built directly (a rethrow that adds context) is made one line too, and escaping twice changes nothing.
  const Error direct(Errc::format, std::string("a\nb"));
  EXPECT_STREQ(direct.what(), "a\\nb");
  EXPECT_EQ(printable(direct.what()), direct.what());
  // A cut never splits a UTF-8 sequence.
  EXPECT_EQ(printable("\xc3\xa9\xc3\xa9", 3), "\xc3\xa9... (4 bytes)");
}

TEST(ThreadPool, CoversTheRangeExactlyOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(10007);
  pool.parallel_for(hits.size(), 7, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) hits[i]++;
  });
  for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(1000, 1, [](size_t b, size_t) {
    if (b >= 500) throw std::runtime_error("boom");
  }), std::runtime_error);
  std::atomic<size_t> sum{0};
  pool.parallel_for(100, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950u);
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<size_t> count{0};
  pool.parallel_for(8, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) pool.parallel_for(10, 1, [&](size_t b2, size_t e2) { count += e2 - b2; });
  });
  EXPECT_EQ(count.load(), 80u);
}

// Many short jobs back to back, with pauses longer than the workers' spin between some of them, so that jobs
// find the workers both spinning and asleep: every job must cover its range once and return.
TEST(ThreadPool, BackToBackJobsWithSleepingAndSpinningWorkers) {
  ThreadPool pool(3);
  for (int round = 0; round < 2000; ++round) {
    std::vector<int> hits(37, 0);
    pool.parallel_for(hits.size(), 1, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    ASSERT_EQ(std::count(hits.begin(), hits.end(), 1), 37) << "round " << round;
    if (round % 200 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

TEST(Tensor, BufferSizeIsChecked) {
  const TensorBuffer b = make_buffer(DType::BF16, {3, 5});
  EXPECT_EQ(b.bytes.size(), 30u);
  EXPECT_EQ(shape_str(b.shape), "[3, 5]");
  EXPECT_THROW(make_buffer(DType::F32, {1ll << 40, 1ll << 40}), Error);
}

TEST(Progress, CountsUseUnitPrefixes) {
  EXPECT_EQ(human_count(950), "950");
  EXPECT_EQ(human_count(1234), "1.2k");
  EXPECT_EQ(human_count(8.19e9), "8.2G");
}

// Work in weights: done/total, bar, percent, rate and the ETA of the remaining work at that rate, and RSS.
TEST(Progress, LineShowsRateEtaAndRss) {
  const std::string line = format_progress({"quantize", "weights", 2'000'000'000, 8'000'000'000, 50.0, 3ull << 30,
                                            "model.layers.3.mlp.up_proj.weight", false});
  EXPECT_EQ(line,
            "quantize: 2.0G/8.0G weights [######..................]  25% 40.0M weights/s ETA 150s RSS 3.0 GiB "
            "model.layers.3.mlp.up_proj.weight");
}

// Bytes print as sizes; the final line gives the time taken instead of an ETA, without the note.
TEST(Progress, FinalLineInBytes) {
  const std::string line = format_progress({"hash sources", "B", 3ull << 30, 3ull << 30, 2.0, 12ull << 20, "x", true});
  EXPECT_EQ(line, "hash sources: 3.0 GiB/3.0 GiB [########################] 100% 1.5 GiB/s in 2.0s RSS 12.0 MiB");
}

// Nothing done yet: no rate, so no ETA.
TEST(Progress, NoEtaBeforeTheFirstUnit) {
  const std::string line = format_progress({"load", "weights", 0, 100, 3.0, 1 << 20, "", false});
  EXPECT_EQ(line.find("ETA"), std::string::npos) << line;
  EXPECT_NE(line.find("  0%"), std::string::npos) << line;
}

TEST(Progress, ResidentMemorySplitsAnonymousAndFile) {
  start_rss_sampling();
  std::vector<char> block(64 << 20, 1);  // touched: 64 MiB anonymous
  const ResidentMemory now = current_resident();
  EXPECT_GE(now.anon, 64u << 20);
  EXPECT_GT(now.file, 0u);  // the test binary's own pages
  EXPECT_GE(now.total, now.anon + now.file);
  const ResidentMemory peak = peak_resident();
  EXPECT_GE(peak.anon, now.anon);
  EXPECT_GE(peak.total, peak.anon);
  EXPECT_EQ(block[12345], 1);
}

}  // namespace
}  // namespace lowbit
