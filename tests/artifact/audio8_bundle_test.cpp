// audio8 mixed bundles (seed 001): a fixture writer builds small bundles (v2, and calibrated q4 with provenance);
// the corruption matrix violates every rule of the seed's loader once and expects its own error for each; round
// trips through import and export are bit-exact; the lowbit binary verifies, inspects, imports and exports them.
#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include "artifact/artifact_fixture.h"
#include "lowbit/artifact/audio8_bundle.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/codec/affine.h"
#include "lowbit/codec/offset_scale.h"
#include "lowbit/core/dtype.h"

namespace lowbit::artifact::testing {
namespace {

namespace os = codec::offset_scale;

// ---------------------------------------------------------------------------------------------------------------
// Fixture writer

struct Bundle {
  json manifest;
  std::string payload;
};

// Record indices of the base bundle, in payload order.
enum : size_t { kEmbed, kQ3, kNorm, kAudioF16, kAudioF32, kLast, kRecords };
constexpr size_t kEmbedScales = 256;  // payload offset of the embedding's scales (8 rows x 32 code bytes)
constexpr size_t kQ3Offset = 272, kNormOffset = 480, kF16Offset = 608, kF32Offset = 638;

json& rec(Bundle& b, size_t i) { return b.manifest["tensors"][i]; }

json full8_grid() {
  return {{"bits", 3},         {"zero_point", 4},  {"max_code", 7},
          {"padding_code", 4}, {"signed_min", -4}, {"signed_max", 3},
          {"inference_permutation_required", false}};
}

struct Packed {
  std::string_view precision;
  int bits;
  uint32_t max_code;
};
constexpr Packed kQ4{"q4", 4, 14}, kQ3Legacy{"q3", 3, 6}, kFull8{"q3_full8", 3, 7};

void add_packed(Bundle& b, const std::string& name, const Packed& p, int64_t rows, int64_t cols,
                std::mt19937_64& rng) {
  const int64_t row_bytes = cols * p.bits / 8, groups = cols / 64;
  std::string codes(static_cast<size_t>(rows * row_bytes), '\0');
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      os::write_code(reinterpret_cast<uint8_t*>(codes.data()) + r * row_bytes, c, p.bits,
                     static_cast<uint32_t>(rng() % (p.max_code + 1)));
  std::string scales(static_cast<size_t>(rows * groups * 2), '\0');
  for (size_t i = 0; i < scales.size() / 2; ++i) {
    const uint16_t h = static_cast<uint16_t>(0x3000 + rng() % 0xc00);  // in [2^-3, 1)
    std::memcpy(scales.data() + 2 * i, &h, 2);
  }
  const uint64_t offset = b.payload.size();
  json e = {{"name", name},
            {"offset", offset},
            {"bytes", codes.size() + scales.size()},
            {"shape", {rows, cols}},
            {"precision", p.precision},
            {"encoding", p.precision == "q3_full8" ? "uniform_lsb_full8" : "uniform_lsb"},
            {"group_size", 64},
            {"padded_cols", cols},
            {"row_bytes", row_bytes},
            {"codes_bytes", codes.size()},
            {"scales_offset", offset + codes.size()},
            {"scales_bytes", scales.size()},
            {"scales_dtype", "F16"},
            {"scales_shape", {rows, groups}}};
  if (p.precision == "q3_full8") e["grid"] = full8_grid();
  b.manifest["tensors"].push_back(std::move(e));
  b.payload += codes + scales;
}

void add_dense(Bundle& b, const std::string& name, DType dtype, const Shape& shape, std::mt19937_64& rng) {
  const auto values = random_values(rng, static_cast<size_t>(checked_numel(shape, name)));
  std::string bytes(values.size() * dtype_size(dtype), '\0');
  for (size_t i = 0; i < values.size(); ++i) store_float(dtype, bytes.data(), i, values[i]);
  b.manifest["tensors"].push_back({{"name", name},
                                   {"offset", b.payload.size()},
                                   {"bytes", bytes.size()},
                                   {"shape", shape},
                                   {"precision", "original"},
                                   {"encoding", "original"},
                                   {"source_dtype", std::string(dtype_name(dtype))}});
  b.payload += bytes;
}

std::string sha_of(std::string_view bytes) { return sha256_hex(std::as_bytes(std::span(bytes))); }

// The manifest's metadata hash and the overlay identity, as docs/FORMAT.md defines them.
std::string metadata_sha(const json& manifest) {
  json rest = manifest;
  rest.erase("provenance");
  return sha_of(rest.dump());
}

std::string range_sha(const Bundle& b, size_t i) {
  const json& r = b.manifest["tensors"][i];
  return sha_of(std::string_view(b.payload).substr(r["offset"].get<size_t>(), r["bytes"].get<size_t>()));
}

// Turns a bundle into a calibrated-q4 one: its q4 records calibrated, the others copied from a parent.
void calibrate(Bundle& b) {
  b.manifest["format"] = audio8::kFormatCalibratedQ4;
  json calibrated = json::array(), copied = json::object();
  std::string overlay;
  for (size_t i = 0; i < b.manifest["tensors"].size(); ++i) {
    const json& r = b.manifest["tensors"][i];
    const std::string name = r["name"];
    if (r["precision"] == "q4") {
      calibrated.push_back(name);
      overlay += name + "\n" + range_sha(b, i) + "\n";
    } else {
      copied[name] = range_sha(b, i);
    }
  }
  b.manifest["provenance"] = {{"method", "gptq"},
                              {"parent_manifest_sha256", std::string(64, '1')},
                              {"parent_weights_sha256", std::string(64, '2')},
                              {"calibration_sha256", std::string(64, '3')},
                              {"calibrated_tensors", calibrated},
                              {"copied_tensors", copied},
                              {"overlay_identity_sha256", sha_of(overlay)}};
  b.manifest["provenance"]["metadata_sha256"] = metadata_sha(b.manifest);
}

// A valid bundle: packed q4 embedding (tied head), q3 and q3_full8 (q4 unless v2) linears, dense BF16/F16/F32,
// an audio tower lowbit does not run.
Bundle make_bundle(std::string_view format = audio8::kFormatV2, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  Bundle b;
  b.manifest = {{"format", format},        {"group_size", 64},           {"tie_word_embeddings", true},
                {"weights_file", "weights.bin"}, {"source_revision", "rev-1"}, {"profile", "mixed-q3q4"},
                {"tensors", json::array()},
                {"aliases", {{"language_model.lm_head.weight", "language_model.model.embed_tokens.weight"}}}};
  add_packed(b, "language_model.model.embed_tokens.weight", kQ4, 8, 64, rng);
  add_packed(b, "language_model.model.layers.0.self_attn.q_proj.weight", kQ3Legacy, 4, 128, rng);
  add_dense(b, "language_model.model.norm.weight", DType::BF16, {64}, rng);
  add_dense(b, "audio_tower.proj.weight", DType::F16, {3, 5}, rng);
  add_dense(b, "audio_tower.scale", DType::F32, {6}, rng);
  add_packed(b, "language_model.model.layers.0.mlp.up_proj.weight", format == audio8::kFormatV2 ? kFull8 : kQ4, 4,
             64, rng);
  b.manifest["weights_bytes"] = b.payload.size();
  b.manifest["weights_sha256"] = sha_of(b.payload);
  if (format == audio8::kFormatCalibratedQ4) calibrate(b);
  return b;
}

void write_bundle(const fs::path& dir, const Bundle& b) {
  fs::create_directories(dir);
  write_text(dir / "weights.bin", b.payload);
  write_text(dir / "manifest.json", b.manifest.dump(1));
}

void put_u16(Bundle& b, size_t at, uint16_t v) { std::memcpy(b.payload.data() + at, &v, 2); }
void put_u32(Bundle& b, size_t at, uint32_t v) { std::memcpy(b.payload.data() + at, &v, 4); }

ForeignModel open_bundle(const fs::path& dir, ForeignOpenOptions options = {}) { return audio8::open(dir, options); }

// ---------------------------------------------------------------------------------------------------------------
// The corruption matrix

struct Case {
  const char* name;
  Errc expected;
  std::function<void(Bundle&)> edit;
  std::function<void(const fs::path&)> after_write = nullptr;    // damage on disk
  std::function<void(const fs::path&)> while_loading = nullptr;  // runs before the final re-check
  bool calibrated = false;
  bool refresh_sha = true;  // recompute weights_sha256 after the edit, so that exactly the intended rule fires
  bool verify_hash = true;
};

void append_to(const fs::path& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::app);
  f << text;
}

json& prov(Bundle& b) { return b.manifest["provenance"]; }

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // manifest.json and top-level fields
      {"manifest_missing", Errc::missing_file, [](Bundle&) {},
       [](const fs::path& d) { fs::remove(d / "manifest.json"); }},
      {"manifest_not_json", Errc::format, [](Bundle&) {},
       [](const fs::path& d) { write_text(d / "manifest.json", "{\"format\": "); }},
      {"manifest_duplicate_key", Errc::duplicate, [](Bundle&) {},
       [](const fs::path& d) {
         std::string t = read_text(d / "manifest.json");
         t.insert(1, "\"profile\": \"x\",");
         write_text(d / "manifest.json", t);
       }},
      {"manifest_not_object", Errc::format, [](Bundle&) {},
       [](const fs::path& d) { write_text(d / "manifest.json", "[]"); }},
      {"format_unknown", Errc::format, [](Bundle& b) { b.manifest["format"] = "audio8-mixed-bundle-v3"; }},
      {"format_missing", Errc::format, [](Bundle& b) { b.manifest.erase("format"); }},
      {"group_size_not_64", Errc::codec_params, [](Bundle& b) { b.manifest["group_size"] = 128; }},
      {"group_size_not_integer", Errc::codec_params, [](Bundle& b) { b.manifest["group_size"] = "64"; }},
      {"tie_word_embeddings_false", Errc::format, [](Bundle& b) { b.manifest["tie_word_embeddings"] = false; }},
      {"weights_file_with_directory", Errc::unsafe_path,
       [](Bundle& b) { b.manifest["weights_file"] = "sub/weights.bin"; }},
      {"weights_file_dotdot", Errc::unsafe_path, [](Bundle& b) { b.manifest["weights_file"] = ".."; }},
      {"weights_file_absent", Errc::missing_file, [](Bundle& b) { b.manifest["weights_file"] = "other.bin"; }},
      {"weights_file_symlinked", Errc::unsafe_path, [](Bundle&) {},
       [](const fs::path& d) {
         fs::rename(d / "weights.bin", d / "real.bin");
         fs::create_symlink("real.bin", d / "weights.bin");
       }},
      {"source_revision_missing", Errc::format, [](Bundle& b) { b.manifest.erase("source_revision"); }},
      {"profile_missing", Errc::format, [](Bundle& b) { b.manifest.erase("profile"); }},
      {"weights_bytes_differs", Errc::size_mismatch,
       [](Bundle& b) { b.manifest["weights_bytes"] = b.payload.size() + 2; }},
      {"weights_sha_mismatch", Errc::hash_mismatch, [](Bundle& b) { b.payload[kNormOffset] ^= 1; }, nullptr, nullptr,
       false, false},
      {"weights_sha_not_hex", Errc::format, [](Bundle& b) { b.manifest["weights_sha256"] = "XYZ"; }, nullptr, nullptr,
       false, false},
      // records: count, contiguity, duplicates, coverage
      {"no_records", Errc::limit, [](Bundle& b) { b.manifest["tensors"] = json::array(); }},
      {"too_many_records", Errc::limit,
       [](Bundle& b) { b.manifest["tensors"] = json::array_t(2001, rec(b, kEmbed)); }},
      {"tensors_not_array", Errc::format, [](Bundle& b) { b.manifest["tensors"] = json::object(); }},
      {"record_not_object", Errc::format, [](Bundle& b) { rec(b, kQ3) = 3; }},
      {"duplicate_name", Errc::duplicate, [](Bundle& b) { rec(b, kQ3)["name"] = rec(b, kEmbed)["name"]; }},
      {"first_offset_not_zero", Errc::layout, [](Bundle& b) { rec(b, kEmbed)["offset"] = 2; }},
      {"offset_gap", Errc::layout, [](Bundle& b) { rec(b, kNorm)["offset"] = kNormOffset + 2; }},
      {"offset_overlap", Errc::layout, [](Bundle& b) { rec(b, kNorm)["offset"] = kNormOffset - 2; }},
      {"bytes_zero", Errc::layout, [](Bundle& b) { rec(b, kNorm)["bytes"] = 0; }},
      {"bytes_not_integer", Errc::layout, [](Bundle& b) { rec(b, kNorm)["bytes"] = 128.5; }},
      {"record_outside_payload", Errc::layout, [](Bundle& b) { rec(b, kLast)["bytes"] = 106; }},
      {"unreferenced_bytes", Errc::layout,
       [](Bundle& b) {
         b.payload += "zz";
         b.manifest["weights_bytes"] = b.payload.size();
       }},
      {"full8_in_v1", Errc::version, [](Bundle& b) { b.manifest["format"] = audio8::kFormatV1; }},
      // dense records
      {"dense_encoding", Errc::format, [](Bundle& b) { rec(b, kNorm)["encoding"] = "uniform_lsb"; }},
      {"dense_dtype", Errc::dtype, [](Bundle& b) { rec(b, kNorm)["source_dtype"] = "F64"; }},
      {"dense_shape_empty", Errc::shape, [](Bundle& b) { rec(b, kNorm)["shape"] = json::array(); }},
      {"dense_shape_zero", Errc::shape, [](Bundle& b) { rec(b, kNorm)["shape"] = {0, 64}; }},
      {"dense_shape_not_integer", Errc::shape, [](Bundle& b) { rec(b, kNorm)["shape"] = {"64"}; }},
      {"dense_bytes_differ_from_shape", Errc::size_mismatch, [](Bundle& b) { rec(b, kNorm)["shape"] = {32}; }},
      {"dense_over_64_MiB", Errc::limit,
       [](Bundle& b) {
         b.manifest["tensors"].erase(kLast);
         const uint64_t bytes = (uint64_t{64} << 20) + 4;
         rec(b, kAudioF32)["shape"] = {bytes / 4};
         rec(b, kAudioF32)["bytes"] = bytes;
         b.manifest["weights_bytes"] = kF32Offset + bytes;
       },
       [](const fs::path& d) { fs::resize_file(d / "weights.bin", kF32Offset + (uint64_t{64} << 20) + 4); },
       nullptr, false, false, false},
      {"dense_nan_bf16", Errc::non_finite, [](Bundle& b) { put_u16(b, kNormOffset + 2, 0x7fc0); }},
      {"dense_inf_f16", Errc::non_finite, [](Bundle& b) { put_u16(b, kF16Offset, 0x7c00); }},
      {"dense_nan_f32", Errc::non_finite, [](Bundle& b) { put_u32(b, kF32Offset + 4, 0x7fc00000u); }},
      // packed records: precision and grid metadata
      {"packed_precision_unknown", Errc::codec_params, [](Bundle& b) { rec(b, kQ3)["precision"] = "q2"; }},
      {"packed_encoding_wrong", Errc::codec_params,
       [](Bundle& b) { rec(b, kEmbed)["encoding"] = "uniform_lsb_full8"; }},
      {"legacy_with_grid", Errc::codec_params, [](Bundle& b) { rec(b, kQ3)["grid"] = full8_grid(); }},
      {"full8_encoding_legacy", Errc::codec_params, [](Bundle& b) { rec(b, kLast)["encoding"] = "uniform_lsb"; }},
      {"full8_grid_missing", Errc::codec_params, [](Bundle& b) { rec(b, kLast).erase("grid"); }},
      {"full8_grid_zero_point", Errc::codec_params, [](Bundle& b) { rec(b, kLast)["grid"]["zero_point"] = 3; }},
      {"full8_grid_permutation", Errc::codec_params,
       [](Bundle& b) { rec(b, kLast)["grid"]["inference_permutation_required"] = true; }},
      // packed records: dimensions
      {"packed_shape_rank", Errc::shape, [](Bundle& b) { rec(b, kEmbed)["shape"] = {8, 64, 1}; }},
      {"packed_rows_over_bound", Errc::limit, [](Bundle& b) { rec(b, kEmbed)["shape"] = {262145, 64}; }},
      {"packed_columns_over_bound", Errc::limit, [](Bundle& b) { rec(b, kEmbed)["shape"] = {8, 32832}; }},
      {"packed_columns_not_multiple_of_64", Errc::shape, [](Bundle& b) { rec(b, kEmbed)["shape"] = {8, 96}; }},
      // packed records: every derived storage field
      {"derived_group_size", Errc::codec_params, [](Bundle& b) { rec(b, kEmbed)["group_size"] = 32; }},
      {"derived_padded_cols", Errc::codec_params, [](Bundle& b) { rec(b, kEmbed)["padded_cols"] = 128; }},
      {"derived_row_bytes", Errc::layout, [](Bundle& b) { rec(b, kQ3)["row_bytes"] = 64; }},
      {"derived_row_bytes_missing", Errc::layout, [](Bundle& b) { rec(b, kQ3).erase("row_bytes"); }},
      {"derived_codes_bytes", Errc::layout, [](Bundle& b) { rec(b, kQ3)["codes_bytes"] = 190; }},
      {"derived_scales_offset", Errc::layout, [](Bundle& b) { rec(b, kQ3)["scales_offset"] = 0; }},
      {"derived_scales_bytes", Errc::layout, [](Bundle& b) { rec(b, kQ3)["scales_bytes"] = 32; }},
      {"derived_scales_dtype", Errc::dtype, [](Bundle& b) { rec(b, kQ3)["scales_dtype"] = "BF16"; }},
      {"derived_scales_shape", Errc::shape, [](Bundle& b) { rec(b, kQ3)["scales_shape"] = {2, 4}; }},
      {"derived_bytes", Errc::layout,
       [](Bundle& b) {
         b.payload += "zz";
         b.manifest["weights_bytes"] = b.payload.size();
         rec(b, kLast)["bytes"] = rec(b, kLast)["bytes"].get<int>() + 2;
       }},
      // packed content
      {"scale_nan", Errc::non_finite, [](Bundle& b) { put_u16(b, kEmbedScales, 0x7e00); }},
      {"scale_inf", Errc::non_finite, [](Bundle& b) { put_u16(b, kEmbedScales + 2, 0x7c00); }},
      {"scale_zero", Errc::non_finite, [](Bundle& b) { put_u16(b, kEmbedScales + 4, 0x0000); }},
      {"scale_negative", Errc::non_finite, [](Bundle& b) { put_u16(b, kEmbedScales + 6, 0xbc00); }},
      {"reserved_code_q4", Errc::reserved_code, [](Bundle& b) { b.payload[33] |= 0x0f; }},
      {"reserved_code_q3", Errc::reserved_code, [](Bundle& b) { b.payload[kQ3Offset + 48] |= 0x07; }},
      // names and aliases
      {"name_ambiguous_outside_prefix", Errc::unsupported, [](Bundle& b) { rec(b, kAudioF16)["name"] = "model.x"; }},
      {"aliases_missing", Errc::format, [](Bundle& b) { b.manifest.erase("aliases"); }},
      {"alias_shadows_tensor", Errc::duplicate,
       [](Bundle& b) { b.manifest["aliases"]["audio_tower.scale"] = "audio_tower.proj.weight"; }},
      {"alias_target_missing", Errc::format,
       [](Bundle& b) { b.manifest["aliases"]["language_model.lm_head.weight"] = "language_model.nothing"; }},
      {"tied_head_missing", Errc::format, [](Bundle& b) { b.manifest["aliases"] = json::object(); }},
      {"tied_head_elsewhere", Errc::format,
       [](Bundle& b) { b.manifest["aliases"]["language_model.lm_head.weight"] = rec(b, kQ3)["name"]; }},
      {"embedding_missing", Errc::format,
       [](Bundle& b) {
         rec(b, kEmbed)["name"] = "language_model.model.embed.weight";
         b.manifest["aliases"]["language_model.lm_head.weight"] = "language_model.model.embed.weight";
       }},
      // config.json beside the manifest
      {"config_hash_mismatch", Errc::hash_mismatch,
       [](Bundle& b) {
         b.manifest["external_assets_not_included"] = {{"config.json", {{"sha256", std::string(64, '0')}}}};
       },
       [](const fs::path& d) { write_text(d / "config.json", "{}"); }},
      {"config_hash_not_hex", Errc::format,
       [](Bundle& b) { b.manifest["external_assets_not_included"] = {{"config.json", {{"sha256", "abc"}}}}; }},
      {"config_not_json", Errc::format, [](Bundle&) {},
       [](const fs::path& d) { write_text(d / "config.json", "{"); }},
      // while loading
      {"payload_changed_while_loading", Errc::changed, [](Bundle&) {}, nullptr,
       [](const fs::path& d) { append_to(d / "weights.bin", "x"); }},
      {"manifest_changed_while_loading", Errc::changed, [](Bundle&) {}, nullptr,
       [](const fs::path& d) { append_to(d / "manifest.json", " "); }},
      {"payload_changed_without_hashes", Errc::changed, [](Bundle&) {}, nullptr,
       [](const fs::path& d) { append_to(d / "weights.bin", "x"); }, false, true, false},
      // calibrated q4: the provenance block
      {"calibrated_provenance_missing", Errc::format, [](Bundle& b) { b.manifest.erase("provenance"); }, nullptr,
       nullptr, true},
      {"calibrated_provenance_unknown_field", Errc::format, [](Bundle& b) { prov(b)["note"] = 1; }, nullptr, nullptr,
       true},
      {"calibrated_method", Errc::format, [](Bundle& b) { prov(b)["method"] = "awq"; }, nullptr, nullptr, true},
      {"calibrated_parent_hash_not_hex", Errc::format, [](Bundle& b) { prov(b)["parent_weights_sha256"] = "00"; },
       nullptr, nullptr, true},
      {"calibrated_metadata_hash", Errc::hash_mismatch, [](Bundle&) {},
       [](const fs::path& d) {
         json m = json::parse(read_text(d / "manifest.json"));
         m["profile"] = "other";
         write_text(d / "manifest.json", m.dump(1));
       },
       nullptr, true},
      {"calibrated_copied_range_hash", Errc::hash_mismatch, [](Bundle& b) { b.payload[kNormOffset] ^= 1; }, nullptr,
       nullptr, true},
      {"calibrated_overlay_identity", Errc::hash_mismatch, [](Bundle& b) { put_u16(b, kEmbedScales, 0x2000); },
       nullptr, nullptr, true},
      {"calibrated_not_q4", Errc::format,
       [](Bundle& b) {
         const std::string name = rec(b, kQ3)["name"];
         prov(b)["calibrated_tensors"].push_back(name);
         prov(b)["copied_tensors"].erase(name);
       },
       nullptr, nullptr, true},
      {"calibrated_record_uncovered", Errc::format,
       [](Bundle& b) { prov(b)["copied_tensors"].erase(rec(b, kNorm)["name"].get<std::string>()); }, nullptr,
       nullptr, true},
      {"calibrated_and_copied", Errc::duplicate,
       [](Bundle& b) { prov(b)["copied_tensors"][rec(b, kEmbed)["name"].get<std::string>()] = std::string(64, 'a'); },
       nullptr, nullptr, true},
      {"calibrated_names_unknown_tensor", Errc::format,
       [](Bundle& b) { prov(b)["copied_tensors"]["ghost"] = std::string(64, 'a'); }, nullptr, nullptr, true},
      {"calibrated_name_repeated", Errc::format,
       [](Bundle& b) { prov(b)["calibrated_tensors"].push_back(rec(b, kEmbed)["name"]); }, nullptr, nullptr, true},
      {"calibrated_with_full8", Errc::version, [](Bundle& b) { rec(b, kLast)["precision"] = "q3_full8"; }, nullptr,
       nullptr, true},
  };
  return all;
}

