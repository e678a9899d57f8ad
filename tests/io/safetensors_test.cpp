#include "lowbit/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "lowbit/core/error.h"

namespace lowbit::io {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> to_bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// 8-byte little-endian length, the header text, then `data_bytes` bytes of data.
std::vector<std::byte> build_file(std::string_view header, size_t data_bytes, uint64_t declared_length) {
  std::vector<std::byte> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((declared_length >> (8 * i)) & 0xff);
  const auto h = to_bytes(header);
  out.insert(out.end(), h.begin(), h.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<std::byte>(i * 7 + 1));
  return out;
}

std::vector<std::byte> build_file(std::string_view header, size_t data_bytes) {
  return build_file(header, data_bytes, header.size());
}

// The error a header is rejected with; fails the test when it is accepted.
Error rejection(std::span<const std::byte> file) {
  try {
    parse_safetensors_header(file, "bad.safetensors");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "accepted";
  return Error(Errc::internal, "accepted");
}

Errc rejection_code(std::string_view header, size_t data_bytes) {
  return rejection(build_file(header, data_bytes)).code();
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           fmt::format("lowbit_st_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_text(const fs::path& path, std::string_view text) {
    std::ofstream(path, std::ios::binary) << text;
  }

  fs::path dir_;
};

TensorBuffer pattern_tensor(DType dtype, Shape shape, int seed) {
  TensorBuffer b = make_buffer(dtype, std::move(shape));
  for (size_t i = 0; i < b.bytes.size(); ++i) b.bytes[i] = static_cast<std::byte>(i * 31 + seed);
  return b;
}

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// ---- accepted headers ----------------------------------------------------------------------------------------

TEST(SafetensorsHeader, ParsesEntriesInOffsetOrderWithMetadata) {
  const auto file = build_file(
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[2,10]},)"
      R"("__metadata__":{"format":"pt"},"a":{"shape":[1],"data_offsets":[0,2],"dtype":"BF16"}}   )",
      10);
  const auto h = parse_safetensors_header(file, "x");
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].name, "a");
  EXPECT_EQ(h.entries[0].dtype, DType::BF16);
  EXPECT_EQ(h.entries[1].name, "b");
  EXPECT_EQ(h.entries[1].shape, Shape{2});
  EXPECT_EQ(h.entries[1].begin, 2u);
  EXPECT_EQ(h.entries[1].end, 10u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_start, file.size() - 10);
}

TEST(SafetensorsHeader, AcceptsEmptyScalarAndZeroSizedTensors) {
  EXPECT_TRUE(parse_safetensors_header(build_file("{}", 0), "x").entries.empty());
  const auto h = parse_safetensors_header(
      build_file(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                 R"("z2":{"dtype":"F16","shape":[4,0],"data_offsets":[8,8]},)"
                 R"("z1":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}})",
                 8),
      "x");
  ASSERT_EQ(h.entries.size(), 3u);
  EXPECT_EQ(h.entries[0].name, "s");
  EXPECT_EQ(h.entries[1].name, "z1");  // zero-sized at the same offset: ordered by name
  EXPECT_EQ(h.entries[2].name, "z2");
}

// ---- rejected headers: every rule, with its error class --------------------------------------------------------

TEST(SafetensorsHeader, RejectsBadLengthPrefix) {
  EXPECT_EQ(rejection(to_bytes("")).code(), Errc::truncated);
  EXPECT_EQ(rejection(to_bytes(std::string_view("\x02\0\0\0\0\0\0", 7))).code(), Errc::truncated);
  EXPECT_EQ(rejection(build_file("{}", 0, 3)).code(), Errc::truncated);  // length runs past the end
  EXPECT_EQ(rejection(build_file("{}", 0, 100'000'001)).code(), Errc::limit);
  EXPECT_EQ(rejection(build_file("{}", 0, ~uint64_t{0})).code(), Errc::limit);
  EXPECT_EQ(rejection(build_file("", 0)).code(), Errc::format);  // zero-length header
}

