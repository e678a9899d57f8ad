// Jinja: an interpreter for the subset of Jinja2 that Hugging Face chat templates use (for/if/set/macro,
// namespaces, filters, tests, string and dict methods, whitespace control), rendering the way transformers'
// apply_chat_template does: trim_blocks and lstrip_blocks on, loop controls, raise_exception, strftime_now and
// HF's tojson (ensure_ascii off, Python json.dumps separators). Values are JSON (insertion-ordered objects, as
// Python dicts are). A hostile template fails with a one-line lowbit::Error naming the template and line: output
// size, loop iterations and nesting depth are bounded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lowbit::model::jinja {

using Json = nlohmann::ordered_json;

struct Limits {
  size_t max_output_bytes = size_t{64} << 20;  // also bounds every string a template builds
  int max_depth = 96;                         // nesting of expressions, statements and macro calls
  int64_t max_iterations = 1'000'000;         // loop iterations over a whole render
};

struct RenderOptions {
  Limits limits;
  // The time strftime_now formats; the local time when absent.
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parses `source`; `name` (a path or "builtin chatml") prefixes errors. Errc::format on a syntax error.
  Template(std::string_view source, std::string name, const Limits& limits = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token, ...). Errc::format for a
  // template that fails at run time (type errors, undefined attributes, raise_exception), Errc::limit for a bound.
  std::string render(const Json& variables, const RenderOptions& options = {}) const;
  const std::string& name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lowbit::model::jinja
