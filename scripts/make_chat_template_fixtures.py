#!/usr/bin/env python3
"""Renders every chat template in tests/model/fixtures/chat_templates/*.jinja over a set of conversations with
Python's jinja2, the way transformers' apply_chat_template does, and writes the results as fixtures that
tests/model/jinja_test.cpp must reproduce byte for byte.

The environment copies transformers' _cached_compile_jinja_template (utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loop controls and the {% generation %}
tag, its tojson (json.dumps with ensure_ascii=False), raise_exception and strftime_now globals; render() gets
messages, tools, documents=None, add_generation_prompt and the special tokens, as apply_chat_template passes them.
strftime_now reads a fixed time (NOW) so the fixtures do not depend on the day they were made.

Writes conversations.json (the inputs) and <template>.expected.json (one case per conversation and options: the
output, or the error message when the template refuses the conversation).

Usage: scripts/make_chat_template_fixtures.py   (needs python3-jinja2 >= 3.1)
"""
import datetime
import json
import pathlib

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests/model/fixtures/chat_templates"
NOW = datetime.datetime(2026, 12, 4, 15, 30, 0)

# Special tokens each family's tokenizer_config declares; templates print them.
TOKENS = {
    "llama-3": ("<|begin_of_text|>", "<|eot_id|>"),
    "Llama-3": ("<|begin_of_text|>", "<|eot_id|>"),
    "firefunction": ("<|begin_of_text|>", "<|eot_id|>"),
    "functionary": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen": ("", "<|im_end|>"),
    "gemma": ("<bos>", "<eos>"),
    "mistral": ("<s>", "</s>"),
    "Mistral": ("<s>", "</s>"),
    "Phi": ("<s>", "<|endoftext|>"),
    "DeepSeek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "granite": ("<|start_of_role|>", "<|end_of_text|>"),
    "SmolLM": ("<|im_start|>", "<|im_end|>"),
    "Cohere": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time, no arguments.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]

TOOL_CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
}

CONVERSATIONS = {
    "single": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_multi": {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "  And 3+3?  "},
        ]
    },
    "unicode": {
        "messages": [
            {"role": "user", "content": "Grüße, 世界 🙂 — \"quotes\" and 'apostrophes'\nsecond line\ttab \\ backslash"},
            {"role": "assistant", "content": "Bonjour ! ¿Qué tal?"},
            {"role": "user", "content": "{{ not a template }} {% neither %}"},
        ]
    },
    "tools": {
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "What's the weather in Zürich?"},
        ],
        "tools": TOOLS,
    },
    "tool_call": {
        "messages": [
            {"role": "user", "content": "What's the weather in Zürich?"},
            {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
            {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 3.5, \"sky\": \"snow\"}"},
            {"role": "assistant", "content": "It is 3.5 °C and snowing."},
            {"role": "user", "content": "Thanks!"},
        ],
        "tools": TOOLS,
    },
    "openai_tool_calls": {  # as OpenAI clients send them: arguments a JSON string, two calls, reasoning apart
        "messages": [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "Weather and time in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Two lookups.",
                "tool_calls": [
                    {"id": "call00001", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
                    {"id": "call00002", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "call00001", "content": "-2 °C"},
            {"role": "tool", "tool_call_id": "call00002", "content": "09:41"},
        ],
        "tools": TOOLS,
    },
    "content_parts": {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be concise."}]},
            {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]},
        ]
    },
    "thinking": {
        "messages": [
            {"role": "user", "content": "Is 17 prime?"},
            {"role": "assistant", "content": "<think>\nCheck divisors up to 4.\n</think>\n\nYes, 17 is prime."},
            {"role": "user", "content": "And 21?"},
        ]
    },
}


ENDS_ELSEWHERE = {"system_multi", "tool_call", "openai_tool_calls"}


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def tokens_for(name):
    for key, pair in TOKENS.items():
        if key in name:
            return pair
    return ("<s>", "</s>")