TEST(Audio8Bundle, BaseBundlesOpen) {
  for (std::string_view format : {audio8::kFormatV1, audio8::kFormatV2, audio8::kFormatCalibratedQ4}) {
    TempDir tmp;
    write_bundle(tmp.path(), make_bundle(format));
    EXPECT_TRUE(audio8::recognizes(tmp.path())) << format;
    const ForeignModel m = open_bundle(tmp.path());
    EXPECT_EQ(m.format, format);
    ASSERT_EQ(m.tensors.size(), size_t{kRecords});
  }
}

TEST(Audio8Bundle, CorruptionMatrix) {
  std::set<std::string> names, messages;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(names.insert(c.name).second) << "case listed twice";
    TempDir tmp;
    const fs::path dir = tmp / "bundle";
    Bundle b = make_bundle(c.calibrated ? audio8::kFormatCalibratedQ4 : audio8::kFormatV2);
    c.edit(b);
    if (c.refresh_sha) b.manifest["weights_sha256"] = sha_of(b.payload);
    if (c.calibrated && b.manifest.contains("provenance")) b.manifest["provenance"]["metadata_sha256"] = metadata_sha(b.manifest);
    write_bundle(dir, b);
    if (c.after_write) c.after_write(dir);
    ForeignOpenOptions options{.verify_hash = c.verify_hash};
    if (c.while_loading) options.before_recheck = [&] { c.while_loading(dir); };
    std::string message;
    EXPECT_EQ(error_of([&] { open_bundle(dir, options); }, &message), c.expected) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(dir.string()), std::string::npos) << "names the file: " << message;
    // Each case is rejected by its own check: no two messages are the same once the directory is removed.
    for (size_t at; (at = message.find(dir.string())) != std::string::npos;) message.replace(at, dir.string().size(), "DIR");
    EXPECT_TRUE(messages.insert(message).second) << "same message as another case: " << message;
  }
  RecordProperty("corruption_kinds", static_cast<int>(cases().size()));
}

