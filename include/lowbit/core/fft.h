// A mixed-radix discrete Fourier transform of any length (the log-mel front end's n_fft 400 = 2^4 * 5^2): recursive
// decimation in time over the length's prime factors, one table of the length's roots of unity. A prime length
// (or prime factor) is transformed directly, so the cost is O(n * sum of n's prime factors).
#pragma once

#include <complex>
#include <cstddef>
#include <span>
#include <vector>

namespace lowbit {

class Fft {
 public:
  explicit Fft(size_t n);  // n >= 1
  size_t size() const { return roots_.size(); }
  // X[k] = sum_t x[t] exp(-2 pi i k t / n), in place; x.size() must be size().
  void forward(std::span<std::complex<double>> x) const;

 private:
  void transform(const std::complex<double>* in, size_t stride, std::complex<double>* out, size_t n) const;
  std::vector<std::complex<double>> roots_;  // exp(-2 pi i j / n)
};

}  // namespace lowbit
