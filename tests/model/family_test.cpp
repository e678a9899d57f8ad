// The family table and the CPU interpreter of its descriptions: the four Llama-shaped families against
// transformers' logits (tests/model/fixtures/families), every op of family.h against a direct double-precision
// reference written here, and the refusals (unknown family, numbers that do not fit, tensors missing or left over).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <numbers>
#include <random>

#include "lowbit/core/error.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/safetensors.h"
#include "lowbit/model/family.h"
#include "lowbit/model/model.h"
#include "model/tiny_model.h"

namespace lowbit::model {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/families";

using testing::prefill_logits;
using testing::stepwise_logits;

// max |a - b| / max(1, max |b|)
template <class A, class B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0, scale = 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

std::string error_of(const std::function<void()>& f, Errc* code = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "no error";
}

// ---------------------------------------------------------------------------------------------------------------
// transformers' logits

struct Expected {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

Expected read_expected(const fs::path& path) {
  const auto f = io::SafetensorsFile::open(path);
  const TensorView tokens = f.tensor("tokens"), logits = f.tensor("logits");
  Expected e;
  e.tokens.assign(tokens.as<int32_t>(), tokens.as<int32_t>() + tokens.shape[0]);
  e.logits.assign(logits.as<float>(), logits.as<float>() + logits.shape[0] * logits.shape[1]);
  return e;
}

TEST(FamilyFixtures, LlamaShapedFamiliesMatchTransformers) {
  ThreadPool pool(2);
  for (const char* family : {"llama", "mistral", "qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    const fs::path dir = kFixtures / family;
    const Expected e = read_expected(dir / "expected.safetensors");
    const auto m = load_model(dir);
    EXPECT_EQ(m->config.arch, family);
    EXPECT_LE(relative_error(prefill_logits(*m, e.tokens, pool), e.logits), 1e-4);
    EXPECT_LE(relative_error(stepwise_logits(*m, e.tokens, pool), e.logits), 1e-4);
  }
}

TEST(FamilyFixtures, LlamaGgufFromLlamaCppsConverterMatchesTransformers) {
  ThreadPool pool(2);
  const Expected e = read_expected(kFixtures / "llama/expected.safetensors");
  const auto m = load_model(kFixtures / "llama/model.gguf");
  EXPECT_EQ(m->config.rope_style, RopeStyle::interleaved);
  // llama3 RoPE scaling recovered from rope_freqs.weight, original context included (the converter omits it)
  EXPECT_EQ(m->config.rope_scaling.kind, RopeScaling::Kind::llama3);
  EXPECT_EQ(m->config.rope_scaling.factor, 8.0);
  EXPECT_EQ(m->config.rope_scaling.original_max_position, 64);
  EXPECT_LE(relative_error(prefill_logits(*m, e.tokens, pool), e.logits), 1e-4);
}

// ---------------------------------------------------------------------------------------------------------------
// Every op of family.h on a hand-built two-layer model, against a direct double-precision reference.

ModelConfig op_config() {
  ModelConfig c;
  c.dim = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.hidden_dim = 6;
  c.vocab = 11;
  c.max_seq = 16;
  c.norm_eps = 1e-5f;
  return c;
}

const std::vector<int32_t> kOpTokens{3, 7, 1, 9, 4, 4, 10, 0};

// Values for every role a layer may have; fused tensors are the concatenation of their parts, so the reference
// computes them from the parts.
struct OpWeights {
  std::vector<std::map<Role, std::vector<float>>> layers;
  std::vector<float> embed, head, final_norm, final_bias;
};

bool is_norm_gain(Role r) { return testing::is_gain(r); }

// [rows, cols] of every role (cols none: a vector), as family.h's Role comments give them.
std::pair<Dim, Dim> role_shape(Role r) {
  switch (r) {
    case Role::q: return {Dim::q_dim, Dim::dim};
    case Role::k: case Role::v: return {Dim::kv_dim, Dim::dim};
    case Role::o: return {Dim::dim, Dim::q_dim};
    case Role::gate: case Role::up: return {Dim::hidden, Dim::dim};
    case Role::down: return {Dim::dim, Dim::hidden};
    case Role::q_bias: return {Dim::q_dim, Dim::none};
    case Role::k_bias: case Role::v_bias: return {Dim::kv_dim, Dim::none};
    case Role::q_norm: case Role::k_norm: return {Dim::head_dim, Dim::none};
    case Role::up_bias: return {Dim::hidden, Dim::none};
    default: return {Dim::dim, Dim::none};  // the norms of the stream, their biases, o_bias, down_bias
  }
}

OpWeights op_weights(const ModelConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  const auto values = [&](int64_t n, float offset) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = offset + u(rng);
    return v;
  };
  OpWeights w;
  w.embed = values(c.vocab * c.dim, 0);
  w.head = values(c.vocab * c.dim, 0);
  w.final_norm = values(c.dim, 1);
  w.final_bias = values(c.dim, 0);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto& m = w.layers.emplace_back();
    for (size_t r = 0; r < kRoleCount; ++r) {
      const auto role = static_cast<Role>(r);
      if (role == Role::qkv || role == Role::gate_up) continue;
      const auto [rows, cols] = role_shape(role);
      const int64_t n = dim_size(rows, c) * (cols == Dim::none ? 1 : dim_size(cols, c));
      m[role] = values(n, is_norm_gain(role) ? 1.0f : 0.0f);
    }
    m[Role::qkv] = m[Role::q];
    m[Role::qkv].insert(m[Role::qkv].end(), m[Role::k].begin(), m[Role::k].end());
    m[Role::qkv].insert(m[Role::qkv].end(), m[Role::v].begin(), m[Role::v].end());
    m[Role::gate_up] = m[Role::gate];
    m[Role::gate_up].insert(m[Role::gate_up].end(), m[Role::up].begin(), m[Role::up].end());
  }
  return w;
}

// A Model running `desc` with weights `w` (only the tensors desc lists are given to it).
struct OpModel {
  std::deque<std::vector<float>> storage;
  Model model;
};

std::unique_ptr<OpModel> op_model(const ModelConfig& c, const ModelDesc& desc, const OpWeights& w) {
  auto out = std::make_unique<OpModel>();
  Model& m = out->model;
  m.config = c;
  m.desc = desc;
  const auto linear = [&](const std::vector<float>& v, int64_t rows, int64_t cols) {
    return kernels::prepare_cpu(dense_f32_ref({rows, cols}, out->storage.emplace_back(v)));
  };
  m.embed = linear(w.embed, c.vocab, c.dim);
  m.lm_head = linear(w.head, c.vocab, c.dim);
  m.final_norm = w.final_norm;
  if (desc.final_norm == NormKind::layer) m.final_norm_bias = w.final_bias;
  m.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const TensorSpec& t : desc.layers[l].tensors) {
      const std::vector<float>& v = w.layers[l].at(t.role);
      if (t.linear())
        m.layers[l].linears[static_cast<size_t>(t.role)] = linear(v, dim_size(t.rows, c), dim_size(t.cols, c));
      else
        m.layers[l].vectors[static_cast<size_t>(t.role)] = v;
    }
  return out;
}