TEST(SafetensorsHeader, RejectsMalformedJson) {
  EXPECT_EQ(rejection_code(" {}", 0), Errc::format);       // must start with '{'
  EXPECT_EQ(rejection_code("[]", 0), Errc::format);
  EXPECT_EQ(rejection_code("{", 0), Errc::format);
  EXPECT_EQ(rejection_code("{}x", 0), Errc::format);       // trailing garbage
  EXPECT_EQ(rejection_code(std::string("{}\0\0", 4), 0), Errc::format);  // NUL padding is not whitespace
  EXPECT_EQ(rejection_code("{} {}", 0), Errc::format);
  EXPECT_EQ(rejection_code("{/*c*/}", 0), Errc::format);   // no comments
  EXPECT_EQ(rejection_code("{\"a\xff\":1}", 0), Errc::format);  // invalid UTF-8
  EXPECT_EQ(rejection_code(R"({"__metadata__":{"k":"v"},"__metadata__":{}})", 0), Errc::duplicate);
  EXPECT_EQ(rejection_code(R"({"__metadata__":{"a":[[[[[[[[1]]]]]]]]}})", 0), Errc::limit);  // nesting depth
}

TEST(SafetensorsHeader, RejectsDuplicateNames) {
  const std::string entry = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_EQ(rejection_code(R"({"t":)" + entry + R"(,"t":)" + entry + "}", 1), Errc::duplicate);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
            Errc::duplicate);
  EXPECT_EQ(rejection_code(R"({"__metadata__":{"k":"a","k":"b"}})", 0), Errc::duplicate);
}

TEST(SafetensorsHeader, RejectsBadMetadata) {
  EXPECT_EQ(rejection_code(R"({"__metadata__":[]})", 0), Errc::format);
  EXPECT_EQ(rejection_code(R"({"__metadata__":null})", 0), Errc::format);
  EXPECT_EQ(rejection_code(R"({"__metadata__":{"k":1}})", 0), Errc::format);
  EXPECT_EQ(rejection_code(R"({"__metadata__":{"k":{"x":"y"}}})", 0), Errc::format);
}

TEST(SafetensorsHeader, RejectsBadEntryFields) {
  EXPECT_EQ(rejection_code(R"({"t":[]})", 0), Errc::format);
  EXPECT_EQ(rejection_code(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", 1), Errc::format);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"U8","data_offsets":[0,1]}})", 1), Errc::format);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"U8","shape":[1]}})", 1), Errc::format);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0}})", 1), Errc::format);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"U8","shape":[1],"offsets":[0,1]}})", 1), Errc::format);
}

TEST(SafetensorsHeader, RejectsBadDtype) {
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4), Errc::dtype);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"F4","shape":[1],"data_offsets":[0,1]}})", 1), Errc::dtype);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"","shape":[1],"data_offsets":[0,1]}})", 1), Errc::dtype);
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":3,"shape":[1],"data_offsets":[0,1]}})", 1), Errc::format);
}

TEST(SafetensorsHeader, RejectsBadShape) {
  const auto with_shape = [](std::string_view shape, size_t bytes) {
    return rejection_code(fmt::format(R"({{"t":{{"dtype":"U8","shape":{},"data_offsets":[0,{}]}}}})", shape, bytes),
                          bytes);
  };
  EXPECT_EQ(with_shape("4", 4), Errc::format);
  EXPECT_EQ(with_shape("[-4]", 4), Errc::shape);
  EXPECT_EQ(with_shape("[4.0]", 4), Errc::format);
  EXPECT_EQ(with_shape("[\"4\"]", 4), Errc::format);
  EXPECT_EQ(with_shape("[[4]]", 4), Errc::format);
  EXPECT_EQ(with_shape("[9223372036854775808]", 0), Errc::overflow);   // 2^63: not an int64
  EXPECT_EQ(with_shape("[18446744073709551616]", 0), Errc::format);    // 2^64: parsed as a float
  EXPECT_EQ(with_shape("[1,1,1,1,1,1,1,1,1]", 1), Errc::limit);         // rank 9
  EXPECT_EQ(with_shape("[4294967296,4294967296]", 0), Errc::overflow);  // numel overflows 64 bits
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
            Errc::overflow);  // numel x 8 overflows
  EXPECT_EQ(with_shape("[2,3]", 5), Errc::shape);  // span differs from numel x size
  EXPECT_EQ(rejection_code(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), Errc::shape);
}

