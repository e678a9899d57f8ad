// Trellis encoder throughput on one core: weights per second for one 256-weight tail-biting block (two
// Viterbi passes over 2^L states), at L in {12, 16} and k in {2, 3, 4}.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "lowbit/codec/trellis.h"

namespace {

using lowbit::codec::trellis::BlockEncoder;
using lowbit::codec::trellis::Code;
using lowbit::codec::trellis::kBlock;

void BM_TrellisEncodeBlock(benchmark::State& state) {
  const int L = static_cast<int>(state.range(0)), k = static_cast<int>(state.range(1));
  const Code code = state.range(2) == 0 ? Code::mad1 : Code::inst3;
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss;
  std::vector<float> target(kBlock);
  for (float& x : target) x = gauss(rng);
  std::vector<uint16_t> words(static_cast<size_t>(kBlock * k / 16));
  BlockEncoder encoder(code, L, k);
  for (auto _ : state) {
    double cost = encoder.encode(target.data(), nullptr, words.data(), nullptr);
    benchmark::DoNotOptimize(cost);
  }
  state.SetItemsProcessed(state.iterations() * kBlock);  // items/s = weights/s on one core
  state.SetLabel(code == Code::mad1 ? "1mad" : "3inst");
}

BENCHMARK(BM_TrellisEncodeBlock)
    ->ArgNames({"L", "k", "code"})
    ->ArgsProduct({{12, 16}, {2, 3, 4}, {0}})
    ->Args({16, 2, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