// --- the reference, in double, written from the formulas ---

using Vec = std::vector<double>;

Vec matvec(const std::vector<float>& w, const Vec& x, int64_t rows) {
  const auto cols = static_cast<int64_t>(x.size());
  Vec y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) y[r] += static_cast<double>(w[r * cols + j]) * x[j];
  return y;
}

Vec ref_norm(const Vec& x, const std::vector<float>& g, const std::vector<float>* b, NormKind kind, double eps) {
  const double n = static_cast<double>(x.size());
  Vec y(x.size());
  if (kind == NormKind::layer) {
    double mean = 0, var = 0;
    for (double v : x) mean += v / n;
    for (double v : x) var += (v - mean) * (v - mean) / n;
    for (size_t j = 0; j < x.size(); ++j) y[j] = (x[j] - mean) / std::sqrt(var + eps) * g[j] + (b ? (*b)[j] : 0.0);
    return y;
  }
  double ms = 0;
  for (double v : x) ms += v * v / n;
  for (size_t j = 0; j < x.size(); ++j)
    y[j] = x[j] / std::sqrt(ms + eps) * (kind == NormKind::rms_unit_offset ? 1.0 + g[j] : g[j]);
  return y;
}

void ref_rope(double* v, int64_t dims, const std::vector<float>& inv, RopeStyle style, int64_t pos) {
  for (int64_t j = 0; j < dims / 2; ++j) {
    const double angle = static_cast<double>(pos) * inv[j];
    const int64_t a = style == RopeStyle::half ? j : 2 * j, b = style == RopeStyle::half ? j + dims / 2 : 2 * j + 1;
    const double x = v[a], y = v[b];
    v[a] = x * std::cos(angle) - y * std::sin(angle);
    v[b] = x * std::sin(angle) + y * std::cos(angle);
  }
}

