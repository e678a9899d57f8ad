// audio8 mixed bundles (seed 001): the reader applies every `require` of the seed's loader, each as its own
// one-line error naming the file, the record and the field; the writer turns a lowbit artifact back into a bundle.
// docs/FORMAT.md ("Foreign formats") lists the rules and the calibrated-q4 provenance checks.
#include "lowbit/artifact/audio8_bundle.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "lowbit/artifact/reader.h"
#include "lowbit/codec/affine.h"
#include "lowbit/codec/offset_scale.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/staged_dir.h"
#include "lowbit/io/json.h"

namespace lowbit::artifact::audio8 {

namespace {

namespace fs = std::filesystem;
namespace os = codec::offset_scale;
using nlohmann::json;

constexpr size_t kMaxRecords = 2000;
constexpr uint64_t kMaxDenseBytes = 64ull << 20;
constexpr uint64_t kMaxManifestBytes = 16ull << 20;  // 2000 records are far below this
constexpr uint64_t kMaxConfigBytes = 16ull << 20;
constexpr std::string_view kEmbedding = "model.embed_tokens.weight";
constexpr std::string_view kHead = "lm_head.weight";
constexpr std::array<std::string_view, 3> kTokenizerFiles = {"tokenizer.json", "tokenizer_config.json",
                                                             "tokenizer.model"};

// ---------------------------------------------------------------------------------------------------------------
// Errors: "[audio8] DIR/manifest.json: tensors[3] 'name': field 'row_bytes' = 10, expected 24"

struct Where {
  std::string file;
  std::string record;  // "tensors[3] 'name'", empty for top-level fields

