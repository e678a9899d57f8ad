// Qwen3-ASR against transformers' qwen3_asr (scripts/make_qwen3_asr_fixtures.py): the log-mel features of the
// committed speech (espeak-ng), the projected encoder output of a random-weight model, and lowbit's greedy ids.
// Tolerances: max |lowbit - reference| over a slice within 1e-4 of the slice's largest |reference|.
// The model is not committed: where the script has not written it under .cache (no torch: CI), it is written here
// from the committed config files and the script's counter-based generator, the same bytes (its SHA-256 checked).
// LOWBIT_TEST_DEVICE=cuda loads every model (and runs every transcribe command) on the GPU: the GPU check
// (scripts/gpu_bench.sh) runs these tests so; on the CPU by default.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sndfile.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <list>
#include <nlohmann/json.hpp>
#include <regex>
#include <system_error>

#include "artifact/artifact_fixture.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/audio.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/log_mel.h"
#include "lowbit/model/speech.h"
#include "model/counter_rng.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/qwen3_asr";
const fs::path kCache = fs::path(LOWBIT_SOURCE_DIR) / ".cache";
const fs::path kTokenizer = fs::path(LOWBIT_SHARED_DIR) / "tokenizers/qwen3";

std::string test_device() {
  const char* device = std::getenv("LOWBIT_TEST_DEVICE");
  return device ? device : "cpu";
}

SpeechModel* load(const fs::path& dir) { return load_speech_model(dir, test_device()).release(); }

// `lowbit transcribe args... --device <test_device()>`
artifact::testing::CliResult transcribe_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "transcribe");
  args.insert(args.end(), {"--device", test_device()});
  return artifact::testing::run_cli(args);
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

json expected() { return read_json(kFixtures / "expected.json"); }

using Tensors = std::vector<std::pair<std::string, TensorBuffer>>;

// The tensors of model/weights.json, in fp32: 1 + sym(amp) for a gain, sym(amp) otherwise.
Tensors draw_weights(const json& weights) {
  const testing::CounterRng rng(weights.at("seed").get<uint64_t>());
  Tensors out;
  for (const json& t : weights.at("tensors")) {
    const auto name = t.at("name").get<std::string>();
    TensorBuffer b = make_buffer(DType::F32, t.at("shape").get<Shape>());
    const uint64_t key = rng.key(name), n = b.bytes.size() / sizeof(float);
    const auto amp = static_cast<float>(t.at("amp").get<double>());
    const float offset = t.at("kind") == "g" ? 1.0f : 0.0f;
    float* v = b.as<float>();
    for (uint64_t i = 0; i < n; ++i) v[i] = testing::CounterRng::sym(key, i, amp) + offset;
    out.emplace_back(name, std::move(b));
  }
  return out;
}

// The script's make_phonon: mlx_audio's name of an HF tensor, and whether it is a conv weight ([out, in, kh, kw],
// which MLX stores [out, kh, kw, in]).
std::pair<std::string, bool> phonon_name(const std::string& name) {
  const auto rest = [&](std::string_view prefix) { return name.substr(prefix.size()); };
  if (name.starts_with("model.language_model.")) return {"model." + rest("model.language_model."), false};
  if (name == "lm_head.weight") return {name, false};
  if (name.starts_with("model.audio_tower.")) {
    const std::string local = "audio_tower." + rest("model.audio_tower.");
    return {local, local.find(".conv2d") != std::string::npos && local.ends_with("weight")};
  }
  if (name.starts_with("model.multi_modal_projector.linear_"))
    return {"audio_tower.proj" + rest("model.multi_modal_projector.linear_"), false};
  throw std::runtime_error("unexpected tensor " + name);
}

TensorBuffer conv_to_mlx(const TensorBuffer& w) {
  const int64_t out = w.shape[0], in = w.shape[1], kh = w.shape[2], kw = w.shape[3];
  TensorBuffer t = make_buffer(DType::F32, {out, kh, kw, in});
  const auto* src = reinterpret_cast<const float*>(w.bytes.data());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t c = 0; c < in; ++c)
      for (int64_t y = 0; y < kh; ++y)
        for (int64_t x = 0; x < kw; ++x)
          t.as<float>()[((o * kh + y) * kw + x) * in + c] = src[((o * in + c) * kh + y) * kw + x];
  return t;
}