def option_sets(source):
    """Extra template variables worth a case of their own: the thinking switches templates read."""
    sets = [{}]
    if "enable_thinking" in source:
        sets += [{"enable_thinking": False}, {"enable_thinking": True}]
    if "thinking" in source and "enable_thinking" not in source:
        sets += [{"thinking": True}]
    return sets


# Language pieces real templates use rarely or not yet, rendered with SNIPPET_VARIABLES: language_snippets.json.
SNIPPET_VARIABLES = {
    "s": "  Hello, World! Ünïcödé  ",
    "n": 7,
    "f": 2.5,
    "xs": [3, 1, 2, 3],
    "words": ["b", "A", "c", "a"],
    "d": {"z": 1, "a": [1, 2], "m": {"k": None}},
    "people": [{"name": "Ann", "age": 31, "admin": True}, {"name": "bob", "age": 25}, {"name": "Cy", "age": 40, "admin": False}],
    "empty": [],
    "nothing": None,
}
SNIPPETS = [
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' H') }}",
    "{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ 'hello world'.capitalize() }}",
    "{{ s.split(',') }}|{{ s.split() }}|{{ 'a,b,,c'.split(',', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}",
    "{{ s.replace('l', 'L') }}|{{ s.replace('l', 'L', 2) }}|{{ s | replace('o', '0') }}",
    "{{ s.startswith('  He') }}{{ s.endswith(('x', '  ')) }}{{ s.find('World') }}{{ s.count('l') }}",
    "{{ '{} and {}'.format('a', 1) }}|{{ '{0}{1}{0}'.format('x', 'y') }}|{{ '{name}!'.format(name='hi') }}",
    "{{ '%s is %d' | format('n', 7) }}|{{ '%s%%' % 5 }}",
    "{{ s[2:7] }}|{{ s[-3:] }}|{{ s[::2] }}|{{ s[::-1] }}|{{ xs[1:] }}|{{ xs[:-1] }}|{{ xs[::-2] }}|{{ s[100:] }}",
    "{{ s | length }} {{ s | trim | length }} {{ xs | length }} {{ d | length }} {{ empty | length }}",
    "{{ xs | first }} {{ xs | last }} {{ xs | sum }} {{ xs | min }} {{ xs | max }} {{ xs | unique | list }}",
    "{{ words | sort }} {{ words | sort(reverse=true) }} {{ words | sort(case_sensitive=true) }} {{ words | unique | list }}",
    "{{ people | sort(attribute='age') | map(attribute='name') | join(', ') }}",
    "{{ people | selectattr('admin') | map(attribute='name') | list }} {{ people | rejectattr('admin') | list | length }}",
    "{{ people | selectattr('age', 'gt', 30) | map(attribute='name') | join }} {{ people | map(attribute='admin', default='?') | list }}",
    "{{ xs | select('odd') | list }} {{ xs | reject('equalto', 3) | list }} {{ words | map('upper') | join('') }}",
    # (Pairs are iterated, not printed: Python prints them as tuples, which JSON values cannot tell from lists.)
    "{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %} {% for k, v in d | items %}{{ k }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list }}",
    "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}",
    "{{ s | tojson }}|{{ s | tojson(ensure_ascii=true) }}|{{ 'tab\there \x01 \u2028' | tojson }}",
    "{{ [1.0, 0.1, 1e16, 1e-5, 123456789.125, -0.0, 3] | tojson }}|{{ [1.0, 0.1, 1e16, 1e-5, -0.0] }}",
    "{{ f }} {{ f * 2 }} {{ n / 2 }} {{ n // 2 }} {{ n % 3 }} {{ -n // 2 }} {{ -n % 3 }} {{ 2 ** 10 }} {{ 7.5 // 2 }}",
    "{{ n | string }}{{ f | int }}{{ '42' | int }}{{ 'x' | int }}{{ '3.9' | int }}{{ '2.5' | float }}{{ n | float }}",
    "{{ f | round }} {{ 2.567 | round(2) }} {{ 2.5 | round(0, 'floor') }} {{ -3 | abs }} {{ 'Hi' | center(6) if false else 'ok' }}",
    "{{ nothing }} {{ nothing is none }} {{ missing is defined }} {{ missing | default('dflt') }} {{ '' | default('e', true) }}",
    "{{ nothing | default('x') }} {{ xs is sequence }} {{ d is mapping }} {{ s is string }} {{ n is number }} {{ f is float }} {{ n is integer }}",
    "{{ true is boolean }} {{ 1 is boolean }} {{ xs is iterable }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }}",
    "{{ 'a' in 'cat' }} {{ 3 in xs }} {{ 'z' in d }} {{ 'q' not in d }} {{ 1 == 1.0 }} {{ [1, 2] == [1, 2] }} {{ 'a' < 'b' }}",
    "{{ xs }} {{ d }} {{ people[0] }} {{ {'k': \"it's\"} }} {{ ['x\\ny', 'q\"'] }} {{ true }} {{ none }}",
    "{{ 'a' ~ 1 ~ 2.0 ~ none ~ true }} {{ 'ab' * 3 }} {{ [0] * 3 }} {{ xs + [9] }} {{ 'x' + 'y' }}",
    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in xs %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }}{{ loop.cycle('a', 'b') }} {% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% else %}none{% endfor %}{% for x in empty %}x{% else %}empty{% endfor %}",
    "{% for p in people if p.age > 26 %}{{ p.name }}{{ loop.index }}{% endfor %}",
    "{% set ns = namespace(total=0, names=[]) %}{% for p in people %}{% set ns.total = ns.total + p.age %}{% set ns.names = ns.names + [p.name] %}{% endfor %}{{ ns.total }} {{ ns.names }}",
    "{% set x = 1 %}{% for i in xs %}{% set x = i %}{% endfor %}{{ x }}",
    "{% macro m(a, b=2, c='c') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='z') }}{{ m('x') | upper }}",
    "{% set block %}inner {{ n }}{% endset %}{{ block | upper }}|{% filter upper %}up {{ s | trim }}{% endfilter %}",
    "{{ 'yes' if n > 5 else 'no' }} {{ 'only' if false }}. {{ n > 5 and 'and' or 'or' }} {{ not nothing }} {{ none or 'x' }}",
    "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b='x') }}",
    "{{ strftime_now('%Y-%m-%d %H:%M %A %B %j') }} {{ strftime_now('%d %b %Y') }}",
    "{{ s | indent(2) }}|{{ 'a\nb\n\nc' | indent(4, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}",
    "{{ '<b>&' | e }} {{ ('<i>' | safe) + '<b>' }} {{ '<b>' ~ ('<i>' | safe) }} {{ ('<i>' | safe | upper) + '&' }}",
    "{{ words | join(', ') }} {{ people | join(', ', attribute='name') }} {{ xs | reverse | list }} {{ 'abc' | reverse }} {{ 'abc' | list }}",
    "{{ 'Hello World' | wordcount }} {{ 'hello WORLD' | title }} {{ 'hELLO' | capitalize }} {{ 'x' is upper }} {{ 'x' is lower }}",
    "{%- if n -%}\n  a\n{%- elif f -%}\n  b\n{%- else -%}\n  c\n{%- endif -%}\n!",
    "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{{ people | map(attribute='name') }}{{ xs | select('odd') | length }}",
    "{{ people | selectattr('name', 'in', ['Ann', 'Cy']) | map(attribute='age') | sum }} {{ xs | map('string') | join('-') }}",
    "{{ d.get('z') }} {{ d.get('nope') }} {{ d.get('nope', 5) }} {{ d['m']['k'] }} {{ d.m.k is none }} {{ d.a[1] }} {{ d.a.0 }}",
    "{{ people[5] is defined }} {{ d.nope is defined }} {{ d.nope.deeper }}",
    "{% set x = 1 %}{% for i in xs %}{{ x }}{% set x = i %}{{ x }};{% endfor %}{{ x }}",
    "{% macro m() %}{{ y }}{% endmacro %}{% set y = 5 %}{{ m() }}|{% if true %}{% set z = 3 %}{% endif %}{{ z }}",
    "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
    "{{ 'x' if 0 }}|{{ nothing.attr }}|{{ nothing.attr is defined }}|{{ '\\u00e9\\x41\\n' | tojson }}|{{ 'a' 'b' }}",
    "{%- for x in xs -%}\n  {{- x -}}\n  ,\n{%- endfor %}\n  {{ n }}  \n{# c #}  \n  {% if n %}y{% endif %}",
    "{{ true is sameas true }} {{ n is not none }} {{ xs[0] is number }} {{ 'a' is in 'abc' }} {{ n is ge 7 }} {{ d is not mapping }}",
    "{{ [] is iterable }} {{ nothing is iterable }} {{ empty is sequence }} {{ none is none }} {{ missing is undefined }}",
    "{% set a, b = [1, 2] %}{{ a }}{{ b }} {% set t = (1, 2) %}{{ t | length }} {{ xs | batch(2) | list | length if false else 'nb' }}",
    "{{ d['z'] }}{{ d.z }}{{ d['missing'] | default('m') }}{{ xs[-1] }}{{ xs[10] | default('oob') }}",
    "{% for k in d %}{{ k }}{% endfor %} {% for c in 'héllo' %}{{ c }}.{% endfor %} {{ 'héllo' | length }} {{ 'héllo'[1] }}",
    "{{ 10 / 4 }} {{ 10 // 4 }} {{ 10.0 // 4 }} {{ -10 // 4 }} {{ 10 % -3 }} {{ 2 ** -1 }} {{ 1e3 }} {{ 3 - 1.5 }}",
    "{{ 1 < 2 < 3 if false else (1 < 2 and 2 < 3) }} {{ not 1 == 2 }} {{ -xs[0] }} {{ (xs | length) - 1 }}",
    "{{ '%-5s|' | format('ab') if false else 'f' }} {{ ' '.join(['a', 'b']) }} {{ 'a-b-c'.split('-') | join('+') }}",
    "{{ 1 + 'a' }}",
    "{{ raise_exception('custom failure') }}",
    "{{ xs | last }}{{ people | selectattr('admin') | last }}",
]