  std::string at(std::string_view field) const {
    return record.empty() ? fmt::format("{}: field '{}'", file, field)
                          : fmt::format("{}: {}: field '{}'", file, record, field);
  }
};

template <class... Args>
[[noreturn]] void reject(Errc code, const Where& w, std::string_view field, fmt::format_string<Args...> f,
                         Args&&... args) {
  fail(code, "[audio8] {} {}", w.at(field), fmt::format(f, std::forward<Args>(args)...));
}

const json& member(const json& obj, std::string_view key, const Where& w) {
  const auto it = obj.find(key);
  if (it == obj.end()) reject(Errc::format, w, key, "is missing");
  return *it;
}

std::string string_field(const json& obj, std::string_view key, const Where& w) {
  const json& v = member(obj, key, w);
  if (!v.is_string()) reject(Errc::format, w, key, "expected a string, got {}", io::json_kind(v));
  return v.get<std::string>();
}

// A JSON integer (never a boolean or a float), as the seed's `type(x) is int`.
int64_t integer_field(const json& obj, std::string_view key, const Where& w, Errc code = Errc::format) {
  const json& v = member(obj, key, w);
  if (!v.is_number_integer()) reject(code, w, key, "expected an integer, got {}", io::json_kind(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    reject(Errc::limit, w, key, "= {} is out of range", v.dump());
  return v.get<int64_t>();
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string hash_field(const json& obj, std::string_view key, const Where& w) {
  std::string h = string_field(obj, key, w);
  if (!is_hex64(h)) reject(Errc::format, w, key, "= {} is not 64 lowercase hex digits", io::quote(h));
  return h;
}

// A storage field the seed derives from shape and precision: present and equal to the computed value.
void expect_field(const json& rec, std::string_view key, const json& expected, Errc code, const Where& w) {
  const auto it = rec.find(key);
  if (it == rec.end()) reject(code, w, key, "is missing, expected {}", expected.dump());
  if (*it != expected) reject(code, w, key, "= {}, expected {}", it->dump(), expected.dump());
}

std::string read_small_file(const fs::path& path, uint64_t max_bytes, std::string_view what) {
  const MappedFile f = MappedFile::open(path);
  if (f.size() > max_bytes)
    fail(Errc::limit, "[audio8] {}: {} is {} bytes, more than {}", path.string(), what, f.size(), max_bytes);
  return {reinterpret_cast<const char*>(f.bytes().data()), f.size()};
}

// ---------------------------------------------------------------------------------------------------------------
// Precisions and names

json full8_grid() {
  return {{"bits", 3},         {"zero_point", 4},  {"max_code", 7},
          {"padding_code", 4}, {"signed_min", -4}, {"signed_max", 3},
          {"inference_permutation_required", false}};
}

struct Precision {
  std::string_view name, encoding;
  int bits;
};
constexpr std::array<Precision, 3> kPacked = {{{"q3_full8", "uniform_lsb_full8", 3},
                                               {"q3", "uniform_lsb", 3},
                                               {"q4", "uniform_lsb", 4}}};

const Precision* packed_precision(std::string_view name) {
  for (const Precision& p : kPacked)
    if (p.name == name) return &p;
  return nullptr;
}

// Parameters of the offset_scale codec for a packed record (exactly what the codec's encode writes).
codec::Params offset_scale_params(const Precision& p, int64_t cols) {
  codec::Params params = {{"precision", p.name}, {"group_size", os::kGroupSize}, {"padded_cols", cols},
                          {"encoding", p.encoding}};
  if (p.name == "q3_full8") params["grid"] = full8_grid();
  return params;
}

struct DenseDType {
  std::string_view bundle, param;
  DType dtype;
};
constexpr std::array<DenseDType, 3> kDense = {{{"BF16", "bf16", DType::BF16},
                                               {"F16", "f16", DType::F16},
                                               {"F32", "f32", DType::F32}}};

bool is_language_model_name(std::string_view hf_name) {
  return hf_name.starts_with("model.") || hf_name.starts_with("lm_head.");
}

// The bundle's "language_model.model.x" is lowbit's "model.x"; other names are kept. Refuses a name outside the
// language model that would read as one of its HF names, so that the mapping can be inverted on export.
std::string lowbit_name(const std::string& name, const Where& w) {
  if (name.starts_with(kLanguageModelPrefix)) {
    const std::string rest = name.substr(kLanguageModelPrefix.size());
    if (is_language_model_name(rest)) return rest;
  } else if (is_language_model_name(name)) {
    reject(Errc::unsupported, w, "name", "= {} reads as a language-model name without the '{}' prefix",
           io::quote(name), kLanguageModelPrefix);
  }
  return name;
}

std::string bundle_name(const std::string& lowbit) {
  return is_language_model_name(lowbit) ? std::string(kLanguageModelPrefix) + lowbit : lowbit;
}

// ---------------------------------------------------------------------------------------------------------------
// Reading

struct Record {
  const json* doc = nullptr;
  std::string name;  // as stored in the bundle
  uint64_t offset = 0, bytes = 0;
  Where where;
};

struct Bundle {
  fs::path dir, manifest_path, payload_path;
  std::string manifest_sha;
  json manifest;
  std::string format;
  MappedFile payload;
  std::vector<Record> records;
};

std::span<const std::byte> record_bytes(const Bundle& b, uint64_t offset, uint64_t size) {
  return b.payload.bytes().subspan(offset, size);
}

// The seed's top-level fields, the payload's length and SHA-256.
void check_top_level(Bundle& b, const ForeignOpenOptions& options) {
  const Where w{b.manifest_path.string(), {}};
  b.format = string_field(b.manifest, "format", w);
  if (b.format != kFormatV1 && b.format != kFormatV2 && b.format != kFormatCalibratedQ4)
    reject(Errc::format, w, "format", "= {} is not {}, {} or {}", io::quote(b.format), kFormatV1, kFormatV2,
           kFormatCalibratedQ4);
  if (integer_field(b.manifest, "group_size", w, Errc::codec_params) != os::kGroupSize)
    reject(Errc::codec_params, w, "group_size", "= {}, expected 64", b.manifest["group_size"].dump());
  if (member(b.manifest, "tie_word_embeddings", w) != true)
    reject(Errc::format, w, "tie_word_embeddings", "= {}, expected true", b.manifest["tie_word_embeddings"].dump());
  const std::string file = string_field(b.manifest, "weights_file", w);
  if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
      file.find('\0') != std::string::npos)
    reject(Errc::unsafe_path, w, "weights_file", "= {} is not a plain file name", io::quote(file));
  member(b.manifest, "source_revision", w);
  member(b.manifest, "profile", w);
  const int64_t declared = integer_field(b.manifest, "weights_bytes", w);
  const std::string sha = hash_field(b.manifest, "weights_sha256", w);
  b.payload_path = b.dir / file;
  b.payload = MappedFile::open(b.payload_path);
  if (declared < 0 || b.payload.size() != static_cast<uint64_t>(declared))
    reject(Errc::size_mismatch, w, "weights_bytes", "= {}, but {} is {} bytes", declared, file, b.payload.size());
  if (options.verify_hash && sha256_hex(b.payload.bytes()) != sha)
    reject(Errc::hash_mismatch, w, "weights_sha256", "= {} differs from the SHA-256 of {}", sha, file);
}

// Records: 1 to 2000, contiguous from offset 0, no duplicates, inside the payload, covering all of it.
void check_records(Bundle& b) {
  const Where w{b.manifest_path.string(), {}};
  const json& records = member(b.manifest, "tensors", w);
  if (!records.is_array()) reject(Errc::format, w, "tensors", "expected an array, got {}", io::json_kind(records));
  if (records.empty() || records.size() > kMaxRecords)
    reject(Errc::limit, w, "tensors", "holds {} records, expected 1 to {}", records.size(), kMaxRecords);
  const uint64_t payload_bytes = b.payload.size();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    Where rw{w.file, fmt::format("tensors[{}]", i)};
    if (!r.is_object()) reject(Errc::format, w, "tensors", "[{}] is not an object", i);
    std::string name = string_field(r, "name", rw);
    rw.record = fmt::format("tensors[{}] {}", i, io::quote(name));
    if (!names.insert(name).second) reject(Errc::duplicate, rw, "name", "repeats an earlier record's name");
    const int64_t at = integer_field(r, "offset", rw, Errc::layout);
    if (at < 0 || static_cast<uint64_t>(at) != offset)
      reject(Errc::layout, rw, "offset", "= {}, expected {} (records are contiguous from 0)", at, offset);
    const int64_t size = integer_field(r, "bytes", rw, Errc::layout);
    if (size <= 0) reject(Errc::layout, rw, "bytes", "= {}, expected > 0", size);
    if (static_cast<uint64_t>(size) > payload_bytes - offset)
      reject(Errc::layout, rw, "bytes", "= {} ends at {}, past the payload's {} bytes", size,
             checked_add(offset, static_cast<uint64_t>(size), "record end"), payload_bytes);
    if (b.format != kFormatV2 && r.value("precision", json()) == "q3_full8")
      reject(Errc::version, rw, "precision", "q3_full8 requires {}, this bundle is {}", kFormatV2, b.format);
    b.records.push_back({&r, std::move(name), offset, static_cast<uint64_t>(size), std::move(rw)});
    offset += static_cast<uint64_t>(size);
  }
  if (offset != payload_bytes)
    reject(Errc::layout, w, "tensors", "cover {} bytes; the payload's last {} bytes are unreferenced", offset,
           payload_bytes - offset);
}

codec::TensorRef dense_record(const Bundle& b, const Record& rec) {
  const json& r = *rec.doc;
  const Where& w = rec.where;
  if (string_field(r, "encoding", w) != "original")
    reject(Errc::format, w, "encoding", "= {}, expected \"original\"", r["encoding"].dump());
  const std::string dtype_name = string_field(r, "source_dtype", w);
  const DenseDType* dt = nullptr;
  for (const DenseDType& d : kDense)
    if (d.bundle == dtype_name) dt = &d;
  if (!dt) reject(Errc::dtype, w, "source_dtype", "= {}, expected BF16, F16 or F32", io::quote(dtype_name));
  const json& shape_json = member(r, "shape", w);
  if (!shape_json.is_array() || shape_json.empty() || shape_json.size() > kMaxRank)
    reject(Errc::shape, w, "shape", "= {} is not a list of 1 to {} dimensions", shape_json.dump(), kMaxRank);
  Shape shape;
  for (const json& d : shape_json) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0 || d.get<int64_t>() > kMaxDim)
      reject(Errc::shape, w, "shape", "= {} holds a dimension that is not a positive integer", shape_json.dump());
    shape.push_back(d.get<int64_t>());
  }
  const uint64_t expected = checked_mul(checked_numel(shape, w.at("shape")), dtype_size(dt->dtype), w.at("shape"));
  if (expected != rec.bytes)
    reject(Errc::size_mismatch, w, "bytes", "= {}, but shape {} of {} is {} bytes", rec.bytes, shape_str(shape),
           dtype_name, expected);
  if (rec.bytes > kMaxDenseBytes)
    reject(Errc::limit, w, "bytes", "= {} exceeds the dense bound of {} bytes", rec.bytes, kMaxDenseBytes);
  const auto data = record_bytes(b, rec.offset, rec.bytes);
  const uint64_t n = rec.bytes / dtype_size(dt->dtype);
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(load_float(dt->dtype, data.data(), i)))
      reject(Errc::non_finite, w, "values", "element {} is not finite", i);
  codec::TensorRef ref;
  ref.codec = &codec::codec_or_throw("dense", "audio8");
  ref.params = {{"dtype", dt->param}};
  ref.shape = shape;
  ref.arrays.items.emplace_back("data", TensorView{dt->dtype, std::move(shape), data});
  return ref;
}