void write_tensors(const fs::path& path, const Tensors& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, b] : tensors) views.emplace_back(name, b.view());
  io::write_safetensors(path, views, metadata);
}

// The script's two model directories, from the files committed under model/ and phonon/, the generator and the
// Qwen3 tokenizer of ../shared; throws when model.safetensors is not the reference's (`sha256`).
void write_model_dirs(const fs::path& model, const fs::path& phonon, const std::string& sha256) {
  const fs::path src = kFixtures / "model";
  const json weights = read_json(src / "weights.json");
  Tensors tensors = draw_weights(weights);
  fs::create_directories(model);
  write_tensors(model / "model.safetensors", tensors, weights.at("metadata").get<std::map<std::string, std::string>>());
  if (const std::string got = sha256_file(model / "model.safetensors"); got != sha256)
    throw std::runtime_error(
        fmt::format("{}: SHA-256 {}, but expected.json's model_sha256 is {}: the generator or "
                    "weights.json differ from scripts/make_qwen3_asr_fixtures.py's",
                    (model / "model.safetensors").string(), got, sha256));
  json tokenizer = read_json(kTokenizer / "tokenizer.json");
  for (const json& t : read_json(src / "added_tokens.json")) tokenizer.at("added_tokens").push_back(t);
  std::ofstream(model / "tokenizer.json") << tokenizer.dump();
  fs::copy_file(kTokenizer / "tokenizer_config.json", model / "tokenizer_config.json");
  for (const char* f : {"config.json", "preprocessor_config.json", "generation_config.json"})
    fs::copy_file(src / f, model / f);

  for (auto& [name, b] : tensors) {
    bool conv = false;
    std::tie(name, conv) = phonon_name(name);
    if (conv) b = conv_to_mlx(b);
  }
  fs::create_directories(phonon);
  write_tensors(phonon / "model.safetensors", tensors, {{"format", "mlx"}});
  for (const char* f : {"config.json", "packed_manifest.json"}) fs::copy_file(kFixtures / "phonon" / f, phonon / f);
  for (const char* f :
       {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json", "generation_config.json"})
    fs::copy_file(model / f, phonon / f);
}

// The directories the model tests run: the script's under .cache where torch made them, else the same written
// once per fixture version under the temp dir (a finished one renamed into place, so concurrent tests share it).
struct ModelDirs {
  fs::path model, phonon;
  std::string skip, error;  // why the tests skip, or fail, when they do
};

// Names the written directories by what they are made of, so that new weights or committed files write new ones.
std::string fixture_key(const std::string& model_sha256) {
  Sha256 h;
  h.update(model_sha256.data(), model_sha256.size());
  for (const char* sub : {"model", "phonon"}) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(kFixtures / sub)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      h.update(text.data(), text.size());
    }
  }
  return h.hex().substr(0, 16);
}

ModelDirs find_model_dirs() {
  const std::string sha256 = expected().at("model_sha256").get<std::string>();
  ModelDirs d{kCache / "qwen3_asr_fixture", kCache / "qwen3_asr_fixture_phonon", "", ""};
  if (fs::exists(d.model / "model.safetensors") && fs::exists(d.phonon / "model.safetensors")) {
    if (sha256_file(d.model / "model.safetensors") != sha256)
      d.error = d.model.string() +
                " holds other weights than expected.json's model_sha256: rerun scripts/make_qwen3_asr_fixtures.py "
                "--model-only, or remove it";
    return d;
  }
  if (!fs::exists(kTokenizer / "tokenizer.json")) {
    d.skip = kTokenizer.string() + " absent: the fixture model needs the Qwen3 tokenizer";
    return d;
  }
  const fs::path dir = fs::temp_directory_path() / ("lowbit_qwen3_asr_fixture_" + fixture_key(sha256));
  d.model = dir / "model";
  d.phonon = dir / "phonon";
  if (fs::exists(dir)) return d;
  const fs::path tmp = fmt::format("{}.tmp{}", dir.string(), ::getpid());
  std::error_code ec;
  try {
    fs::remove_all(tmp);
    write_model_dirs(tmp / "model", tmp / "phonon", sha256);
    fs::rename(tmp, dir, ec);  // fails where another test process renamed its copy first
  } catch (const std::exception& e) {
    d.error = e.what();
  }
  fs::remove_all(tmp, ec);
  if (d.error.empty() && !fs::exists(dir)) d.error = "could not write " + dir.string();
  return d;
}

