#include "lowbit/quant/reuse.h"

#include <algorithm>

#include "lowbit/core/error.h"
#include "lowbit/core/sha256.h"

namespace lowbit::quant {

namespace fs = std::filesystem;

namespace {

// The checkpoint's own files: everything but the entries that record reused artifacts.
std::vector<artifact::SourceFile> checkpoint_files(const artifact::Provenance& p) {
  std::vector<artifact::SourceFile> out;
  for (const auto& s : p.sources)
    if (s.name.find('/') == std::string::npos) out.push_back(s);
  return out;
}

bool same_files(const std::vector<artifact::SourceFile>& a, const std::vector<artifact::SourceFile>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.name == y.name && x.size == y.size && x.sha256 == y.sha256;
  });
}

// Every key of `wanted` at the same value in `stored`.
bool params_hold(const codec::Params& stored, const codec::Params& wanted) {
  if (!wanted.is_object()) return wanted.is_null() || stored == wanted;
  if (!stored.is_object()) return false;
  for (const auto& [key, value] : wanted.items())
    if (!stored.contains(key) || stored.at(key) != value) return false;
  return true;
}

}  // namespace

std::string reuse_source_name(const fs::path& dir) {
  const fs::path clean = dir.lexically_normal();
  const std::string name = (clean.has_filename() ? clean : clean.parent_path()).filename().string();
  return "reuse/" + name + "/" + std::string(artifact::kManifestName);
}

ReuseBank::ReuseBank(const std::vector<fs::path>& artifacts, const artifact::Provenance& expected) {
  for (const fs::path& dir : artifacts) {
    artifact::Artifact a = artifact::Artifact::open(dir);
    const artifact::Provenance& p = a.provenance();
    const char* differs = nullptr;
    if (!same_files(checkpoint_files(p), checkpoint_files(expected)))
      differs = "sources";
    else if (p.seeds != expected.seeds)
      differs = "seeds";
    else if (p.calibration_sha256 != expected.calibration_sha256)
      differs = "calibration_sha256";
    if (differs)
      fail(Errc::unsupported,
           "[quantize] --reuse {}: manifest.json provenance.{} differs from this quantize's; its "
           "tensors were made from other inputs",
           dir.string(), differs);
    artifacts_.push_back(std::move(a));
  }
  used_.assign(artifacts_.size(), false);
}

std::optional<codec::EncodedTensor> ReuseBank::take(std::string_view name, const Shape& shape,
                                                    const CodecChoice& choice) {
  for (size_t i = 0; i < artifacts_.size(); ++i) {
    const artifact::Artifact& a = artifacts_[i];
    if (!a.contains(name)) continue;
    const codec::TensorRef& t = a.tensor(name);
    if (t.codec->id != choice.codec || t.shape != shape || !params_hold(t.params, choice.params)) continue;
    codec::EncodedTensor out;
    out.params = t.params;
    for (const auto& [role, view] : t.arrays.items) {
      TensorBuffer b = make_buffer(view.dtype, view.shape);
      std::copy(view.bytes.begin(), view.bytes.end(), b.bytes.begin());
      out.arrays.emplace_back(role, std::move(b));
    }
    a.release_pages(name);
    used_[i] = true;
    ++taken_;
    return out;
  }
  return std::nullopt;
}

std::vector<artifact::SourceFile> ReuseBank::used_sources() const {
  std::vector<artifact::SourceFile> out;
  for (size_t i = 0; i < artifacts_.size(); ++i) {
    if (!used_[i]) continue;
    const fs::path manifest = artifacts_[i].dir() / artifact::kManifestName;
    out.push_back({reuse_source_name(artifacts_[i].dir()), static_cast<uint64_t>(fs::file_size(manifest)),
                   sha256_file(manifest)});
  }
  return out;
}

}  // namespace lowbit::quant