// ---------------------------------------------------------------------------------------------------------------
// Contents, names, config

TEST(Audio8Bundle, PackedRecordsDecodeAsTheSeedsGrids) {
  TempDir tmp;
  const Bundle b = make_bundle();
  write_bundle(tmp.path(), b);
  const ForeignModel m = open_bundle(tmp.path());
  // seed 001: q4 codes c -> (c + 1 - 8) * s, legacy q3 c -> (c + 1 - 4) * s, full8 c -> (c - 4) * s.
  const std::pair<size_t, int> records[] = {{kEmbed, 7}, {kQ3, 3}, {kLast, 4}};
  for (const auto& [index, zero] : records) {
    const auto& [name, ref] = m.tensors[index];
    const auto [rows, cols] = codec::matrix_dims(ref.shape);
    const auto* codes = reinterpret_cast<const uint8_t*>(ref.arrays.at("codes").bytes.data());
    const auto* scales = reinterpret_cast<const uint16_t*>(ref.arrays.at("scales").bytes.data());
    const int bits = index == kEmbed ? 4 : 3;
    const std::vector<float> decoded = codec::decode_all(ref);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int code = static_cast<int>(os::read_code(codes + r * (cols * bits / 8), c, bits));
        ASSERT_EQ(decoded[r * cols + c], static_cast<float>(code - zero) * f16_to_f32(scales[r * (cols / 64) + c / 64]))
            << name;
      }
  }
  EXPECT_EQ(m.tensors[kEmbed].first, "model.embed_tokens.weight");
  EXPECT_EQ(m.tensors[kAudioF16].first, "audio_tower.proj.weight");
  ASSERT_EQ(m.aliases.size(), 1u);
  EXPECT_EQ(m.aliases[0], (std::pair<std::string, std::string>{"lm_head.weight", "model.embed_tokens.weight"}));
  EXPECT_TRUE(m.config.is_null());
  ASSERT_EQ(m.unsupported.size(), 2u);
  EXPECT_EQ(m.unsupported[0], "audio_tower (2 tensors)");
  EXPECT_NE(m.unsupported[1].find("no config.json"), std::string::npos) << m.unsupported[1];
  EXPECT_EQ(m.recipe["source_format"], audio8::kFormatV2);
}

