#include "lowbit/codec/hadamard.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "lowbit/core/error.h"

namespace lowbit::codec::hadamard {

namespace {

constexpr int64_t kMaxSmall = 256;

bool is_prime(int64_t q) {
  if (q < 2) return false;
  for (int64_t d = 2; d * d <= q; ++d)
    if (q % d == 0) return false;
  return true;
}

bool is_pow2(int64_t n) { return n > 0 && std::has_single_bit(static_cast<uint64_t>(n)); }

// Which Paley construction builds an m x m Hadamard matrix: 1 or 2, or 0 for none.
int paley_kind(int64_t m) {
  if (m < 4 || m > kMaxSmall || is_pow2(m)) return 0;
  if (is_prime(m - 1) && (m - 1) % 4 == 3) return 1;
  if (m % 2 == 0 && is_prime(m / 2 - 1) && (m / 2 - 1) % 4 == 1) return 2;
  return 0;
}

// Quadratic character of a mod q (q an odd prime): 0, +1 or -1.
int chi(int64_t a, int64_t q) {
  a = ((a % q) + q) % q;
  if (a == 0) return 0;
  for (int64_t x = 1; x < q; ++x)
    if (x * x % q == a) return 1;
  return -1;
}

// Paley I: H = I + S, S = [[0, 1^T], [-1, Q]], Q[i][j] = chi(j - i) over GF(q), size q + 1.
std::vector<int8_t> paley1(int64_t q) {
  const int64_t m = q + 1;
  std::vector<int8_t> h(static_cast<size_t>(m * m));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) {
      int s;
      if (i == 0) s = j == 0 ? 0 : 1;
      else if (j == 0) s = -1;
      else s = chi(j - i, q);
      h[static_cast<size_t>(i * m + j)] = static_cast<int8_t>(s + (i == j ? 1 : 0));
    }
  return h;
}

// Paley II: the symmetric conference matrix C = [[0, 1^T], [1, Q]] of size q + 1 with each 0 replaced by
// [[1, -1], [-1, -1]] and each +-1 by +-[[1, 1], [1, -1]]; size 2 (q + 1).
std::vector<int8_t> paley2(int64_t q) {
  const int64_t c = q + 1, m = 2 * c;
  std::vector<int8_t> h(static_cast<size_t>(m * m));
  for (int64_t i = 0; i < c; ++i)
    for (int64_t j = 0; j < c; ++j) {
      const int e = (i == 0 || j == 0) ? (i == j ? 0 : 1) : chi(j - i, q);
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          const int v = e == 0 ? ((a == 0 && b == 0) ? 1 : -1) : e * ((a == 1 && b == 1) ? -1 : 1);
          h[static_cast<size_t>((2 * i + a) * m + 2 * j + b)] = static_cast<int8_t>(v);
        }
    }
  return h;
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t small_factor(int64_t n) {
  if (n <= 0) return 0;
  if (is_pow2(n)) return 1;
  for (int64_t m = 4; m <= std::min(n, kMaxSmall); m += 4)
    if (n % m == 0 && is_pow2(n / m) && paley_kind(m) != 0) return m;
  return 0;
}

bool is_supported(int64_t n) { return small_factor(n) != 0; }

int64_t padded_size(int64_t width, int64_t multiple) {
  if (width < 0 || !is_pow2(multiple)) fail(Errc::internal, "[hadamard] bad padded_size({}, {})", width, multiple);
  int64_t n = std::max<int64_t>((width + multiple - 1) / multiple * multiple, multiple);
  while (!is_supported(n)) n += multiple;  // terminates: every power of two is supported
  return n;
}

std::vector<int8_t> small_matrix(int64_t m) {
  if (m == 1) return {1};
  switch (paley_kind(m)) {
    case 1: return paley1(m - 1);
    case 2: return paley2(m / 2 - 1);
    default: fail(Errc::internal, "[hadamard] no small Hadamard matrix of size {}", m);
  }
}

float random_sign(uint64_t seed, uint64_t i) { return (splitmix64(splitmix64(seed) + i) >> 63) ? -1.0f : 1.0f; }

RandomizedHadamard::RandomizedHadamard(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  m_ = small_factor(n);
  if (m_ == 0) fail(Errc::shape, "[hadamard] size {} has no supported Hadamard matrix", n);
  small_ = small_matrix(m_);
  small_t_.resize(small_.size());
  for (int64_t i = 0; i < m_; ++i)
    for (int64_t j = 0; j < m_; ++j)
      small_t_[static_cast<size_t>(j * m_ + i)] = small_[static_cast<size_t>(i * m_ + j)];
  signs_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) signs_[static_cast<size_t>(i)] = random_sign(seed, static_cast<uint64_t>(i));
  norm_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
}

void RandomizedHadamard::apply_h(float* x, bool transpose) const {
  const int64_t chunks = n_ / m_;
  if (m_ > 1) {
    // (H v)_i = sum_j v_j H[i][j] = sum_j v_j H^T[j][i]: with j outside, the inner loop runs along a row of H^T
    // (of H for the transpose) and vectorizes; each sum still adds its terms in order j = 0 .. m - 1.
    const std::vector<int8_t>& by_j = transpose ? small_ : small_t_;
    float tmp[kMaxSmall];
    for (int64_t c = 0; c < chunks; ++c) {
      float* v = x + c * m_;
      std::fill_n(tmp, m_, 0.0f);
      for (int64_t j = 0; j < m_; ++j) {
        const int8_t* h = by_j.data() + j * m_;
        const float vj = v[j];
        for (int64_t i = 0; i < m_; ++i) tmp[i] += vj * static_cast<float>(h[i]);
      }
      std::copy_n(tmp, m_, v);
    }
  }
  // Sylvester factor (symmetric): butterflies between chunks of m.
  for (int64_t h = 1; h < chunks; h *= 2)
    for (int64_t base = 0; base < chunks; base += 2 * h)
      for (int64_t c = base; c < base + h; ++c) {
        float* a = x + c * m_;
        float* b = x + (c + h) * m_;
        for (int64_t i = 0; i < m_; ++i) {
          const float u = a[i], w = b[i];
          a[i] = u + w;
          b[i] = u - w;
        }
      }
}

void RandomizedHadamard::forward(float* x) const {
  for (int64_t i = 0; i < n_; ++i) x[i] *= signs_[static_cast<size_t>(i)];
  apply_h(x, false);
  for (int64_t i = 0; i < n_; ++i) x[i] *= norm_;
}

void RandomizedHadamard::inverse(float* x) const {
  apply_h(x, true);
  for (int64_t i = 0; i < n_; ++i) x[i] *= norm_ * signs_[static_cast<size_t>(i)];
}

}  // namespace lowbit::codec::hadamard
