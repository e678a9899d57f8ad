// lowbit demo-artifact OUT: writes an artifact of seeded random dense tensors through the artifact writer. It
// lets `./run demo` show the write -> verify -> inspect path before a real model is involved, and gives the
// crash-consistency test a writer process to kill.
#include <fmt/format.h>

#include <cstdio>
#include <random>
#include <string>

#include "cli/command.h"
#include "lowbit/artifact/writer.h"

namespace {

struct Options {
  std::string out;
  size_t tensors = 8;
  uint64_t seed = 1;
  uint64_t shard_bytes = lowbit::artifact::kDefaultShardBytes;
  bool force = false;
};

// A [rows, cols] tensor of N(0, 0.02) values stored as `dtype`.
lowbit::TensorBuffer random_tensor(std::mt19937_64& rng, lowbit::DType dtype) {
  std::uniform_int_distribution<int> log2_dim(4, 7);
  std::normal_distribution<float> value(0.0f, 0.02f);
  lowbit::TensorBuffer t = lowbit::make_buffer(dtype, {int64_t{1} << log2_dim(rng), int64_t{1} << log2_dim(rng)});
  const size_t n = static_cast<size_t>(t.shape[0] * t.shape[1]);
  for (size_t i = 0; i < n; ++i) lowbit::store_float(dtype, t.bytes.data(), i, value(rng));
  return t;
}

void run(const Options& o) {
  using namespace lowbit::artifact;
  constexpr lowbit::DType kDTypes[] = {lowbit::DType::BF16, lowbit::DType::F16, lowbit::DType::F32};
  std::mt19937_64 rng(o.seed);
  ArtifactWriter writer(o.out, {.shard_bytes = o.shard_bytes, .force = o.force});
  for (size_t i = 0; i < o.tensors; ++i)
    writer.add_dense(fmt::format("layers.{}.weight", i), random_tensor(rng, kDTypes[i % 3]).view());
  const nlohmann::json config = {{"model_type", "lowbit-demo"}, {"num_tensors", o.tensors}};
  writer.add_file_contents("config.json", FileRole::config, config.dump(2) + "\n");
  writer.set_config(config);
  Provenance provenance;
  provenance.recipe = {{"generator", "demo-artifact"}, {"distribution", "normal(0, 0.02)"}};
  provenance.seeds = {{"demo", o.seed}};
  writer.set_provenance(std::move(provenance));
  const Manifest& m = writer.commit();
  std::fprintf(stderr, "[demo-artifact] wrote %zu tensors in %zu files to %s\n", m.tensors.size(), m.files.size() + 1,
               o.out.c_str());
}

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("demo-artifact", "Write an artifact of seeded random tensors (for demos and tests)");
  cmd->add_option("out", o.out, "Destination directory")->required();
  cmd->add_option("--tensors", o.tensors, "Number of tensors")->check(CLI::Range(size_t{0}, size_t{10000}));
  cmd->add_option("--seed", o.seed, "Random seed");
  cmd->add_option("--shard-bytes", o.shard_bytes, "Cut payload shards at this many bytes")
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  cmd->add_flag("--force", o.force, "Replace an existing artifact at OUT");
  cmd->callback([] { run(o); });
}

}  // namespace

LOWBIT_COMMAND(demo_artifact, setup);
