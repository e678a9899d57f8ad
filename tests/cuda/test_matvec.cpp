// GPU matvec kernels against a CPU fp64 reference built from the codec's own decode_rows, on random shapes and
// activations, with poisoned outputs. Skips when no CUDA device is present (CI has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/random_tensor.h"
#include "lowbit/codec/codec.h"
#include "lowbit/core/error.h"
#include "lowbit/kernels/cuda.h"
#include "prepare.h"
#include "support/codec_examples.h"

namespace lowbit::kernels::cuda {
namespace {

class CudaMatvec : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!device_available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
  std::mt19937_64 rng{20261202};
};

std::vector<float> random_normal(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Encoded {
  codec::EncodedTensor encoded;
  codec::TensorRef ref;
};

Encoded encode(const std::string& id, const codec::Params& params, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  const codec::Codec& c = codec::codec_or_throw(id, "test");
  const std::vector<float> w = random_normal(static_cast<size_t>(rows * cols), rng);
  Encoded e;
  e.encoded = c.encode(params, {rows, cols}, w.data(), {});
  e.ref = {&c, e.encoded.params, {rows, cols}, e.encoded.views()};
  codec::validate_tensor(e.ref, "test");
  return e;
}

// What matmul_error divides the L2 norm of the error by: the norm of y_ref, or the norm of each output's sum of
// |w x|, the scale rounding errors grow with (the CPU kernel harness bounds each output by it). An output that
// nearly cancels (one row of a few columns) is off by far more than 2e-5 of itself from rounding alone: on an
// H200, 2e-4 of y_ref where y_ref was 8e-4 of its terms' scale.
enum class ErrorScale { result, terms };

// Relative L2 error of the GPU's y [m, rows] from `linear` (prepared from ref) against fp64 x @ decode(W)^T; every
// output must be written. Batches beyond kMaxBatch go through gemm (prefill).
double matmul_error(const CudaLinear& linear, const codec::TensorRef& ref, int m, std::mt19937_64& rng,
                    ErrorScale scale = ErrorScale::result) {
  const auto [rows, cols] = codec::matrix_dims(ref.shape);
  const std::vector<float> w = codec::decode_all(ref);
  const std::vector<float> x = random_normal(static_cast<size_t>(m * cols), rng);
  DeviceBuffer dx(x.size() * sizeof(float)), dy(static_cast<size_t>(m * rows) * sizeof(float));
  dx.upload(x.data(), dx.size());
  dy.fill(0xFF);  // NaN: an unwritten output fails the check below
  if (m <= kMaxBatch)
    linear.matmul(dx.as<const float>(), m, dy.as<float>(), nullptr);
  else
    linear.gemm(dx.as<const float>(), m, dy.as<float>(), nullptr);
  synchronize("test matmul");
  std::vector<float> y(static_cast<size_t>(m * rows));
  dy.download(y.data(), dy.size());
  double err = 0, norm = 0;
  for (int i = 0; i < m; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      double ref_y = 0, terms = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = static_cast<double>(w[r * cols + k]) * x[i * cols + k];
        ref_y += p;
        terms += std::abs(p);
      }
      const double got = y[i * rows + r];
      if (!std::isfinite(got)) return INFINITY;
      err += (got - ref_y) * (got - ref_y);
      norm += scale == ErrorScale::result ? ref_y * ref_y : terms * terms;
    }
  return std::sqrt(err / norm);
}

double matmul_error(const codec::TensorRef& ref, int m, std::mt19937_64& rng) {
  return matmul_error(*prepare_cuda(ref), ref, m, rng);
}

// Every codec has exactly one row in the CUDA kernel table (src/kernels/cuda/prepare.cpp), and every row names a
// codec (host only: runs without a GPU).
TEST(KernelRegistry, EveryCodecHasACudaKernelAndNoRowIsStale) {
  for (const codec::Codec& c : codec::all_codecs()) {
    int rows = 0;
    for (const CudaKernelEntry& e : cuda_kernel_table()) rows += e.codec_id == c.id;
    EXPECT_EQ(rows, 1) << "codec '" << c.id << "' needs exactly one row in src/kernels/cuda/prepare.cpp";
  }
  for (const CudaKernelEntry& e : cuda_kernel_table())
    EXPECT_NE(codec::find_codec(e.codec_id), nullptr) << "CUDA kernel row for unknown codec '" << e.codec_id << "'";
}

// The examples of every codec (tests/support/codec_examples.h, shared with the CPU kernel harness), or a failure
// naming a codec without any or without a CUDA kernel row.
struct CodecUnderTest {
  const codec::Codec& codec;
  const lowbit::testing::CodecExample& example;
  const CudaKernelEntry& kernel;
};

std::vector<CodecUnderTest> codecs_with_examples() {
  std::vector<CodecUnderTest> out;
  for (const codec::Codec& c : codec::all_codecs()) {
    const auto example = lowbit::testing::codec_examples().find(std::string(c.id));
    const auto& table = cuda_kernel_table();
    const auto kernel = std::ranges::find(table, c.id, &CudaKernelEntry::codec_id);
    if (example == lowbit::testing::codec_examples().end())
      ADD_FAILURE() << "codec '" << c.id << "' has no example params in tests/support/codec_examples.h";
    else if (kernel == table.end())
      ADD_FAILURE() << "codec '" << c.id << "' has no row in the CUDA kernel table";
    else
      out.push_back({c, example->second, *kernel});
  }
  return out;
}

// prepare_cuda of a valid tensor: the prepared weight, or nullptr when the kernel table declares the tensor
// without a CUDA kernel and prepare_cuda refused it with the table's message. Any other refusal, or a declared
// refusal that did not happen, fails.
std::unique_ptr<CudaLinear> prepare_or_declared_refusal(const CudaKernelEntry& kernel, const codec::TensorRef& ref) {
  const std::string no_kernel = kernel.no_kernel ? kernel.no_kernel(ref) : "";
  try {
    auto linear = prepare_cuda(ref);
    EXPECT_EQ(no_kernel, "") << "prepare_cuda ran a tensor the CUDA kernel table declares without a kernel";
    return linear;
  } catch (const Error& err) {
    if (no_kernel.empty())
      ADD_FAILURE() << "prepare_cuda refused a tensor the CUDA kernel table does not declare refused: " << err.what();
    EXPECT_EQ(err.code(), Errc::unsupported) << err.what();
    EXPECT_EQ(err.what(), no_kernel);
    return nullptr;
  }
}

TEST_F(CudaMatvec, AffineMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 300), cols_d(1, 1100);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128})
      for (const char* dt : {"bf16", "f16", "f32"}) {
        const int64_t rows = rows_d(rng), cols = cols_d(rng);
        const Encoded e = encode("affine", {{"bits", bits}, {"group_size", group}, {"scale_dtype", dt}}, rows, cols, rng);
        for (int m : {1, 3, 16}) {
          SCOPED_TRACE(::testing::Message() << bits << " bits, group " << group << ", " << dt << ", [" << rows << ", "
                                          << cols << "], m " << m);
          EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
        }
      }
}