TEST(SafetensorsHeader, RejectsBadOffsets) {
  const auto with_offsets = [](std::string_view offsets, size_t bytes) {
    return rejection_code(fmt::format(R"({{"t":{{"dtype":"U8","shape":[0],"data_offsets":{}}}}})", offsets), bytes);
  };
  EXPECT_EQ(with_offsets("[0]", 0), Errc::format);
  EXPECT_EQ(with_offsets("[0,0,0]", 0), Errc::format);
  EXPECT_EQ(with_offsets("{}", 0), Errc::format);
  EXPECT_EQ(with_offsets("[-1,0]", 0), Errc::layout);
  EXPECT_EQ(with_offsets("[0.0,0]", 0), Errc::format);
  EXPECT_EQ(with_offsets("[5,4]", 0), Errc::layout);  // end before begin
}

TEST(SafetensorsHeader, RejectsHolesOverlapsAndTrailingBytes) {
  const std::string a = R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  EXPECT_EQ(rejection_code("{" + a + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[5,7]}})", 7), Errc::layout);
  EXPECT_EQ(rejection_code("{" + a + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})", 5), Errc::layout);
  EXPECT_EQ(rejection_code("{" + a + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4), Errc::layout);
  EXPECT_EQ(rejection_code(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3), Errc::layout);
  EXPECT_EQ(rejection_code("{" + a + "}", 5), Errc::layout);    // a trailing byte
  EXPECT_EQ(rejection_code("{}", 1), Errc::layout);             // data with no tensor
  EXPECT_EQ(rejection_code("{" + a + "}", 3), Errc::truncated);  // data cut short
  EXPECT_EQ(rejection_code(R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}})", 0),
            Errc::layout);
}

TEST(SafetensorsHeader, ErrorsNameTheFileAndTheTensor) {
  const Error e = rejection(build_file(R"({"w.0":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0));
  const std::string message = e.what();
  EXPECT_NE(message.find("[read_safetensors]"), std::string::npos) << message;
  EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("\"w.0\""), std::string::npos) << message;
  EXPECT_NE(message.find("shape[0]"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(SafetensorsHeader, RejectsTooManyTensorsBeforeValidatingThem) {
  std::string header = "{";
  for (size_t i = 0; i <= kSafetensorsMaxTensors; ++i) header += fmt::format("{}\"{}\":0", i ? "," : "", i);
  header += "}";
  EXPECT_EQ(rejection_code(header, 0), Errc::limit);
}

// ---- writing and reading files -----------------------------------------------------------------------------

using SafetensorsFileTest = TempDir;

TEST_F(SafetensorsFileTest, RoundTripsEveryDtypeZeroCopyAndAligned) {
  std::vector<TensorBuffer> buffers;
  std::vector<std::pair<std::string, TensorView>> tensors;
  int seed = 0;
  for (const auto& row : kDTypes) buffers.push_back(pattern_tensor(row.dtype, {2, 3}, ++seed));
  buffers.push_back(pattern_tensor(DType::F32, {}, 99));      // scalar
  buffers.push_back(pattern_tensor(DType::BF16, {0, 5}, 0));  // empty
  for (size_t i = 0; i < buffers.size(); ++i)
    tensors.emplace_back(i < kDTypes.size() ? fmt::format("t.{}", kDTypes[i].name) : fmt::format("extra.{}", i),
                         buffers[i].view());
  const fs::path path = dir_ / "all.safetensors";
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "line\nbreak \"quoted\" ü"}});

  const auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "line\nbreak \"quoted\" ü");
  const auto names = f.names();
  EXPECT_EQ(names.size(), tensors.size());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(f.header().data_start % 8, 0u);
  for (const auto& [name, view] : tensors) {
    ASSERT_TRUE(f.contains(name)) << name;
    const TensorView got = f.tensor(name);
    EXPECT_EQ(got.dtype, view.dtype) << name;
    EXPECT_EQ(got.shape, view.shape) << name;
    EXPECT_TRUE(same_bytes(got.bytes, view.bytes)) << name;
    if (!got.bytes.empty()) {
      const auto* base = f.file().bytes().data();
      EXPECT_TRUE(got.bytes.data() >= base && got.bytes.data() < base + f.file().size()) << name << " is a copy";
      EXPECT_EQ(reinterpret_cast<uintptr_t>(got.bytes.data()) % dtype_size(got.dtype), 0u) << name;
    }
  }
  EXPECT_FALSE(f.contains("absent"));
  try {
    f.tensor("absent");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format);
  }
}

