// Reading safetensors files and checkpoints. The checks follow the reference implementation's
// (huggingface/safetensors, read_metadata and Metadata::validate) and are stricter where it is lenient (its
// Python package 0.8 accepts all of these): repeated keys, unknown fields in an entry, a null __metadata__,
// more than kSafetensorsMaxRank dimensions, and a header that does not start with '{' are rejected.
#include "lowbit/io/safetensors.h"

#include <algorithm>
#include <limits>
#include <set>

#include "lowbit/core/checked.h"
#include "lowbit/core/error.h"
#include "lowbit/io/json.h"

namespace lowbit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kReadOp = "read_safetensors";
constexpr std::string_view kCheckpointOp = "read_checkpoint";
constexpr std::string_view kIndexName = "model.safetensors.index.json";
constexpr std::string_view kSingleName = "model.safetensors";
// root object -> tensor object -> shape array; one level of slack so that a nested array inside a field is
// reported as a wrong type rather than as a depth limit.
constexpr size_t kHeaderMaxDepth = 4;
constexpr size_t kMaxShards = 100'000;
constexpr uint64_t kIndexMaxBytes = 100'000'000;

uint64_t load_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// A JSON number that is a non-negative integer; `negative` is the error for a negative one.
uint64_t non_negative_integer(const json& v, std::string_view field, Errc negative) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) fail(negative, "{}: {} is negative", field, v.get<int64_t>());
  fail(Errc::format, "{}: expected a non-negative integer, got {}", field, json_kind(v));
}

DType parse_entry_dtype(const json& v) {
  if (!v.is_string()) fail(Errc::format, "dtype: expected a string, got {}", json_kind(v));
  const auto& name = v.get_ref<const std::string&>();
  const auto dtype = parse_dtype(name);
  if (!dtype) fail(Errc::dtype, "dtype: unknown dtype {}", quote(name));
  return *dtype;
}

Shape parse_entry_shape(const json& v) {
  if (!v.is_array()) fail(Errc::format, "shape: expected an array, got {}", json_kind(v));
  if (v.size() > kSafetensorsMaxRank)
    fail(Errc::limit, "shape: {} dimensions, more than the {} allowed", v.size(), kSafetensorsMaxRank);
  Shape shape;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = fmt::format("shape[{}]", i);
    const uint64_t d = non_negative_integer(v[i], field, Errc::shape);
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(Errc::overflow, "{}: {} does not fit in 63 bits", field, d);
    shape.push_back(static_cast<int64_t>(d));
  }
  return shape;
}

// Everything about one entry that can be checked without its neighbours. Errors are prefixed by the caller.
SafetensorsEntry parse_entry_fields(const std::string& name, const json& v) {
  if (!v.is_object()) fail(Errc::format, "expected an object, got {}", json_kind(v));
  for (const auto& [key, _] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets") fail(Errc::format, "unexpected field {}", quote(key));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!v.contains(key)) fail(Errc::format, "missing field \"{}\"", key);

  SafetensorsEntry e;
  e.name = name;
  e.dtype = parse_entry_dtype(v["dtype"]);
  e.shape = parse_entry_shape(v["shape"]);
  const json& offsets = v["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    fail(Errc::format, "data_offsets: expected [begin, end], got {}{}", json_kind(offsets),
         offsets.is_array() ? fmt::format(" of {} elements", offsets.size()) : "");
  e.begin = non_negative_integer(offsets[0], "data_offsets[0]", Errc::layout);
  e.end = non_negative_integer(offsets[1], "data_offsets[1]", Errc::layout);
  if (e.begin > e.end) fail(Errc::layout, "data_offsets [{}, {}] end before they begin", e.begin, e.end);

  const uint64_t numel = checked_numel(e.shape, "shape");
  const uint64_t nbytes = checked_mul(numel, dtype_size(e.dtype), "shape x dtype size");
  if (nbytes != e.end - e.begin)
    fail(Errc::shape, "shape {} of {} needs {} bytes, but data_offsets [{}, {}] span {}", shape_str(e.shape),
         dtype_name(e.dtype), nbytes, e.begin, e.end, e.end - e.begin);
  return e;
}

SafetensorsEntry parse_entry(const std::string& name, const json& v, std::string_view source) {
  try {
    return parse_entry_fields(name, v);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("[{}] {}: tensor {}: {}", kReadOp, source, quote(name), e.what()));
  }
}

std::map<std::string, std::string> parse_metadata(const json& v, std::string_view source) {
  if (!v.is_object())
    fail(Errc::format, "[{}] {}: __metadata__: expected an object of strings, got {}", kReadOp, source, json_kind(v));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      fail(Errc::format, "[{}] {}: __metadata__[{}]: expected a string, got {}", kReadOp, source, quote(key),
           json_kind(value));
    metadata.emplace(key, value.get<std::string>());
  }
  return metadata;
}

