// lowbit demo-artifact OUT: writes an artifact of seeded random tensors (dense and quantized) through the artifact writer. It
// lets `./run demo` show the write -> verify -> inspect path before a real model is involved, and gives the
// crash-consistency test a writer process to kill.
#include <fmt/format.h>

#include <cstdio>
#include <random>
#include <string>

#include "command.h"
#include "lowbit/artifact/writer.h"
#include "lowbit/codec/codec.h"

namespace {

struct Options {
  std::string out;
  size_t tensors = 8;
  uint64_t seed = 1;
  uint64_t shard_bytes = lowbit::artifact::kDefaultShardBytes;
  bool force = false;
};

// What the demo tensors are stored as, in turn: the dense dtypes and two quantized codecs.
struct Storage {
  const char* codec;
  const char* params;
};
constexpr Storage kStorages[] = {{"dense", R"({"dtype": "bf16"})"},       {"offset_scale", R"({"precision": "q4"})"},
                                 {"dense", R"({"dtype": "f16"})"},        {"offset_scale", R"({"precision": "q3"})"},
                                 {"dense", R"({"dtype": "f32"})"}};

// A [rows, cols] tensor of N(0, 0.02) values, encoded with `storage`'s codec.
lowbit::codec::EncodedTensor random_tensor(std::mt19937_64& rng, const Storage& storage, lowbit::Shape& shape) {
  std::uniform_int_distribution<int> log2_rows(4, 7), log2_cols(6, 8);  // whole groups of 64 columns
  std::normal_distribution<float> value(0.0f, 0.02f);
  shape = {int64_t{1} << log2_rows(rng), int64_t{1} << log2_cols(rng)};
  std::vector<float> weights(static_cast<size_t>(shape[0] * shape[1]));
  for (float& w : weights) w = value(rng);
  const auto& codec = lowbit::codec::codec_or_throw(storage.codec, "[demo-artifact]");
  return codec.encode(nlohmann::json::parse(storage.params), shape, weights.data(), {});
}

void run(const Options& o) {
  using namespace lowbit::artifact;
  std::mt19937_64 rng(o.seed);
  ArtifactWriter writer(o.out, {.shard_bytes = o.shard_bytes, .force = o.force});
  for (size_t i = 0; i < o.tensors; ++i) {
    const Storage& storage = kStorages[i % std::size(kStorages)];
    lowbit::Shape shape;
    auto encoded = random_tensor(rng, storage, shape);
    writer.add(fmt::format("layers.{}.weight", i), shape, storage.codec, std::move(encoded));
  }
  const nlohmann::json config = {{"model_type", "lowbit-demo"}, {"num_tensors", o.tensors}};
  writer.add_file_contents("config.json", FileRole::config, config.dump(2) + "\n");
  writer.set_config(config);
  Provenance provenance;
  provenance.seeds = {{"demo", o.seed}};
  writer.set_provenance(std::move(provenance));
  const Manifest& m = writer.commit();
  std::fprintf(stderr, "[demo-artifact] wrote %zu tensors in %zu files to %s\n", m.tensors.size(), m.files.size() + 1,
               o.out.c_str());
}

void setup(CLI::App& root) {
  static Options o;
  auto* cmd = root.add_subcommand("demo-artifact", "Write an artifact of seeded random tensors, dense and quantized (for demos and tests)");
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
