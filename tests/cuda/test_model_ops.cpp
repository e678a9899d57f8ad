// The model-description ops of model_ops.cu against host references written out here: the three norm kinds
// (with the residual add fused in, and in place as a post-norm), the MLP activations with an up bias, bias adds
// and logit soft-capping, and attention with a per-layer scale, soft-capping, a sliding window, partial rotary
// and (1 + w) head norms through launch_qkv_prepare, the prefill attention (two passes) and the decode attention
// (split over several blocks, with and without preparing q/k/v itself). The model-level tests
// (test_cuda_model.cpp) compare whole models with the CPU interpreter. Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <random>
#include <vector>

#include "lowbit/kernels/cuda_model_ops.h"
#include "lowbit/kernels/cuda.h"

namespace lowbit::kernels::cuda {
namespace {

class ModelOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!device_available(&why)) GTEST_SKIP() << "no usable CUDA device: " << why;
  }
};

std::vector<float> random_values(size_t n, uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

DeviceBuffer upload(const std::vector<float>& v) {
  DeviceBuffer b(v.size() * sizeof(float));
  b.upload(v.data(), b.size());
  return b;
}

std::vector<float> download(const DeviceBuffer& b, size_t n) {
  synchronize("model_ops test");
  check_last_error("model_ops test");
  std::vector<float> v(n);
  b.download(v.data(), n * sizeof(float));
  return v;
}

// ||a - b|| / ||b||; NaN never passes a bound.
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Every norm kind, rows of 64 and 4096 (one and four float4s per thread), with and without the residual add,
// with and without the LayerNorm bias; then a post-norm in place (out == x).
TEST_F(ModelOpsTest, NormsMatchHostReference) {
  constexpr int kBatch = 3;
  constexpr float kEps = 1e-6f;
  for (const int64_t n : {int64_t{64}, int64_t{4096}}) {
    for (const NormType type : {NormType::rms, NormType::rms_unit_offset, NormType::layer}) {
      for (const bool with_delta : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " type " << static_cast<int>(type) << " delta "
                                          << with_delta);
        const size_t total = static_cast<size_t>(kBatch * n);
        // Rows off zero mean, so that LayerNorm's mean matters.
        std::vector<float> x = random_values(total, 1 + n), delta = random_values(total, 2 + n);
        for (float& v : x) v += 0.7f;
        const std::vector<float> w = random_values(static_cast<size_t>(n), 3, 0.3f);
        const std::vector<float> bias = random_values(static_cast<size_t>(n), 4);
        const bool with_bias = type == NormType::layer && with_delta;  // LayerNorm without a bias when no delta
        DeviceBuffer dx = upload(x), dd = upload(delta), dw = upload(w), db = upload(bias), out(total * 4);
        launch_norm(type, dx.as<float>(), with_delta ? dd.as<float>() : nullptr, dw.as<float>(),
                    with_bias ? db.as<float>() : nullptr, out.as<float>(), kBatch, n, kEps, nullptr);
        std::vector<double> want(total), want_x(total);
        for (int b = 0; b < kBatch; ++b) {
          std::vector<double> row(static_cast<size_t>(n));
          double sum = 0, sq = 0;
          for (int64_t j = 0; j < n; ++j) {
            const size_t i = static_cast<size_t>(b * n + j);
            row[j] = static_cast<double>(x[i]) + (with_delta ? delta[i] : 0.0);
            want_x[i] = row[j];
            sum += row[j];
            sq += row[j] * row[j];
          }
          const double mean = type == NormType::layer ? sum / n : 0.0;
          double var = 0;
          for (const double v : row) var += (v - mean) * (v - mean);
          const double inv = 1.0 / std::sqrt((type == NormType::layer ? var : sq) / n + kEps);
          for (int64_t j = 0; j < n; ++j) {
            const double gain = type == NormType::rms_unit_offset ? 1.0 + w[j] : w[j];
            want[static_cast<size_t>(b * n + j)] = (row[j] - mean) * inv * gain + (with_bias ? bias[j] : 0.0);
          }
        }
        EXPECT_LT(relative_error(download(out, total), want), 1e-5);
        EXPECT_LT(relative_error(download(dx, total), want_x), 1e-6);  // x holds x + delta after the add
        // The same norm of out in place, as a post-norm of the branch: the result's statistics are the
        // normalised row's, so compare with the host norm of `want`.
        launch_norm(type, out.as<float>(), nullptr, dw.as<float>(), nullptr, out.as<float>(), kBatch, n, kEps,
                    nullptr);
        std::vector<double> again(total);
        for (int b = 0; b < kBatch; ++b) {
          double sum = 0, sq = 0;
          for (int64_t j = 0; j < n; ++j) {
            const double v = want[static_cast<size_t>(b * n + j)];
            sum += v;
            sq += v * v;
          }
          const double mean = type == NormType::layer ? sum / n : 0.0;
          double var = 0;
          for (int64_t j = 0; j < n; ++j) var += std::pow(want[static_cast<size_t>(b * n + j)] - mean, 2);
          const double inv = 1.0 / std::sqrt((type == NormType::layer ? var : sq) / n + kEps);
          for (int64_t j = 0; j < n; ++j) {
            const double gain = type == NormType::rms_unit_offset ? 1.0 + w[j] : w[j];
            again[static_cast<size_t>(b * n + j)] = (want[static_cast<size_t>(b * n + j)] - mean) * inv * gain;
          }
        }
        EXPECT_LT(relative_error(download(out, total), again), 1e-5);
      }
    }
  }
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double gelu_tanh(double g) {
  return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
}
double gelu_erf(double u) { return 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0))); }