codec::TensorRef packed_record(const Bundle& b, const Record& rec) {
  const json& r = *rec.doc;
  const Where& w = rec.where;
  const std::string precision = string_field(r, "precision", w);
  const Precision* p = packed_precision(precision);
  if (!p) reject(Errc::codec_params, w, "precision", "= {} is not original, q3_full8, q3 or q4", io::quote(precision));
  const std::string encoding = r.value("encoding", json()).is_string() ? r["encoding"].get<std::string>() : "";
  if (encoding != p->encoding)
    reject(Errc::codec_params, w, "encoding", "= {}, expected \"{}\" for {}", r.value("encoding", json()).dump(),
           p->encoding, precision);
  if (p->name == "q3_full8" && r.value("grid", json()) != full8_grid())
    reject(Errc::codec_params, w, "grid", "= {}, expected {}", r.value("grid", json()).dump(), full8_grid().dump());
  if (p->name != "q3_full8" && r.contains("grid"))
    reject(Errc::codec_params, w, "grid", "is only allowed with q3_full8 (legacy grid metadata)");
  const json& shape = member(r, "shape", w);
  if (!shape.is_array() || shape.size() != 2 || !shape[0].is_number_integer() || !shape[1].is_number_integer())
    reject(Errc::shape, w, "shape", "= {} is not [rows, columns] of integers", shape.dump());
  const int64_t rows = shape[0].get<int64_t>(), cols = shape[1].get<int64_t>();
  if (rows <= 0 || rows > os::kMaxRows)
    reject(Errc::limit, w, "shape", "rows = {} outside [1, {}]", rows, os::kMaxRows);
  if (cols <= 0 || cols > os::kMaxCols)
    reject(Errc::limit, w, "shape", "columns = {} outside [1, {}]", cols, os::kMaxCols);
  if (cols % os::kGroupSize != 0)
    reject(Errc::shape, w, "shape", "columns = {} are not a multiple of {}", cols, os::kGroupSize);
  const int64_t row_bytes = cols * p->bits / 8, groups = cols / os::kGroupSize;
  const int64_t codes_bytes = rows * row_bytes, scales_bytes = rows * groups * 2;
  expect_field(r, "group_size", os::kGroupSize, Errc::codec_params, w);
  expect_field(r, "padded_cols", cols, Errc::codec_params, w);
  expect_field(r, "row_bytes", row_bytes, Errc::layout, w);
  expect_field(r, "codes_bytes", codes_bytes, Errc::layout, w);
  expect_field(r, "scales_offset", rec.offset + static_cast<uint64_t>(codes_bytes), Errc::layout, w);
  expect_field(r, "scales_bytes", scales_bytes, Errc::layout, w);
  expect_field(r, "scales_dtype", "F16", Errc::dtype, w);
  expect_field(r, "scales_shape", json::array({rows, groups}), Errc::shape, w);
  expect_field(r, "bytes", codes_bytes + scales_bytes, Errc::layout, w);
  codec::TensorRef ref;
  ref.codec = &codec::codec_or_throw("offset_scale", "audio8");
  ref.params = offset_scale_params(*p, cols);
  ref.shape = {rows, cols};
  ref.arrays.items.emplace_back(
      "codes", TensorView{DType::U8, {rows, row_bytes}, record_bytes(b, rec.offset, codes_bytes)});
  ref.arrays.items.emplace_back(
      "scales", TensorView{DType::F16, {rows, groups}, record_bytes(b, rec.offset + codes_bytes, scales_bytes)});
  try {
    ref.codec->check_content(ref.params, ref.shape, ref.arrays);  // scales finite and > 0, no reserved code
  } catch (const Error& e) {
    reject(e.code(), w, e.code() == Errc::non_finite ? "scales" : "codes", "{}", e.what());
  }
  return ref;
}