TEST_F(CudaMatvec, AffineLargeAlignedShapes) {
  for (int m : {1, 2, 4, 5, 8, 16}) {
    const Encoded e = encode("affine", {{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}}, 520, 4096, rng);
    SCOPED_TRACE(::testing::Message() << "m " << m);
    EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
  }
}

// The row-chunk kernel (3/5/6 bits): rows of more chunks than a warp has lanes, aligned and odd widths (x read
// as float4 or element-wise), several rows per warp with a partial last warp, every batch width.
TEST_F(CudaMatvec, RowChunkAffineLongRowsMatchDecodeRows) {
  for (int bits : {3, 5, 6})
    for (int group : {32, 128})
      for (const int64_t cols : {int64_t{4096}, int64_t{4099}}) {
        const Encoded e =
            encode("affine", {{"bits", bits}, {"group_size", group}, {"scale_dtype", "bf16"}}, 37, cols, rng);
        for (int m : {1, 2, 5, 16}) {
          SCOPED_TRACE(::testing::Message() << bits << " bits, group " << group << ", cols " << cols << ", m " << m);
          EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
        }
      }
}

// The tensor-core kernel (2/4 bits) splits K over up to 16 warps and unrolls k-blocks: long odd rows cover
// partial unrolls, padded row tiles and every batch width.
TEST_F(CudaMatvec, AffineMmaSplitKMatchesDecodeRows) {
  for (int bits : {2, 4})
    for (int group : {32, 128}) {
      const int64_t rows = 45, cols = 9001;
      const Encoded e = encode("affine", {{"bits", bits}, {"group_size", group}, {"scale_dtype", "bf16"}}, rows, cols, rng);
      for (int m : {1, 2, 7, 8, 12}) {
        SCOPED_TRACE(::testing::Message() << bits << " bits, group " << group << ", m " << m);
        EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
      }
    }
}

