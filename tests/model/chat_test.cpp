// Chat templates: a model's own template executed, the built-in fallbacks, prefix stability, tool-call parsing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "lowbit/model/chat.h"
#include "lowbit/model/tokenizers.h"

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
  EXPECT_FALSE(parse_chat_format("gemma").has_value());
}

TEST(ChatTemplate, BuiltinRenderingIsPrefixStable) {
  for (auto format : {ChatFormat::chatml, ChatFormat::llama3}) {
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
