#include "lowbit/io/json.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "lowbit/core/error.h"

namespace lowbit::io {
namespace {

Errc parse_error(std::string_view text, size_t max_depth = kJsonMaxDepth) {
  try {
    parse_json(text, "test", "t.json", max_depth);
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "accepted: " << text;
  return Errc::internal;
}

TEST(Json, ParsesStrictJson) {
  const auto v = parse_json(R"( {"a":[1,{"b":"c"}],"d":{"a":1}} )", "test", "t.json");
  EXPECT_EQ(v["a"][1]["b"], "c");
  EXPECT_EQ(v["d"]["a"], 1);  // the same key in different objects is fine
  EXPECT_EQ(parse_json("[[[]]]", "test", "t.json", 3).size(), 1u);
}

TEST(Json, RejectsSyntaxDuplicatesAndDepth) {
  EXPECT_EQ(parse_error("{"), Errc::format);
  EXPECT_EQ(parse_error("{} x"), Errc::format);
  EXPECT_EQ(parse_error("// c\n{}"), Errc::format);
  EXPECT_EQ(parse_error("NaN"), Errc::format);
  EXPECT_EQ(parse_error(R"({"a":1,"a":1})"), Errc::duplicate);
  EXPECT_EQ(parse_error(R"({"x":[{"a":1,"b":{"c":1},"a":2}]})"), Errc::duplicate);
  EXPECT_EQ(parse_error("[[[[]]]]", 3), Errc::limit);
  EXPECT_EQ(parse_error(std::string(100000, '[')), Errc::limit);
}

TEST(Json, ErrorsAreOneLineAndNameTheSource) {
  try {
    parse_json("{\"a\":\n\"\x01\xfe\"}", "op", "dir/t.json");
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("[op] dir/t.json: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_EQ(quote("a\nb\"c"), R"("a\nb\"c")");
  EXPECT_EQ(quote(std::string(500, 'x')).size(), 125u);
}

TEST(Json, ReadsFilesWithinALimit) {
  const auto path = std::filesystem::temp_directory_path() / fmt::format("lowbit_json_test_{}.json", ::getpid());
  std::ofstream(path) << R"({"k":"v"})";
  EXPECT_EQ(read_json_file(path, "test", 100)["k"], "v");
  try {
    read_json_file(path, "test", 5);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::limit);
  }
  std::filesystem::remove(path);
  try {
    read_json_file(path, "test", 100);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::missing_file);
  }
}

}  // namespace
}  // namespace lowbit::io
