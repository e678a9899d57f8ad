// Batch-1 matvec per codec and width at [4096 x 4096], [14336 x 4096] and [4096 x 14336] ([rows, cols] =
// [out, in]) on all cores, reporting the effective GB/s of weight bytes read next to the machine's read
// bandwidth, measured first by the same binary (a multi-threaded sum over a buffer larger than the LLC).
// Each case cycles through enough copies of its weight to exceed twice the LLC, so figures are from DRAM,
// as in a real model whose layers do not fit in cache. matvec_hot_1thread/* gives each kernel's compute
// ceiling per core (one thread, weight in cache, CPU time).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "block_kernels.h"
#include "simd.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cpu.h"

namespace {

using lowbit::codec::Params;

// Codecs and the widths/variants benchmarked for each; a codec without a row is skipped (and named on stderr).
const std::map<std::string, std::vector<Params>>& bench_params() {
  static const std::map<std::string, std::vector<Params>> table = [] {
    std::map<std::string, std::vector<Params>> t;
    t["dense"] = {{{"dtype", "bf16"}}, {{"dtype", "f16"}}, {{"dtype", "f32"}}};
    for (int bits : {2, 3, 4, 5, 6, 8})
      t["affine"].push_back({{"bits", bits}, {"group_size", 64}, {"scale_dtype", "bf16"}});
    // GGUF Q4_1 and Q8_0 as they load (group 32, f16 metadata).
    for (int bits : {4, 8}) t["affine"].push_back({{"bits", bits}, {"group_size", 32}, {"scale_dtype", "f16"}});
    for (const char* precision : {"q3", "q3_full8", "q4"}) t["offset_scale"].push_back({{"precision", precision}});
    t["two_plane"] = {{{"storage", "planes"}, {"metadata", "full"}},
                      {{"storage", "quint5"}, {"metadata", "slim"}},
                      {{"storage", "trit3"}, {"metadata", "full"}}};
    // L = 12 keeps the Viterbi encode of these shapes to minutes; bench_trellis_matvec covers L = 16.
    t["trellis"] = {{{"L", 12}, {"k", 2}, {"code", "1mad"}}, {{"L", 12}, {"k", 4}, {"code", "1mad"}}};
    return t;
  }();
  return table;
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{4096, 4096}, {14336, 4096}, {4096, 14336}};

size_t llc_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<size_t>(l3) : size_t{64} << 20;
}

// Bytes each benchmark streams through: twice the LLC, at least 512 MiB.
size_t working_set_bytes() { return std::max(2 * llc_bytes(), size_t{512} << 20); }

double g_read_gbps = 0.0;

// The dispatched Highway targets: the shared SIMD helpers' and the row-block kernels' (which also build AVX3_DL).
std::string target_label() {
  return std::string(lowbit::kernels::simd::target_name()) + "/" + lowbit::kernels::block_target_name();
}

// Sums a buffer larger than the LLC on every core of the default pool.
void BM_ReadBandwidth(benchmark::State& state) {
  const size_t n = working_set_bytes() / sizeof(uint64_t);
  std::vector<uint64_t> buffer(n, 1);
  lowbit::ThreadPool& pool = lowbit::default_pool();
  const size_t chunks = pool.size() * 8;
  std::vector<uint64_t> sums(chunks);
  double seconds = 0, bytes = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(chunks, 1, [&](size_t c0, size_t c1) {
      for (size_t c = c0; c < c1; ++c) {
        const uint64_t* p = buffer.data() + c * (n / chunks);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= n / chunks; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
        sums[c] = s0 + s1 + s2 + s3;
      }
    });
    benchmark::DoNotOptimize(sums.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const size_t read = n / chunks * chunks * sizeof(uint64_t);  // the whole chunks summed
    bytes += static_cast<double>(read);
  }
  g_read_gbps = bytes / seconds / 1e9;
  state.counters["GB/s"] = g_read_gbps;
  state.counters["threads"] = static_cast<double>(pool.size());
  state.SetLabel(std::to_string(working_set_bytes() >> 20) + " MiB buffer");
}

std::vector<float> random_weights(int64_t rows, int64_t cols) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + cols));
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& f : w) f = normal(rng);
  return w;
}

// Copies of one encoded weight, each prepared for the CPU.
struct Copies {
  std::vector<lowbit::codec::EncodedTensor> tensors;
  std::vector<std::unique_ptr<lowbit::kernels::CpuLinear>> kernels;
};

