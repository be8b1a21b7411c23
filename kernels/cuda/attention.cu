// Causal GQA attention on CUDA (kernels/cuda/ops.h; math as ref::attention: query head h
// reads KV head h / (n_head / n_head_kv), token t sits at n_past + t and attends to cache
// rows [0, n_past + t], scores scaled by s.scale, softmax over them).
//
// CUDA-core path (decode, and prefill on f16/f32 caches): fp32 arithmetic, flash-style (online softmax, the score row never
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
// // latency-bound, and fixed chunks of 64 x 4 heads gave 18 blocks on 132 SMs: 2% of HBM). Prefill
// uses as many splits as fill the device twice (usually 1: no merge).
// Prefill with 16-bit caches runs on tensor cores instead (attention_tc_kernel below), its keys
// split the same way when a piece's blocks do not fill the SMs twice. Not yet:
// wgmma / ldmatrix / double-buffered tiles there, the RoPE and output gate fused in.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
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

// The tensor-core prefill kernel's tile (attention_tc_kernel below): 64 query rows (whole
// GQA groups), 64 keys a step, 4 warps.
constexpr int kTcRows = 64, kTcKeys = 64, kTcThreads = 128;

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

// Prefill with bf16 K and V runs on tensor cores (attention_tc_kernel): no splits.
bool use_tensor_cores(const ref::AttentionShape& s, int64_t T) {
    const int group = s.n_head / s.n_head_kv;  // a block's 64 rows hold whole groups
    const bool b16 = s.type_k == GgmlType::BF16 || s.type_k == GgmlType::F16;
    return T > kAttnDecodeMaxT && b16 && s.type_v == s.type_k && 64 % group == 0;
}

// The 16-bit decode kernel's constants (attn_decode_kernel below).
#ifndef ALLOY_ATTN_DEC_WARPS
#define ALLOY_ATTN_DEC_WARPS 4
#endif
constexpr int kDecWarps = ALLOY_ATTN_DEC_WARPS, kDecKeys = 8, kDecRows = 4;
#ifndef ALLOY_ATTN_DEC_SPLITS
#define ALLOY_ATTN_DEC_SPLITS 64
#endif
constexpr int kDecSplits = ALLOY_ATTN_DEC_SPLITS;
constexpr int kDecMinChunk = kDecWarps * kDecKeys;  // one block step
static_assert(kDecSplits <= 64 && kDecSplits <= kMaxSplits, "the merge block holds one split per thread");

__host__ __device__ inline int64_t dec_chunk(int64_t n_keys) {
    const int64_t want = (n_keys + kDecSplits - 1) / kDecSplits;
    int64_t c = kDecMinChunk;
    while (c < want) c <<= 1;
    return c;
}
__host__ __device__ inline int dec_splits(int64_t n_keys) {
    const int64_t c = dec_chunk(n_keys);
    return int((n_keys + c - 1) / c);
}

// Query heads per decode block: the whole group when it fits in kDecRows rows.
int dec_heads(int group) { return group <= kDecRows ? group : heads_per_block(group); }

bool use_dec16(const ref::AttentionShape& s, int64_t T) {
    auto b16 = [](GgmlType t) { return t == GgmlType::F16 || t == GgmlType::BF16; };
    return T <= kAttnDecodeMaxT && b16(s.type_k) && b16(s.type_v);
}

