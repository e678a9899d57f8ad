// GPU decode matvec throughput per codec at Llama-shaped matrices, with cuBLAS bf16 timed the same way in the
// same process. Every timing replays a CUDA graph of `kLaunches` launches that rotate over enough weight copies
// to exceed L2 (so each launch streams from HBM), and reports the median over replays.
// Effective GB/s counts the bytes the artifact stores for the weight (codes + scales + biases), TFLOP/s 2 m N K
// over the time. Batches up to kMaxBatch run matmul (decode), larger ones gemm (prefill).
// Usage: bench_cuda [--json FILE] [--quick] [--filter SUBSTR] [--shapes NxK,...] [--batches M,...] [--no-cublas]
// (only codecs whose name contains SUBSTR, cuBLAS runs unless --no-cublas; --shapes: only those shapes, every
// batch for the codecs and cuBLAS; --batches: those batch sizes instead of 1, 2, 4, 8, 16)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lowbit/codec/codec.h"
#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "cuda/random_tensor.h"

namespace lc = lowbit::kernels::cuda;
using lowbit::DType;

namespace {

constexpr int kLaunches = 24;
constexpr uint64_t kRotationBytes = uint64_t{192} << 20;  // over three times the 60 MB L2

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) lowbit::fail(lowbit::Errc::internal, "[bench_cuda] {}: {}", what, cudaGetErrorString(e));
}

// Median microseconds per launch of fn(i) for i in [0, kLaunches), captured in one graph, over `replays` replays
// (the first 3 discarded).
double time_graph(const std::function<void(int, cudaStream_t)>& fn, int replays = 25) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  for (int i = 0; i < kLaunches; ++i) fn(i, s);  // warm-up outside the graph
  check(cudaStreamSynchronize(s), "warm-up");
  cudaGraph_t g;
  cudaGraphExec_t ge;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < kLaunches; ++i) fn(i, s);
  check(cudaStreamEndCapture(s, &g), "end capture");
  check(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  std::vector<float> ms;
  for (int rep = 0; rep < replays; ++rep) {
    check(cudaEventRecord(a, s), "record");
    check(cudaGraphLaunch(ge, s), "graph launch");
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float t;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    if (rep >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return ms[ms.size() / 2] * 1e3 / kLaunches;
}

uint16_t to_bf16(float f) { return lowbit::f32_to_bf16(f); }

struct Row {
  std::string codec;
  int64_t n, k;
  int m;
  double us, gbps, bits;
  double tflops() const { return 2.0 * m * n * k / us / 1e6; }
};

struct Case {
  std::string name, id;
  lowbit::codec::Params params;
};

// One row per batch size in `ms`; the weight copies are prepared once for all of them.
std::vector<Row> bench_codec(const Case& c, int64_t n, int64_t k, const std::vector<int>& ms, std::mt19937_64& rng) {
  const lowbit::testing::RandomTensor host = lowbit::testing::random_tensor(c.id, c.params, n, k, rng);
  const uint64_t bytes = lowbit::codec::bits_per_weight(*host.ref.codec, host.ref.params, host.ref.shape) * n * k / 8;
  const int copies = static_cast<int>(std::clamp<uint64_t>(kRotationBytes / bytes + 1, 2, kLaunches));
  std::vector<std::unique_ptr<lc::CudaLinear>> ws;
  for (int i = 0; i < copies; ++i) ws.push_back(lc::prepare_cuda(host.ref));
  std::vector<Row> rows;
  for (const int m : ms) {
    std::normal_distribution<float> nd;
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = nd(rng);
    lc::DeviceBuffer dx(x.size() * 4), dy(static_cast<size_t>(m * n) * 4);
    dx.upload(x.data(), dx.size());
    // A prefill GEMM runs for milliseconds at large m: fewer replays keep the run short.
    const double us = time_graph([&](int i, cudaStream_t s) {
      if (m <= lc::kMaxBatch)
        ws[i % copies]->matmul(dx.as<const float>(), m, dy.as<float>(), s);
      else
        ws[i % copies]->gemm(dx.as<const float>(), m, dy.as<float>(), s);
    }, m <= lc::kMaxBatch ? 25 : 8);
    rows.push_back({c.name, n, k, m, us, static_cast<double>(ws[0]->weight_bytes()) / us / 1e3,
                    8.0 * ws[0]->weight_bytes() / (n * k)});
  }
  return rows;
}

// cuBLAS bf16 GEMV-shaped GEMM (y [m, n] = x [m, k] @ W^T), timed the same way.
Row bench_cublas(int64_t n, int64_t k, int m, std::mt19937_64& rng) {
  const uint64_t bytes = static_cast<uint64_t>(n * k) * 2;
  const int copies = static_cast<int>(std::clamp<uint64_t>(kRotationBytes / bytes + 1, 2, kLaunches));
  std::vector<uint16_t> w(static_cast<size_t>(n * k));
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (auto& v : w) v = to_bf16(nd(rng));
  std::vector<lc::DeviceBuffer> ws;
  for (int i = 0; i < copies; ++i) {
    ws.emplace_back(bytes);
    ws.back().upload(w.data(), bytes);
  }
  std::vector<uint16_t> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = to_bf16(nd(rng));
  lc::DeviceBuffer dx(x.size() * 2), dy(static_cast<size_t>(m * n) * 2);
  dx.upload(x.data(), dx.size());
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) lowbit::fail(lowbit::Errc::internal, "[bench_cuda] cublasCreate");
  const float one = 1.0f, zero = 0.0f;
  const double us = time_graph([&](int i, cudaStream_t s) {
    cublasSetStream(h, s);
    // Column-major: y^T [n, m] = W [n, k] (row-major = col-major W^T [k, n], so op T) @ x^T [k, m].
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), m, static_cast<int>(k), &one,
                 ws[i % copies].data(), CUDA_R_16BF, static_cast<int>(k), dx.data(), CUDA_R_16BF,
                 static_cast<int>(k), &zero, dy.data(), CUDA_R_16BF, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  });
  cublasDestroy(h);
  return {"cublas_bf16", n, k, m, us, bytes / us / 1e3, 16.0};
}