// Byte sequences from the reference implementation's own tests (safetensors/src/tensor.rs).
TEST_F(SafetensorsFileTest, WritesTheReferenceBytes) {
  const auto read_all = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  TensorBuffer attn = make_buffer(DType::F32, {1, 2, 3});
  for (int i = 0; i < 6; ++i) attn.as<float>()[i] = static_cast<float>(i);
  write_safetensors(dir_ / "a.safetensors", {{"attn.0", attn.view()}});
  std::string expected = std::string("\x40\0\0\0\0\0\0\0", 8) +
                         R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  expected.append(reinterpret_cast<const char*>(attn.bytes.data()), attn.bytes.size());
  EXPECT_EQ(read_all(dir_ / "a.safetensors"), expected);

  write_safetensors(dir_ / "e.safetensors", {});
  EXPECT_EQ(read_all(dir_ / "e.safetensors"), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  write_safetensors(dir_ / "m.safetensors", {}, {{"framework", "pt"}});
  EXPECT_EQ(read_all(dir_ / "m.safetensors"),
            std::string("\x28\0\0\0\0\0\0\0", 8) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
}

// tests/io/fixtures/reference.safetensors was written by Python's `safetensors` (make_reference.py).
TEST_F(SafetensorsFileTest, ReadsAndReproducesTheReferenceFixture) {
  const fs::path fixture = fs::path(LOWBIT_SOURCE_DIR) / "tests/io/fixtures/reference.safetensors";
  const auto f = SafetensorsFile::open(fixture);
  EXPECT_EQ(f.metadata().at("format"), "np");
  EXPECT_EQ(f.names().size(), 14u);
  const TensorView f32 = f.tensor("f32");
  EXPECT_EQ(f32.shape, (Shape{3, 2}));
  EXPECT_EQ(load_float(DType::F32, f32.bytes.data(), 5), 2.5f);
  const TensorView f16 = f.tensor("f16");
  EXPECT_EQ(load_float(DType::F16, f16.bytes.data(), 3), 0.75f);
  EXPECT_EQ(f.tensor("scalar").shape, Shape{});
  EXPECT_EQ(f.tensor("empty").shape, (Shape{0, 3}));
  EXPECT_EQ(f.tensor("bool").dtype, DType::BOOL);
  int64_t i64[3];
  std::memcpy(i64, f.tensor("i64").bytes.data(), sizeof i64);
  EXPECT_EQ(i64[0], -1);
  EXPECT_EQ(i64[2], 1);

  // Writing the same tensors back gives the same bytes.
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const auto& name : f.names()) tensors.emplace_back(name, f.tensor(name));
  write_safetensors(dir_ / "again.safetensors", tensors, f.metadata());
  const auto again = MappedFile::open(dir_ / "again.safetensors");
  EXPECT_TRUE(same_bytes(again.bytes(), f.file().bytes()));
}

TEST_F(SafetensorsFileTest, EveryPrefixOfAValidFileIsTruncated) {
  const auto f = SafetensorsFile::open(fs::path(LOWBIT_SOURCE_DIR) / "tests/io/fixtures/reference.safetensors");
  const auto bytes = f.file().bytes();
  for (size_t n = 0; n < bytes.size(); ++n) EXPECT_EQ(rejection(bytes.first(n)).code(), Errc::truncated) << n;
}

TEST_F(SafetensorsFileTest, StreamingWriterWritesInDeclarationOrder) {
  const TensorBuffer big = pattern_tensor(DType::U8, {3 << 20}, 5);  // larger than the write buffer
  const TensorBuffer small = pattern_tensor(DType::I16, {7}, 6);
  const fs::path path = dir_ / "s.safetensors";
  SafetensorsWriter w(path, {{"k", "v"}});
  w.declare("z.small", DType::I16, {7});
  w.declare("a.big", DType::U8, {3 << 20});
  w.declare("m.none", DType::F32, {0});
  w.write("z.small", small.bytes);
  w.write("a.big", big.bytes);
  w.write("m.none", {});
  const uint64_t size = w.finish();
  EXPECT_EQ(size, fs::file_size(path));
  const auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.header().entries[0].name, "z.small");
  EXPECT_TRUE(same_bytes(f.tensor("a.big").bytes, big.bytes));
  EXPECT_TRUE(same_bytes(f.tensor("z.small").bytes, small.bytes));
}

Errc writer_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error";
  return Errc::internal;
}

