#!/usr/bin/env python3
"""Graceful shutdown of a live `alloy serve` (issue 19): SIGTERM / SIGINT drain, then exit 0.

Starts `alloy serve` on the embedded default model and, for each case, opens a streaming
request (and a plain one), sends the signal once the stream has begun, and checks:
  - drain (SIGTERM, default --shutdown-timeout 10): new connections are refused at once; the
    stream runs to its end (finish_reason "length", every token asked for), well-formed (every
    "data:" line JSON, [DONE] last); the plain request is answered in full; exit status 0;
  - timeout (SIGINT, --shutdown-timeout 1, a request far longer than that): the stream is
    cancelled at the timeout but still ends well-formed (finish_reason "cancelled", then
    [DONE]); exit status 0, within a few seconds of the signal.
Standard library only. Usage: shutdown_test.py --alloy build/alloy
"""
import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from live_server import check, failures, free_port, wait_healthy  # tests/server/live_server.py




def open_stream(port, max_tokens):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return conn, resp


def read_events(resp, first=None):
    """Every "data:" payload of the stream until it ends (the first one given if read already)."""
    events = [first] if first is not None else []
    while True:
        line = resp.readline()
        if not line:
            return events
        line = line.decode().rstrip("\r\n")
        if line.startswith("data: "):
            events.append(line[6:])


def first_event(resp):
    """The first "data:" payload (None if the stream ends before one)."""
    while True:
        raw = resp.readline()
        if not raw:
            return None
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: "):
            return line[6:]


def well_formed(events):
    """(finish_reason, completion_tokens) of a stream that ends in [DONE] with JSON chunks; None if not."""
    if not events or events[-1] != "[DONE]":
        return None
    finish, tokens = None, None
    for e in events[:-1]:
        try:
            c = json.loads(e)
        except ValueError:
            return None
        for ch in c.get("choices", []):
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
        if c.get("usage"):
            tokens = c["usage"]["completion_tokens"]
    return finish, tokens


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


def start(alloy, port, extra):
    return subprocess.Popen([alloy, "serve", "--port", str(port), "-c", "4096", "--parallel", "2", "-t", "2"] + extra,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def drain_case(alloy):
    port = free_port()
    proc = start(alloy, port, [])
    try:
        wait_healthy(port, proc)
        conn, resp = open_stream(port, 160)
        check(resp.status == 200, "drain: the stream is answered 200")
        first = first_event(resp)
        # A plain request in flight too: sent before the signal, answered in full after it.
        plain = {}

        def post_plain():
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request("POST", "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 60, "temperature": 0}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            plain["status"], plain["body"] = r.status, r.read()

        t = threading.Thread(target=post_plain)
        t.start()
        time.sleep(0.3)  # the plain request is accepted
        t_sig = time.time()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        check(refused(port), "drain: a new connection after SIGTERM is refused")
        events = read_events(resp, first)
        conn.close()
        got = well_formed(events)
        check(got is not None, f"drain: the stream ends well-formed ({len(events)} events, last {events[-1:]})")
        check(got == ("length", 160), f"drain: the stream ran to its end (finish_reason, tokens = {got})")
        t.join(timeout=60)
        ok = plain.get("status") == 200 and json.loads(plain["body"])["usage"]["completion_tokens"] == 60
        check(ok, f"drain: the plain request in flight is answered in full ({plain.get('status')})")
        rc = proc.wait(timeout=30)
        check(rc == 0, f"drain: exit status 0 (got {rc}, {time.time() - t_sig:.1f} s after the signal)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def timeout_case(alloy):
    port = free_port()
    proc = start(alloy, port, ["--shutdown-timeout", "1"])
    try:
        wait_healthy(port, proc)
        conn, resp = open_stream(port, 3000)  # minutes at the tiny model's speed here
        first = first_event(resp)
        t_sig = time.time()
        proc.send_signal(signal.SIGINT)
        events = read_events(resp, first)
        conn.close()
        ended = time.time() - t_sig
        got = well_formed(events)
        check(got is not None, f"timeout: the cancelled stream ends well-formed ({len(events)} events)")
        check(got is not None and got[0] == "cancelled" and got[1] < 3000,
              f"timeout: cancelled at the timeout (finish_reason, tokens = {got}, {ended:.1f} s after SIGINT)")
        check(0.9 < ended < 6, f"timeout: the stream ended after the 1 s timeout, not before or much later ({ended:.1f} s)")
        rc = proc.wait(timeout=30)
        check(rc == 0, f"timeout: exit status 0 (got {rc}, {time.time() - t_sig:.1f} s after the signal)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alloy", required=True)
    a = ap.parse_args()
    try:
        drain_case(a.alloy)
        timeout_case(a.alloy)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        check(False, f"{type(e).__name__}: {e}")
    if failures:
        print(f"shutdown_test: {len(failures)} check(s) failed: {failures}")
        return 1
    print("shutdown_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