TEST(Audio8Bundle, ConfigBesideManifestIsCheckedAgainstItsDeclaredHash) {
  TempDir tmp;
  const json text_config = {{"model_type", "qwen3"}, {"hidden_size", 64}};
  const std::string config = json{{"model_type", "audio8"}, {"text_config", text_config}}.dump();
  Bundle b = make_bundle();
  b.manifest["external_assets_not_included"] = {{"config.json", {{"sha256", sha_of(config)}}}};
  write_bundle(tmp.path(), b);
  write_text(tmp / "config.json", config);
  const ForeignModel m = open_bundle(tmp.path());
  EXPECT_EQ(m.config, text_config);
  EXPECT_EQ(m.unsupported, std::vector<std::string>{"audio_tower (2 tensors)"});
}

TEST(Audio8Bundle, RecognizesOnlyBundles) {
  TempDir tmp;
  EXPECT_FALSE(audio8::recognizes(tmp.path()));
  write_text(tmp / "manifest.json", "{\"format\": \"audio8-mixed-bundle-v2\"");  // not JSON
  EXPECT_FALSE(audio8::recognizes(tmp.path()));
  write_text(tmp / "manifest.json", R"({"format": "lowbit-artifact", "provenance": {"format": "audio8-mixed-bundle-v2"}})");
  EXPECT_FALSE(audio8::recognizes(tmp.path()));
  write_bundle(tmp / "b", make_bundle());
  EXPECT_TRUE(audio8::recognizes(tmp / "b"));
  ArtifactWriter w(tmp / "imported");
  import_foreign(open_bundle(tmp / "b"), w);
  w.commit();
  EXPECT_FALSE(audio8::recognizes(tmp / "imported"));  // its provenance names the bundle's format
  EXPECT_EQ(find_foreign_format(tmp / "imported"), nullptr);
  ASSERT_NE(find_foreign_format(tmp / "b"), nullptr);
}