const ModelDirs& model_dirs() {
  static const ModelDirs dirs = find_model_dirs();
  return dirs;
}

// In a fixture's SetUp: the test body runs only where the model directories are there.
void require_model_dirs() {
  if (!model_dirs().error.empty()) FAIL() << model_dirs().error;
  if (!model_dirs().skip.empty()) GTEST_SKIP() << model_dirs().skip;
}

// max |got - want| / max |want| over the slice.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return diff / scale;
}

TEST(Qwen3Asr, LogMelMatchesTheReferenceExtractor) {
  const json e = expected();
  const std::vector<float> audio = io::read_audio(kFixtures / e.at("audio").get<std::string>(), 16000);
  ASSERT_EQ(audio.size(), e.at("samples").get<size_t>());
  const LogMel mel = log_mel(audio, MelOptions{});
  const json& m = e.at("mel");
  ASSERT_EQ(mel.bins, m.at("bins").get<int64_t>());
  ASSERT_EQ(mel.frames, m.at("frames").get<int64_t>());
  ASSERT_EQ(mel.padded_frames, m.at("padded_frames").get<int64_t>());
  const auto first = m.at("slice_frames")[0].get<int64_t>(), last = m.at("slice_frames")[1].get<int64_t>();
  std::vector<float> got;  // [frames, bins] as the fixture stores it
  for (int64_t f = first; f < last; ++f)
    for (int64_t b = 0; b < mel.bins; ++b) got.push_back(mel.values[static_cast<size_t>(b * mel.padded_frames + f)]);
  EXPECT_LT(relative_error(got, m.at("slice").get<std::vector<float>>()), 1e-4);
  double sum = 0;
  for (float v : mel.values) sum += v;
  EXPECT_NEAR(sum, m.at("sum").get<double>(), 1e-4 * std::abs(m.at("sum").get<double>()));
}

std::vector<float> speech() { return io::read_audio(kFixtures / expected().at("audio").get<std::string>(), 16000); }

class Qwen3AsrModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (model_dirs().skip.empty() && model_dirs().error.empty()) model_ = load(model_dirs().model);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override { require_model_dirs(); }
  static SpeechModel* model_;
};
SpeechModel* Qwen3AsrModel::model_ = nullptr;

TEST_F(Qwen3AsrModel, EncoderOutputMatchesTheReference) {
  const json e = expected().at("encoder");
  ThreadPool pool(2);
  const std::vector<float> out = encode_audio(*model_, log_mel(speech(), model_->mel), pool);
  const auto dim = e.at("dim").get<int64_t>();
  ASSERT_EQ(static_cast<int64_t>(out.size()), e.at("tokens").get<int64_t>() * dim);
  std::vector<float> got;
  for (const json& r : e.at("rows"))
    got.insert(got.end(), out.begin() + r.get<int64_t>() * dim, out.begin() + (r.get<int64_t>() + 1) * dim);
  EXPECT_LT(relative_error(got, e.at("slice").get<std::vector<float>>()), 1e-4);
  double sum = 0;
  for (float v : out) sum += v;
  EXPECT_NEAR(sum, e.at("sum").get<double>(), 1e-4 * static_cast<double>(out.size()));
}

void expect_reference_greedy(const SpeechModel& model, const fs::path& dir) {
  const auto tokenizer = load_tokenizer_for(*model.decoder, dir, std::nullopt);
  ThreadPool pool(2);
  for (const char* key : {"auto", "english"}) {
    const json e = expected().at(key);
    TranscribeOptions options{.language = std::nullopt, .max_tokens = 32};
    if (!e.at("language").is_null()) options.language = e.at("language").get<std::string>();
    const Transcript t = transcribe(model, *tokenizer, speech(), options, pool);
    EXPECT_EQ(t.prompt_tokens, static_cast<int64_t>(e.at("prompt_ids").size())) << dir << " " << key;
    EXPECT_EQ(t.token_ids, e.at("token_ids").get<std::vector<int32_t>>()) << dir << " " << key;
  }
}

