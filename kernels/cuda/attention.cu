// Causal GQA attention on CUDA (kernels/cuda/ops.h; math as ref::attention: query head h
// reads KV head h / (n_head / n_head_kv), token t sits at n_past + t and attends to cache
// rows [0, n_past + t], scores scaled by s.scale, softmax over them).
//
// First version: fp32 CUDA-core arithmetic, flash-style (online softmax, the score row never
// stored). A block of 4 warps takes one token, one KV head and G (1, 2 or 4) of the query
// heads that share it, over one split of the keys: each warp walks keys warp, warp + 4, ...,
// loads the key and value rows once (lane l holds head_dim / 32 contiguous elements, one 16-
// byte load for a bf16 row of 256), kKeys keys per step, and updates G running softmaxes, so
// a K/V row fetched from memory serves the whole group. The 4 warps' (max, sum, output)
// merge in shared memory; with several splits per token the partial (max, sum, output) go to
// the workspace, and the last split block of a (token, tile) to finish merges them in split
// order (a counter per token and tile, left zeroed: the workspace is zeroed once).
//
// Split-K: at decode (T <= kAttnDecodeMaxT) each token cuts its keys into about
// kAttnDecodeSplits chunks (a multiple of 16 keys, at least 16), a function of its own key
// count only, so its arithmetic is that of a one-token call (verification = decode, bit for
// bit) and even depth 512 spreads over 264 blocks (one head each up to 8k keys: decode is
// latency-bound, and fixed chunks of 64 x 4 heads gave 18 blocks on 132 SMs: 2% of HBM). Prefill uses as many splits as fill the device twice (usually 1: no merge).
// Not yet: bf16 tensor cores (mma/wgmma) for prefill, the RoPE and output gate fused in.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace alloy::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Keys a warp loads per step: decode issues a whole step's K and V rows at once (its cost is
// the chain of memory round trips); prefill 1 (4 measured slower there: 160 vs 107 us at T
// 512, the registers halving the warps per SM).
constexpr int kDecodeKeys = 8, kPrefillKeys = 1;
constexpr int kMaxSplits = 128;  // make_plan never asks for more (decode: ~kAttnDecodeSplits)
static_assert(kAttnDecodeSplits <= kMaxSplits, "the merge's shared weights");

struct Args {
    const float* q;  // [T, n_head, hd]
    const void* k;   // [n_ctx, n_head_kv, hd] of tk
    const void* v;   // [n_ctx, n_head_kv, hd] of tv
    float* out;      // [T, n_head, hd]
    float* part_o;   // [T, n_head, S, hd]  (S > 1 only)
    float* part_ml;  // [T, n_head, S, 2]   running max, sum
    unsigned* done;  // [T, n_head / G]      splits finished (zero between calls)
    int64_t T, n_past, chunk;  // chunk: keys per split (0: per token, decode_chunk)
    int n_head, n_head_kv, hd, group, S;
    float scale;
    GgmlType tk, tv;
};

struct Plan {
    int64_t chunk = 0;
    int S = 1;
    int G = 1;
};

// Keys per split of a decode token with n_keys keys: about kAttnDecodeSplits splits, each a
// multiple of 32 keys (one step of kDecodeKeys keys for each of the 4 warps).
__host__ __device__ inline int64_t decode_chunk(int64_t n_keys) {
    const int64_t c = (n_keys + kAttnDecodeSplits - 1) / kAttnDecodeSplits;
    return c <= 32 ? 32 : (c + 31) / 32 * 32;
}

int heads_per_block(int group) { return group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1; }

Plan make_plan(const ref::AttentionShape& s, int64_t T, int64_t n_past) {
    Plan p;
    p.G = heads_per_block(s.n_head / s.n_head_kv);
    const int64_t max_keys = n_past + T;
    if (T <= kAttnDecodeMaxT) {
        // Decode is latency-bound: one head per block gives 4x the warps, each with a quarter
        // of the serial work; past 8k keys the group's shared K/V reads (HBM, not L2) win.
        // G changes no head's arithmetic, so the bits stay those of a one-token call.
        if (max_keys <= 8192) p.G = 1;
        p.chunk = 0;
        for (int64_t t = 0; t < T; ++t) {
            const int64_t n = n_past + t + 1;
            p.S = std::max(p.S, int(detail::ceil_div(n, decode_chunk(n))));
        }
        return p;
    } else {
        const int64_t blocks = T * (s.n_head / p.G);
        const int64_t want = detail::ceil_div(2 * detail::sm_count(), blocks);
        const int64_t S = std::max<int64_t>(1, std::min(want, detail::ceil_div(max_keys, 256)));
        p.chunk = detail::ceil_div(max_keys, S);
    }
    p.S = int(detail::ceil_div(max_keys, p.chunk));
    return p;
}

