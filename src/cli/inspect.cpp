// lowbit inspect ART [--json]: the tensors of a verified artifact (name, shape, codec, params, bits per weight),
// totals, the files, and summaries of the config and provenance.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "cli/command.h"
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

std::vector<TensorRow> tensor_rows(const Artifact& a) {
  std::vector<TensorRow> rows;
  for (const auto& t : a.manifest().tensors) {
    const auto& ref = a.tensor(t.name);
    TensorRow r{t.name, lowbit::shape_str(t.shape), t.codec, t.params.dump()};
    r.weights = lowbit::checked_numel(t.shape, t.name);
    for (const auto& [role, view] : ref.arrays.items) r.stored_bytes += view.bytes.size();
    r.bits_per_weight = lowbit::codec::bits_per_weight(*ref.codec, t.params, t.shape);
    rows.push_back(std::move(r));
  }
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
  return {{"format", doc["format"]},
          {"version", doc["version"]},
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
          {"quality", m.quality}};
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

void print_table(const Artifact& a, const std::vector<TensorRow>& rows) {
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
  const auto& m = a.manifest();
  fmt::print("\ntotal: {} tensors, {} weights, {} stored ({:.3f} bits/weight), artifact {} in {} files\n",
             rows.size(), weights, lowbit::human_bytes(stored), average_bits(stored, weights),
             lowbit::human_bytes(a.total_bytes()), m.files.size() + 1);
  fmt::print("config: {}\n", config_summary(m.config, 8));
  fmt::print("provenance: {}, {} source files, calibration {}, seeds {}\n", m.provenance.tool,
             m.provenance.sources.size(), m.provenance.calibration_sha256.value_or("none"),
             json(m.provenance.seeds).dump());
  if (!m.quality.empty()) fmt::print("quality: {}\n", m.quality.dump());
}

void run(const Options& o) {
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
