// Chat templates: recognition from Jinja strings, rendering, prefix stability.
#include <gtest/gtest.h>

#include <filesystem>

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

TEST(ChatTemplate, RecognizesChatmlWithItsDefaultSystemPrompt) {
  const auto tmpl = recognize_chat_template(kSmolTemplate);
  ASSERT_TRUE(tmpl.has_value());
  EXPECT_EQ(tmpl->format, ChatFormat::chatml);
  EXPECT_EQ(tmpl->default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(render_chat(*tmpl, {{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // An explicit system message replaces the default one.
  EXPECT_EQ(render_chat(*tmpl, {{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, RecognizesLlama3) {
  const auto tmpl = recognize_chat_template(
      "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
      "m['content'] | trim + '<|eot_id|>' }}{% endfor %}");
  ASSERT_TRUE(tmpl.has_value());
  EXPECT_EQ(tmpl->format, ChatFormat::llama3);
  EXPECT_EQ(render_chat(*tmpl, {{"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_FALSE(recognize_chat_template("{{ messages }}").has_value());
}

// Gemma 3's template as HF ships it (shortened to the parts that print): the system prompt opens the first user
// turn, the assistant is "model".
TEST(ChatTemplate, RecognizesGemma) {
  const auto tmpl = recognize_chat_template(
      "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + "
      "'\n\n' -%}{%- endif -%}{%- for message in loop_messages -%}{{ '<start_of_turn>' + role + '\n' + "
      "(first_user_prefix if loop.first else \"\") }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
      "{%- endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}");
  ASSERT_TRUE(tmpl.has_value());
  EXPECT_EQ(tmpl->format, ChatFormat::gemma);
  EXPECT_EQ(render_chat(*tmpl, {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}}, true),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplate, RecognizesPhi3) {
  const auto tmpl = recognize_chat_template(
      "{% for message in messages %}{% if message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
      "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + "
      "'<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}");
  ASSERT_TRUE(tmpl.has_value());
  EXPECT_EQ(tmpl->format, ChatFormat::phi3);
  EXPECT_EQ(render_chat(*tmpl, {{"user", "Hi"}}, true), "<|user|>\nHi<|end|>\n<|assistant|>\n");
}

TEST(ChatTemplate, RenderingIsPrefixStable) {
  for (const auto& tmpl : {ChatTemplate{ChatFormat::chatml, "sys"}, ChatTemplate{ChatFormat::llama3, std::nullopt},
                           ChatTemplate{ChatFormat::gemma, std::nullopt}, ChatTemplate{ChatFormat::phi3, std::nullopt}}) {
    std::vector<ChatMessage> messages = {{"system", "s"}, {"user", "a"}};
    const std::string first = render_chat(tmpl, messages, true);
    messages.push_back({"assistant", "b"});
    messages.push_back({"user", "c"});
    EXPECT_EQ(render_chat(tmpl, messages, true).rfind(first + "b", 0), 0u);
  }
}

TEST(ChatTemplate, Qwen3TemplateIsChatmlWithoutDefaultSystem) {
  const auto config = std::filesystem::path(LOWBIT_SHARED_DIR) / "tokenizers/qwen3/tokenizer_config.json";
  if (!std::filesystem::exists(config)) GTEST_SKIP() << config << " absent (../shared not mounted)";
  const auto jinja = read_chat_template(config);
  ASSERT_TRUE(jinja.has_value());
  const auto tmpl = recognize_chat_template(*jinja);
  ASSERT_TRUE(tmpl.has_value());
  EXPECT_EQ(tmpl->format, ChatFormat::chatml);
  EXPECT_FALSE(tmpl->default_system.has_value());
}

}  // namespace
}  // namespace lowbit::model
