#!/usr/bin/env python3
"""The official `openai` Python client (PyPI) against a live `alloy serve` (issue 19, must-show 1).

Starts `alloy serve` on a free port with the embedded default model (a tiny synthetic Qwen3.5
with the real Qwen3 vocabulary: random weights, so answers are gibberish, but every field of
the API is real) and an API key, then checks through the client: completions and chat, each
streaming and not (a stream adds up to the whole answer), reasoning_content, logprobs, n (whole and
streamed), a tool round trip (tools + an assistant tool call + the tool's message), errors as the client's
exception types with their status and param, the API key (a wrong key is a 401), response_format
json_object (the content parses) and GET /slots.

Usage: openai_client_test.py --alloy build/alloy
Exit 0: all passed; 1: a check failed; 77: the `openai` package is not installed (skipped).
"""
import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from live_server import check, failures, free_port, wait_healthy  # tests/server/live_server.py

try:
    import openai
except ImportError:
    print("openai_client_test: the openai package is not installed (scripts/test.sh installs it into build/pyenv); skipped")
    sys.exit(77)

KEY = "test-key-1"



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alloy", required=True)
    a = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen([a.alloy, "serve", "--port", str(port), "-c", "512", "--parallel", "4", "-t", "2",
                             "--api-key", KEY, "-a", "tiny"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(port, proc)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)
        run_checks(c, port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    if failures:
        print(f"openai_client_test: {len(failures)} check(s) failed: {failures}")
        return 1
    print("openai_client_test: all checks passed")
    return 0


def run_checks(c, port):
    models = c.models.list()
    check([m.id for m in models.data] == ["tiny"], "models.list names the alias")

    # Completions, whole and streamed.
    r = c.completions.create(model="tiny", prompt="The capital of France is", max_tokens=12, temperature=0)
    check(isinstance(r.choices[0].text, str) and r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length",
          "completions: text, usage, finish_reason")
    text = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="The capital of France is", max_tokens=12, temperature=0, stream=True) if ch.choices)
    check(text == r.choices[0].text, "completions stream adds up to the whole text")

    # Chat with thinking off, whole and streamed.
    msgs = [{"role": "user", "content": "Hello there"}]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0, extra_body=off)
    m = r.choices[0].message
    check(m.role == "assistant" and isinstance(m.content, str), "chat: an assistant message")
    parts = []
    for ch in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0, stream=True,
                                        extra_body=off):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
    check("".join(parts) == m.content, "chat stream adds up to the whole content")

    # Thinking on: the reasoning comes apart in reasoning_content (the model's think block).
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0)
    rc = getattr(r.choices[0].message, "reasoning_content", None)
    check(isinstance(rc, str) and len(rc) > 0, "chat with thinking: reasoning_content is filled")

    # logprobs: one entry per generated token, top_logprobs alternatives each, greedy first.
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0, logprobs=True,
                                  top_logprobs=3, extra_body=off)
    lp = r.choices[0].logprobs.content
    check(len(lp) == r.usage.completion_tokens and all(len(e.top_logprobs) == 3 for e in lp) and
          all(e.logprob <= 0 and e.top_logprobs[0].logprob == e.logprob for e in lp),
          "chat logprobs: per token, 3 alternatives, the greedy token first")
    r = c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2)
    check(len(r.choices[0].logprobs.tokens) == 5 and len(r.choices[0].logprobs.top_logprobs[0]) == 2,
          "completions logprobs: tokens and top_logprobs")

    # n: three choices, indexed.
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=3, n=3,
                                  extra_body=off)
    check([ch.index for ch in r.choices] == [0, 1, 2], "n = 3: three choices, indexed")
    # The same three choices in one stream: chunks by index, each choice's finish_reason in its
    # last chunk, the usage totals in a last chunk without choices (stream_options.include_usage).
    texts, finish, usage, after_finish = {}, {}, None, False
    for ch in c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=3, n=3,
                                        stream=True, stream_options={"include_usage": True}, extra_body=off):
        if not ch.choices:
            usage = ch.usage
        for choice in ch.choices:
            after_finish |= choice.index in finish
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    check([texts.get(i) for i in range(3)] == [ch.message.content for ch in r.choices] and not after_finish,
          "n = 3 streamed: each index adds up to its choice, nothing after its finish_reason")
    check([finish.get(i) for i in range(3)] == [ch.finish_reason for ch in r.choices], "n = 3 streamed: finish_reasons")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens and
          usage.prompt_tokens == r.usage.prompt_tokens, "n = 3 streamed: include_usage gives the totals")

    # A tool round trip: the tools, the assistant's call and the tool's answer go back in.
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    history = msgs + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = c.chat.completions.create(model="tiny", messages=history, tools=tools, max_tokens=8, temperature=0,
                                  extra_body=off)
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls") and r.usage.prompt_tokens > 40,
          "tools: the round trip is accepted and answered")

    # response_format json_object: the content parses as a JSON object (random weights, temperature 1:
    # grammar-constrained sampling, not the model, makes it so); json_schema is refused by name.
    for seed in (5, 6):
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=1.0, seed=seed,
                                      response_format={"type": "json_object"}, extra_body=off)
        try:
            obj = json.loads(r.choices[0].message.content)
        except ValueError:
            obj = None
        check(isinstance(obj, dict) and r.choices[0].finish_reason == "stop",
              f"response_format json_object (seed {seed}): the content is a JSON object")
    try:
        c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, extra_body=off,
                                  response_format={"type": "json_schema",
                                                   "json_schema": {"name": "x", "schema": {"type": "object"}}})
        check(False, "response_format json_schema is refused")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(e.status_code == 400 and body.get("param") == "response_format.type",
              "response_format json_schema: 400 naming response_format.type")

    # Errors: the client's exception types, with the field named.
    try:
        c.completions.create(model="tiny", prompt="x", max_tokens=100000)
        check(False, "a too large max_tokens is refused")
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(e.status_code == 400 and body.get("param") == "max_tokens", "a too large max_tokens: 400 naming max_tokens")
    try:
        c.chat.completions.create(model="tiny", messages=msgs, logprobs=True, top_logprobs=50)
        check(False, "top_logprobs 50 is refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, "top_logprobs 50: 400")

    # GET /slots (not an OpenAI endpoint: plain HTTP): behind the key, one idle entry per slot
    # (--parallel 4) once the requests above are done.
    req = urllib.request.Request(f"http://127.0.0.1:{port}/slots")
    try:
        urllib.request.urlopen(req, timeout=10)
        check(False, "/slots without the key is refused")
    except urllib.error.HTTPError as e:
        check(e.code == 401, "/slots without the key: 401")
    req.add_header("Authorization", f"Bearer {KEY}")
    for _ in range(100):  # the engine publishes its view after the step that finished the last request
        with urllib.request.urlopen(req, timeout=10) as r:
            slots = json.loads(r.read())
        if all(s["state"] == "idle" for s in slots["slots"]):
            break
        time.sleep(0.05)
    check(len(slots["slots"]) == 4 and slots["queue_depth"] == 0 and
          [s["id"] for s in slots["slots"]] == [0, 1, 2, 3] and all(s["state"] == "idle" for s in slots["slots"]),
          "/slots: four idle slots, an empty queue")

    # The API key.
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        check(False, "a wrong API key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "a wrong API key: 401")


if __name__ == "__main__":
    sys.exit(main())
