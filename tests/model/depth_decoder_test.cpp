// The seed 004 depth decoder against the seed's own code on MLX (tests/model/fixtures/depth/<variant>/, written by
// scripts/make_depth_fixtures.py; depth_fixture.h), and its refusals of bad models and inputs.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/model/depth_decoder.h"
#include "model/depth_fixture.h"

namespace lowbit::model {
namespace {

using namespace testing;  // the fixtures' helpers (depth_fixture.h)

class DepthFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DepthFixture, MatchesTheSeedOnMlx) { expect_matches_fixture(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Variants, DepthFixture, ::testing::Values("dense_f16", "quant_f16", "dense_bf16", "dense_f32"),
                         [](const auto& info) { return info.param; });

// Runs `fn`, which must throw a lowbit::Error of `code` whose message names `name` in quotes.
template <class Fn>
void expect_refused(Fn fn, Errc code, const std::string& name) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected an error naming '" << name << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    EXPECT_EQ(exit_code(e.code()), 3) << e.what();
  }
}

class DepthRefusals : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("lowbit_depth_refusals_{}", ::getpid());
    write_model(dir_ / "good", false, DType::F16);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Writes the inputs of 2 frames after `edit`, and runs them.
  void run_inputs(const std::function<void(Tensors&)>& edit) {
    auto in = make_inputs("refusals", 2, true, true);
    edit(in);
    write_named(dir_ / "in.safetensors", in);
    auto model = DepthDecoder::load(dir_ / "good");
    run_depth_file(model, dir_ / "in.safetensors", dir_ / "out.safetensors", false);
  }
  static TensorBuffer& named(Tensors& t, const std::string& name) {
    for (auto& [n, b] : t)
      if (n == name) return b;
    throw std::runtime_error("no tensor " + name);
  }
  static void drop(Tensors& t, const std::string& name) {
    std::erase_if(t, [&](const auto& e) { return e.first == name; });
  }
  static void load_edited(const Edit& edit, bool quantized = false) {
    write_model(dir_ / "bad", quantized, DType::F16, edit);
    DepthDecoder::load(dir_ / "bad");
  }
  static fs::path dir_;
};
fs::path DepthRefusals::dir_;

TEST_F(DepthRefusals, GoodInputsRun) {
  run_inputs([](Tensors&) {});
  const auto out = io::SafetensorsFile::open(dir_ / "out.safetensors");
  EXPECT_EQ(out.tensor("codes").shape, (Shape{2, 32}));
  EXPECT_FALSE(out.contains("logits"));
}

TEST_F(DepthRefusals, BadInputsNameTheTensor) {
  expect_refused([&] { run_inputs([](Tensors& t) {
                         named(t, "h") = make_buffer(DType::F16, {2, kHidden});
                       }); },
                 Errc::dtype, "h");
  expect_refused([&] { run_inputs([](Tensors& t) {
                         named(t, "h") = make_buffer(DType::BF16, {2, kHidden + 1});
                       }); },
                 Errc::shape, "h");
  expect_refused([&] { run_inputs([](Tensors& t) { named(t, "cb0") = make_buffer(DType::I32, {3}); }); }, Errc::shape,
                 "cb0");
  expect_refused([&] { run_inputs([](Tensors& t) { named(t, "cb0").as<int32_t>()[1] = 2048; }); }, Errc::reserved_code,
                 "cb0");
  expect_refused([&] { run_inputs([](Tensors& t) { drop(t, "cb0"); }); }, Errc::format, "cb0");
  expect_refused([&] { run_inputs([](Tensors& t) {
                         named(t, "uniform") = make_buffer(DType::F32, {2, 32, 2048});
                       }); },
                 Errc::shape, "uniform");
  expect_refused([&] { run_inputs([](Tensors& t) {
                         named(t, "uniform") = make_buffer(DType::F16, {2, 31, 2048});
                       }); },
                 Errc::dtype, "uniform");
  expect_refused([&] { run_inputs([](Tensors& t) {
                         named(t, "force") = make_buffer(DType::I32, {2, 31});
                       }); },
                 Errc::shape, "force");
  expect_refused([&] { run_inputs([](Tensors& t) { named(t, "force").as<int32_t>()[5] = -1; }); }, Errc::reserved_code,
                 "force");
  expect_refused([&] { run_inputs([](Tensors& t) { named(t, "speaker") = make_buffer(DType::F32, {kD + 16}); }); },
                 Errc::shape, "speaker");
  expect_refused([&] { run_inputs([](Tensors& t) { named(t, "speaker") = make_buffer(DType::I32, {kD}); }); },
                 Errc::dtype, "speaker");
  expect_refused([&] { run_inputs([](Tensors& t) { t.emplace_back("extra", make_buffer(DType::F32, {1})); }); },
                 Errc::format, "extra");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_FALSE(e.path().filename().string().starts_with(".out.safetensors.tmp")) << e.path();
}