Plan make_plan(const ref::AttentionShape& s, int64_t T, int64_t n_past) {
    Plan p;
    if (use_tensor_cores(s, T)) {
        // A prompt piece after a long context (512-token steps at depth 3584: 32 x 2 blocks,
        // each walking 4096 keys) splits its keys so that the blocks fill the SMs twice; the
        // splits are multiples of the 64-key tile, at least 512 keys each, merged after.
        const int group = s.n_head / s.n_head_kv;
        const int64_t blocks = detail::ceil_div(T, kTcRows / group) * s.n_head_kv;
        const int64_t max_keys = n_past + T;
        // (Fill 4x and 256-key splits measured within 2% of these: bench/RESULTS.md.)
        // ALLOY_ATTN_TC_SPLITS=0: one split, for A/B.
        static const bool splits_on = [] { const char* e = std::getenv("ALLOY_ATTN_TC_SPLITS"); return !e || std::atoi(e) != 0; }();
        const int64_t want = std::min(detail::ceil_div(2 * detail::sm_count(), blocks), detail::ceil_div(max_keys, 512));
        if (want <= 1 || !splits_on) return p;
        p.chunk = detail::ceil_div(detail::ceil_div(max_keys, want), kTcKeys) * kTcKeys;
        p.S = int(detail::ceil_div(max_keys, p.chunk));
        return p;
    }
    p.G = heads_per_block(s.n_head / s.n_head_kv);
    const int64_t max_keys = n_past + T;
    if (use_dec16(s, T)) {  // attn_decode_kernel: splits by each token's key count
        p.G = dec_heads(s.n_head / s.n_head_kv);
        p.chunk = 0;
        for (int64_t t = 0; t < T; ++t) p.S = std::max(p.S, dec_splits(n_past + t + 1));
        return p;
    }
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
    detail::pdl_entry();
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

// ---- decode on 16-bit caches (f16 / bf16 K and V, T <= kAttnDecodeMaxT) -------------------
// A block of kDecWarps warps takes one token, one KV head and up to kDecRows of its query
// heads (all 4 of the 0.8B's group: every K/V row fetched serves the whole group), over one
// split of the token's keys. The splits are a function of the token's own key count n only
// (dec_chunk: a power of two >= kDecMinChunk = 32 keys, so at most kDecSplits of them), so a
// token's bits are those of a one-token call whatever T and n_past (verification = decode).
// Warp w of 4 takes keys j0 + 32 i + 8 w .. + 8 (8 warps per block measured slower below 2k
// keys and at T = 4: 213 registers give one block of 8 warps per SM): their K and V rows are loaded at once as raw 16-bit words (one
// 16-byte load per lane per row at head_dim 256) and converted when used. The 8 keys x 4 rows
// dot products are reduced with one reduce-scatter butterfly (31 shuffles for the 32 sums
// instead of 5 per sum; each sum is still the xor-16, 8, 4, 2, 1 tree over the lanes), so lane
// L ends with the score of key L / 4 and row L % 4; the online softmax keeps per-lane partial
// sums of p (reduced over the row's lanes once at the end); p goes through shared memory as
// one float4 per key for the PV step. The warps' (max, sum, o) merge in shared memory in warp
// order; a token with one split writes out directly, else the partials go to the workspace
// and attn_merge_kernel (launched with programmatic dependent launch, so it is resident and
// waiting when this grid ends) merges them in split order, one block per (token, head, 64
// dims). No counters, fences or atomics.
struct DecArgs {
    const float* q;
    const void* k;
    const void* v;
    float* out;
    float* part_o;   // [T, n_head, S, hd]
    float* part_ml;  // [T, n_head, S, 2]
    int64_t T, n_past;
    int n_head, n_head_kv, group, G, S;
    float scale;
    bool k_bf, v_bf;  // bf16 (else f16)
    // attention_decode: per token on the device its position (n_keys = pos[t] + 1) and cache
    // (k_tab[slot[t]], v_tab[slot[t]]); nullptr: n_keys = n_past + t + 1 and the caches k, v.
    const int32_t* pos = nullptr;
    const int32_t* slot = nullptr;
    const void* const* k_tab = nullptr;
    const void* const* v_tab = nullptr;
    __device__ int64_t n_keys(int64_t t) const { return pos ? int64_t(pos[t]) + 1 : n_past + t + 1; }
};

template <int EPL>
__device__ __forceinline__ void load_words(const void* base, int64_t idx, uint32_t (&w)[EPL / 2]) {
    const unsigned short* p = static_cast<const unsigned short*>(base) + idx;
    if constexpr (EPL == 8) {
        const uint4 x = __ldg(reinterpret_cast<const uint4*>(p));
        w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
    } else if constexpr (EPL == 4) {
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
        w[0] = x.x, w[1] = x.y;
    } else {
        w[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
    }
}
template <int EPL>
__device__ __forceinline__ void words_to_f32(const uint32_t (&w)[EPL / 2], bool bf, float (&f)[EPL]) {
    if (bf) {
#pragma unroll
        for (int i = 0; i < EPL / 2; ++i) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
#pragma unroll
        for (int i = 0; i < EPL / 2; ++i) {
            f[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
            f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
        }
    }
}

// v[0..32): 32 partial sums per lane -> the full sum of slot `lane` (the xor 16, 8, 4, 2, 1
// tree over the lanes, as a butterfly would give; fp32 addition commutes).
__device__ __forceinline__ float reduce_scatter32(float (&v)[32], int lane) {
#pragma unroll
    for (int lvl = 0; lvl < 5; ++lvl) {
        const int o = 16 >> lvl, h = o;
        const bool up = lane & o;
#pragma unroll
        for (int i = 0; i < h; ++i) {
            const float lo = v[i], hi = v[i + h];
            const float keep = up ? hi : lo, send = up ? lo : hi;
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
    return v[0];
}

template <int EPL>
__global__ void __launch_bounds__(kDecWarps * 32, 1) attn_decode_kernel(const DecArgs a) {
    detail::pdl_entry();
    constexpr int HD = EPL * 32, R = kDecRows;
    static_assert(kDecKeys * R == 32, "one score per lane after the reduce-scatter");
    __shared__ float sm_o[kDecWarps][R][HD];
    __shared__ float sm_m[kDecWarps][R], sm_l[kDecWarps][R];
    __shared__ __align__(16) float sm_p[kDecWarps][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = a.T - 1 - blockIdx.z;  // the longest rows first
    const int split = blockIdx.x;
    const int tiles = a.group / a.G;
    const int kvh = blockIdx.y / tiles, h0 = kvh * a.group + (blockIdx.y % tiles) * a.G;
    const int64_t n_keys = a.n_keys(t);
    const int64_t chunk = dec_chunk(n_keys);
    const int64_t j0 = int64_t(split) * chunk;
    if (j0 >= n_keys) return;  // this token has fewer splits
    const int64_t j1 = min(j0 + chunk, n_keys);
    const int ns = int((n_keys + chunk - 1) / chunk);
    const int G = a.G;

    float q[R][EPL];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < G) {
            const float* qh = a.q + (t * a.n_head + h0 + r) * HD + lane * EPL;
#pragma unroll
            for (int e = 0; e < EPL; ++e) q[r][e] = qh[e] * a.scale;
        } else {
#pragma unroll
            for (int e = 0; e < EPL; ++e) q[r][e] = 0.0f;
        }
    }
    float m[R], acc[R][EPL], lpart = 0.0f;  // lpart: this lane's share of its row's sum of p
#pragma unroll
    for (int r = 0; r < R; ++r) {
        m[r] = -INFINITY;
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[r][e] = 0.0f;
    }
    const void* const kc = a.k_tab ? a.k_tab[a.slot[t]] : a.k;
    const void* const vc = a.v_tab ? a.v_tab[a.slot[t]] : a.v;
    const int myrow = lane & 3, mykey = lane >> 2;
    const int64_t kv_stride = int64_t(a.n_head_kv) * HD;
    const int64_t col = int64_t(kvh) * HD + lane * EPL;
    for (int64_t jb = j0 + int64_t(warp) * kDecKeys; jb < j1; jb += int64_t(kDecWarps) * kDecKeys) {
        uint32_t kw[kDecKeys][EPL / 2], vw[kDecKeys][EPL / 2];
#pragma unroll
        for (int kk = 0; kk < kDecKeys; ++kk) {
            if (jb + kk < j1) {
                load_words<EPL>(kc, (jb + kk) * kv_stride + col, kw[kk]);
                load_words<EPL>(vc, (jb + kk) * kv_stride + col, vw[kk]);
            } else {
#pragma unroll
                for (int i = 0; i < EPL / 2; ++i) kw[kk][i] = vw[kk][i] = 0u;
            }
        }
        float sc[32];
#pragma unroll
        for (int kk = 0; kk < kDecKeys; ++kk) {
            float kf[EPL];
            words_to_f32<EPL>(kw[kk], a.k_bf, kf);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < EPL; ++e) d = fmaf(q[r][e], kf[e], d);
                sc[kk * R + r] = d;
            }
        }
        const float score = reduce_scatter32(sc, lane);  // key jb + mykey, row myrow
        const bool valid = myrow < G && jb + mykey < j1;
        const float sv = valid ? score : -INFINITY;
        float mx = sv;
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        float mnew[R], corr[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            mnew[r] = fmaxf(m[r], __shfl_sync(0xffffffffu, mx, r));
            corr[r] = mnew[r] == -INFINITY ? 1.0f : expf(m[r] - mnew[r]);  // 0 on a row's first keys
        }
        const float mown = myrow == 0 ? mnew[0] : myrow == 1 ? mnew[1] : myrow == 2 ? mnew[2] : mnew[3];
        const float cown = myrow == 0 ? corr[0] : myrow == 1 ? corr[1] : myrow == 2 ? corr[2] : corr[3];
        const float p = valid ? expf(sv - mown) : 0.0f;
        lpart = fmaf(lpart, cown, p);
        sm_p[warp][lane] = p;
        __syncwarp();
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[r][e] *= corr[r];
#pragma unroll
        for (int kk = 0; kk < kDecKeys; ++kk) {
            const float4 pk = *reinterpret_cast<const float4*>(&sm_p[warp][kk * R]);
            float vf[EPL];
            words_to_f32<EPL>(vw[kk], a.v_bf, vf);
#pragma unroll
            for (int e = 0; e < EPL; ++e) {
                acc[0][e] = fmaf(pk.x, vf[e], acc[0][e]);
                acc[1][e] = fmaf(pk.y, vf[e], acc[1][e]);
                acc[2][e] = fmaf(pk.z, vf[e], acc[2][e]);
                acc[3][e] = fmaf(pk.w, vf[e], acc[3][e]);
            }
        }
        __syncwarp();  // sm_p is read before the next step rewrites it
#pragma unroll
        for (int r = 0; r < R; ++r) m[r] = mnew[r];
    }
    // The row sums: the partial sums of the row's 8 lanes (key bits 2..4 of the lane).
    lpart += __shfl_xor_sync(0xffffffffu, lpart, 4);
    lpart += __shfl_xor_sync(0xffffffffu, lpart, 8);
    lpart += __shfl_xor_sync(0xffffffffu, lpart, 16);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < G) {
#pragma unroll
            for (int e = 0; e < EPL; ++e) sm_o[warp][r][lane * EPL + e] = acc[r][e];
        }
        if (lane == 0) sm_m[warp][r] = m[r];
    }
    if (lane < R) sm_l[warp][lane] = lpart;
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HD; idx += kDecWarps * 32) {
        const int r = idx / HD, d = idx % HD;
        float M = sm_m[0][r];  // warp 0 saw key j0: finite
#pragma unroll
        for (int w = 1; w < kDecWarps; ++w) M = fmaxf(M, sm_m[w][r]);
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < kDecWarps; ++w) {
            const float c = expf(sm_m[w][r] - M);  // 0 for a warp that saw no key
            L = fmaf(sm_l[w][r], c, L);
            O = fmaf(sm_o[w][r][d], c, O);
        }
        const int64_t th = t * a.n_head + h0 + r;
        if (ns == 1) {
            a.out[th * HD + d] = O / L;
        } else {
            a.part_o[(th * a.S + split) * HD + d] = O;
            if (d == 0) a.part_ml[(th * a.S + split) * 2] = M, a.part_ml[(th * a.S + split) * 2 + 1] = L;
        }
    }
}