// The entries, sorted by offset, must tile [0, data_size) exactly.
void check_tiling(const std::vector<SafetensorsEntry>& entries, uint64_t data_size, std::string_view source) {
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    if (e.begin > covered)
      fail(Errc::layout, "[{}] {}: tensor {}: data_offsets [{}, {}] leave a hole: bytes [{}, {}) belong to no tensor",
           kReadOp, source, quote(e.name), e.begin, e.end, covered, e.begin);
    if (e.begin < covered)
      fail(Errc::layout, "[{}] {}: tensor {}: data_offsets [{}, {}] overlap tensor {}, which ends at {}", kReadOp,
           source, quote(e.name), e.begin, e.end, quote(entries[i - 1].name), covered);
    covered = e.end;
  }
  if (covered > data_size)
    fail(Errc::truncated, "[{}] {}: the tensors span {} data bytes, but only {} follow the header", kReadOp, source,
         covered, data_size);
  if (covered < data_size)
    fail(Errc::layout, "[{}] {}: {} trailing bytes after the last tensor", kReadOp, source, data_size - covered);
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> file, std::string_view source) {
  if (file.size() < 8)
    fail(Errc::truncated, "[{}] {}: {} bytes, too short for the 8-byte header length", kReadOp, source, file.size());
  const uint64_t n = load_le64(file.data());
  if (n > kSafetensorsMaxHeader)
    fail(Errc::limit, "[{}] {}: header length {} exceeds the limit of {} bytes", kReadOp, source, n,
         kSafetensorsMaxHeader);
  if (n > file.size() - 8)
    fail(Errc::truncated, "[{}] {}: header length {} runs past the end of the file ({} bytes)", kReadOp, source, n,
         file.size());
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), n);
  if (text.empty() || text.front() != '{')
    fail(Errc::format, "[{}] {}: the header does not start with '{{'", kReadOp, source);
  const json root = parse_json(text, kReadOp, source, kHeaderMaxDepth);
  if (!root.is_object()) fail(Errc::format, "[{}] {}: the header is not a JSON object", kReadOp, source);

  SafetensorsHeader header;
  header.data_start = 8 + n;
  const size_t count = root.size() - (root.contains("__metadata__") ? 1 : 0);
  if (count > kSafetensorsMaxTensors)
    fail(Errc::limit, "[{}] {}: {} tensors, more than the {} allowed", kReadOp, source, count,
         kSafetensorsMaxTensors);
  header.entries.reserve(count);
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__")
      header.metadata = parse_metadata(value, source);
    else
      header.entries.push_back(parse_entry(key, value, source));
  }
  // Zero-byte tensors share an offset with their neighbour; the name orders them deterministically.
  std::sort(header.entries.begin(), header.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  check_tiling(header.entries, file.size() - header.data_start, source);
  return header;
}

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path);
  f.header_ = parse_safetensors_header(f.file_.bytes(), path.string());
  for (size_t i = 0; i < f.header_.entries.size(); ++i) f.index_.emplace(f.header_.entries[i].name, i);
  return f;
}

bool SafetensorsFile::contains(std::string_view name) const { return index_.find(name) != index_.end(); }

TensorView SafetensorsFile::tensor(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    fail(Errc::format, "[{}] {}: no tensor {}", kReadOp, file_.path().string(), quote(name));
  const SafetensorsEntry& e = header_.entries[it->second];
  return {e.dtype, e.shape, file_.bytes().subspan(header_.data_start + e.begin, e.end - e.begin)};
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;
}

namespace {

bool exists_no_follow(const fs::path& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

// A shard named by an index must be a plain file name in the index's directory.
void check_shard_name(const std::string& shard, const fs::path& index) {
  if (shard.empty() || shard.find('/') != std::string::npos || shard.find('\\') != std::string::npos ||
      shard.find("..") != std::string::npos || shard == "." || shard.find('\0') != std::string::npos)
    fail(Errc::unsafe_path, "[{}] {}: weight_map: shard name {} is not a plain file name", kCheckpointOp,
         index.string(), quote(shard));
}

// weight_map: tensor name -> shard file name, grouped by shard (sorted, so shards open in a fixed order).
std::map<std::string, std::vector<std::string>> read_weight_map(const fs::path& index) {
  const json root = read_json_file(index, kCheckpointOp, kIndexMaxBytes);
  if (!root.is_object()) fail(Errc::format, "[{}] {}: expected a JSON object, got {}", kCheckpointOp, index.string(),
                              json_kind(root));
  if (root.contains("metadata") && !root["metadata"].is_object())
    fail(Errc::format, "[{}] {}: metadata: expected an object, got {}", kCheckpointOp, index.string(),
         json_kind(root["metadata"]));
  if (!root.contains("weight_map"))
    fail(Errc::format, "[{}] {}: missing field \"weight_map\"", kCheckpointOp, index.string());
  const json& map = root["weight_map"];
  if (!map.is_object())
    fail(Errc::format, "[{}] {}: weight_map: expected an object, got {}", kCheckpointOp, index.string(),
         json_kind(map));
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, shard] : map.items()) {
    if (!shard.is_string())
      fail(Errc::format, "[{}] {}: weight_map[{}]: expected a shard file name, got {}", kCheckpointOp,
           index.string(), quote(tensor), json_kind(shard));
    const auto& name = shard.get_ref<const std::string&>();
    check_shard_name(name, index);
    by_shard[name].push_back(tensor);
  }
  if (by_shard.size() > kMaxShards)
    fail(Errc::limit, "[{}] {}: {} shards, more than the {} allowed", kCheckpointOp, index.string(), by_shard.size(),
         kMaxShards);
  return by_shard;
}

}  // namespace

