// The Jinja interpreter: real chat templates rendered byte-identically to Python jinja2 (fixtures written by
// scripts/make_chat_template_fixtures.py), the language pieces templates use, and hostile templates failing with
// one-line errors instead of crashing or hanging.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "lowbit/core/error.h"
#include "lowbit/model/jinja.h"

namespace lowbit::model::jinja {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(LOWBIT_SOURCE_DIR) / "tests/model/fixtures/chat_templates";

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::tm parse_time(const std::string& iso) {  // "2026-12-04T15:30:00"
  std::tm tm{};
  std::istringstream(iso) >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  const std::time_t t = timegm(&tm);
  gmtime_r(&t, &tm);  // fills in the weekday and day of the year
  return tm;
}

std::string render(std::string_view source, const Json& variables) {
  return Template(source, "test").render(variables);
}

TEST(Jinja, RealTemplatesMatchPythonJinja2ByteForByte) {
  const Json conversations = Json::parse(read_text(kFixtures / "conversations.json"));
  int templates = 0, cases = 0, passed = 0;
  for (const auto& entry : fs::directory_iterator(kFixtures)) {
    const std::string file = entry.path().filename().string();
    if (!file.ends_with(".expected.json")) continue;
    const Json expected = Json::parse(read_text(entry.path()));
    const std::string name = expected["template"];
    const Template tmpl(read_text(kFixtures / name), name);
    RenderOptions options;
    options.now = parse_time(expected["now"]);
    ++templates;
    for (const auto& c : expected["cases"]) {
      const Json& conversation = conversations[c["conversation"].get<std::string>()];
      Json variables = {{"messages", conversation["messages"]},
                        {"tools", conversation.contains("tools") ? conversation["tools"] : Json(nullptr)},
                        {"documents", nullptr},
                        {"add_generation_prompt", c["add_generation_prompt"]},
                        {"bos_token", expected["bos_token"]},
                        {"eos_token", expected["eos_token"]}};
      for (const auto& [k, v] : c["options"].items()) variables[k] = v;
      const std::string label = fmt::format("{} / {} {} agp={}", name, c["conversation"].get<std::string>(),
                                            c["options"].dump(), c["add_generation_prompt"].get<bool>());
      ++cases;
      if (c.contains("error")) {
        try {
          const std::string out = tmpl.render(variables, options);
          ADD_FAILURE() << label << ": jinja2 refused (" << c["error"].get<std::string>() << ") but we rendered:\n"
                        << out;
        } catch (const Error& e) {
          EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
          ++passed;
        }
        continue;
      }
      try {
        const std::string out = tmpl.render(variables, options);
        EXPECT_EQ(out, c["output"].get<std::string>()) << label;
        if (out == c["output"].get<std::string>()) ++passed;
      } catch (const Error& e) {
        ADD_FAILURE() << label << ": " << e.what();
      }
    }
  }
  std::printf("[jinja] %d templates, %d/%d cases identical to jinja2\n", templates, passed, cases);
  EXPECT_GE(templates, 20);
  EXPECT_EQ(passed, cases);
}

TEST(Jinja, LanguageSnippetsMatchPythonJinja2) {
  const Json expected = Json::parse(read_text(kFixtures / "language_snippets.json"));
  RenderOptions options;
  options.now = parse_time(expected["now"]);
  int passed = 0;
  for (const auto& c : expected["cases"]) {
    const std::string source = c["source"];
    try {
      const std::string out = Template(source, "snippet").render(expected["variables"], options);
      if (c.contains("error")) {
        ADD_FAILURE() << source << "\njinja2 refused (" << c["error"].get<std::string>() << ") but we rendered: " << out;
      } else {
        EXPECT_EQ(out, c["output"].get<std::string>()) << source;
        passed += out == c["output"].get<std::string>();
      }
    } catch (const Error& e) {
      if (c.contains("error")) ++passed;
      else ADD_FAILURE() << source << "\n" << e.what();
    }
  }
  std::printf("[jinja] %d/%zu snippets identical to jinja2\n", passed, expected["cases"].size());
  EXPECT_EQ(passed, static_cast<int>(expected["cases"].size()));
}

TEST(Jinja, WhitespaceControlFollowsTrimAndLstripBlocks) {
  // trim_blocks eats the newline after a block tag; lstrip_blocks the indentation before one; "-" all whitespace.
  EXPECT_EQ(render("{% if true %}\n  a\n  {% endif %}\nb", Json::object()), "  a\nb");
  EXPECT_EQ(render("x  {%- if true -%}  y  {%- endif -%}  z", Json::object()), "xyz");
  EXPECT_EQ(render("  {{ 1 }}\n", Json::object()), "  1");  // expressions keep indentation; one final \n goes
  EXPECT_EQ(render("a {# note #}\nb", Json::object()), "a b");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}", Json::object()), "  x");
  EXPECT_EQ(render("{% raw %}{{ not code }}{% endraw %}", Json::object()), "{{ not code }}");
}

