"""What the live-server scripts share (tests/server/*_test.py, bench/load_test.py): a free
loopback port, waiting for `alloy serve` to answer /health, and the checks' tally."""
import json
import socket
import time
import urllib.request

failures = []  # the failed checks' descriptions; a script exits non-zero when it is not empty


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, timeout=60):
    """Until GET /health says ok; raises if the server process exits first or time runs out."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"alloy serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if json.loads(r.read())["status"] == "ok":
                    return
        except (OSError, ValueError, KeyError):  # not listening yet, or an answer not yet JSON
            time.sleep(0.2)
    raise RuntimeError("alloy serve did not become healthy")