// EPL contiguous elements of a cache row (element index idx) as fp32; exact conversions.
template <int EPL>
__device__ __forceinline__ void load_row(const void* base, GgmlType ty, int64_t idx, float (&f)[EPL]) {
    if (ty == GgmlType::F32) {
        const float* p = static_cast<const float*>(base) + idx;
        if constexpr (EPL % 4 == 0) {
#pragma unroll
            for (int i = 0; i < EPL / 4; ++i) {
                const float4 x = __ldg(reinterpret_cast<const float4*>(p) + i);
                f[4 * i] = x.x, f[4 * i + 1] = x.y, f[4 * i + 2] = x.z, f[4 * i + 3] = x.w;
            }
        } else {
#pragma unroll
            for (int e = 0; e < EPL; ++e) f[e] = __ldg(p + e);
        }
        return;
    }
    static_assert(EPL % 2 == 0, "16-bit rows are read in 32-bit words");
    const unsigned short* p = static_cast<const unsigned short*>(base) + idx;
    uint32_t w[EPL / 2];
    if constexpr (EPL % 8 == 0) {
#pragma unroll
        for (int i = 0; i < EPL / 8; ++i) {
            const uint4 x = __ldg(reinterpret_cast<const uint4*>(p) + i);
            w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
        }
    } else if constexpr (EPL % 4 == 0) {
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
        w[0] = x.x, w[1] = x.y;
    } else {
#pragma unroll
        for (int i = 0; i < EPL / 2; ++i) w[i] = __ldg(reinterpret_cast<const uint32_t*>(p) + i);
    }
    const bool bf = ty == GgmlType::BF16;
#pragma unroll
    for (int i = 0; i < EPL / 2; ++i) {
        const unsigned short lo = w[i] & 0xffffu, hi = w[i] >> 16;
        f[2 * i] = bf ? __uint_as_float(uint32_t(lo) << 16) : __half2float(__ushort_as_half(lo));
        f[2 * i + 1] = bf ? __uint_as_float(uint32_t(hi) << 16) : __half2float(__ushort_as_half(hi));
    }
}

