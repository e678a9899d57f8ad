#include "lowbit/codec/hadamard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "lowbit/core/error.h"

namespace lowbit::codec::hadamard {
namespace {

TEST(Hadamard, SmallMatricesAreHadamard) {
  int checked = 0;
  for (int64_t m = 1; m <= 256; ++m) {
    if (small_factor(m) != m) continue;  // only the sizes used as small factors
    const std::vector<int8_t> h = small_matrix(m);
    ASSERT_EQ(h.size(), static_cast<size_t>(m * m));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        int dot = 0;
        for (int64_t c = 0; c < m; ++c) dot += h[i * m + c] * h[j * m + c];
        ASSERT_EQ(dot, i == j ? m : 0) << "m = " << m << " rows " << i << ", " << j;
      }
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(Hadamard, SizesAndFactors) {
  EXPECT_EQ(small_factor(4096), 1);
  EXPECT_EQ(small_factor(24), 12);     // 2 x Paley I (q = 11)
  EXPECT_EQ(small_factor(14336), 28);  // 512 x Paley II (q = 13)
  EXPECT_EQ(small_factor(5120), 20);
  EXPECT_EQ(small_factor(176), 44);
  EXPECT_EQ(small_factor(172), 0);  // 4 x 43: no Paley matrix of 172
  EXPECT_EQ(small_factor(100), 0);  // 4 x 25: 100 = q + 1 with q = 99 not prime, 2 (q + 1) with q = 49 not prime
  EXPECT_EQ(padded_size(172, 16), 176);
  EXPECT_EQ(padded_size(64, 16), 64);
  EXPECT_EQ(padded_size(1, 16), 16);
  EXPECT_EQ(padded_size(11008, 16), 11264);
  for (int64_t n = 16; n <= 4096; n += 16) {
    const int64_t p = padded_size(n, 16);
    EXPECT_TRUE(is_supported(p));
    EXPECT_EQ(p % 16, 0);
    EXPECT_LT(p, n * 9 / 8 + 16) << n;  // padding stays small
  }
}

TEST(Hadamard, ForwardIsTheOrthogonalMatrixHDOverSqrtN) {
  for (int64_t n : {16, 24, 48, 80}) {
    const RandomizedHadamard rh(n, 7);
    const int64_t m = small_factor(n);
    const std::vector<int8_t> hm = small_matrix(m);
    // Column j of R: forward of the unit vector e_j must equal H[:, j] d_j / sqrt(n), H = H_pow2 (x) H_m.
    for (int64_t j = 0; j < n; ++j) {
      std::vector<float> e(static_cast<size_t>(n), 0.0f);
      e[j] = 1.0f;
      rh.forward(e.data());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t ih = i / m, il = i % m, jh = j / m, jl = j % m;
        const int sylvester = (__builtin_popcountll(static_cast<uint64_t>(ih & jh)) & 1) ? -1 : 1;
        const double expect = sylvester * hm[il * m + jl] * random_sign(7, j) / std::sqrt(double(n));
        ASSERT_NEAR(e[i], expect, 1e-6) << "n " << n << " (" << i << ", " << j << ")";
      }
    }
  }
}

TEST(Hadamard, InverseUndoesForwardAndNormIsKept) {
  std::mt19937 rng(3);
  std::normal_distribution<float> gauss;
  for (int64_t n : {16, 176, 320, 1024}) {
    const RandomizedHadamard rh(n, 11);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = gauss(rng);
    std::vector<float> y = x;
    rh.forward(y.data());
    double nx = 0, ny = 0;
    for (int64_t i = 0; i < n; ++i) nx += x[i] * x[i], ny += y[i] * y[i];
    EXPECT_NEAR(ny / nx, 1.0, 1e-5);
    rh.inverse(y.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], x[i], 1e-5);
  }
}

TEST(Hadamard, SignsDependOnTheSeed) {
  int differ = 0;
  for (uint64_t i = 0; i < 256; ++i) differ += random_sign(1, i) != random_sign(2, i);
  EXPECT_GT(differ, 90);
  EXPECT_LT(differ, 166);
}

TEST(Hadamard, SignGoldenVectors) {
  // Bit 63 of splitmix64(splitmix64(seed) + i), computed independently (Python, 64-bit wrapping arithmetic).
  const std::pair<uint64_t, const char*> golden[] = {{0, "-+--++-+----+-++"}, {42, "+-++-------+++-+"}};
  for (const auto& [seed, signs] : golden)
    for (uint64_t i = 0; i < 16; ++i) EXPECT_EQ(random_sign(seed, i), signs[i] == '-' ? -1.0f : 1.0f) << seed << " " << i;
}

TEST(Hadamard, UnsupportedSizeIsRejected) {
  try {
    RandomizedHadamard(172, 0);
    FAIL() << "172 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::shape);
  }
}

}  // namespace
}  // namespace lowbit::codec::hadamard