// ---------------------------------------------------------------------------------------------------------------
// Round trips

void import_into(const fs::path& bundle, const fs::path& out) {
  ArtifactWriter w(out);
  import_foreign(open_bundle(bundle), w);
  w.commit();
}

TEST(Audio8Bundle, ExportOfImportReproducesThePayload) {
  for (std::string_view format : {audio8::kFormatV1, audio8::kFormatV2}) {
    TempDir tmp;
    const Bundle b = make_bundle(format);
    write_bundle(tmp / "b", b);
    import_into(tmp / "b", tmp / "a");
    audio8::export_bundle(Artifact::open(tmp / "a"), tmp / "b2", {.format = format});
    EXPECT_EQ(read_text(tmp / "b2" / "weights.bin"), b.payload) << format;
    const json m2 = json::parse(read_text(tmp / "b2" / "manifest.json"));
    EXPECT_EQ(m2["tensors"], b.manifest["tensors"]);
    EXPECT_EQ(m2["aliases"], b.manifest["aliases"]);
    for (const char* key : {"format", "weights_sha256", "weights_bytes", "source_revision", "profile"})
      EXPECT_EQ(m2[key], b.manifest[key]) << key;
    open_bundle(tmp / "b2");
  }
}

void expect_same_arrays(const codec::TensorRef& a, const codec::TensorRef& b, const std::string& name) {
  EXPECT_EQ(a.codec, b.codec) << name;
  EXPECT_EQ(a.params, b.params) << name;
  EXPECT_EQ(a.shape, b.shape) << name;
  ASSERT_EQ(a.arrays.items.size(), b.arrays.items.size()) << name;
  for (size_t i = 0; i < a.arrays.items.size(); ++i) {
    const auto x = a.arrays.items[i].second.bytes, y = b.arrays.items[i].second.bytes;
    EXPECT_TRUE(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin())) << name << " " << a.arrays.items[i].first;
  }
}