std::vector<double> reference(const ModelConfig& c, const ModelDesc& d, const OpWeights& w,
                              const std::vector<int32_t>& tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  const double eps = d.norm_eps;
  std::vector<Vec> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c.dim; ++j)
      x[i].push_back(w.embed[tokens[i] * c.dim + j] * static_cast<double>(d.embed_scale));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerDesc& L = d.layers[l];
    const auto& W = w.layers[l];
    const auto add_bias = [&](Vec& v, Role r) {
      if (L.has(r))
        for (size_t j = 0; j < v.size(); ++j) v[j] += W.at(r)[j];
    };
    std::vector<Vec> h(static_cast<size_t>(n));
    for (const Op& op : L.ops) {
      if (op.kind == Op::Kind::norm) {
        for (int64_t i = 0; i < n; ++i)
          h[i] = ref_norm(op.in == Reg::x ? x[i] : h[i], W.at(op.weight),
                          op.bias == Role::count ? nullptr : &W.at(op.bias), L.norm, eps);
      } else if (op.kind == Op::Kind::add) {
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < c.dim; ++j) x[i][j] += h[i][j];
      } else if (op.kind == Op::Kind::attention) {
        std::vector<Vec> q(n), k(n), v(n);
        for (int64_t i = 0; i < n; ++i) {
          q[i] = matvec(W.at(Role::q), h[i], c.q_dim());
          k[i] = matvec(W.at(Role::k), h[i], c.kv_dim());
          v[i] = matvec(W.at(Role::v), h[i], c.kv_dim());
          add_bias(q[i], Role::q_bias);
          add_bias(k[i], Role::k_bias);
          add_bias(v[i], Role::v_bias);
          for (auto [vec, heads, norm] :
               {std::tuple{&q[i], c.n_heads, Role::q_norm}, std::tuple{&k[i], c.n_kv_heads, Role::k_norm}})
            for (int64_t hd = 0; hd < heads; ++hd) {
              double* head = vec->data() + hd * c.head_dim;
              if (L.has(norm)) {
                const Vec normed = ref_norm(Vec(head, head + c.head_dim), W.at(norm), nullptr, L.norm, eps);
                std::copy(normed.begin(), normed.end(), head);
              }
              ref_rope(head, L.attention.rope_dims, d.rope_inv_freq[L.attention.rope], d.rope_style, i);
            }
        }
        for (int64_t i = 0; i < n; ++i) {
          Vec att(static_cast<size_t>(c.q_dim()));
          for (int64_t hd = 0; hd < c.n_heads; ++hd) {
            const int64_t kv = hd / (c.n_heads / c.n_kv_heads);
            std::vector<double> p;
            std::vector<int64_t> seen;
            for (int64_t t = 0; t <= i; ++t) {
              if (L.attention.window > 0 && i - t >= L.attention.window) continue;
              double s = 0;
              for (int64_t e = 0; e < c.head_dim; ++e) s += q[i][hd * c.head_dim + e] * k[t][kv * c.head_dim + e];
              s *= L.attention.scale;
              if (L.attention.softcap > 0) s = L.attention.softcap * std::tanh(s / L.attention.softcap);
              p.push_back(s);
              seen.push_back(t);
            }
            const double mx = *std::max_element(p.begin(), p.end());
            double z = 0;
            for (double& s : p) z += (s = std::exp(s - mx));
            for (size_t u = 0; u < p.size(); ++u)
              for (int64_t e = 0; e < c.head_dim; ++e)
                att[hd * c.head_dim + e] += p[u] / z * v[seen[u]][kv * c.head_dim + e];
          }
          h[i] = matvec(W.at(Role::o), att, c.dim);
          add_bias(h[i], Role::o_bias);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) {
          Vec mid(static_cast<size_t>(c.hidden_dim));
          const Vec up = matvec(W.at(Role::up), h[i], c.hidden_dim);
          if (L.activation == Activation::gelu_erf) {
            for (int64_t j = 0; j < c.hidden_dim; ++j) {
              const double a = up[j] + (L.has(Role::up_bias) ? W.at(Role::up_bias)[j] : 0.0);
              mid[j] = 0.5 * a * (1 + std::erf(a / std::numbers::sqrt2));
            }
          } else {
            const Vec gate = matvec(W.at(Role::gate), h[i], c.hidden_dim);
            for (int64_t j = 0; j < c.hidden_dim; ++j) {
              const double g = gate[j];
              const double act =
                  L.activation == Activation::swiglu
                      ? g / (1 + std::exp(-g))
                      : 0.5 * g * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (g + 0.044715 * g * g * g)));
              mid[j] = act * up[j];
            }
          }
          h[i] = matvec(W.at(Role::down), mid, c.dim);
          add_bias(h[i], Role::down_bias);
        }
      }
    }
  }
  std::vector<double> logits;
  for (int64_t i = 0; i < n; ++i) {
    const Vec xn =
        ref_norm(x[i], w.final_norm, d.final_norm == NormKind::layer ? &w.final_bias : nullptr, d.final_norm, eps);
    for (double z : matvec(w.head, xn, c.vocab))
      logits.push_back(d.final_softcap > 0 ? d.final_softcap * std::tanh(z / d.final_softcap) : z);
  }
  return logits;
}