// Batch 1 of 2/4 bits and, on matrices tall enough (matvec.h), batches 2..8 of 4 bits run the persistent kernel of
// affine_fma.cu: more tiles than SMs (blocks take several tiles), rows long enough to wrap the ring of
// shared-memory slots, partial tiles, units and slots, batches that fill part of their width (3 of 4, 6 of 8), and
// rows too long for the tensor-core decode's activation fragments in shared memory (batch 1 decodes them on the
// CUDA cores, wider batches run affine_mma.cu). The last two shapes are tall enough for batches 2..4 and 2..8 on
// an H200 (132 SMs).
TEST_F(CudaMatvec, AffineFmaMatchesDecodeRows) {
  struct Case {
    int64_t rows, cols;
    int group;
    const char* dt;
  };
  for (int bits : {2, 4})
    for (const Case& c : {Case{4500, 700, 128, "bf16"}, Case{300, 20001, 32, "f32"}, Case{1000, 4096, 64, "bf16"},
                         Case{40, 50000, 128, "bf16"}, Case{16000, 1500, 128, "bf16"},
                         Case{30001, 520, 64, "f32"}}) {
      const Encoded e =
          encode("affine", {{"bits", bits}, {"group_size", c.group}, {"scale_dtype", c.dt}}, c.rows, c.cols, rng);
      for (int m : {1, 2, 3, 4, 6, 8}) {
        SCOPED_TRACE(::testing::Message() << bits << " bits, group " << c.group << ", " << c.dt << " [" << c.rows
                                          << ", " << c.cols << "], m " << m);
        EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
      }
    }
}

// 4 bits at batches 2..8 on rows of at least 64 units (8192 columns): each tile's K split over 2, 4 or 8 blocks
// that add their slices' sums into y. On an H200 (132 SMs): 1400 x 8300 (group 32, f32) in 4 / 8 slices at batches
// 2 / 4 (6 and 8 run affine_mma.cu), 2700 x 8200 (group 128, bf16) in 2 / 4 / 8 at batches 2 / 4 / 8; slices of
// unequal length (9 units and a last of 2), the last unit past the row's end, batches that fill part of their
// width (3 of 4, 6 of 8).
TEST_F(CudaMatvec, AffineFmaKSplitMatchesDecodeRows) {
  for (const auto& [rows, cols, group, dt] : {std::tuple{1400, 8300, 32, "f32"}, std::tuple{2700, 8200, 128, "bf16"}}) {
    const Encoded e = encode("affine", {{"bits", 4}, {"group_size", group}, {"scale_dtype", dt}}, rows, cols, rng);
    for (int m : {2, 3, 4, 6, 8}) {
      SCOPED_TRACE(::testing::Message() << "group " << group << ", " << dt << " [" << rows << ", " << cols << "], m "
                                        << m);
      EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
    }
  }
}

// Two-plane tensors in every storage and metadata variant (slim expands at load), through the CUDA-core kernel
// (batches of up to 4 rows per launch, wider batches in slices), on shapes with partial row tiles and groups.
TEST_F(CudaMatvec, TwoPlaneMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 200), cols_d(1, 1500);
  for (const char* storage : {"planes", "quint5", "trit3"})
    for (const char* metadata : {"full", "slim"})
      for (const char* dt : {"bf16", "f16", "f32"}) {
        const int64_t rows = rows_d(rng), cols = cols_d(rng);
        const Encoded e = encode("two_plane", {{"storage", storage}, {"metadata", metadata}, {"scale_dtype", dt}},
                                 rows, cols, rng);
        for (int m : {1, 2, 3, 7, 16}) {
          SCOPED_TRACE(::testing::Message() << storage << ", " << metadata << ", " << dt << " [" << rows << ", "
                                          << cols << "], m " << m);
          EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
        }
      }
}

// The CUDA-core kernel splits K over 16 warps when rows are long: stages past a warp's first, odd k-block counts.
TEST_F(CudaMatvec, TwoPlaneLongRowsMatchDecodeRows) {
  const Encoded e = encode("two_plane", {{"storage", "planes"}}, 40, 20000, rng);
  for (int m : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
  }
}

// The affine form of an offset_scale tensor decodes to the same weights (host only: runs without a GPU).
TEST(CudaPrepare, OffsetScaleAsAffineDecodesTheSame) {
  std::mt19937_64 rng(5);
  for (const char* precision : {"q4", "q3", "q3_full8"}) {
    const Encoded e = encode("offset_scale", {{"precision", precision}}, 37, 200, rng);
    const codec::EncodedTensor affine = offset_scale_as_affine(e.ref);
    const codec::TensorRef ref{&codec::codec_or_throw("affine", "test"), affine.params, e.ref.shape, affine.views()};
    codec::validate_tensor(ref, "test");
    EXPECT_EQ(codec::decode_all(ref), codec::decode_all(e.ref)) << precision;
  }
}

