// Chat templates: a model's own template executed, the built-in fallbacks, prefix stability, tool-call parsing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/gguf_builder.h"
#include "lowbit/core/thread_pool.h"
#include "lowbit/model/chat.h"
#include "lowbit/model/tokenizers.h"
#include "tiny_model.h"

namespace lowbit::model {
namespace {

// SmolLM2-135M-Instruct's template as its GGUF stores it (a fixed default system prompt).
constexpr const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

ChatTemplate compiled(std::string_view source, std::string bos = "") {
  return {std::make_shared<const jinja::Template>(source, "test"), std::move(bos), ""};
}

TEST(ChatTemplate, RunsTheModelsTemplateWithItsDefaultSystemPrompt) {
  const ChatTemplate tmpl = compiled(kSmolTemplate);
  EXPECT_EQ(render_chat(tmpl, {{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // An explicit system message replaces the default one.
  EXPECT_EQ(render_chat(tmpl, {{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, BuiltinLlama3) {
  const ChatTemplate tmpl = compiled(builtin_chat_template_source(ChatFormat::llama3), "<|begin_of_text|>");
  EXPECT_EQ(render_chat(tmpl, {{"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(parse_chat_format("llama3"), ChatFormat::llama3);
  EXPECT_EQ(parse_chat_format("chatml"), ChatFormat::chatml);
  EXPECT_EQ(parse_chat_format("gemma"), ChatFormat::gemma);
  EXPECT_EQ(parse_chat_format("phi3"), ChatFormat::phi3);
  EXPECT_FALSE(parse_chat_format("gemma3").has_value());
  EXPECT_FALSE(parse_chat_format("").has_value());
}

// The built-in Gemma and Phi-3 templates against the real ones (google/gemma-3-it, Phi-3.5-mini-instruct) as
// Python jinja2 rendered them (tests/model/fixtures/chat_templates, scripts/make_chat_template_fixtures.py), on
// every fixture conversation of plain text turns.
TEST(ChatTemplate, BuiltinGemmaAndPhi3RenderTextTurnsAsTheRealTemplates) {
  const std::filesystem::path dir = std::filesystem::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/chat_templates";
  auto json_of = [](const std::filesystem::path& file) {
    std::ifstream in(file);
    return nlohmann::json::parse(in);
  };
  const auto conversations = json_of(dir / "conversations.json");
  const std::pair<ChatFormat, const char*> real[] = {
      {ChatFormat::gemma, "google-gemma-3-it.expected.json"},
      {ChatFormat::phi3, "microsoft-Phi-3.5-mini-instruct.expected.json"}};
  for (const auto& [format, file] : real) {
    const auto expected = json_of(dir / file);
    ChatTemplate tmpl = compiled(builtin_chat_template_source(format), expected["bos_token"]);
    tmpl.eos_token = expected["eos_token"];
    int compared = 0;
    for (const auto& c : expected["cases"]) {
      const auto& messages = conversations[c["conversation"].get<std::string>()]["messages"];
      const bool text_turns = std::all_of(messages.begin(), messages.end(), [](const auto& m) {
        return m["content"].is_string() && m["role"] != "tool" && !m.contains("tool_calls");
      });
      if (!text_turns || c.contains("error") || !c["options"].empty()) continue;
      std::vector<ChatMessage> turns;
      for (const auto& m : messages) turns.push_back({m["role"], m["content"]});
      EXPECT_EQ(render_chat(tmpl, turns, c["add_generation_prompt"]), c["output"].get<std::string>())
          << file << " / " << c["conversation"];
      ++compared;
    }
    EXPECT_GE(compared, 4) << file;
  }
}

TEST(ChatTemplate, BuiltinRenderingIsPrefixStable) {
  for (auto format : {ChatFormat::chatml, ChatFormat::llama3, ChatFormat::gemma, ChatFormat::phi3}) {
    const ChatTemplate tmpl = compiled(builtin_chat_template_source(format), "<s>");
    std::vector<ChatMessage> messages = {{"user", "a"}};
    const std::string first = render_chat(tmpl, messages, true);
    messages.push_back({"assistant", "b"});
    messages.push_back({"user", "c"});
    EXPECT_EQ(render_chat(tmpl, messages, true).rfind(first + "b", 0), 0u);
  }
}

TEST(ChatTemplate, ExtraVariablesReachTheTemplate) {
  const ChatTemplate tmpl = compiled("{{ 'think' if enable_thinking is not defined or enable_thinking else 'fast' }}");
  EXPECT_EQ(render_chat(tmpl, {}, true), "think");
  EXPECT_EQ(render_chat(tmpl, {}, true, {{"enable_thinking", false}}), "fast");
}

TEST(ChatTemplate, Qwen3StoredTemplateRendersChatmlWithoutDefaultSystem) {
  const auto config = std::filesystem::path(LOWBIT_SHARED_DIR) / "tokenizers/qwen3/tokenizer_config.json";
  if (!std::filesystem::exists(config)) GTEST_SKIP() << config << " absent (../shared not mounted)";
  const auto jinja = read_chat_template(config);
  ASSERT_TRUE(jinja.has_value());
  EXPECT_EQ(render_chat(compiled(*jinja), {{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(compiled(*jinja), {{"user", "Hi"}}, true, {{"enable_thinking", false}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, ToolCallsRoundTripThroughQwenTemplate) {
  // What the template writes for an assistant tool call is what parse_tool_calls reads back.
  const auto source = std::ifstream(std::filesystem::path(LOWBIT_SOURCE_DIR) /
                                    "tests/model/fixtures/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  const std::string text((std::istreambuf_iterator<char>(source.rdbuf())), std::istreambuf_iterator<char>());
  const jinja::Json call = {{"name", "get_weather"}, {"arguments", {{"city", "Zürich"}, {"days", 2}}}};
  const jinja::Json messages = {{{"role", "user"}, {"content", "Weather?"}},
                                {{"role", "assistant"}, {"content", ""}, {"tool_calls", {{{"type", "function"}, {"function", call}}}}}};
  const std::string out = render_chat(compiled(text), messages, nullptr, false);
  const std::string header = "<|im_start|>assistant\n";
  const std::string reply = out.substr(out.rfind(header) + header.size());
  const ParsedReply parsed = parse_tool_calls(reply.substr(0, reply.find("<|im_end|>")));
  ASSERT_EQ(parsed.tool_calls.size(), 1u) << out;
  EXPECT_EQ(parsed.tool_calls[0].name, "get_weather");
  EXPECT_EQ(parsed.tool_calls[0].arguments, call["arguments"]);
  EXPECT_EQ(parsed.content, "");
}

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / fmt::format("lowbit_chat_{}_{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_file(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// One token per lowercase letter: the chat session's token bookkeeping is visible in the text.
class LetterTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool, bool) const override {
    std::vector<int32_t> ids;
    for (char ch : text) ids.push_back(ch - 'a');
    return ids;
  }
  std::string token_text(int32_t id) const override { return std::string(1, static_cast<char>('a' + id % 26)); }
  int32_t vocab_size() const override { return 32; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::vector<int32_t> eos_ids() const override { return {}; }
  std::optional<int32_t> token_id(std::string_view) const override { return std::nullopt; }
};

TEST(ChatTemplate, FindsTheTemplateStoredWithTheModel) {
  const fs::path dir = fresh_dir("stored");
  EXPECT_FALSE(stored_chat_template(dir).has_value());
  write_file(dir / "chat_template.json", R"({"chat_template": "from chat_template.json"})");
  EXPECT_EQ(stored_chat_template(dir), "from chat_template.json");
  // A list of named templates: the default one.
  write_file(dir / "tokenizer_config.json",
             R"({"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "dflt"}]})");
  EXPECT_EQ(stored_chat_template(dir), "dflt");
  write_file(dir / "chat_template.jinja", "from chat_template.jinja");
  EXPECT_EQ(stored_chat_template(dir), "from chat_template.jinja");
  fs::remove_all(dir);

  io::GgufBuilder g;
  g.kv_string("tokenizer.chat_template", "{{ 'from gguf' }}");
  const auto image = g.build();
  const fs::path gguf = fs::temp_directory_path() / fmt::format("lowbit_chat_{}.gguf", ::getpid());
  std::ofstream(gguf, std::ios::binary).write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  EXPECT_EQ(stored_chat_template(gguf), "{{ 'from gguf' }}");
  fs::remove(gguf);
}

TEST(ChatTemplate, SpecialTokensComeFromTheModelFiles) {
  const LetterTokenizer tok;  // no BOS, no EOS of its own
  const fs::path dir = fresh_dir("special");
  EXPECT_EQ(chat_special_tokens(dir, tok), std::make_pair(std::string(), std::string()));
  write_file(dir / "tokenizer_config.json", R"({"bos_token": {"content": "<bos>", "lstrip": false}, "eos_token": "<eos>"})");
  EXPECT_EQ(chat_special_tokens(dir, tok), std::make_pair(std::string("<bos>"), std::string("<eos>")));
  fs::remove_all(dir);

  // A GGUF names them by id in its vocabulary (SentencePiece tokenizers give control tokens no text of their own).
  io::GgufBuilder g;
  g.kv_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
  g.kv_scalar<uint32_t>("tokenizer.ggml.bos_token_id", io::GgufValueType::u32, 1);
  g.kv_scalar<uint32_t>("tokenizer.ggml.eos_token_id", io::GgufValueType::u32, 2);
  const auto image = g.build();
  const fs::path gguf = fs::temp_directory_path() / fmt::format("lowbit_chat_special_{}.gguf", ::getpid());
  std::ofstream(gguf, std::ios::binary).write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
  EXPECT_EQ(chat_special_tokens(gguf, tok), std::make_pair(std::string("<s>"), std::string("</s>")));
  fs::remove(gguf);
}

TEST(ChatSession, ATemplateThatRewritesEarlierTurnsReusesTheSharedPrefix) {
  // Earlier assistant turns render as "z" (as Qwen3 drops past reasoning): the second turn's text is no longer an
  // extension of the first, so the session must rewind to where they diverge.
  const auto model = testing::tiny_model(testing::tiny_config());
  const LetterTokenizer tok;
  SamplerOptions greedy;
  greedy.temperature = 0;
  ThreadPool pool(1);
  ChatSession session(*model, tok,
                      compiled("{% for m in messages %}{{ 'z' if m.role == 'assistant' else m.content }}{% endfor %}"),
                      64, greedy, std::nullopt);
  std::string first, second;
  session.reply("abc", 4, pool, [&](std::string_view s) { first += s; });
  const GenerateStats stats = session.reply("de", 4, pool, [&](std::string_view s) { second += s; });
  ASSERT_EQ(first.size(), 4u);
  // Shared: "abc" (and "z" when the first reply began with it); prefilled: the rest of "abczde".
  EXPECT_EQ(stats.prompt_tokens, first[0] == 'z' ? 2 : 3);
  // The same text prefilled from scratch gives the same greedy reply: nothing stale was attended to.
  ChatSession fresh(*model, tok, compiled("abczde"), 64, greedy, std::nullopt);
  std::string expected;
  fresh.reply("ignored", 4, pool, [&](std::string_view s) { expected += s; });
  EXPECT_EQ(second, expected);
}

TEST(ToolCalls, ParsesHermesStyleBlocks) {
  const ParsedReply r = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}</tool_call>\n");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments.dump(), R"({"city":"Zürich","days":2})");  // key order kept
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  EXPECT_EQ(r.tool_calls[1].arguments.dump(), R"({"tz":"UTC"})");
}

TEST(ToolCalls, LeavesTextWithoutValidCallsAlone) {
  EXPECT_TRUE(parse_tool_calls("plain answer ").tool_calls.empty());
  EXPECT_EQ(parse_tool_calls("plain answer ").content, "plain answer ");
  // Not JSON, no name, arguments not an object, unterminated: all stay text.
  for (const char* reply : {"<tool_call>get_weather(city)</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                            "<tool_call>{\"name\": \"f\", \"arguments\": {}}"}) {
    const ParsedReply r = parse_tool_calls(reply);
    EXPECT_TRUE(r.tool_calls.empty()) << reply;
    EXPECT_EQ(r.content, reply);
  }
  const ParsedReply no_args = parse_tool_calls("<tool_call>{\"name\": \"get_time\"}</tool_call>");
  ASSERT_EQ(no_args.tool_calls.size(), 1u);
  EXPECT_EQ(no_args.tool_calls[0].arguments, jinja::Json::object());
  EXPECT_EQ(no_args.content, "");
}

}  // namespace
}  // namespace lowbit::model