// --- the variants: each changes the baseline llama description by one feature ---

TensorSpec spec(Role r, Dim rows, Dim cols = Dim::none) { return {r, "", "", rows, cols}; }

void remove_roles(LayerDesc& l, std::initializer_list<Role> roles) {
  for (Role r : roles) std::erase_if(l.tensors, [r](const TensorSpec& t) { return t.role == r; });
}

struct Variant {
  const char* name;
  std::function<void(ModelDesc&)> apply;
  bool changes = true;  // false: a fused tensor, the same function as its parts (the reference uses the parts)
};

void each_layer(ModelDesc& d, const std::function<void(LayerDesc&)>& f) {
  for (LayerDesc& l : d.layers) f(l);
}

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v{
      {"rms_unit_offset",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) { l.norm = NormKind::rms_unit_offset; });
         d.final_norm = NormKind::rms_unit_offset;
       }},
      {"layer_norm_with_bias",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) {
           l.norm = NormKind::layer;
           l.tensors.push_back(spec(Role::attn_norm_bias, Dim::dim));
           l.tensors.push_back(spec(Role::ffn_norm_bias, Dim::dim));
           l.ops[0].bias = Role::attn_norm_bias;
           l.ops[3].bias = Role::ffn_norm_bias;
         });
         d.final_norm = NormKind::layer;
       }},
      {"qk_norm",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) {
           l.tensors.push_back(spec(Role::q_norm, Dim::head_dim));
           l.tensors.push_back(spec(Role::k_norm, Dim::head_dim));
         });
       }},
      {"qkvo_biases",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) {
           for (auto [r, rows] : {std::pair{Role::q_bias, Dim::q_dim},
                                  {Role::k_bias, Dim::kv_dim},
                                  {Role::v_bias, Dim::kv_dim},
                                  {Role::o_bias, Dim::dim}})
             l.tensors.push_back(spec(r, rows));
         });
       }},
      {"fused_qkv",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) {
           remove_roles(l, {Role::q, Role::k, Role::v});
           l.tensors.push_back(spec(Role::qkv, Dim::qkv_dim, Dim::dim));
         });
       },
       false},
      {"fused_gate_up",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) {
           remove_roles(l, {Role::gate, Role::up});
           l.tensors.push_back(spec(Role::gate_up, Dim::gate_up_dim, Dim::dim));
         });
       },
       false},
      {"geglu_tanh", [](ModelDesc& d) { each_layer(d, [](LayerDesc& l) { l.activation = Activation::geglu_tanh; }); }},
      {"gelu_erf_with_biases",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) {
           l.activation = Activation::gelu_erf;
           remove_roles(l, {Role::gate});
           l.tensors.push_back(spec(Role::up_bias, Dim::hidden));
           l.tensors.push_back(spec(Role::down_bias, Dim::dim));
         });
       }},
      {"post_norms",
       [](ModelDesc& d) {
         each_layer(d, [](LayerDesc& l) {
           l.tensors.push_back(spec(Role::post_attn_norm, Dim::dim));
           l.tensors.push_back(spec(Role::post_ffn_norm, Dim::dim));
           l.ops.insert(l.ops.begin() + 5, {Op::Kind::norm, Reg::h, Role::post_ffn_norm});
           l.ops.insert(l.ops.begin() + 2, {Op::Kind::norm, Reg::h, Role::post_attn_norm});
         });
       }},
      {"partial_rope_and_a_table_per_layer",
       [](ModelDesc& d) {
         d.rope_inv_freq = {{0.7f}, {1.3f, 0.2f}};
         d.layers[0].attention.rope = 0;
         d.layers[0].attention.rope_dims = 2;
         d.layers[1].attention.rope = 1;
       }},
      {"interleaved_rope", [](ModelDesc& d) { d.rope_style = RopeStyle::interleaved; }},
      {"attention_scale", [](ModelDesc& d) { each_layer(d, [](LayerDesc& l) { l.attention.scale = 1.7f; }); }},
      {"attention_softcap", [](ModelDesc& d) { each_layer(d, [](LayerDesc& l) { l.attention.softcap = 0.2f; }); }},
      {"sliding_window", [](ModelDesc& d) { d.layers[1].attention.window = 2; }},
      {"embed_scale", [](ModelDesc& d) { d.embed_scale = 2.5f; }},
      {"final_softcap", [](ModelDesc& d) { d.final_softcap = 0.7f; }},
  };
  return v;
}