// The splits of one (token, head) merged in split order: block (token x head, 64 dims), a
// thread per dimension. Skips tokens of one split (written directly).
constexpr int kMergeThreads = 64;
__global__ void __launch_bounds__(kMergeThreads) attn_merge_kernel(const DecArgs a, int hd) {
    detail::pdl_entry();
    const int64_t th = blockIdx.x, t = th / a.n_head;
    const int ns = dec_splits(a.n_keys(t));
    if (ns == 1) return;
    __shared__ float sm_m[kMergeThreads], sm_l[kMergeThreads], sm_w[kMergeThreads];
    const int tid = threadIdx.x;
    const float* ml = a.part_ml + th * a.S * 2;
    if (tid < ns) sm_m[tid] = __ldcg(ml + 2 * tid), sm_l[tid] = __ldcg(ml + 2 * tid + 1);
    const int d = blockIdx.y * kMergeThreads + tid;
    const float* po = a.part_o + th * a.S * hd + d;
    __syncthreads();
    float M = sm_m[0];
    for (int s2 = 1; s2 < ns; ++s2) M = fmaxf(M, sm_m[s2]);
    if (tid < ns) sm_w[tid] = expf(sm_m[tid] - M);
    __syncthreads();
    float L = 0.0f, O = 0.0f;
#pragma unroll 16
    for (int s2 = 0; s2 < ns; ++s2) {
        L = fmaf(sm_l[s2], sm_w[s2], L);
        O = fmaf(__ldcg(po + int64_t(s2) * hd), sm_w[s2], O);
    }
    a.out[th * hd + d] = O / L;
}

