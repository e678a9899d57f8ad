#include "lowbit/quant/calibration.h"

#include <array>
#include <deque>

#include "lowbit/core/error.h"
#include "lowbit/core/sha256.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/io/text_file.h"

namespace lowbit::quant {

namespace {

// Records the input of a linear into a Hessian on every call, then computes through the wrapped kernel.
class CapturingLinear final : public kernels::CpuLinear {
 public:
  CapturingLinear(const kernels::CpuLinear& inner, Hessian& h) : inner_(inner), h_(h) {}
  int64_t rows() const override { return inner_.rows(); }
  int64_t cols() const override { return inner_.cols(); }
  uint64_t weight_bytes() const override { return inner_.weight_bytes(); }
  void matmul(const float* x, int64_t m, float* y, ThreadPool& pool) const override {
    h_.add(x, m, inner_.cols());
    inner_.matmul(x, m, y, pool);
  }
  void gather_rows(std::span<const int32_t> ids, float* out) const override { inner_.gather_rows(ids, out); }

 private:
  const kernels::CpuLinear& inner_;
  Hessian& h_;
};

// Puts a capturing wrapper in `slot` for as long as it lives.
class CaptureScope {
 public:
  CaptureScope(std::unique_ptr<kernels::CpuLinear>& slot, Hessian& h)
      : slot_(slot), original_(std::move(slot)) {
    h.dim = original_->cols();
    slot_ = std::make_unique<CapturingLinear>(*original_, h);
  }
  ~CaptureScope() { slot_ = std::move(original_); }

