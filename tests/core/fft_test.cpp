// Fft against the direct transform (long double sums) on random input, lengths with small, large and prime factors.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>

#include "lowbit/core/error.h"
#include "lowbit/core/fft.h"

namespace lowbit {
namespace {

TEST(Fft, MatchesTheDirectTransform) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  for (size_t n : {1, 2, 3, 4, 5, 7, 12, 16, 25, 97, 400, 512, 1000}) {
    std::vector<std::complex<double>> x(n);
    for (auto& v : x) v = {normal(rng), normal(rng)};
    std::vector<std::complex<double>> got = x;
    Fft(n).forward(got);
    double diff = 0, scale = 0;
    for (size_t k = 0; k < n; ++k) {
      long double re = 0, im = 0;
      for (size_t t = 0; t < n; ++t) {
        const long double a =
            -2 * std::numbers::pi_v<long double> * static_cast<long double>(k * t % n) / static_cast<long double>(n);
        re += x[t].real() * std::cos(a) - x[t].imag() * std::sin(a);
        im += x[t].real() * std::sin(a) + x[t].imag() * std::cos(a);
      }
      diff = std::max(diff, std::abs(got[k] - std::complex<double>(static_cast<double>(re), static_cast<double>(im))));
      scale = std::max(scale, std::hypot(static_cast<double>(re), static_cast<double>(im)));
    }
    EXPECT_LT(diff / scale, 1e-13) << "length " << n;
  }
}

TEST(Fft, RejectsAnotherLength) {
  std::vector<std::complex<double>> x(5);
  EXPECT_THROW(Fft(4).forward(x), Error);
  EXPECT_THROW(Fft(0), Error);
}

}  // namespace
}  // namespace lowbit