template <int EPL>
void launch_dec16(const DecArgs& a, cudaStream_t st, const char* op) {
    const dim3 grid(unsigned(a.S), unsigned(a.n_head_kv * (a.group / a.G)), unsigned(a.T));
    detail::launch(op, attn_decode_kernel<EPL>, dim3(grid), dim3(kDecWarps * 32), 0, st, a);
    ALLOY_CUDA_LAUNCHED(op);
    if (a.S == 1) return;  // every token has one split: written directly
#ifdef ALLOY_ATTN_EXP
    static const int exp_mode = [] { const char* e = getenv("ALLOY_ATTN_EXP"); return e ? atoi(e) : 0; }();
    if (exp_mode == 2) return;  // timing experiment: no merge
    if (exp_mode == 1) {
        detail::launch(op, attn_merge_kernel, dim3(unsigned(a.T * a.n_head), unsigned(EPL * 32 / kMergeThreads)), dim3(kMergeThreads), 0, st, a, EPL * 32);
        ALLOY_CUDA_LAUNCHED(op);
        return;
    }
#endif
    detail::launch(op, attn_merge_kernel, dim3(unsigned(a.T * a.n_head), unsigned(EPL * 32 / kMergeThreads)),
                   dim3(kMergeThreads), 0, st, a, EPL * 32);
}

template <int EPL, int kKeys>
void launch_epl(const Args& a, int G, dim3 grid, cudaStream_t st) {
    switch (G) {
        case 4: detail::launch("cuda::attention", attention_kernel<EPL, 4, kKeys>, dim3(grid), dim3(kThreads), 0, st, a); break;
        case 2: detail::launch("cuda::attention", attention_kernel<EPL, 2, kKeys>, dim3(grid), dim3(kThreads), 0, st, a); break;
        default: detail::launch("cuda::attention", attention_kernel<EPL, 1, kKeys>, dim3(grid), dim3(kThreads), 0, st, a); break;
    }
}

