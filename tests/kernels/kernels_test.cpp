// One harness for every (codec, CPU kernel) pair in the registries: each kernel is checked against an fp64
// reference computed from the codec's exact decode_rows, on random shapes, odd row counts and the smallest
// legal widths, for m == 1 and m > 1, with the outputs poisoned before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // iterate the AVX-512 VNNI target the block kernels compile too
#endif
#include <hwy/targets.h>

#include "block_kernels.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/kernels/cpu.h"
#include "lowbit/kernels/cpu_attention.h"
#include "simd.h"
#include "support/codec_examples.h"

namespace lowbit::kernels {
namespace {

using codec::Params;
using lowbit::testing::codec_examples;

std::vector<float> random_values(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = normal(rng);
  if (n > 3) v[n / 3] *= 6.0f;  // an outlier, as real weights have
  return v;
}

struct Encoded {
  codec::EncodedTensor encoded;
  codec::TensorRef ref;
};

Encoded encode(const codec::Codec& c, const Params& params, const Shape& shape, std::mt19937& rng) {
  const auto weights = random_values(static_cast<size_t>(shape[0] * shape[1]), rng, 0.05f);
  Encoded e{c.encode(params, shape, weights.data(), {}), {}};
  e.ref = {&c, e.encoded.params, shape, e.encoded.views()};
  codec::validate_tensor(e.ref, c.id);
  return e;
}

// Batch-1 kernels may round each activation to within this fraction of the largest |x| among the aligned
// kRoundingWindow columns around it (the row-block kernels: 16-bit integers per group of 32, 64 or 128 columns,
// docs/CODECS.md); f32 kernels round far less.
constexpr double kActivationRounding = 1.0 / (2 * 32637.0);
constexpr int64_t kRoundingWindow = 128;

// y_ref [m, rows] in fp64 from the exact decode, and per output the scale of its terms (sum |w x|) and the
// bound on what rounding the activations can move it (sum |w| kActivationRounding max |x| of the window).
void reference(const std::vector<float>& w, int64_t rows, int64_t cols, const std::vector<float>& x, int64_t m,
               std::vector<double>& y, std::vector<double>& magnitude, std::vector<double>& rounding) {
  y.assign(static_cast<size_t>(m * rows), 0.0);
  magnitude.assign(static_cast<size_t>(m * rows), 0.0);
  rounding.assign(static_cast<size_t>(m * rows), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> window_max(static_cast<size_t>(cols));
    for (int64_t c0 = 0; c0 < cols; c0 += kRoundingWindow) {
      const int64_t c1 = std::min(cols, c0 + kRoundingWindow);
      double largest = 0;
      for (int64_t c = c0; c < c1; ++c) largest = std::max(largest, std::abs(static_cast<double>(x[i * cols + c])));
      std::fill(window_max.begin() + c0, window_max.begin() + c1, largest);
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double p = static_cast<double>(w[r * cols + c]) * x[i * cols + c];
        y[i * rows + r] += p;
        magnitude[i * rows + r] += std::abs(p);
        rounding[i * rows + r] += std::abs(w[r * cols + c]) * kActivationRounding * window_max[c];
      }
  }
}

void expect_matmul_matches(const CpuLinear& k, const codec::TensorRef& ref, int64_t m, std::mt19937& rng,
                           ThreadPool& pool, const std::string& what, float x_scale = 1.0f) {
  const auto [rows, cols] = codec::matrix_dims(ref.shape);
  ASSERT_EQ(k.rows(), rows) << what;
  ASSERT_EQ(k.cols(), cols) << what;
  const auto w = codec::decode_all(ref);
  const auto x = random_values(static_cast<size_t>(m * cols), rng, x_scale);
  std::vector<double> y_ref, magnitude, rounding;
  reference(w, rows, cols, x, m, y_ref, magnitude, rounding);
  std::vector<float> y(static_cast<size_t>(m * rows), std::numeric_limits<float>::quiet_NaN());
  k.matmul(x.data(), m, y.data(), pool);
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_NEAR(y[i], y_ref[i], 2e-5 * magnitude[i] + rounding[i] + 1e-6 * std::min(1.0f, x_scale))
        << what << " m=" << m << " output " << i;
}

void expect_gather_matches(const CpuLinear& k, const codec::TensorRef& ref, std::mt19937& rng,
                           const std::string& what) {
  const auto [rows, cols] = codec::matrix_dims(ref.shape);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(rows - 1));
  const std::vector<int32_t> ids = {pick(rng), static_cast<int32_t>(rows - 1), pick(rng), 0};
  std::vector<float> out(ids.size() * static_cast<size_t>(cols), std::numeric_limits<float>::quiet_NaN());
  k.gather_rows(ids, out.data());
  std::vector<float> row(static_cast<size_t>(cols));
  for (size_t i = 0; i < ids.size(); ++i) {
    ref.codec->decode_rows(ref.params, ref.shape, ref.arrays, ids[i], ids[i] + 1, row.data());
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_NEAR(out[i * cols + c], row[c], 1e-6f * (1.0f + std::abs(row[c]))) << what << " id " << ids[i];
  }
  const std::vector<int32_t> bad = {0, static_cast<int32_t>(rows)};
  EXPECT_THROW(k.gather_rows(bad, out.data()), Error) << what;
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW(k.gather_rows(negative, out.data()), Error) << what;
}

TEST(KernelRegistry, EveryCodecHasACpuKernelAndNoRowIsStale) {
  for (const codec::Codec& c : codec::all_codecs()) {
    int rows = 0;
    for (const CpuKernelEntry& e : cpu_kernel_table()) rows += e.codec_id == c.id;
    EXPECT_EQ(rows, 1) << "codec '" << c.id << "' needs exactly one row in src/kernels/cpu/registry.cpp";
  }
  for (const CpuKernelEntry& e : cpu_kernel_table())
    EXPECT_NE(codec::find_codec(e.codec_id), nullptr) << "kernel row for unknown codec '" << e.codec_id << "'";
}

TEST(KernelRegistry, CodecsHaveExamples) {
  for (const codec::Codec& c : codec::all_codecs())
    EXPECT_TRUE(codec_examples().contains(std::string(c.id)))
        << "codec '" << c.id << "' has no example params in tests/support/codec_examples.h";
}

void expect_every_codec_matches(ThreadPool& pool, std::mt19937& rng) {
  for (const codec::Codec& c : codec::all_codecs()) {
    const auto it = codec_examples().find(std::string(c.id));
    if (it == codec_examples().end()) continue;  // reported by CodecsHaveExamples
    for (const Params& params : it->second.params)
      for (const int64_t cols : it->second.widths)
        for (const int64_t rows : {int64_t{1}, int64_t{3}, int64_t{37}}) {
          const std::string what = fmt::format("{} {} [{}, {}] on {}", c.id, params.dump(), rows, cols,
                                               simd::target_name());
          const Encoded e = encode(c, params, {rows, cols}, rng);
          const auto kernel = prepare_cpu(e.ref);
          for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{5}})
            expect_matmul_matches(*kernel, e.ref, m, rng, pool, what);
          expect_gather_matches(*kernel, e.ref, rng, what);
        }
  }
}

