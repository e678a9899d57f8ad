#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "lowbit/core/error.h"
#include "lowbit/io/json.h"
#include "lowbit/model/chat.h"
#include "lowbit/model/family.h"
#include "lowbit/model/gguf_model.h"
#include "lowbit/model/tokenizers.h"

namespace lowbit::model {
namespace {

// The built-in templates: the fallback when a model stores none, and what --template picks. Plain ChatML;
// Llama-3 as its early templates wrote it (no tools, no dates); Gemma as Gemma 3's template renders text turns (a
// leading system message joins the first user turn, assistant turns are "model", contents trimmed); Phi-3 as
// Phi-3.5-mini's. tests/model/chat_test.cpp checks the last two against the real templates' jinja2 output.
constexpr std::string_view kChatmlTemplate =
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";
constexpr std::string_view kLlama3Template =
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";
constexpr std::string_view kGemmaTemplate =
    "{{- bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set prefix = messages[0]['content'] + '\\n\\n' %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set prefix = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{{- (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}";
constexpr std::string_view kPhi3Template =
    "{%- for message in messages %}"
    "{%- if message['role'] in ['user', 'assistant'] or (message['role'] == 'system' and message['content']) %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- else %}{{ eos_token }}{%- endif %}";

struct BuiltinTemplate {
  ChatFormat format;
  std::string_view name;  // --template's value and the family table's chat_template
  std::string_view source;
  std::string_view tokens[2];  // special tokens a tokenizer made for this format has
};
// In the order a model without a stored template and without a family default is matched against.
constexpr BuiltinTemplate kBuiltinTemplates[] = {
    {ChatFormat::llama3, "llama3", kLlama3Template, {"<|start_header_id|>", "<|eot_id|>"}},
    {ChatFormat::chatml, "chatml", kChatmlTemplate, {"<|im_start|>", "<|im_end|>"}},
    {ChatFormat::gemma, "gemma", kGemmaTemplate, {"<start_of_turn>", "<end_of_turn>"}},
    {ChatFormat::phi3, "phi3", kPhi3Template, {"<|user|>", "<|end|>"}},
};

const BuiltinTemplate& builtin(ChatFormat format) {
  for (const auto& b : kBuiltinTemplates)
    if (b.format == format) return b;
  fail(Errc::internal, "[chat] built-in template {} is not in the table", static_cast<int>(format));
}

bool tokenizer_fits(const Tokenizer& tokenizer, const BuiltinTemplate& b) {
  return tokenizer.token_id(b.tokens[0]) && tokenizer.token_id(b.tokens[1]);
}

// Tokens that end an assistant turn in the templates lowbit meets (ChatML, Llama-3, Gemma, Phi-3/4).
constexpr std::string_view kEndOfTurnTokens[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"};

std::optional<std::string> read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) fail_errno("chat", path.string());
  return text.str();
}

std::string token_string(const Tokenizer& tokenizer, std::optional<int32_t> id) {
  return id ? tokenizer.token_text(*id) : std::string();
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::optional<ChatFormat> parse_chat_format(std::string_view name) {
  for (const auto& b : kBuiltinTemplates)
    if (b.name == name) return b.format;
  return std::nullopt;
}

std::pair<std::string, std::string> chat_special_tokens(const std::filesystem::path& model_path,
                                                      const Tokenizer& tokenizer) {
  const std::vector<int32_t> eos_ids = tokenizer.eos_ids();
  std::pair<std::string, std::string> tokens = {
      token_string(tokenizer, tokenizer.bos_id()),
      token_string(tokenizer, eos_ids.empty() ? std::nullopt : std::optional(eos_ids.front()))};
  bool bos_known = false, eos_known = false;
  std::error_code ec;
  const auto config = model_path / "tokenizer_config.json";
  if (std::filesystem::is_directory(model_path, ec) && std::filesystem::is_regular_file(config, ec)) {
    const auto json = io::read_json_file(config, "chat", size_t{64} << 20);
    auto text_of = [&](const char* key, std::string& out, bool& known) {
      const auto it = json.find(key);
      if (it == json.end()) return;
      known = true;
      if (it->is_string()) out = it->get<std::string>();
      else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) out = (*it)["content"];
      else out.clear();
    };
    text_of("bos_token", tokens.first, bos_known);
    text_of("eos_token", tokens.second, eos_known);
  }
  std::optional<std::filesystem::path> gguf;
  if (is_gguf_file(model_path)) {
    gguf = model_path;
  } else if (std::filesystem::is_directory(model_path, ec)) {  // an artifact of a GGUF source
    for (const auto& entry : std::filesystem::directory_iterator(model_path, ec))
      if (entry.path().extension() == ".gguf" && is_gguf_file(entry.path())) gguf = entry.path();
  }
  if (gguf && !(bos_known && eos_known)) {
    const auto file = io::GgufFile::open(*gguf);
    const auto vocab = file.get_strings("tokenizer.ggml.tokens");
    auto entry = [&](const char* key, std::string& out, bool known) {
      const auto id = file.get_uint(key);
      if (!known && vocab && id && *id < vocab->size()) out = (*vocab)[*id];
    };
    entry("tokenizer.ggml.bos_token_id", tokens.first, bos_known);
    entry("tokenizer.ggml.eos_token_id", tokens.second, eos_known);
  }
  return tokens;
}

ChatTemplate make_chat_template(std::string_view source, std::string name, const std::filesystem::path& model_path,
                                const Tokenizer& tokenizer) {
  auto [bos, eos] = chat_special_tokens(model_path, tokenizer);
  return {std::make_shared<const jinja::Template>(source, std::move(name)), std::move(bos), std::move(eos)};
}

std::string_view builtin_chat_template_source(ChatFormat format) { return builtin(format).source; }

ChatTemplate builtin_chat_template(ChatFormat format, const std::filesystem::path& model_path, const Tokenizer& tokenizer) {
  const auto& b = builtin(format);
  return make_chat_template(b.source, fmt::format("builtin {}", b.name), model_path, tokenizer);
}

ChatTemplate chat_template_from_file(const std::filesystem::path& file, const std::filesystem::path& model_path,
                                     const Tokenizer& tokenizer) {
  const auto source = read_text_file(file);
  if (!source) fail(Errc::missing_file, "[chat] {}: no such chat template file", file.string());
  return make_chat_template(*source, file.string(), model_path, tokenizer);
}

std::optional<std::string> stored_chat_template(const std::filesystem::path& model_path) {
  std::error_code ec;
  if (is_gguf_file(model_path)) return gguf_chat_template(io::GgufFile::open(model_path));
  if (!std::filesystem::is_directory(model_path, ec)) return std::nullopt;
  if (auto text = read_text_file(model_path / "chat_template.jinja")) return text;
  if (auto text = read_chat_template(model_path / "tokenizer_config.json")) return text;
  if (auto text = read_chat_template(model_path / "chat_template.json")) return text;
  for (const auto& entry : std::filesystem::directory_iterator(model_path, ec))  // an artifact of a GGUF source
    if (entry.path().extension() == ".gguf" && is_gguf_file(entry.path()))
      if (auto text = gguf_chat_template(io::GgufFile::open(entry.path()))) return text;
  return std::nullopt;
}

ChatTemplate chat_template_for(const Model& model, const std::filesystem::path& model_path,
                               const Tokenizer& tokenizer) {
  if (const auto source = stored_chat_template(model_path))
    return make_chat_template(*source, model_path.string(), model_path, tokenizer);
  // The family's own format first (Gemma GGUFs often carry no template), as long as the tokenizer has its tokens.
  if (const auto format = parse_chat_format(family_of(model.config).chat_template))
    if (tokenizer_fits(tokenizer, builtin(*format))) return builtin_chat_template(*format, model_path, tokenizer);
  for (const auto& b : kBuiltinTemplates)
    if (tokenizer_fits(tokenizer, b)) return builtin_chat_template(b.format, model_path, tokenizer);
  fail(Errc::unsupported,
       "[chat] {}: no chat template stored with the model and no special tokens of a built-in "
       "one (chatml, llama3, gemma, phi3); pass --template or --chat-template",
       model_path.string());
}

std::string render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        const jinja::Json& extra) {
  jinja::Json list = jinja::Json::array();
  for (const auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render_chat(tmpl, list, nullptr, add_generation_prompt, extra);
}

std::string render_chat(const ChatTemplate& tmpl, const jinja::Json& messages, const jinja::Json& tools,
                        bool add_generation_prompt, const jinja::Json& extra) {
  jinja::Json variables = {{"messages", messages},
                           {"tools", tools},
                           {"documents", nullptr},
                           {"add_generation_prompt", add_generation_prompt},
                           {"bos_token", tmpl.bos_token},
                           {"eos_token", tmpl.eos_token}};
  for (const auto& [k, v] : extra.items()) variables[k] = v;
  return tmpl.jinja->render(variables);
}

std::vector<int32_t> chat_stop_tokens(const Model& model, const Tokenizer& tokenizer) {
  std::vector<int32_t> stops = tokenizer.eos_ids();
  stops.insert(stops.end(), model.config.eos_ids.begin(), model.config.eos_ids.end());
  for (auto end : kEndOfTurnTokens)
    if (auto id = tokenizer.token_id(end)) stops.push_back(*id);
  return stops;
}

ParsedReply parse_tool_calls(std::string_view reply) {
  constexpr std::string_view open = "<tool_call>", close = "</tool_call>";
  ParsedReply parsed;
  size_t pos = 0;
  while (true) {
    const size_t begin = reply.find(open, pos);
    const size_t end = begin == std::string_view::npos ? begin : reply.find(close, begin + open.size());
    if (end == std::string_view::npos) break;
    const std::string_view body = reply.substr(begin + open.size(), end - begin - open.size());
    auto call = jinja::Json::parse(body, nullptr, false);
    auto args = call.is_object() ? call.value("arguments", jinja::Json::object()) : jinja::Json();
    if (args.is_string()) args = jinja::Json::parse(args.get<std::string>(), nullptr, false);
    const bool valid = call.is_object() && call.contains("name") && call["name"].is_string() && args.is_object();
    parsed.content.append(reply.substr(pos, begin - pos));
    if (valid) parsed.tool_calls.push_back({call["name"].get<std::string>(), std::move(args)});
    else parsed.content.append(reply.substr(begin, end + close.size() - begin));
    pos = end + close.size();
  }
  parsed.content.append(reply.substr(pos));
  if (!parsed.tool_calls.empty()) {
    const size_t first = parsed.content.find_first_not_of(" \t\r\n");
    parsed.content = first == std::string::npos
                         ? std::string()
                         : parsed.content.substr(first, parsed.content.find_last_not_of(" \t\r\n") - first + 1);
  }
  return parsed;
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
  std::vector<int32_t> fresh;
  if (full.compare(0, text_.size(), text_) == 0) {
    fresh = tokenizer_.encode(std::string_view(full).substr(text_.size()), false, true);
  } else {
    // Templates may re-render earlier turns (Qwen3 drops past reasoning, Llama-3.1 dates the system turn): keep
    // the cached tokens the new rendering shares and prefill the rest over what followed them.
    fresh = tokenizer_.encode(full, false, true);
    const auto diverge = std::mismatch(tokens_.begin(), tokens_.end(), fresh.begin(), fresh.end()).first;
    tokens_.erase(diverge, tokens_.end());
    fresh.erase(fresh.begin(), fresh.begin() + static_cast<std::ptrdiff_t>(tokens_.size()));
  }
  const auto pos = static_cast<int64_t>(tokens_.size());
  if (pos + static_cast<int64_t>(fresh.size()) >= cache_.capacity())
    fail(Errc::limit, "[chat] the conversation needs more than the {} tokens of context", cache_.capacity());
  if (fresh.empty()) fail(Errc::internal, "[chat] the rendered conversation added no tokens");
  text_ = full;

  GenerateStats stats;
  stats.prompt_tokens = static_cast<int64_t>(fresh.size());
  std::vector<float> logits(static_cast<size_t>(model_.config.vocab));
  const auto t0 = Clock::now();
  forward(model_, cache_, fresh, pos, logits.data(), false, pool);
  stats.prefill_seconds = seconds_since(t0);
  tokens_.insert(tokens_.end(), fresh.begin(), fresh.end());

  const std::vector<int32_t> stops = chat_stop_tokens(model_, tokenizer_);

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