TEST_F(Qwen3AsrModel, GreedyTokensMatchTheReference) { expect_reference_greedy(*model_, model_dirs().model); }

class Qwen3AsrPhonon : public ::testing::Test {
 protected:
  void SetUp() override { require_model_dirs(); }
};

TEST_F(Qwen3AsrPhonon, GreedyTokensMatchTheReference) {
  expect_reference_greedy(*std::unique_ptr<SpeechModel>(load(model_dirs().phonon)), model_dirs().phonon);
}

// The Phonon fixture with its decoder's linears packed two-plane (seed 000) in a storage variant, and (hybrid) the
// embedding and audio_tower.proj2 4-bit affine; beside it, the same weights dequantized into the dense layout.
void write_packed_phonon(const fs::path& packed, const fs::path& dequantized, const std::string& storage, bool slim,
                         bool hybrid) {
  const fs::path& phonon = model_dirs().phonon;
  const auto ckpt = io::SafetensorsCheckpoint::open(phonon);
  json manifest = json::parse(std::ifstream(phonon / "packed_manifest.json"));
  manifest["modules"] = json::array();
  std::list<codec::EncodedTensor> encoded;
  std::list<std::vector<float>> values;
  std::vector<std::pair<std::string, TensorView>> packed_tensors, dense_tensors;
  const auto add = [&](const std::string& module, const char* codec_id, const codec::Params& params,
                       const std::map<std::string, std::string>& names, const TensorView& w) {
    const codec::Codec& codec = codec::codec_or_throw(codec_id, module);
    encoded.push_back(codec.encode(params, w.shape, w.as<float>(), {}));
    for (const auto& [role, buffer] : encoded.back().arrays) {
      const auto it = names.find(role);
      packed_tensors.emplace_back(module + "." + (it != names.end() ? it->second : role), buffer.view());
    }
    values.push_back(codec::decode_all({&codec, encoded.back().params, w.shape, encoded.back().views()}));
    dense_tensors.emplace_back(module + ".weight",
                               TensorView{DType::F32, w.shape, std::as_bytes(std::span(values.back()))});
  };
  const std::regex linear(R"(model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight)");
  const codec::Params affine{{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}};
  for (const std::string& name : ckpt.names()) {
    const TensorView w = ckpt.tensor(name);
    ASSERT_EQ(w.dtype, DType::F32) << name;
    const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
    if (std::regex_match(name, linear)) {
      add(module, "two_plane", {{"storage", storage}, {"metadata", slim ? "slim" : "full"}, {"scale_dtype", "bf16"}},
          {{"base_codes", "base_q"}, {"residual_codes", "residual_q"}, {"codes", storage + "_q"}}, w);
      manifest["modules"].push_back({{"name", module}, {"in_features", w.shape[1]}, {"out_features", w.shape[0]}});
    } else if (hybrid && (name == "model.embed_tokens.weight" || name == "audio_tower.proj2.weight")) {
      add(module, "affine", affine, {{"codes", "weight"}}, w);
    } else {
      packed_tensors.emplace_back(name, w);
      dense_tensors.emplace_back(name, w);
    }
  }
  manifest["module_count"] = manifest["modules"].size();
  if (slim) manifest["decoder_metadata"] = {{"format", "broadcast-scales-v1"}};
  if (storage == "quint5") manifest["decoder_codes"] = {{"format", "ten-base5-per-24bit-v1"}};
  if (hybrid) {
    const TensorView e = ckpt.tensor("model.embed_tokens.weight"), p = ckpt.tensor("audio_tower.proj2.weight");
    manifest["hybrid_quantization"] = {{"format", "mlx-native-affine-v1"},
                                       {"embedding",
                                        {{"name", "model.embed_tokens"},
                                         {"num_embeddings", e.shape[0]},
                                         {"dims", e.shape[1]},
                                         {"group_size", 64},
                                         {"bits", 4},
                                         {"mode", "affine"}}},
                                       {"audio_linears",
                                        {{{"name", "audio_tower.proj2"},
                                          {"in_features", p.shape[1]},
                                          {"out_features", p.shape[0]},
                                          {"bias", true},
                                          {"group_size", 64},
                                          {"bits", 4},
                                          {"mode", "affine"}}}}};
  }
  for (const fs::path& dir : {packed, dequantized}) {
    fs::create_directories(dir);
    for (const char* f : {"config.json", "preprocessor_config.json", "generation_config.json", "tokenizer.json",
                          "tokenizer_config.json"})
      fs::copy_file(phonon / f, dir / f);
  }
  std::ofstream(packed / "packed_manifest.json") << manifest.dump(1);
  fs::copy_file(phonon / "packed_manifest.json", dequantized / "packed_manifest.json");
  io::write_safetensors(packed / "model.safetensors", packed_tensors, {{"format", "mlx"}});
  io::write_safetensors(dequantized / "model.safetensors", dense_tensors, {{"format", "mlx"}});
}