// Grid: x = token (last first: the longest rows start first), y = split, z = (KV head,
// group tile).
template <int EPL, int G, int kKeys>
__global__ void __launch_bounds__(kThreads) attention_kernel(const Args a) {
    constexpr int HD = EPL * 32;
    __shared__ float sm_o[kWarps][G][HD];
    __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = a.T - 1 - blockIdx.x;
    const int split = blockIdx.y;
    const int tiles = a.group / G;
    const int kvh = blockIdx.z / tiles;
    const int h0 = kvh * a.group + (blockIdx.z % tiles) * G;
    const int64_t n_keys = a.n_past + t + 1;
    const int64_t chunk = a.chunk ? a.chunk : decode_chunk(n_keys);
    const int64_t j0 = int64_t(split) * chunk;
    if (j0 >= n_keys) return;  // this token has fewer splits; the merge reads only its own
    const int64_t j1 = min(j0 + chunk, n_keys);

    float q[G][EPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float* qh = a.q + (t * a.n_head + h0 + g) * HD + lane * EPL;
#pragma unroll
        for (int e = 0; e < EPL; ++e) q[g][e] = qh[e] * a.scale;
    }
    float m[G], l[G], acc[G][EPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[g][e] = 0.0f;
    }
    const int64_t kv_stride = int64_t(a.n_head_kv) * HD;
    const int64_t col = int64_t(kvh) * HD + lane * EPL;
    // kKeys keys per warp step, all loads issued first: one key at a time left each warp
    // waiting a full memory latency per key (decode at depth 4096 ran at 8% of HBM).
    for (int64_t jb = j0 + int64_t(warp) * kKeys; jb < j1; jb += int64_t(kWarps) * kKeys) {
        float kf[kKeys][EPL], vf[kKeys][EPL];
#pragma unroll
        for (int kk = 0; kk < kKeys; ++kk) {
            if (jb + kk < j1) {
                load_row<EPL>(a.k, a.tk, (jb + kk) * kv_stride + col, kf[kk]);
                load_row<EPL>(a.v, a.tv, (jb + kk) * kv_stride + col, vf[kk]);
            } else {
#pragma unroll
                for (int e = 0; e < EPL; ++e) kf[kk][e] = vf[kk][e] = 0.0f;
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float sc[kKeys];
#pragma unroll
            for (int kk = 0; kk < kKeys; ++kk) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; ++e) dot = fmaf(q[g][e], kf[kk][e], dot);
                sc[kk] = dot;
            }
            // The kKeys butterflies interleaved (independent shuffles in flight); every lane
            // ends with the same sums.
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
#pragma unroll
                for (int kk = 0; kk < kKeys; ++kk) sc[kk] += __shfl_xor_sync(0xffffffffu, sc[kk], o);
            float m_new = m[g];
#pragma unroll
            for (int kk = 0; kk < kKeys; ++kk)
                if (jb + kk < j1) m_new = fmaxf(m_new, sc[kk]);
            const float corr = expf(m[g] - m_new);  // 0 on the first step (m = -inf)
            float p[kKeys], psum = 0.0f;
#pragma unroll
            for (int kk = 0; kk < kKeys; ++kk) {
                p[kk] = jb + kk < j1 ? expf(sc[kk] - m_new) : 0.0f;
                psum += p[kk];
            }
            l[g] = fmaf(l[g], corr, psum);
#pragma unroll
            for (int e = 0; e < EPL; ++e) {
                float o = acc[g][e] * corr;
#pragma unroll
                for (int kk = 0; kk < kKeys; ++kk) o = fmaf(p[kk], vf[kk][e], o);
                acc[g][e] = o;
            }
            m[g] = m_new;
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int e = 0; e < EPL; ++e) sm_o[warp][g][lane * EPL + e] = acc[g][e];
        if (lane == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = l[g];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += kThreads) {
        const int g = idx / HD, d = idx % HD;
        float M = sm_m[0][g];  // warp 0 saw key j0, so M is finite
#pragma unroll
        for (int w = 1; w < kWarps; ++w) M = fmaxf(M, sm_m[w][g]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float c = expf(sm_m[w][g] - M);  // 0 for a warp that saw no key
            L = fmaf(sm_l[w][g], c, L);
            O = fmaf(sm_o[w][g][d], c, O);
        }
        const int64_t th = t * a.n_head + h0 + g;
        if (a.S == 1) {
            a.out[th * HD + d] = O / L;
        } else {
            a.part_o[(th * a.S + split) * HD + d] = O;
            if (d == 0) a.part_ml[(th * a.S + split) * 2] = M, a.part_ml[(th * a.S + split) * 2 + 1] = L;
        }
    }
    if (a.S == 1) return;
    // The last of this (token, tile)'s splits to finish merges them all (a second kernel cost
    // a launch and its own chain of memory round trips: ~7 us at depth 512).
    __shared__ bool last;
    __shared__ float sm_w[G][kMaxSplits];
    __shared__ float sm_L[G];
    const int ns = int((n_keys + chunk - 1) / chunk);
    __syncthreads();  // this block's partials are written
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned* cnt = a.done + t * (a.n_head / G) + blockIdx.z;
        last = atomicAdd(cnt, 1u) == unsigned(ns - 1);
        if (last) *cnt = 0;  // every split has arrived: leave the counter zeroed for the next call
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Warp g takes head g's statistics: each lane loads its (<= 4) splits' (max, sum) at once,
    // the max is order-free, the weighted sum a fixed tree; then every thread merges outputs
    // of all G heads with the split loop unrolled, so the merge costs ~2 memory round trips.
    static_assert(G <= kWarps && kMaxSplits <= 4 * 32, "merge layout");
    if (warp < G) {
        const int64_t th = t * a.n_head + h0 + warp;
        const float* ml = a.part_ml + th * a.S * 2;
        float mv[4], lv[4];
        float Mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int s2 = lane + 32 * i;
            mv[i] = s2 < ns ? __ldcg(ml + 2 * s2) : -INFINITY;
            lv[i] = s2 < ns ? __ldcg(ml + 2 * s2 + 1) : 0.0f;
            Mx = fmaxf(Mx, mv[i]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) Mx = fmaxf(Mx, __shfl_xor_sync(0xffffffffu, Mx, o));
        float Ls = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int s2 = lane + 32 * i;
            if (s2 < ns) {
                const float w = expf(mv[i] - Mx);
                sm_w[warp][s2] = w;
                Ls = fmaf(lv[i], w, Ls);
            }
        }
        Ls = detail::warp_sum_all(Ls);  // with one split exactly l
        if (lane == 0) sm_L[warp] = Ls;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += kThreads) {
        const int g = idx / HD, d = idx % HD;
        const int64_t th = t * a.n_head + h0 + g;
        const float* po = a.part_o + th * a.S * HD + d;
        float Os = 0.0f;
#pragma unroll 16
        for (int s2 = 0; s2 < ns; ++s2) Os = fmaf(__ldcg(po + int64_t(s2) * HD), sm_w[g][s2], Os);
        a.out[th * HD + d] = Os / sm_L[g];  // with one split: O / L exactly, as the direct path
    }
}

