// Is decode bound by the bytes it reads or by the kernels' arithmetic? The batch-1 matvecs of one SmolLM2-135M
// decode step (30 layers of q, k, v, o, gate, up, down, unfused, and the tied 49152 x 576 head; random weights) in
// two layouts: the Q4_1 GGUF's as it loads (affine 4-bit g32 f16 linears; the Q8_0 head as affine 8-bit g32 whose
// biases are -128 scale, so the kernel keeps the scale alone) and its affine4 artifact's (affine 4-bit g64 bf16,
// head included). "model" multiplies every distinct matrix (the real working set: every byte from beyond L2);
// "hot" one layer's matrices and a 1/16 slice of the head, repeated to the same weight count (a few MB, near the
// core). Milliseconds per step (median and min over the rounds, the four interleaved) and GB/s of weights.
//   bench_decode_layout [threads] [rounds]   (other arguments, such as ./run bench's benchmark flags, are ignored)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/dtype.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cpu.h"

namespace {

using lowbit::codec::Params;

std::unique_ptr<lowbit::kernels::CpuLinear> make(const Params& params, int64_t rows, int64_t cols, bool offset_biases,
                                                 uint32_t seed) {
  const lowbit::codec::Codec& codec = *lowbit::codec::find_codec("affine");
  std::vector<float> w(static_cast<size_t>(rows * cols));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& f : w) f = normal(rng);
  lowbit::codec::EncodedTensor t = codec.encode(params, {rows, cols}, w.data(), {});
  if (offset_biases) {
    lowbit::TensorBuffer *scales = nullptr, *biases = nullptr;
    for (auto& [role, buffer] : t.arrays) {
      if (role == "scales") scales = &buffer;
      if (role == "biases") biases = &buffer;
    }
    const auto dtype = scales->dtype;
    for (size_t i = 0; i < scales->bytes.size() / lowbit::dtype_size(dtype); ++i)
      lowbit::store_float(dtype, biases->bytes.data(), i, -128.0f * lowbit::load_float(dtype, scales->bytes.data(), i));
  }
  return lowbit::kernels::prepare_cpu_owned(codec, {rows, cols}, std::move(t));
}

struct Step {
  std::vector<std::unique_ptr<lowbit::kernels::CpuLinear>> mats;
  std::vector<int> order;  // indices into mats, one decode step
  double bytes = 0;
};

Step build(bool gguf, bool hot) {
  const Params lin = gguf ? Params{{"bits", 4}, {"group_size", 32}, {"scale_dtype", "f16"}}
                          : Params{{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}};
  const Params head = gguf ? Params{{"bits", 8}, {"group_size", 32}, {"scale_dtype", "f16"}} : lin;
  const int64_t dim = 576, kv = 192, hidden = 1536, vocab = 49152;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{dim, dim},    {kv, dim},     {kv, dim},    {dim, dim},
                                                           {hidden, dim}, {hidden, dim}, {dim, hidden}};
  Step s;
  const int layers = hot ? 1 : 30;
  for (int l = 0; l < layers; ++l)
    for (const auto& [r, c] : shapes) s.mats.push_back(make(lin, r, c, false, static_cast<uint32_t>(s.mats.size())));
  const int head_parts = hot ? 16 : 1;  // hot: a slice of the head, multiplied head_parts times
  s.mats.push_back(make(head, vocab / head_parts, dim, gguf, 99));
  for (int l = 0; l < 30; ++l)
    for (int i = 0; i < 7; ++i) s.order.push_back(hot ? i : l * 7 + i);
  for (int p = 0; p < head_parts; ++p) s.order.push_back(static_cast<int>(s.mats.size()) - 1);
  for (int i : s.order) s.bytes += static_cast<double>(s.mats[static_cast<size_t>(i)]->weight_bytes());
  return s;
}

double run(const Step& s, lowbit::ThreadPool& pool, std::vector<float>& x, std::vector<float>& y) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i : s.order) s.mats[static_cast<size_t>(i)]->matmul(x.data(), 1, y.data(), pool);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<long> numbers;  // the numeric arguments: threads, rounds
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long v = std::strtol(argv[i], &end, 10);
    if (*argv[i] != '\0' && *end == '\0' && v > 0) numbers.push_back(v);
  }
  const auto threads = static_cast<size_t>(numbers.size() > 0 ? numbers[0] : 1);
  const int rounds = static_cast<int>(numbers.size() > 1 ? std::min(numbers[1], 1000L) : 20);
  lowbit::set_default_threads(threads);
  lowbit::ThreadPool pool(threads);
  const char* names[4] = {"gguf model", "artifact model", "gguf hot", "artifact hot"};
  Step steps[4] = {build(true, false), build(false, false), build(true, true), build(false, true)};
  std::vector<float> x(1536, 0.01f), y(49152);
  std::vector<double> ms[4];
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 4; ++k) ms[k].push_back(run(steps[k], pool, x, y));
  for (int k = 0; k < 4; ++k) {
    std::sort(ms[k].begin(), ms[k].end());
    const double med = ms[k][ms[k].size() / 2];
    std::printf("%-15s threads %zu: %.3f ms/step (min %.3f), %.1f MB/step, %.1f GB/s\n", names[k], threads, med,
                ms[k][0], steps[k].bytes / 1e6, steps[k].bytes / med / 1e6);
  }
}