// offset_scale runs through the affine kernels (bias = -offset * scale).
TEST_F(CudaMatvec, OffsetScaleMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 200), cols_d(1, 900);
  for (const char* precision : {"q4", "q3", "q3_full8"}) {
    const int64_t rows = rows_d(rng), cols = cols_d(rng);
    const Encoded e = encode("offset_scale", {{"precision", precision}}, rows, cols, rng);
    for (int m : {1, 5, 16}) {
      SCOPED_TRACE(::testing::Message() << precision << " [" << rows << ", " << cols << "], m " << m);
      EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
    }
  }
}

TEST_F(CudaMatvec, DenseMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 200), cols_d(1, 700);
  for (const char* dt : {"bf16", "f16", "f32"})
    for (int m : {1, 2, 7, 16}) {
      const int64_t rows = rows_d(rng), cols = cols_d(rng);
      const Encoded e = encode("dense", {{"dtype", dt}}, rows, cols, rng);
      SCOPED_TRACE(::testing::Message() << dt << " [" << rows << ", " << cols << "], m " << m);
      EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
    }
}

TEST_F(CudaMatvec, TrellisMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 100), cols_d(1, 600);
  for (int k : {2, 3, 4})
    for (int L : {12, 16})
      for (const char* code : {"1mad", "3inst"}) {
        const int64_t rows = rows_d(rng), cols = cols_d(rng);
        const codec::Params params{{"L", L}, {"k", k}, {"code", code}, {"rotate", "none"}};
        const auto t = lowbit::testing::random_tensor("trellis", params, rows, cols, rng, 0.5f);
        for (int m : {1, 4, 9}) {
          SCOPED_TRACE(::testing::Message() << "k " << k << " L " << L << " " << code << " [" << rows << ", " << cols
                                          << "], m " << m);
          EXPECT_LT(matmul_error(t.ref, m, rng), 1e-4);
        }
      }
}

// Tall trellis matrices (512 or more 16-row tiles): batch 1 runs the CUDA-core kernel (trellis_fma.cu), other
// batches the tensor-core kernel with several tile rows per block; odd widths take the partial-chunk paths.
// k = 4 (an 80-bit window per tile row) also at L 12.
TEST_F(CudaMatvec, TallTrellisMatchesDecodeRows) {
  for (const auto& [k, L] : {std::pair{2, 16}, std::pair{3, 16}, std::pair{4, 12}, std::pair{4, 16}})
    for (const char* code : {"1mad", "3inst"})
      for (const int64_t cols : {int64_t{130}, int64_t{257}}) {
        const int64_t rows = 8200 + 17 * k;
        const codec::Params params{{"L", L}, {"k", k}, {"code", code}, {"rotate", "none"}};
        const auto t = lowbit::testing::random_tensor("trellis", params, rows, cols, rng, 0.5f);
        for (int m : {1, 3, 16}) {
          SCOPED_TRACE(::testing::Message() << "k " << k << " L " << L << " " << code << " [" << rows << ", " << cols
                                            << "], m " << m);
          EXPECT_LT(matmul_error(t.ref, m, rng), 1e-4);
        }
      }
}

// Rotated trellis tensors: activations rotated by R_in (and outputs by R_out^T) on the device, sizes with a
// Paley small factor included.
TEST_F(CudaMatvec, TrellisRotatedMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 120), cols_d(1, 700);
  for (const char* rotate : {"input", "both"})
    for (int k : {2, 3, 4}) {
      const int64_t rows = rows_d(rng), cols = cols_d(rng);
      codec::Params params{{"L", 12}, {"k", k}, {"code", "1mad"}, {"rotate", rotate}, {"input_seed", 11}};
      if (std::string(rotate) == "both") params["output_seed"] = 12;
      const auto t = lowbit::testing::random_tensor("trellis", params, rows, cols, rng, 0.5f);
      for (int m : {1, 6, 16}) {
        SCOPED_TRACE(::testing::Message() << "rotate " << rotate << " k " << k << " [" << rows << ", " << cols
                                          << "], m " << m);
        EXPECT_LT(matmul_error(t.ref, m, rng), 1e-4);
      }
    }
}

