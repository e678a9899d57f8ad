// lowbit inspect ART [--json]: the tensors of a verified artifact (name, shape, codec, params, bits per weight),
// totals, the files, summaries of the config and provenance, and the checked quality and recipe records. A version 1
// artifact's free-form recipe and quality, which nothing checked, are shown only under "unverified".
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "command.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/core/checked.h"
#include "lowbit/core/progress.h"

namespace {

using lowbit::artifact::Artifact;
using nlohmann::json;

struct Options {
  std::string artifact;
  bool json = false;
  bool no_verify_hash = false;
};

struct TensorRow {
  std::string name, shape, codec, params;
  uint64_t weights = 0, stored_bytes = 0;
  double bits_per_weight = 0;
};

TensorRow tensor_row(const std::string& name, const lowbit::codec::TensorRef& ref) {
  TensorRow r{name, lowbit::shape_str(ref.shape), std::string(ref.codec->id), ref.params.dump()};
  r.weights = lowbit::checked_numel(ref.shape, name);
  for (const auto& [role, view] : ref.arrays.items) r.stored_bytes += view.bytes.size();
  r.bits_per_weight = lowbit::codec::bits_per_weight(*ref.codec, ref.params, ref.shape);
  return r;
}

std::vector<TensorRow> tensor_rows(const Artifact& a) {
  std::vector<TensorRow> rows;
  for (const auto& t : a.manifest().tensors) rows.push_back(tensor_row(t.name, a.tensor(t.name)));
  return rows;
}

double average_bits(uint64_t bytes, uint64_t weights) {
  return weights == 0 ? 0.0 : 8.0 * static_cast<double>(bytes) / static_cast<double>(weights);
}

json as_json(const Artifact& a, const std::vector<TensorRow>& rows) {
  const auto& m = a.manifest();
  json tensors = json::array();
  uint64_t weights = 0, stored = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    tensors.push_back({{"name", rows[i].name}, {"shape", m.tensors[i].shape}, {"codec", rows[i].codec},
                       {"params", m.tensors[i].params}, {"bits_per_weight", rows[i].bits_per_weight},
                       {"stored_bytes", rows[i].stored_bytes}});
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

// "key=value" for the config's scalar entries, at most `limit` of them.
std::string config_summary(const json& config, size_t limit) {
  std::string out;
  size_t shown = 0;
  for (const auto& [key, value] : config.items()) {
    if (value.is_structured() || shown == limit) continue;
    out += fmt::format("{}{}={}", shown++ ? ", " : "", key, value.dump());
  }
  if (config.size() > shown) out += fmt::format("{}(+{} more)", shown ? ", " : "", config.size() - shown);
  return out.empty() ? "(empty)" : out;
}

// The tensor table; returns the total stored bytes.
uint64_t print_rows(const std::vector<TensorRow>& rows) {
  size_t name_width = 4, shape_width = 5, codec_width = 5;
  for (const TensorRow& r : rows) {
    name_width = std::max(name_width, r.name.size());
    shape_width = std::max(shape_width, r.shape.size());
    codec_width = std::max(codec_width, r.codec.size());
  }
  fmt::print("{:<{}}  {:<{}}  {:<{}}  {:>7}  {}\n", "name", name_width, "shape", shape_width, "codec", codec_width,
             "bits/w", "params");
  uint64_t weights = 0, stored = 0;
  for (const TensorRow& r : rows) {
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:>7.3f}  {}\n", r.name, name_width, r.shape, shape_width, r.codec,
               codec_width, r.bits_per_weight, r.params);
    weights += r.weights;
    stored += r.stored_bytes;
  }
  fmt::print("\ntotal: {} tensors, {} weights, {} stored ({:.3f} bits/weight)", rows.size(), weights,
             lowbit::human_bytes(stored), average_bits(stored, weights));
  return stored;
}

void print_table(const Artifact& a, const std::vector<TensorRow>& rows) {
  print_rows(rows);
  const auto& m = a.manifest();
  fmt::print(", artifact {} in {} files\n", lowbit::human_bytes(a.total_bytes()), m.files.size() + 1);
  fmt::print("config: {}\n", config_summary(m.config, 8));
  fmt::print("provenance: {}, {} source files, calibration {}, seeds {}\n", m.provenance.tool,
             m.provenance.sources.size(), m.provenance.calibration_sha256.value_or("none"),
             json(m.provenance.seeds).dump());
  // Scalars only (bits per weight, time, RSS); the per-tensor records are in --json.
  if (a.quality().is_object())
    for (const auto& [key, value] : a.quality().items())
      fmt::print("quality.{} (quality.json, checked): {}\n", key, config_summary(value, 12));
  if (a.recipe().is_object())
    for (const auto& [key, value] : a.recipe().items())
      fmt::print("recipe.{} (recipe.json, checked): {}\n", key, config_summary(value, 12));
  for (const auto& [key, value] : m.unverified.items())
    fmt::print("unverified {} (format version {}, not checked): {}\n", key, m.version,
               value.is_object() ? config_summary(value, 12) : value.dump());
}

// A foreign format (audio8 bundle, Phonon directory), opened with every check of its own loader.
void inspect_foreign(const lowbit::artifact::ForeignFormat& format, const Options& o) {
  const auto model = format.open(o.artifact, {.verify_hash = !o.no_verify_hash});
  std::vector<TensorRow> rows;
  for (const auto& [name, ref] : model.tensors) rows.push_back(tensor_row(name, ref));
  if (o.json) {
    json tensors = json::array();
    for (size_t i = 0; i < rows.size(); ++i)
      tensors.push_back({{"name", rows[i].name}, {"shape", model.tensors[i].second.shape}, {"codec", rows[i].codec},
                         {"params", model.tensors[i].second.params}, {"bits_per_weight", rows[i].bits_per_weight},
                         {"stored_bytes", rows[i].stored_bytes}});
    fmt::print("{}\n", json{{"format", model.format},
                            {"tensors", std::move(tensors)},
                            {"aliases", model.aliases},
                            {"unsupported", model.unsupported},
                            {"config", model.config},
                            {"provenance", model.recipe}}
                           .dump(2));
    return;
  }
  print_rows(rows);
  fmt::print("\nformat: {}\n", model.format);
  for (const auto& [alias, target] : model.aliases) fmt::print("alias: {} -> {}\n", alias, target);
  if (!model.unsupported.empty()) fmt::print("not run by lowbit: {}\n", fmt::join(model.unsupported, ", "));
  fmt::print("config: {}\n", model.config.is_object() ? config_summary(model.config, 8) : "(none)");
}

void run(const Options& o) {
  if (const auto* foreign = lowbit::artifact::find_foreign_format(o.artifact)) return inspect_foreign(*foreign, o);
  lowbit::artifact::ReadOptions options;
  options.verify_hash = !o.no_verify_hash;
  const Artifact a = Artifact::open(o.artifact, options);
  const auto rows = tensor_rows(a);
  if (o.json)
    fmt::print("{}\n", as_json(a, rows).dump(2));
  else
    print_table(a, rows);
}

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("inspect", "Verify an artifact and list its tensors, codecs, bits per weight and config");
  cmd->add_option("artifact", o.artifact, "Artifact directory")->required();
  cmd->add_flag("--json", o.json, "Print one JSON object instead of a table");
  cmd->add_flag("--no-verify-hash", o.no_verify_hash, "Skip the SHA-256 checks (trusted local files only)");
  cmd->callback([] { run(o); });
}

}  // namespace

LOWBIT_COMMAND(inspect, setup);
