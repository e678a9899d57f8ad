#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <fcntl.h>

#include "artifact/artifact_fixture.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/json.h"
#include "lowbit/model/chat.h"
#include "lowbit/model/hf.h"
#include "lowbit/model/mlx.h"
#include "lowbit/quant/pipeline.h"
#include "model/tiny_model.h"
#include "quant/quant_fixture.h"

namespace lowbit::quant {
namespace {

namespace fs = std::filesystem;

using testing::TempDir;

// A small HF-layout source model; by default with an MLP width that needs padding (40 is no multiple of any
// group).
fs::path write_source(const fs::path& dir, int64_t hidden = 40) {
  model::ModelConfig c = model::testing::tiny_config();
  c.dim = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.hidden_dim = hidden;
  c.vocab = 48;
  const auto m = model::testing::tiny_model(c, 3);
  model::write_hf(*m, dir / "src");
  return dir / "src";
}

std::vector<float> logits_of(const model::Model& m, const std::vector<int32_t>& tokens) {
  model::KvCache cache(m.config, static_cast<int64_t>(tokens.size()));
  std::vector<float> out(tokens.size() * static_cast<size_t>(m.config.vocab));
  model::forward(m, cache, tokens, 0, out.data(), true, default_pool());
  return out;
}

TEST(Quantize, AffineArtifactIsAnMlxCheckpoint) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path, 128);
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");
  const QuantizeReport r = quantize(o);
  EXPECT_GT(r.linear_bits_per_weight(), 4.0);
  EXPECT_LT(r.linear_bits_per_weight(), 6.0);

  const auto config = io::read_json_file(o.destination / "config.json", "test", 1 << 20);
  ASSERT_TRUE(model::is_mlx_quantized(config));
  EXPECT_EQ(config["quantization"]["bits"], 4);
  EXPECT_EQ(config["quantization"]["group_size"], 64);

  const auto via_manifest = model::load_model(o.destination);
  const auto via_mlx = model::load_mlx(o.destination);
  for (const auto& t : via_mlx->tensors) {
    if (t.ref.shape.size() == 2) {
      EXPECT_EQ(t.ref.codec->id, "affine") << t.name;
    }
  }
  const std::vector<int32_t> tokens{1, 5, 9, 2, 40, 7};
  EXPECT_EQ(logits_of(*via_manifest, tokens), logits_of(*via_mlx, tokens));

  // Padded widths have no MLX form: such an artifact carries no mlx-lm config.json.
  o.source = write_source(tmp.path / "padded", 40);
  o.destination = tmp.path / "padded_out";
  quantize(o);
  EXPECT_FALSE(fs::exists(o.destination / "config.json"));
}

// Loaded for the CPU only, an affine artifact's every tensor lives in its kernel or decoded vector: no tensor views
// the mapping any more and the model lets it go, with logits equal to the default load's.
TEST(Quantize, AffineArtifactLoadedForTheCpuOnlyReleasesItsMapping) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path, 128);
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");
  quantize(o);
  const auto loaded = model::load_model(o.destination);
  const auto cpu = model::load_model(o.destination, {.cpu_only = true});
  EXPECT_FALSE(loaded->keep_alive.empty());
  EXPECT_TRUE(cpu->keep_alive.empty());
  for (const auto& t : cpu->tensors) {
    EXPECT_TRUE(t.ref.arrays.items.empty()) << t.name;
    EXPECT_EQ(t.storage, nullptr) << t.name;
  }
  const std::vector<int32_t> tokens{1, 5, 9, 2, 40, 7};
  EXPECT_EQ(logits_of(*cpu, tokens), logits_of(*loaded, tokens));
}

TEST(Quantize, TheChatTemplateTravelsIntoTheArtifact) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path, 128);
  const std::string tmpl = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  std::ofstream(o.source / "chat_template.jinja") << tmpl;
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");
  quantize(o);
  EXPECT_EQ(model::stored_chat_template(o.destination), tmpl);
}

