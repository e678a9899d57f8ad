#include "lowbit/core/fft.h"

#include <cmath>
#include <numbers>

#include "lowbit/core/error.h"

namespace lowbit {

namespace {

size_t smallest_factor(size_t n) {
  for (size_t p = 2; p * p <= n; ++p)
    if (n % p == 0) return p;
  return n;
}

}  // namespace

Fft::Fft(size_t n) : roots_(n) {
  if (n == 0) fail(Errc::shape, "[Fft] length 0");
  for (size_t j = 0; j < n; ++j)
    roots_[j] = std::polar(1.0, -2 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n));
}

void Fft::forward(std::span<std::complex<double>> x) const {
  if (x.size() != size()) fail(Errc::shape, "[Fft] {} values for a transform of length {}", x.size(), size());
  const std::vector<std::complex<double>> in(x.begin(), x.end());
  transform(in.data(), 1, x.data(), x.size());
}

// out[0, n) = the DFT of in[0], in[stride], ..., in[(n - 1) * stride]: the DFTs of the p decimated sequences of
// length m = n / p (p the smallest factor of n), then for each k < m the p outputs k + q * m from the p values
// at r * m + k, twiddled by exp(-2 pi i r (k + q m) / n).
void Fft::transform(const std::complex<double>* in, size_t stride, std::complex<double>* out, size_t n) const {
  if (n == 1) {
    out[0] = in[0];
    return;
  }
  const size_t p = smallest_factor(n), m = n / p, step = size() / n;  // roots of n: every step-th of size()
  for (size_t r = 0; r < p; ++r) transform(in + r * stride, stride * p, out + r * m, m);
  std::vector<std::complex<double>> v(p);
  for (size_t k = 0; k < m; ++k) {
    for (size_t r = 0; r < p; ++r) v[r] = out[r * m + k];
    for (size_t q = 0; q < p; ++q) {
      std::complex<double> sum = 0;
      const size_t e = k + q * m;
      for (size_t r = 0; r < p; ++r) sum += roots_[(r * e % n) * step] * v[r];
      out[e] = sum;
    }
  }
}

}  // namespace lowbit
