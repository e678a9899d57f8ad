// Trellis decode (1MAD and 3INST, the latter on the AVX-512 FP16 path where the CPU has it): batch-1 matvec and
// m = 16 matmul at [4096 x 4096] and [14336 x 4096] on all cores, with
// random codes (every bit pattern is a valid stream, and the decode cost does not depend on the codes), so
// that L = 16 is measured without hours of Viterbi. Reports GB/s of weight bytes read and bits per weight.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/codec/trellis.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cpu.h"
#include "simd.h"
#include "trellis_avx512.h"

namespace {

using lowbit::codec::Params;

// A trellis tensor with random codes and unit-order scales, laid out as the codec declares.
lowbit::codec::EncodedTensor random_trellis(const Params& params, const lowbit::Shape& shape) {
  const lowbit::codec::Codec& codec = *lowbit::codec::find_codec("trellis");
  lowbit::codec::EncodedTensor t;
  t.params = params;
  const auto lay = lowbit::codec::trellis::parse_layout(params, shape);
  t.params["padded_rows"] = lay.padded_rows;
  t.params["padded_cols"] = lay.padded_cols;
  std::mt19937 rng(7);
  for (const lowbit::codec::ArraySpec& spec : codec.arrays(t.params, shape)) {
    lowbit::TensorBuffer b = lowbit::make_buffer(spec.dtype, spec.shape);
    if (spec.role == "codes")
      for (auto& byte : b.bytes) byte = static_cast<std::byte>(rng());
    else
      for (size_t i = 0; i < b.bytes.size() / 2; ++i) lowbit::store_float(spec.dtype, b.bytes.data(), i, 0.02f);
    t.arrays.emplace_back(spec.role, std::move(b));
  }
  return t;
}

void BM_TrellisMatmul(benchmark::State& state) {
  const int L = static_cast<int>(state.range(0)), k = static_cast<int>(state.range(1));
  const auto code = state.range(2) == 0 ? lowbit::codec::trellis::Code::mad1 : lowbit::codec::trellis::Code::inst3;
  const int64_t rows = state.range(3), cols = state.range(4), m = state.range(5);
  const Params params{{"L", L},
                      {"k", k},
                      {"code", code == lowbit::codec::trellis::Code::mad1 ? "1mad" : "3inst"},
                      {"rotate", "input"},
                      {"input_seed", 1}};
  const lowbit::Shape shape{rows, cols};
  const lowbit::codec::EncodedTensor t = random_trellis(params, shape);
  const lowbit::codec::Codec& codec = *lowbit::codec::find_codec("trellis");
  const auto kernel = lowbit::kernels::prepare_cpu({&codec, t.params, shape, t.views()});
  std::vector<float> x(static_cast<size_t>(m * cols), 0.01f), y(static_cast<size_t>(m * rows));
  lowbit::ThreadPool& pool = lowbit::default_pool();
  for (auto _ : state) {
    kernel->matmul(x.data(), m, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kernel->weight_bytes()));
  state.counters["bits/w"] = lowbit::codec::bits_per_weight(codec, t.params, shape);
  state.SetLabel(lowbit::kernels::trellis_avx512::usable(code) ? "AVX-512 FP16" : lowbit::kernels::simd::target_name());
}

BENCHMARK(BM_TrellisMatmul)
    ->ArgNames({"L", "k", "code", "rows", "cols", "m"})  // code 0: 1MAD, 1: 3INST
    ->ArgsProduct({{12, 16}, {2, 4}, {0, 1}, {4096}, {4096}, {1, 16}})
    ->Args({16, 2, 1, 14336, 4096, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
