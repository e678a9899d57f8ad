// trellis: QTIP-style bitshift trellis coding (seed 003). A weight matrix is cut into 16 x 16 tiles (16 output
// rows x 16 input columns, T = 256 weights, visited row-major inside the tile); each tile is one tail-biting
// block of exactly T * k bits. The state moves s <- ((s << k) | next k bits) mod 2^L and the weight is
// code(s) * scale, with code 1mad or 3inst (pseudo-random Gaussian codes computed from the state) and an fp16
// scale per (padded) row or per tensor. Incoherence processing rotates the weight by randomized Hadamard
// transforms on the input side (default) and optionally the output side before coding.
//
// params: {"L": 8..16, "k": 1..4, "code": "1mad" | "3inst", "scale": "row" | "tensor" (default "row"),
//          "rotate": "none" | "input" | "both" (default "input"), "input_seed", "output_seed" (integers >= 0,
//          present only for a rotated side; encode fills them from EncodeOptions::seed and seed + 1),
//          "padded_rows", "padded_cols" (filled in by encode)}
// arrays:  "codes"  U16 [padded_rows / 16, padded_cols / 16, 16 k]   (each tile's T k-bit stream, MSB first)
//          "scales" F16 [padded_rows] ("row") or [1] ("tensor")
// The stored matrix is W' = R_out W R_in^T (R = identity for a side not rotated), zero-padded; decode_rows
// undoes the rotations and returns the logical W; kernels instead rotate activations (x' = R_in x) and outputs
// (y = R_out^T y'). docs/CODECS.md fixes the bit order, tile order, transforms and numerics.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lowbit/codec/codec.h"

namespace lowbit::codec::trellis {

enum class Code : uint8_t { mad1, inst3 };

inline constexpr int kTileDim = 16;
inline constexpr int kBlock = kTileDim * kTileDim;  // T

// The code of a state (the state as a 32-bit integer): 1MAD and 3INST exactly as docs/CODECS.md states.
float code_1mad(uint32_t state);
float code_3inst(uint32_t state);
float code_value(Code code, uint32_t state);
double code_std(Code code);  // over all 2^16 states, for the initial scale

// The 2^L code values, computed once per (code, L) and kept for the process; L in [1, 16].
const float* code_table(Code code, int L);

// A block's stream: T * k bits (T * k a multiple of 16), bit j in word j / 16 at bit position 15 - j % 16.
// Symbol t is bits [t k, (t + 1) k); state t is the L-bit window of the circular stream ending at bit
// (t + 1) k, its earliest bit the most significant.
uint32_t state_at(const uint16_t* words, int T, int k, int L, int t);
// out[t] = table[state t] for the T steps of a block (the exact decode; any T with T * k % 16 == 0).
void decode_block(const uint16_t* words, int T, int k, int L, const float* table, float* out);

// Viterbi search over the 2^L states of a block of T steps with k bits per step (L - k >= 3, T * k >= L,
// T * k % 16 == 0).
// Targets are in code units (weight / scale); the objective is sum_t importance[t] (code(s_t) - target[t])^2,
// importance nullptr meaning all ones. One encoder holds O(T 2^(L-k)) bytes of workspace: use one per thread.
class BlockEncoder {
 public:
  BlockEncoder(Code code, int L, int k, int T = kBlock);
  ~BlockEncoder();
  BlockEncoder(BlockEncoder&&) noexcept;
  BlockEncoder& operator=(BlockEncoder&&) noexcept;

  int L() const { return L_; }
  int k() const { return k_; }
  int T() const { return T_; }

  // Tail-biting encode by two passes: the block rotated by T / 2 is searched unconstrained, its state at the
  // original start fixes the L - k bits that the start and the end share, and the block is searched again
  // with them forced. Writes the stream (T k / 16 words) and the chosen code values recon[T] (may be null);
  // returns the weighted squared error.
  double encode(const float* target, const float* importance, uint16_t* words, float* recon);

  // The minimum-cost path s_0 .. s_{T-1} into states[T] with s_t = ((s_{t-1} << k) | b_t) mod 2^L; with
  // overlap >= 0, also s_0 >> k == overlap and s_{T-1} mod 2^(L-k) == overlap (a tail-biting path). Returns
  // its cost.
  double viterbi(const float* target, const float* importance, int64_t overlap, uint32_t* states);

 private:
  struct Workspace;
  int L_, k_, T_;
  const float* table_;
  std::unique_ptr<Workspace> ws_;
};

// The stream (T k / 16 words) of a tail-biting path: symbol t is the low k bits of states[t].
void pack_states(const uint32_t* states, int T, int k, uint16_t* words);

// Parameters parsed and checked against the logical shape.
struct Layout {
  Code code = Code::mad1;
  int L = 16, k = 2;
  bool per_row_scale = true;
  bool rotate_input = true, rotate_output = false;
  uint64_t input_seed = 0, output_seed = 0;
  int64_t rows = 0, cols = 0, padded_rows = 0, padded_cols = 0;

  int64_t row_tiles() const { return padded_rows / kTileDim; }
  int64_t col_tiles() const { return padded_cols / kTileDim; }
  int words_per_tile() const { return kBlock * k / 16; }
};
Layout parse_layout(const Params& params, const Shape& shape);

// out [16, 16] (row-major) = tile (tile_row, tile_col) of W', scales applied (code value x scale in f32).
void decode_tile(const Layout& layout, const ArrayViews& arrays, int64_t tile_row, int64_t tile_col, float* out);
// Decodes tile row `tile_row` (16 rows of W', all columns, scales applied) to out [16, padded_cols].
void decode_tile_row(const Layout& layout, const ArrayViews& arrays, int64_t tile_row, float* out);

void validate(const Params& params, const Shape& shape);
std::vector<ArraySpec> arrays(const Params& params, const Shape& shape);
void check_content(const Params& params, const Shape& shape, const ArrayViews& arrays);
void decode_rows(const Params& params, const Shape& shape, const ArrayViews& arrays, int64_t row_begin,
                 int64_t row_end, float* out);
EncodedTensor encode(const Params& params, const Shape& shape, const float* weights, const EncodeOptions& options);
EncodedTensor slice(const Params& params, const Shape& shape, const ArrayViews& arrays, Axis axis,
                    std::span<const Range> ranges);
// The F16 "scales" array encode starts from (before refitting them to its codes), for W' [padded_rows,
// padded_cols] as stored (rotated, zero-padded): the rms of each row (or of the tensor) over the columns the
// objective weighs without importance, over the code's rms. BlockLDLQ codes with these scales.
TensorBuffer starting_scales(const Layout& layout, const std::vector<float>& wp);

}  // namespace lowbit::codec::trellis