TEST(Jinja, ExpressionsFollowPythonSemantics) {
  const Json vars = {{"s", "Hello World"}, {"xs", {3, 1, 2}}, {"d", {{"b", 1}, {"a", 2}}}, {"f", 2.5}};
  EXPECT_EQ(render("{{ s[::-1] }}|{{ s[-5:] }}|{{ s.split()[1] }}|{{ s.lower().startswith('hello') }}", vars),
            "dlroW olleH|World|World|True");
  EXPECT_EQ(render("{{ xs }}|{{ d }}|{{ none }}|{{ f * 2 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ 1 / 4 }}", vars),
            "[3, 1, 2]|{'b': 1, 'a': 2}|None|5.0|3|2|0.25");
  EXPECT_EQ(render("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"' | tojson }}", vars),
            "{\"b\": 1, \"a\": 2}|{\n  \"b\": 1,\n  \"a\": 2\n}|\"é\\\"\"");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ loop.index }}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}", vars),
            "1b=1,2a=2");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in xs if x > 1 %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}", vars),
            "5");
  EXPECT_EQ(render("{{ xs | sort | join('-') }}|{{ xs | map('string') | list | length }}|{{ 'a' ~ 1 ~ none }}", vars),
            "1-2-3|3|a1None");
  EXPECT_EQ(render("{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}{{ greet('Bob') }}/{{ greet('Al', p='Yo') }}", vars),
            "Hi Bob/Yo Al");
  EXPECT_EQ(render("{{ missing is defined }}{{ missing | default('x') }}{{ d.get('zz', 7) }}{{ 'b' in d }}", vars),
            "Falsex7True");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", vars),
            "3");
}

TEST(Jinja, ErrorsNameTheTemplateAndLine) {
  try {
    render("line one\n{{ raise_exception('roles must alternate') }}", Json::object());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[jinja] test:2: raise_exception: roles must alternate");
  }
  try {
    Template("{% for x in xs %}\n{{ x }", "bad.jinja");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::format);
    EXPECT_NE(std::string(e.what()).find("bad.jinja:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(render("{{ x.y }}", Json::object()), Error);  // attribute of undefined
  EXPECT_THROW(render("{{ 1 + 'a' }}", Json::object()), Error);
  EXPECT_THROW(render("{% for x in none %}{% endfor %}", Json::object()), Error);
  EXPECT_THROW(Template("{% frobnicate %}", "t"), Error);
}

TEST(Jinja, DeeplyNestedInputIsRefused) {
  Json deep = Json::array();
  for (int i = 0; i < 2000; ++i) deep = Json::array({deep});
  for (const char* source : {"{{ x | tojson }}", "{{ x }}"}) {
    try {
      render(source, {{"x", deep}});
      ADD_FAILURE() << source;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::limit) << e.what();
    }
  }
}

TEST(Jinja, HostileTemplatesHitBoundsNotTheMachine) {
  auto code_of = [](std::string_view source) {
    try {
      render(source, Json::object());
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      return e.code();
    }
    return Errc::internal;
  };
  EXPECT_EQ(code_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), Errc::limit);
  EXPECT_EQ(code_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"), Errc::limit);
  EXPECT_EQ(code_of("{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
            Errc::limit);
  EXPECT_EQ(code_of("{{ 'x' * 100000000000 }}"), Errc::limit);
  EXPECT_EQ(code_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"), Errc::format);
  EXPECT_EQ(code_of("{{ " + std::string(50000, '[') + " }}"), Errc::format);
  EXPECT_EQ(code_of(std::string(5000, '{') + "%"), Errc::format);
  EXPECT_EQ(code_of("{{ ('x' * 1000000) | replace('', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}"),
            Errc::limit);
  EXPECT_EQ(code_of("{{ 'a' | indent(1000000000) }}"), Errc::limit);
  EXPECT_EQ(code_of("{{ range(2000000) | list | length }}"), Errc::limit);
}

}  // namespace
}  // namespace lowbit::model::jinja

namespace lowbit::model::jinja {
namespace {

// Mutated real templates (pieces cut, repeated, or syntax dropped in) must render or fail with a one-line
// lowbit::Error: no other exception, no crash, no hang.
TEST(Jinja, MutatedTemplatesRenderOrFailCleanly) {
  const Json conversations = Json::parse(read_text(kFixtures / "conversations.json"));
  const Json variables = {{"messages", conversations["tool_call"]["messages"]},
                          {"tools", conversations["tool_call"]["tools"]},
                          {"add_generation_prompt", true},
                          {"bos_token", "<s>"},
                          {"eos_token", "</s>"}};
  static constexpr std::string_view kPieces[] = {"{%", "%}", "{{", "}}", "{#", "-", "(", ")", "[", "]", "|", "'",
                                                 "endfor", "endif", "else", "loop", "namespace(", ".", ",", "\\"};
  std::mt19937 rng(19);
  int rendered = 0, refused = 0;
  for (const auto& entry : fs::directory_iterator(kFixtures)) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string source = read_text(entry.path());
    for (int round = 0; round < 24; ++round) {
      std::string text = source;
      for (int edit = 0; edit < 3 && !text.empty(); ++edit) {
        const size_t at = rng() % text.size(), len = std::min<size_t>(rng() % 40, text.size() - at);
        switch (rng() % 3) {
          case 0: text.erase(at, len); break;
          case 1: text.insert(at, text.substr(at, len)); break;
          default: text.insert(at, kPieces[rng() % std::size(kPieces)]);
        }
      }
      try {
        Template(text, entry.path().filename().string()).render(variables);
        ++rendered;
      } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
        ++refused;
      }
    }
  }
  std::printf("[jinja] mutated templates: %d rendered, %d refused\n", rendered, refused);
  EXPECT_GT(rendered, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace lowbit::model::jinja
