#include "lowbit/codec/trellis.h"

#include <gtest/gtest.h>

#include "codec/codec_test_util.h"

#include <cmath>
#include <limits>
#include <random>

#include "lowbit/codec/codec.h"
#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"

namespace lowbit::codec::trellis {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(TrellisCode, GoldenValues) {
  // Computed independently (Python/numpy: the byte sum over float32 division; two float16 halves added in
  // float16).
  EXPECT_EQ(code_1mad(0), -0x1.406e8ep+0f);
  EXPECT_EQ(code_1mad(1), -0x1.ad8d48p-1f);
  EXPECT_EQ(code_1mad(12345), 0x1.4c8e6ap-6f);
  EXPECT_EQ(code_1mad(65535), 0x1.a69fa6p-2f);
  EXPECT_EQ(code_3inst(0), 0x1.894p-1f);
  EXPECT_EQ(code_3inst(1), -0x1.d6cp-1f);
  EXPECT_EQ(code_3inst(12345), 0x1.164p+0f);
  EXPECT_EQ(code_3inst(65535), -0x1.44p-3f);
}

TEST(TrellisCode, StatisticsOverAllStates) {
  for (const auto& [code, std_expected] : {std::pair{Code::mad1, 1.0}, std::pair{Code::inst3, 1.2437}}) {
    const float* t = code_table(code, 16);
    double sum = 0, sum2 = 0;
    for (uint32_t s = 0; s < 65536; ++s) {
      ASSERT_EQ(t[s], code_value(code, s));
      sum += t[s];
      sum2 += double{t[s]} * t[s];
    }
    const double mean = sum / 65536, sd = std::sqrt(sum2 / 65536 - mean * mean);
    EXPECT_NEAR(mean, 0.0, 0.01);
    EXPECT_NEAR(sd, std_expected, 0.002);
    EXPECT_NEAR(code_std(code), std_expected, 0.002);
  }
}

TEST(TrellisStream, StateGoldenVectors) {
  // T = 8, k = 2, L = 6, stream 1011 0010 0111 1000: state t is the 6-bit window ending at bit 2 (t + 1),
  // wrapping around (state 0 = bits 12..15 then 0..1).
  const uint16_t word = 0xB278;
  const uint32_t expect[8] = {34, 11, 44, 50, 9, 39, 30, 56};
  for (int t = 0; t < 8; ++t) EXPECT_EQ(state_at(&word, 8, 2, 6, t), expect[t]) << t;
  // T = 256, k = 3, L = 16 over words (0x9E37 i + 0x1234) mod 2^16.
  std::vector<uint16_t> words(48);
  for (int i = 0; i < 48; ++i) words[i] = static_cast<uint16_t>(i * 0x9E37 + 0x1234);
  const std::pair<int, uint32_t> golden[] = {{0, 62056}, {1, 37700}, {5, 18642}, {100, 39177}, {255, 7757}};
  for (const auto& [t, s] : golden) EXPECT_EQ(state_at(words.data(), 256, 3, 16, t), s) << t;
}

TEST(TrellisStream, DecodeBlockFollowsStateAt) {
  for (const auto& [L, k] : {std::pair{12, 1}, {16, 2}, {16, 3}, {12, 4}, {9, 4}}) {
    std::vector<uint16_t> words(static_cast<size_t>(kBlock * k / 16));
    std::mt19937 rng(L * 10 + k);
    for (auto& w : words) w = static_cast<uint16_t>(rng());
    const float* table = code_table(Code::mad1, L);
    std::vector<float> out(kBlock);
    decode_block(words.data(), kBlock, k, L, table, out.data());
    for (int t = 0; t < kBlock; ++t) ASSERT_EQ(out[t], table[state_at(words.data(), kBlock, k, L, t)]) << L << k << t;
  }
}

// Exhaustive tail-biting search: every stream of T k = 16 bits, the best cost per overlap (s_0 >> k).
std::vector<double> exhaustive_by_overlap(Code code, int L, int k, int T, const float* x, const float* w) {
  const float* table = code_table(code, L);
  std::vector<double> best(size_t{1} << (L - k), std::numeric_limits<double>::infinity());
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t word = static_cast<uint16_t>(bits);
    double cost = 0;
    for (int t = 0; t < T; ++t) {
      const double d = double{table[state_at(&word, T, k, L, t)]} - x[t];
      cost += w[t] * d * d;
    }
    double& b = best[state_at(&word, T, k, L, 0) >> k];
    b = std::min(b, cost);
  }
  return best;
}