TEST(Quantize, TargetBitsChoosesAmongCandidatesWithinBudget) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path);
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");  // linears may take 4, 3 or 5 bits
  o.target_bpw = 4.6;
  const QuantizeReport r = quantize(o);
  EXPECT_LE(r.bits_per_weight(), 4.6);
  std::set<int64_t> bits;
  for (const auto& t : r.tensors)
    if (t.choice.codec == "affine" && t.name.find("layers") != std::string::npos) bits.insert(t.choice.params["bits"].get<int64_t>());
  EXPECT_GT(bits.size(), 1u) << "a budget between the candidates should mix widths";
  EXPECT_TRUE(r.allocation.is_object());
  const auto art = artifact::Artifact::open(o.destination);
  // The allocation is stored in the checked quality record (every chosen candidate's codec is the tensor's).
  EXPECT_EQ(art.quality()["quantize"]["allocation"], r.allocation);
}

// --target-linear-bpw budgets the layers' linears only: the embedding and head keep their first candidate and
// are neither measured nor counted, and the linears' bits per weight stay within the target. A recipe's own
// target applies the same way when the command line gives none.
TEST(Quantize, TargetLinearBitsBudgetsTheLinearsOnly) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path, 128);
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");  // linears may take 4, 3 or 5 bits; embedding and head affine 4-bit
  o.target_linear_bpw = 4.0;
  const QuantizeReport r = quantize(o);
  ASSERT_TRUE(r.allocation.is_object());
  EXPECT_EQ(r.allocation["scope"], "linears");
  EXPECT_LE(r.linear_bits_per_weight(), 4.0);
  EXPECT_GT(r.linear_bits_per_weight(), 3.5) << "the budget above affine 3-bit's should be used";
  for (const auto& t : r.tensors) {
    const bool layer = t.name.find("layers") != std::string::npos;
    EXPECT_EQ(r.allocation["choices"].contains(t.name), layer && t.shape.size() == 2) << t.name;
    if (!layer && t.shape.size() == 2) {
      EXPECT_EQ(t.choice.params["bits"], 4) << t.name;
    }
  }

  o.target_linear_bpw.reset();
  o.recipe.target_linear_bpw = 4.0;
  o.destination = tmp.path / "from_recipe";
  const QuantizeReport from_recipe = quantize(o);
  ASSERT_TRUE(from_recipe.allocation.is_object());
  EXPECT_EQ(from_recipe.linear_bits_per_weight(), r.linear_bits_per_weight());

  o.target_bpw = 4.0;
  o.target_linear_bpw = 4.0;
  try {
    quantize(o);
    FAIL() << "two targets";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::usage);
  }
}

// --target-bpw measures the candidates the padding fallback leaves: on a model whose widths (64, 40) two-plane's
// 128-wide groups would pad, affine 3-bit replaces it, so a budget below affine 4-bit's is met.
TEST(Quantize, TargetBitsMeasuresThePaddingFallback) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path);
  o.destination = tmp.path / "out";
  const nlohmann::json affine3 = {{"codec", "affine"}, {"params", {{"bits", 3}, {"group_size", 64}, {"scale_dtype", "bf16"}}}};
  const nlohmann::json affine4 = {{"codec", "affine"}, {"params", {{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}}}};
  const nlohmann::json two_plane = {{"codec", "two_plane"}, {"params", {{"storage", "quint5"}, {"metadata", "full"}}}};
  o.recipe = Recipe::from_json({{"default", {{"candidates", {two_plane, affine4}}, {"padding_fallback", affine3}}}}, "t");
  o.target_bpw = 4.1;
  const QuantizeReport r = quantize(o);
  ASSERT_TRUE(r.allocation.is_object());
  EXPECT_TRUE(r.allocation["feasible"].get<bool>());
  EXPECT_LE(r.bits_per_weight(), 4.1);
  for (const auto& [name, entry] : r.allocation["choices"].items())
    for (const auto& c : entry["candidates"]) EXPECT_NE(c["codec"], "two_plane") << name;
  for (const auto& t : r.tensors) EXPECT_NE(t.choice.codec, "two_plane") << t.name;
}

// The quality record (quality.json) gives the artifact's size on disk, itself and the manifest included.
TEST(Quantize, StoredRecordHoldsTheArtifactSize) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path);
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");
  const QuantizeReport r = quantize(o);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(o.destination)) on_disk += fs::file_size(e.path());
  EXPECT_EQ(r.artifact_bytes, on_disk);
  const auto art = artifact::Artifact::open(o.destination);
  EXPECT_EQ(art.quality()["quantize"]["artifact_bytes"].get<uint64_t>(), on_disk);
  EXPECT_EQ(art.total_bytes(), on_disk);
}