// ---- prefill on tensor cores (mma.sync m16n8k16, bf16 or f16, fp32 accumulation) ---------
// For bf16 K and V caches, or f16 ones (then q and P are rounded to f16: finer than bf16, and
// in range: |q scale| and P <= 1 are far from f16's limit), and T > kAttnDecodeMaxT. A block of 4 warps takes 64 query rows:
// 64 / group consecutive tokens x the group's query heads of one KV head (row r = token
// r / group, head r % group), so a staged K/V tile serves the whole group; each warp owns 16
// rows. Per tile of 64 keys: K and V [64, D] are
// staged in shared memory (bf16, rows padded by 16 bytes), fragments loaded by ldmatrix (V's
// transposed by ldmatrix.trans), S = Q K^T goes to registers, the online softmax
// runs on the S fragments (a row's 4 owning lanes reduce by shuffles), P is rounded to bf16
// and fed back as the A operand of O += P V (the S accumulator layout of two adjacent 8-key
// tiles is the A layout of one 16-key slice). q is rounded to bf16 after the scale (and
// log2 e, so the softmax uses exp2), so results differ from ref by ~1e-3 relative.

// kF16: f16 operands (f16 caches), else bf16.
template <bool kF16>
__device__ __forceinline__ void mma_16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (kF16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices from shared memory, one row address per lane (lanes 8i..8i+7: matrix
// i); .trans delivers each transposed.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
    const unsigned a = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
    const unsigned a = unsigned(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

template <bool kF16>
__device__ __forceinline__ uint32_t pack_16(float lo, float hi) {
    if constexpr (kF16) {
        const __half2 v = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    } else {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&v);
    }
}

template <int D, bool kF16>
__global__ void __launch_bounds__(kTcThreads, 1) attention_tc_kernel(const Args a) {
    detail::pdl_entry();
    constexpr int QS = D + 8;  // row stride of Q, K, V in bf16 elements (16-byte pad: the 8 row
                               // addresses of an ldmatrix fall in 32 different banks)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint16_t* Qs = reinterpret_cast<uint16_t*>(smem_raw);  // [64][QS]
    uint16_t* Ks = Qs + kTcRows * QS;                      // [64][QS]
    uint16_t* Vs = Ks + kTcKeys * QS;                      // [64][QS]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qr = lane >> 2, qc = (lane & 3) * 2;  // fragment row / column pair
    // Blocks with the most keys first.
    const int tpb = kTcRows / a.group;  // tokens per block
    const int64_t t0 = (int64_t(gridDim.x) - 1 - blockIdx.x) * tpb;
    const int kvh = blockIdx.y, h0 = kvh * a.group;
    const int64_t kv_stride = int64_t(a.n_head_kv) * D;
    const uint16_t* kc = static_cast<const uint16_t*>(a.k);
    const uint16_t* vc = static_cast<const uint16_t*>(a.v);

    // Q tile, scaled by scale * log2(e), to bf16; rows past T are zero (never stored).
    const float qscale = a.scale * 1.4426950408889634f;
    for (int i = threadIdx.x; i < kTcRows * D / 2; i += kTcThreads) {
        const int r = i / (D / 2), c = (i % (D / 2)) * 2;
        const int64_t tok = t0 + r / a.group;
        float2 v = make_float2(0.0f, 0.0f);
        if (tok < a.T) v = *reinterpret_cast<const float2*>(a.q + (tok * a.n_head + h0 + r % a.group) * D + c);
        *reinterpret_cast<uint32_t*>(Qs + r * QS + c) = pack_16<kF16>(v.x * qscale, v.y * qscale);
    }
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // rows qr and qr + 8
    const int r0 = warp * 16 + qr, r1 = r0 + 8;  // this thread's two rows
    const int64_t tok0 = t0 + r0 / a.group, tok1 = t0 + r1 / a.group;
    // Keys any row sees, cut to this block's split (blockIdx.z of a.S, a.chunk keys each).
    const int64_t key_lo = a.S > 1 ? int64_t(blockIdx.z) * a.chunk : 0;
    const int64_t key_end = min(min(a.n_past + t0 + tpb, a.n_past + a.T), a.S > 1 ? key_lo + a.chunk : INT64_MAX);

    for (int64_t j0 = key_lo; j0 < key_end; j0 += kTcKeys) {
        __syncthreads();  // the previous tile is consumed (and Q is written, the first time)
        for (int i = threadIdx.x; i < kTcKeys * D / 8; i += kTcThreads) {
            const int r = i / (D / 8), c = (i % (D / 8)) * 8;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j0 + r < key_end) {
                kv = __ldg(reinterpret_cast<const uint4*>(kc + (j0 + r) * kv_stride + kvh * D + c));
                vv = __ldg(reinterpret_cast<const uint4*>(vc + (j0 + r) * kv_stride + kvh * D + c));
            }
            *reinterpret_cast<uint4*>(Ks + r * QS + c) = kv;
            *reinterpret_cast<uint4*>(Vs + r * QS + c) = vv;
        }
        __syncthreads();
        // S = Q K^T for this warp's 16 rows x 64 keys.
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        // ldmatrix row addresses: A (Q rows) matrices 0-3 = (rows 0-7, k 0-7), (8-15, 0-7),
        // (0-7, 8-15), (8-15, 8-15); B from K rows: (keys 0-7, k 0-7), (0-7, 8-15), (8-15,
        // 0-7), (8-15, 8-15), i.e. two 8-key n-tiles.
        const int mi = lane >> 3, mr = lane & 7;
        const uint16_t* qa = Qs + (warp * 16 + mr + (mi & 1) * 8) * QS + (mi >> 1) * 8;
        const uint16_t* kb = Ks + (mr + (mi >> 1) * 8) * QS + (mi & 1) * 8;
#pragma unroll 4
        for (int k = 0; k < D; k += 16) {
            uint32_t af[4];
            ldsm_x4(af, qa + k);
#pragma unroll
            for (int np = 0; np < 4; ++np) {
                uint32_t bf[4];
                ldsm_x4(bf, kb + np * 16 * QS + k);
                mma_16<kF16>(s[2 * np], af, bf[0], bf[1]);
                mma_16<kF16>(s[2 * np + 1], af, bf[2], bf[3]);
            }
        }
        // Causal mask (key j visible to token t iff j <= n_past + t), row maxima.
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int64_t j = j0 + n * 8 + qc + e;
                if (j > a.n_past + tok0 || j >= key_end) s[n][e] = -INFINITY;
                if (j > a.n_past + tok1 || j >= key_end) s[n][2 + e] = -INFINITY;
                mx0 = fmaxf(mx0, s[n][e]);
                mx1 = fmaxf(mx1, s[n][2 + e]);
            }
        }
#pragma unroll
        for (int o2 = 1; o2 <= 2; o2 <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o2));
        }
        // Key 0 is visible to every row, so without splits the maxima are finite after the
        // first tile; a later split's row may have seen no key yet (m = -inf, O = l = 0): its
        // exponentials are taken against 0 instead (giving 0 rather than NaN), m stays -inf.
        const float ref0 = mx0 == -INFINITY ? 0.0f : mx0, ref1 = mx1 == -INFINITY ? 0.0f : mx1;
        const float c0 = exp2f(m0 - ref0), c1 = exp2f(m1 - ref1);
        m0 = mx0, m1 = mx1;
        float ps0 = 0.0f, ps1 = 0.0f;
        uint32_t pf[4][4];  // P as A fragments, one per 16-key slice
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const float p0 = exp2f(s[n][0] - ref0), p1 = exp2f(s[n][1] - ref0);
            const float p2 = exp2f(s[n][2] - ref1), p3 = exp2f(s[n][3] - ref1);
            ps0 += p0 + p1;
            ps1 += p2 + p3;
            pf[n / 2][(n & 1) * 2] = pack_16<kF16>(p0, p1);
            pf[n / 2][(n & 1) * 2 + 1] = pack_16<kF16>(p2, p3);
        }
        l0 = l0 * c0 + ps0;
        l1 = l1 * c1 + ps1;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) o[i][0] *= c0, o[i][1] *= c0, o[i][2] *= c1, o[i][3] *= c1;
        // O += P V: B fragments from V rows by ldmatrix.trans: matrices (keys 0-7, dims 0-7),
        // (keys 8-15, dims 0-7), (0-7, 8-15), (8-15, 8-15): two 8-dim n-tiles per load.
        const uint16_t* vb = Vs + (mr + (mi & 1) * 8) * QS + (mi >> 1) * 8;