// Exhaustive unconstrained search: every start state and every symbol sequence.
double exhaustive_free(const float* table, int L, int k, int T, const float* x, const float* w, int t, uint32_t s,
                       double acc) {
  const double d = double{table[s]} - x[t];
  acc += w[t] * d * d;
  if (t == T - 1) return acc;
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t b = 0; b < (1u << k); ++b)
    best = std::min(best, exhaustive_free(table, L, k, T, x, w, t + 1, ((s << k) | b) & ((1u << L) - 1), acc));
  return best;
}

TEST(TrellisViterbi, EqualsExhaustiveSearchOnSmallCases) {
  struct Case { int L, k, T; Code code; };
  for (const Case c : {Case{4, 1, 16, Code::mad1}, Case{6, 2, 8, Code::inst3}, Case{5, 2, 8, Code::mad1},
                       Case{8, 4, 4, Code::mad1}, Case{7, 4, 4, Code::inst3}}) {
    SCOPED_TRACE(testing::Message() << "L " << c.L << " k " << c.k << " T " << c.T);
    const std::vector<float> x = gaussian(c.T, c.L * 7 + c.k);
    const std::vector<float> w = uniform(c.T, c.L + c.k, 0.1f, 2.0f);
    BlockEncoder enc(c.code, c.L, c.k, c.T);
    std::vector<uint32_t> states(c.T);
    const float* table = code_table(c.code, c.L);
    double free_best = std::numeric_limits<double>::infinity();
    for (uint32_t s0 = 0; s0 < (1u << c.L); ++s0)
      free_best = std::min(free_best, exhaustive_free(table, c.L, c.k, c.T, x.data(), w.data(), 0, s0, 0.0));
    EXPECT_NEAR(enc.viterbi(x.data(), w.data(), -1, states.data()), free_best, 1e-4 * (1 + free_best));

    const std::vector<double> by_overlap = exhaustive_by_overlap(c.code, c.L, c.k, c.T, x.data(), w.data());
    double tail_best = std::numeric_limits<double>::infinity();
    for (size_t o = 0; o < by_overlap.size(); ++o) {
      const double cost = enc.viterbi(x.data(), w.data(), static_cast<int64_t>(o), states.data());
      ASSERT_NEAR(cost, by_overlap[o], 1e-4 * (1 + cost)) << "overlap " << o;
      EXPECT_EQ(states[0] >> c.k, o);
      EXPECT_EQ(states[c.T - 1] & ((1u << (c.L - c.k)) - 1), o);
      tail_best = std::min(tail_best, by_overlap[o]);
    }
    // The two-pass encode is a tail-biting stream whose decode costs what it reports.
    uint16_t word = 0;
    std::vector<float> recon(c.T);
    const double cost = enc.encode(x.data(), w.data(), &word, recon.data());
    EXPECT_GE(cost, tail_best - 1e-6);
    EXPECT_GE(cost, free_best - 1e-6);
    double decoded_cost = 0;
    for (int t = 0; t < c.T; ++t) {
      const float v = table[state_at(&word, c.T, c.k, c.L, t)];
      EXPECT_EQ(v, recon[t]);
      decoded_cost += w[t] * (double{v} - x[t]) * (double{v} - x[t]);
    }
    EXPECT_NEAR(decoded_cost, cost, 1e-6 * (1 + cost));
  }
}

