// Randomized Hadamard transforms (incoherence processing): R = H D / sqrt(n), with D a diagonal of random
// signs drawn from a seed and H an n x n Hadamard matrix. R is orthogonal, so W x = (W R^T)(R x): a weight is
// stored as W R^T and activations are rotated by R at run time. The trellis codec applies it to the input side
// of a weight (optionally also the output side); the quantizer reuses it for the model's rotation fold.
//
// Sizes: n = 2^a * m with m = 1 (Sylvester) or m a Paley-constructible size (Paley I: m = q + 1, q prime,
// q = 3 mod 4; Paley II: m = 2 (q + 1), q prime, q = 1 mod 4; Paley I preferred when both apply), m <= 256 and
// not a power of two. m is the smallest such size with n / m a power of two, and H = H_{2^a} (x) H_m
// (Kronecker: index i = i_hi * m + i_lo). Widths without such a factorization are zero-padded to the next
// supported size (padded_size). docs/CODECS.md gives the exact matrices and the sign sequence.
#pragma once

#include <cstdint>
#include <vector>

namespace lowbit::codec::hadamard {

// The small factor m of a supported size n, or 0 when n has no supported factorization.
int64_t small_factor(int64_t n);
bool is_supported(int64_t n);

// The smallest supported size >= width that is a multiple of `multiple` (a power of two).
int64_t padded_size(int64_t width, int64_t multiple);

// The m x m Hadamard matrix used as the small factor (entries +1/-1, row-major); m == 1 gives {1}.
std::vector<int8_t> small_matrix(int64_t m);

// Sign i of the seed's diagonal: bit 63 of splitmix64(splitmix64(seed) + i) set means -1 (so nearby seeds
// give unrelated sign sequences).
float random_sign(uint64_t seed, uint64_t i);

class RandomizedHadamard {
 public:
  RandomizedHadamard(int64_t n, uint64_t seed);  // throws Errc::shape when n is not supported

  int64_t size() const { return n_; }
  uint64_t seed() const { return seed_; }

  // x [n] <- R x = H D x / sqrt(n).
  void forward(float* x) const;
  // x [n] <- R^T x = D H^T x / sqrt(n).
  void inverse(float* x) const;

 private:
  // x <- H x (transpose: H^T x), unnormalized.
  void apply_h(float* x, bool transpose) const;

  int64_t n_ = 0, m_ = 1;
  uint64_t seed_ = 0;
  std::vector<int8_t> small_, small_t_;  // H_m and its transpose, row-major
  std::vector<float> signs_;    // D
  float norm_ = 1.0f;           // 1 / sqrt(n)
};

}  // namespace lowbit::codec::hadamard