TEST(Audio8Bundle, ImportOfExportKeepsCodesAndScales) {
  TempDir tmp;
  write_exportable_artifact(tmp / "a");
  const Artifact a = Artifact::open(tmp / "a");
  audio8::export_bundle(a, tmp / "b");
  EXPECT_TRUE(fs::exists(tmp / "b" / "config.json"));
  EXPECT_TRUE(fs::exists(tmp / "b" / "tokenizer.json"));
  import_into(tmp / "b", tmp / "a2");
  const Artifact a2 = Artifact::open(tmp / "a2");
  EXPECT_EQ(a2.tensor_names(), a.tensor_names());
  for (const std::string& name : a.tensor_names()) expect_same_arrays(a.tensor(name), a2.tensor(name), name);
  EXPECT_EQ(a2.config()["model_type"], "qwen3");
  EXPECT_EQ(a2.files_with_role(FileRole::tokenizer).size(), 1u);
  EXPECT_EQ(error_of([&] { audio8::export_bundle(a, tmp / "b"); }), Errc::exists);
  audio8::export_bundle(a, tmp / "b", {.force = true});
  audio8::export_bundle(a, (tmp / "c").string() + "/");
  EXPECT_EQ(read_text(tmp / "c" / "weights.bin"), read_text(tmp / "b" / "weights.bin"));
  EXPECT_EQ(error_of([&] { audio8::export_bundle(a, tmp / "v1", {.format = audio8::kFormatV1}); }),
            Errc::unsupported);  // q3_full8 needs v2
}