// Trellis prefill GEMM (trellis_gemm.cu, m > kMaxBatch): every k, L and code, each rotation on a third of them,
// row counts with partial 256-row blocks and 64-row token blocks, odd widths (partial chunks, scalar copies of x).
TEST_F(CudaMatvec, TrellisGemmMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 600), cols_d(1, 700);
  const char* rotations[] = {"none", "input", "both"};
  int combo = 0;
  for (int k : {2, 3, 4})
    for (int L : {12, 16})
      for (const char* code : {"1mad", "3inst"}) {
        const char* rotate = rotations[combo++ % 3];
        const int64_t rows = rows_d(rng), cols = cols_d(rng);
        codec::Params params{{"L", L}, {"k", k}, {"code", code}, {"rotate", rotate}};
        if (std::string(rotate) != "none") params["input_seed"] = 5;
        if (std::string(rotate) == "both") params["output_seed"] = 6;
        const auto t = lowbit::testing::random_tensor("trellis", params, rows, cols, rng, 0.5f);
        for (int m : {17, 40, 64, 130, 257}) {
          SCOPED_TRACE(::testing::Message() << "k " << k << " L " << L << " " << code << " rotate " << rotate << " ["
                                            << rows << ", " << cols << "], m " << m);
          EXPECT_LT(matmul_error(t.ref, m, rng), 1e-4);
        }
      }
}

// Long rows split K over a cluster of blocks (up to 8, uneven shares); rotated gemm runs in chunks of 512 rows
// through the shared scratch, a last chunk of up to 16 rows through the decode kernel.
TEST_F(CudaMatvec, TrellisGemmSplitAndChunksMatchDecodeRows) {
  for (const char* code : {"1mad", "3inst"}) {
    const codec::Params plain{{"L", 16}, {"k", 3}, {"code", code}, {"rotate", "none"}};
    const auto t = lowbit::testing::random_tensor("trellis", plain, 300, 2100, rng, 0.5f);
    for (int m : {20, 64, 200}) {
      SCOPED_TRACE(::testing::Message() << code << " [300, 2100], m " << m);
      EXPECT_LT(matmul_error(t.ref, m, rng), 1e-4);
    }
    const codec::Params rotated{{"L", 12}, {"k", 2}, {"code", code}, {"rotate", "both"}, {"input_seed", 7},
                                {"output_seed", 8}};
    const auto r = lowbit::testing::random_tensor("trellis", rotated, 50, 100, rng, 0.5f);
    SCOPED_TRACE(::testing::Message() << code << " rotated [50, 100], m 520");
    EXPECT_LT(matmul_error(r.ref, 520, rng), 1e-4);
  }
}

// gemm (prefill) takes any number of rows, for every codec's example params: batches past kMaxBatch, with a
// partial last chunk, on more rows than one 64-row tile. Errors relative to the terms' scale, one bound for every
// codec (the kernels' own tests above and below bound them relative to y_ref).
TEST_F(CudaMatvec, GemmMatchesDecodeRowsForEveryCodec) {
  for (const CodecUnderTest& t : codecs_with_examples())
    for (const codec::Params& params : t.example.params) {
      SCOPED_TRACE(::testing::Message() << t.codec.id << " " << params.dump() << " [77, 300]");
      const Encoded e = encode(std::string(t.codec.id), params, 77, 300, rng);
      const auto linear = prepare_or_declared_refusal(t.kernel, e.ref);
      if (!linear) continue;  // declared and refused, checked above
      for (int m : {17, 40}) EXPECT_LT(matmul_error(*linear, e.ref, m, rng, ErrorScale::terms), 2e-5) << "m " << m;
    }
}

// Every codec over its examples (every param set, every example width, a few row counts), at batch 1, decode
// batches up to kMaxBatch and prefill rows past it. Errors relative to the terms' scale (one row of a few columns
// cancels), one bound for every codec; RecordProperty keeps each codec's worst error in the XML report.
TEST_F(CudaMatvec, EveryCodecExampleMatchesDecodeRows) {
  for (const CodecUnderTest& t : codecs_with_examples()) {
    double worst = 0;
    for (const codec::Params& params : t.example.params)
      for (const int64_t cols : t.example.widths)
        for (const int64_t rows : {int64_t{1}, int64_t{3}, int64_t{37}}) {
          SCOPED_TRACE(::testing::Message()
                       << t.codec.id << " " << params.dump() << " [" << rows << ", " << cols << "]");
          const Encoded e = encode(std::string(t.codec.id), params, rows, cols, rng);
          const auto linear = prepare_or_declared_refusal(t.kernel, e.ref);
          if (!linear) continue;  // declared and refused, checked above
          for (int m : {1, 3, 12, 17, 40}) {
            const double err = matmul_error(*linear, e.ref, m, rng, ErrorScale::terms);
            EXPECT_LT(err, 2e-5) << "m " << m;
            worst = std::max(worst, err);
          }
        }
    RecordProperty("worst_error_" + std::string(t.codec.id), fmt::format("{:.3g}", worst));
  }
}

