#include "lowbit/artifact/manifest.h"

#include <algorithm>
#include <set>
#include <utility>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"
#include "json_fields.h"

namespace lowbit::artifact {

namespace {

using nlohmann::json;
using detail::Fields;
using detail::has_control_char;
using detail::is_sha256_hex;

constexpr std::string_view kOp = detail::kManifestOp;

std::string indexed(std::string_view list, size_t i) { return fmt::format("{}[{}]", list, i); }

FileRole parse_role(std::string_view name, std::string_view source, std::string_view where) {
  for (FileRole r : {FileRole::payload, FileRole::config, FileRole::tokenizer, FileRole::quality, FileRole::recipe,
                     FileRole::other})
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

// Version 1's free-form `provenance.recipe` goes to `unverified`; version 2 has no such field.
Provenance parse_provenance(Fields& root, std::string_view source, int64_t version, json& unverified) {
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
  if (version == kLegacyVersion) unverified["provenance.recipe"] = f.object("recipe");
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
    case FileRole::quality: return "quality";
    case FileRole::recipe: return "recipe";
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
  if (!version.is_number_unsigned() ||
      (version.get<uint64_t>() != kVersion && version.get<uint64_t>() != kLegacyVersion))
    fail(Errc::version, "{} {}: version: {} is not supported (this reader knows versions {} and {})", kOp, source,
         version.dump(), kLegacyVersion, kVersion);
  Manifest m;
  m.version = version.get<int64_t>();
  m.files = parse_files(root, source);
  m.tensors = parse_tensors(root, source, m.files);
  m.config = root.object("config");
  m.provenance = parse_provenance(root, source, m.version, m.unverified);
  if (m.version == kLegacyVersion) {
    if (const json* quality = root.optional("quality")) {
      if (!quality->is_object()) fail(Errc::format, "{} {}: quality: must be a JSON object", kOp, source);
      m.unverified["quality"] = *quality;
    }
  }
  for (FileRole role : {FileRole::quality, FileRole::recipe}) {
    if (m.version == kLegacyVersion && m.find_role(role))
      fail(Errc::format, "{} {}: files: role '{}' needs version {}", kOp, source, file_role_name(role), kVersion);
    if (std::count_if(m.files.begin(), m.files.end(), [&](const FileEntry& e) { return e.role == role; }) > 1)
      fail(Errc::duplicate, "{} {}: files: more than one file of role '{}'", kOp, source, file_role_name(role));
  }
  root.finish();
  return m;
}

// Writes the current version only: a version 1 manifest's unverified fields are never written back.
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
            {"calibration_sha256", provenance.calibration_sha256 ? json(*provenance.calibration_sha256) : json()},
            {"seeds", std::move(seeds_json)}}}};
}

std::string Manifest::serialize() const { return to_json().dump(2) + "\n"; }

const TensorEntry* Manifest::find_tensor(std::string_view name) const {
  for (const TensorEntry& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const FileEntry* Manifest::find_role(FileRole role) const {
  for (const FileEntry& f : files)
    if (f.role == role) return &f;
  return nullptr;
}

const FileEntry* Manifest::find_file(std::string_view name) const {
  for (const FileEntry& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

}  // namespace lowbit::artifact