TEST_F(SafetensorsFileTest, StreamingWriterRejectsMisuse) {
  const TensorBuffer t = pattern_tensor(DType::F32, {2}, 1);
  const fs::path path = dir_ / "w.safetensors";
  SafetensorsWriter w(path);
  w.declare("a", DType::F32, {2});
  w.declare("b", DType::F32, {2});
  EXPECT_EQ(writer_error([&] { w.declare("a", DType::U8, {1}); }), Errc::duplicate);
  EXPECT_EQ(writer_error([&] { w.declare("__metadata__", DType::U8, {1}); }), Errc::format);
  EXPECT_EQ(writer_error([&] { w.declare("bad\xff", DType::U8, {1}); }), Errc::format);
  EXPECT_EQ(writer_error([&] { w.declare("neg", DType::U8, {-1}); }), Errc::shape);
  EXPECT_EQ(writer_error([&] { w.declare("deep", DType::U8, Shape(9, 1)); }), Errc::limit);
  EXPECT_EQ(writer_error([&] { w.declare("huge", DType::F64, {int64_t{1} << 62}); }), Errc::overflow);
  EXPECT_EQ(writer_error([&] { w.write("b", t.bytes); }), Errc::internal);  // out of order
  EXPECT_EQ(writer_error([&] { w.write("a", std::span(t.bytes).first(4)); }), Errc::internal);  // wrong size
  EXPECT_EQ(writer_error([&] { w.finish(); }), Errc::internal);  // nothing written yet
  w.write("a", t.bytes);
  EXPECT_EQ(writer_error([&] { w.declare("c", DType::F32, {2}); }), Errc::internal);  // after writing started
  EXPECT_EQ(writer_error([&] { w.finish(); }), Errc::internal);  // b not written
  w.write("b", t.bytes);
  EXPECT_EQ(writer_error([&] { w.write("b", t.bytes); }), Errc::internal);  // all written
  w.finish();
  EXPECT_EQ(writer_error([&] { w.finish(); }), Errc::internal);
  EXPECT_EQ(SafetensorsFile::open(path).names(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(SafetensorsFileTest, AbandonedWriterRemovesItsFile) {
  const fs::path path = dir_ / "gone.safetensors";
  {
    SafetensorsWriter w(path);
    w.declare("a", DType::U8, {1});
    EXPECT_TRUE(fs::exists(path));
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsFileTest, WriterRefusesSymlinkAndReaderRefusesSymlink) {
  write_safetensors(dir_ / "real.safetensors", {});
  fs::create_symlink(dir_ / "real.safetensors", dir_ / "link.safetensors");
  EXPECT_EQ(writer_error([&] { SafetensorsFile::open(dir_ / "link.safetensors"); }), Errc::unsafe_path);
  EXPECT_EQ(writer_error([&] { SafetensorsWriter w(dir_ / "link.safetensors"); }), Errc::io);
  EXPECT_TRUE(fs::exists(dir_ / "real.safetensors"));
}

// ---- checkpoints -------------------------------------------------------------------------------------------

class SafetensorsCheckpointTest : public TempDir {
 protected:
  void SetUp() override {
    TempDir::SetUp();
    a_ = pattern_tensor(DType::F32, {2, 2}, 1);
    b_ = pattern_tensor(DType::BF16, {3}, 2);
    c_ = pattern_tensor(DType::U8, {5}, 3);
  }
  // Two shards: a and b in the first, c in the second; `index` is written as given.
  void write_sharded(std::string_view index) {
    write_safetensors(dir_ / "model-00001-of-00002.safetensors", {{"a", a_.view()}, {"b", b_.view()}});
    write_safetensors(dir_ / "model-00002-of-00002.safetensors", {{"c", c_.view()}});
    write_text(dir_ / "model.safetensors.index.json", index);
  }
  static constexpr std::string_view kGoodIndex =
      R"({"metadata":{"total_size":27},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
      R"("b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})";
  Errc open_error(const fs::path& p) {
    return writer_error([&] { SafetensorsCheckpoint::open(p); });
  }
  TensorBuffer a_, b_, c_;
};

TEST_F(SafetensorsCheckpointTest, OpensShardedThroughDirectoryOrIndex) {
  write_sharded(kGoodIndex);
  for (const fs::path& p : {dir_, dir_ / "model.safetensors.index.json"}) {
    const auto ck = SafetensorsCheckpoint::open(p);
    EXPECT_EQ(ck.shards().size(), 2u);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_TRUE(same_bytes(ck.tensor("a").bytes, a_.bytes));
    EXPECT_TRUE(same_bytes(ck.tensor("c").bytes, c_.bytes));
    EXPECT_EQ(ck.tensor("b").dtype, DType::BF16);
    EXPECT_FALSE(ck.contains("d"));
  }
}

TEST_F(SafetensorsCheckpointTest, OpensSingleFile) {
  write_safetensors(dir_ / "model.safetensors", {{"a", a_.view()}});
  for (const fs::path& p : {dir_, dir_ / "model.safetensors"}) {
    const auto ck = SafetensorsCheckpoint::open(p);
    EXPECT_EQ(ck.names(), std::vector<std::string>{"a"});
    EXPECT_TRUE(same_bytes(ck.tensor("a").bytes, a_.bytes));
  }
  EXPECT_EQ(writer_error([&] { SafetensorsCheckpoint::open(dir_).tensor("zz"); }), Errc::format);
}

TEST_F(SafetensorsCheckpointTest, RejectsUnsafeShardNames) {
  for (std::string_view shard : {"../model-00002-of-00002.safetensors", "sub/x.safetensors", "/etc/passwd", "..",
                                 ".", "", "a\\\\b"}) {
    write_sharded(fmt::format(R"({{"weight_map":{{"c":"{}"}}}})", shard));
    EXPECT_EQ(open_error(dir_), Errc::unsafe_path) << shard;
  }
}

TEST_F(SafetensorsCheckpointTest, RejectsInconsistentIndex) {
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  // c mapped to the shard that does not hold it (and then missing from its own)
  write_sharded(fmt::format(R"({{"weight_map":{{"a":"{0}","b":"{0}","c":"{0}"}}}})", s1, s2));
  EXPECT_EQ(open_error(dir_), Errc::format);
  // b held by a shard but not in the weight map
  write_sharded(fmt::format(R"({{"weight_map":{{"a":"{0}","c":"{1}"}}}})", s1, s2));
  EXPECT_EQ(open_error(dir_), Errc::format);
  // a tensor in the map that no shard holds
  write_sharded(fmt::format(R"({{"weight_map":{{"a":"{0}","b":"{0}","c":"{1}","d":"{1}"}}}})", s1, s2));
  EXPECT_EQ(open_error(dir_), Errc::format);
  // a shard that does not exist
  write_sharded(fmt::format(R"({{"weight_map":{{"a":"{0}","b":"{0}","c":"missing.safetensors"}}}})", s1));
  EXPECT_EQ(open_error(dir_), Errc::missing_file);
  // a key repeated in the index
  write_sharded(fmt::format(R"({{"weight_map":{{"a":"{0}","b":"{0}","c":"{1}","c":"{1}"}}}})", s1, s2));
  EXPECT_EQ(open_error(dir_), Errc::duplicate);
  // wrong types
  write_sharded(R"({"weight_map":[]})");
  EXPECT_EQ(open_error(dir_), Errc::format);
  write_sharded(R"({"weight_map":{"c":2}})");
  EXPECT_EQ(open_error(dir_), Errc::format);
  write_sharded(R"({"metadata":1,"weight_map":{}})");
  EXPECT_EQ(open_error(dir_), Errc::format);
  write_sharded(R"({"weights":{}})");
  EXPECT_EQ(open_error(dir_), Errc::format);
  write_sharded("not json");
  EXPECT_EQ(open_error(dir_), Errc::format);
}

TEST_F(SafetensorsCheckpointTest, RejectsATensorInTwoShards) {
  write_sharded(kGoodIndex);
  write_safetensors(dir_ / "model-00002-of-00002.safetensors", {{"a", a_.view()}, {"c", c_.view()}});
  EXPECT_EQ(open_error(dir_), Errc::duplicate);
}

TEST_F(SafetensorsCheckpointTest, RejectsSymlinkedShardAndEmptyDirectory) {
  EXPECT_EQ(open_error(dir_), Errc::missing_file);
  write_sharded(kGoodIndex);
  fs::rename(dir_ / "model-00002-of-00002.safetensors", dir_ / "elsewhere.safetensors");
  fs::create_symlink(dir_ / "elsewhere.safetensors", dir_ / "model-00002-of-00002.safetensors");
  EXPECT_EQ(open_error(dir_), Errc::unsafe_path);
}

}  // namespace
}  // namespace lowbit::io