// The tensor-core prefill GEMM (affine_gemm.cu) of affine 2/4 bits and two-plane: partial row and token tiles
// (m not a multiple of the 64-token tile), odd widths (x copied a float at a time), every group and meta type.
TEST_F(CudaMatvec, AffineGemmMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 300), cols_d(1, 1100);
  for (int bits : {2, 4})
    for (int group : {32, 64, 128})
      for (const char* dt : {"bf16", "f16", "f32"}) {
        const int64_t rows = rows_d(rng), cols = cols_d(rng);
        const Encoded e = encode("affine", {{"bits", bits}, {"group_size", group}, {"scale_dtype", dt}}, rows, cols, rng);
        for (int m : {17, 64, 257}) {
          SCOPED_TRACE(::testing::Message() << bits << " bits, group " << group << ", " << dt << ", [" << rows << ", "
                                            << cols << "], m " << m);
          EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
        }
      }
}

// Long rows split K over a cluster of blocks (shares of whole groups, the last one shorter); tall
// matrices take many row blocks.
TEST_F(CudaMatvec, AffineGemmSplitKMatchesDecodeRows) {
  struct Case {
    int64_t rows, cols;
    int bits, group;
  };
  for (const Case& c : {Case{200, 9001, 4, 128}, Case{130, 20000, 2, 32}, Case{1000, 4096, 4, 64}, Case{3000, 700, 2, 128}})
    for (int m : {17, 65, 190}) {
      const Encoded e =
          encode("affine", {{"bits", c.bits}, {"group_size", c.group}, {"scale_dtype", "bf16"}}, c.rows, c.cols, rng);
      SCOPED_TRACE(::testing::Message() << c.bits << " bits, group " << c.group << " [" << c.rows << ", " << c.cols
                                        << "], m " << m);
      EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
    }
}

// Two-plane runs the GEMM once per plane (the residual's pass adds to the base's); offset_scale q4 as its affine form.
TEST_F(CudaMatvec, TwoPlaneAndOffsetScaleGemmMatchDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 300), cols_d(1, 2000);
  for (const char* storage : {"planes", "trit3"})
    for (const char* dt : {"bf16", "f32"}) {
      const int64_t rows = rows_d(rng), cols = cols_d(rng);
      const Encoded e = encode("two_plane", {{"storage", storage}, {"scale_dtype", dt}}, rows, cols, rng);
      for (int m : {17, 70}) {
        SCOPED_TRACE(::testing::Message() << storage << ", " << dt << " [" << rows << ", " << cols << "], m " << m);
        EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
      }
    }
  const Encoded e = encode("offset_scale", {{"precision", "q4"}}, 150, 1000, rng);
  SCOPED_TRACE("offset_scale q4, m 99");
  EXPECT_LT(matmul_error(e.ref, 99, rng), 2e-5);
}

// The tile GEMM (tile_gemm.cu) of dense bf16 and affine 3/5/6/8 bits, decoded into shared memory: partial row and
// token tiles, odd widths (x copied a float at a time, partial coalesced steps and bit-stream chunks), every group and
// meta type.
TEST_F(CudaMatvec, TileGemmMatchesDecodeRows) {
  std::uniform_int_distribution<int64_t> rows_d(1, 300), cols_d(1, 1100);
  std::vector<std::pair<std::string, codec::Params>> cases = {{"dense", {{"dtype", "bf16"}}}};
  for (int bits : {3, 5, 6, 8})
    for (int group : {32, 64, 128})
      for (const char* dt : {"bf16", "f16", "f32"})
        cases.push_back({"affine", {{"bits", bits}, {"group_size", group}, {"scale_dtype", dt}}});
  for (const auto& [id, params] : cases) {
    const int64_t rows = rows_d(rng), cols = cols_d(rng);
    const Encoded e = encode(id, params, rows, cols, rng);
    for (int m : {17, 40, 64, 130, 257}) {
      SCOPED_TRACE(::testing::Message() << id << " " << params.dump() << " [" << rows << ", " << cols << "], m " << m);
      EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
    }
  }
}

