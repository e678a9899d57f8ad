// Qwen3-ASR against transformers' qwen3_asr (scripts/make_qwen3_asr_fixtures.py): the log-mel features of the
// committed speech (espeak-ng), the projected encoder output of a random-weight model, and lowbit's greedy ids.
// Tolerances: max |lowbit - reference| over a slice within 1e-4 of the slice's largest |reference|.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <list>
#include <nlohmann/json.hpp>
#include <regex>

#include "artifact/artifact_fixture.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/audio.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/log_mel.h"
#include "lowbit/model/speech.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/qwen3_asr";
// The random-weight model itself is not committed; the script rewrites it identically (same seed).
const fs::path kModel = fs::path(LOWBIT_SOURCE_DIR) / ".cache/qwen3_asr_fixture";
// The same weights in a Phonon directory (mlx_audio's names and conv layout, dense decoder linears).
const fs::path kPhonon = fs::path(LOWBIT_SOURCE_DIR) / ".cache/qwen3_asr_fixture_phonon";
constexpr const char* kModelAbsent = " absent: run scripts/make_qwen3_asr_fixtures.py --model-only";

json expected() {
  std::ifstream in(kFixtures / "expected.json");
  return json::parse(in);
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
    if (fs::exists(kModel / "model.safetensors")) model_ = load_speech_model(kModel).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << kModel << kModelAbsent;
  }
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

TEST_F(Qwen3AsrModel, GreedyTokensMatchTheReference) { expect_reference_greedy(*model_, kModel); }

TEST(Qwen3AsrPhonon, GreedyTokensMatchTheReference) {
  if (!fs::exists(kPhonon / "model.safetensors")) GTEST_SKIP() << kPhonon << kModelAbsent;
  expect_reference_greedy(*load_speech_model(kPhonon), kPhonon);
}

// The Phonon fixture with its decoder's linears packed two-plane (seed 000) in a storage variant, and (hybrid) the
// embedding and audio_tower.proj2 4-bit affine; beside it, the same weights dequantized into the dense layout.
void write_packed_phonon(const fs::path& packed, const fs::path& dequantized, const std::string& storage, bool slim,
                         bool hybrid) {
  const auto ckpt = io::SafetensorsCheckpoint::open(kPhonon);
  json manifest = json::parse(std::ifstream(kPhonon / "packed_manifest.json"));
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
      fs::copy_file(kPhonon / f, dir / f);
  }
  std::ofstream(packed / "packed_manifest.json") << manifest.dump(1);
  fs::copy_file(kPhonon / "packed_manifest.json", dequantized / "packed_manifest.json");
  io::write_safetensors(packed / "model.safetensors", packed_tensors, {{"format", "mlx"}});
  io::write_safetensors(dequantized / "model.safetensors", dense_tensors, {{"format", "mlx"}});
}

TEST(Qwen3AsrPhonon, PackedDecodersMatchTheirDequantizedWeights) {
  if (!fs::exists(kPhonon / "model.safetensors")) GTEST_SKIP() << kPhonon << kModelAbsent;
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
    const auto packed = load_speech_model(tmp / "packed"), dequantized = load_speech_model(tmp / "dequantized");
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
    const auto r = artifact::testing::run_cli(
        {"transcribe", (tmp / "packed").string(), (kFixtures / "speech.wav").string(), "--json", "--max-tokens", "32"});
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
  const auto tokenizer = load_tokenizer_for(*model_->decoder, kModel, std::nullopt);
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

TEST_F(Qwen3AsrModel, AudioChangesTheTranscript) {
  // The same model on silence: the audio rows reach the decoder, so the ids differ.
  const auto tokenizer = load_tokenizer_for(*model_->decoder, kModel, std::nullopt);
  ThreadPool pool(2);
  const std::vector<float> silence(speech().size(), 0.0f);
  const Transcript t = transcribe(*model_, *tokenizer, silence, {.language = std::nullopt, .max_tokens = 8}, pool);
  const auto want = expected().at("auto").at("token_ids").get<std::vector<int32_t>>();
  EXPECT_NE(t.token_ids, std::vector<int32_t>(want.begin(), want.begin() + 8));
}

TEST_F(Qwen3AsrModel, CliPrintsTheTextAndTokenIds) {
  const auto r = artifact::testing::run_cli(
      {"transcribe", kModel.string(), (kFixtures / "speech.wav").string(), "--json", "--max-tokens", "32"});
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
  const auto r = artifact::testing::run_cli(
      {"transcribe", kModel.string(), (tmp / "speech.flac").string(), "--json", "--max-tokens", "32"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).at("token_ids"), expected().at("auto").at("token_ids"));
}

// lowbit quantize on the qwen3_asr checkpoint (affine4: the decoder's linears 4-bit, the audio encoder's matrices
// 8-bit), transcribed from the artifact, against the same weights dequantized into a transformers qwen3_asr
// directory and run dense: the same greedy ids.
TEST_F(Qwen3AsrModel, QuantizedArtifactMatchesItsDequantizedWeights) {
  artifact::testing::TempDir tmp;
  const fs::path art = tmp / "art", dense = tmp / "dense";
  const auto q = artifact::testing::run_cli({"quantize", kModel.string(), art.string(), "--no-calib"});
  ASSERT_EQ(q.status, 0) << q.err;
  const artifact::Artifact a = artifact::Artifact::open(art);
  EXPECT_EQ(a.tensor("model.audio_tower.layers.0.fc1.weight").params.at("bits"), 8);
  EXPECT_EQ(a.tensor("model.multi_modal_projector.linear_2.weight").params.at("bits"), 8);
  EXPECT_EQ(a.tensor("model.layers.0.mlp.down_proj.weight").params.at("bits"), 4);
  std::vector<std::vector<float>> values;
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& name : a.tensor_names()) {
    const codec::TensorRef ref = a.tensor(name);
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
    fs::copy_file(kModel / f, dense / f);
  const auto quantized = load_speech_model(art), dequantized = load_speech_model(dense);
  const auto tokenizer = load_tokenizer_for(*quantized->decoder, art, std::nullopt);
  ThreadPool pool(2);
  const TranscribeOptions options{.language = std::nullopt, .max_tokens = 32};
  const Transcript got = transcribe(*quantized, *tokenizer, speech(), options, pool);
  const Transcript want = transcribe(*dequantized, *tokenizer, speech(), options, pool);
  EXPECT_EQ(got.token_ids.size(), 32u);
  EXPECT_EQ(got.token_ids, want.token_ids);
  const auto r = artifact::testing::run_cli(
      {"transcribe", art.string(), (kFixtures / "speech.wav").string(), "--json", "--max-tokens", "32"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).at("token_ids").get<std::vector<int32_t>>(), want.token_ids);
}

TEST_F(Qwen3AsrModel, CliRejectsBadAudioWithOneLine) {
  artifact::testing::TempDir tmp;
  std::ofstream(tmp / "text.wav") << "not audio at all\n";
  std::ofstream(tmp / "empty.wav", std::ios::binary)
      .write("RIFF\x24\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x80\x3e\0\0\0\x7d\0\0\x02\0\x10\0data\0\0\0\0", 44);
  for (const char* name : {"text.wav", "empty.wav", "absent.flac"}) {
    const auto r = artifact::testing::run_cli({"transcribe", kModel.string(), (tmp / name).string()});
    EXPECT_EQ(r.status, std::string(name) == "absent.flac" ? 1 : 3) << name << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

}  // namespace
}  // namespace lowbit::model