#pragma unroll
        for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t bf[4];
                ldsm_x4_trans(bf, vb + kt * 16 * QS + dp * 16);
                mma_16<kF16>(o[2 * dp], pf[kt], bf[0], bf[1]);
                mma_16<kF16>(o[2 * dp + 1], pf[kt], bf[2], bf[3]);
            }
        }
    }
    // The row sums over the 4 lanes of a row, then out = O / l.
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o2);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o2);
    }
    if (a.S > 1) {  // this split's (m, l) and unnormalized O, merged by attention_tc_merge_kernel
        const int64_t th0 = tok0 * a.n_head + h0 + r0 % a.group, th1 = tok1 * a.n_head + h0 + r1 % a.group;
        const int sp = int(blockIdx.z);
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            if (tok0 < a.T)
                *reinterpret_cast<float2*>(a.part_o + (th0 * a.S + sp) * D + i * 8 + qc) = make_float2(o[i][0], o[i][1]);
            if (tok1 < a.T)
                *reinterpret_cast<float2*>(a.part_o + (th1 * a.S + sp) * D + i * 8 + qc) = make_float2(o[i][2], o[i][3]);
        }
        if (qc == 0) {
            if (tok0 < a.T) a.part_ml[(th0 * a.S + sp) * 2] = m0, a.part_ml[(th0 * a.S + sp) * 2 + 1] = l0;
            if (tok1 < a.T) a.part_ml[(th1 * a.S + sp) * 2] = m1, a.part_ml[(th1 * a.S + sp) * 2 + 1] = l1;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
        if (tok0 < a.T)
            *reinterpret_cast<float2*>(a.out + (tok0 * a.n_head + h0 + r0 % a.group) * D + i * 8 + qc) =
                make_float2(o[i][0] / l0, o[i][1] / l0);
        if (tok1 < a.T)
            *reinterpret_cast<float2*>(a.out + (tok1 * a.n_head + h0 + r1 % a.group) * D + i * 8 + qc) =
                make_float2(o[i][2] / l1, o[i][3] / l1);
    }
}

