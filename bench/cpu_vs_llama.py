#!/usr/bin/env python3
"""Side-by-side CPU benchmark: Alloy vs llama.cpp's llama-bench on the same GGUF, in one run.

    python3 bench/cpu_vs_llama.py --llama-bench PATH/llama-bench --model M.gguf \
        [-p 512,4096] [-n 128] [-d 0,4096] [-r 5] [-t 2] [--alloy build/alloy] [--rounds 1]
        [--cache-type f16|bf16|f32]

llama.cpp is built by hand outside this repository (never committed, no build script here);
pass its llama-bench binary. Both engines get the same tests, threads and repetitions; the
first repetition of each test is treated as cold and excluded, the median of the rest is
compared. Prints a markdown table with both medians and the ratio, and writes the raw JSON of
both engines next to --out (default bench/last_run.json).

--rounds N runs the two engines alternately N times (llama.cpp, alloy, llama.cpp, ...): this
host's memory bandwidth and core speed drift by tens of percent within minutes, so one
engine's whole run can land in a fast phase and the other's in a slow one. The warm samples
of all rounds are pooled per engine (each round's cold repetition excluded), and the table
also lists the ratio of each round.
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
    ap.add_argument("--cache-type", default="", help="KV cache type of K and V for both engines (-ctk/-ctv), e.g. bf16")
    ap.add_argument("--out", default="bench/last_run.json")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the engines this many times and pool")
    a = ap.parse_args()

    common = ["-m", a.model, "-p", a.p, "-n", a.n, "-d", a.d, "-r", a.r, "-t", a.t, "-o", "json"]
    if a.cache_type:
        common += ["-ctk", a.cache_type, "-ctv", a.cache_type]
    rounds = []  # per round: (llama.cpp JSON, alloy JSON, {engine: peak RSS})
    for _ in range(a.rounds):
        # llama-bench runs an extra warm-up by default; switch it off so both report rep 1 as cold.
        peer, peer_rss = run_json([a.llama_bench] + common + ["--no-warmup"] + a.llama_args.split())
        ours, ours_rss = run_json([a.alloy, "bench"] + common + ["--gdn", a.gdn])
        rounds.append((peer, ours, {"llama.cpp": peer_rss, "alloy": ours_rss}))
    peer_rss = max(r[2]["llama.cpp"] for r in rounds)
    ours_rss = max(r[2]["alloy"] for r in rounds)
    out = {"llama.cpp": rounds[0][0], "alloy": rounds[0][1], "peak_rss_bytes": rounds[0][2]}
    if a.rounds > 1:
        out["rounds"] = [{"llama.cpp": p, "alloy": o, "peak_rss_bytes": r} for p, o, r in rounds]
    json.dump(out, open(a.out, "w"), indent=1)

    def warm(t):
        """Warm samples: llama-bench lists its cold repetition first, alloy reports it apart."""
        s = t["samples_ts"]
        return s[1:] if len(s) > 1 and "cold_ts" not in t else s

    # Decode: both engines stream the same bytes per token (alloy's count); stated against the
    # read bandwidth alloy probed between its repetitions (the bandwidth floor of this run;
    # over rounds, the median of the rounds' probes). The host's memory bandwidth moves
    # between rounds, so with several rounds each round's alloy figure is also stated against
    # that round's own probe (the last column): the pooled percentage can mix phases.
    ratio_col = " per-round ratio |" if a.rounds > 1 else ""
    round_col = " alloy % of each round's probe |" if a.rounds > 1 else ""
    print(f"| test | llama.cpp t/s | alloy t/s | alloy/llama.cpp |{ratio_col} alloy cold t/s | floor (probe) | llama.cpp % of floor | alloy % of floor |{round_col}")
    print("| --- | ---: | ---: | ---: |" + (" ---: |" if a.rounds > 1 else "") + " ---: | ---: | ---: | ---: |" +
          (" ---: |" if a.rounds > 1 else ""))
    for t in rounds[0][1]:
        k = key(t)
        per_round = []  # (llama.cpp test, alloy test) of each round
        for peer, ours, _ in rounds:
            pb = {key(x): x for x in peer}
            ob = {key(x): x for x in ours}
            if k in pb and k in ob:
                per_round.append((pb[k], ob[k]))
        if not per_round:
            continue
        pm = statistics.median([x for p, _ in per_round for x in warm(p)])
        om = statistics.median([x for _, o in per_round for x in warm(o)])
        probes = [o["read_bw_probe_gbs"] for _, o in per_round if o.get("read_bw_probe_gbs")]
        if probes:
            gbs = statistics.median(probes)
            f_ts = gbs * 1e9 / t["decode_bytes_per_token"]
            floor = f"{f_ts:.2f} t/s ({gbs:.1f} GB/s) | {100 * pm / f_ts:.0f}% | {100 * om / f_ts:.0f}%"
        else:
            floor = " | | "
        rr = ""
        if a.rounds > 1:
            rr = " " + " ".join(f"{statistics.median(warm(o)) / statistics.median(warm(p)):.2f}" for p, o in per_round) + " |"
        cold = statistics.median([o["cold_ts"] for _, o in per_round])
        own = ""
        if a.rounds > 1:
            own = " " + " ".join(
                f"{100 * statistics.median(warm(o)) * o['decode_bytes_per_token'] / (o['read_bw_probe_gbs'] * 1e9):.0f}"
                if o.get("read_bw_probe_gbs") else "-" for _, o in per_round) + " |"
        print(f"| {name(k)} | {pm:.2f} | {om:.2f} | {om / pm:.2f}x |{rr} {cold:.2f} | {floor} |{own}")
    print(f"\npeak RSS of the whole run: llama.cpp {peer_rss / 2**30:.2f} GiB, alloy {ours_rss / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
