// lowbit inspect ART [--json]: the tensors of a verified artifact (name, shape, codec, params, bits per weight),
// totals, the files, summaries of the config and provenance, and the checked quality and recipe records. A version 1
// artifact's free-form recipe and quality, which nothing checked, are shown only under "unverified".
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "command.h"
#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/inspect.h"
#include "lowbit/artifact/reader.h"
#include "lowbit/core/progress.h"

namespace {

using lowbit::artifact::Artifact;
using lowbit::artifact::TensorSummary;
using nlohmann::json;

struct Options {
  std::string artifact;
  bool json = false;
  bool no_verify_hash = false;
};

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
uint64_t print_rows(const std::vector<TensorSummary>& rows) {
  size_t name_width = 4, shape_width = 5, codec_width = 5;
  for (const TensorSummary& r : rows) {
    name_width = std::max(name_width, r.name.size());
    shape_width = std::max(shape_width, r.shape.size());
    codec_width = std::max(codec_width, r.codec.size());
  }
  fmt::print("{:<{}}  {:<{}}  {:<{}}  {:>7}  {}\n", "name", name_width, "shape", shape_width, "codec", codec_width,
             "bits/w", "params");
  uint64_t weights = 0, stored = 0;
  for (const TensorSummary& r : rows) {
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:>7.3f}  {}\n", r.name, name_width, r.shape, shape_width, r.codec,
               codec_width, r.bits_per_weight, r.params);
    weights += r.weights;
    stored += r.stored_bytes;
  }
  fmt::print("\ntotal: {} tensors, {} weights, {} stored ({:.3f} bits/weight)", rows.size(), weights,
             lowbit::human_bytes(stored), lowbit::artifact::average_bits(stored, weights));
  return stored;
}

void print_table(const Artifact& a, const std::vector<TensorSummary>& rows) {
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
  const auto rows = lowbit::artifact::summarize_tensors(model);
  if (o.json) {
    fmt::print("{}\n", lowbit::artifact::inspect_json(model, rows).dump(2));
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
  const auto rows = lowbit::artifact::summarize_tensors(a);
  if (o.json)
    fmt::print("{}\n", lowbit::artifact::inspect_json(a, rows).dump(2));
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
