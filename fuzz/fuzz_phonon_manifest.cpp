// libFuzzer target: a Phonon packed directory's manifest through phonon::open, beside a fixed config.json.
#include "fuzz/fuzz_input.h"
#include "lowbit/artifact/phonon.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lowbit;
  static const auto dir = [] {
    // A small qwen3_asr config (as tests/artifact/phonon_test.cpp builds), so manifests get past the config.
    fuzz::write_file("phonon/config.json",
                     R"({"model_type": "qwen3_asr", "thinker_config": {"text_config": {)"
                     R"("vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, )"
                     R"("num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, )"
                     R"("head_dim": 32, "max_position_embeddings": 256, "rope_theta": 1000000.0, )"
                     R"("rms_norm_eps": 1e-6, "tie_word_embeddings": true}, "audio_config": {)"
                     R"("num_mel_bins": 8, "encoder_layers": 1, "encoder_attention_heads": 2, )"
                     R"("encoder_ffn_dim": 32, "d_model": 16, "output_dim": 64, )"
                     R"("downsample_hidden_size": 8}}})");
    return fuzz::work_dir() / "phonon";
  }();
  fuzz::write_file("phonon/" + std::string(artifact::phonon::kManifestFile), fuzz::as_text(data, size));
  return fuzz::refuse_or_accept([&] { artifact::phonon::open(dir, {.verify_hash = false}); });
}