TEST_F(Qwen3AsrPhonon, PackedDecodersMatchTheirDequantizedWeights) {
  struct Variant {
    const char* storage;
    bool slim, hybrid;
  };
  ThreadPool pool(2);
  for (const Variant v :
       {Variant{"planes", false, false}, Variant{"planes", true, false}, Variant{"quint5", false, false},
        Variant{"quint5", true, false}, Variant{"planes", false, true}, Variant{"quint5", true, true}}) {
    const std::string label = fmt::format("{}-{}{}", v.storage, v.slim ? "slim" : "full", v.hybrid ? "-hybrid" : "");
    artifact::testing::TempDir tmp;
    write_packed_phonon(tmp / "packed", tmp / "dequantized", v.storage, v.slim, v.hybrid);
    const std::unique_ptr<SpeechModel> packed(load(tmp / "packed")), dequantized(load(tmp / "dequantized"));
    for (const NamedTensor& t : packed->decoder->tensors) {
      if (t.name == "model.layers.1.mlp.down_proj.weight") {
        EXPECT_EQ(t.ref.codec->id, "two_plane") << label;
        EXPECT_EQ(t.ref.params.at("storage"), v.storage) << label;
      }
      if (t.name == "model.embed_tokens.weight") {
        EXPECT_EQ(t.ref.codec->id, v.hybrid ? "affine" : "dense") << label;
      }
    }
    const auto tokenizer = load_tokenizer_for(*packed->decoder, tmp / "packed", std::nullopt);
    const TranscribeOptions options{.language = std::nullopt, .max_tokens = 32};
    const Transcript got = transcribe(*packed, *tokenizer, speech(), options, pool);
    EXPECT_EQ(got.token_ids.size(), 32u) << label;
    EXPECT_EQ(got.token_ids, transcribe(*dequantized, *tokenizer, speech(), options, pool).token_ids) << label;
    const auto r = transcribe_cli(
        {(tmp / "packed").string(), (kFixtures / "speech.wav").string(), "--json", "--max-tokens", "32"});
    ASSERT_EQ(r.status, 0) << label << ": " << r.err;
    EXPECT_EQ(json::parse(r.out).at("token_ids").get<std::vector<int32_t>>(), got.token_ids) << label;
  }
}

TEST(Qwen3Asr, LongAudioSplitsAsTheReference) {
  const std::vector<float> one = speech();
  const json want = expected();  // named: a range-for over a temporary's member reads freed memory
  for (const json& c : want.at("chunks")) {
    std::vector<float> wav;
    for (int64_t i = 0; i < c.at("repeat").get<int64_t>(); ++i) wav.insert(wav.end(), one.begin(), one.end());
    std::vector<int64_t> starts;
    const std::vector<AudioChunk> chunks = split_audio(wav, 16000, c.at("seconds").get<double>());
    starts.reserve(chunks.size());
    for (const AudioChunk& a : chunks) starts.push_back(a.begin);
    EXPECT_EQ(starts, c.at("starts").get<std::vector<int64_t>>()) << c.dump();
    EXPECT_EQ(chunks.back().end, static_cast<int64_t>(wav.size()));
    for (size_t i = 1; i < chunks.size(); ++i) EXPECT_EQ(chunks[i].begin, chunks[i - 1].end);
  }
  const std::vector<AudioChunk> whole{{0, static_cast<int64_t>(one.size())}};
  EXPECT_EQ(split_audio(one, 16000, 1200.0), whole);
}