TEST(FamilyOps, EveryOpMatchesTheDirectReferenceAndChangesTheLogits) {
  ThreadPool pool(2);
  const ModelConfig c = op_config();
  const ModelDesc base = describe_model(c, "test");
  const OpWeights w = op_weights(c, 5);
  const std::vector<double> base_ref = reference(c, base, w, kOpTokens);
  {
    const auto m = op_model(c, base, w);
    EXPECT_LE(relative_error(prefill_logits(m->model, kOpTokens, pool), base_ref), 1e-5);
  }
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    ModelDesc d = base;
    v.apply(d);
    const std::vector<double> ref = reference(c, d, w, kOpTokens);
    if (v.changes) {
      EXPECT_GT(relative_error(ref, base_ref), 1e-3) << "the variant does not change the reference";
    }
    const auto m = op_model(c, d, w);
    EXPECT_LE(relative_error(prefill_logits(m->model, kOpTokens, pool), ref), 1e-5);
    EXPECT_LE(relative_error(stepwise_logits(m->model, kOpTokens, pool), ref), 1e-5);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Refusals

nlohmann::json llama_json() {
  return {{"model_type", "llama"},    {"hidden_size", 64},       {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"intermediate_size", 96}, {"vocab_size", 100}};
}

TEST(FamilyTable, UnknownFamilyNamesFileFieldAndKnownFamilies) {
  nlohmann::json hf = llama_json();
  hf["model_type"] = "gemma7";
  hf["architectures"] = {"Gemma7ForCausalLM"};
  Errc code{};
  const std::string what = error_of([&] { parse_hf_config(hf, "dir/config.json"); }, &code);
  EXPECT_EQ(code, Errc::unsupported);
  EXPECT_EQ(exit_code(code), 3);
  for (const char* part : {"dir/config.json", "model_type", "gemma7", "llama, mistral, qwen2, qwen3"})
    EXPECT_NE(what.find(part), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos);
}

TEST(FamilyTable, ClassNameAndRoundTripThroughHfJson) {
  nlohmann::json hf = llama_json();
  hf.erase("model_type");
  hf["architectures"] = {"Qwen2ForCausalLM"};
  const ModelConfig c = parse_hf_config(hf, "test");
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  const nlohmann::json back = config_to_hf_json(c);
  EXPECT_EQ(back["architectures"][0], "Qwen2ForCausalLM");
  const ModelConfig again = parse_hf_config(back, "test");
  EXPECT_EQ(again.arch, c.arch);
  EXPECT_EQ(again.q_dim(), c.q_dim());
  EXPECT_EQ(family_of(again).name, "qwen2");
}

TEST(FamilyTable, ConfigNumbersThatDoNotFitAreRefusedNamingTheField) {
  const auto refused = [](nlohmann::json hf, const char* field) {
    Errc code{};
    const std::string what = error_of([&] { parse_hf_config(hf, "cfg.json"); }, &code);
    EXPECT_EQ(exit_code(code), 3) << what;
    EXPECT_NE(what.find(field), std::string::npos) << what;
    EXPECT_NE(what.find("cfg.json"), std::string::npos) << what;
  };
  nlohmann::json hf = llama_json();
  hf["num_key_value_heads"] = 3;  // 4 heads do not split into 3 groups
  refused(hf, "n_kv_heads");
  hf = llama_json();
  hf["num_attention_heads"] = 5;  // 64 / 5 is no head width
  hf["num_key_value_heads"] = 5;
  hf["head_dim"] = 13;
  refused(hf, "head_dim");
  hf = llama_json();
  hf["model_type"] = "mistral";
  hf["sliding_window"] = 0;
  refused(hf, "sliding_window");
  hf["sliding_window"] = -4;
  refused(hf, "sliding_window");
  hf["sliding_window"] = 8;
  EXPECT_EQ(parse_hf_config(hf, "cfg.json").sliding_window, 8);
  EXPECT_EQ(describe_model(parse_hf_config(hf, "cfg.json"), "cfg.json").layers[1].attention.window, 8);
}

// The tensors of a tiny llama with `layers` layers of tensors, finished with a config of config_layers.
ModelBuilder builder_with_layers(const ModelConfig& c, int64_t layers) {
  ModelConfig tensors_config = c;
  tensors_config.n_layers = layers;
  const ModelDesc d = describe_model(tensors_config, "test");
  ModelBuilder b;
  const auto add = [&](const std::string& name, Shape shape) {
    std::vector<float> v(static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1)), 0.25f);
    b.add_f32(name, std::move(shape), std::move(v));
  };
  add(std::string(kEmbedTensor), {c.vocab, c.dim});
  add(std::string(kFinalNormTensor), {c.dim});
  add(std::string(kLmHeadTensor), {c.vocab, c.dim});
  for (int64_t l = 0; l < layers; ++l)
    for (const TensorSpec& t : d.layers[l].tensors)
      add(hf_tensor_name(l, t),
          t.linear() ? Shape{dim_size(t.rows, c), dim_size(t.cols, c)} : Shape{dim_size(t.rows, c)});
  return b;
}

