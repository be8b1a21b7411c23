#!/usr/bin/env python3
"""The hybrid prefix cache of `alloy serve` measured as a user meets it (issue 19, must-show 3).

Starts `alloy serve` twice on loopback, with the cache on (--cache-ram) and off (--cache-ram 0),
and runs against each, streaming through /v1/chat/completions:
  1. a 10-turn chat with a ~2,000-token system prompt: per turn the prompt tokens, the tokens
     the cache resumed (usage.prompt_tokens_details.cached_tokens), the tokens re-processed and
     the time to first token;
  2. two requests sharing a ~4,096-token prefix: the second one's time to first token;
  3. a short prompt (< 600 tokens) asked again with a new question: whether it hits.
Prints a markdown table per part. Standard library only.

    python3 bench/prefix_cache_bench.py --alloy build/alloy -m MODEL.gguf [-t 2]
"""
import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import time

WORDS = ("the model keeps a state for every sequence and the cache stores it at the end of each "
         "prompt so that a later request with the same beginning starts there instead of at zero "
         "gated delta rule attention layer token prefix chat turn system user assistant answer "
         "question river mountain city window garden music paper light stone water").split()


def text(n_words, seed):
    r = random.Random(seed)
    return " ".join(r.choice(WORDS) for _ in range(n_words))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, alloy, model, cache_mib, threads, ctx):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [alloy, "serve", "-m", model, "--port", str(self.port), "-np", "1", "-c", str(ctx), "-t", str(threads),
             "--cache-ram", str(cache_mib)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("alloy serve did not start: " + self.proc.stderr.read().decode(errors="replace"))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def chat(self, messages, max_tokens):
        """Streams one chat completion: (answer text, time to first token s, usage)."""
        body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True},
                           "chat_template_kwargs": {"enable_thinking": False}})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        ttft, out, usage = None, [], None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    out.append(piece)
        if ttft is None:
            ttft = time.perf_counter() - t0
        return "".join(out), ttft, usage


def run_chat(srv, turns, system_words):
    msgs = [{"role": "system", "content": text(system_words, 1)}]
    rows = []
    for k in range(turns):
        msgs.append({"role": "user", "content": f"Question {k}: " + text(30, 100 + k)})
        answer, ttft, u = srv.chat(msgs, 24)
        cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        rows.append((k + 1, u["prompt_tokens"], cached, u["prompt_tokens"] - cached, ttft))
        msgs.append({"role": "assistant", "content": answer})
    return rows


def run_shared(srv, prefix_words):
    prefix = text(prefix_words, 2)
    out = []
    for q in range(2):
        _, ttft, u = srv.chat([{"role": "system", "content": prefix}, {"role": "user", "content": text(20, 200 + q)}], 8)
        out.append((u["prompt_tokens"], u.get("prompt_tokens_details", {}).get("cached_tokens", 0), ttft))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alloy", default="build/alloy")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--cache-ram", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--system-words", type=int, default=1900, help="~2,000 tokens with the bundled vocabulary")
    ap.add_argument("--prefix-words", type=int, default=3950, help="~4,096 tokens")
    args = ap.parse_args()
    results = {}
    for name, mib in (("on", args.cache_ram), ("off", 0)):
        srv = Server(args.alloy, args.model, mib, args.threads, 8192)
        try:
            results[name] = (run_chat(srv, args.turns, args.system_words), run_shared(srv, args.prefix_words),
                             run_shared(srv, 300))
        finally:
            srv.stop()
    print("## 10-turn chat, system prompt ~2,000 tokens (greedy, 24 answer tokens, thinking off)\n")
    print("| turn | prompt tokens | cached (on) | re-processed on / off | TTFT on s | TTFT off s | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for a, b in zip(results["on"][0], results["off"][0]):
        print(f"| {a[0]} | {a[1]} | {a[2]} | {a[3]} / {b[3]} | {a[4]:.3f} | {b[4]:.3f} | {b[4] / a[4]:.1f}x |")
    for part, title in ((1, "a shared ~4,096-token prefix"), (2, "a shared short prefix (< 600 tokens)")):
        print(f"\n## Two requests sharing {title}\n")
        print("| request | prompt tokens | cached (on) | TTFT on s | TTFT off s | ratio |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for i, (a, b) in enumerate(zip(results["on"][part], results["off"][part])):
            print(f"| {i + 1} | {a[0]} | {a[1]} | {a[2]:.3f} | {b[2]:.3f} | {b[2] / a[2]:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