// Gate and up rows side by side (stride 2 hidden, as a fused gate_up projection writes them), with an up bias.
TEST_F(ModelOpsTest, ActivationsMatchHostReference) {
  constexpr int kBatch = 5;
  constexpr int64_t kHidden = 300;
  const std::vector<float> gu = random_values(static_cast<size_t>(kBatch * 2 * kHidden), 7, 2.0f);
  const std::vector<float> up_bias = random_values(static_cast<size_t>(kHidden), 8);
  const DeviceBuffer dgu = upload(gu), dbias = upload(up_bias);
  for (const ActType type : {ActType::swiglu, ActType::geglu_tanh, ActType::gelu_erf}) {
    DeviceBuffer out(static_cast<size_t>(kBatch * kHidden) * 4);
    launch_activation(type, dgu.as<float>(), dgu.as<float>() + kHidden, dbias.as<float>(), 2 * kHidden,
                      out.as<float>(), kBatch, kHidden, nullptr);
    std::vector<double> want;
    for (int b = 0; b < kBatch; ++b)
      for (int64_t j = 0; j < kHidden; ++j) {
        const double g = gu[static_cast<size_t>(b * 2 * kHidden + j)];
        const double u = gu[static_cast<size_t>(b * 2 * kHidden + kHidden + j)] + up_bias[static_cast<size_t>(j)];
        want.push_back(type == ActType::swiglu ? silu(g) * u : type == ActType::geglu_tanh ? gelu_tanh(g) * u
                                                                                            : gelu_erf(u));
      }
    EXPECT_LT(relative_error(download(out, want.size()), want), 1e-6) << "activation " << static_cast<int>(type);
  }
}

TEST_F(ModelOpsTest, BiasAddAndSoftcapMatchHostReference) {
  constexpr int kBatch = 4;
  constexpr int64_t kN = 1000;
  const std::vector<float> y = random_values(static_cast<size_t>(kBatch * kN), 9, 20.0f);
  const std::vector<float> bias = random_values(static_cast<size_t>(kN), 10);
  DeviceBuffer dy = upload(y);
  const DeviceBuffer db = upload(bias);
  launch_add_bias(dy.as<float>(), db.as<float>(), kBatch, kN, nullptr);
  std::vector<double> want(y.size());
  for (size_t i = 0; i < y.size(); ++i) want[i] = static_cast<double>(y[i]) + bias[i % kN];
  EXPECT_LT(relative_error(download(dy, y.size()), want), 1e-7);
  launch_softcap(dy.as<float>(), kBatch * kN, 30.0f, nullptr);
  for (double& v : want) v = 30.0 * std::tanh(v / 30.0);
  EXPECT_LT(relative_error(download(dy, y.size()), want), 1e-6);
}