// ---------------------------------------------------------------------------------------------------------------
// Calibrated-q4 provenance (docs/FORMAT.md, "Calibrated q4 bundles")

// SHA-256 of the manifest without its "provenance" block, serialized with sorted keys and no whitespace.
std::string metadata_sha256(const json& manifest) {
  json rest = manifest;
  rest.erase("provenance");
  const std::string text = rest.dump();
  return sha256_hex(std::as_bytes(std::span(text)));
}

void verify_provenance(const Bundle& b) {
  const Where w{b.manifest_path.string(), "provenance"};
  const json& prov = member(b.manifest, "provenance", Where{w.file, {}});
  if (!prov.is_object()) reject(Errc::format, w, "provenance", "expected an object, got {}", io::json_kind(prov));
  static const std::set<std::string> kKeys = {"method",          "parent_manifest_sha256", "parent_weights_sha256",
                                              "calibration_sha256", "metadata_sha256",      "calibrated_tensors",
                                              "copied_tensors",  "overlay_identity_sha256"};
  for (const auto& [key, value] : prov.items())
    if (!kKeys.contains(key)) reject(Errc::format, w, key, "is not a provenance field");
  if (string_field(prov, "method", w) != "gptq")
    reject(Errc::format, w, "method", "= {}, expected \"gptq\"", prov["method"].dump());
  for (const char* key : {"parent_manifest_sha256", "parent_weights_sha256", "calibration_sha256"})
    hash_field(prov, key, w);
  if (hash_field(prov, "metadata_sha256", w) != metadata_sha256(b.manifest))
    reject(Errc::hash_mismatch, w, "metadata_sha256", "differs from the SHA-256 of the manifest without provenance");
  const json& calibrated = member(prov, "calibrated_tensors", w);
  const json& copied = member(prov, "copied_tensors", w);
  if (!calibrated.is_array()) reject(Errc::format, w, "calibrated_tensors", "expected an array of names");
  if (!copied.is_object()) reject(Errc::format, w, "copied_tensors", "expected an object of name: sha256");
  std::set<std::string> calibrated_names;
  for (const json& n : calibrated)
    if (!n.is_string() || !calibrated_names.insert(n.get<std::string>()).second)
      reject(Errc::format, w, "calibrated_tensors", "holds {}, not a name listed once", n.dump());
  Sha256 overlay;
  size_t covered = 0;
  for (const Record& rec : b.records) {
    const std::string range_sha = sha256_hex(record_bytes(b, rec.offset, rec.bytes));
    if (calibrated_names.contains(rec.name)) {
      if (rec.doc->value("precision", json()) != "q4")
        reject(Errc::format, w, "calibrated_tensors", "names {}, which is not a q4 record", io::quote(rec.name));
      if (copied.contains(rec.name))
        reject(Errc::duplicate, w, "copied_tensors", "names {}, which is also calibrated", io::quote(rec.name));
      const std::string line = rec.name + "\n" + range_sha + "\n";
      overlay.update(line.data(), line.size());
      ++covered;
    } else {
      const auto it = copied.find(rec.name);
      if (it == copied.end())
        reject(Errc::format, w, "copied_tensors", "lacks record {} (neither calibrated nor copied)",
               io::quote(rec.name));
      if (*it != range_sha)
        reject(Errc::hash_mismatch, w, "copied_tensors",
               "[{}] = {} differs from the SHA-256 of its payload range", io::quote(rec.name), it->dump());
      ++covered;
    }
  }
  if (covered != calibrated_names.size() + copied.size())
    reject(Errc::format, w, "calibrated_tensors", "or copied_tensors name tensors the bundle does not hold");
  if (hash_field(prov, "overlay_identity_sha256", w) != overlay.hex())
    reject(Errc::hash_mismatch, w, "overlay_identity_sha256", "differs from the calibrated records' identity");
}

// ---------------------------------------------------------------------------------------------------------------
// Config, aliases, the final re-check

