#include "lowbit/artifact/records.h"

#include <map>

#include "json_fields.h"
#include "lowbit/artifact/audio8_bundle.h"
#include "lowbit/artifact/phonon.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"

namespace lowbit::artifact {

namespace {

using detail::Fields;
using nlohmann::json;

constexpr std::string_view kOp = "[verify]";

json parse_record(std::string_view text, std::string_view source) {
  if (text.size() > kMaxRecordBytes)
    fail(Errc::limit, "{} {}: {} bytes, more than the limit {}", kOp, source, text.size(), kMaxRecordBytes);
  return io::parse_json(text, "verify", source);
}

// A restated fact must equal the manifest's or the codec's; `field` names it in the file `source`.
template <typename T>
void expect_equal(const T& stated, const T& actual, Errc code, std::string_view source, const std::string& field) {
  if (!(stated == actual))
    fail(code, "{} {}: {}: states {}, the manifest and its codecs give {}", kOp, source, field, json(stated).dump(),
         json(actual).dump());
}

uint64_t stored_bytes(const TensorEntry& t) {
  uint64_t bytes = 0;
  for (const ArrayEntry& a : t.arrays)
    bytes = checked_add(bytes, checked_mul(checked_shape_numel(a.shape, t.name), dtype_size(a.dtype), t.name), t.name);
  return bytes;
}

double average_bits(uint64_t bytes, uint64_t weights) { return weights ? 8.0 * bytes / weights : 0.0; }

const TensorEntry& named_tensor(Fields& f, const Manifest& m, std::string_view source, const std::string& field) {
  const std::string name = f.name("name");
  const TensorEntry* t = m.find_tensor(name);
  if (!t) fail(Errc::format, "{} {}: {}.name: no tensor '{}' in the manifest", kOp, source, field, name);
  return *t;
}

// allocation: --target-bpw's budget and, per tensor, the measured candidates and the index of the chosen one, whose
// codec must be the tensor's.
void check_allocation(const json& a, const Manifest& m, std::string_view source, const std::string& where) {
  Fields f(a, source, where, kOp);
  f.number("target_bits_per_weight");
  const std::string scope = f.string("scope", 16);
  if (scope != "linears" && scope != "all") fail(Errc::format, "{} {}: {}.scope: must be \"linears\" or \"all\"", kOp, source, where);
  f.unsigned_integer("budget_bytes");
  f.unsigned_integer("bytes");
  f.boolean("feasible");
  const json& choices = f.object("choices");
  for (const auto& [name, choice] : choices.items()) {
    const std::string field = fmt::format("{}.choices[{}]", where, io::quote(name));
    const TensorEntry* t = m.find_tensor(name);
    if (!t) fail(Errc::format, "{} {}: {}: no tensor of that name in the manifest", kOp, source, field);
    Fields c(choice, source, field, kOp);
    const uint64_t chosen = c.unsigned_integer("chosen");
    const json& candidates = c.array("candidates", 64);
    if (chosen >= candidates.size())
      fail(Errc::format, "{} {}: {}.chosen: {} is not a candidate index", kOp, source, field, chosen);
    for (size_t k = 0; k < candidates.size(); ++k) {
      const std::string cf = fmt::format("{}.candidates[{}]", field, k);
      Fields cand(candidates[k], source, cf, kOp);
      const std::string codec = cand.string("codec", kMaxNameBytes);
      codec::codec_or_throw(codec, fmt::format("{} {}: {}.codec", kOp, source, cf));
      cand.object("params");
      cand.unsigned_integer("bytes");
      cand.number("loss");
      cand.unsigned_integer("sampled_rows");
      cand.finish();
      if (k == chosen) expect_equal(codec, t->codec, Errc::format, source, cf + ".codec");
    }
    c.finish();
  }
  f.finish();
}

void check_quantize_report(const json& report, const Manifest& m, uint64_t artifact_bytes, std::string_view source) {
  Fields f(report, source, "quantize", kOp);
  const json& tensors = f.array("tensors", kMaxTensors);
  std::map<std::string, bool, std::less<>> seen;
  uint64_t weights = 0, bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string field = fmt::format("quantize.tensors[{}]", i);
    Fields t(tensors[i], source, field, kOp);
    const TensorEntry& entry = named_tensor(t, m, source, field);
    if (!seen.emplace(entry.name, true).second)
      fail(Errc::duplicate, "{} {}: {}.name: tensor '{}' reported twice", kOp, source, field, entry.name);
    expect_equal(t.shape("shape"), entry.shape, Errc::shape, source, field + ".shape");
    expect_equal(t.string("codec", kMaxNameBytes), entry.codec, Errc::format, source, field + ".codec");
    const std::string method = t.string("method", 16);
    if (method != "dense" && method != "rtn" && method != "gptq" && method != "block_ldlq" && method != "reused")
      fail(Errc::format, "{} {}: {}.method: unknown method {}", kOp, source, field, io::quote(method));
    const codec::Codec& codec = codec::codec_or_throw(entry.codec, kOp);
    expect_equal(t.number("bits_per_weight"), codec::bits_per_weight(codec, entry.params, entry.shape), Errc::format,
                 source, field + ".bits_per_weight");
    const uint64_t stored = stored_bytes(entry);
    expect_equal(t.unsigned_integer("bytes"), stored, Errc::size_mismatch, source, field + ".bytes");
    for (const char* loss : {"proxy_loss", "rtn_proxy_loss"})
      if (t.number(loss) < 0) fail(Errc::format, "{} {}: {}.{}: must not be negative", kOp, source, field, loss);
    t.unsigned_integer("rtn_proxy_loss_sampled_rows");
    t.boolean("guard_tripped");
    // rows the tensor's Hessian came from (an MoE expert's: the tokens routed to it); -1 without calibration;
    // absent in artifacts quantized before the field existed
    if (const auto* rows = t.optional("calibration_rows"); rows && !(rows->is_number_integer() && *rows >= -1))
      fail(Errc::format, "{} {}: {}.calibration_rows: {} is not a row count or -1", kOp, source, field, rows->dump());
    t.finish();
    weights += checked_shape_numel(entry.shape, entry.name);
    bytes += stored;
  }
  expect_equal(f.unsigned_integer("weights"), weights, Errc::format, source, "quantize.weights");
  expect_equal(f.unsigned_integer("bytes"), bytes, Errc::size_mismatch, source, "quantize.bytes");
  expect_equal(f.number("bits_per_weight"), average_bits(bytes, weights), Errc::format, source,
               "quantize.bits_per_weight");
  const double linear = f.number("linear_bits_per_weight");
  if (linear < 0) fail(Errc::format, "{} {}: quantize.linear_bits_per_weight: must not be negative", kOp, source);
  expect_equal(f.unsigned_integer("artifact_bytes"), artifact_bytes, Errc::size_mismatch, source,
               "quantize.artifact_bytes");
  if (f.number("wall_seconds") < 0) fail(Errc::format, "{} {}: quantize.wall_seconds: must not be negative", kOp, source);
  f.unsigned_integer("peak_rss_bytes");
  // sampled peaks, anonymous and file-backed apart; absent in artifacts quantized before the fields existed
  for (const char* key : {"peak_rss_anon_bytes", "peak_rss_file_bytes"})
    if (const json* v = f.optional(key); v && !v->is_number_unsigned())
      fail(Errc::format, "{} {}: quantize.{}: {} is not a byte count", kOp, source, key, v->dump());
  f.unsigned_integer("calibration_tokens");
  f.boolean("source_quantized");
  if (const json* a = f.nullable_object("allocation")) check_allocation(*a, m, source, "quantize.allocation");
  const auto rotation = m.provenance.seeds.find("rotation");
  const json* fold = f.nullable_object("fold");
  if (bool(fold) != (rotation != m.provenance.seeds.end()))
    fail(Errc::format, "{} {}: quantize.fold: {} but the manifest's provenance.seeds {}", kOp, source,
         fold ? "present" : "null", fold ? "has no rotation seed" : "has a rotation seed");
  if (fold) {
    Fields ff(*fold, source, "quantize.fold", kOp);
    expect_equal(ff.unsigned_integer("seed"), rotation->second, Errc::format, source, "quantize.fold.seed");
    if (ff.number("kld") < 0) fail(Errc::format, "{} {}: quantize.fold.kld: must not be negative", kOp, source);
    const json& deviations = ff.array("deviations", kMaxTensors);
    for (size_t i = 0; i < deviations.size(); ++i)
      if (!deviations[i].is_string() || deviations[i].get<std::string>().size() > kMaxNameBytes)
        fail(Errc::format, "{} {}: quantize.fold.deviations[{}]: must be a string of at most {} bytes", kOp, source, i,
             kMaxNameBytes);
    ff.finish();
  }
  if (const json* cache = f.nullable_object("calibration_cache")) {
    Fields c(*cache, source, "quantize.calibration_cache", kOp);
    const json& dir = c.required("directory");
    if (!dir.is_null() && !dir.is_string())
      fail(Errc::format, "{} {}: quantize.calibration_cache.directory: must be a string or null", kOp, source);
    for (const char* key : {"layers_reused", "layers_computed", "entries_rejected"}) c.unsigned_integer(key);
    for (const char* key : {"seconds_saved", "seconds_spent"}) c.number(key);
    c.finish();
  }
  f.finish();
}

void check_choice(Fields& f, std::string_view source) {
  codec::codec_or_throw(f.string("codec", kMaxNameBytes), fmt::format("{} {}: {}", kOp, source, f.path("codec")));
  f.object("params");
}

// A rule as Recipe::to_json writes it (docs/RECIPES.md): `match` (not in the default), then one codec with its
// params or a list of candidates, and an optional padding fallback.
void check_rule(const json& rule, bool is_default, std::string_view source, const std::string& where) {
  Fields f(rule, source, where, kOp);
  if (!is_default) f.string("match", kMaxNameBytes);
  if (f.optional("candidates")) {
    const json& candidates = f.array("candidates", 64);
    if (candidates.empty()) fail(Errc::format, "{} {}: {}.candidates: must not be empty", kOp, source, where);
    for (size_t i = 0; i < candidates.size(); ++i) {
      Fields c(candidates[i], source, fmt::format("{}.candidates[{}]", where, i), kOp);
      check_choice(c, source);
      c.finish();
    }
  } else {
    check_choice(f, source);
  }
  if (const json* fallback = f.optional("padding_fallback")) {
    Fields c(*fallback, source, where + ".padding_fallback", kOp);
    check_choice(c, source);
    c.finish();
  }
  f.finish();
}

void check_quantize_recipe(const json& recipe, const Manifest& m, std::string_view source) {
  Fields f(recipe, source, "quantize", kOp);
  f.name("name");
  const bool rotate = f.boolean("rotate");
  if (rotate != m.provenance.seeds.contains("rotation"))
    fail(Errc::format, "{} {}: quantize.rotate: {} but the manifest's provenance.seeds {}", kOp, source, rotate,
         rotate ? "has no rotation seed" : "has a rotation seed");
  const json& rules = f.array("rules", 4096);
  for (size_t i = 0; i < rules.size(); ++i) check_rule(rules[i], false, source, fmt::format("quantize.rules[{}]", i));
  check_rule(f.required("default"), true, source, "quantize.default");
  if (f.optional("target_linear_bits_per_weight") && !(f.number("target_linear_bits_per_weight") > 0))
    fail(Errc::format, "{} {}: quantize.target_linear_bits_per_weight: must be positive", kOp, source);
  f.finish();
}

// A hash an import restates must be the one its provenance lists for that source file.
void expect_source_hash(Fields& f, const char* key, const std::string& file, const Manifest& m, std::string_view source) {
  const std::string sha = f.sha256(key);
  for (const SourceFile& s : m.provenance.sources)
    if (s.name == file) return expect_equal(sha, s.sha256, Errc::hash_mismatch, source, std::string("import.") + key);
  fail(Errc::format, "{} {}: import.{}: provenance.sources lists no '{}'", kOp, source, key, file);
}

// What the audio8 loader verified (artifact/audio8_bundle.h): the bundle's format, payload name and hashes (equal to
// the provenance's sources), the identity fields it read, and for calibrated bundles the checked provenance block.
void check_audio8_import(Fields& f, const std::string& format, const Manifest& m, std::string_view source) {
  if (format != audio8::kFormatV1 && format != audio8::kFormatV2 && format != audio8::kFormatCalibratedQ4)
    fail(Errc::format, "{} {}: import.source_format: unknown format {}", kOp, source, io::quote(format));
  const std::string weights_file = f.string("weights_file", kMaxFileNameBytes);
  check_file_name(weights_file, fmt::format("{} {}: import.weights_file", kOp, source));
  expect_source_hash(f, "manifest_sha256", std::string(audio8::kManifestName), m, source);
  expect_source_hash(f, "weights_sha256", weights_file, m, source);
  f.boolean("source_payload_sha_verified");
  for (const char* key : {"source_revision", "profile"})
    if (!f.required(key).is_string() && !f.required(key).is_number())
      fail(Errc::format, "{} {}: import.{}: must be a string or a number", kOp, source, key);
  expect_equal(f.string("language_model_prefix", kMaxNameBytes), std::string(audio8::kLanguageModelPrefix),
               Errc::format, source, "import.language_model_prefix");
  if (const json* assets = f.optional("external_assets_not_included"))
    if (!assets->is_object()) fail(Errc::format, "{} {}: import.external_assets_not_included: must be an object", kOp, source);
  const bool calibrated = format == audio8::kFormatCalibratedQ4;
  for (const char* key : {"calibration_provenance_verified", "copied_tensor_range_hashes_verified"})
    if (calibrated != bool(f.optional(key)) || (calibrated && !f.boolean(key)))
      fail(Errc::format, "{} {}: import.{}: {}", kOp, source, key, calibrated ? "must be true" : "only for calibrated bundles");
  if (calibrated != bool(f.optional("overlay_identity_sha256")) || calibrated != bool(f.optional("provenance")))
    fail(Errc::format, "{} {}: import: overlay_identity_sha256 and provenance are recorded for calibrated bundles only",
         kOp, source);
  if (calibrated) {
    const std::string overlay = f.sha256("overlay_identity_sha256");
    Fields p(f.object("provenance"), source, "import.provenance", kOp);
    expect_equal(p.string("method", 16), std::string("gptq"), Errc::format, source, "import.provenance.method");
    for (const char* key : {"parent_manifest_sha256", "parent_weights_sha256", "calibration_sha256", "metadata_sha256"})
      p.sha256(key);
    expect_equal(p.sha256("overlay_identity_sha256"), overlay, Errc::format, source,
                 "import.provenance.overlay_identity_sha256");
    p.array("calibrated_tensors", 2000);
    p.object("copied_tensors");
    p.finish();
  }
}

// What the Phonon loader verified (artifact/phonon.h): the packed manifest's module count and code formats.
void check_phonon_import(Fields& f, std::string_view source) {
  Fields p(f.object("packed_manifest"), source, "import.packed_manifest", kOp);
  p.unsigned_integer("modules");
  p.nullable_object("decoder_codes");
  p.nullable_object("decoder_metadata");
  const json& hybrid = p.required("hybrid_quantization");
  if (!hybrid.is_null() && !hybrid.is_string())
    fail(Errc::format, "{} {}: import.packed_manifest.hybrid_quantization: must be a string or null", kOp, source);
  p.finish();
}

void check_import(const json& record, const Manifest& m, std::string_view source) {
  Fields f(record, source, "import", kOp);
  if (f.optional("source_format")) {
    check_audio8_import(f, f.string("source_format", kMaxNameBytes), m, source);
  } else {
    expect_equal(f.string("format", kMaxNameBytes), std::string(phonon::kFormatName), Errc::format, source,
                 "import.format");
    check_phonon_import(f, source);
  }
  f.finish();
}

}  // namespace

json check_quality(std::string_view text, const Manifest& m, uint64_t artifact_bytes, std::string_view source) {
  json doc = parse_record(text, source);
  Fields f(doc, source, "", kOp);
  check_quantize_report(f.object("quantize"), m, artifact_bytes, source);
  f.finish();
  return doc;
}

json check_recipe(std::string_view text, const Manifest& m, std::string_view source) {
  json doc = parse_record(text, source);
  Fields f(doc, source, "", kOp);
  if (doc.size() != 1) fail(Errc::format, "{} {}: must hold exactly one of \"quantize\" and \"import\"", kOp, source);
  if (f.optional("quantize"))
    check_quantize_recipe(f.object("quantize"), m, source);
  else
    check_import(f.object("import"), m, source);
  f.finish();
  return doc;
}

}  // namespace lowbit::artifact
