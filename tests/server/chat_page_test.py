#!/usr/bin/env python3
"""The chat page at "/" of a live `alloy serve`, driven in headless Chromium (issue 19).

Starts `alloy serve` on a free port with the embedded default model (random weights: the text
is gibberish, but every byte of it comes through the page's stream), opens the page in headless
Chromium and drives it over the Chrome DevTools protocol (--remote-debugging-pipe: JSON messages
on fds 3/4, standard library only). It checks:
  - the request the page sends: stream, the settings (temperature, max tokens, system prompt,
    chat_template_kwargs.enable_thinking) as set in its settings panel;
  - thinking on: text streams into the reasoning box (reasoning_content), apart from the reply;
  - thinking off: the reply's text appears piece by piece while the stream is open (a
    MutationObserver in the page records the reply's length at every change), ends as "done",
    and a tokens/s figure is shown;
  - the stop button: a long reply stops growing, is marked stopped, the page can send again,
    and the server has cancelled the request (no slot busy, far fewer tokens than asked).

Usage: chat_page_test.py --alloy build/alloy [--chromium PATH]
Exit 0: all passed; 1: a check failed; 77: no Chromium installed (skipped).
"""
import argparse
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from live_server import check, failures, free_port, wait_healthy  # tests/server/live_server.py




def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"no metric {name}")


def move_high(fd):
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class DevTools:
    """The DevTools protocol over Chromium's --remote-debugging-pipe: each message is JSON
    followed by a NUL byte; we write commands on its fd 3 and read replies and events on fd 4."""

    def __init__(self, chromium, profile_dir):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Chromium's ends moved above 10 first, so that putting them at 3 and 4 clobbers neither.
        to_chrome_r, from_chrome_w = move_high(to_chrome_r), move_high(from_chrome_w)
        args = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-dev-shm-usage", f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"]
        # The pipe ends must be fds 3 and 4 in Chromium: a small Python step puts them there and
        # execs it (they sit above 10, so neither dup2 clobbers the other).
        place = ("import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); os.dup2(r, 3); os.dup2(w, 4); "
                 "os.close(r); os.close(w); os.execvp(sys.argv[3], sys.argv[3:])")
        self.proc = subprocess.Popen([sys.executable, "-c", place, str(to_chrome_r), str(from_chrome_w)] + args,
                                     pass_fds=(to_chrome_r, from_chrome_w), stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(profile_dir, "stderr.txt"), "wb"))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.next_id = 0
        self.replies = {}
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        buf = b""
        while True:
            data = os.read(self.from_chrome, 65536)
            if not data:
                with self.cv:
                    self.replies[None] = "closed"
                    self.cv.notify_all()
                return
            buf += data
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                m = json.loads(msg)
                if "id" in m:
                    with self.cv:
                        self.replies[m["id"]] = m
                        self.cv.notify_all()

    def send(self, method, params=None, session=None, timeout=30):
        with self.cv:
            self.next_id += 1
            mid = self.next_id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        with self.cv:
            if not self.cv.wait_for(lambda: mid in self.replies or None in self.replies, timeout):
                raise RuntimeError(f"DevTools: no reply to {method} in {timeout} s")
            if mid not in self.replies:
                raise RuntimeError("DevTools: Chromium closed the pipe")
            m = self.replies.pop(mid)
        if "error" in m:
            raise RuntimeError(f"DevTools {method}: {m['error']}")
        return m.get("result", {})

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_chrome)