// The declared SHA-256 of config.json under external_assets_not_included, if any.
std::optional<std::string> declared_config_sha(const json& manifest, const Where& w) {
  const auto assets = manifest.find("external_assets_not_included");
  if (assets == manifest.end()) return std::nullopt;
  const Where aw{w.file, "external_assets_not_included"};
  if (!assets->is_object()) reject(Errc::format, w, "external_assets_not_included", "expected an object");
  const auto config = assets->find(kConfigName);
  if (config == assets->end()) return std::nullopt;
  if (!config->is_object()) reject(Errc::format, aw, kConfigName, "expected an object");
  if (!config->contains("sha256")) return std::nullopt;
  return hash_field(*config, "sha256", Where{w.file, "external_assets_not_included.config.json"});
}

// The language model's HF config: config.json beside the manifest (its text_config when it is a multimodal
// config), checked against the declared hash; null when absent.
json read_config(const Bundle& b, ForeignModel& out) {
  const Where w{b.manifest_path.string(), {}};
  const std::optional<std::string> declared = declared_config_sha(b.manifest, w);
  const fs::path path = b.dir / kConfigName;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    out.unsupported.push_back(fmt::format("language model: no {} beside {} (expected sha256 {}), so it can be "
                                          "verified and imported but not run",
                                          kConfigName, kManifestName, declared.value_or("not declared")));
    return nullptr;
  }
  const std::string text = read_small_file(path, kMaxConfigBytes, kConfigName);
  const std::string sha = sha256_hex(std::as_bytes(std::span(text)));
  if (declared && sha != *declared)
    fail(Errc::hash_mismatch, "[audio8] {}: SHA-256 {} differs from external_assets_not_included.config.json.sha256 "
         "{} in {}", path.string(), sha, *declared, kManifestName);
  out.provenance.sources.push_back({std::string(kConfigName), text.size(), sha});
  json config = io::parse_json(text, "audio8", path.string());
  if (!config.is_object()) fail(Errc::format, "[audio8] {}: expected a JSON object", path.string());
  if (config.contains("text_config") && config["text_config"].is_object()) return config["text_config"];
  return config;
}

void read_aliases(const Bundle& b, const std::set<std::string>& stored, ForeignModel& out) {
  const Where w{b.manifest_path.string(), {}};
  const json& aliases = member(b.manifest, "aliases", w);
  if (!aliases.is_object()) reject(Errc::format, w, "aliases", "expected an object, got {}", io::json_kind(aliases));
  const Where aw{w.file, "aliases"};
  std::map<std::string, std::string> resolved;
  for (const auto& [alias, target] : aliases.items()) {
    if (stored.contains(alias)) reject(Errc::duplicate, aw, alias, "is also a stored tensor (invalid tied alias)");
    if (!target.is_string() || !stored.contains(target.get<std::string>()))
      reject(Errc::format, aw, alias, "= {} does not name a stored tensor (invalid tied alias)", target.dump());
    resolved[alias] = target.get<std::string>();
  }
  const std::string head = std::string(kLanguageModelPrefix) + std::string(kHead);
  const std::string embedding = std::string(kLanguageModelPrefix) + std::string(kEmbedding);
  if (!stored.contains(embedding))
    reject(Errc::format, w, "tensors", "lack {} (missing tied head)", io::quote(embedding));
  if (!resolved.contains(head)) reject(Errc::format, aw, head, "is missing (missing tied head)");
  if (resolved[head] != embedding)
    reject(Errc::format, aw, head, "= {}, expected {} (missing tied head)", io::quote(resolved[head]),
           io::quote(embedding));
  for (const auto& [alias, target] : resolved)
    out.aliases.emplace_back(lowbit_name(alias, aw), lowbit_name(target, aw));
}

void recheck(const Bundle& b, const ForeignOpenOptions& options) {
  if (options.before_recheck) options.before_recheck();
  const auto changed = [&](const fs::path& p, std::string_view how) {
    fail(Errc::changed, "[audio8] {}: bundle changed while loading ({})", p.string(), how);
  };
  if (options.verify_hash) {
    if (sha256_file(b.payload_path) != b.manifest["weights_sha256"].get<std::string>())
      changed(b.payload_path, "its SHA-256 differs from weights_sha256");
    if (sha256_file(b.manifest_path) != b.manifest_sha) changed(b.manifest_path, "its SHA-256 differs");
  } else if (file_identity(b.payload_path) != b.payload.identity()) {
    changed(b.payload_path, "its size, mtime or inode differ");
  }
}

// Parts other than the language model, by their first name component, with their tensor counts.
std::vector<std::string> unsupported_parts(const std::vector<std::pair<std::string, codec::TensorRef>>& tensors) {
  std::map<std::string, size_t> parts;
  for (const auto& [name, ref] : tensors)
    if (!is_language_model_name(name)) ++parts[name.substr(0, name.find('.'))];
  std::vector<std::string> out;
  for (const auto& [part, n] : parts) out.push_back(fmt::format("{} ({} tensors)", part, n));
  return out;
}

}  // namespace

bool recognizes(const fs::path& dir) {
  try {
    const fs::path path = dir / kManifestName;
    std::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(path, ec)) || fs::file_size(path, ec) > kMaxManifestBytes)
      return false;
    const std::string text = read_small_file(path, kMaxManifestBytes, kManifestName);
    if (text.find("audio8-") == std::string::npos) return false;  // cheap filter before parsing
    const json doc = json::parse(text, nullptr, false);
    if (!doc.is_object()) return false;
    const auto it = doc.find("format");
    return it != doc.end() && it->is_string() &&
           (*it == kFormatV1 || *it == kFormatV2 || *it == kFormatCalibratedQ4);
  } catch (...) {
    return false;
  }
}

