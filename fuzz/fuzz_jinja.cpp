// libFuzzer target: any byte string given to jinja::Template as template source, rendered over a small chat
// conversation, must render or fail with a lowbit::Error; anything else (another exception, a crash, a sanitizer
// report, a hang) is a finding. Seeds: tests/model/fixtures/chat_templates/*.jinja.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lowbit/core/error.h"
#include "lowbit/model/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lowbit::model::jinja::Json;
  static const Json variables = {
      {"messages", Json::parse(R"([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
           "function": {"name": "f", "arguments": {"a": 1}}}]}, {"role": "tool", "content": "42"}])")},
      {"tools", Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])")},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  lowbit::model::jinja::RenderOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_iterations = 100000;
  try {
    const lowbit::model::jinja::Template tmpl(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    tmpl.render(variables, options);
  } catch (const lowbit::Error&) {
  }
  return 0;
}