// Long rows split K over a cluster of blocks (shares of whole groups of up to 2 stages, the last share
// shorter); tall matrices take many row blocks; offset_scale q3 as its 3-bit affine form.
TEST_F(CudaMatvec, TileGemmSplitKMatchesDecodeRows) {
  struct Case {
    std::string id;
    codec::Params params;
    int64_t rows, cols;
  };
  const std::vector<Case> cases = {
      {"dense", {{"dtype", "bf16"}}, 200, 9001},
      {"affine", {{"bits", 8}, {"group_size", 32}, {"scale_dtype", "bf16"}}, 130, 20000},
      {"affine", {{"bits", 3}, {"group_size", 128}, {"scale_dtype", "bf16"}}, 1000, 4096},
      {"affine", {{"bits", 5}, {"group_size", 128}, {"scale_dtype", "f32"}}, 64, 12345},
      {"affine", {{"bits", 6}, {"group_size", 64}, {"scale_dtype", "bf16"}}, 3000, 700},
      {"offset_scale", {{"precision", "q3"}}, 150, 3000},
  };
  for (const Case& c : cases)
    for (int m : {17, 65, 190}) {
      const Encoded e = encode(c.id, c.params, c.rows, c.cols, rng);
      SCOPED_TRACE(::testing::Message() << c.id << " " << c.params.dump() << " [" << c.rows << ", " << c.cols
                                        << "], m " << m);
      EXPECT_LT(matmul_error(e.ref, m, rng), 2e-5);
    }
}

TEST_F(CudaMatvec, RejectsBatchOutsideRange) {
  const Encoded e = encode("dense", {{"dtype", "bf16"}}, 8, 64, rng);
  const auto linear = prepare_cuda(e.ref);
  DeviceBuffer dx(64 * sizeof(float) * (kMaxBatch + 1)), dy(8 * sizeof(float) * (kMaxBatch + 1));
  for (int m : {0, kMaxBatch + 1}) {
    try {
      linear->matmul(dx.as<const float>(), m, dy.as<float>(), nullptr);
      ADD_FAILURE() << "batch " << m << " accepted";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), Errc::limit);
    }
  }
}

// Every affine width has a kernel; trellis k = 1 (a 1-bit state step) has none.
TEST_F(CudaMatvec, RejectsTrellisStepWithoutKernel) {
  const codec::Params params{{"L", 12}, {"k", 1}, {"code", "1mad"}, {"rotate", "none"}};
  const auto t = lowbit::testing::random_tensor("trellis", params, 16, 64, rng, 0.5f);
  try {
    prepare_cuda(t.ref);
    ADD_FAILURE() << "trellis k 1 accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::unsupported);
  }
}