template <int EPL, int kKeys>
void launch_epl(const Args& a, int G, dim3 grid, cudaStream_t st) {
    switch (G) {
        case 4: attention_kernel<EPL, 4, kKeys><<<grid, kThreads, 0, st>>>(a); break;
        case 2: attention_kernel<EPL, 2, kKeys><<<grid, kThreads, 0, st>>>(a); break;
        default: attention_kernel<EPL, 1, kKeys><<<grid, kThreads, 0, st>>>(a); break;
    }
}

bool kv_type_ok(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

void check(const ref::AttentionShape& s, int64_t T, int64_t n_past, const char* op) {
    if (!kv_type_ok(s.type_k) || !kv_type_ok(s.type_v))
        throw Error(std::string(op) + ": KV cache types must be f32, f16 or bf16");
    if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
        throw Error(std::string(op) + ": head_dim " + std::to_string(s.head_dim) + " not in {64, 128, 256}");
    if (s.n_head_kv <= 0 || s.n_head <= 0 || s.n_head % s.n_head_kv)
        throw Error(std::string(op) + ": n_head must be a positive multiple of n_head_kv");
    if (T < 0 || n_past < 0 || T > 0x7fffffff) throw Error(std::string(op) + ": bad T or n_past");
}

}  // namespace

size_t attention_workspace_bytes(const ref::AttentionShape& s, int64_t T, int64_t n_past) {
    check(s, T, n_past, "cuda::attention_workspace_bytes");
    if (T == 0) return 0;
    const Plan p = make_plan(s, T, n_past);
    if (p.S == 1) return 0;
    const size_t rows = size_t(T) * s.n_head * p.S;
    return (rows * s.head_dim + 63) / 64 * 64 * 4 + (rows * 2 + 63) / 64 * 64 * 4 + size_t(T) * (s.n_head / p.G) * 4;
}

void attention(const ref::AttentionShape& s, const float* q, const void* k_cache, const void* v_cache, float* out,
               int64_t T, int64_t n_past, void* workspace, void* stream) {
    const char* op = "cuda::attention";
    check(s, T, n_past, op);
    if (T == 0) return;
    const Plan p = make_plan(s, T, n_past);
    if (p.S > kMaxSplits) throw Error(std::string(op) + ": internal: more key splits than the merge holds");
    Args a{q, k_cache, v_cache, out, nullptr, nullptr, nullptr, T, n_past, p.chunk,
           s.n_head, s.n_head_kv, s.head_dim, s.n_head / s.n_head_kv, p.S, s.scale, s.type_k, s.type_v};
    if (p.S > 1) {
        if (!workspace) throw Error(std::string(op) + ": workspace is null");
        const size_t rows = size_t(T) * s.n_head * p.S;
        a.part_o = static_cast<float*>(workspace);
        a.part_ml = a.part_o + (rows * s.head_dim + 63) / 64 * 64;
        a.done = reinterpret_cast<unsigned*>(a.part_ml + (rows * 2 + 63) / 64 * 64);
    }
    cudaStream_t st = detail::as_stream(stream);
    const dim3 grid(unsigned(T), unsigned(p.S), unsigned(s.n_head / p.G));
    // The decode step size is fixed (not chosen by G) so a token's arithmetic never depends on
    // the call's other tokens.
    if (T <= kAttnDecodeMaxT) {
        switch (s.head_dim) {
            case 64: launch_epl<2, kDecodeKeys>(a, p.G, grid, st); break;
            case 128: launch_epl<4, kDecodeKeys>(a, p.G, grid, st); break;
            default: launch_epl<8, kDecodeKeys>(a, p.G, grid, st); break;
        }
    } else {
        switch (s.head_dim) {
            case 64: launch_epl<2, kPrefillKeys>(a, p.G, grid, st); break;
            case 128: launch_epl<4, kPrefillKeys>(a, p.G, grid, st); break;
            default: launch_epl<8, kPrefillKeys>(a, p.G, grid, st); break;
        }
    }
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