// On every Highway target this CPU runs (AVX-512, AVX2, SSE4, ...), not only the one dispatch picks.
TEST(Kernels, EveryCodecMatchesFp64ReferenceOfItsDecoder) {
  ThreadPool pool(3);
  std::mt19937 rng(1234);
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    // The row-block kernels compile every target this test iterates (AVX3_DL included): each is really run.
    EXPECT_STREQ(block_target_name(), hwy::TargetName(target));
    expect_every_codec_matches(pool, rng);
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Affine tensors whose every bias is -2^(bits-1) scale (GGUF Q4_0, Q5_0, Q8_0, Q3_K and Q6_K as they load) are prepared
// with the scale alone, read as such (weight_bytes leaves the biases out), and still match the fp64 reference, on every
// target; one other bias brings the biases back.
TEST(Kernels, AffineWithOffsetBiasesKeepsTheScaleAlone) {
  ThreadPool pool(2);
  std::mt19937 rng(22);
  const codec::Codec& c = *codec::find_codec("affine");
  const auto array = [](Encoded& e, std::string_view role) -> TensorBuffer& {
    for (auto& [name, buffer] : e.encoded.arrays)
      if (name == role) return buffer;
    throw std::logic_error("no array");
  };
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const auto& [bits, group, name, dtype] :
         {std::tuple{4, 32, "f16", DType::F16}, std::tuple{5, 32, "f16", DType::F16},
          std::tuple{8, 32, "f16", DType::F16}, std::tuple{3, 16, "f32", DType::F32},
          std::tuple{6, 16, "f32", DType::F32}})
      for (const int64_t cols : {int64_t{33}, int64_t{544}}) {
        const std::string what =
            fmt::format("affine {} bits g{} [37, {}] on {}", bits, group, cols, simd::target_name());
        const Params params{{"bits", bits}, {"group_size", group}, {"scale_dtype", name}};
        Encoded e = encode(c, params, {37, cols}, rng);
        TensorBuffer &scales = array(e, "scales"), &biases = array(e, "biases");
        const size_t n = scales.bytes.size() / dtype_size(dtype);
        const auto offset = static_cast<float>(1 << (bits - 1));
        for (size_t i = 0; i < n; ++i)
          store_float(dtype, biases.bytes.data(), i, -offset * load_float(dtype, scales.bytes.data(), i));
        e.ref.arrays = e.encoded.views();
        const uint64_t without_biases = array(e, "codes").bytes.size() + scales.bytes.size();
        const auto kernel = prepare_cpu(e.ref);
        EXPECT_EQ(kernel->weight_bytes(), without_biases) << what;
        for (const int64_t m : {int64_t{1}, int64_t{3}}) expect_matmul_matches(*kernel, e.ref, m, rng, pool, what);
        expect_gather_matches(*kernel, e.ref, rng, what);
        store_float(dtype, biases.bytes.data(), n - 1, 1.0f);  // the last group may be all padding, scale 0
        EXPECT_EQ(prepare_cpu(e.ref)->weight_bytes(), without_biases + biases.bytes.size()) << what;
      }
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(Kernels, LargeBatchCrossesTileAndChunkBoundaries) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  for (const codec::Codec& c : codec::all_codecs()) {
    const auto it = codec_examples().find(std::string(c.id));
    if (it == codec_examples().end()) continue;
    const Params& params = it->second.params.front();
    const Encoded e = encode(c, params, {35, 1100}, rng);
    const auto kernel = prepare_cpu(e.ref);
    expect_matmul_matches(*kernel, e.ref, 19, rng, pool, fmt::format("{} {}", c.id, params.dump()));
  }
}