// quantize -> verify -> inspect: the records quantize writes pass the reader's schema, the stored recipe is one the
// recipe parser reads back as the recipe used, and inspect shows the checked report, not the manifest's say-so.
TEST(Quantize, RecordsRoundTripThroughVerifyAndInspect) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path);
  o.destination = tmp.path / "out";
  o.recipe = preset("affine4");
  const QuantizeReport r = quantize(o);
  const auto art = artifact::Artifact::open(o.destination);
  EXPECT_EQ(Recipe::from_json(art.recipe()["quantize"], "recipe.json").to_json(), o.recipe.to_json());
  ASSERT_EQ(art.quality()["quantize"]["tensors"].size(), r.tensors.size());
  EXPECT_EQ(art.quality()["quantize"]["bytes"].get<uint64_t>(), r.bytes);
  const auto verify = artifact::testing::run_cli({"verify", o.destination.string()});
  EXPECT_EQ(verify.status, 0) << verify.err;
  const auto inspect = artifact::testing::run_cli({"inspect", "--json", o.destination.string()});
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  const nlohmann::json shown = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(shown["quality"], art.quality());
  EXPECT_EQ(shown["recipe"]["quantize"]["name"], "affine4");
  EXPECT_EQ(shown["version"], artifact::kVersion);
}

// A calibrated, rotated run fills every optional part of the report (GPTQ methods, the fold, the calibration cache)
// and the reader's schema accepts it; the fold's seed is the manifest's rotation seed.
TEST(Quantize, CalibratedRotatedReportPassesTheSchema) {
  std::optional<QuantizeOptions> o = testing::calibrated_stories260k("affine4", 128, 64);
  if (!o) GTEST_SKIP() << "needs ../shared/models/stories260K and data/tinystories-valid-excerpt.txt";
  TempDir tmp;
  o->destination = tmp.path / "out";
  o->calib_cache = tmp.path / "cache";
  o->recipe.rotate = true;
  o->seed = 5;
  quantize(*o);
  const auto art = artifact::Artifact::open(o->destination);
  const nlohmann::json& q = art.quality()["quantize"];
  EXPECT_EQ(q["fold"]["seed"], 5);
  EXPECT_EQ(art.provenance().seeds.at("rotation"), 5u);
  EXPECT_TRUE(q["calibration_cache"].is_object());
  std::set<std::string> methods;
  for (const auto& t : q["tensors"]) methods.insert(t["method"].get<std::string>());
  EXPECT_TRUE(methods.contains("gptq")) << q["tensors"].dump();
  EXPECT_EQ(art.recipe()["quantize"]["rotate"], true);
}

TEST(Quantize, RefusesAnExistingDestinationUnlessForced) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path);
  o.destination = tmp.path / "out";
  o.recipe = preset("q4");
  quantize(o);
  try {
    quantize(o);
    FAIL() << "overwrote without --force";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::exists);
  }
  o.force = true;
  o.recipe = preset("affine3");
  quantize(o);
  EXPECT_EQ(artifact::Artifact::open(o.destination).recipe()["quantize"]["name"], "affine3");
}