// Rewrites the whole JSON file (after every row, so that a run cut off by a time limit keeps its rows).
void write_json(const std::string& path, const std::vector<Row>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) lowbit::fail(lowbit::Errc::io, "[bench_cuda] cannot write {}", path);
  std::fprintf(f, "{\"device\": \"%s\", \"rows\": [\n", lc::device_summary().c_str());
  for (size_t i = 0; i < rows.size(); ++i)
    std::fprintf(f, "  {\"codec\": \"%s\", \"N\": %lld, \"K\": %lld, \"m\": %d, \"us\": %.3f, \"GBps\": %.1f, \"TFLOPs\": %.2f, \"bits\": %.3f}%s\n",
                 rows[i].codec.c_str(), static_cast<long long>(rows[i].n), static_cast<long long>(rows[i].k),
                 rows[i].m, rows[i].us, rows[i].gbps, rows[i].tflops(), rows[i].bits, i + 1 < rows.size() ? "," : "");
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::string filter;
  bool quick = false;
  bool cublas = true;
  std::string shape_list;  // --shapes NxK[,NxK...]: every selected codec and cuBLAS at every batch there
  std::string batch_list;  // --batches M[,M...]
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--no-cublas")) cublas = false;
    else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) shape_list = argv[++i];
    else if (!std::strcmp(argv[i], "--batches") && i + 1 < argc) batch_list = argv[++i];
  }
  std::string why;
  if (!lc::device_available(&why)) {
    std::fprintf(stderr, "bench_cuda: no usable CUDA device (%s); nothing to measure\n", why.c_str());
    return 0;
  }
  try {
    std::fprintf(stderr, "bench_cuda: %s\n", lc::device_summary().c_str());
    std::mt19937_64 rng(7);
    std::vector<std::pair<int64_t, int64_t>> shapes =
        quick ? std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}}
              : std::vector<std::pair<int64_t, int64_t>>{{4096, 4096},  {14336, 4096}, {4096, 14336},
                                                         {28672, 8192}, {8192, 28672}, {128256, 4096}};
    auto aff = [](int bits, int group) {
      return Case{fmt::format("affine{}_g{}", bits, group), "affine",
                  {{"bits", bits}, {"group_size", group}, {"scale_dtype", "bf16"}}};
    };
    auto trellis = [](int k, const char* code) {
      return Case{fmt::format("trellis{}_{}", k, code), "trellis",
                  {{"L", 16}, {"k", k}, {"code", code}, {"rotate", "none"}}};
    };
    const std::vector<Case> cases = {{"dense_bf16", "dense", {{"dtype", "bf16"}}},
                                     aff(4, 128), aff(8, 128), aff(4, 64), aff(3, 64), aff(2, 64),
                                     trellis(2, "1mad"), trellis(3, "1mad"), trellis(2, "3inst"),
                                     {"offset_q4", "offset_scale", {{"precision", "q4"}}},
                                     {"two_plane", "two_plane", {{"storage", "planes"}}},
                                     trellis(3, "3inst"), {"offset_q3", "offset_scale", {{"precision", "q3"}}},
                                     trellis(4, "1mad"), trellis(4, "3inst")};
    std::vector<Row> rows;
    auto add = [&](const Row& r) {
      rows.push_back(r);
      std::printf("%-14s [%6lld x %6lld] m=%-3d %9.2f us %7.0f GB/s %7.2f TFLOP/s  %5.2f bits/w\n", r.codec.c_str(),
                  static_cast<long long>(r.n), static_cast<long long>(r.k), r.m, r.us, r.gbps, r.tflops(), r.bits);
      std::fflush(stdout);
      if (!json_path.empty()) write_json(json_path, rows);
    };
    auto selected = [&](const Case& c) {
      if (filter.empty()) return true;
      for (size_t begin = 0; begin <= filter.size();) {
        const size_t end = std::min(filter.find(',', begin), filter.size());
        if (c.name.find(filter.substr(begin, end - begin)) != std::string::npos) return true;
        begin = end + 1;
      }
      return false;
    };
    // Small batches first (a time limit cuts the end): time per call relative to batch 1 decides how well
    // batching pays (dense bf16, affine4 g128, affine2 g64, trellis2 1MAD).
    std::vector<int> batches = quick ? std::vector<int>{1, 2, 16} : std::vector<int>{1, 2, 4, 8, 16};
    if (!batch_list.empty()) {
      batches.clear();
      for (const char* p = batch_list.c_str(); *p;) {
        int m = 0, used = 0;
        if (std::sscanf(p, "%d%n", &m, &used) != 1 || m < 1 || m > 65536)
          lowbit::fail(lowbit::Errc::usage, "[bench_cuda] --batches: '{}' is not M[,M...] with 1 <= M <= 65536",
                       batch_list);
        batches.push_back(m);
        p += used;
        if (*p == ',') ++p;
      }
    }
    const auto batch_shapes = quick ? shapes : std::vector<std::pair<int64_t, int64_t>>{{14336, 4096}, {8192, 28672}};
    if (!shape_list.empty()) {
      shapes.clear();
      for (const char* p = shape_list.c_str(); *p;) {
        long long n = 0, k = 0;
        int used = 0;
        if (std::sscanf(p, "%lldx%lld%n", &n, &k, &used) != 2 || n < 1 || k < 1)
          lowbit::fail(lowbit::Errc::usage, "[bench_cuda] --shapes: '{}' is not NxK[,NxK...]", shape_list);
        shapes.emplace_back(n, k);
        p += used;
        if (*p == ',') ++p;
      }
      for (const auto& [n, k] : shapes) {
        if (cublas)
          for (int m : batches) add(bench_cublas(n, k, m, rng));
        for (const Case& c : cases)
          if (selected(c))
            for (const Row& r : bench_codec(c, n, k, batches, rng)) add(r);
      }
      return 0;
    }
    for (const auto& [n, k] : batch_shapes) {
      if (cublas)
        for (int m : batches) add(bench_cublas(n, k, m, rng));
      for (const int c : {0, 1, 5, 6, 10})
        if (selected(cases[c]))
          for (const Row& r : bench_codec(cases[c], n, k, batches, rng)) add(r);
    }
    for (const auto& [n, k] : shapes) {
      if (cublas) add(bench_cublas(n, k, 1, rng));
      for (const Case& c : cases)
        if (selected(c))
          for (const Row& r : bench_codec(c, n, k, {1}, rng)) add(r);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