// An affine tensor [rows, 64 * groups] with biases -offset x scale and codes in [lo, hi].
codec::EncodedTensor affine_tensor(int bits, int64_t rows, int64_t cols, uint32_t offset, uint32_t lo, uint32_t hi,
                                   std::mt19937_64& rng, bool bias_off = false) {
  codec::EncodedTensor t;
  t.params = {{"bits", bits}, {"group_size", 64}, {"scale_dtype", "f32"}, {"padded_cols", cols}};
  TensorBuffer codes = make_buffer(DType::U32, {rows, cols * bits / 32});
  TensorBuffer scales = make_buffer(DType::F32, {rows, cols / 64});  // F16-exact values
  TensorBuffer biases = make_buffer(DType::F32, {rows, cols / 64});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      codec::affine::write_code(codes.as<uint32_t>() + r * (cols * bits / 32), c, bits,
                                lo + static_cast<uint32_t>(rng() % (hi - lo + 1)));
  for (int64_t i = 0; i < rows * cols / 64; ++i) {
    const float s = f16_to_f32(static_cast<uint16_t>(0x2c00 + rng() % 0x400));
    scales.as<float>()[i] = s;
    biases.as<float>()[i] = -static_cast<float>(offset) * s + (bias_off ? 0.01f : 0.0f);
  }
  t.arrays.emplace_back("codes", std::move(codes));
  t.arrays.emplace_back("scales", std::move(scales));
  t.arrays.emplace_back("biases", std::move(biases));
  return t;
}