// A source that is already quantized is refused with one line naming why, unless allow_requantize: a lowbit
// artifact (its tensors' codecs, after loading; padded widths: no MLX config.json), an MLX or transformers
// config.json quantization block and a GGUF quant type (from the files, before loading).
TEST(Quantize, RefusesAnAlreadyQuantizedSourceUnlessAllowed) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path, 40);
  o.destination = tmp.path / "first";
  o.recipe = preset("affine4");
  EXPECT_FALSE(quantize(o).source_quantized);

  const auto refused = [&](const std::string& why) {
    try {
      quantize(o);
      ADD_FAILURE() << o.source << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::unsupported);
      const std::string what = e.what();
      EXPECT_NE(what.find(why), std::string::npos) << what;
      EXPECT_NE(what.find("--allow-requantize"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_FALSE(fs::exists(o.destination));
  };
  o.source = tmp.path / "first";
  o.destination = tmp.path / "second";
  refused("stored as affine");
  o.allow_requantize = true;
  EXPECT_TRUE(quantize(o).source_quantized);
  EXPECT_TRUE(fs::exists(o.destination / "manifest.json"));

  o.allow_requantize = false;
  o.source = write_source(tmp.path / "mlx", 128);
  o.destination = tmp.path / "mlx_out";
  quantize(o);
  o.source = o.destination;
  o.destination = tmp.path / "third";
  refused("config.json has a 'quantization' block");

  o.source = write_source(tmp.path / "hf", 128);
  auto config = io::read_json_file(o.source / "config.json", "test", 1 << 20);
  config["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  std::ofstream(o.source / "config.json") << config.dump();
  o.destination = tmp.path / "third";
  refused("'quantization_config' block");

  o.source = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/gguf_quant/model.Q4_0.gguf";
  refused("is Q4_0");
}

// --reuse copies a tensor from the first earlier artifact that stores it with the recipe's codec and params (an
// affine3 artifact offers affine4 its embedding and head, which both presets store alike, and none of its
// linears), records the manifests of the artifacts it took from among the sources, and refuses an artifact made
// from other inputs; an artifact that itself reused can be reused in turn.
TEST(Quantize, ReuseCopiesMatchingTensorsFromEarlierArtifacts) {
  TempDir tmp;
  QuantizeOptions o;
  o.source = write_source(tmp.path, 128);
  o.recipe = preset("affine3");
  o.destination = tmp.path / "a3";
  quantize(o);
  o.recipe = preset("affine4");
  o.destination = tmp.path / "a4";
  const QuantizeReport first = quantize(o);

  o.destination = tmp.path / "from_a3";
  o.reuse = {tmp.path / "a3"};
  for (const auto& t : quantize(o).tensors)
    EXPECT_EQ(t.method == "reused", t.name.ends_with("embed_tokens.weight") || t.name == "lm_head.weight") << t.name;

  o.destination = tmp.path / "again";
  o.reuse = {tmp.path / "a4", tmp.path / "a3"};
  const QuantizeReport again = quantize(o);
  int64_t reused = 0;
  for (const auto& t : again.tensors) {
    EXPECT_EQ(t.method, t.choice.codec == "dense" ? "dense" : "reused") << t.name;
    reused += t.method == "reused";
  }
  EXPECT_GT(reused, 2);
  EXPECT_EQ(testing::artifact_tensor_bytes(tmp.path / "again"), testing::artifact_tensor_bytes(tmp.path / "a4"));
  const artifact::Artifact a = artifact::Artifact::open(tmp.path / "again");  // quality.json checks "reused"
  const auto& sources = a.provenance().sources;
  const auto entry =
      std::find_if(sources.begin(), sources.end(), [](const auto& s) { return s.name.find('/') != std::string::npos; });
  ASSERT_NE(entry, sources.end());
  EXPECT_EQ(entry->name, "reuse/a4/manifest.json");
  EXPECT_EQ(entry->sha256, sha256_file(tmp.path / "a4" / "manifest.json"));
  EXPECT_EQ(std::count_if(sources.begin(), sources.end(), [](const auto& s) { return s.name.starts_with("reuse/"); }),
            1);

  o.reuse = {tmp.path / "again"};
  o.destination = tmp.path / "chained";
  quantize(o);
  EXPECT_EQ(testing::artifact_tensor_bytes(tmp.path / "chained"), testing::artifact_tensor_bytes(tmp.path / "a4"));

  const auto refused = [&](const std::string& field) {
    try {
      quantize(o);
      ADD_FAILURE() << "reused an artifact of other inputs";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::unsupported);
      EXPECT_NE(std::string(e.what()).find("provenance." + field), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(o.destination));
  };
  o.reuse = {tmp.path / "a4"};
  o.destination = tmp.path / "other_seed";
  o.seed = 1;
  refused("seeds");
  o.seed = 0;
  fs::copy(o.source, tmp.path / "edited");
  o.source = tmp.path / "edited";
  std::ofstream(o.source / "config.json", std::ios::app) << "\n";
  o.destination = tmp.path / "other_source";
  refused("sources");
}

// The command line: an already-quantized source exits 3 with one line, and --reuse (after SRC OUT, several
// artifacts) reports what it copied.
TEST(Quantize, CliRefusesRequantizingWithExit3AndTakesReuse) {
  TempDir tmp;
  const fs::path gguf = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/gguf_quant/model.Q4_0.gguf";
  const auto refused = artifact::testing::run_cli({"quantize", gguf.string(), (tmp.path / "q").string(), "--no-calib"});
  EXPECT_EQ(refused.status, 3) << refused.err;
  EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
  EXPECT_NE(refused.err.find("--allow-requantize"), std::string::npos) << refused.err;

  const fs::path src = write_source(tmp.path, 128);
  const auto a4 = (tmp.path / "a4").string(), a3 = (tmp.path / "a3").string();
  ASSERT_EQ(artifact::testing::run_cli({"quantize", src.string(), a4, "--no-calib"}).status, 0);
  ASSERT_EQ(artifact::testing::run_cli({"quantize", src.string(), a3, "--no-calib", "--preset", "affine3"}).status, 0);
  const auto again = artifact::testing::run_cli(
      {"quantize", src.string(), (tmp.path / "again").string(), "--no-calib", "--json", "--reuse", a4, a3});
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.err.find("from 2 --reuse artifacts"), std::string::npos) << again.err;
  const auto report = nlohmann::json::parse(again.out);
  for (const auto& t : report["tensors"])
    EXPECT_EQ(t["method"], t["codec"] == "dense" ? "dense" : "reused") << t["name"];
}

// Quantizing is a function of its inputs: two calibrated trellis runs (the layers after the first calibrate on
// the quantized layers before them, run through the trellis kernel) write byte-identical tensors. The kernel in a
// quantized layer's slot once viewed an encoding freed before the next layer ran it.
TEST(Quantize, CalibratedTrellisRunsAreByteIdentical) {
  std::optional<QuantizeOptions> o = testing::calibrated_stories260k("trellis2", 512, 128);
  if (!o) GTEST_SKIP() << "stories260K or the TinyStories excerpt absent (../shared not mounted)";
  TempDir tmp;
  std::vector<std::string> tensors;
  for (const char* name : {"first", "second"}) {
    o->destination = tmp.path / name;
    const QuantizeReport r = quantize(*o);
    EXPECT_GT(std::count_if(r.tensors.begin(), r.tensors.end(), [](const auto& t) { return t.method == "block_ldlq"; }),
              1);
    tensors.push_back(testing::artifact_tensor_bytes(o->destination));
  }
  EXPECT_TRUE(tensors[0] == tensors[1]) << "two runs of the same quantize wrote different tensors";
}

// The quantize command killed at random points never leaves a partial artifact: the destination is absent or
// complete and verified.
TEST(Quantize, KillAtRandomPointsNeverLeavesAPartialArtifact) {
  const fs::path model = fs::path(LOWBIT_SHARED_DIR) / "models/stories260K/stories260K.bin";
  const fs::path tok = fs::path(LOWBIT_SHARED_DIR) / "models/stories260K/tok512.bin";
  // Calibrated, so that a run lasts long enough to be killed at many points; the text from ../shared too, so
  // that the test does not depend on debian-reference-en being installed.
  const fs::path text = fs::path(LOWBIT_SHARED_DIR) / "data/calibration-debian-reference.en.txt";
  if (!fs::exists(model)) GTEST_SKIP() << model << " absent (../shared not mounted)";
  TempDir tmp;
  std::mt19937_64 rng(2026);
  std::uniform_int_distribution<int> delay_ms(0, 1500);
  int complete = 0, absent = 0;
  for (int run = 0; run < 6; ++run) {
    const fs::path out = tmp.path / fmt::format("out{}", run);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      ::execl(LOWBIT_CLI, "lowbit", "quantize", model.c_str(), out.c_str(), "--preset", "affine4", "--tokenizer",
              tok.c_str(), "--calib", text.c_str(), "--calib-tokens", "1024", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!fs::exists(out)) {
      ++absent;
      continue;
    }
    EXPECT_NO_THROW(artifact::Artifact::open(out)) << "run " << run;
    ++complete;
  }
  EXPECT_EQ(complete + absent, 6);
}

}  // namespace
}  // namespace lowbit::quant
