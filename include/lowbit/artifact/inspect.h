// What `lowbit inspect` reports of an artifact or a foreign format (audio8 bundle, Phonon directory): a row per
// tensor and the --json document, in the library so that the CLI and the Python package give the same answer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "lowbit/artifact/foreign.h"
#include "lowbit/artifact/reader.h"

namespace lowbit::artifact {

struct TensorSummary {
  std::string name, shape, codec, params;  // shape "[576, 1536]", params as compact JSON
  uint64_t weights = 0, stored_bytes = 0;
  double bits_per_weight = 0;
};

TensorSummary summarize_tensor(const std::string& name, const codec::TensorRef& ref);
std::vector<TensorSummary> summarize_tensors(const Artifact& a);
std::vector<TensorSummary> summarize_tensors(const ForeignModel& model);

// 8 * stored bytes / weights (0 for no weights).
double average_bits(uint64_t stored_bytes, uint64_t weights);

// The `lowbit inspect --json` document: tensors, files, totals, config, provenance and quality of an artifact.
nlohmann::json inspect_json(const Artifact& a, const std::vector<TensorSummary>& rows);
// The same for a foreign format: tensors, aliases, the parts lowbit does not run, config, provenance.
nlohmann::json inspect_json(const ForeignModel& model, const std::vector<TensorSummary>& rows);
// The document for the artifact or foreign format at `path`, opened with every check (hashes unless told not to).
nlohmann::json inspect_json(const std::filesystem::path& path, bool verify_hash = true);

}  // namespace lowbit::artifact
