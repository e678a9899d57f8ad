#include "lowbit/quant/calibration_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "lowbit/core/error.h"
#include "lowbit/core/mapped_file.h"
#include "lowbit/core/sha256.h"
#include "lowbit/io/json.h"

namespace lowbit::quant {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "the cache stores f64 little-endian as in memory");

constexpr char kMagic[8] = {'L', 'B', 'C', 'A', 'L', 'I', 'B', '1'};
constexpr int kFormat = 1;
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
constexpr std::array<Hessian LayerHessians::*, 4> kInputs{&LayerHessians::attn_in, &LayerHessians::attn_out,
                                                          &LayerHessians::ffn_in, &LayerHessians::ffn_mid};
constexpr std::array<std::string_view, 4> kInputNames{"attn_in", "attn_out", "ffn_in", "ffn_mid"};

std::string sha256_of_text(std::string_view text) { return sha256_hex(std::as_bytes(std::span(text))); }

bool symmetric(const Hessian& h) {
  for (int64_t i = 0; i < h.dim; ++i)
    for (int64_t j = i + 1; j < h.dim; ++j)
      if (h.h[i * h.dim + j] != h.h[j * h.dim + i]) return false;
  return true;
}

uint64_t stored_values(int64_t dim, bool upper) {
  const auto n = static_cast<uint64_t>(dim);
  return upper ? n * (n + 1) / 2 : n * n;
}

// Writes `parts` to `path` through a temporary file in the same directory, fsynced, then renamed over it.
void write_atomically(const fs::path& path, std::initializer_list<std::span<const std::byte>> parts) {
  std::random_device rd;
  const fs::path tmp =
      path.parent_path() / fmt::format(".{}.tmp-{}-{:08x}", path.filename().string(), ::getpid(), rd());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("calibration cache", tmp.string());
  bool ok = true;
  for (auto part : parts)
    for (size_t at = 0; ok && at < part.size();) {
      const ssize_t n = ::write(fd, part.data() + at, part.size() - at);
      if (n <= 0)
        ok = false;
      else
        at += static_cast<size_t>(n);
    }
  ok = ok && ::fsync(fd) == 0;
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    fail_errno("calibration cache", path.string());
  }
}

// Strict reading of one header field: present, of the expected kind, else an error naming file and field.
class HeaderReader {
 public:
  explicit HeaderReader(const fs::path& path) : path_(path) {}
  [[noreturn]] void bad(std::string_view field, std::string_view why) const {
    fail(Errc::format, "[calibration cache] {}: field '{}' {}", path_.string(), field, why);
  }
  const json& at(const json& obj, std::string_view field, json::value_t kind) const {
    const auto it = obj.find(field);
    if (it == obj.end()) bad(field, "is missing");
    const bool integer = kind == json::value_t::number_unsigned;
    if (integer ? !it->is_number_unsigned() : it->type() != kind)
      bad(field, integer ? "is not an unsigned integer" : "has the wrong type");
    return *it;
  }
  uint64_t uint(const json& obj, std::string_view field) const {
    return at(obj, field, json::value_t::number_unsigned).get<uint64_t>();
  }
  std::string str(const json& obj, std::string_view field) const {
    return at(obj, field, json::value_t::string).get<std::string>();
  }
  void only(const json& obj, std::initializer_list<std::string_view> keys) const {
    for (const auto& [k, v] : obj.items())
      if (std::find(keys.begin(), keys.end(), k) == keys.end()) bad(k, "is not a known field");
  }

 private:
  const fs::path& path_;
};

}  // namespace

json CalibrationCache::base_key(std::string_view pass, const std::vector<std::string>& source_sha256,
                                const CalibrationText& text, bool rotate, uint64_t rotation_seed) {
  Sha256 tokens;
  for (const auto& w : text.windows) {
    const auto n = static_cast<uint64_t>(w.size());
    tokens.update(&n, sizeof n);
    tokens.update(w.data(), w.size() * sizeof(int32_t));
  }
  return {{"format", kFormat},
          {"lowbit", LOWBIT_VERSION},
          {"pass", pass},
          {"source_sha256", source_sha256},
          {"calibration_sha256", text.sha256},
          {"calibration_tokens", text.tokens()},
          {"windows", text.windows.size()},
          {"token_ids_sha256", tokens.hex()},
          {"rotate", rotate},
          {"rotation_seed", rotate ? json(rotation_seed) : json(nullptr)}};
}

CalibrationCache::CalibrationCache(fs::path dir, const json& base_key)
    : dir_(std::move(dir)), pass_(base_key.at("pass").get<std::string>()), key_(sha256_of_text(base_key.dump())) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_))
    fail(Errc::io, "[calibration cache] {}: not a directory ({})", dir_.string(), ec.message());
  finish_layer(-1);
}