TEST(FamilyBuilder, ExactTensorSetLoads) {
  const ModelConfig c = testing::tiny_config();
  EXPECT_NO_THROW(builder_with_layers(c, c.n_layers).finish(c, "dir"));
}

TEST(FamilyBuilder, TensorOfALayerBeyondTheConfigIsRefused) {
  const ModelConfig c = testing::tiny_config();
  Errc code{};
  const std::string what = error_of([&] { builder_with_layers(c, c.n_layers + 1).finish(c, "dir"); }, &code);
  EXPECT_EQ(code, Errc::format);
  EXPECT_NE(what.find("'model.layers.2."), std::string::npos) << what;
  EXPECT_NE(what.find("dir"), std::string::npos) << what;
}

TEST(FamilyBuilder, TensorTheFamilyDoesNotHaveIsRefused) {
  const ModelConfig c = testing::tiny_config();  // llama without attention_bias
  ModelConfig qwen2 = c;
  qwen2.arch = "qwen2";
  const std::string bias = hf_tensor_name(0, *describe_model(qwen2, "test").layers[0].find(Role::q_bias));
  ModelBuilder b = builder_with_layers(c, c.n_layers);
  b.add_f32(bias, {c.q_dim()}, std::vector<float>(static_cast<size_t>(c.q_dim())));
  Errc code{};
  const std::string what = error_of([&] { b.finish(c, "dir"); }, &code);
  EXPECT_EQ(code, Errc::format);
  EXPECT_NE(what.find(bias), std::string::npos) << what;
  // The same tensors are a qwen2 model's.
  ModelBuilder ok = builder_with_layers(qwen2, qwen2.n_layers);
  EXPECT_NO_THROW(ok.finish(qwen2, "dir"));
}

TEST(FamilyBuilder, MissingTensorIsRefusedNamingIt) {
  const ModelConfig c = testing::tiny_config();
  Errc code{};
  const std::string what = error_of([&] { builder_with_layers(c, 1).finish(c, "dir"); }, &code);
  EXPECT_EQ(code, Errc::format);
  EXPECT_NE(what.find("'model.layers.1."), std::string::npos) << what;
  EXPECT_NE(what.find("missing"), std::string::npos) << what;
}

}  // namespace
}  // namespace lowbit::model