// Host reference of one layer's attention: q/k heads after bias-free (1 + w) RMSNorm and partial RoPE (half
// pairs over the first rope_dims dimensions), scores softcap * tanh(q.k * scale / softcap) over the window.
struct AttentionCase {
  int n_heads = 4, n_kv_heads = 2, head_dim = 64, rope_dims = 32;
  float scale = 0.3f, softcap = 5.0f, eps = 1e-6f;
  int64_t window = 0;
  std::vector<float> q, k, v, q_norm, k_norm, inv_freq;  // q [rows, q_dim], k, v [rows, kv_dim]

  int64_t q_dim() const { return int64_t{n_heads} * head_dim; }
  int64_t kv_dim() const { return int64_t{n_kv_heads} * head_dim; }

  std::vector<double> prepared(const std::vector<float>& src, int64_t dim, const std::vector<float>& norm,
                               int64_t row, int head) const {
    std::vector<double> h(static_cast<size_t>(head_dim));
    double ss = 0;
    for (int d = 0; d < head_dim; ++d) {
      h[d] = src[static_cast<size_t>(row * dim + head * head_dim + d)];
      ss += h[d] * h[d];
    }
    const double inv = 1.0 / std::sqrt(ss / head_dim + eps);
    for (int d = 0; d < head_dim; ++d) h[d] *= inv * (1.0 + norm[d]);
    const int half = rope_dims / 2;
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(row) * inv_freq[i], c = std::cos(angle), s = std::sin(angle);
      const double a = h[i], b = h[i + half];
      h[i] = a * c - b * s;
      h[i + half] = a * s + b * c;
    }
    return h;
  }

  // Output row `row` [q_dim] (its position is `row`).
  std::vector<double> reference(int64_t row) const {
    std::vector<double> out(static_cast<size_t>(q_dim()));
    const int64_t first = window > 0 ? std::max<int64_t>(0, row - window + 1) : 0;
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / (n_heads / n_kv_heads);
      const std::vector<double> qh = prepared(q, q_dim(), q_norm, row, h);
      std::vector<double> scores;
      double max = -INFINITY;
      for (int64_t t = first; t <= row; ++t) {
        const std::vector<double> kh = prepared(k, kv_dim(), k_norm, t, kvh);
        double dot = 0;
        for (int d = 0; d < head_dim; ++d) dot += qh[d] * kh[d];
        scores.push_back(softcap * std::tanh(dot * scale / softcap));
        max = std::max(max, scores.back());
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - max));
      for (int64_t t = first; t <= row; ++t)
        for (int d = 0; d < head_dim; ++d)
          out[static_cast<size_t>(h * head_dim + d)] +=
              scores[static_cast<size_t>(t - first)] / sum * v[static_cast<size_t>(t * kv_dim() + kvh * head_dim + d)];
    }
    return out;
  }
};

AttentionCase attention_case(int64_t rows, int64_t window, uint64_t seed) {
  AttentionCase a;
  a.window = window;
  a.q = random_values(static_cast<size_t>(rows * a.q_dim()), seed);
  a.k = random_values(static_cast<size_t>(rows * a.kv_dim()), seed + 1);
  a.v = random_values(static_cast<size_t>(rows * a.kv_dim()), seed + 2);
  a.q_norm = random_values(static_cast<size_t>(a.head_dim), seed + 3, 0.3f);
  a.k_norm = random_values(static_cast<size_t>(a.head_dim), seed + 4, 0.3f);
  for (int i = 0; i < a.rope_dims / 2; ++i)
    a.inv_freq.push_back(std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(a.rope_dims)));
  return a;
}

// The device side of an AttentionCase: q, k, v uploaded as three [rows, width] blocks.
struct DeviceAttention {
  DeviceBuffer q, k, v, q_norm, k_norm, inv_freq, keys, values, pos, slot, out;
  QkvArgs args;
  KvLayer kv;