class Page:
    def __init__(self, dt, url):
        self.dt = dt
        target = dt.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = dt.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        dt.send("Runtime.enable", session=self.session)
        dt.send("Page.enable", session=self.session)
        dt.send("Page.navigate", {"url": url}, session=self.session)
        self.wait_for("document.readyState === 'complete' && !!document.getElementById('send')", 30, "the page loads")

    def js(self, expr):
        """The value of a JavaScript expression in the page (promises awaited)."""
        r = self.dt.send("Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True},
                         session=self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page JS failed: {expr!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expr, timeout, what):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.js(expr):
                return True
            time.sleep(0.05)
        raise RuntimeError(f"timed out ({timeout} s) waiting until {what}: {expr}")


# Test hooks put into the page from outside (the page itself has none): the bodies it posts, and
# the last reply's text length at every DOM change with the page's state at that moment.
HOOKS = r"""
window.__bodies = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (init && init.body) window.__bodies.push(JSON.parse(init.body));
  return realFetch(url, init);
};
window.__growth = [];
new MutationObserver(() => {
  const last = [...document.querySelectorAll('.msg.assistant')].pop();
  if (!last) return;
  window.__growth.push({content: last.querySelector('.content').textContent.length,
                        reasoning: last.querySelector('.reasoning').textContent.length,
                        state: last.dataset.state});
}).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
true
"""


def send_message(page, text):
    page.js("window.__growth = []; true")
    page.js(f"document.getElementById('input').value = {json.dumps(text)}; document.getElementById('send').click(); true")
    page.wait_for("document.querySelectorAll('.msg.assistant').length > 0 && "
                  "[...document.querySelectorAll('.msg.assistant')].pop().dataset.state !== undefined", 10,
                  "a reply bubble appears")


LAST = "[...document.querySelectorAll('.msg.assistant')].pop()"


def run_checks(page, port):
    check(page.js("document.title") == "Alloy chat", "the page at / is the chat page")
    page.wait_for("document.getElementById('model').textContent === 'tiny'", 10, "the model name is shown")
    page.js(HOOKS)

    # Settings as a user sets them (the panel's inputs, then their change events).
    page.js("""(() => {
      document.getElementById('toggle-settings').click();
      const set = (id, v) => { const e = document.getElementById(id);
        if (e.type === 'checkbox') e.checked = v; else e.value = v;
        e.dispatchEvent(new Event('change')); };
      set('temperature', '0'); set('max-tokens', '48'); set('system', 'You are terse.'); set('thinking', true);
      return true; })()""")

    # 1. Thinking on: the reasoning streams into its own box.
    send_message(page, "Hello there")
    page.wait_for(f"{LAST}.dataset.state !== 'streaming'", 60, "the first reply ends")
    body = page.js("window.__bodies[window.__bodies.length - 1]")
    check(body.get("stream") is True and body.get("temperature") == 0 and body.get("max_tokens") == 48,
          "the request streams with the settings' temperature and max tokens")
    check(body["messages"][0] == {"role": "system", "content": "You are terse."} and
          body["messages"][-1] == {"role": "user", "content": "Hello there"}, "the system prompt and the message are sent")
    check(body.get("chat_template_kwargs") == {"enable_thinking": True}, "thinking on is sent as enable_thinking")
    state = page.js(f"{LAST}.dataset.state")
    reasoning = page.js(f"{LAST}.querySelector('.reasoning').textContent")
    check(state == "done", f"the reply ends as done (state {state})")
    check(len(reasoning) > 0 and not page.js(f"{LAST}.querySelector('.reasoning-box').hidden"),
          "thinking on: reasoning_content is shown in the reasoning box")

    # 2. Thinking off: the reply's text appears piece by piece, then the tokens/s figure.
    page.js("(() => { const e = document.getElementById('thinking'); e.checked = false;"
            " e.dispatchEvent(new Event('change')); document.getElementById('max-tokens').value = '400'; return true; })()")
    send_message(page, "Tell me a story")
    page.wait_for(f"{LAST}.dataset.state !== 'streaming'", 60, "the second reply ends")
    body = page.js("window.__bodies[window.__bodies.length - 1]")
    check(body.get("chat_template_kwargs") == {"enable_thinking": False}, "thinking off is sent as enable_thinking: false")
    check([m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"],
          "the second turn carries the history")
    growth = page.js("window.__growth")
    while_streaming = sorted({g["content"] for g in growth if g["state"] == "streaming" and g["content"] > 0})
    check(len(while_streaming) >= 3, f"the reply grows while streaming ({len(while_streaming)} distinct lengths seen)")
    content = page.js(f"{LAST}.querySelector('.content').textContent")
    check(len(content) > 0 and page.js(f"{LAST}.dataset.state") == "done", "thinking off: the reply's content is shown, done")
    check(page.js(f"{LAST}.querySelector('.reasoning').textContent") == "", "thinking off: no reasoning")
    stats = page.js(f"{LAST}.querySelector('.stats').textContent")
    check("tok/s" in stats and any(ch.isdigit() for ch in stats.split("tok/s")[0]), f"tokens/s shown: {stats!r}")

    # 3. Stop: a long reply is cut off, the connection closes and the server cancels it.
    gen_before = metric(port, "alloy_generated_tokens_total")
    page.js("document.getElementById('max-tokens').value = '3500'; true")
    send_message(page, "Tell me a very long story")
    page.wait_for(f"{LAST}.dataset.state === 'streaming' && {LAST}.querySelector('.content').textContent.length > 20",
                  30, "the long reply starts")
    check(page.js("document.getElementById('stop').disabled") is False and
          page.js("document.getElementById('send').disabled") is True, "while streaming: stop enabled, send disabled")
    page.js("document.getElementById('stop').click(); true")
    page.wait_for(f"{LAST}.dataset.state === 'stopped'", 10, "the reply is marked stopped")
    n1 = page.js(f"{LAST}.querySelector('.content').textContent.length")
    time.sleep(1.0)
    n2 = page.js(f"{LAST}.querySelector('.content').textContent.length")
    check(n1 == n2 and n1 > 0, f"after stop the reply no longer grows ({n1} -> {n2} characters)")
    check("stopped" in page.js(f"{LAST}.querySelector('.stats').textContent"), "the stats say stopped")
    check(page.js("document.getElementById('send').disabled") is False and
          page.js("document.getElementById('stop').disabled") is True, "after stop: send enabled again, stop disabled")
    t0 = time.time()
    while metric(port, "alloy_requests_active") > 0 and time.time() - t0 < 10:
        time.sleep(0.1)
    check(metric(port, "alloy_requests_active") == 0, "the server freed the slot")
    generated = metric(port, "alloy_generated_tokens_total") - gen_before
    check(generated < 3000, f"the server stopped generating ({generated:.0f} of 3500 tokens)")

    # The page still works after a stop: a short reply comes through.
    page.js("document.getElementById('max-tokens').value = '8'; true")
    send_message(page, "Again")
    page.wait_for(f"{LAST}.dataset.state !== 'streaming'", 60, "the reply after the stop ends")
    check(page.js(f"{LAST}.dataset.state") == "done", "after a stop the next message is answered")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--alloy", required=True)
    ap.add_argument("--chromium", default=os.environ.get("CHROMIUM"))
    a = ap.parse_args()
    chromium = a.chromium or next((p for p in map(shutil.which, ["chromium", "chromium-browser", "google-chrome"]) if p),
                                  None)
    if not chromium:
        print("chat_page_test: no Chromium (Debian package chromium; scripts/deps.sh installs it); skipped")
        return 77
    port = free_port()
    server = subprocess.Popen([a.alloy, "serve", "--port", str(port), "-c", "4096", "--parallel", "2", "-t", "2",
                               "-a", "tiny"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    profile = tempfile.mkdtemp(prefix="alloy_chat_page_")
    dt = None
    try:
        wait_healthy(port, server)
        dt = DevTools(chromium, profile)
        run_checks(Page(dt, f"http://127.0.0.1:{port}/"), port)
    except (RuntimeError, OSError) as e:
        check(False, f"{type(e).__name__}: {e}")
    finally:
        if dt:
            dt.close()
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        if failures:  # Chromium's own last words help when it is the browser that failed
            with open(os.path.join(profile, "stderr.txt"), errors="replace") as f:
                print("chromium stderr (tail):\n" + "".join(f.readlines()[-5:]))
        shutil.rmtree(profile, ignore_errors=True)
    if failures:
        print(f"chat_page_test: {len(failures)} check(s) failed: {failures}")
        return 1
    print("chat_page_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
