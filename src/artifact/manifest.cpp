#include "lowbit/artifact/manifest.h"

#include <algorithm>
#include <set>
#include <utility>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"

namespace lowbit::artifact {

namespace {

using nlohmann::json;

constexpr std::string_view kOp = "[manifest]";

bool has_control_char(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

bool is_sha256_hex(std::string_view s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Strict reading of one JSON object of the manifest: typed getters whose errors name the file and the field, and
// finish() rejecting keys that were not read.
class Fields {
 public:
  Fields(const json& object, std::string_view source, std::string where)
      : object_(object), source_(source), where_(std::move(where)) {
    if (!object_.is_object())
      fail(Errc::format, "{} {}: {}: must be a JSON object, got {}", kOp, source_, where_.empty() ? "the document" : where_,
           io::json_kind(object_));
  }

  std::string path(std::string_view key) const { return where_.empty() ? std::string(key) : where_ + "." + std::string(key); }

  const json* optional(std::string_view key) {
    seen_.emplace(key);
    auto it = object_.find(std::string(key));
    return it == object_.end() ? nullptr : &*it;
  }

  const json& required(std::string_view key) {
    const json* v = optional(key);
    if (!v) fail(Errc::format, "{} {}: {}: required field is missing", kOp, source_, path(key));
    return *v;
  }

  std::string string(std::string_view key, size_t max_bytes) {
    const json& v = required(key);
    if (!v.is_string()) fail(Errc::format, "{} {}: {}: must be a string", kOp, source_, path(key));
    std::string s = v.get<std::string>();
    if (s.size() > max_bytes)
      fail(Errc::limit, "{} {}: {}: {} bytes, more than the limit {}", kOp, source_, path(key), s.size(), max_bytes);
    return s;
  }

  // A printable name: non-empty, bounded, without control characters.
  std::string name(std::string_view key) {
    std::string s = string(key, kMaxNameBytes);
    check_tensor_name(s, fmt::format("{} {}: {}", kOp, source_, path(key)));
    return s;
  }

  uint64_t unsigned_integer(std::string_view key) {
    const json& v = required(key);
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
    fail(Errc::format, "{} {}: {}: must be a non-negative integer", kOp, source_, path(key));
  }

  std::string sha256(std::string_view key) {
    std::string s = string(key, 64);
    if (!is_sha256_hex(s))
      fail(Errc::format, "{} {}: {}: must be 64 lowercase hex digits", kOp, source_, path(key));
    return s;
  }

  const json& object(std::string_view key) {
    const json& v = required(key);
    if (!v.is_object()) fail(Errc::format, "{} {}: {}: must be a JSON object", kOp, source_, path(key));
    return v;
  }

  const json& array(std::string_view key, size_t max_items) {
    const json& v = required(key);
    if (!v.is_array()) fail(Errc::format, "{} {}: {}: must be an array", kOp, source_, path(key));
    if (v.size() > max_items)
      fail(Errc::limit, "{} {}: {}: {} entries, more than the limit {}", kOp, source_, path(key), v.size(),
           max_items);
    return v;
  }

  Shape shape(std::string_view key) {
    const json& v = array(key, kMaxRank);
    Shape shape;
    for (const json& d : v) {
      if (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(kMaxDim))
        fail(Errc::limit, "{} {}: {}: dimension {} above the limit {}", kOp, source_, path(key), d.get<uint64_t>(),
             kMaxDim);
      if (!d.is_number_integer()) fail(Errc::format, "{} {}: {}: dimensions must be integers", kOp, source_, path(key));
      shape.push_back(d.get<int64_t>());
    }
    checked_shape_numel(shape, fmt::format("{} {}: {}", kOp, source_, path(key)));
    return shape;
  }

  DType dtype(std::string_view key) {
    const std::string name = string(key, 16);
    const auto dt = parse_dtype(name);
    if (!dt) fail(Errc::dtype, "{} {}: {}: unknown dtype '{}'", kOp, source_, path(key), name);
    return *dt;
  }

  void finish() const {
    for (const auto& [key, value] : object_.items())
      if (!seen_.contains(key)) fail(Errc::format, "{} {}: {}: unknown field", kOp, source_, path(key));
  }

 private:
  const json& object_;
  std::string_view source_;
  std::string where_;
  std::set<std::string, std::less<>> seen_;
};

std::string indexed(std::string_view list, size_t i) { return fmt::format("{}[{}]", list, i); }

FileRole parse_role(std::string_view name, std::string_view source, std::string_view where) {
  for (FileRole r : {FileRole::payload, FileRole::config, FileRole::tokenizer, FileRole::other})
    if (file_role_name(r) == name) return r;
  fail(Errc::format, "{} {}: {}.role: unknown file role '{}'", kOp, source, where, name);
}

std::vector<FileEntry> parse_files(Fields& root, std::string_view source) {
  const json& list = root.array("files", kMaxFiles);
  std::vector<FileEntry> files;
  std::set<std::string, std::less<>> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = indexed("files", i);
    Fields f(list[i], source, where);
    FileEntry e;
    e.name = f.string("name", kMaxFileNameBytes);
    check_file_name(e.name, fmt::format("{} {}: {}.name", kOp, source, where));
    if (e.name == kManifestName)
      fail(Errc::format, "{} {}: {}.name: '{}' is reserved for the manifest itself", kOp, source, where, e.name);
    e.role = parse_role(f.string("role", 16), source, where);
    e.size = f.unsigned_integer("size");
    e.sha256 = f.sha256("sha256");
    f.finish();
    if (!names.insert(e.name).second)
      fail(Errc::duplicate, "{} {}: {}.name: file '{}' declared twice", kOp, source, where, e.name);
    files.push_back(std::move(e));
  }
  return files;
}

// Rethrows a codec error with the manifest location in front, keeping its code.
template <class Fn>
auto with_context(const std::string& context, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", context, e.what()));
  } catch (const nlohmann::json::exception& e) {
    fail(Errc::codec_params, "{}: params: {}", context, e.what());
  }
}

// The declared arrays must be exactly the ones the codec stores for these params and this logical shape.
void check_arrays_match_codec(const codec::Codec& c, const TensorEntry& t, const std::string& context) {
  const auto specs = with_context(context, [&] { return c.arrays(t.params, t.shape); });
  if (specs.size() != t.arrays.size())
    fail(Errc::shape, "{}: codec '{}' stores {} arrays, manifest declares {}", context, c.id, specs.size(),
         t.arrays.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const ArrayEntry& a = t.arrays[i];
    if (a.role != specs[i].role)
      fail(Errc::shape, "{}: arrays[{}] is '{}', codec '{}' expects '{}'", context, i, a.role, c.id, specs[i].role);
    if (a.dtype != specs[i].dtype)
      fail(Errc::dtype, "{}: array '{}' declared {}, codec '{}' expects {}", context, a.role, dtype_name(a.dtype),
           c.id, dtype_name(specs[i].dtype));
    if (a.shape != specs[i].shape)
      fail(Errc::shape, "{}: array '{}' declared {}, codec '{}' expects {}", context, a.role, shape_str(a.shape),
           c.id, shape_str(specs[i].shape));
  }
}

ArrayEntry parse_array(const json& value, std::string_view source, const std::string& where,
                       const std::map<std::string, FileRole, std::less<>>& file_roles) {
  Fields f(value, source, where);
  ArrayEntry a;
  a.role = f.name("role");
  a.file = f.string("file", kMaxFileNameBytes);
  check_file_name(a.file, fmt::format("{} {}: {}.file", kOp, source, where));
  const auto it = file_roles.find(a.file);
  if (it == file_roles.end() || it->second != FileRole::payload)
    fail(Errc::format, "{} {}: {}.file: '{}' is not a declared payload file", kOp, source, where, a.file);
  a.key = f.name("key");
  a.dtype = f.dtype("dtype");
  a.shape = f.shape("shape");
  f.finish();
  return a;
}

TensorEntry parse_tensor(const json& value, std::string_view source, const std::string& where,
                         const std::map<std::string, FileRole, std::less<>>& file_roles) {
  Fields f(value, source, where);
  TensorEntry t;
  t.name = f.name("name");
  const std::string context = fmt::format("{} {}: {} ('{}')", kOp, source, where, t.name);
  t.shape = f.shape("shape");
  t.codec = f.string("codec", kMaxNameBytes);
  const codec::Codec& c = codec::codec_or_throw(t.codec, context);
  t.params = f.required("params");
  if (!t.params.is_object()) fail(Errc::codec_params, "{}: params must be a JSON object", context);
  with_context(context, [&] { c.validate(t.params, t.shape); });
  const json& arrays = f.array("arrays", kMaxArraysPerTensor);
  for (size_t i = 0; i < arrays.size(); ++i)
    t.arrays.push_back(parse_array(arrays[i], source, where + indexed(".arrays", i), file_roles));
  f.finish();
  check_arrays_match_codec(c, t, context);
  return t;
}

std::vector<TensorEntry> parse_tensors(Fields& root, std::string_view source, const std::vector<FileEntry>& files) {
  std::map<std::string, FileRole, std::less<>> file_roles;
  for (const FileEntry& e : files) file_roles.emplace(e.name, e.role);
  const json& list = root.array("tensors", kMaxTensors);
  std::vector<TensorEntry> tensors;
  std::set<std::string, std::less<>> names;
  std::set<std::pair<std::string, std::string>> keys;  // (file, key)
  std::set<std::string, std::less<>> used_payloads;
  for (size_t i = 0; i < list.size(); ++i) {
    TensorEntry t = parse_tensor(list[i], source, indexed("tensors", i), file_roles);
    if (!names.insert(t.name).second)
      fail(Errc::duplicate, "{} {}: tensors[{}].name: tensor '{}' declared twice", kOp, source, i, t.name);
    for (const ArrayEntry& a : t.arrays) {
      if (!keys.emplace(a.file, a.key).second)
        fail(Errc::duplicate, "{} {}: tensors[{}] ('{}'): array key '{}' in '{}' is used twice", kOp, source, i,
             t.name, a.key, a.file);
      used_payloads.insert(a.file);
    }
    tensors.push_back(std::move(t));
  }
  for (const FileEntry& e : files)
    if (e.role == FileRole::payload && !used_payloads.contains(e.name))
      fail(Errc::format, "{} {}: files: payload '{}' holds no declared array", kOp, source, e.name);
  return tensors;
}

Provenance parse_provenance(Fields& root, std::string_view source) {
  Fields f(root.object("provenance"), source, "provenance");
  Provenance p;
  p.tool = f.name("tool");
  const json& sources = f.array("sources", kMaxSources);
  for (size_t i = 0; i < sources.size(); ++i) {
    Fields s(sources[i], source, indexed("provenance.sources", i));
    SourceFile sf;
    sf.name = s.name("name");
    sf.size = s.unsigned_integer("size");
    sf.sha256 = s.sha256("sha256");
    s.finish();
    p.sources.push_back(std::move(sf));
  }
  p.recipe = f.object("recipe");
  const json& calibration = f.required("calibration_sha256");
  if (!calibration.is_null()) p.calibration_sha256 = f.sha256("calibration_sha256");
  const json& seeds = f.object("seeds");
  if (seeds.size() > kMaxSeeds)
    fail(Errc::limit, "{} {}: provenance.seeds: {} entries, more than the limit {}", kOp, source, seeds.size(),
         kMaxSeeds);
  Fields seed_fields(seeds, source, "provenance.seeds");
  for (const auto& [key, value] : seeds.items()) {
    if (key.empty() || key.size() > kMaxNameBytes || has_control_char(key))
      fail(Errc::format, "{} {}: provenance.seeds: bad seed name", kOp, source);
    p.seeds.emplace(key, seed_fields.unsigned_integer(key));
  }
  f.finish();
  return p;
}

json shape_json(const Shape& shape) { return json(shape); }

}  // namespace

std::string_view file_role_name(FileRole role) {
  switch (role) {
    case FileRole::payload: return "payload";
    case FileRole::config: return "config";
    case FileRole::tokenizer: return "tokenizer";
    case FileRole::other: return "other";
  }
  return "other";
}

void check_file_name(std::string_view name, std::string_view context) {
  if (name.empty()) fail(Errc::unsafe_path, "{}: empty file name", context);
  if (name.size() > kMaxFileNameBytes)
    fail(Errc::unsafe_path, "{}: file name of {} bytes, more than {}", context, name.size(), kMaxFileNameBytes);
  if (has_control_char(name)) fail(Errc::unsafe_path, "{}: file name contains a control character", context);
  if (name.front() == '/') fail(Errc::unsafe_path, "{}: '{}' is an absolute path", context, name);
  if (name.find('/') != std::string_view::npos || name.find('\\') != std::string_view::npos)
    fail(Errc::unsafe_path, "{}: '{}' contains a path separator", context, name);
  if (name == "." || name == "..") fail(Errc::unsafe_path, "{}: '{}' names a directory", context, name);
  if (name.front() == '.') fail(Errc::unsafe_path, "{}: '{}' starts with '.'", context, name);
}

void check_tensor_name(std::string_view name, std::string_view context) {
  if (name.size() > kMaxNameBytes)
    fail(Errc::limit, "{}: name of {} bytes, more than the limit {}", context, name.size(), kMaxNameBytes);
  if (name.empty() || has_control_char(name))
    fail(Errc::format, "{}: names must be non-empty without control characters", context);
}

uint64_t checked_shape_numel(const Shape& shape, std::string_view context) {
  if (shape.size() > kMaxRank) fail(Errc::limit, "{}: rank {} above the limit {}", context, shape.size(), kMaxRank);
  for (int64_t d : shape) {
    if (d < 0) fail(Errc::shape, "{}: negative dimension {}", context, d);
    if (d > kMaxDim) fail(Errc::limit, "{}: dimension {} above the limit {}", context, d, kMaxDim);
  }
  return checked_numel(shape, context);
}

Manifest Manifest::parse(std::string_view text, std::string_view source) {
  if (text.size() > kMaxManifestBytes)
    fail(Errc::limit, "{} {}: {} bytes, more than the limit {}", kOp, source, text.size(), kMaxManifestBytes);
  return from_json(io::parse_json(text, "manifest", source), source);
}

Manifest Manifest::from_json(const json& doc, std::string_view source) {
  Fields root(doc, source, "");
  const json& format = root.required("format");
  if (!format.is_string()) fail(Errc::format, "{} {}: format: expected a string, got {}", kOp, source, io::json_kind(format));
  if (format.get<std::string>() != kFormat)
    fail(Errc::format, "{} {}: format: expected \"{}\", found {}", kOp, source, kFormat,
         io::quote(format.get<std::string>()));
  const json& version = root.required("version");
  if (!version.is_number_integer()) fail(Errc::format, "{} {}: version: must be an integer", kOp, source);
  if (!version.is_number_unsigned() || version.get<uint64_t>() != kVersion)
    fail(Errc::version, "{} {}: version: {} is not supported (this reader knows version {})", kOp, source,
         version.dump(), kVersion);
  Manifest m;
  m.files = parse_files(root, source);
  m.tensors = parse_tensors(root, source, m.files);
  m.config = root.object("config");
  m.provenance = parse_provenance(root, source);
  if (const json* quality = root.optional("quality")) {
    if (!quality->is_object()) fail(Errc::format, "{} {}: quality: must be a JSON object", kOp, source);
    m.quality = *quality;
  }
  root.finish();
  return m;
}

json Manifest::to_json() const {
  json tensors_json = json::array();
  for (const TensorEntry& t : tensors) {
    json arrays_json = json::array();
    for (const ArrayEntry& a : t.arrays)
      arrays_json.push_back({{"role", a.role}, {"file", a.file}, {"key", a.key}, {"dtype", dtype_name(a.dtype)},
                             {"shape", shape_json(a.shape)}});
    tensors_json.push_back({{"name", t.name}, {"shape", shape_json(t.shape)}, {"codec", t.codec},
                            {"params", t.params}, {"arrays", std::move(arrays_json)}});
  }
  json files_json = json::array();
  for (const FileEntry& f : files)
    files_json.push_back({{"name", f.name}, {"role", file_role_name(f.role)}, {"size", f.size}, {"sha256", f.sha256}});
  json sources_json = json::array();
  for (const SourceFile& s : provenance.sources)
    sources_json.push_back({{"name", s.name}, {"size", s.size}, {"sha256", s.sha256}});
  json seeds_json = json::object();
  for (const auto& [name, seed] : provenance.seeds) seeds_json[name] = seed;
  return {{"format", kFormat},
          {"version", kVersion},
          {"tensors", std::move(tensors_json)},
          {"files", std::move(files_json)},
          {"config", config},
          {"provenance",
           {{"tool", provenance.tool},
            {"sources", std::move(sources_json)},
            {"recipe", provenance.recipe},
            {"calibration_sha256", provenance.calibration_sha256 ? json(*provenance.calibration_sha256) : json()},
            {"seeds", std::move(seeds_json)}}},
          {"quality", quality}};
}

std::string Manifest::serialize() const { return to_json().dump(2) + "\n"; }

const TensorEntry* Manifest::find_tensor(std::string_view name) const {
  for (const TensorEntry& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const FileEntry* Manifest::find_file(std::string_view name) const {
  for (const FileEntry& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

}  // namespace lowbit::artifact