// Activations far from 1 in magnitude (the integer matvec picks a power-of-two scale per group).
TEST(Kernels, TinyAndHugeActivations) {
  ThreadPool pool(2);
  std::mt19937 rng(13);
  for (const codec::Codec& c : codec::all_codecs()) {
    const auto it = codec_examples().find(std::string(c.id));
    if (it == codec_examples().end()) continue;
    const Encoded e = encode(c, it->second.params.front(), {21, 150}, rng);
    const auto kernel = prepare_cpu(e.ref);
    for (const float x_scale : {1e-30f, 1e30f})
      for (const int64_t m : {int64_t{1}, int64_t{2}})
        expect_matmul_matches(*kernel, e.ref, m, rng, pool, fmt::format("{} x ~{}", c.id, x_scale), x_scale);
  }
}

// The batch-1 rounding bound is nearly reached and never exceeded: every activation of a 128-column group sits
// just below the middle of two steps of the finest grid the bound allows (so a coarser grid, or rounding that
// is not to nearest, breaks it), all weights are equal and positive (so the errors add up).
TEST(Kernels, BlockMatvecActivationRoundingStaysWithinItsBound) {
  constexpr int64_t rows = 16, cols = 128;
  BlockMatrix m(8, 0, BlockMeta::scale_bias, DType::F32, rows, cols, cols, cols);
  const std::vector<uint8_t> codes(cols, 255), unused(cols, 0);
  const float scale = 1.0f, bias = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    m.set_row_codes(r, codes.data(), unused.data());
    m.set_meta(r, 0, 0, reinterpret_cast<const std::byte*>(&scale));
    m.set_meta(r, 0, 1, reinterpret_cast<const std::byte*>(&bias));
  }
  const auto kernel = make_block_linear(std::move(m), 0);
  const double step = 2 * kActivationRounding;  // largest |x| = 1
  std::vector<float> x(cols);
  x[0] = 1.0f;
  for (int64_t c = 1; c < cols; ++c) x[c] = static_cast<float>(((c * 9973) % 32000 + 0.49) * step);
  double exact = 0, magnitude = 0;
  for (const float v : x) exact += 255.0 * v, magnitude += 255.0 * std::abs(v);
  const double bound = 255.0 * cols * kActivationRounding + 1e-6 * magnitude;
  std::vector<float> y(rows, std::numeric_limits<float>::quiet_NaN());
  ThreadPool pool(2);
  kernel->matmul(x.data(), 1, y.data(), pool);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_LE(std::abs(y[r] - exact), bound) << "row " << r;
    EXPECT_GT(std::abs(y[r] - exact), 0.9 * 255.0 * (cols - 1) * 0.49 * step)
        << "row " << r << ": the construction no longer nears the bound (a finer kernel? tighten kActivationRounding)";
  }
}

