// The MSE-versus-bits table of docs/CODECS.md: trellis k = 2, 3, 4 against affine 2, 3, 4 bits, on Gaussian
// matrices and on the stories260K weights (llama2.c checkpoint in ../shared/models). Prints a markdown table:
// bits per weight (all metadata included) and the relative MSE sum (w - w_hat)^2 / sum w^2, plus the wall time
// of each configuration's encodes on all threads of the default pool.
//
// usage: bench_trellis_mse [path/to/stories260K.bin | ""] [gaussian_rows]   (defaults: ../shared path, 64)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/thread_pool.h"

namespace {

using lowbit::Shape;
using lowbit::codec::Params;

struct Matrix {
  Shape shape;
  std::vector<float> values;
};

struct Dataset {
  std::string name;
  std::vector<Matrix> matrices;
};

Dataset gaussian(int64_t rows, int64_t cols) {
  Matrix m{{rows, cols}, std::vector<float>(static_cast<size_t>(rows * cols))};
  std::mt19937 rng(42);
  std::normal_distribution<float> g;
  for (float& v : m.values) v = g(rng);
  return {"gaussian " + std::to_string(rows) + "x" + std::to_string(cols), {std::move(m)}};
}

// llama2.c "version 0" checkpoint: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len), then fp32 tensors; the 2-D weights are the embedding and, per layer, wq wk wv wo w1 w2 w3.
Dataset stories(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  int32_t h[7];
  f.read(reinterpret_cast<char*>(h), sizeof h);
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4], vocab = std::abs(h[5]);
  const int64_t kv_dim = dim * kv_heads / heads;
  Dataset d{"stories260K", {}};
  const auto read = [&](int64_t count, Shape shape, bool keep) {
    for (int64_t i = 0; i < count; ++i) {
      Matrix m{shape, std::vector<float>(static_cast<size_t>(shape[0] * shape[1]))};
      f.read(reinterpret_cast<char*>(m.values.data()), static_cast<std::streamsize>(m.values.size() * 4));
      if (keep) d.matrices.push_back(std::move(m));
    }
  };
  read(1, {vocab, dim}, true);
  read(layers, {1, dim}, false);  // attention norms
  read(layers, {dim, dim}, true);
  read(layers, {kv_dim, dim}, true);
  read(layers, {kv_dim, dim}, true);
  read(layers, {dim, dim}, true);
  read(layers, {1, dim}, false);  // ffn norms
  read(layers, {hidden, dim}, true);
  read(layers, {dim, hidden}, true);
  read(layers, {hidden, dim}, true);
  if (!f) return {};
  return d;
}

struct Result {
  double bpw = 0, rel_mse = 0, seconds = 0;
};

Result measure(const lowbit::codec::Codec& codec, const Params& params, const Dataset& data) {
  double bits = 0, n = 0, err = 0, energy = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Matrix& m : data.matrices) {
    lowbit::codec::EncodeOptions options;
    options.seed = 1;
    const lowbit::codec::EncodedTensor e = codec.encode(params, m.shape, m.values.data(), options);
    const std::vector<float> w = lowbit::codec::decode_all({&codec, e.params, m.shape, e.views()});
    for (size_t i = 0; i < w.size(); ++i) {
      err += (double{w[i]} - m.values[i]) * (double{w[i]} - m.values[i]);
      energy += double{m.values[i]} * m.values[i];
    }
    const double count = static_cast<double>(m.values.size());
    bits += lowbit::codec::bits_per_weight(codec, e.params, m.shape) * count;
    n += count;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {bits / n, err / energy, seconds};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string source = __FILE__;  // <repo>/bench/bench_trellis_mse.cpp; the data sit in <repo>/../shared
  const std::string repo = source.substr(0, source.rfind("/bench/"));
  const std::string path =
      argc > 1 && argv[1][0] != '\0' ? argv[1] : repo + "/../shared/models/stories260K/stories260K.bin";
  const int64_t gaussian_rows = argc > 2 ? std::stoll(argv[2]) : 64;
  std::vector<Dataset> datasets{gaussian(gaussian_rows, 1024)};
  Dataset s = stories(path);
  if (s.matrices.empty()) std::fprintf(stderr, "bench_trellis_mse: %s not readable, stories260K skipped\n", path.c_str());
  else datasets.push_back(std::move(s));

  struct Config {
    std::string label, codec;
    Params params;
  };
  std::vector<Config> configs;
  for (int k : {2, 3, 4})
    configs.push_back({"trellis k=" + std::to_string(k) + " L=16 1mad", "trellis",
                       {{"L", 16}, {"k", k}, {"code", "1mad"}, {"rotate", "input"}}});
  configs.push_back({"trellis k=2 L=16 3inst", "trellis", {{"L", 16}, {"k", 2}, {"code", "3inst"}, {"rotate", "input"}}});
  configs.push_back({"trellis k=2 L=12 1mad", "trellis", {{"L", 12}, {"k", 2}, {"code", "1mad"}, {"rotate", "input"}}});
  for (int bits : {2, 3, 4})
    for (int group : {32, 64})
      configs.push_back({"affine " + std::to_string(bits) + "-bit g" + std::to_string(group), "affine",
                         {{"bits", bits}, {"group_size", group}, {"scale_dtype", "f16"}}});

  std::printf("threads: %zu\n\n| codec |", lowbit::default_pool().size());
  for (const Dataset& d : datasets) std::printf(" %s bpw | %s rel. MSE | %s encode s |", d.name.c_str(), d.name.c_str(), d.name.c_str());
  std::printf("\n| --- |");
  for (size_t i = 0; i < datasets.size(); ++i) std::printf(" ---: | ---: | ---: |");
  std::printf("\n");
  for (const Config& c : configs) {
    const lowbit::codec::Codec* codec = lowbit::codec::find_codec(c.codec);
    if (!codec) {
      std::fprintf(stderr, "bench_trellis_mse: codec '%s' not registered, skipped\n", c.codec.c_str());
      continue;
    }
    std::printf("| %s |", c.label.c_str());
    for (const Dataset& d : datasets) {
      const Result r = measure(*codec, c.params, d);
      std::printf(" %.3f | %.4f | %.1f |", r.bpw, r.rel_mse, r.seconds);
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  return 0;
}