TEST(TrellisViterbi, TailBitingBlockDecodesTheSameFromEveryRotation) {
  for (const auto& [L, k] : {std::pair{10, 2}, {12, 3}}) {
    const std::vector<float> x = gaussian(kBlock, 5);
    BlockEncoder enc(Code::mad1, L, k);
    std::vector<uint16_t> words(static_cast<size_t>(kBlock * k / 16));
    std::vector<float> recon(kBlock), rotated_out(kBlock);
    enc.encode(x.data(), nullptr, words.data(), recon.data());
    const int nbits = kBlock * k;
    for (int r = 0; r < kBlock; ++r) {  // the stream rotated left by r symbols starts at step r
      std::vector<uint16_t> rotated(words.size(), 0);
      for (int j = 0; j < nbits; ++j) {
        const int src = (j + r * k) % nbits;
        if ((words[src >> 4] >> (15 - (src & 15))) & 1u) rotated[j >> 4] |= static_cast<uint16_t>(1u << (15 - (j & 15)));
      }
      decode_block(rotated.data(), kBlock, k, L, code_table(Code::mad1, L), rotated_out.data());
      for (int t = 0; t < kBlock; ++t) ASSERT_EQ(rotated_out[t], recon[(t + r) % kBlock]) << "r " << r << " t " << t;
    }
  }
}

TEST(TrellisViterbi, ZeroImportanceStepsAreFree) {
  std::vector<float> x = gaussian(kBlock, 9), w(kBlock, 1.0f);
  for (int t = 0; t < kBlock; t += 2) {
    w[t] = 0.0f;
    x[t] = 1e6f;  // ignored
  }
  BlockEncoder enc(Code::mad1, 10, 2);
  std::vector<uint16_t> words(kBlock * 2 / 16);
  const double cost = enc.encode(x.data(), w.data(), words.data(), nullptr);
  EXPECT_LT(cost, 0.2 * kBlock / 2);
}

Params params(int L, int k, const char* code, const char* rotate, const char* scale) {
  return {{"L", L}, {"k", k}, {"code", code}, {"rotate", rotate}, {"scale", scale}};
}

TensorRef ref(const EncodedTensor& e, const Shape& shape) { return test_util::encoded_ref("trellis", e, shape); }

double mse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
  return s / static_cast<double>(a.size());
}

TEST(TrellisCodec, RoundTripsEveryLayout) {
  ThreadPool pool(2);
  const Shape shape{20, 40};  // pads to 32 x 48 (no rotation) or the Hadamard sizes
  const std::vector<float> w = gaussian(800, 1);
  for (const char* rotate : {"none", "input", "both"})
    for (const char* scale : {"row", "tensor"})
      for (const char* code : {"1mad", "3inst"}) {
        SCOPED_TRACE(testing::Message() << rotate << " " << scale << " " << code);
        EncodeOptions opt;
        opt.pool = &pool;
        opt.seed = 17;
        const EncodedTensor e = encode(params(10, 3, code, rotate, scale), shape, w.data(), opt);
        const TensorRef t = ref(e, shape);
        validate_tensor(t, "test");
        const std::vector<float> d = decode_all(t);
        EXPECT_LT(mse(d, w), 0.1);  // k = 3 on unit Gaussians: about 0.03 to 0.05
        std::vector<float> part(3 * 40);
        decode_rows(e.params, shape, t.arrays, 17, 20, part.data());
        for (int i = 0; i < 3 * 40; ++i) ASSERT_EQ(part[i], d[17 * 40 + i]);
        EXPECT_EQ(e.params.contains("input_seed"), std::string(rotate) != "none");
        EXPECT_EQ(e.params.contains("output_seed"), std::string(rotate) == "both");
        // Re-encoding with the stored (normalized) params gives the same codes.
        const EncodedTensor again = encode(e.params, shape, w.data(), opt);
        EXPECT_EQ(again.arrays[0].second.bytes, e.arrays[0].second.bytes);
      }
}

TEST(TrellisCodec, UnrotatedDecodeIsCodeTimesScale) {
  const Shape shape{16, 32};
  const std::vector<float> w = gaussian(512, 2);
  const EncodedTensor e = encode(params(12, 2, "3inst", "none", "row"), shape, w.data(), {});
  const TensorRef t = ref(e, shape);
  const std::vector<float> d = decode_all(t);
  const uint16_t* words = t.arrays.at("codes").as<uint16_t>();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 32; ++c) {
      const int tile = c / 16, step = r * 16 + c % 16;  // row-major inside the tile
      const uint32_t s = state_at(words + tile * 32, kBlock, 2, 12, step);
      const float scale = load_float(DType::F16, t.arrays.at("scales").bytes.data(), static_cast<size_t>(r));
      ASSERT_EQ(d[r * 32 + c], code_3inst(s) * scale) << r << " " << c;
    }
}

