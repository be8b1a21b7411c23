// Causal GQA attention on CUDA (kernels/cuda/ops.h; math as ref::attention: query head h
// reads KV head h / (n_head / n_head_kv), token t sits at n_past + t and attends to cache
// rows [0, n_past + t], scores scaled by s.scale, softmax over them).
//
// First version: fp32 CUDA-core arithmetic, flash-style (online softmax, the score row never
// stored). A block of 4 warps takes one token, one KV head and G (1, 2 or 4) of the query
// heads that share it, over one split of the keys: each warp walks keys warp, warp + 4, ...,
// loads the key and value rows once (lane l holds head_dim / 32 contiguous elements, one 16-
// byte load for a bf16 row of 256) and updates G running softmaxes, so a K/V row fetched from
// L2 serves the whole group. The 4 warps' (max, sum, output) merge in shared memory; with
// several splits per token the partial (max, sum, output) go to the workspace and a second
// kernel merges them in split order.
//
// Split-K: decode (T <= kAttnDecodeMaxT) cuts the keys into fixed chunks of kAttnDecodeChunk
// so a token's arithmetic depends only on its own key count (verification = decode, bit for
// bit); prefill uses as many splits as fill the device twice over (usually 1: no merge).
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

struct Args {
    const float* q;  // [T, n_head, hd]
    const void* k;   // [n_ctx, n_head_kv, hd] of tk
    const void* v;   // [n_ctx, n_head_kv, hd] of tv
    float* out;      // [T, n_head, hd]
    float* part_o;   // [T, n_head, S, hd]  (S > 1 only)
    float* part_ml;  // [T, n_head, S, 2]   running max, sum
    int64_t T, n_past, chunk;
    int n_head, n_head_kv, hd, group, S;
    float scale;
    GgmlType tk, tv;
};

struct Plan {
    int64_t chunk = 0;
    int S = 1;
    int G = 1;
};

int heads_per_block(int group) { return group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1; }

Plan make_plan(const ref::AttentionShape& s, int64_t T, int64_t n_past) {
    Plan p;
    p.G = heads_per_block(s.n_head / s.n_head_kv);
    const int64_t max_keys = n_past + T;
    if (T <= kAttnDecodeMaxT) {
        p.chunk = kAttnDecodeChunk;
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
template <int EPL, int G>
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
    const int64_t j0 = int64_t(split) * a.chunk;
    if (j0 >= n_keys) return;  // this token has fewer splits; the merge reads only its own
    const int64_t j1 = min(j0 + a.chunk, n_keys);

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
    for (int64_t j = j0 + warp; j < j1; j += kWarps) {
        float kf[EPL], vf[EPL];
        load_row<EPL>(a.k, a.tk, j * kv_stride + col, kf);
        load_row<EPL>(a.v, a.tv, j * kv_stride + col, vf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; ++e) dot = fmaf(q[g][e], kf[e], dot);
            const float sc = detail::warp_sum_all(dot);
            const float m_new = fmaxf(m[g], sc);
            const float corr = expf(m[g] - m_new);  // 0 on the first key (m = -inf)
            const float p = expf(sc - m_new);
            l[g] = fmaf(l[g], corr, p);
#pragma unroll
            for (int e = 0; e < EPL; ++e) acc[g][e] = fmaf(acc[g][e], corr, p * vf[e]);
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
}

// One block per (token, query head), a thread per output element: the token's splits merged
// in split order.
__global__ void merge_kernel(const Args a) {
    const int64_t th = blockIdx.x;
    const int64_t t = th / a.n_head;
    const int ns = int((a.n_past + t + 1 + a.chunk - 1) / a.chunk);
    const float* ml = a.part_ml + th * a.S * 2;
    float M = ml[0];
    for (int s = 1; s < ns; ++s) M = fmaxf(M, ml[2 * s]);
    for (int d = threadIdx.x; d < a.hd; d += blockDim.x) {
        float L = 0.0f, O = 0.0f;
        for (int s = 0; s < ns; ++s) {
            const float c = expf(ml[2 * s] - M);
            L = fmaf(ml[2 * s + 1], c, L);
            O = fmaf(a.part_o[(th * a.S + s) * a.hd + d], c, O);
        }
        a.out[th * a.hd + d] = O / L;
    }
}

template <int EPL>
void launch_epl(const Args& a, int G, dim3 grid, cudaStream_t st) {
    switch (G) {
        case 4: attention_kernel<EPL, 4><<<grid, kThreads, 0, st>>>(a); break;
        case 2: attention_kernel<EPL, 2><<<grid, kThreads, 0, st>>>(a); break;
        default: attention_kernel<EPL, 1><<<grid, kThreads, 0, st>>>(a); break;
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
    return (rows * s.head_dim + 63) / 64 * 64 * 4 + rows * 2 * 4;
}

void attention(const ref::AttentionShape& s, const float* q, const void* k_cache, const void* v_cache, float* out,
               int64_t T, int64_t n_past, void* workspace, void* stream) {
    const char* op = "cuda::attention";
    check(s, T, n_past, op);
    if (T == 0) return;
    const Plan p = make_plan(s, T, n_past);
    if (p.S > 65535) throw Error(std::string(op) + ": too many key splits (context too long)");
    Args a{q, k_cache, v_cache, out, nullptr, nullptr, T, n_past, p.chunk,
           s.n_head, s.n_head_kv, s.head_dim, s.n_head / s.n_head_kv, p.S, s.scale, s.type_k, s.type_v};
    if (p.S > 1) {
        if (!workspace) throw Error(std::string(op) + ": workspace is null");
        const size_t rows = size_t(T) * s.n_head * p.S;
        a.part_o = static_cast<float*>(workspace);
        a.part_ml = a.part_o + (rows * s.head_dim + 63) / 64 * 64;
    }
    cudaStream_t st = detail::as_stream(stream);
    const dim3 grid(unsigned(T), unsigned(p.S), unsigned(s.n_head / p.G));
    switch (s.head_dim) {
        case 64: launch_epl<2>(a, p.G, grid, st); break;
        case 128: launch_epl<4>(a, p.G, grid, st); break;
        default: launch_epl<8>(a, p.G, grid, st); break;
    }
    ALLOY_CUDA_LAUNCHED(op);
    if (p.S > 1) {
        merge_kernel<<<unsigned(T * s.n_head), std::min(256, s.head_dim), 0, st>>>(a);
        ALLOY_CUDA_LAUNCHED(op);
    }
}

}  // namespace alloy::cuda