CalibrationCache::~CalibrationCache() = default;
CalibrationCache::CalibrationCache(CalibrationCache&&) noexcept = default;
CalibrationCache& CalibrationCache::operator=(CalibrationCache&&) noexcept = default;

fs::path CalibrationCache::entry_path(int64_t layer) const {
  return dir_ / fmt::format("{}-layer-{:04}-{}.lbcal", pass_, layer, key_);
}

void CalibrationCache::add_stored(std::string_view name, std::string_view codec, const codec::EncodedTensor& t) {
  const auto text = [&](std::string_view s) {
    const auto n = static_cast<uint64_t>(s.size());
    next_->update(&n, sizeof n);
    next_->update(s.data(), s.size());
  };
  text(name);
  text(codec);
  text(t.params.dump());
  for (const auto& [role, buffer] : t.arrays) {
    text(role);
    text(std::string_view(reinterpret_cast<const char*>(buffer.bytes.data()), buffer.bytes.size()));
  }
}

void CalibrationCache::finish_layer(int64_t layer) {
  if (next_) key_ = next_->hex();
  next_ = std::make_unique<Sha256>();
  next_->update(key_.data(), key_.size());
  const int64_t next_layer = layer + 1;
  next_->update(&next_layer, sizeof next_layer);
}

void CalibrationCache::write(int64_t layer, const LayerHessians& hessians, double seconds) const {
  std::vector<std::byte> payload;
  json entries = json::array();
  for (size_t k = 0; k < kInputs.size(); ++k) {
    const Hessian& h = hessians.*kInputs[k];
    const bool upper = symmetric(h);
    entries.push_back(
        {{"input", kInputNames[k]}, {"dim", h.dim}, {"samples", h.samples}, {"layout", upper ? "upper" : "full"}});
    for (int64_t i = 0; i < h.dim; ++i) {
      const double* row = h.h.data() + i * h.dim + (upper ? i : 0);
      const auto bytes = std::as_bytes(std::span(row, static_cast<size_t>(upper ? h.dim - i : h.dim)));
      payload.insert(payload.end(), bytes.begin(), bytes.end());
    }
  }
  const json header{{"format", kFormat},
                    {"key", key_},
                    {"pass", pass_},
                    {"layer", layer},
                    {"hessians", entries},
                    {"payload_bytes", payload.size()},
                    {"payload_sha256", sha256_hex(payload)},
                    {"seconds", seconds}};
  const std::string text = header.dump();
  const uint64_t length = text.size();
  write_atomically(entry_path(layer), {std::as_bytes(std::span(kMagic)), std::as_bytes(std::span(&length, 1)),
                                       std::as_bytes(std::span(text)), std::span<const std::byte>(payload)});
}