TEST(Audio8Bundle, AffineWithImpliedOffsetsExportsLosslessly) {
  TempDir tmp;
  std::mt19937_64 rng(3);
  {
    ArtifactWriter w(tmp / "a");
    w.add("model.embed_tokens.weight", {8, 128}, "affine", affine_tensor(4, 8, 128, 8, 1, 15, rng));  // seed's MLX form
    w.add("model.layers.0.a.weight", {4, 64}, "affine", affine_tensor(4, 4, 64, 7, 0, 14, rng));
    w.add("model.layers.0.b.weight", {4, 64}, "affine", affine_tensor(3, 4, 64, 4, 1, 7, rng));  // v1: q3
    w.add("model.layers.0.c.weight", {4, 64}, "affine", affine_tensor(3, 4, 64, 3, 0, 6, rng));
    w.commit();
  }
  const Artifact a = Artifact::open(tmp / "a");
  for (std::string_view format : {audio8::kFormatV2, audio8::kFormatV1}) {
    const fs::path b = tmp / std::string(format), a2 = tmp / (std::string(format) + "-a");
    audio8::export_bundle(a, b, {.format = format});
    import_into(b, a2);
    const Artifact imported = Artifact::open(a2);
    const char* precisions[] = {"q4", "q4", format == audio8::kFormatV2 ? "q3_full8" : "q3", "q3"};
    for (size_t i = 0; i < 4; ++i) {
      const std::string name = a.tensor_names()[i];
      EXPECT_EQ(imported.tensor(name).params["precision"], precisions[i]) << name;
      EXPECT_EQ(codec::decode_all(imported.tensor(name)), codec::decode_all(a.tensor(name))) << name;
    }
  }
}

TEST(Audio8Bundle, ExportRefusesWhatNoPrecisionHolds) {
  TempDir tmp;
  std::mt19937_64 rng(5);
  const auto refused = [&](const std::string& dir, codec::EncodedTensor bad) {
    {
      ArtifactWriter w(tmp / dir);
      w.add("model.embed_tokens.weight", {4, 64}, "affine", affine_tensor(4, 4, 64, 8, 1, 15, rng));
      w.add("model.layers.0.bad.weight", {4, 64}, "affine", std::move(bad));
      w.commit();
    }
    std::string message;
    EXPECT_EQ(error_of([&] { audio8::export_bundle(Artifact::open(tmp / dir), tmp / (dir + "-b")); }, &message),
              Errc::unsupported);
    EXPECT_NE(message.find("model.layers.0.bad.weight"), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(tmp / (dir + "-b")));
  };
  refused("bias", affine_tensor(4, 4, 64, 8, 1, 15, rng, true));
  refused("code", affine_tensor(4, 4, 64, 7, 0, 15, rng));  // 15 on offset 7 is q4's reserved code
  refused("bits", affine_tensor(2, 4, 64, 2, 0, 3, rng));
  {
    ArtifactWriter w(tmp / "untied");
    w.add("model.embed_tokens.weight", {4, 64}, "affine", affine_tensor(4, 4, 64, 8, 1, 15, rng));
    w.add("lm_head.weight", {4, 64}, "affine", affine_tensor(4, 4, 64, 8, 1, 15, rng));
    w.commit();
  }
  EXPECT_EQ(error_of([&] { audio8::export_bundle(Artifact::open(tmp / "untied"), tmp / "untied-b"); }),
            Errc::unsupported);
}

// ---------------------------------------------------------------------------------------------------------------
// The lowbit binary

TEST(Audio8Bundle, CliVerifyInspectImportExport) {
  TempDir tmp;
  const fs::path b = tmp / "b", a = tmp / "a", b2 = tmp / "b2";
  const Bundle bundle = make_bundle();
  write_bundle(b, bundle);
  CliResult r = run_cli({"verify", b.string()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("OK: audio8-mixed-bundle-v2, 6 tensors, 1 aliases"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("audio_tower (2 tensors)"), std::string::npos) << r.out;
  r = run_cli({"inspect", "--json", b.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  const json inspected = json::parse(r.out);
  EXPECT_EQ(inspected["format"], "audio8-mixed-bundle-v2");
  EXPECT_EQ(inspected["tensors"].size(), 6u);
  EXPECT_EQ(inspected["tensors"][0]["codec"], "offset_scale");
  r = run_cli({"import", b.string(), a.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(run_cli({"verify", a.string()}).status, 0);
  r = run_cli({"export", a.string(), b2.string(), "--format", "audio8-v2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read_text(b2 / "weights.bin"), bundle.payload);
  EXPECT_EQ(run_cli({"export", a.string(), b2.string()}).status, 1);  // exists
  EXPECT_EQ(run_cli({"export", a.string(), (tmp / "b3").string(), "--format", "gguf"}).status, 2);

  Bundle bad = bundle;
  rec(bad, kQ3)["row_bytes"] = 7;
  write_bundle(tmp / "bad", bad);
  for (const char* command : {"verify", "inspect", "import"}) {
    std::vector<std::string> args = {command, (tmp / "bad").string()};
    if (std::string_view(command) == "import") args.push_back((tmp / "bad-a").string());
    r = run_cli(args);
    EXPECT_EQ(r.status, 3) << command << ": " << r.err;
    EXPECT_NE(r.err.find("field 'row_bytes' = 7, expected 48"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(tmp / "bad-a"));
}

}  // namespace
}  // namespace lowbit::artifact::testing