namespace {

// The file a checkpoint path names: itself, or the index (else the single file) inside a directory; the
// directory itself when it holds only "model*.safetensors" shards, which mlx-lm loads without an index.
fs::path checkpoint_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  if (exists_no_follow(path / kIndexName)) return path / kIndexName;
  if (exists_no_follow(path / kSingleName)) return path / kSingleName;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("model") && name.ends_with(".safetensors")) return path;
  }
  fail(Errc::missing_file, "[{}] {}: holds neither {} nor {} nor model*.safetensors shards", kCheckpointOp,
       path.string(), kIndexName, kSingleName);
}

// The "model*.safetensors" shards of a directory, in name order.
std::vector<fs::path> unindexed_shards(const fs::path& dir) {
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("model") && name.ends_with(".safetensors")) shards.push_back(e.path());
  }
  if (shards.size() > kMaxShards)
    fail(Errc::limit, "[{}] {}: {} shards, more than the {} allowed", kCheckpointOp, dir.string(), shards.size(),
         kMaxShards);
  std::sort(shards.begin(), shards.end());
  return shards;
}

// The weight map (tensor -> shard) must say exactly where each tensor is held, no more and no less.
void check_weight_map_matches(const std::map<std::string, size_t, std::less<>>& mapped,
                              const std::map<std::string, size_t, std::less<>>& held,
                              const std::vector<std::unique_ptr<SafetensorsFile>>& shards, const fs::path& index) {
  const auto shard_name = [&](size_t s) { return shards[s]->file().path().filename().string(); };
  for (const auto& [tensor, s] : mapped) {
    const auto it = held.find(tensor);
    if (it == held.end() || it->second != s)
      fail(Errc::format, "[{}] {}: weight_map puts tensor {} in {}, which does not hold it", kCheckpointOp,
           index.string(), quote(tensor), shard_name(s));
  }
  for (const auto& [tensor, s] : held)
    if (!mapped.contains(tensor))
      fail(Errc::format, "[{}] {}: tensor {} of {} is missing from weight_map", kCheckpointOp, index.string(),
           quote(tensor), shard_name(s));
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const fs::path& given) {
  const fs::path path = checkpoint_file(given);
  SafetensorsCheckpoint ck;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const fs::path& shard : unindexed_shards(path)) {
      const size_t s = ck.shards_.size();
      ck.shards_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(shard)));
      for (const auto& e : ck.shards_.back()->header().entries)
        if (!ck.shard_of_.emplace(e.name, s).second)
          fail(Errc::duplicate, "[{}] {}: tensor {} is in two shards", kCheckpointOp, shard.string(), quote(e.name));
    }
    return ck;
  }
  if (path.extension() != ".json") {
    ck.shards_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
    for (const auto& e : ck.shards_[0]->header().entries) ck.shard_of_.emplace(e.name, 0);
    return ck;
  }

  // Every tensor a shard holds must be mapped to that shard, and every mapped tensor must be in its shard.
  std::map<std::string, size_t, std::less<>> held_by;
  for (const auto& [shard, tensors] : read_weight_map(path)) {
    const size_t s = ck.shards_.size();
    for (const auto& t : tensors) ck.shard_of_.emplace(t, s);
    ck.shards_.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path.parent_path() / shard)));
    for (const auto& e : ck.shards_.back()->header().entries) {
      const auto [it, fresh] = held_by.emplace(e.name, s);
      if (!fresh)
        fail(Errc::duplicate, "[{}] {}: tensor {} is in both {} and {}", kCheckpointOp, path.string(),
             quote(e.name), ck.shards_[it->second]->file().path().filename().string(), shard);
    }
  }
  check_weight_map_matches(ck.shard_of_, held_by, ck.shards_, path);
  return ck;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const { return shard_of_.find(name) != shard_of_.end(); }

TensorView SafetensorsCheckpoint::tensor(std::string_view name) const {
  const auto it = shard_of_.find(name);
  if (it == shard_of_.end()) fail(Errc::format, "[{}] no tensor {} in the checkpoint", kCheckpointOp, quote(name));
  return shards_[it->second]->tensor(name);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(shard_of_.size());
  for (const auto& [name, _] : shard_of_) out.push_back(name);
  return out;
}

std::vector<const MappedFile*> SafetensorsCheckpoint::files() const {
  std::vector<const MappedFile*> out;
  for (const auto& shard : shards_) out.push_back(&shard->file());
  return out;
}

}  // namespace lowbit::io
