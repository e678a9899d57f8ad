// Chat: the prompt formats of instruction-tuned models (ChatML, Llama-3, Gemma, Phi-3), recognized from a model's Jinja chat
// template string (tokenizer_config.json or GGUF tokenizer.chat_template) rather than by running Jinja, and a
// session that keeps the KV cache across turns so each turn only prefills its new tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/model/generate.h"
#include "lowbit/model/model.h"

namespace lowbit::model {

enum class ChatFormat { chatml, llama3, gemma, phi3 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ChatTemplate {
  ChatFormat format = ChatFormat::chatml;
  // The system prompt the template inserts when the conversation has none (SmolLM2, Qwen2.5 do).
  std::optional<std::string> default_system;
};

// "chatml", "llama3", "gemma" or "phi3"; nullopt otherwise.
std::optional<ChatFormat> parse_chat_format(std::string_view name);
// Recognizes a Jinja template by its markers; nullopt when it is none of the formats.
std::optional<ChatTemplate> recognize_chat_template(std::string_view jinja);
// The template of a model: from GGUF metadata or tokenizer_config.json beside it, else guessed from the
// tokenizer's special tokens. Errc::unsupported when none fits (pass --template).
ChatTemplate chat_template_for(const std::filesystem::path& model_path, const Tokenizer& tokenizer);

// The prompt text for `messages`, ending with the assistant header when add_generation_prompt. Rendering is
// prefix-stable: the text of a conversation is a prefix of the text of any continuation of it.
std::string render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt);

// A conversation with one model: each reply continues the KV cache of the turns before it.
class ChatSession {
 public:
  ChatSession(const Model& model, const Tokenizer& tokenizer, ChatTemplate tmpl, int64_t context,
              SamplerOptions sampler, std::optional<std::string> system);
  // Adds a user message, streams the reply through `emit` (whole UTF-8 characters), returns the statistics.
  // Stops at an end-of-turn token or after max_tokens. Errc::limit when the context is full.
  GenerateStats reply(const std::string& user_message, int64_t max_tokens, ThreadPool& pool,
                      const std::function<void(std::string_view)>& emit);

 private:
  const Model& model_;
  const Tokenizer& tokenizer_;
  ChatTemplate template_;
  KvCache cache_;
  Sampler sampler_;
  std::vector<ChatMessage> messages_;
  std::vector<int32_t> tokens_;  // everything in the cache
  std::string text_;             // the rendered text those tokens stand for
};

}  // namespace lowbit::model