ForeignModel open(const fs::path& dir, const ForeignOpenOptions& options) {
  Bundle b;
  b.dir = dir;
  b.manifest_path = dir / kManifestName;
  const std::string text = read_small_file(b.manifest_path, kMaxManifestBytes, kManifestName);
  b.manifest_sha = sha256_hex(std::as_bytes(std::span(text)));
  b.manifest = io::parse_json(text, "audio8", b.manifest_path.string());
  if (!b.manifest.is_object()) fail(Errc::format, "[audio8] {}: expected a JSON object", b.manifest_path.string());
  check_top_level(b, options);
  check_records(b);
  if (b.format == kFormatCalibratedQ4) verify_provenance(b);

  ForeignModel out;
  out.format = b.format;
  out.config = read_config(b, out);
  std::set<std::string> stored;
  for (const Record& rec : b.records) {
    const bool dense = rec.doc->value("precision", json()) == "original";
    out.tensors.emplace_back(lowbit_name(rec.name, rec.where), dense ? dense_record(b, rec) : packed_record(b, rec));
    stored.insert(rec.name);
  }
  read_aliases(b, stored, out);
  recheck(b, options);

  out.unsupported = [&] {
    std::vector<std::string> parts = unsupported_parts(out.tensors);
    parts.insert(parts.end(), out.unsupported.begin(), out.unsupported.end());
    return parts;
  }();
  for (std::string_view name : kTokenizerFiles) {
    std::error_code ec;
    if (fs::is_regular_file(fs::symlink_status(dir / name, ec))) out.files.push_back({dir / name, FileRole::tokenizer});
  }
  out.provenance.sources.insert(out.provenance.sources.begin(),
                                {{std::string(kManifestName), text.size(), b.manifest_sha},
                                 {b.payload_path.filename().string(), b.payload.size(),
                                  b.manifest["weights_sha256"].get<std::string>()}});
  json recipe = {{"source_format", b.format},
                 {"weights_file", b.payload_path.filename().string()},
                 {"manifest_sha256", b.manifest_sha},
                 {"weights_sha256", b.manifest["weights_sha256"]},
                 {"source_payload_sha_verified", options.verify_hash},
                 {"source_revision", b.manifest["source_revision"]},
                 {"profile", b.manifest["profile"]},
                 {"language_model_prefix", kLanguageModelPrefix}};
  if (b.manifest.contains("external_assets_not_included"))
    recipe["external_assets_not_included"] = b.manifest["external_assets_not_included"];
  if (b.format == kFormatCalibratedQ4) {
    recipe["calibration_provenance_verified"] = true;
    recipe["copied_tensor_range_hashes_verified"] = true;
    recipe["overlay_identity_sha256"] = b.manifest["provenance"]["overlay_identity_sha256"];
    recipe["provenance"] = b.manifest["provenance"];
  }
  out.recipe = std::move(recipe);
  out.keep_alive.push_back(std::make_shared<MappedFile>(std::move(b.payload)));
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Writing

namespace {

// One record of the bundle being written: its manifest entry and its bytes (views of the artifact, or owned when
// converted from affine).
struct OutRecord {
  json entry;
  std::vector<std::span<const std::byte>> parts;
  std::vector<std::byte> owned;
};

[[noreturn]] void refuse(const std::string& tensor, std::string_view why) {
  fail(Errc::unsupported, "[export] tensor '{}': {}", tensor, why);
}

OutRecord dense_out(const std::string& name, const codec::TensorRef& ref) {
  const TensorView& data = ref.arrays.at("data");
  const DenseDType* dt = nullptr;
  for (const DenseDType& d : kDense)
    if (d.dtype == data.dtype) dt = &d;
  if (!dt) refuse(name, "dense storage is not BF16, F16 or F32");
  if (ref.shape.empty()) refuse(name, "a scalar has no bundle shape");
  if (data.bytes.size() > kMaxDenseBytes) refuse(name, fmt::format("{} bytes exceed the bundle's dense bound of {}",
                                                                  data.bytes.size(), kMaxDenseBytes));
  OutRecord r;
  r.entry = {{"precision", "original"}, {"encoding", "original"}, {"source_dtype", dt->bundle},
             {"shape", ref.shape}};
  r.parts = {data.bytes};
  return r;
}

OutRecord packed_entry(const Precision& p, int64_t rows, int64_t cols) {
  const int64_t row_bytes = cols * p.bits / 8, groups = cols / os::kGroupSize;
  OutRecord r;
  r.entry = {{"precision", p.name},
             {"encoding", p.encoding},
             {"shape", {rows, cols}},
             {"group_size", os::kGroupSize},
             {"padded_cols", cols},
             {"row_bytes", row_bytes},
             {"codes_bytes", rows * row_bytes},
             {"scales_bytes", rows * groups * 2},
             {"scales_dtype", "F16"},
             {"scales_shape", {rows, groups}}};
  if (p.name == "q3_full8") r.entry["grid"] = full8_grid();
  return r;
}

OutRecord offset_scale_out(const std::string& name, const codec::TensorRef& ref, std::string_view format) {
  const os::Layout l = os::layout(ref.params, ref.shape);
  if (l.padded_cols != l.cols) refuse(name, fmt::format("{} columns are not a multiple of 64", l.cols));
  if (l.grid.precision == "q3_full8" && format != kFormatV2) refuse(name, "q3_full8 needs audio8-mixed-bundle-v2");
  OutRecord r = packed_entry(*packed_precision(l.grid.precision), l.rows, l.cols);
  r.parts = {ref.arrays.at("codes").bytes, ref.arrays.at("scales").bytes};
  return r;
}

// An affine tensor as packed codes: affine value scale * (q - a) with a the implied offset (bias = -a * scale
// exactly in every group) is offset_scale's scale * (c - offset) with c = q - (a - offset).
struct AffineMapping {
  int bits;
  uint32_t affine_offset;
  std::string_view precision;
};
constexpr std::array<AffineMapping, 5> kAffineMappings = {{{4, 7, "q4"},
                                                           {4, 8, "q4"},
                                                           {3, 4, "q3_full8"},
                                                           {3, 4, "q3"},
                                                           {3, 3, "q3"}}};

// Scales as F16 when every group's bias is exactly -offset * scale with a finite positive F16-exact scale.
std::optional<std::vector<uint16_t>> implied_offset_scales(const codec::affine::Layout& l, const TensorView& scales,
                                                           const TensorView& biases, uint32_t offset) {
  std::vector<uint16_t> out(static_cast<size_t>(l.rows * l.groups_per_row()));
  for (size_t i = 0; i < out.size(); ++i) {
    const float s = load_float(l.scale_dtype, scales.bytes.data(), i);
    const float b = load_float(l.scale_dtype, biases.bytes.data(), i);
    out[i] = f32_to_f16(s);
    if (!(std::isfinite(s) && s > 0.0f) || f16_to_f32(out[i]) != s || b != -static_cast<float>(offset) * s)
      return std::nullopt;
  }
  return out;
}

// Codes re-based onto the precision's grid, or nullopt when a code falls outside it.
std::optional<std::vector<uint8_t>> rebased_codes(const codec::affine::Layout& l, const TensorView& words,
                                                  const AffineMapping& m, const os::Grid& grid) {
  const int64_t row_bytes = l.cols * grid.bits / 8;
  std::vector<uint8_t> out(static_cast<size_t>(l.rows * row_bytes));
  const int32_t shift = static_cast<int32_t>(m.affine_offset) - static_cast<int32_t>(grid.offset);
  for (int64_t r = 0; r < l.rows; ++r) {
    std::vector<uint32_t> row(static_cast<size_t>(l.words_per_row()));
    std::memcpy(row.data(), words.bytes.data() + r * l.words_per_row() * 4, row.size() * 4);
    for (int64_t c = 0; c < l.cols; ++c) {
      const int32_t code = static_cast<int32_t>(codec::affine::read_code(row.data(), c, l.bits)) - shift;
      if (code < 0 || code > static_cast<int32_t>(grid.max_code)) return std::nullopt;
      os::write_code(out.data() + r * row_bytes, c, grid.bits, static_cast<uint32_t>(code));
    }
  }
  return out;
}

OutRecord affine_out(const std::string& name, const codec::TensorRef& ref, std::string_view format) {
  const codec::affine::Layout l = codec::affine::layout(ref.params, ref.shape);
  if ((l.bits != 3 && l.bits != 4) || l.group_size != os::kGroupSize)
    refuse(name, fmt::format("affine {}-bit group {} has no bundle precision (3 or 4 bits, group 64)", l.bits,
                             l.group_size));
  if (l.padded_cols != l.cols || l.cols > os::kMaxCols || l.rows > os::kMaxRows)
    refuse(name, fmt::format("shape {} is outside the bundle's bounds (columns a multiple of 64)",
                             shape_str(ref.shape)));
  for (const AffineMapping& m : kAffineMappings) {
    if (m.bits != l.bits || (m.precision == "q3_full8" && format != kFormatV2)) continue;
    const Precision& p = *packed_precision(m.precision);
    const os::Layout grid = os::layout(offset_scale_params(p, l.cols), ref.shape);
    auto scales = implied_offset_scales(l, ref.arrays.at("scales"), ref.arrays.at("biases"), m.affine_offset);
    if (!scales) continue;
    auto codes = rebased_codes(l, ref.arrays.at("codes"), m, grid.grid);
    if (!codes) continue;
    OutRecord r = packed_entry(p, l.rows, l.cols);
    const auto code_bytes = std::as_bytes(std::span(*codes));
    const auto scale_bytes = std::as_bytes(std::span(*scales));
    r.owned.assign(code_bytes.begin(), code_bytes.end());
    r.owned.insert(r.owned.end(), scale_bytes.begin(), scale_bytes.end());
    r.parts = {r.owned};
    return r;
  }
  refuse(name, "affine biases are not -offset x scale with an offset and codes a bundle precision represents");
}

OutRecord record_out(const std::string& name, const codec::TensorRef& ref, std::string_view format) {
  const std::string_view id = ref.codec->id;
  if (id == "dense") return dense_out(name, ref);
  if (id == "offset_scale") return offset_scale_out(name, ref, format);
  if (id == "affine") return affine_out(name, ref, format);
  refuse(name, fmt::format("codec {} has no audio8 precision", id));
}

bool same_tensor(const codec::TensorRef& a, const codec::TensorRef& b) {
  if (a.codec != b.codec || a.params != b.params || a.shape != b.shape || a.arrays.items.size() != b.arrays.items.size())
    return false;
  for (size_t i = 0; i < a.arrays.items.size(); ++i) {
    const auto x = a.arrays.items[i].second.bytes, y = b.arrays.items[i].second.bytes;
    if (x.size() != y.size() || !std::equal(x.begin(), x.end(), y.begin())) return false;
  }
  return true;
}

void write_file(const fs::path& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f.flush()) fail_errno("export", path.string());
}

// Tokenizer files an export copies from the artifact (FileRole::tokenizer) carry their usual names.
bool is_tokenizer_file_name(const std::string& name) {
  return name.starts_with("tokenizer") || name == "special_tokens_map.json" || name == "generation_config.json";
}

// What export --force may replace: a directory that opens as an audio8 bundle (hashes not read) and holds only
// the files an export writes: manifest, config, the weights file it names, tokenizer files. Anything else (a
// user's directory with a stray manifest.json, a bundle with the user's notes beside it) is refused and kept.
bool is_exported_bundle(const fs::path& dir) {
  try {
    if (!recognizes(dir)) return false;
    open(dir, {.verify_hash = false});
    const json manifest = io::read_json_file(dir / kManifestName, "export", kMaxManifestBytes);
    const std::string weights = manifest.value("weights_file", "");
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (!e.is_regular_file() || e.is_symlink()) return false;
      if (name != kManifestName && name != kConfigName && name != weights && !is_tokenizer_file_name(name))
        return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

void export_bundle(const Artifact& art, const fs::path& out_path, const ExportOptions& options) {
  if (options.format != kFormatV1 && options.format != kFormatV2)
    fail(Errc::usage, "[export] format '{}' is not {} or {}", options.format, kFormatV1, kFormatV2);
  StagedDirectory staging(out_path, "export", options.force,
                          {"an audio8 bundle written by export", is_exported_bundle});
  if (!art.contains(kEmbedding))
    fail(Errc::unsupported, "[export] {}: no {}; audio8 bundles tie the head to the embedding", art.dir().string(),
         kEmbedding);
  // Names a bundle's import recorded in recipe.json (checked when the artifact was opened).
  const json recipe = art.recipe().is_object() ? art.recipe().value("import", json::object()) : json::object();
  const auto recorded = [&](const char* key) {
    const auto it = recipe.find(key);
    return it != recipe.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const bool from_bundle = recorded("source_format").starts_with("audio8-");
  const std::string weights_file = from_bundle && !recorded("weights_file").empty() ? recorded("weights_file")
                                                                                     : "weights.bin";
  check_file_name(weights_file, "[export] recipe.json: import.weights_file");

  std::vector<OutRecord> records;
  for (const std::string& name : art.tensor_names()) {
    const codec::TensorRef& ref = art.tensor(name);
    if (name == kHead) {
      if (!same_tensor(ref, art.tensor(kEmbedding)))
        refuse(name, "audio8 bundles tie the head to the embedding; this head differs from it");
      continue;
    }
    OutRecord r = record_out(name, ref, options.format);
    r.entry["name"] = bundle_name(name);
    records.push_back(std::move(r));
  }
  if (records.size() > kMaxRecords)
    fail(Errc::limit, "[export] {}: {} tensors, a bundle holds at most {}", art.dir().string(), records.size(),
         kMaxRecords);

  const fs::path payload_path = staging.path() / weights_file;
  std::ofstream payload(payload_path, std::ios::binary | std::ios::trunc);
  Sha256 sha;
  uint64_t offset = 0;
  json entries = json::array();
  for (OutRecord& r : records) {
    uint64_t bytes = 0;
    for (const auto part : r.parts) {
      payload.write(reinterpret_cast<const char*>(part.data()), static_cast<std::streamsize>(part.size()));
      sha.update(part);
      bytes += part.size();
    }
    r.entry["offset"] = offset;
    r.entry["bytes"] = bytes;
    if (r.entry["precision"] != "original") r.entry["scales_offset"] = offset + r.entry["codes_bytes"].get<uint64_t>();
    offset += bytes;
    entries.push_back(std::move(r.entry));
  }
  if (!payload.flush()) fail_errno("export", payload_path.string());
  payload.close();

  json manifest = {{"format", options.format},
                   {"group_size", os::kGroupSize},
                   {"tie_word_embeddings", true},
                   {"weights_file", weights_file},
                   {"weights_bytes", offset},
                   {"weights_sha256", sha.hex()},
                   {"source_revision", from_bundle ? recipe.value("source_revision", json("lowbit")) : json("lowbit")},
                   {"profile", from_bundle ? recipe.value("profile", json("lowbit-export")) : json("lowbit-export")},
                   {"tensors", std::move(entries)},
                   {"aliases", {{bundle_name(std::string(kHead)), bundle_name(std::string(kEmbedding))}}}};
  if (!art.config().empty()) {
    const std::string config = art.config().dump(2) + "\n";
    write_file(staging.path() / kConfigName, config);
    manifest["external_assets_not_included"] = {
        {kConfigName, {{"sha256", sha256_hex(std::as_bytes(std::span(config)))}}}};
  }
  for (const fs::path& file : art.files_with_role(FileRole::tokenizer))
    fs::copy_file(file, staging.path() / file.filename());
  write_file(staging.path() / kManifestName, manifest.dump(2) + "\n");
  staging.publish();
}

}  // namespace lowbit::artifact::audio8