 private:
  std::unique_ptr<kernels::CpuLinear>& slot_;
  std::unique_ptr<kernels::CpuLinear> original_;
};

}  // namespace

Hessian& LayerHessians::of(LinearInput input) {
  switch (input) {
    case LinearInput::attn_in: return attn_in;
    case LinearInput::attn_out: return attn_out;
    case LinearInput::ffn_in: return ffn_in;
    case LinearInput::ffn_mid: return ffn_mid;
    case LinearInput::expert_in: case LinearInput::expert_mid: break;
  }
  fail(Errc::internal, "[calibration] no Hessian is shared by the linears of an expert");
}

namespace {
Hessian& collected(LayerHessians& hs, LinearInput input, int32_t expert) {
  if (!is_expert_input(input)) return hs.of(input);
  std::vector<Hessian>& per_expert = input == LinearInput::expert_in ? hs.expert_in : hs.expert_mid;
  if (expert < 0 || static_cast<size_t>(expert) >= per_expert.size())
    fail(Errc::internal, "[calibration] no Hessian for expert {}", expert);
  return per_expert[static_cast<size_t>(expert)];
}
}  // namespace

Hessian* LayerHessians::for_linear(LinearInput input, int32_t expert) {
  Hessian& h = collected(*this, input, expert);
  return !is_expert_input(input) || h.samples >= static_cast<uint64_t>(h.dim) ? &h : nullptr;
}

uint64_t LayerHessians::rows(LinearInput input, int32_t expert) { return collected(*this, input, expert).samples; }

bool is_expert_input(LinearInput input) {
  return input == LinearInput::expert_in || input == LinearInput::expert_mid;
}

std::optional<LayerLinear> layer_linear(const model::ModelDesc& desc, std::string_view tensor_name) {
  const auto t = model::find_layer_tensor(desc, tensor_name);
  if (!t) return std::nullopt;
  const auto input = model::linear_input(t->spec->role);
  if (!input) return std::nullopt;
  return LayerLinear{t->layer, t->spec->role, *input, t->spec->expert};
}

int64_t CalibrationText::tokens() const {
  int64_t n = 0;
  for (const auto& w : windows) n += static_cast<int64_t>(w.size());
  return n;
}

CalibrationText load_calibration(const std::filesystem::path& path, const model::Tokenizer& tokenizer,
                                 int64_t max_tokens, int64_t ctx) {
  // Far more text than any calibration takes (the Debian reference is 0.9 MB), and a bound on a gzip's expansion.
  constexpr uint64_t kMaxTextBytes = uint64_t{256} << 20;
  const std::string text = io::read_text_file(path, "calibration", kMaxTextBytes);
  CalibrationText out;
  out.sha256 = sha256_hex(std::as_bytes(std::span(text)));
  // Line by line: tokenizers' merge loops grow faster than linearly with the piece they are given, and only a
  // prefix of a long text is needed.
  std::vector<int32_t> ids;
  for (size_t at = 0; at < text.size() && static_cast<int64_t>(ids.size()) < max_tokens;) {
    const size_t nl = text.find('\n', at);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    const auto piece = tokenizer.encode(std::string_view(text).substr(at, end - at), false, false);
    ids.insert(ids.end(), piece.begin(), piece.end());
    at = end;
  }
  const auto bos = tokenizer.bos_id();
  const int64_t body = bos ? ctx - 1 : ctx;
  for (size_t at = 0; at < ids.size() && out.tokens() < max_tokens; at += static_cast<size_t>(body)) {
    std::vector<int32_t> w;
    if (bos) w.push_back(*bos);
    const size_t end = std::min(ids.size(), at + static_cast<size_t>(body));
    w.insert(w.end(), ids.begin() + static_cast<std::ptrdiff_t>(at), ids.begin() + static_cast<std::ptrdiff_t>(end));
    if (w.size() < 2) break;
    out.windows.push_back(std::move(w));
  }
  if (out.windows.empty()) fail(Errc::format, "[calibration] {}: no tokens to calibrate on", path.string());
  return out;
}

LayerwiseCalibrator::LayerwiseCalibrator(model::Model& model, const CalibrationText& text) : model_(model) {
  const int64_t dim = model.config.dim;
  for (const auto& w : text.windows) {
    ctx_ = std::max<int64_t>(ctx_, static_cast<int64_t>(w.size()));
    std::vector<float> x(w.size() * static_cast<size_t>(dim));
    model.embed->gather_rows(w, x.data());  // x [len, dim]
    hidden_.push_back(std::move(x));
  }
}

void LayerwiseCalibrator::run_layer(int64_t layer) {
  const int64_t dim = model_.config.dim;
  model::KvCache cache(model_.config, ctx_);
  for (auto& x : hidden_) {
    const auto m = static_cast<int64_t>(x.size()) / dim;
    model::forward_layers(model_, cache, x.data(), m, 0, layer, layer + 1, default_pool());
  }
}

LayerHessians LayerwiseCalibrator::capture(int64_t layer) {
  LayerHessians h;
  auto& w = model_.layers.at(static_cast<size_t>(layer));
  const std::vector<std::vector<float>> saved = hidden_;
  {
    // One capture per input: the first linear reading it records it for all that share it.
    std::deque<CaptureScope> scopes;
    std::array<bool, 4> captured{};
    for (const model::TensorSpec& t : model_.desc.layers.at(static_cast<size_t>(layer)).tensors) {
      const auto input = model::linear_input(t.role);
      if (!input || is_expert_input(*input) || captured[static_cast<size_t>(*input)]) continue;
      captured[static_cast<size_t>(*input)] = true;
      scopes.emplace_back(w.linear_slot(t.role), h.of(*input));
    }
    // Each expert's gate sees exactly the rows routed to it (the moe op gathers them), and its down their
    // activations.
    h.expert_in.resize(w.experts.size());
    h.expert_mid.resize(w.experts.size());
    for (size_t e = 0; e < w.experts.size(); ++e) {
      scopes.emplace_back(w.experts[e].gate, h.expert_in[e]);
      scopes.emplace_back(w.experts[e].down, h.expert_mid[e]);
    }
    run_layer(layer);
  }
  hidden_ = saved;
  return h;
}

void LayerwiseCalibrator::advance(int64_t layer) { run_layer(layer); }

}  // namespace lowbit::quant