// An Inf or NaN activation makes every output non-finite, as an f32 dot product would, on both paths (the
// integer matvec of the row-block kernels carries it as a NaN group factor).
TEST(Kernels, NonFiniteActivationsReachEveryOutput) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  for (const codec::Codec& c : codec::all_codecs()) {
    const auto it = codec_examples().find(std::string(c.id));
    if (it == codec_examples().end()) continue;
    const Encoded e = encode(c, it->second.params.front(), {19, 200}, rng);
    const auto kernel = prepare_cpu(e.ref);
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
      for (const int64_t m : {int64_t{1}, int64_t{3}}) {
        auto x = random_values(static_cast<size_t>(m * 200), rng);
        for (int64_t i = 0; i < m; ++i) x[static_cast<size_t>(i * 200 + 77)] = bad;
        std::vector<float> y(static_cast<size_t>(m * 19), 0.0f);
        kernel->matmul(x.data(), m, y.data(), pool);
        for (size_t i = 0; i < y.size(); ++i) EXPECT_FALSE(std::isfinite(y[i])) << c.id << " m=" << m << " output " << i;
      }
  }
}

// A kernel that says it no longer reads its stored arrays keeps working once they are gone (ASan checks it).
TEST(Kernels, PreparedCopyOutlivesStoredArrays) {
  ThreadPool pool(2);
  std::mt19937 rng(17);
  for (const codec::Codec& c : codec::all_codecs()) {
    const auto it = codec_examples().find(std::string(c.id));
    if (it == codec_examples().end()) continue;
    auto e = std::make_unique<Encoded>(encode(c, it->second.params.front(), {18, 130}, rng));
    const auto kernel = prepare_cpu(e->ref);
    if (kernel->reads_stored_arrays()) continue;
    const auto x = random_values(3 * 130, rng);
    std::vector<float> before(3 * 18), after(3 * 18), row_before(130), row_after(130);
    const std::vector<int32_t> ids = {17};
    for (const int64_t m : {int64_t{1}, int64_t{3}}) kernel->matmul(x.data(), m, before.data(), pool);
    kernel->gather_rows(ids, row_before.data());
    e.reset();
    for (const int64_t m : {int64_t{1}, int64_t{3}}) kernel->matmul(x.data(), m, after.data(), pool);
    kernel->gather_rows(ids, row_after.data());
    EXPECT_EQ(before, after) << c.id;
    EXPECT_EQ(row_before, row_after) << c.id;
  }
}

// Fused q/k/v-style parts give the rows of each part, in order, from one call.
TEST(Kernels, FusedMatricesMatchTheirParts) {
  ThreadPool pool(2);
  std::mt19937 rng(99);
  for (const codec::Codec& c : codec::all_codecs()) {
    const auto it = codec_examples().find(std::string(c.id));
    if (it == codec_examples().end()) continue;
    const Params& params = it->second.params.front();
    std::vector<Encoded> parts;
    for (const int64_t rows : {5, 3, 8}) parts.push_back(encode(c, params, {rows, 96}, rng));
    std::vector<codec::TensorRef> refs;
    refs.reserve(parts.size());
    for (const Encoded& p : parts) refs.push_back(p.ref);
    std::unique_ptr<CpuLinear> fused;
    try {
      fused = prepare_cpu_fused(refs);
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), Errc::unsupported) << c.id << ": " << e.what();
      continue;
    }
    ASSERT_EQ(fused->rows(), 16);
    for (const int64_t m : {int64_t{1}, int64_t{3}}) {
      const auto x = random_values(static_cast<size_t>(m * 96), rng);
      std::vector<float> y(static_cast<size_t>(m * 16), std::numeric_limits<float>::quiet_NaN());
      fused->matmul(x.data(), m, y.data(), pool);
      int64_t row0 = 0;
      for (const Encoded& p : parts) {
        const auto k = prepare_cpu(p.ref);
        std::vector<float> part_y(static_cast<size_t>(m * k->rows()));
        k->matmul(x.data(), m, part_y.data(), pool);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t r = 0; r < k->rows(); ++r)
            EXPECT_NEAR(y[i * 16 + row0 + r], part_y[i * k->rows() + r], 1e-5f) << c.id;
        row0 += k->rows();
      }
    }
    const Encoded other_width = encode(c, params, {4, 64}, rng);
    refs.push_back(other_width.ref);
    EXPECT_THROW(prepare_cpu_fused(refs), Error) << c.id;
  }
}

