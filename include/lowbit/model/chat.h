// Chat: a model's own Jinja chat template (chat_template.jinja, tokenizer_config.json, chat_template.json or GGUF
// tokenizer.chat_template) executed by the Jinja interpreter, built-in ChatML and Llama-3 templates as the fallback,
// tool calls parsed out of replies, and a session that keeps the KV cache across turns so each turn only prefills
// the tokens its rendering changed.
#pragma once

#include <filesystem>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/model/generate.h"
#include "lowbit/model/jinja.h"
#include "lowbit/model/model.h"

namespace lowbit::model {

enum class ChatFormat { chatml, llama3, gemma, phi3 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct ChatTemplate {
  std::shared_ptr<const jinja::Template> jinja;
  std::string bos_token, eos_token;  // the template variables of those names
};

// "chatml", "llama3", "gemma" or "phi3"; nullopt otherwise.
std::optional<ChatFormat> parse_chat_format(std::string_view name);
// The Jinja source of a built-in template (plain ChatML; Llama-3 without tools or dates; Gemma's and Phi-3's text
// turns).
std::string_view builtin_chat_template_source(ChatFormat format);
ChatTemplate builtin_chat_template(ChatFormat format, const std::filesystem::path& model_path, const Tokenizer& tokenizer);
// `source` compiled as a chat template for the model at `model_path`; `name` appears in errors.
ChatTemplate make_chat_template(std::string_view source, std::string name, const std::filesystem::path& model_path,
                                const Tokenizer& tokenizer);
// A template file given by the user (--chat-template FILE). Errc::missing_file when it cannot be read.
ChatTemplate chat_template_from_file(const std::filesystem::path& file, const std::filesystem::path& model_path,
                                     const Tokenizer& tokenizer);
// The bos_token and eos_token a template sees, as transformers passes them: tokenizer_config.json's (a string or
// {"content": ...}), else the GGUF vocabulary's entry for the BOS/EOS id, else the tokenizer's text of the token
// (empty for SentencePiece control tokens, hence the other sources first).
std::pair<std::string, std::string> chat_special_tokens(const std::filesystem::path& model_path, const Tokenizer& tokenizer);
// The template string stored with a model, if any: a directory's chat_template.jinja, tokenizer_config.json
// "chat_template" or chat_template.json, a GGUF's tokenizer.chat_template (also a GGUF tokenizer inside an artifact).
std::optional<std::string> stored_chat_template(const std::filesystem::path& model_path);
// The template of a model: its stored one, else its family's built-in format (family.h), else a built-in one
// guessed from the tokenizer's special tokens. Errc::unsupported when none fits (pass --template or --chat-template).
ChatTemplate chat_template_for(const Model& model, const std::filesystem::path& model_path, const Tokenizer& tokenizer);

// The prompt text for `messages` (HF apply_chat_template's variables: messages, tools, add_generation_prompt,
// bos_token, eos_token, plus `extra`, e.g. {"enable_thinking": false}).
std::string render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        const jinja::Json& extra = jinja::Json::object());
// The same for OpenAI-style JSON messages (tool_calls, tool results, content parts) and tool definitions (an array,
// or null for none).
std::string render_chat(const ChatTemplate& tmpl, const jinja::Json& messages, const jinja::Json& tools,
                        bool add_generation_prompt, const jinja::Json& extra = jinja::Json::object());

// The tokens that end a reply: the tokenizer's and the config's end-of-sequence ids and the end-of-turn tokens of
// the chat formats (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>) the vocabulary has.
std::vector<int32_t> chat_stop_tokens(const Model& model, const Tokenizer& tokenizer);

// A tool call a model wrote in its reply.
struct ToolCall {
  std::string name;
  jinja::Json arguments;  // an object
};

struct ParsedReply {
  std::string content;  // the reply without its tool-call blocks (trimmed of the whitespace they leave)
  std::vector<ToolCall> tool_calls;
};

// Splits Qwen/Hermes-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks out of a reply.
// "arguments" may also be a JSON string holding the object. A block that is not such JSON stays in `content`.
ParsedReply parse_tool_calls(std::string_view reply);

// A conversation with one model: each reply continues the KV cache of the turns before it.
class ChatSession {
 public:
  ChatSession(const Model& model, const Tokenizer& tokenizer, ChatTemplate tmpl, int64_t context,
              SamplerOptions sampler, std::optional<std::string> system);
  // Adds an earlier turn of the conversation (any role) without generating; the next reply() prefills it.
  void add_message(ChatMessage message) { messages_.push_back(std::move(message)); }
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