std::optional<CachedLayer> CalibrationCache::read(int64_t layer, const LayerInputDims& dims) const {
  const fs::path path = entry_path(layer);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return std::nullopt;
  const MappedFile file = MappedFile::open(path);
  const auto bytes = file.bytes();
  const auto bad = [&](Errc code, std::string_view field, std::string_view why) {
    fail(code, "[calibration cache] {}: {} {}", path.string(), field, why);
  };
  if (bytes.size() < sizeof kMagic + 8 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    bad(Errc::format, "magic", "is not LBCALIB1");
  uint64_t length = 0;
  std::memcpy(&length, bytes.data() + sizeof kMagic, sizeof length);
  const uint64_t body = bytes.size() - sizeof kMagic - 8;
  if (length > kMaxHeaderBytes || length > body)
    bad(Errc::truncated, "header length", fmt::format("{} exceeds the file", length));
  const json j = io::parse_json(std::string_view(reinterpret_cast<const char*>(bytes.data()) + 16, length),
                                "calibration cache", path.string());
  const HeaderReader r(path);
  if (!j.is_object()) r.bad("header", "is not an object");
  r.only(j, {"format", "key", "pass", "layer", "hessians", "payload_bytes", "payload_sha256", "seconds"});
  if (r.uint(j, "format") != kFormat) r.bad("format", "is not 1");
  if (r.str(j, "key") != key_) r.bad("key", "does not match this run's key");
  if (r.str(j, "pass") != pass_) r.bad("pass", fmt::format("is not '{}'", pass_));
  if (layer < 0 || r.uint(j, "layer") != static_cast<uint64_t>(layer)) r.bad("layer", fmt::format("is not {}", layer));
  const auto seconds = j.find("seconds");
  if (seconds == j.end() || !seconds->is_number() || !(seconds->get<double>() >= 0))
    r.bad("seconds", "is not a number >= 0");
  const std::span<const std::byte> payload = bytes.subspan(16 + length);
  if (r.uint(j, "payload_bytes") != payload.size())
    bad(Errc::size_mismatch, "field 'payload_bytes'", "differs from the file");
  if (r.str(j, "payload_sha256") != sha256_hex(payload))
    bad(Errc::hash_mismatch, "field 'payload_sha256'", "differs from the payload");
  const json& list = r.at(j, "hessians", json::value_t::array);
  if (list.size() != kInputs.size()) r.bad("hessians", "does not list the 4 linear inputs");
  CachedLayer out;
  out.seconds = seconds->get<double>();
  uint64_t at = 0;
  for (size_t k = 0; k < kInputs.size(); ++k) {
    const json& e = list[k];
    if (!e.is_object()) r.bad("hessians", "holds a non-object");
    r.only(e, {"input", "dim", "samples", "layout"});
    if (r.str(e, "input") != kInputNames[k])
      r.bad("input", fmt::format("of Hessian {} is not '{}'", k, kInputNames[k]));
    if (r.uint(e, "dim") != static_cast<uint64_t>(dims[k]))
      bad(Errc::shape, "field 'dim'", fmt::format("of {} is not the model's {}", kInputNames[k], dims[k]));
    const std::string layout = r.str(e, "layout");
    if (layout != "upper" && layout != "full") r.bad("layout", "is not 'upper' or 'full'");
    const bool upper = layout == "upper";
    const uint64_t n = stored_values(dims[k], upper);
    if (n > (payload.size() - at) / sizeof(double))
      bad(Errc::truncated, "payload", fmt::format("ends inside {}", kInputNames[k]));
    Hessian& h = out.hessians.*kInputs[k];
    h.dim = dims[k];
    h.samples = r.uint(e, "samples");
    h.h.assign(static_cast<size_t>(dims[k] * dims[k]), 0.0);
    const auto* values = reinterpret_cast<const std::byte*>(payload.data() + at);
    size_t v = 0;
    for (int64_t i = 0; i < h.dim; ++i)
      for (int64_t jj = upper ? i : 0; jj < h.dim; ++jj, ++v) {
        double x;
        std::memcpy(&x, values + v * sizeof x, sizeof x);
        if (!std::isfinite(x))
          bad(Errc::non_finite, "payload", fmt::format("{}[{}, {}] is not finite", kInputNames[k], i, jj));
        h.h[i * h.dim + jj] = x;
        if (upper) h.h[jj * h.dim + i] = x;
      }
    at += n * sizeof(double);
  }
  if (at != payload.size()) bad(Errc::layout, "payload", "has trailing bytes");
  return out;
}

CachedCalibrator::CachedCalibrator(model::Model& model, const CalibrationText& text,
                                   std::optional<CalibrationCache> cache)
    : model_(model), text_(text), cache_(std::move(cache)) {}

LayerHessians CachedCalibrator::hessians(int64_t layer) {
  const auto& w = model_.layers.at(static_cast<size_t>(layer));
  // The cache holds the four shared Hessians only: an MoE layer's per-expert ones are computed every time.
  const bool cacheable = w.experts.empty();
  LayerInputDims dims{};
  for (const model::TensorSpec& t : model_.desc.layers.at(static_cast<size_t>(layer)).tensors)
    if (const auto input = model::linear_input(t.role); input && !is_expert_input(*input))
      dims[static_cast<size_t>(*input)] = w.linear(t.role)->cols();
  if (cache_ && cacheable) {
    try {
      if (auto hit = cache_->read(layer, dims)) {
        ++stats_.reused;
        stats_.seconds_saved += hit->seconds;
        return std::move(hit->hessians);
      }
    } catch (const Error& e) {
      ++stats_.rejected;
      std::fprintf(stderr, "[quantize] warning: %s; ignoring that entry, calibrating again\n", e.what());
    }
  }
  const auto start = std::chrono::steady_clock::now();
  if (!calibrator_) calibrator_.emplace(model_, text_);
  for (; hidden_at_ < layer; ++hidden_at_) calibrator_->advance(hidden_at_);
  LayerHessians h = calibrator_->capture(layer);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++stats_.computed;
  stats_.seconds_spent += seconds;
  if (cache_ && cacheable) {
    try {
      cache_->write(layer, h, seconds);
    } catch (const Error& e) {
      std::fprintf(stderr, "[quantize] warning: %s; continuing without caching layer %lld\n", e.what(),
                   static_cast<long long>(layer));
    }
  }
  return h;
}

void CachedCalibrator::stored(std::string_view name, std::string_view codec, const codec::EncodedTensor& tensor) {
  if (cache_) cache_->add_stored(name, codec, tensor);
}

void CachedCalibrator::finish_layer(int64_t layer) {
  if (cache_) cache_->finish_layer(layer);
}

}  // namespace lowbit::quant