// The key splits of one (token, head) row merged in split order: a block per (row, 64 dims),
// a thread per dimension. A split whose keys the row does not see has m = -inf, l = 0, O = 0
// and weighs nothing; split 0 holds key 0, so L > 0. m is in log2 units (q was scaled by
// log2 e).
__global__ void __launch_bounds__(64) attention_tc_merge_kernel(const Args a) {
    detail::pdl_entry();
    const int64_t th = blockIdx.x;
    const int d = blockIdx.y * 64 + threadIdx.x;
    const float* ml = a.part_ml + th * a.S * 2;
    float M = -INFINITY;
    for (int sp = 0; sp < a.S; ++sp)
        if (__ldcg(ml + 2 * sp + 1) > 0.0f) M = fmaxf(M, __ldcg(ml + 2 * sp));
    float L = 0.0f, O = 0.0f;
    const float* po = a.part_o + th * a.S * a.hd + d;
    for (int sp = 0; sp < a.S; ++sp) {
        const float l = __ldcg(ml + 2 * sp + 1);
        if (l == 0.0f) continue;
        const float w = exp2f(__ldcg(ml + 2 * sp) - M);
        L = fmaf(l, w, L);
        O = fmaf(__ldcg(po + int64_t(sp) * a.hd), w, O);
    }
    a.out[th * a.hd + d] = O / L;
}

size_t tc_smem(int D) { return size_t(kTcRows + 2 * kTcKeys) * (D + 8) * 2; }

