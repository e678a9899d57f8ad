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


def main():
    env = environment()
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