  DeviceAttention(const AttentionCase& a, int64_t rows, int64_t capacity)
      : q(upload(a.q)), k(upload(a.k)), v(upload(a.v)), q_norm(upload(a.q_norm)), k_norm(upload(a.k_norm)),
        inv_freq(upload(a.inv_freq)), keys(static_cast<size_t>(capacity * a.kv_dim()) * 4),
        values(static_cast<size_t>(capacity * a.kv_dim()) * 4), pos(static_cast<size_t>(rows) * 4),
        slot(static_cast<size_t>(rows) * 4), out(static_cast<size_t>(rows * a.q_dim()) * 4) {
    std::vector<int32_t> p(static_cast<size_t>(rows)), s(static_cast<size_t>(rows), 0);
    for (int64_t i = 0; i < rows; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    pos.upload(p.data(), pos.size());
    slot.upload(s.data(), slot.size());
    keys.fill(0);
    values.fill(0);
    args.q = q.as<float>();
    args.k = k.as<float>();
    args.v = v.as<float>();
    args.q_stride = a.q_dim();
    args.k_stride = args.v_stride = a.kv_dim();
    args.q_norm = q_norm.as<float>();
    args.k_norm = k_norm.as<float>();
    args.norm_unit_offset = true;
    args.inv_freq = inv_freq.as<float>();
    args.n_heads = a.n_heads;
    args.n_kv_heads = a.n_kv_heads;
    args.head_dim = a.head_dim;
    args.rope_dims = a.rope_dims;
    args.eps = a.eps;
    args.scale = a.scale;
    args.softcap = a.softcap;
    args.window = a.window;
    kv = {keys.data(), values.data(), ElemType::f32, capacity};
  }

  // args with q and out moved on to `row` (a pass or a decode row that starts there).
  QkvArgs from_row(int64_t row, const AttentionCase& a) const {
    QkvArgs r = args;
    r.q = args.q + row * a.q_dim();
    r.k = args.k + row * a.kv_dim();
    r.v = args.v + row * a.kv_dim();
    return r;
  }
};

// 90 rows through launch_qkv_prepare, then the prefill attention in two passes (rows 0..39, 40..89: the second
// starts its key walk inside the window), for windows of 0 (all keys), 20 and 64 keys.
TEST_F(ModelOpsTest, PrefillAttentionWithWindowSoftcapAndPartialRopeMatchesHost) {
  constexpr int64_t kRows = 90, kSplit = 40;
  for (const int64_t window : {int64_t{0}, int64_t{20}, int64_t{64}}) {
    SCOPED_TRACE(::testing::Message() << "window " << window);
    const AttentionCase a = attention_case(kRows, window, 50 + window);
    DeviceAttention d(a, kRows, 128);
    launch_qkv_prepare(d.args, d.kv, d.pos.as<int32_t>(), d.slot.as<int32_t>(), kRows, nullptr);
    launch_prefill_attention(d.args, d.kv, 0, 0, kSplit, d.out.as<float>(), nullptr);
    QkvArgs second = d.from_row(kSplit, a);
    launch_prefill_attention(second, d.kv, 0, kSplit, kRows - kSplit, d.out.as<float>() + kSplit * a.q_dim(),
                             nullptr);
    const std::vector<float> got = download(d.out, static_cast<size_t>(kRows * a.q_dim()));
    for (int64_t row = 0; row < kRows; ++row) {
      const std::vector<float> got_row(got.begin() + row * a.q_dim(), got.begin() + (row + 1) * a.q_dim());
      ASSERT_LT(relative_error(got_row, a.reference(row)), 1e-5) << "row " << row;
    }
  }
}

// A decode row at position 300 of a capacity of 512 (4 splits of at least 128 positions): the cache filled by
// launch_qkv_prepare for positions 0..299, the row's own q/k/v prepared inside the attention kernel or by
// launch_qkv_prepare first; windows of 0 (300 positions over 3 splits), 200 (2 splits) and 50 (1).
TEST_F(ModelOpsTest, DecodeAttentionWithWindowSoftcapAndPartialRopeMatchesHost) {
  constexpr int64_t kPos = 300, kCapacity = 512;
  ASSERT_EQ(attention_splits(kCapacity), 4);
  for (const int64_t window : {int64_t{0}, int64_t{200}, int64_t{50}}) {
    for (const bool prepare : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "window " << window << " prepare " << prepare);
      const AttentionCase a = attention_case(kPos + 1, window, 70 + window);
      DeviceAttention d(a, kPos + 1, kCapacity);
      DeviceBuffer partials(static_cast<size_t>(a.n_heads * kAttentionSplits * (a.head_dim + 2)) * 4);
      DeviceBuffer counters(static_cast<size_t>(a.n_heads) * 4);
      counters.fill(0);
      launch_qkv_prepare(d.args, d.kv, d.pos.as<int32_t>(), d.slot.as<int32_t>(), prepare ? kPos : kPos + 1,
                         nullptr);
      const QkvArgs row = d.from_row(kPos, a);
      launch_decode_attention(row, d.kv, d.pos.as<int32_t>() + kPos, d.slot.as<int32_t>(), 1, prepare,
                              {partials.as<float>(), counters.as<uint32_t>()}, d.out.as<float>(), nullptr);
      const std::vector<float> got = download(d.out, static_cast<size_t>(a.q_dim()));
      EXPECT_LT(relative_error(got, a.reference(kPos)), 1e-5);
    }
  }
}