TEST(TrellisCodec, ColumnImportanceSteersTheError) {
  const Shape shape{16, 32};
  const std::vector<float> w = gaussian(512, 4);
  std::vector<float> importance(32, 1.0f);
  for (int c = 0; c < 32; c += 2) importance[c] = 100.0f;  // every tile mixes heavy and light columns
  EncodeOptions opt;
  opt.column_importance = importance;
  const EncodedTensor e = encode(params(10, 2, "1mad", "none", "row"), shape, w.data(), opt);
  const std::vector<float> d = decode_all(ref(e, shape));
  double heavy = 0, light = 0;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 32; ++c) (c % 2 == 0 ? heavy : light) += (d[r * 32 + c] - w[r * 32 + c]) * (d[r * 32 + c] - w[r * 32 + c]);
  EXPECT_LT(heavy * 2, light);
}

// A 2-bit affine code at group g: scale and minimum per group in f16 (2 + 32 / g bits per weight).
double affine_rtn_mse(const std::vector<float>& w, int g) {
  double err = 0;
  for (size_t b = 0; b < w.size(); b += static_cast<size_t>(g)) {
    float lo = w[b], hi = w[b];
    for (int i = 0; i < g; ++i) lo = std::min(lo, w[b + i]), hi = std::max(hi, w[b + i]);
    const float scale = f16_to_f32(f32_to_f16((hi - lo) / 3.0f)), bias = f16_to_f32(f32_to_f16(lo));
    for (int i = 0; i < g; ++i) {
      const float q = std::clamp(std::nearbyint((w[b + i] - bias) / scale), 0.0f, 3.0f);
      err += (q * scale + bias - w[b + i]) * (q * scale + bias - w[b + i]);
    }
  }
  return err / static_cast<double>(w.size());
}

TEST(TrellisCodec, BeatsTwoBitAffineOnGaussians) {
  const Shape shape{32, 32};  // four L = 16 blocks
  const std::vector<float> w = gaussian(1024, 8);
  const Params p = params(16, 2, "1mad", "none", "row");
  const EncodedTensor e = encode(p, shape, w.data(), {});
  const double trellis = mse(decode_all(ref(e, shape)), w);
  const double bpw = bits_per_weight(*find_codec("trellis"), e.params, shape);
  EXPECT_NEAR(bpw, 2.0 + 16.0 / 32, 1e-9);
  for (int g : {32, 64, 128}) EXPECT_LT(trellis, affine_rtn_mse(w, g)) << "group " << g;
  EXPECT_LT(trellis, 0.085);  // QTIP reports about 0.069 for 1MAD at k = 2, L = 16
}

TEST(TrellisCodec, RejectsBadParams) {
  const Shape shape{16, 16};
  const auto rejects = [&](Params p, Errc code) {
    try {
      validate(p, shape);
      ADD_FAILURE() << "accepted " << p.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  const Params good = params(12, 2, "1mad", "input", "row");
  validate(good, shape);
  rejects(params(7, 2, "1mad", "input", "row"), Errc::codec_params);
  rejects(params(12, 5, "1mad", "input", "row"), Errc::codec_params);
  rejects(params(12, 2, "2mad", "input", "row"), Errc::codec_params);
  Params p = good;
  p["output_seed"] = 3;  // output side not rotated
  rejects(p, Errc::codec_params);
  p = good;
  p["padded_cols"] = 32;
  rejects(p, Errc::codec_params);
  p = good;
  p["extra"] = 1;
  rejects(p, Errc::codec_params);
  try {
    validate(good, Shape{4, 4, 4});
    ADD_FAILURE() << "rank 3 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::shape);
  }
}

}  // namespace
}  // namespace lowbit::codec::trellis