TEST(Simd, HelpersMatchScalarOnOddLengths) {
  std::mt19937 rng(5);
  for (const size_t n : {size_t{1}, size_t{15}, size_t{67}}) {
    const auto a = random_values(n, rng), b = random_values(n, rng);
    double ref = 0;
    for (size_t i = 0; i < n; ++i) ref += static_cast<double>(a[i]) * b[i];
    EXPECT_NEAR(simd::dot(a.data(), b.data(), n), ref, 1e-4);
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(a[i]);
    std::vector<float> out(n);
    simd::to_f32(DType::BF16, h.data(), n, out.data());
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], bf16_to_f32(h[i]));
    for (size_t i = 0; i < n; ++i) h[i] = f32_to_f16(a[i]);
    simd::to_f32(DType::F16, h.data(), n, out.data());
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], f16_to_f32(h[i]));
  }
}

// The trellis kernel computes code values in lanes instead of reading codec::trellis::code_table: with one-hot
// activations (no rotation) each output is one weight, code value times scale, and must equal the decoder's
// bit for bit, on both the one-row and the batched path, for both codes, every k and the presets' L, on every
// Highway target (AVX3_DL also runs the AVX-512 FP16 path for 3INST where the CPU has it: trellis_avx512.h).
TEST(Kernels, TrellisOneHotColumnsEqualTheDecoderExactly) {
  std::mt19937 rng(13);
  ThreadPool pool(2);
  const codec::Codec& c = *codec::find_codec("trellis");
  std::vector<Encoded> tensors;
  for (const auto& [L, k, code] :
       {std::tuple{16, 2, "1mad"}, std::tuple{12, 1, "3inst"}, std::tuple{12, 2, "3inst"}, std::tuple{12, 3, "3inst"},
        std::tuple{12, 4, "3inst"}, std::tuple{16, 3, "3inst"}, std::tuple{16, 4, "3inst"}})
    tensors.push_back(encode(c, Params{{"L", L}, {"k", k}, {"code", code}, {"rotate", "none"}}, {32, 48}, rng));
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (const Encoded& e : tensors) {
      const int64_t rows = e.ref.shape[0], cols = e.ref.shape[1];
      const std::string what = fmt::format("{} on {}", e.ref.params.dump(), simd::target_name());
      const auto w = codec::decode_all(e.ref);
      const auto kernel = prepare_cpu(e.ref);
      for (const int64_t m : {int64_t{1}, int64_t{2}})
        for (int64_t j = 0; j < cols; ++j) {
          std::vector<float> x(static_cast<size_t>(m * cols), 0.0f), y(static_cast<size_t>(m * rows));
          for (int64_t i = 0; i < m; ++i) x[i * cols + (j + i) % cols] = 1.0f;
          kernel->matmul(x.data(), m, y.data(), pool);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_EQ(y[i * rows + r], w[r * cols + (j + i) % cols]) << what << " m=" << m << " col " << j;
        }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// attend_head against softmax attention in f64, over lengths and head sizes that leave vector remainders.
TEST(Attention, MatchesFp64SoftmaxAttention) {
  std::mt19937 rng(11);
  for (const size_t n : {size_t{1}, size_t{7}, size_t{40}})
    for (const size_t hd : {size_t{5}, size_t{64}, size_t{72}})
      for (const float softcap : {0.0f, 20.0f}) {
        const size_t stride = hd + 3;
        const auto q = random_values(hd, rng), keys = random_values(n * stride, rng),
                   values = random_values(n * stride, rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
        std::vector<double> p(n);
        double max = -INFINITY, sum = 0;
        for (size_t t = 0; t < n; ++t) {
          double s = 0;
          for (size_t c = 0; c < hd; ++c) s += static_cast<double>(q[c]) * keys[t * stride + c];
          s *= scale;
          if (softcap > 0) s = softcap * std::tanh(s / softcap);
          p[t] = s;
          max = std::max(max, s);
        }
        for (double& v : p) sum += (v = std::exp(v - max));
        std::vector<float> scores(n), out(hd);
        attend_head(q.data(), keys.data(), values.data(), stride, n, hd, scale, softcap, scores.data(), out.data());
        for (size_t c = 0; c < hd; ++c) {
          double ref = 0;
          for (size_t t = 0; t < n; ++t) ref += p[t] / sum * values[t * stride + c];
          EXPECT_NEAR(out[c], ref, 1e-5) << "n " << n << " hd " << hd << " softcap " << softcap;
        }
      }
}

}  // namespace
}  // namespace lowbit::kernels