Copies make_copies(const lowbit::codec::Codec& codec, const Params& params, int64_t rows, int64_t cols) {
  const auto weights = random_weights(rows, cols);
  lowbit::codec::EncodeOptions options;
  options.pool = &lowbit::default_pool();
  Copies c;
  c.tensors.push_back(codec.encode(params, {rows, cols}, weights.data(), options));
  uint64_t bytes = 0;
  for (const auto& [role, buffer] : c.tensors[0].arrays) bytes += buffer.bytes.size();
  const size_t copies = std::max<size_t>(1, (working_set_bytes() + bytes - 1) / bytes);
  const auto prepare = [&](const lowbit::codec::EncodedTensor& t) {
    c.kernels.push_back(lowbit::kernels::prepare_cpu({&codec, t.params, {rows, cols}, t.views()}));
  };
  prepare(c.tensors[0]);
  // A kernel that reads its own prepared copy needs no copy of the stored arrays to be distinct.
  const bool own_copy = !c.kernels[0]->reads_stored_arrays();
  for (size_t i = 1; i < copies; ++i) {
    if (!own_copy) c.tensors.push_back(c.tensors[0]);
    prepare(c.tensors.back());
  }
  return c;
}

// Google Benchmark calls a benchmark function several times (to size its iteration count, then once per
// repetition); the copies of the case being run are kept between those calls (encoding and preparing them
// took most of a run's time) and released when the next case starts.
const Copies& copies_for(const lowbit::codec::Codec& codec, const Params& params, int64_t rows, int64_t cols) {
  static std::string cached_case;
  static std::unique_ptr<Copies> cached;
  const std::string name = std::string(codec.id) + params.dump() + std::to_string(rows) + "x" + std::to_string(cols);
  if (name != cached_case) {
    cached.reset();
    cached = std::make_unique<Copies>(make_copies(codec, params, rows, cols));
    cached_case = name;
  }
  return *cached;
}

void BM_Matvec(benchmark::State& state, const lowbit::codec::Codec* codec, const Params& params, int64_t rows,
               int64_t cols) {
  const Copies& copies = copies_for(*codec, params, rows, cols);
  std::vector<float> x(static_cast<size_t>(cols), 0.01f), y(static_cast<size_t>(rows));
  lowbit::ThreadPool& pool = lowbit::default_pool();
  size_t next = 0;
  double seconds = 0, bytes = 0;
  for (auto _ : state) {
    const auto& k = *copies.kernels[next];
    next = (next + 1) % copies.kernels.size();
    const auto t0 = std::chrono::steady_clock::now();
    k.matmul(x.data(), 1, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bytes += static_cast<double>(k.weight_bytes());
  }
  const double gbps = bytes / seconds / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["of_read_bw"] = g_read_gbps > 0 ? gbps / g_read_gbps : 0.0;
  state.counters["bits/w"] = lowbit::codec::bits_per_weight(*codec, copies.tensors[0].params, {rows, cols});
  state.SetLabel(target_label());
}

// The compute ceiling: one thread on one copy of a [1024 x 4096] weight that stays in cache; GB/s of weight
// bytes per core (CPU time), to set against the per-core share of the read bandwidth.
void BM_MatvecHot(benchmark::State& state, const lowbit::codec::Codec* codec, const Params& params) {
  const int64_t rows = 1024, cols = 4096;
  const auto weights = random_weights(rows, cols);
  const auto tensor = codec->encode(params, {rows, cols}, weights.data(), {});
  const auto kernel = lowbit::kernels::prepare_cpu({codec, tensor.params, {rows, cols}, tensor.views()});
  std::vector<float> x(static_cast<size_t>(cols), 0.01f), y(static_cast<size_t>(rows));
  lowbit::ThreadPool single(1);
  for (auto _ : state) {
    kernel->matmul(x.data(), 1, y.data(), single);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(kernel->weight_bytes()) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(target_label());
}

}  // namespace

int main(int argc, char** argv) {
  // LOWBIT_THREADS pins the pool size (e.g. to the cores a taskset allows); default: every core.
  if (const char* threads = std::getenv("LOWBIT_THREADS"))
    lowbit::set_default_threads(std::strtoul(threads, nullptr, 10));
  benchmark::RegisterBenchmark("read_bandwidth", BM_ReadBandwidth)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (const lowbit::codec::Codec& codec : lowbit::codec::all_codecs()) {
    const auto it = bench_params().find(std::string(codec.id));
    if (it == bench_params().end()) {
      std::fprintf(stderr, "bench_kernels: no benchmark params for codec '%.*s'\n", static_cast<int>(codec.id.size()),
                   codec.id.data());
      continue;
    }
    for (const Params& params : it->second)
      for (const auto& [rows, cols] : kShapes) {
        const std::string name = "matvec/" + std::string(codec.id) + "/" + params.dump() + "/" +
                                 std::to_string(rows) + "x" + std::to_string(cols);
        benchmark::RegisterBenchmark(name.c_str(), BM_Matvec, &codec, params, rows, cols)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    for (const Params& params : it->second) {
      const std::string name = "matvec_hot_1thread/" + std::string(codec.id) + "/" + params.dump() + "/1024x4096";
      benchmark::RegisterBenchmark(name.c_str(), BM_MatvecHot, &codec, params)->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
