#!/usr/bin/env python3
"""Side-by-side CPU benchmark: Alloy vs llama.cpp's llama-bench on the same GGUF, in one run.

    python3 bench/cpu_vs_llama.py --llama-bench PATH/llama-bench --model M.gguf \
        [-p 512,4096] [-n 128] [-d 0,4096] [-r 5] [-t 2] [--alloy build/alloy]

llama.cpp is built by hand outside this repository (never committed, no build script here);
pass its llama-bench binary. Both engines get the same tests, threads and repetitions; the
first repetition of each test is treated as cold and excluded, the median of the rest is
compared. Prints a markdown table with both medians and the ratio, and writes the raw JSON of
both engines next to --out (default bench/last_run.json).
"""
import argparse
import json
import statistics
import subprocess
import sys


def run_json(cmd):
    """Runs a benchmark; returns its JSON and the peak resident memory (GNU time, KiB)."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    r = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M"] + cmd, check=True, capture_output=True, text=True)
    rss = [int(l.split()[1]) for l in r.stderr.splitlines() if l.startswith("MAXRSS ")]
    return json.loads(r.stdout), (rss[-1] * 1024 if rss else 0)


def key(t):
    return (t["n_prompt"], t["n_gen"], t["n_depth"])


def name(k):
    p, n, d = k
    s = f"pp{p}" if p else f"tg{n}"
    return s + (f" @ d{d}" if d else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--alloy", default="build/alloy")
    ap.add_argument("--model", required=True)
    ap.add_argument("-p", default="512")
    ap.add_argument("-n", default="128")
    ap.add_argument("-d", default="0")
    ap.add_argument("-r", default="5")
    ap.add_argument("-t", default="2")
    ap.add_argument("--gdn", default="chunked")
    ap.add_argument("--llama-args", default="", help="extra llama-bench args, e.g. '-fa 1'")
    ap.add_argument("--out", default="bench/last_run.json")
    a = ap.parse_args()

    common = ["-m", a.model, "-p", a.p, "-n", a.n, "-d", a.d, "-r", a.r, "-t", a.t, "-o", "json"]
    # llama-bench runs an extra warm-up by default; switch it off so both report rep 1 as cold.
    peer, peer_rss = run_json([a.llama_bench] + common + ["--no-warmup"] + a.llama_args.split())
    ours, ours_rss = run_json([a.alloy, "bench"] + common + ["--gdn", a.gdn])
    json.dump({"llama.cpp": peer, "alloy": ours, "peak_rss_bytes": {"llama.cpp": peer_rss, "alloy": ours_rss}},
              open(a.out, "w"), indent=1)

    def med(t):
        s = t["samples_ts"]
        return statistics.median(s[1:] if len(s) > 1 and "cold_ts" not in t else s)

    peer_by = {key(t): t for t in peer}
    # Decode: both engines stream the same bytes per token (alloy's count); stated against the
    # read bandwidth alloy probed right before its test (the bandwidth floor of this run).
    print(f"| test | llama.cpp t/s | alloy t/s | alloy/llama.cpp | alloy cold t/s | floor (probe) | llama.cpp % of floor | alloy % of floor |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in ours:
        k = key(t)
        if k not in peer_by:
            continue
        pm, om = med(peer_by[k]), med(t)
        floor = ""
        if t.get("read_bw_probe_gbs"):
            f_ts = t["read_bw_probe_gbs"] * 1e9 / t["decode_bytes_per_token"]
            floor = f"{f_ts:.2f} t/s ({t['read_bw_probe_gbs']:.1f} GB/s) | {100 * pm / f_ts:.0f}% | {100 * om / f_ts:.0f}%"
        else:
            floor = " | | "
        print(f"| {name(k)} | {pm:.2f} | {om:.2f} | {om / pm:.2f}x | {t['cold_ts']:.2f} | {floor} |")
    print(f"\npeak RSS of the whole run: llama.cpp {peer_rss / 2**30:.2f} GiB, alloy {ours_rss / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