// Grouped expert matmuls (CudaExperts) against fp64 x @ decode(W_e)^T per group: 6 experts, groups written to
// device memory as the router kernel writes them (expert ids out of order, one expert twice, groups past the last
// with count 0 whose rows stay poisoned), rows per group up to the batch, x rows contiguous or read through a row
// map (x_rows, as the MoE gate/up reads the routed rows), for every layout with a grouped kernel: dense f32 / f16
// (row-chunk), dense bf16 and affine 8 (coalesced), affine 2 / 4 (tensor cores).
TEST_F(CudaMatvec, GroupedExpertsMatchDecodeRows) {
  constexpr int kExperts = 6;
  const std::vector<std::pair<std::string, codec::Params>> codecs = {
      {"dense", {{"dtype", "f32"}}},
      {"dense", {{"dtype", "f16"}}},
      {"dense", {{"dtype", "bf16"}}},
      {"affine", {{"bits", 8}, {"group_size", 64}, {"scale_dtype", "bf16"}}},
      {"affine", {{"bits", 4}, {"group_size", 64}, {"scale_dtype", "bf16"}}},
      {"affine", {{"bits", 4}, {"group_size", 128}, {"scale_dtype", "f32"}}},
      {"affine", {{"bits", 2}, {"group_size", 32}, {"scale_dtype", "f16"}}},
  };
  // (expert, rows) per group; max_groups = the list's size (the trailing zeros are empty groups).
  const std::vector<std::vector<std::pair<int, int>>> layouts = {
      {{3, 1}, {0, 0}},
      {{5, 2}, {1, 3}, {2, 1}, {0, 0}, {0, 0}},
      {{4, 16}, {0, 9}, {4, 16}, {0, 0}},
  };
  for (const auto& [id, params] : codecs)
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{96, 256}, {200, 700}}) {
      std::vector<Encoded> experts;
      std::vector<std::unique_ptr<CudaLinear>> prepared;
      for (int e = 0; e < kExperts; ++e) {
        experts.push_back(encode(id, params, rows, cols, rng));
        prepared.push_back(prepare_cuda(experts.back().ref));
      }
      const CudaExperts grouped(std::move(prepared), "test experts");
      for (const auto& groups : layouts)
        for (const bool mapped : {false, true}) {
          std::vector<int32_t> expert, start, count;
          int total = 0, batch = 1;
          for (const auto& [e, n] : groups) {
            expert.push_back(e);
            start.push_back(total);
            count.push_back(n);
            total += n;
            batch = std::max(batch, n);
          }
          SCOPED_TRACE(::testing::Message() << id << " " << params.dump() << " [" << rows << ", " << cols << "], "
                                            << groups.size() << " groups, batch " << batch << ", mapped " << mapped);
          // Mapped: group row i reads x row x_rows[i] of 5 source rows (repeats allowed, as rows choosing experts).
          const int x_count = mapped ? 5 : total;
          std::vector<int32_t> x_rows(static_cast<size_t>(std::max(total, 1)));
          for (int i = 0; i < total; ++i) x_rows[static_cast<size_t>(i)] = mapped ? (3 * i + 1) % x_count : i;
          const std::vector<float> x = random_normal(static_cast<size_t>(x_count * cols), rng);
          const size_t y_rows = static_cast<size_t>(total + 1);  // one row past the groups: must stay untouched
          DeviceBuffer dx(x.size() * 4), dy(y_rows * rows * 4), de(expert.size() * 4), ds(start.size() * 4),
              dc(count.size() * 4), dm(x_rows.size() * 4);
          dx.upload(x.data(), dx.size());
          dm.upload(x_rows.data(), dm.size());
          de.upload(expert.data(), de.size());
          ds.upload(start.data(), ds.size());
          dc.upload(count.data(), dc.size());
          dy.fill(0xFF);
          grouped.grouped_matmul(dx.as<const float>(),
                                 {de.as<const int32_t>(), ds.as<const int32_t>(), dc.as<const int32_t>(),
                                  static_cast<int>(groups.size()), mapped ? dm.as<const int32_t>() : nullptr},
                                 batch, dy.as<float>(), nullptr);
          synchronize("test grouped matmul");
          std::vector<float> y(y_rows * rows);
          dy.download(y.data(), dy.size());
          double err = 0, norm = 0;
          for (size_t g = 0; g < groups.size(); ++g) {
            const std::vector<float> w = codec::decode_all(experts[static_cast<size_t>(expert[g])].ref);
            for (int i = start[g]; i < start[g] + count[g]; ++i)
              for (int64_t r = 0; r < rows; ++r) {
                double want = 0;
                const int64_t xi = x_rows[static_cast<size_t>(i)];
                for (int64_t k = 0; k < cols; ++k) want += static_cast<double>(w[r * cols + k]) * x[xi * cols + k];
                const double got = y[static_cast<size_t>(i * rows + r)];
                err += std::isfinite(got) ? (got - want) * (got - want) : INFINITY;
                norm += want * want;
              }
          }
          EXPECT_LT(std::sqrt(err / norm), 2e-5);
          for (int64_t r = 0; r < rows; ++r) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(total * rows + r)]));
        }
    }
}

// Experts in a layout without a grouped kernel, or stored unlike each other, are refused (Errc::unsupported).
TEST_F(CudaMatvec, GroupedExpertsRejectLayoutsWithoutKernel) {
  const auto refused = [](std::vector<std::unique_ptr<CudaLinear>> experts) {
    try {
      CudaExperts grouped(std::move(experts), "test experts");
      return false;
    } catch (const Error& err) {
      return err.code() == Errc::unsupported;
    }
  };
  const codec::Params trellis{{"L", 16}, {"k", 2}, {"code", "1mad"}, {"rotate", "none"}};
  std::vector<std::unique_ptr<CudaLinear>> t;
  t.push_back(prepare_cuda(lowbit::testing::random_tensor("trellis", trellis, 32, 256, rng, 0.5f).ref));
  EXPECT_TRUE(refused(std::move(t)));
  std::vector<std::unique_ptr<CudaLinear>> three;
  three.push_back(
      prepare_cuda(encode("affine", {{"bits", 3}, {"group_size", 64}, {"scale_dtype", "bf16"}}, 32, 256, rng).ref));
  EXPECT_TRUE(refused(std::move(three)));
  std::vector<std::unique_ptr<CudaLinear>> mixed;
  mixed.push_back(prepare_cuda(encode("dense", {{"dtype", "f32"}}, 32, 256, rng).ref));
  mixed.push_back(prepare_cuda(encode("dense", {{"dtype", "f32"}}, 32, 320, rng).ref));
  EXPECT_TRUE(refused(std::move(mixed)));
}

}  // namespace
}  // namespace lowbit::kernels::cuda