template <int D, bool kF16>
void launch_tc_t(const Args& a, cudaStream_t st) {
    const size_t smem = tc_smem(D);
    ALLOY_CUDA_CHECK("cuda::attention", cudaFuncSetAttribute(attention_tc_kernel<D, kF16>,
                                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const dim3 grid(unsigned(detail::ceil_div(a.T, kTcRows / a.group)), unsigned(a.n_head_kv), unsigned(a.S));
    detail::launch("cuda::attention", attention_tc_kernel<D, kF16>, dim3(grid), dim3(kTcThreads), smem, st, a);
    if (a.S == 1) return;
    ALLOY_CUDA_LAUNCHED("cuda::attention");
    detail::launch("cuda::attention", attention_tc_merge_kernel, dim3(unsigned(a.T * a.n_head), unsigned(D / 64)), dim3(64),
                   0, st, a);
}
template <int D>
void launch_tc(const Args& a, cudaStream_t st) {
    if (a.tk == GgmlType::F16)
        launch_tc_t<D, true>(a, st);
    else
        launch_tc_t<D, false>(a, st);
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

// The workspace: [kDecodeCounters] split counters of decode calls (T <= kAttnDecodeMaxT) at a
// fixed place in front, zeroed once and left zeroed by every call; then part_o, part_ml; then
// (T > kAttnDecodeMaxT only) that call's counters, zeroed by a memset each call. The decode
// counters must not move with T: a call's partials overwrite whatever lay there, and counters
// laid where an earlier call of another T left its partials were garbage (seen: verification
// calls of 2 tokens after calls of 3 on one workspace gave wrong outputs).
constexpr size_t kDecodeCounters = 4096;  // T * (n_head / G) of a decode call

struct WorkspaceLayout {
    size_t part_o = 0, part_ml = 0, tail = 0, bytes = 0;  // byte offsets; tail: prefill's counters
};
WorkspaceLayout workspace_layout(const ref::AttentionShape& s, int64_t T, const Plan& p) {
    WorkspaceLayout w;
    if (p.S == 1) return w;
    const size_t rows = size_t(T) * s.n_head * p.S;
    w.part_o = kDecodeCounters * 4;
    w.part_ml = w.part_o + (rows * s.head_dim + 63) / 64 * 64 * 4;
    w.tail = w.part_ml + (rows * 2 + 63) / 64 * 64 * 4;
    w.bytes = w.tail + (T > kAttnDecodeMaxT && !use_tensor_cores(s, T) ? size_t(T) * (s.n_head / p.G) * 4 : 0);
    return w;
}

size_t attention_workspace_bytes(const ref::AttentionShape& s, int64_t T, int64_t n_past) {
    check(s, T, n_past, "cuda::attention_workspace_bytes");
    if (T == 0) return 0;
    return workspace_layout(s, T, make_plan(s, T, n_past)).bytes;
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
    cudaStream_t st = detail::as_stream(stream);
    if (p.S > 1) {
        if (!workspace) throw Error(std::string(op) + ": workspace is null");
        const WorkspaceLayout w = workspace_layout(s, T, p);
        char* base = static_cast<char*>(workspace);
        a.part_o = reinterpret_cast<float*>(base + w.part_o);
        a.part_ml = reinterpret_cast<float*>(base + w.part_ml);
        if (T <= kAttnDecodeMaxT) {
            if (size_t(T) * size_t(s.n_head / p.G) > kDecodeCounters)
                throw Error(std::string(op) + ": more than " + std::to_string(kDecodeCounters) + " decode split counters");
            a.done = reinterpret_cast<unsigned*>(base);
        } else if (!use_tensor_cores(s, T)) {  // the tensor-core path merges in a kernel of its own
            a.done = reinterpret_cast<unsigned*>(base + w.tail);
            ALLOY_CUDA_CHECK(op, cudaMemsetAsync(a.done, 0, w.bytes - w.tail, st));
        }
    }
    const dim3 grid(unsigned(T), unsigned(p.S), unsigned(s.n_head / p.G));
    // The decode step size is fixed (not chosen by G) so a token's arithmetic never depends on
    // the call's other tokens.
    if (use_tensor_cores(s, T)) {
        switch (s.head_dim) {
            case 64: launch_tc<64>(a, st); break;
            case 128: launch_tc<128>(a, st); break;
            default: launch_tc<256>(a, st); break;
        }
    } else if (use_dec16(s, T)) {
        DecArgs d{q, k_cache, v_cache, out, a.part_o, a.part_ml, T, n_past, s.n_head, s.n_head_kv,
                  s.n_head / s.n_head_kv, p.G, p.S, s.scale, s.type_k == GgmlType::BF16, s.type_v == GgmlType::BF16};
        switch (s.head_dim) {
            case 64: launch_dec16<2>(d, st, op); break;
            case 128: launch_dec16<4>(d, st, op); break;
            default: launch_dec16<8>(d, st, op); break;
        }
        return;
    } else if (T <= kAttnDecodeMaxT) {
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

bool attention_decode_supported(const ref::AttentionShape& s, int64_t T) {
    return T >= 1 && use_dec16(s, T) && s.head_dim % 64 == 0 && s.head_dim <= 256 && s.n_head_kv > 0 &&
           s.n_head % s.n_head_kv == 0;
}

// The layout of attention()'s, at the most splits a token can have (kDecSplits).
size_t attention_decode_workspace_bytes(const ref::AttentionShape& s, int64_t T) {
    if (!attention_decode_supported(s, T)) throw Error("cuda::attention_decode_workspace_bytes: shape or T not supported");
    Plan p;
    p.S = kDecSplits;
    return workspace_layout(s, T, p).bytes;
}

void attention_decode(const ref::AttentionShape& s, const float* q, const void* const* k_caches,
                      const void* const* v_caches, const int32_t* slot, const int32_t* pos, float* out, int64_t T,
                      void* workspace, void* stream) {
    const char* op = "cuda::attention_decode";
    check(s, T, 0, op);
    if (!attention_decode_supported(s, T))
        throw Error(std::string(op) + ": needs f16 or bf16 K and V caches and 1 <= T <= " + std::to_string(kAttnDecodeMaxT));
    if (!q || !k_caches || !v_caches || !slot || !pos || !out || !workspace)
        throw Error(std::string(op) + ": a null device array");
    Plan p;
    p.S = kDecSplits;
    const WorkspaceLayout w = workspace_layout(s, T, p);
    char* base = static_cast<char*>(workspace);
    const int group = s.n_head / s.n_head_kv;
    DecArgs d{q, nullptr, nullptr, out, reinterpret_cast<float*>(base + w.part_o), reinterpret_cast<float*>(base + w.part_ml),
              T, 0, s.n_head, s.n_head_kv, group, dec_heads(group), p.S, s.scale, s.type_k == GgmlType::BF16,
              s.type_v == GgmlType::BF16};
    d.pos = pos;
    d.slot = slot;
    d.k_tab = k_caches;
    d.v_tab = v_caches;
    cudaStream_t st = detail::as_stream(stream);
    switch (s.head_dim) {
        case 64: launch_dec16<2>(d, st, op); break;
        case 128: launch_dec16<4>(d, st, op); break;
        default: launch_dec16<8>(d, st, op); break;
    }
}

}  // namespace alloy::cuda
