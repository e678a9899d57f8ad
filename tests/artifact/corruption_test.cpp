// The corruption matrix, in the manner of llama.cpp's test-gguf.cpp: every kind of damage is applied to a fresh
// valid artifact (built from a seeded RNG) and must be rejected by Artifact::open with the expected error class.
// Where a check sits behind another one (the payload parser behind the hash, the codec behind the parser), the
// corruption refreshes the declared size and hash so that exactly the intended check is reached.
#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <cmath>

#include "artifact/artifact_fixture.h"
#include "lowbit/core/dtype.h"

namespace lowbit::artifact::testing {
namespace {

enum class Corruption {
  // manifest.json as a document
  manifest_not_json,
  manifest_duplicate_key,
  manifest_too_deep,
  manifest_too_large,
  manifest_unknown_field,
  manifest_symlinked,
  manifest_hard_linked,
  manifest_missing,
  bad_format,
  bad_version,
  version_not_integer,
  // tensors
  unknown_codec,
  bad_param_value,
  unknown_param,
  params_not_object,
  wrong_array_dtype,
  wrong_array_shape,
  wrong_logical_shape,
  missing_array_entry,
  array_role_renamed,
  duplicate_tensor_name,
  duplicate_array_key,
  array_in_non_payload_file,
  array_in_undeclared_file,
  oversize_dim,
  negative_dim,
  rank_too_high,
  numel_overflow,
  too_many_tensors,
  tensor_name_too_long,
  tensor_name_control_char,
  // files as declared
  duplicate_file_entry,
  unknown_file_role,
  manifest_declared_as_file,
  path_with_slash,
  path_dotdot,
  absolute_path,
  path_control_char,
  path_hidden,
  wrong_hash_string,
  wrong_hash_value,
  wrong_declared_size_larger,
  wrong_declared_size_smaller,
  payload_without_arrays,
  // files on disk
  missing_payload,
  missing_config,
  extra_file,
  extra_directory,
  truncated_payload,
  appended_byte,
  flipped_payload_byte,
  flipped_config_byte,
  symlinked_payload,
  hard_linked_payload,
  // payload contents (size and hash refreshed)
  safetensors_bad_header_length,
  safetensors_header_not_json,
  safetensors_misaligned,
  safetensors_overlap,
  safetensors_hole,
  safetensors_trailing_bytes,
  payload_missing_array,
  payload_extra_array,
  payload_dtype_differs,
  payload_shape_differs,
  non_finite_dense,
  reserved_code,
  non_finite_scale,
  // while loading
  changed_size_while_loading,
  changed_mtime_while_loading,
  replaced_while_loading,
  count,
};

struct Case {
  Corruption kind;
  const char* name;
  Errc expected;
};

constexpr Case kCases[] = {
    {Corruption::manifest_not_json, "manifest_not_json", Errc::format},
    {Corruption::manifest_duplicate_key, "manifest_duplicate_key", Errc::duplicate},
    {Corruption::manifest_too_deep, "manifest_too_deep", Errc::limit},
    {Corruption::manifest_too_large, "manifest_too_large", Errc::limit},
    {Corruption::manifest_unknown_field, "manifest_unknown_field", Errc::format},
    {Corruption::manifest_symlinked, "manifest_symlinked", Errc::unsafe_path},
    {Corruption::manifest_hard_linked, "manifest_hard_linked", Errc::unsafe_path},
    {Corruption::manifest_missing, "manifest_missing", Errc::missing_file},
    {Corruption::bad_format, "bad_format", Errc::format},
    {Corruption::bad_version, "bad_version", Errc::version},
    {Corruption::version_not_integer, "version_not_integer", Errc::format},
    {Corruption::unknown_codec, "unknown_codec", Errc::unknown_codec},
    {Corruption::bad_param_value, "bad_param_value", Errc::codec_params},
    {Corruption::unknown_param, "unknown_param", Errc::codec_params},
    {Corruption::params_not_object, "params_not_object", Errc::codec_params},
    {Corruption::wrong_array_dtype, "wrong_array_dtype", Errc::dtype},
    {Corruption::wrong_array_shape, "wrong_array_shape", Errc::shape},
    {Corruption::wrong_logical_shape, "wrong_logical_shape", Errc::shape},
    {Corruption::missing_array_entry, "missing_array_entry", Errc::shape},
    {Corruption::array_role_renamed, "array_role_renamed", Errc::shape},
    {Corruption::duplicate_tensor_name, "duplicate_tensor_name", Errc::duplicate},
    {Corruption::duplicate_array_key, "duplicate_array_key", Errc::duplicate},
    {Corruption::array_in_non_payload_file, "array_in_non_payload_file", Errc::format},
    {Corruption::array_in_undeclared_file, "array_in_undeclared_file", Errc::format},
    {Corruption::oversize_dim, "oversize_dim", Errc::limit},
    {Corruption::negative_dim, "negative_dim", Errc::shape},
    {Corruption::rank_too_high, "rank_too_high", Errc::limit},
    {Corruption::numel_overflow, "numel_overflow", Errc::overflow},
    {Corruption::too_many_tensors, "too_many_tensors", Errc::limit},
    {Corruption::tensor_name_too_long, "tensor_name_too_long", Errc::limit},
    {Corruption::tensor_name_control_char, "tensor_name_control_char", Errc::format},
    {Corruption::duplicate_file_entry, "duplicate_file_entry", Errc::duplicate},
    {Corruption::unknown_file_role, "unknown_file_role", Errc::format},
    {Corruption::manifest_declared_as_file, "manifest_declared_as_file", Errc::format},
    {Corruption::path_with_slash, "path_with_slash", Errc::unsafe_path},
    {Corruption::path_dotdot, "path_dotdot", Errc::unsafe_path},
    {Corruption::absolute_path, "absolute_path", Errc::unsafe_path},
    {Corruption::path_control_char, "path_control_char", Errc::unsafe_path},
    {Corruption::path_hidden, "path_hidden", Errc::unsafe_path},
    {Corruption::wrong_hash_string, "wrong_hash_string", Errc::format},
    {Corruption::wrong_hash_value, "wrong_hash_value", Errc::hash_mismatch},
    {Corruption::wrong_declared_size_larger, "wrong_declared_size_larger", Errc::truncated},
    {Corruption::wrong_declared_size_smaller, "wrong_declared_size_smaller", Errc::size_mismatch},
    {Corruption::payload_without_arrays, "payload_without_arrays", Errc::format},
    {Corruption::missing_payload, "missing_payload", Errc::missing_file},
    {Corruption::missing_config, "missing_config", Errc::missing_file},
    {Corruption::extra_file, "extra_file", Errc::extra_file},
    {Corruption::extra_directory, "extra_directory", Errc::extra_file},
    {Corruption::truncated_payload, "truncated_payload", Errc::truncated},
    {Corruption::appended_byte, "appended_byte", Errc::size_mismatch},
    {Corruption::flipped_payload_byte, "flipped_payload_byte", Errc::hash_mismatch},
    {Corruption::flipped_config_byte, "flipped_config_byte", Errc::hash_mismatch},
    {Corruption::symlinked_payload, "symlinked_payload", Errc::unsafe_path},
    {Corruption::hard_linked_payload, "hard_linked_payload", Errc::unsafe_path},
    {Corruption::safetensors_bad_header_length, "safetensors_bad_header_length", Errc::truncated},
    {Corruption::safetensors_header_not_json, "safetensors_header_not_json", Errc::format},
    {Corruption::safetensors_misaligned, "safetensors_misaligned", Errc::layout},
    {Corruption::safetensors_overlap, "safetensors_overlap", Errc::layout},
    {Corruption::safetensors_hole, "safetensors_hole", Errc::layout},
    {Corruption::safetensors_trailing_bytes, "safetensors_trailing_bytes", Errc::layout},
    {Corruption::payload_missing_array, "payload_missing_array", Errc::format},
    {Corruption::payload_extra_array, "payload_extra_array", Errc::layout},
    {Corruption::payload_dtype_differs, "payload_dtype_differs", Errc::dtype},
    {Corruption::payload_shape_differs, "payload_shape_differs", Errc::shape},
    {Corruption::non_finite_dense, "non_finite_dense", Errc::non_finite},
    {Corruption::reserved_code, "reserved_code", Errc::reserved_code},
    {Corruption::non_finite_scale, "non_finite_scale", Errc::non_finite},
    {Corruption::changed_size_while_loading, "changed_size_while_loading", Errc::changed},
    {Corruption::changed_mtime_while_loading, "changed_mtime_while_loading", Errc::changed},
    {Corruption::replaced_while_loading, "replaced_while_loading", Errc::changed},
};
static_assert(std::size(kCases) == static_cast<size_t>(Corruption::count), "one case per corruption kind");

constexpr const char* kDense32 = "norm.weight";  // F32 [16]
constexpr const char* kDenseBf16 = "embed.weight";
constexpr const char* kQuantized = "layers.0.weight";

// Edits the manifest document.
void edit_manifest(const fs::path& dir, const std::function<void(json&)>& edit) {
  json m = read_manifest(dir);
  edit(m);
  write_manifest(dir, m);
}

json& first_payload(json& m) {
  for (json& f : m["files"])
    if (f["role"] == "payload") return f;
  throw std::runtime_error("no payload");
}

std::string first_payload_name(const fs::path& dir) {
  json m = read_manifest(dir);
  return first_payload(m)["name"].get<std::string>();
}

void rename_declared_file(const fs::path& dir, const std::string& from, const std::string& to) {
  edit_manifest(dir, [&](json& m) {
    file_entry(m, from)["name"] = to;
    for (json& t : m["tensors"])
      for (json& a : t["arrays"])
        if (a["file"] == from) a["file"] = to;
  });
}

void flip_byte(const fs::path& path, uint64_t offset) {
  std::string bytes = read_text(path);
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x40);
  write_text(path, bytes);
}

// Overwrites bytes of one stored array in its payload, then refreshes the payload's size and hash.
void poke_array(const fs::path& dir, const char* tensor, const char* role, size_t offset, std::string_view bytes) {
  const auto [file, key] = array_location(dir, tensor, role);
  edit_payload(dir, file, [&](RawSafetensors& raw) {
    const uint64_t begin = raw.header[key]["data_offsets"][0];
    raw.data.replace(begin + offset, bytes.size(), bytes);
  });
}

// Applies a corruption; may set options (the hook) for the kinds that act while loading.
void apply(Corruption kind, const fs::path& dir, const fs::path& outside, std::mt19937_64& rng, ReadOptions& options) {
  const std::string payload = first_payload_name(dir);
  const fs::path payload_path = dir / payload;
  switch (kind) {
    case Corruption::manifest_not_json:
      write_text(dir / kManifestName, read_text(dir / kManifestName).substr(0, 100));
      break;
    case Corruption::manifest_duplicate_key: {
      std::string text = read_text(dir / kManifestName);
      text.insert(text.find('{') + 1, "\"version\": 1,");
      write_text(dir / kManifestName, text);
      break;
    }
    case Corruption::manifest_too_deep:
      edit_manifest(dir, [](json& m) {
        json deep = json::array();
        for (int i = 0; i < 200; ++i) deep = json::array({deep});
        m["quality"] = {{"deep", deep}};
      });
      break;
    case Corruption::manifest_too_large:
      fs::resize_file(dir / kManifestName, kMaxManifestBytes + 1);
      break;
    case Corruption::manifest_unknown_field:
      edit_manifest(dir, [](json& m) { m["policy"] = "trust me"; });
      break;
    case Corruption::manifest_symlinked:
      fs::rename(dir / kManifestName, outside / kManifestName);
      fs::create_symlink(outside / kManifestName, dir / kManifestName);
      break;
    case Corruption::manifest_hard_linked:
      fs::create_hard_link(dir / kManifestName, outside / "manifest-link.json");
      break;
    case Corruption::manifest_missing:
      fs::remove(dir / kManifestName);
      break;
    case Corruption::bad_format:
      edit_manifest(dir, [](json& m) { m["format"] = "gguf"; });
      break;
    case Corruption::bad_version:
      edit_manifest(dir, [](json& m) { m["version"] = 3; });
      break;
    case Corruption::version_not_integer:
      edit_manifest(dir, [](json& m) { m["version"] = "2"; });
      break;
    case Corruption::unknown_codec:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kQuantized)["codec"] = "q9_magic"; });
      break;
    case Corruption::bad_param_value:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["params"]["dtype"] = "f8"; });
      break;
    case Corruption::unknown_param:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kQuantized)["params"]["trust_remote_code"] = true; });
      break;
    case Corruption::params_not_object:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["params"] = json::array({"f32"}); });
      break;
    case Corruption::wrong_array_dtype:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDenseBf16)["arrays"][0]["dtype"] = "F16"; });
      break;
    case Corruption::wrong_array_shape:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kQuantized)["arrays"][1]["shape"] = {16, 2}; });
      break;
    case Corruption::wrong_logical_shape:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDenseBf16)["shape"] = {16, 32}; });
      break;
    case Corruption::missing_array_entry:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kQuantized)["arrays"].erase(1); });
      break;
    case Corruption::array_role_renamed:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kQuantized)["arrays"][0]["role"] = "weights"; });
      break;
    case Corruption::duplicate_tensor_name:
      edit_manifest(dir, [](json& m) { tensor_entry(m, "layers.1.weight")["name"] = kQuantized; });
      break;
    case Corruption::duplicate_array_key:
      edit_manifest(dir, [](json& m) {
        json& a = tensor_entry(m, "layers.1.weight")["arrays"][0];
        const json& b = tensor_entry(m, kQuantized)["arrays"][0];
        a["file"] = b["file"];
        a["key"] = b["key"];
      });
      break;
    case Corruption::array_in_non_payload_file:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["arrays"][0]["file"] = "config.json"; });
      break;
    case Corruption::array_in_undeclared_file:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["arrays"][0]["file"] = "weights.safetensors"; });
      break;
    case Corruption::oversize_dim:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["shape"] = {uint64_t{1} << 40}; });
      break;
    case Corruption::negative_dim:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["shape"] = {-16}; });
      break;
    case Corruption::rank_too_high:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["shape"] = json(Shape(9, 1)); });
      break;
    case Corruption::numel_overflow:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["shape"] = json(Shape(3, kMaxDim)); });
      break;
    case Corruption::too_many_tensors:
      edit_manifest(dir, [](json& m) { m["tensors"] = json(std::vector<json>(kMaxTensors + 1, json::object())); });
      break;
    case Corruption::tensor_name_too_long:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["name"] = std::string(kMaxNameBytes + 1, 'n'); });
      break;
    case Corruption::tensor_name_control_char:
      edit_manifest(dir, [](json& m) { tensor_entry(m, kDense32)["name"] = "norm\nweight"; });
      break;
    case Corruption::duplicate_file_entry:
      edit_manifest(dir, [](json& m) { m["files"].push_back(file_entry(m, "config.json")); });
      break;
    case Corruption::unknown_file_role:
      edit_manifest(dir, [](json& m) { file_entry(m, "tokenizer.json")["role"] = "executable"; });
      break;
    case Corruption::manifest_declared_as_file:
      edit_manifest(dir, [](json& m) { file_entry(m, "tokenizer.json")["name"] = kManifestName; });
      break;
    case Corruption::path_with_slash:
      rename_declared_file(dir, payload, "sub/" + payload);
      break;
    case Corruption::path_dotdot:
      rename_declared_file(dir, payload, "..");
      break;
    case Corruption::absolute_path:
      rename_declared_file(dir, payload, (outside / payload).string());
      break;
    case Corruption::path_control_char:
      rename_declared_file(dir, payload, payload + "\x01");
      break;
    case Corruption::path_hidden:
      rename_declared_file(dir, payload, "." + payload);
      break;
    case Corruption::wrong_hash_string:
      edit_manifest(dir, [](json& m) { first_payload(m)["sha256"] = std::string(64, 'Z'); });
      break;
    case Corruption::wrong_hash_value:
      edit_manifest(dir, [&](json& m) {
        std::string h = first_payload(m)["sha256"];
        const size_t i = rng() % 64;
        h[i] = h[i] == '0' ? '1' : '0';
        first_payload(m)["sha256"] = h;
      });
      break;
    case Corruption::wrong_declared_size_larger:
      edit_manifest(dir, [](json& m) { first_payload(m)["size"] = first_payload(m)["size"].get<uint64_t>() + 1; });
      break;
    case Corruption::wrong_declared_size_smaller:
      edit_manifest(dir, [](json& m) { first_payload(m)["size"] = first_payload(m)["size"].get<uint64_t>() - 1; });
      break;
    case Corruption::payload_without_arrays:
      edit_manifest(dir, [](json& m) {
        m["files"].push_back({{"name", "unused.safetensors"}, {"role", "payload"}, {"size", 0},
                              {"sha256", std::string(64, '0')}});
      });
      break;
    case Corruption::missing_payload:
      fs::remove(payload_path);
      break;
    case Corruption::missing_config:
      fs::remove(dir / "config.json");
      break;
    case Corruption::extra_file:
      write_text(dir / "notes.txt", "hello");
      break;
    case Corruption::extra_directory:
      fs::create_directory(dir / "extra");
      break;
    case Corruption::truncated_payload:
      fs::resize_file(payload_path, fs::file_size(payload_path) - 1 - rng() % 16);
      break;
    case Corruption::appended_byte: {
      std::ofstream(payload_path, std::ios::app | std::ios::binary).put('\0');
      break;
    }
    case Corruption::flipped_payload_byte:
      flip_byte(payload_path, fs::file_size(payload_path) - 1 - rng() % 64);
      break;
    case Corruption::flipped_config_byte:
      flip_byte(dir / "config.json", rng() % fs::file_size(dir / "config.json"));
      break;
    case Corruption::symlinked_payload:
      fs::rename(payload_path, outside / payload);
      fs::create_symlink(outside / payload, payload_path);
      break;
    case Corruption::hard_linked_payload:
      fs::create_hard_link(payload_path, outside / payload);
      break;
    case Corruption::safetensors_bad_header_length: {
      std::string bytes = read_text(payload_path);
      const uint64_t n = bytes.size();  // a header length running past the end of the file
      std::memcpy(bytes.data(), &n, 8);
      write_text(payload_path, bytes);
      refresh_file_entry(dir, payload);
      break;
    }
    case Corruption::safetensors_header_not_json: {
      const RawSafetensors raw = RawSafetensors::load(payload_path);
      std::string text = raw.header.dump();
      text.back() = ' ';  // the closing brace
      write_text(payload_path, raw.assemble_with(text));
      refresh_file_entry(dir, payload);
      break;
    }
    case Corruption::safetensors_misaligned: {
      const RawSafetensors raw = RawSafetensors::load(payload_path);
      // A header length of 2 mod 8 puts every array off its element alignment, whatever the key names are.
      std::string header = raw.header.dump();
      while (header.size() % 8 != 2) header += ' ';
      write_text(payload_path, raw.assemble_unpadded(header));
      refresh_file_entry(dir, payload);
      break;
    }
    case Corruption::safetensors_overlap:
      edit_payload(dir, payload, [](RawSafetensors& raw) {
        for (auto& [key, entry] : raw.header.items())
          if (key != "__metadata__" && entry["data_offsets"][0] != 0) {
            entry["data_offsets"][0] = entry["data_offsets"][0].get<uint64_t>() - 2;
            entry["data_offsets"][1] = entry["data_offsets"][1].get<uint64_t>() - 2;
            break;
          }
      });
      break;
    case Corruption::safetensors_hole:
      edit_payload(dir, payload, [](RawSafetensors& raw) {
        uint64_t last_end = 0;
        for (auto& [key, entry] : raw.header.items())
          if (key != "__metadata__") last_end = std::max(last_end, entry["data_offsets"][1].get<uint64_t>());
        for (auto& [key, entry] : raw.header.items())
          if (key != "__metadata__" && entry["data_offsets"][1] == last_end) {
            entry["data_offsets"][0] = entry["data_offsets"][0].get<uint64_t>() + 2;
            entry["data_offsets"][1] = last_end + 2;
          }
        raw.data += std::string(2, '\0');
      });
      break;
    case Corruption::safetensors_trailing_bytes:
      edit_payload(dir, payload, [](RawSafetensors& raw) { raw.data += std::string(4, '\0'); });
      break;
    case Corruption::payload_missing_array:
      edit_payload(dir, array_location(dir, kDense32, "data").first, [](RawSafetensors& raw) {
        raw.header["renamed"] = raw.header[kDense32];
        raw.header.erase(kDense32);
      });
      break;
    case Corruption::payload_extra_array:
      edit_payload(dir, payload, [](RawSafetensors& raw) {
        const uint64_t end = raw.data.size();
        raw.header["smuggled"] = {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {end, end + 4}}};
        raw.data += "evil";
      });
      break;
    case Corruption::payload_dtype_differs:
      edit_payload(dir, array_location(dir, kDenseBf16, "data").first,
                   [](RawSafetensors& raw) { raw.header[kDenseBf16]["dtype"] = "F16"; });
      break;
    case Corruption::payload_shape_differs:
      edit_payload(dir, array_location(dir, kDenseBf16, "data").first,
                   [](RawSafetensors& raw) { raw.header[kDenseBf16]["shape"] = {16, 32}; });
      break;
    case Corruption::non_finite_dense: {
      const float nan = std::nanf("");
      poke_array(dir, kDense32, "data", 4 * (rng() % 16), {reinterpret_cast<const char*>(&nan), 4});
      break;
    }
    case Corruption::reserved_code:
      poke_array(dir, kQuantized, "codes", rng() % 32, "\xff");  // code 15 is reserved in q4
      break;
    case Corruption::non_finite_scale:
      poke_array(dir, kQuantized, "scales", 0, std::string_view("\x00\x7c", 2));  // f16 +Inf
      break;
    case Corruption::changed_size_while_loading:
      options.before_recheck = [payload_path] { std::ofstream(payload_path, std::ios::app).put('x'); };
      break;
    case Corruption::changed_mtime_while_loading:
      options.before_recheck = [payload_path] {
        const timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
        ::utimensat(AT_FDCWD, payload_path.c_str(), times, 0);
      };
      break;
    case Corruption::replaced_while_loading:
      options.before_recheck = [payload_path] {
        fs::copy_file(payload_path, payload_path.string() + ".new");
        fs::rename(payload_path.string() + ".new", payload_path);
      };
      break;
    case Corruption::count:
      break;
  }
}

// One test over every kind (one process, one seeded artifact written once and copied per case: copies are cheap,
// fsynced writes are not); SCOPED_TRACE names the kind in any failure.
TEST(CorruptionMatrix, EveryKindIsRejectedWithTheExpectedError) {
  TempDir pristine;
  write_valid_artifact(pristine / "artifact", 0xC0FFEE);
  ASSERT_NO_THROW(Artifact::open(pristine / "artifact"));
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    TempDir tmp;
    const fs::path dir = tmp / "artifact";
    const fs::path outside = tmp / "outside";
    fs::copy(pristine / "artifact", dir, fs::copy_options::recursive);
    fs::create_directory(outside);
    std::mt19937_64 rng(0xC0FFEE + static_cast<uint64_t>(c.kind));
    ReadOptions options;
    apply(c.kind, dir, outside, rng, options);
    std::string message;
    const Errc got = error_of([&] { Artifact::open(dir, options); }, &message);
    EXPECT_EQ(errc_name(got), errc_name(c.expected)) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "error messages are one line: " << message;
  }
}

TEST(CorruptionMatrix, HasAtLeastThirtyKinds) { EXPECT_GE(std::size(kCases), 30u); }

}  // namespace
}  // namespace lowbit::artifact::testing
