#!/usr/bin/env python3
"""The GDN prefill peer on the GPU, run on the device machine in the same call as
build-gpu/gdn_cuda_bench --prefill: fla's chunk_gated_delta_rule (flash-linear-attention 0.6.0,
Triton; carried as wheels, see bench/RESULTS.md) timed at the same shapes as the bench (B = 1,
H_k = 16, d = 128, H_v in {16, 32, 48}, T in {512, 4096, 16384, 65536}; bf16 q/k/v/beta, fp32
g and state; CUDA graph of several calls rotating over input sets that fit in ~256 MB, median of
7 replays), and an outside check: cases with fla's outputs and an fp64 token-by-token
recurrence on the same bf16 values, saved for `gdn_cuda_bench --check-chunked DIR`.

    python3 scripts/gdn_fla_peer.py DIR [--tmax T] && build-gpu/gdn_cuda_bench --check-chunked DIR

Layout written (float32, little-endian), DIR/<case>/: meta.txt "T H_k H_v d"; q.bin [T, H_k, d]
(L2-normalised, * d^-1/2, bf16 values: fla gets scale = 1), k.bin [T, H_k, d], v.bin [T, H_v, d],
g.bin and beta.bin [T, H_v], state0.bin [H_v, d_v, d_k] (alloy's transposed layout);
ref_out.bin [T, H_v, d] and ref_state.bin (fp64 recurrence), fla_out.bin, fla_state.bin.
Value head h reads key head h // (H_v / H_k) (fla's grouped layout).
"""
import os
import sys

import torch
import torch.nn.functional as F
from fla.ops.gated_delta_rule import chunk_gated_delta_rule


def inputs(T, HK, HV, d, gen):
    dev = "cuda"
    q = (F.normalize(torch.randn(1, T, HK, d, generator=gen, device=dev), dim=-1) * d ** -0.5).bfloat16()
    k = F.normalize(torch.randn(1, T, HK, d, generator=gen, device=dev), dim=-1).bfloat16()
    v = torch.randn(1, T, HV, d, generator=gen, device=dev).bfloat16()
    g = F.logsigmoid(torch.rand(1, T, HV, generator=gen, device=dev))
    beta = torch.sigmoid(torch.rand(1, T, HV, generator=gen, device=dev)).bfloat16()
    h0 = 0.1 * torch.randn(1, HV, d, d, generator=gen, device=dev)  # fla layout [N, HV, K, V]
    return q, k, v, g, beta, h0


def run_fla(q, k, v, g, beta, h0):
    return chunk_gated_delta_rule(q, k, v, g, beta, scale=1.0, initial_state=h0, output_final_state=True)


def recurrence_fp64(q, k, v, g, beta, h0):
    HK, HV = q.shape[2], v.shape[2]
    r = HV // HK
    qd = q[0].double().repeat_interleave(r, dim=1)  # [T, HV, d]
    kd = k[0].double().repeat_interleave(r, dim=1)
    vd, gd, bd = v[0].double(), g[0].double(), beta[0].double()
    S = h0[0].double().clone()  # [HV, K, V]
    out = torch.empty_like(vd)
    for t in range(vd.shape[0]):
        S *= torch.exp(gd[t])[:, None, None]
        kv = torch.einsum("hk,hkv->hv", kd[t], S)
        delta = bd[t][:, None] * (vd[t] - kv)
        S += kd[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", qd[t], S)
    return out, S


def save_case(dirname, T, HK, HV, d, q, k, v, g, beta, h0, ref, fl):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "meta.txt"), "w") as f:
        f.write(f"{T} {HK} {HV} {d}\n")
    w = lambda name, x: x.detach().float().contiguous().cpu().numpy().astype("<f4").tofile(os.path.join(dirname, name))
    w("q.bin", q[0])
    w("k.bin", k[0])
    w("v.bin", v[0])
    w("g.bin", g[0])
    w("beta.bin", beta[0])
    w("state0.bin", h0[0].transpose(-1, -2))
    w("ref_out.bin", ref[0])
    w("ref_state.bin", ref[1].transpose(-1, -2))
    w("fla_out.bin", fl[0][0])
    w("fla_state.bin", fl[1][0].transpose(-1, -2))


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def graph_median_us(calls, reps):
    """Median us per call over 7 replays of a CUDA graph of `reps` calls (calls[i % len])."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / reps)
    return sorted(times)[3]


def main():
    out_dir = sys.argv[1]
    tmax = int(sys.argv[sys.argv.index("--tmax") + 1]) if "--tmax" in sys.argv else 65536
    gen = torch.Generator(device="cuda").manual_seed(1)
    import fla

    print(f"torch {torch.__version__}, fla {fla.__version__}, {torch.cuda.get_device_name()}", flush=True)
    d, HK = 128, 16
    # Outside check (also warms fla's autotuning for these head counts).
    for T, HV in [(4096, 16), (1000, 48)]:
        q, k, v, g, beta, h0 = inputs(T, HK, HV, d, gen)
        fl = run_fla(q, k, v, g, beta, h0)
        ref = recurrence_fp64(q, k, v, g, beta, h0)
        print(f"check T={T} HV={HV}: fla out {rel(fl[0][0], ref[0]):.1e} state {rel(fl[1][0], ref[1]):.1e}", flush=True)
        save_case(os.path.join(out_dir, f"T{T}_HV{HV}"), T, HK, HV, d, q, k, v, g, beta, h0, ref, fl)
    print("\n| H_v | T | fla chunk_gated_delta_rule us (CUDA graph) | input sets |\n| ---: | ---: | ---: | ---: |",
          flush=True)
    for HV in (16, 32, 48):
        for T in (512, 4096, 16384, 65536):
            if T > tmax:
                continue
            set_bytes = T * (2 * HK + HV) * d * 2 + T * HV * 6
            sets = max(1, min(8, (256 << 20) // set_bytes))
            ins = [inputs(T, HK, HV, d, gen) for _ in range(sets)]
            calls = [lambda x=x: run_fla(*x) for x in ins]
            reps = max(sets, 16 if T <= 4096 else 4)
            us = graph_median_us(calls, reps)
            print(f"| {HV} | {T} | {us:.1f} | {sets} |", flush=True)
            del ins, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
