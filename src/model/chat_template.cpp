#include <algorithm>
#include <chrono>

#include "lowbit/core/error.h"
#include "lowbit/model/chat.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/tokenizers.h"

namespace lowbit::model {
namespace {

constexpr std::string_view kChatmlStart = "<|im_start|>", kChatmlEnd = "<|im_end|>";
constexpr std::string_view kLlama3Header = "<|start_header_id|>", kLlama3HeaderEnd = "<|end_header_id|>";
constexpr std::string_view kLlama3Bos = "<|begin_of_text|>", kLlama3Eot = "<|eot_id|>";
// Gemma: "<bos><start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n", the system prompt at the head of
// the first user turn (HF's Gemma 2/3 chat templates).
constexpr std::string_view kGemmaBos = "<bos>", kGemmaStart = "<start_of_turn>", kGemmaEnd = "<end_of_turn>";
// Phi-3: "<|user|>\n...<|end|>\n<|assistant|>\n".
constexpr std::string_view kPhi3User = "<|user|>", kPhi3Assistant = "<|assistant|>", kPhi3End = "<|end|>";
// The tokens that end a model's turn, whichever format.
constexpr std::string_view kTurnEnds[] = {kChatmlEnd, kLlama3Eot, kGemmaEnd, kPhi3End};

// A fixed system prompt written out in a ChatML template ("<|im_start|>system\nYou are ...<|im_end|>"), as
// opposed to one built from the messages (which has quotes or expressions before the end marker).
std::optional<std::string> literal_system_prompt(std::string_view jinja) {
  const std::string head = std::string(kChatmlStart) + "system";
  for (size_t at = jinja.find(head); at != std::string_view::npos; at = jinja.find(head, at + 1)) {
    std::string_view rest = jinja.substr(at + head.size());
    if (rest.starts_with("\\n")) rest.remove_prefix(2);
    else if (rest.starts_with("\n")) rest.remove_prefix(1);
    else continue;
    const size_t end = rest.find(kChatmlEnd);
    if (end == std::string_view::npos || end == 0) continue;
    const std::string_view text = rest.substr(0, end);
    if (text.find_first_of("'\"{}+") == std::string_view::npos) return std::string(text);
  }
  return std::nullopt;
}

bool contains(std::string_view haystack, std::string_view needle) { return haystack.find(needle) != std::string_view::npos; }

std::optional<std::string> stored_template(const std::filesystem::path& model_path) {
  std::error_code ec;
  if (std::filesystem::is_directory(model_path, ec)) return read_chat_template(model_path / "tokenizer_config.json");
  if (is_gguf_file(model_path)) return gguf_chat_template(io::GgufFile::open(model_path));
  return std::nullopt;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  if (name == "chatml") return ChatFormat::chatml;
  if (name == "llama3") return ChatFormat::llama3;
  if (name == "gemma") return ChatFormat::gemma;
  if (name == "phi3") return ChatFormat::phi3;
  return std::nullopt;
}

std::optional<ChatTemplate> recognize_chat_template(std::string_view jinja) {
  if (contains(jinja, kLlama3Header) && contains(jinja, kLlama3Eot)) return ChatTemplate{ChatFormat::llama3, std::nullopt};
  if (contains(jinja, kChatmlStart) && contains(jinja, kChatmlEnd))
    return ChatTemplate{ChatFormat::chatml, literal_system_prompt(jinja)};
  if (contains(jinja, kGemmaStart) && contains(jinja, kGemmaEnd)) return ChatTemplate{ChatFormat::gemma, std::nullopt};
  if (contains(jinja, kPhi3User) && contains(jinja, kPhi3End)) return ChatTemplate{ChatFormat::phi3, std::nullopt};
  return std::nullopt;
}

ChatTemplate chat_template_for(const std::filesystem::path& model_path, const Tokenizer& tokenizer) {
  if (const auto jinja = stored_template(model_path))
    if (auto tmpl = recognize_chat_template(*jinja)) return *tmpl;
  if (tokenizer.token_id(kLlama3Header) && tokenizer.token_id(kLlama3Eot)) return {ChatFormat::llama3, std::nullopt};
  if (tokenizer.token_id(kChatmlStart) && tokenizer.token_id(kChatmlEnd)) return {ChatFormat::chatml, std::nullopt};
  if (tokenizer.token_id(kGemmaStart) && tokenizer.token_id(kGemmaEnd)) return {ChatFormat::gemma, std::nullopt};
  if (tokenizer.token_id(kPhi3User) && tokenizer.token_id(kPhi3End)) return {ChatFormat::phi3, std::nullopt};
  fail(Errc::unsupported, "[chat] {}: no ChatML, Llama-3, Gemma or Phi-3 chat template found; pass --template",
       model_path.string());
}

std::string render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  if (tmpl.format == ChatFormat::llama3) {
    out = kLlama3Bos;
    auto header = [&](std::string_view role) {
      out.append(kLlama3Header).append(role).append(kLlama3HeaderEnd).append("\n\n");
    };
    for (const auto& m : messages) {
      header(m.role);
      out.append(m.content).append(kLlama3Eot);
    }
    if (add_generation_prompt) header("assistant");
    return out;
  }
  if (tmpl.format == ChatFormat::gemma) {
    out = kGemmaBos;
    std::string_view system;
    for (const auto& m : messages) {
      if (m.role == "system") {
        system = m.content;
        continue;
      }
      out.append(kGemmaStart).append(m.role == "assistant" ? "model" : m.role).append("\n");
      if (!system.empty()) out.append(system).append("\n\n");
      system = {};
      out.append(m.content).append(kGemmaEnd).append("\n");
    }
    if (add_generation_prompt) out.append(kGemmaStart).append("model\n");
    return out;
  }
  if (tmpl.format == ChatFormat::phi3) {
    for (const auto& m : messages) out.append("<|").append(m.role).append("|>\n").append(m.content).append(kPhi3End).append("\n");
    if (add_generation_prompt) out.append(kPhi3Assistant).append("\n");
    return out;
  }
  auto turn = [&](std::string_view role) { out.append(kChatmlStart).append(role).append("\n"); };
  if (tmpl.default_system && (messages.empty() || messages.front().role != "system")) {
    turn("system");
    out.append(*tmpl.default_system).append(kChatmlEnd).append("\n");
  }
  for (const auto& m : messages) {
    turn(m.role);
    out.append(m.content).append(kChatmlEnd).append("\n");
  }
  if (add_generation_prompt) turn("assistant");
  return out;
}

ChatSession::ChatSession(const Model& model, const Tokenizer& tokenizer, ChatTemplate tmpl, int64_t context,
                         SamplerOptions sampler, std::optional<std::string> system)
    : model_(model),
      tokenizer_(tokenizer),
      template_(std::move(tmpl)),
      cache_(model.config, std::min(context, model.config.max_seq)),
      sampler_(sampler) {
  if (system) messages_.push_back({"system", *system});
}

GenerateStats ChatSession::reply(const std::string& user_message, int64_t max_tokens, ThreadPool& pool,
                                 const std::function<void(std::string_view)>& emit) {
  messages_.push_back({"user", user_message});
  const std::string full = render_chat(template_, messages_, true);
  if (full.compare(0, text_.size(), text_) != 0) fail(Errc::internal, "[chat] the rendered conversation changed");
  const std::vector<int32_t> fresh = tokenizer_.encode(std::string_view(full).substr(text_.size()), false, true);
  const auto pos = static_cast<int64_t>(tokens_.size());
  if (pos + static_cast<int64_t>(fresh.size()) >= cache_.capacity())
    fail(Errc::limit, "[chat] the conversation needs more than the {} tokens of context", cache_.capacity());
  text_ = full;

  GenerateStats stats;
  stats.prompt_tokens = static_cast<int64_t>(fresh.size());
  std::vector<float> logits(static_cast<size_t>(model_.config.vocab));
  const auto t0 = Clock::now();
  forward(model_, cache_, fresh, pos, logits.data(), false, pool);
  stats.prefill_seconds = seconds_since(t0);
  tokens_.insert(tokens_.end(), fresh.begin(), fresh.end());

  std::vector<int32_t> stops = tokenizer_.eos_ids();
  stops.insert(stops.end(), model_.config.eos_ids.begin(), model_.config.eos_ids.end());
  for (auto end : kTurnEnds)
    if (auto id = tokenizer_.token_id(end)) stops.push_back(*id);

  std::string answer;
  Utf8Stream out(emit);
  const auto t1 = Clock::now();
  while (stats.generated_tokens < max_tokens && static_cast<int64_t>(tokens_.size()) < cache_.capacity()) {
    const int32_t next = sampler_.sample(logits, tokens_);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
      stats.stopped_at_eos = true;
      break;
    }
    const std::string piece = tokenizer_.token_text_after(tokens_.back(), next);
    out.write(piece);
    answer += piece;
    ++stats.generated_tokens;
    forward(model_, cache_, std::span(&next, 1), static_cast<int64_t>(tokens_.size()), logits.data(), false, pool);
    tokens_.push_back(next);
  }
  stats.decode_seconds = seconds_since(t1);
  out.flush();
  messages_.push_back({"assistant", answer});
  text_ += answer;
  return stats;
}

}  // namespace lowbit::model