TEST_F(Qwen3AsrModel, ChunkedAudioIsTranscribedChunkByChunk) {
  // Each chunk transcribed alone, zero-padded to a second, within what is left of max_tokens: the same ids.
  const auto tokenizer = load_tokenizer_for(*model_->decoder, model_dirs().model, std::nullopt);
  ThreadPool pool(2);
  const std::vector<float> wav = speech();
  const Transcript whole =
      transcribe(*model_, *tokenizer, wav, {.language = std::nullopt, .max_tokens = 40, .chunk_seconds = 1.0}, pool);
  std::vector<int32_t> want;
  int64_t audio_tokens = 0;
  for (const AudioChunk& c : split_audio(wav, 16000, 1.0)) {
    std::vector<float> part(wav.begin() + c.begin, wav.begin() + c.end);
    part.resize(std::max<size_t>(part.size(), 16000), 0.0f);
    const Transcript t =
        transcribe(*model_, *tokenizer, part,
                   {.language = std::nullopt, .max_tokens = 40 - static_cast<int64_t>(want.size())}, pool);
    want.insert(want.end(), t.token_ids.begin(), t.token_ids.end());
    audio_tokens += t.audio_tokens;
    if (want.size() >= 40) break;
  }
  EXPECT_EQ(whole.token_ids, want);
  EXPECT_EQ(whole.audio_tokens, audio_tokens);
  EXPECT_GT(whole.token_ids.size(), 16u);
}

TEST_F(Qwen3AsrModel, SampledDecodingFollowsItsSeed) {
  // A seeded sampler gives the same ids every run and others for another seed; at a high temperature it leaves the
  // greedy reference; temperature 0 is the greedy reference itself.
  const auto tokenizer = load_tokenizer_for(*model_->decoder, model_dirs().model, std::nullopt);
  ThreadPool pool(2);
  const std::vector<float> wav = speech();
  TranscribeOptions o{.language = std::nullopt, .max_tokens = 32};
  o.sampler = {.temperature = 1.5f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 7};
  const Transcript a = transcribe(*model_, *tokenizer, wav, o, pool);
  const Transcript again = transcribe(*model_, *tokenizer, wav, o, pool);
  o.sampler.seed = 8;
  const Transcript other = transcribe(*model_, *tokenizer, wav, o, pool);
  const auto greedy = expected().at("auto").at("token_ids").get<std::vector<int32_t>>();
  EXPECT_EQ(a.token_ids, again.token_ids);
  EXPECT_NE(a.token_ids, other.token_ids);
  EXPECT_NE(a.token_ids, greedy);
  for (const int32_t id : a.token_ids) EXPECT_TRUE(id >= 0 && id < model_->decoder->config.vocab) << id;
  o.sampler.temperature = 0.0f;
  EXPECT_EQ(transcribe(*model_, *tokenizer, wav, o, pool).token_ids, greedy);
}

TEST_F(Qwen3AsrModel, AudioChangesTheTranscript) {
  // The same model on silence: the audio rows reach the decoder, so the ids differ.
  const auto tokenizer = load_tokenizer_for(*model_->decoder, model_dirs().model, std::nullopt);
  ThreadPool pool(2);
  const std::vector<float> silence(speech().size(), 0.0f);
  const Transcript t = transcribe(*model_, *tokenizer, silence, {.language = std::nullopt, .max_tokens = 8}, pool);
  const auto want = expected().at("auto").at("token_ids").get<std::vector<int32_t>>();
  EXPECT_NE(t.token_ids, std::vector<int32_t>(want.begin(), want.begin() + 8));
}

