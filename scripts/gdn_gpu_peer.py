#!/usr/bin/env python3
"""The GDN decode peer on the GPU, run on the device machine next to build/gdn_cuda_bench:
transformers' torch_recurrent_gated_delta_rule (transformers 5.17, fp32, CUDA graph replay as
shared/anchors/gpu-h200.md timed it) on the anchor's decode shapes, and its outputs on random
inputs saved for `gdn_cuda_bench --check DIR`, which runs cuda::gdn_delta_serial on the same
inputs: an outside check of the kernel, not only against kernels/ref.

    python3 scripts/gdn_gpu_peer.py DIR && build/gdn_cuda_bench --check DIR

Layouts written (float32, little-endian), case by case in DIR/<name>/: meta.txt "B T H d";
q.bin [B*T, H, d] (L2-normalised and already / sqrt(d), alloy's convention), k.bin [B*T, H, d]
(L2-normalised), v.bin [B*T, H, d], g.bin and beta.bin [B*T, H], state0.bin [B, H, d_v, d_k]
(alloy's transposed layout), out.bin [B*T, H, d], state1.bin [B, H, d_v, d_k].
"""
import os
import sys

import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as m

fn = m.torch_recurrent_gated_delta_rule


def inputs(B, T, H, d, gen):
    r = lambda *s: torch.randn(*s, generator=gen, device="cuda")
    q = torch.nn.functional.normalize(r(B, T, H, d), dim=-1)
    k = torch.nn.functional.normalize(r(B, T, H, d), dim=-1)
    v = r(B, T, H, d)
    g = -(0.01 + torch.rand(B, T, H, generator=gen, device="cuda"))
    beta = torch.rand(B, T, H, generator=gen, device="cuda")
    s0 = 0.3 * r(B, H, d, d)  # HF layout [B, H, d_k, d_v]
    return q, k, v, g, beta, s0


def save(dirname, B, T, H, d, q, k, v, g, beta, s0, out, s1):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "meta.txt"), "w") as f:
        f.write(f"{B} {T} {H} {d}\n")
    w = lambda name, x: x.detach().float().contiguous().cpu().numpy().astype("<f4").tofile(os.path.join(dirname, name))
    w("q.bin", q / d ** 0.5)
    w("k.bin", k)
    w("v.bin", v)
    w("g.bin", g)
    w("beta.bin", beta)
    w("state0.bin", s0.transpose(-1, -2))
    w("out.bin", out)
    w("state1.bin", s1.transpose(-1, -2))


def graph_us(call, reps=200):
    """us per call: the best of 5 replays of a CUDA graph of `reps` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            call()
    best = float("inf")
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1e3 / reps)
    return best


def main():
    out_dir = sys.argv[1]
    gen = torch.Generator(device="cuda").manual_seed(1)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    # Outside check of the kernel: decode shapes plus a multi-token, multi-sequence case.
    for (B, T, H, d) in [(1, 1, 16, 128), (32, 1, 32, 128), (2, 7, 4, 128), (3, 5, 6, 64)]:
        q, k, v, g, beta, s0 = inputs(B, T, H, d, gen)
        out, s1 = fn(q, k, v, g, beta, initial_state=s0.clone(), output_final_state=True)
        save(os.path.join(out_dir, f"B{B}_T{T}_H{H}_d{d}"), B, T, H, d, q, k, v, g, beta, s0, out, s1)
    # Timing at the anchor's decode shapes (T = 1).
    print("\n| H_v | B | transformers torch_recurrent, CUDA graph (us) |\n| ---: | ---: | ---: |")
    for H in (16, 32, 48):
        for B in (1, 32):
            q, k, v, g, beta, s0 = inputs(B, 1, H, 128, gen)
            st = s0.clone()
            us = graph_us(lambda: fn(q, k, v, g, beta, initial_state=st, output_final_state=True))
            print(f"| {H} | {B} | {us:.2f} |")


if __name__ == "__main__":
    main()
