// The rows and --json document of `lowbit inspect` (include/lowbit/artifact/inspect.h).
#include "lowbit/artifact/inspect.h"

#include "lowbit/core/checked.h"
#include "lowbit/core/tensor.h"

namespace lowbit::artifact {

using nlohmann::json;

TensorSummary summarize_tensor(const std::string& name, const codec::TensorRef& ref) {
  TensorSummary r{name, shape_str(ref.shape), std::string(ref.codec->id), ref.params.dump()};
  r.weights = checked_numel(ref.shape, name);
  for (const auto& [role, view] : ref.arrays.items) r.stored_bytes += view.bytes.size();
  r.bits_per_weight = codec::bits_per_weight(*ref.codec, ref.params, ref.shape);
  return r;
}

std::vector<TensorSummary> summarize_tensors(const Artifact& a) {
  std::vector<TensorSummary> rows;
  for (const auto& t : a.manifest().tensors) rows.push_back(summarize_tensor(t.name, a.tensor(t.name)));
  return rows;
}

std::vector<TensorSummary> summarize_tensors(const ForeignModel& model) {
  std::vector<TensorSummary> rows;
  for (const auto& [name, ref] : model.tensors) rows.push_back(summarize_tensor(name, ref));
  return rows;
}

double average_bits(uint64_t stored_bytes, uint64_t weights) {
  return weights == 0 ? 0.0 : 8.0 * static_cast<double>(stored_bytes) / static_cast<double>(weights);
}

namespace {

json tensor_json(const TensorSummary& row, const Shape& shape, const json& params) {
  return {{"name", row.name},     {"shape", shape}, {"codec", row.codec}, {"params", params},
          {"bits_per_weight", row.bits_per_weight}, {"stored_bytes", row.stored_bytes}};
}

}  // namespace

json inspect_json(const Artifact& a, const std::vector<TensorSummary>& rows) {
  const auto& m = a.manifest();
  json tensors = json::array();
  uint64_t weights = 0, stored = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    tensors.push_back(tensor_json(rows[i], m.tensors[i].shape, m.tensors[i].params));
    weights += rows[i].weights;
    stored += rows[i].stored_bytes;
  }
  const json doc = m.to_json();
  json out = {{"format", doc["format"]},
          {"version", m.version},
          {"tensors", std::move(tensors)},
          {"files", doc["files"]},
          {"totals",
           {{"tensors", rows.size()},
            {"weights", weights},
            {"stored_bytes", stored},
            {"bits_per_weight", average_bits(stored, weights)},
            {"artifact_bytes", a.total_bytes()}}},
          {"config", m.config},
          {"provenance", doc["provenance"]},
          {"quality", a.quality()},
          {"recipe", a.recipe()}};
  if (!m.unverified.empty()) out["unverified"] = m.unverified;
  return out;
}

json inspect_json(const ForeignModel& model, const std::vector<TensorSummary>& rows) {
  json tensors = json::array();
  for (size_t i = 0; i < rows.size(); ++i)
    tensors.push_back(tensor_json(rows[i], model.tensors[i].second.shape, model.tensors[i].second.params));
  return {{"format", model.format},
          {"tensors", std::move(tensors)},
          {"aliases", model.aliases},
          {"unsupported", model.unsupported},
          {"config", model.config},
          {"provenance", model.recipe}};
}

json inspect_json(const std::filesystem::path& path, bool verify_hash) {
  if (const auto* foreign = find_foreign_format(path)) {
    const ForeignModel model = foreign->open(path, {.verify_hash = verify_hash});
    return inspect_json(model, summarize_tensors(model));
  }
  const Artifact a = Artifact::open(path, {.verify_hash = verify_hash});
  return inspect_json(a, summarize_tensors(a));
}

}  // namespace lowbit::artifact