TEST_F(DepthRefusals, BadModelsNameTheTensor) {
  expect_refused([] { load_edited([](Tensors& t, nlohmann::json&) { drop(t, "heads.3.weight"); }); }, Errc::format,
                 "heads.3.weight");
  expect_refused(
      [] {
        load_edited([](Tensors& t, nlohmann::json&) {
          named(t, "groups.2.1.o.weight") = make_buffer(DType::BF16, {kD, kD + 1});
        });
      },
      Errc::shape, "groups.2.1.o.weight");
  expect_refused(
      [] { load_edited([](Tensors& t, nlohmann::json&) { named(t, "norm.bias") = make_buffer(DType::I32, {kD}); }); },
      Errc::dtype, "norm.bias");
  expect_refused(
      [] {
        load_edited(
            [](Tensors& t, nlohmann::json&) { t.emplace_back("groups.11.0.o.weight", make_buffer(DType::BF16, {1})); });
      },
      Errc::format, "groups.11.0.o.weight");
  expect_refused(
      [] {
        load_edited(
            [](Tensors& t, nlohmann::json&) {
              named(t, "in_proj.weight.scales") = make_buffer(DType::F16, {kD, kHidden / 32});
            },
            true);
      },
      Errc::shape, "in_proj.weight.scales");
  expect_refused(
      [] {
        load_edited([](Tensors&, nlohmann::json& r) { r["groups.0.1.qkv.weight"]["shape"] = {kD, kD}; }, true);
      },
      Errc::shape, "groups.0.1.qkv.weight");
  expect_refused(
      [] {
        load_edited(
            [](Tensors& t, nlohmann::json& r) {
              r["level_emb.weight"] = {{"bits", 4}, {"group_size", 64}, {"shape", {32, kD}}};
              t.emplace_back("level_emb.weight.q", make_buffer(DType::U32, {32, kD / 8}));
            },
            true);
      },
      Errc::unsupported, "level_emb.weight");
}

TEST_F(DepthRefusals, CliExitsThreeNamingTheTensor) {
  auto in = make_inputs("refusals", 2, false, false);
  named(in, "uniform") = make_buffer(DType::F32, {2, 31, 2047});
  write_named(dir_ / "cli_in.safetensors", in);
  const std::string cmd = fmt::format("{} depth {} --inputs {} --out {} 2> {}", LOWBIT_CLI, (dir_ / "good").string(),
                                      (dir_ / "cli_in.safetensors").string(), (dir_ / "cli_out.safetensors").string(),
                                      (dir_ / "cli_err.txt").string());
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  std::ifstream err(dir_ / "cli_err.txt");
  std::string line;
  std::getline(err, line);
  EXPECT_NE(line.find("'uniform'"), std::string::npos) << line;
  EXPECT_FALSE(fs::exists(dir_ / "cli_out.safetensors"));
}

}  // namespace
}  // namespace lowbit::model
