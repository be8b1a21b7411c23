#!/usr/bin/env python3
"""Reference renderings of Qwen3.5's chat template (the oracle for tokenizer/chat_template.cpp
and the server's tools / tool_calls / tool-message handling), made with jinja2 as transformers
renders chat templates (trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False)).

    python3 scripts/make_chat_template_vectors.py TEMPLATE.jinja > tests/fixtures/chat_template/qwen35_cases.json

TEMPLATE: the model's template, e.g. models/templates/Qwen3.5-4B.jinja of a llama.cpp snapshot
or chat_template.jinja of a Qwen3.5 checkpoint (not committed here). Each case keeps the
OpenAI-style request body (messages, tools, chat_template_kwargs) and the expected text.
"""
import json
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city, in \u00b0C.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Z\u00fcrich\""},
        "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "where": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}}

CASES = [
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}],
     "tools": [WEATHER, CLOCK]},
    {"messages": [{"role": "user", "content": "What time is it?"}], "tools": [CLOCK],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "system", "content": "  "}, {"role": "user", "content": "Hi"}], "tools": [CLOCK]},
    {"messages": [
        {"role": "user", "content": "Weather in Paris and Rome for 3 days?"},
        {"role": "assistant", "content": "Let me check both.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(
                {"city": "Paris", "days": 3, "metric": True, "where": {"lat": 48.85, "lon": 2.35}, "tags": ["a", "b"]})}},
            {"id": "b", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Rome", "days": 3, "metric": False}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "b", "content": "{\"temp\": 25}"}],
     "tools": [WEATHER]},
    {"messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "12:00"},
        {"role": "assistant", "content": "It is noon."},
        {"role": "user", "content": "Thanks! And the weather in Oslo?"}],
     "tools": [CLOCK, WEATHER]},
    {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHello!"},
        {"role": "user", "content": "Bye"}]},
]


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    tpl = env.from_string(open(sys.argv[1]).read())
    out = []
    for case in CASES:
        # transformers hands the template the arguments as a dict (it parses OpenAI's string).
        msgs = json.loads(json.dumps(case["messages"]))
        for m in msgs:
            for c in m.get("tool_calls", []) or []:
                if isinstance(c["function"].get("arguments"), str):
                    c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        kw = case.get("chat_template_kwargs", {})
        text = tpl.render(messages=msgs, tools=case.get("tools"), add_generation_prompt=True, **kw)
        out.append({"body": case, "expected": text})
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