// The MoE route against the CPU interpreter's rule (family.h MoeSpec, forward.cpp route_row): softmax in f32, the
// top_k largest p with ties to the lower index, renormalised or not. Logits on a grid of quarters give many exact
// ties (equal logits give equal p on both sides, and distinct ones are far apart); one row is all ties. Checks every
// output: each row's experts and weights in expert order, the (expert, row) numbering, the groups (expert order,
// first pair, count; count 0 past the last), then the weighted combine on top.
TEST_F(ModelOpsTest, MoeRouteWithTiesMatchesHost) {
  struct Case {
    int experts, top_k, batch;
    bool renormalise;
  };
  for (const Case k : {Case{8, 2, 1, true}, Case{8, 2, 5, true}, Case{128, 8, 16, true}, Case{128, 8, 3, false},
                       Case{160, 8, 16, true}, Case{40, 40, 2, false}, Case{1, 1, 4, true}}) {
    SCOPED_TRACE(::testing::Message() << k.experts << " experts, top " << k.top_k << ", batch " << k.batch
                                      << ", renormalise " << k.renormalise);
    const int pairs = k.batch * k.top_k;
    std::vector<float> logits = random_values(static_cast<size_t>(k.batch * k.experts), 90 + k.experts + k.batch, 2.0f);
    for (float& v : logits) v = std::round(v * 4.0f) / 4.0f;
    if (k.batch > 1)
      for (int e = 0; e < k.experts; ++e) logits[static_cast<size_t>(k.experts + e)] = 0.5f;  // row 1: all tied
    // Host: per row the chosen (expert, weight) in choice order, as forward.cpp's route_row.
    std::vector<std::vector<std::pair<int, float>>> want(static_cast<size_t>(k.batch));
    for (int b = 0; b < k.batch; ++b) {
      const float* l = logits.data() + b * k.experts;
      const float mx = *std::max_element(l, l + k.experts);
      std::vector<float> p(static_cast<size_t>(k.experts));
      float sum = 0.0f;
      for (int e = 0; e < k.experts; ++e) sum += p[e] = std::exp(l[e] - mx);
      for (float& v : p) v /= sum;
      std::vector<int> order(static_cast<size_t>(k.experts));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return p[a] > p[c]; });
      float chosen = 0.0f;
      for (int j = 0; j < k.top_k; ++j) chosen += p[order[j]];
      for (int j = 0; j < k.top_k; ++j)
        want[b].push_back({order[j], k.renormalise ? p[order[j]] / chosen : p[order[j]]});
      std::sort(want[b].begin(), want[b].end());  // expert order
    }
    DeviceBuffer dl = upload(logits);
    std::vector<DeviceBuffer> ints;
    for (int a = 0; a < 6; ++a) {
      ints.emplace_back(static_cast<size_t>(pairs) * 4);
      ints.back().fill(0xFF);
    }
    const MoeRoute r{ints[0].as<int32_t>(), ints[1].as<int32_t>(), ints[2].as<float>(),
                     ints[3].as<int32_t>(), ints[4].as<int32_t>(), ints[5].as<int32_t>()};
    launch_moe_route(dl.as<float>(), k.experts, k.top_k, k.renormalise, k.batch, r, nullptr);
    const auto ints_of = [&](int a) {
      const std::vector<float> raw = download(ints[static_cast<size_t>(a)], static_cast<size_t>(pairs));
      std::vector<int32_t> v(raw.size());
      std::memcpy(v.data(), raw.data(), raw.size() * 4);
      return v;
    };
    const std::vector<int32_t> pair_row = ints_of(0), slot = ints_of(1), group_expert = ints_of(3),
                               group_start = ints_of(4), group_count = ints_of(5);
    const std::vector<float> weight = download(ints[2], static_cast<size_t>(pairs));
    // The (expert, row) numbering the host expects, and its groups.
    std::vector<std::pair<int, int>> numbered;  // (expert, row)
    for (int b = 0; b < k.batch; ++b)
      for (const auto& [e, w] : want[b]) numbered.push_back({e, b});
    std::sort(numbered.begin(), numbered.end());
    std::vector<int32_t> want_expert, want_start, want_count;
    for (int i = 0; i < pairs; ++i)
      if (i == 0 || numbered[i].first != numbered[i - 1].first) {
        want_expert.push_back(numbered[i].first);
        want_start.push_back(i);
        want_count.push_back(0);
      }
    for (const auto& [e, b] : numbered)
      ++want_count[std::find(want_expert.begin(), want_expert.end(), e) - want_expert.begin()];
    for (int i = 0; i < pairs; ++i) EXPECT_EQ(pair_row[i], numbered[i].second) << "pair " << i;
    for (int b = 0; b < k.batch; ++b)
      for (int j = 0; j < k.top_k; ++j) {
        const int i = b * k.top_k + j;
        ASSERT_GE(slot[i], 0);
        ASSERT_LT(slot[i], pairs);
        EXPECT_EQ(numbered[slot[i]], std::make_pair(want[b][j].first, b)) << "row " << b << " choice " << j;
        EXPECT_NEAR(weight[i], want[b][j].second, 1e-6f * std::max(1.0f, want[b][j].second)) << "row " << b;
      }
    for (size_t g = 0; g < static_cast<size_t>(pairs); ++g) {
      if (g < want_expert.size()) {
        EXPECT_EQ(group_expert[g], want_expert[g]) << "group " << g;
        EXPECT_EQ(group_start[g], want_start[g]) << "group " << g;
        EXPECT_EQ(group_count[g], want_count[g]) << "group " << g;
      } else {
        EXPECT_EQ(group_count[g], 0) << "group " << g;
      }
    }
    // Combine rows y [pairs, dim] back with the weights.
    constexpr int64_t kDim = 96;
    const std::vector<float> y = random_values(static_cast<size_t>(pairs * kDim), 8);
    DeviceBuffer dy = upload(y), dout(static_cast<size_t>(k.batch * kDim) * 4);
    dout.fill(0xFF);
    launch_moe_combine(dy.as<float>(), kDim, r, k.batch, k.top_k, dout.as<float>(), nullptr);
    const std::vector<float> out = download(dout, static_cast<size_t>(k.batch * kDim));
    std::vector<double> want_out(static_cast<size_t>(k.batch * kDim), 0.0);
    for (int b = 0; b < k.batch; ++b)
      for (const auto& [e, w] : want[b]) {
        const int i =
            static_cast<int>(std::find(numbered.begin(), numbered.end(), std::make_pair(e, b)) - numbered.begin());
        for (int64_t d = 0; d < kDim; ++d) want_out[b * kDim + d] += static_cast<double>(w) * y[i * kDim + d];
      }
    EXPECT_LT(relative_error(out, want_out), 1e-6);
  }
}

}  // namespace
}  // namespace lowbit::kernels::cuda