def write_snippets(env):
    cases = []
    for source in SNIPPETS:
        case = {"source": source}
        try:
            case["output"] = env.from_string(source).render(**SNIPPET_VARIABLES)
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    out = {"variables": SNIPPET_VARIABLES, "now": NOW.isoformat(), "cases": cases}
    (FIXTURES / "language_snippets.json").write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n")
    print(f"snippets: {len(cases)} cases, {sum('error' in c for c in cases)} refused")


def main():
    env = environment()
    write_snippets(env)
    (FIXTURES / "conversations.json").write_text(json.dumps(CONVERSATIONS, ensure_ascii=False, indent=1) + "\n")
    for path in sorted(FIXTURES.glob("*.jinja")):
        source = path.read_text()
        template = env.from_string(source)
        bos, eos = tokens_for(path.stem)
        cases = []
        for conversation, data in CONVERSATIONS.items():
            for options in option_sets(source):
                # Without the generation prompt only for the multi-turn and tool conversations (the rest differ only
                # in the final header).
                for add_generation_prompt in (True, False) if conversation in ENDS_ELSEWHERE else (True,):
                    variables = {
                        "messages": data["messages"],
                        "tools": data.get("tools"),
                        "documents": None,
                        "add_generation_prompt": add_generation_prompt,
                        "bos_token": bos,
                        "eos_token": eos,
                        **options,
                    }
                    case = {"conversation": conversation, "add_generation_prompt": add_generation_prompt, "options": options}
                    try:
                        case["output"] = template.render(**variables)
                    except Exception as e:  # raise_exception, or Python's own TypeError and the like
                        case["error"] = f"{type(e).__name__}: {e}"
                    cases.append(case)
        out = {"template": path.name, "bos_token": bos, "eos_token": eos, "now": NOW.isoformat(), "cases": cases}
        expected = path.with_name(path.stem + ".expected.json")
        expected.write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n")
        errors = sum("error" in c for c in cases)
        print(f"{path.name}: {len(cases)} cases, {errors} refused by the template")


if __name__ == "__main__":
    main()