TEST_F(Qwen3AsrModel, CliPrintsTheTextAndTokenIds) {
  const auto r = transcribe_cli(
      {model_dirs().model.string(), (kFixtures / "speech.wav").string(), "--json", "--max-tokens", "32"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json got = json::parse(r.out);
  EXPECT_EQ(got.at("token_ids"), expected().at("auto").at("token_ids"));
  EXPECT_TRUE(got.at("text").is_string());
  EXPECT_NE(r.err.find("encoder: 32 tokens"), std::string::npos) << r.err;
}

TEST_F(Qwen3AsrModel, CliReadsFlacAlike) {
  // The same 16-bit samples losslessly in FLAC give the same ids.
  artifact::testing::TempDir tmp;
  const std::vector<float> samples = speech();
  SF_INFO info{.frames = 0,
               .samplerate = 16000,
               .channels = 1,
               .format = SF_FORMAT_FLAC | SF_FORMAT_PCM_16,
               .sections = 0,
               .seekable = 0};
  SNDFILE* f = sf_open((tmp / "speech.flac").c_str(), SFM_WRITE, &info);
  ASSERT_NE(f, nullptr) << sf_strerror(nullptr);
  ASSERT_EQ(sf_writef_float(f, samples.data(), static_cast<sf_count_t>(samples.size())),
            static_cast<sf_count_t>(samples.size()));
  sf_close(f);
  const auto r =
      transcribe_cli({model_dirs().model.string(), (tmp / "speech.flac").string(), "--json", "--max-tokens", "32"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).at("token_ids"), expected().at("auto").at("token_ids"));
}

// lowbit quantize on the qwen3_asr checkpoint (affine4: the decoder's linears 4-bit, the audio encoder's matrices
// 8-bit), transcribed from the artifact, against the same weights dequantized into a transformers qwen3_asr
// directory and run dense: the same greedy ids.
TEST_F(Qwen3AsrModel, QuantizedArtifactMatchesItsDequantizedWeights) {
  artifact::testing::TempDir tmp;
  const fs::path art = tmp / "art", dense = tmp / "dense";
  const auto q = artifact::testing::run_cli({"quantize", model_dirs().model.string(), art.string(), "--no-calib"});
  ASSERT_EQ(q.status, 0) << q.err;
  const artifact::Artifact a = artifact::Artifact::open(art);
  EXPECT_EQ(a.tensor("model.audio_tower.layers.0.fc1.weight").params.at("bits"), 8);
  EXPECT_EQ(a.tensor("model.multi_modal_projector.linear_2.weight").params.at("bits"), 8);
  EXPECT_EQ(a.tensor("model.layers.0.mlp.down_proj.weight").params.at("bits"), 4);
  std::vector<std::vector<float>> values;
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& name : a.tensor_names()) {
    const codec::TensorRef& ref = a.tensor(name);
    values.push_back(codec::decode_all(ref));
    const bool decoder = name.starts_with("model.") && !name.starts_with("model.audio_tower.") &&
                         !name.starts_with("model.multi_modal_projector.");
    tensors.emplace_back(decoder ? "model.language_model." + name.substr(6) : name,
                         TensorView{DType::F32, ref.shape, std::as_bytes(std::span(values.back()))});
  }
  fs::create_directories(dense);
  io::write_safetensors(dense / "model.safetensors", tensors);
  for (const char* f :
       {"config.json", "preprocessor_config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(model_dirs().model / f, dense / f);
  const std::unique_ptr<SpeechModel> quantized(load(art)), dequantized(load(dense));
  const auto tokenizer = load_tokenizer_for(*quantized->decoder, art, std::nullopt);
  ThreadPool pool(2);
  const TranscribeOptions options{.language = std::nullopt, .max_tokens = 32};
  const Transcript got = transcribe(*quantized, *tokenizer, speech(), options, pool);
  const Transcript want = transcribe(*dequantized, *tokenizer, speech(), options, pool);
  EXPECT_EQ(got.token_ids.size(), 32u);
  EXPECT_EQ(got.token_ids, want.token_ids);
  const auto r = transcribe_cli({art.string(), (kFixtures / "speech.wav").string(), "--json", "--max-tokens", "32"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).at("token_ids").get<std::vector<int32_t>>(), want.token_ids);
}

TEST_F(Qwen3AsrModel, CliRejectsBadAudioWithOneLine) {
  artifact::testing::TempDir tmp;
  std::ofstream(tmp / "text.wav") << "not audio at all\n";
  std::ofstream(tmp / "empty.wav", std::ios::binary)
      .write("RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data\0\0\0\0", 44);
  for (const char* name : {"text.wav", "empty.wav", "absent.flac"}) {
    const auto r = transcribe_cli({model_dirs().model.string(), (tmp / name).string()});
    EXPECT_EQ(r.status, std::string(name) == "absent.flac" ? 1 : 3) << name << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace lowbit::model
