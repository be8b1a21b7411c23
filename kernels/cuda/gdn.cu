// Gated DeltaNet on CUDA (kernels/cuda/gdn.h): the serial delta rule (decode, verification),
// alone or inside the fused layer op, which runs either as one kernel (fused_serial_kernel:
// conv + SiLU, the q/k L2 norms and the gates, the delta rule, the gated RMSNorm, a cluster
// per key head) or as three (conv + SiLU; the delta rule with the norms and gates; the gated
// RMSNorm), the launch gate picking by batch size (gdn_fused). The fused op's chunked mode
// (prefill): conv + SiLU, norms, gates and bf16 rounding with tokens in parallel
// (chunked_prep_kernel), the new conv state, gdn_delta_chunked (gdn_chunked.cu), the gated
// RMSNorm.
//
// Serial delta rule. Math: spec/GDN.md section 1, in
// the state layout of kernels/ref/gdn.h ([seq, H_v, d_v, d_k]: value column j of a head is
// d_k contiguous floats). Per token and column j:
//   sk = S_j . k, sq = S_j . q
//   delta_j = beta (v_j - alpha sk)
//   o_j = alpha sq + delta_j (k . q)
//   S_j' = alpha S_j + delta_j k
// A warp owns kColsPerWarp columns of one (sequence, head): each lane holds d_k / 32 elements
// of each (in float4 runs when d_k % 4 == 0, else strided), for every token of the sequence, so the state
// moves between HBM and registers once per call. Dot products reduce down the warp in a fixed
// tree and lane 0's sum is broadcast, so every lane updates with the same delta and the bits
// never depend on the call's token count.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "alloy/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/ref/gdn_common.h"

namespace alloy::cuda {

namespace {

constexpr int kMaxDk = 256;               // 8 elements per lane
constexpr int kElems = kMaxDk / 32;
constexpr int kWarps = 4;                 // per block
// Columns per warp. 4 (more bytes in flight per warp) measured slower at B = 32 on the H200
// (H_v 16/32/48: 18.2/48.9/71.8 us against 16.9/47.0/67.9) and gives B = 1 half the blocks.
constexpr int kColsPerWarp = 2;
// The delta-rule kernel takes 4 columns per warp from this many (sequence, head) pairs on.
constexpr int kWideHeads = 128;
#ifndef ALLOY_GDN_DELTA_MINB
#define ALLOY_GDN_DELTA_MINB 8
#endif

// Sum over the warp, in a fixed tree, in every lane: an xor butterfly, whose lane 0 adds in the
// order of a shfl_down tree ((x0 + x16) + (x8 + x24)) + ...; every other lane adds the same pairs
// with the operands swapped, which IEEE addition does not notice, so all lanes hold lane 0's
// bits without a broadcast (5 shuffles, not 6).
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Rows live in registers as kElems values per lane: strided (lane + 32 e: any d_k), or in
// float4 runs (128 (e / 4) + 4 lane + e % 4 when d_k % 4 == 0: each lane moves 16 bytes per
// access, so a warp reads a 512-byte state column in one instruction).

// kElems values of a d_k-long row into registers (zero past d_k).
// kCs: the state's streaming form (ld/st.global.cs: evict first), for batches whose states
// outgrow L2 (launch_delta's gate).
template <bool kVec, int N, bool kCs = false>
__device__ __forceinline__ void load_row(const float* __restrict__ p, int d_k, int lane, float (&x)[N]) {
    if constexpr (kVec) {
#pragma unroll
        for (int e4 = 0; e4 < N / 4; ++e4) {
            const int i = 128 * e4 + 4 * lane;
            const float4 f = i < d_k ? (kCs ? __ldcs(reinterpret_cast<const float4*>(p + i)) : *reinterpret_cast<const float4*>(p + i))
                                     : make_float4(0, 0, 0, 0);
            x[4 * e4] = f.x, x[4 * e4 + 1] = f.y, x[4 * e4 + 2] = f.z, x[4 * e4 + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const int i = lane + 32 * e;
            x[e] = i < d_k ? p[i] : 0.0f;
        }
    }
}

template <bool kVec, int N, bool kCs = false>
__device__ __forceinline__ void store_row(float* __restrict__ p, int d_k, int lane, const float (&x)[N]) {
    if constexpr (kVec) {
#pragma unroll
        for (int e4 = 0; e4 < N / 4; ++e4) {
            const int i = 128 * e4 + 4 * lane;
            const float4 f = make_float4(x[4 * e4], x[4 * e4 + 1], x[4 * e4 + 2], x[4 * e4 + 3]);
            if (i < d_k) {
                if constexpr (kCs) __stcs(reinterpret_cast<float4*>(p + i), f);
                else *reinterpret_cast<float4*>(p + i) = f;
            }
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const int i = lane + 32 * e;
            if (i < d_k) p[i] = x[e];
        }
    }
}

// Inputs of the delta-rule kernel. q, k: token rows qk_stride floats apart, key head kh at
// kh * d_k; v: rows v_stride apart, value head h at h * d_v. Plain (kPrep false): q and k are
// normalised already and g (log decay) and beta are given per (token, value head). Fused
// (kPrep true): q and k come straight from the conv output and are L2-normalised (HF's
// x / sqrt(sum x^2 + eps)) and q scaled by q_scale here, and g = ssm_a softplus(a + dt_bias),
// beta = sigmoid(b) are computed here from the raw a, b.
struct DeltaArgs {
    ref::GdnShape sh;
    const int32_t* offs;
    const float *q, *k, *v;
    int64_t qk_stride, v_stride;
    const float *g, *beta;                      // plain
    const float *a, *b, *ssm_a, *dt_bias;       // fused
    float eps, q_scale;
    float* state;
    float* out;                                 // [T, H_v, d_v]
    const int32_t* slots;                       // [n_seqs] state slot of each sequence (nullptr: slot = sequence)
};

__device__ __forceinline__ float sigmoidf_(float x) {  // never exponentiates a large positive number
    return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The fused paths' arithmetic after a token's reductions, with every rounding spelled out
// (__f*_rn: the compiler may not pick which product of a*b + c*d to fuse), so the split kernel
// and delta_tokens<kPrep> agree bit for bit.
struct PrepScale {
    float ik, iq, kq;  // 1 / |k|, q_scale / |q|, (k . q) ik iq
};
__device__ __forceinline__ PrepScale prep_scale(float kk, float qq, float kq_raw, float eps, float q_scale) {
    PrepScale p;
    p.ik = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(kk, eps)));
    p.iq = __fmul_rn(__fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(qq, eps))), q_scale);
    p.kq = __fmul_rn(__fmul_rn(kq_raw, p.ik), p.iq);
    return p;
}
// delta_j = beta (v_j - alpha (S_j . k_raw) ik)
__device__ __forceinline__ float prep_delta(float b, float v, float alpha, float skr, const PrepScale& p) {
    return __fmul_rn(b, __fmaf_rn(-alpha, __fmul_rn(skr, p.ik), v));
}
// o_j = alpha (S_j . q_raw) iq + delta_j (k . q)
__device__ __forceinline__ float prep_out(float alpha, float sqr, float delta, const PrepScale& p) {
    return __fmaf_rn(delta, p.kq, __fmul_rn(alpha, __fmul_rn(sqr, p.iq)));
}

// The tokens [t0, t1) of one (sequence, head) on a warp's kC columns j0.. held in s: the
// delta rule's arithmetic (whatever kC, each column rounds the same). kE: row elements per lane (d_k <= 32 kE: 4 for d_k <= 128, so no registers and FMAs go
// to the zero padding of d_k 256's 8).
template <bool kVec, bool kPrep, int kE, int kC>
__device__ __forceinline__ void delta_tokens(float (&s)[kC][kE], int j0, int h, int kh, int t0, int t1, int lane,
                                             const ref::GdnShape& sh, const float* __restrict__ Aq,
                                             const float* __restrict__ Ak, const float* __restrict__ Av, int qk_stride,
                                             int v_stride, const float* __restrict__ Ag, const float* __restrict__ Abeta,
                                             const float* __restrict__ Aa, const float* __restrict__ Ab,
                                             const float* __restrict__ ssm_a, const float* __restrict__ dt_bias, float eps,
                                             float q_scale, float* __restrict__ out) {
    const int d_k = sh.d_k, d_v = sh.d_v, H_v = sh.H_v;
    for (int t = t0; t < t1; ++t) {
        const float* qt = Aq + (size_t)t * qk_stride + (size_t)kh * d_k;
        const float* kt = Ak + (size_t)t * qk_stride + (size_t)kh * d_k;
        const float* vt = Av + (size_t)t * v_stride + (size_t)h * d_v;
        float kv[kE], qv[kE], kq = 0.0f;
        load_row<kVec, kE>(kt, d_k, lane, kv);
        load_row<kVec, kE>(qt, d_k, lane, qv);
        float vj[kC];
#pragma unroll
        for (int c = 0; c < kC; ++c) vj[c] = j0 + c < d_v ? vt[j0 + c] : 0.0f;
        const size_t th = (size_t)t * H_v + h;
        const float graw = kPrep ? Aa[th] : Ag[th], braw = kPrep ? Ab[th] : Abeta[th];
        if constexpr (kPrep) {
            // The norms folded in after the reductions, so all five dot products of a token
            // (k.k, q.q, k.q, S_j.k, S_j.q on the raw conv output) reduce at once instead of
            // three in a row: ik = 1 / sqrt(k.k + eps), iq = q_scale / sqrt(q.q + eps); the split
            // kernel rounds the same way (fused_split_kernel).
            float kk = 0.0f, qq = 0.0f;
#pragma unroll
            for (int e = 0; e < kE; ++e) {
                kk += kv[e] * kv[e];
                qq += qv[e] * qv[e];
                kq += kv[e] * qv[e];
            }
            float skr[kC], sqr[kC];
#pragma unroll
            for (int c = 0; c < kC; ++c) {
                float sk = 0.0f, sq = 0.0f;
#pragma unroll
                for (int e = 0; e < kE; ++e) {
                    sk += s[c][e] * kv[e];
                    sq += s[c][e] * qv[e];
                }
                skr[c] = warp_sum(sk);
                sqr[c] = warp_sum(sq);
            }
            kk = warp_sum(kk), qq = warp_sum(qq), kq = warp_sum(kq);
            const float alpha = expf(ssm_a[h] * softplusf_(graw + dt_bias[h])), b = sigmoidf_(braw);
            const PrepScale ps = prep_scale(kk, qq, kq, eps, q_scale);
#pragma unroll
            for (int e = 0; e < kE; ++e) kv[e] = __fmul_rn(kv[e], ps.ik);
#pragma unroll
            for (int c = 0; c < kC; ++c) {
                const int j = j0 + c;
                if (j >= d_v) break;
                const float delta = prep_delta(b, vj[c], alpha, skr[c], ps);
                if (lane == 0) out[((size_t)t * H_v + h) * d_v + j] = prep_out(alpha, sqr[c], delta, ps);
#pragma unroll
                for (int e = 0; e < kE; ++e) s[c][e] = __fmaf_rn(delta, kv[e], __fmul_rn(alpha, s[c][e]));
            }
            continue;
        }
#pragma unroll
        for (int e = 0; e < kE; ++e) kq += kv[e] * qv[e];
        kq = warp_sum(kq);
        const float alpha = expf(graw), b = braw;
#pragma unroll
        for (int c = 0; c < kC; ++c) {
            const int j = j0 + c;
            if (j >= d_v) break;
            float sk = 0.0f, sq = 0.0f;
#pragma unroll
            for (int e = 0; e < kE; ++e) {
                sk += s[c][e] * kv[e];
                sq += s[c][e] * qv[e];
            }
            sk = warp_sum(sk);
            sq = warp_sum(sq);
            const float delta = b * (vj[c] - alpha * sk);
            if (lane == 0) out[((size_t)t * H_v + h) * d_v + j] = alpha * sq + delta * kq;
#pragma unroll
            for (int e = 0; e < kE; ++e) s[c][e] = alpha * s[c][e] + delta * kv[e];
        }
    }
}

#define DELTA_PARAMS                                                                                                  \
    ref::GdnShape sh, const int32_t *__restrict__ offs, const float *__restrict__ Aq, const float *__restrict__ Ak,   \
        const float *__restrict__ Av, int qk_stride, int v_stride, const float *__restrict__ Ag,                      \
        const float *__restrict__ Abeta, const float *__restrict__ Aa, const float *__restrict__ Ab,                  \
        const float *__restrict__ ssm_a, const float *__restrict__ dt_bias, float eps, float q_scale,                 \
        float *__restrict__ state, float *__restrict__ out, const int32_t *__restrict__ slots
#define DELTA_INPUTS sh, Aq, Ak, Av, qk_stride, v_stride, Ag, Abeta, Aa, Ab, ssm_a, dt_bias, eps, q_scale, out

// One wave: a warp per kC columns of a (sequence, head) (the grid's x: column blocks, y: head,
// z: sequence); the small-batch path.
template <bool kVec, bool kPrep, int kE, int kC, bool kCs = false>
__global__ void __launch_bounds__(kWarps * 32, kC == 4 ? ALLOY_GDN_DELTA_MINB : 1) delta_serial_kernel(DELTA_PARAMS) {
    detail::pdl_entry();
    const int seq = blockIdx.z, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = (blockIdx.x * kWarps + warp) * kC;
    const int d_k = sh.d_k, d_v = sh.d_v, H_v = sh.H_v;
    if (j0 >= d_v) return;
    const int kh = sh.tiled ? h % sh.H_k : h / (H_v / sh.H_k);  // ref::GdnShape::key_head (host-only)
    const int slot = slots ? slots[seq] : seq;
    float* S = state + ((size_t)slot * H_v + h) * d_v * d_k;

    // The state columns before the sequence's offsets: the offsets' load latency then overlaps
    // the long pole instead of preceding it (an empty sequence only reads its state).
    float s[kC][kE];
#pragma unroll
    for (int c = 0; c < kC; ++c) {
        if (j0 + c < d_v) load_row<kVec, kE, kCs>(S + (size_t)(j0 + c) * d_k, d_k, lane, s[c]);
        else
#pragma unroll
            for (int e = 0; e < kE; ++e) s[c][e] = 0.0f;
    }
    const int t0 = offs[seq], t1 = offs[seq + 1];
    if (t0 == t1) return;
    delta_tokens<kVec, kPrep, kE, kC>(s, j0, h, kh, t0, t1, lane, DELTA_INPUTS);
#pragma unroll
    for (int c = 0; c < kC; ++c)
        if (j0 + c < d_v) store_row<kVec, kE, kCs>(S + (size_t)(j0 + c) * d_k, d_k, lane, s[c]);
}

// ---- fused layer op (serial), in three launches: conv + SiLU, the delta rule with norms and
// gates, the gated RMSNorm (the large-batch path: their blocks are short and overlap) ----

constexpr int kMaxConvK = 8;

// One token of a channel's causal conv + SiLU: u = silu(sum over taps of w * input), taps oldest
// first as the reference sums them (the window win[0..Km1), then the token's own input x), and
// the window slides by one. Compile-time indices only, so win and wt stay in registers. Shared
// by the three-launch path (conv_silu_kernel) and the chunked mode (chunked_prep_kernel). N:
// taps held (K <= N); the arithmetic does not depend on it. kFast: SiLU as x / (1 + e^-x) with
// the fast exponential and division (~2 ulp), for the chunked mode, which rounds the result to
// bf16 (8 bits) next; the serial paths keep sigmoidf_'s exact-as-ref arithmetic.
template <int N, bool kFast = false>
__device__ __forceinline__ float conv_silu_token(const float (&wt)[N], float (&win)[N], float x, int Km1) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < N - 1; ++i)
        if (i < Km1) acc += wt[i] * win[i];
#pragma unroll
    for (int i = 0; i < N; ++i)
        if (i == Km1) acc += wt[i] * x;
#pragma unroll
    for (int i = 0; i < N - 1; ++i) {
        if (i + 1 < Km1) win[i] = win[i + 1];
        else if (i + 1 == Km1) win[i] = x;
    }
    if constexpr (kFast) return __fdividef(acc, 1.0f + __expf(-acc));  // -> 0 for acc << 0: e^-acc = inf
    return acc * sigmoidf_(acc);
}

// Causal depthwise conv1d + SiLU of every channel of one sequence (a thread per channel, its
// tokens in order); the last K-1 inputs become the new conv state.
__global__ void conv_silu_kernel(const int32_t* __restrict__ offs, const float* __restrict__ qkv, int conv_dim, int K,
                                 const float* __restrict__ w, float* __restrict__ conv_state, float* __restrict__ u,
                                 const int32_t* __restrict__ slots) {
    detail::pdl_entry();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, seq = blockIdx.y;
    if (c >= conv_dim) return;
    const int t0 = offs[seq], t1 = offs[seq + 1];
    if (t0 == t1) return;
    const int Km1 = K - 1;
    float* hist = conv_state + ((size_t)(slots ? slots[seq] : seq) * conv_dim + c) * Km1;
    float win[kMaxConvK], wt[kMaxConvK];
#pragma unroll
    for (int i = 0; i < kMaxConvK; ++i) {
        win[i] = i < Km1 ? hist[i] : 0.0f;
        wt[i] = i < K ? w[(size_t)c * K + i] : 0.0f;
    }
    for (int t = t0; t < t1; ++t) u[(size_t)t * conv_dim + c] = conv_silu_token(wt, win, qkv[(size_t)t * conv_dim + c], Km1);
#pragma unroll
    for (int i = 0; i < kMaxConvK - 1; ++i)
        if (i < Km1) hist[i] = win[i];
}

// o as fp32: the serial delta rule's fp32 rows, or the chunked kernel's bf16 ones (raw bits).
__device__ __forceinline__ float o_value(float x) { return x; }
__device__ __forceinline__ float o_value(uint16_t x) { return __uint_as_float(uint32_t(x) << 16); }

// y = o * rsqrt(mean(o^2) + eps) * norm * silu(z) per (token, value head): a warp per pair,
// only for tokens of the call ([offs[0], offs[n_seqs])). OT: float or bf16 bits (uint16_t).
// Lane l holds columns l + 32 e. kJ > 0: d_v = 32 kJ, the loop unrolled so that every load of
// the row is in flight at once (a runtime-length loop issued them one round trip at a time);
// kJ = 0: any d_v. The sums run in the same order either way (same bits). yb: y also in bf16
// (nullptr: not).
template <typename OT, int kJ>
__global__ void gated_norm_kernel(const int32_t* __restrict__ offs, int n_seqs, int n_tokens, int H_v, int d_v,
                                  const OT* __restrict__ o, const float* __restrict__ z,
                                  const float* __restrict__ norm, float eps, float* __restrict__ y,
                                  __nv_bfloat16* __restrict__ yb) {
    detail::pdl_entry();
    const int lane = threadIdx.x & 31;
    const int64_t pair = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (pair >= int64_t(n_tokens) * H_v) return;
    const int t = int(pair / H_v);
    if (t < offs[0] || t >= offs[n_seqs]) return;
    const size_t row = size_t(pair) * d_v;
    if constexpr (kJ > 0) {
        float ov[kJ], zv[kJ], nv[kJ];
#pragma unroll
        for (int e = 0; e < kJ; ++e) {
            ov[e] = o_value(o[row + lane + 32 * e]);
            zv[e] = z[row + lane + 32 * e];
            nv[e] = norm[lane + 32 * e];
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < kJ; ++e) ss += ov[e] * ov[e];
        const float inv = 1.0f / sqrtf(warp_sum(ss) / float(d_v) + eps);
#pragma unroll
        for (int e = 0; e < kJ; ++e) {
            const float v = ov[e] * inv * nv[e] * (zv[e] * sigmoidf_(zv[e]));
            y[row + lane + 32 * e] = v;
            if (yb) yb[row + lane + 32 * e] = __float2bfloat16_rn(v);
        }
    } else {
        float ss = 0.0f;
        for (int j = lane; j < d_v; j += 32) {
            const float oj = o_value(o[row + j]);
            ss += oj * oj;
        }
        const float inv = 1.0f / sqrtf(warp_sum(ss) / float(d_v) + eps);
        for (int j = lane; j < d_v; j += 32) {
            const float zz = z[row + j];
            const float v = o_value(o[row + j]) * inv * norm[j] * (zz * sigmoidf_(zz));
            y[row + j] = v;
            if (yb) yb[row + j] = __float2bfloat16_rn(v);
        }
    }
}

// The gated RMSNorm over the call's rows (unrolled for d_v = 128).
template <typename OT>
void launch_gated_norm(const int32_t* offs, int n_seqs, int n_tokens, int H_v, int d_v, const OT* o, const float* z,
                       const float* norm, float eps, float* y, uint16_t* yb, cudaStream_t st) {
    const int64_t pairs = int64_t(n_tokens) * H_v;
    const unsigned grid = unsigned((pairs + kWarps - 1) / kWarps);
    auto* ybf = reinterpret_cast<__nv_bfloat16*>(yb);
    if (d_v == 128) detail::launch("cuda::gdn_fused", gated_norm_kernel<OT, 4>, dim3(grid), dim3(kWarps * 32), 0, st, offs, n_seqs, n_tokens, H_v, d_v, o, z, norm, eps, y, ybf);
    else detail::launch("cuda::gdn_fused", gated_norm_kernel<OT, 0>, dim3(grid), dim3(kWarps * 32), 0, st, offs, n_seqs, n_tokens, H_v, d_v, o, z, norm, eps, y, ybf);
}

// yb = y in bf16 for the call's rows [offs[0], offs[n_seqs]) of width n (the one-launch paths,
// whose kernels write fp32 only: the copy for a caller that asked for y_bf16).
__global__ void rows_to_bf16_kernel(const int32_t* __restrict__ offs, int n_seqs, int64_t n, const float* __restrict__ y,
                                    __nv_bfloat16* __restrict__ yb) {
    detail::pdl_entry();
    const int64_t lo = int64_t(offs[0]) * n, hi = int64_t(offs[n_seqs]) * n;
    for (int64_t i = lo + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x)
        yb[i] = __float2bfloat16_rn(y[i]);
}

// ---- fused layer op, chunked mode (prefill, d_k = d_v = 128): conv + SiLU, the q/k norms,
// the gates and the bf16 rounding in one kernel with tokens in parallel; the new conv state;
// gdn_delta_chunked; the gated RMSNorm (gated_norm_kernel<uint16_t>) ----

constexpr int kPrepD = 128;    // channels per head (d_k = d_v)
constexpr int kPrepWarpTok = 16;                   // tokens per warp
constexpr int kPrepTok = 4 * kPrepWarpTok;          // tokens per block (4 warps)

struct PrepArgs {
    const int32_t* offs;
    int n_seqs, H_k, H_v, conv_dim, K;
    const float *qkv, *conv_w, *a, *b, *ssm_a, *dt_bias;
    const float* conv_state;   // read only: the new state is written by conv_state_kernel after
    const int32_t* slots;
    float eps, q_scale;
    uint16_t *q, *k, *v;       // bf16 [n_tokens, H_k, 128], [n_tokens, H_k, 128], [n_tokens, H_v, 128]
    float *g, *beta;           // [n_tokens, H_v]: log decay ssm_a softplus(a + dt_bias), sigmoid(b)
};

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // round to nearest even
    return *reinterpret_cast<const uint32_t*>(&v);
}

// A block per (head of 128 conv channels, tile of kPrepTok tokens of the call): the grid's x is
// q head kh (< H_k), k head (H_k + kh) or v head (2 H_k + h). Warp w takes kPrepWarpTok tokens
// of the tile, lane l the channels 4 l .. 4 l + 3 (16-byte loads of qkv). Each lane runs its
// channels' conv over the warp's tokens: the window from the inputs before them, or from the
// sequence's conv state for tokens within K-1 of the sequence's start (a warp's tokens may span
// sequences). q/k: the warp holds each token's 128 values, L2-normalises them (x / sqrt(sum x^2
// + eps), q also * q_scale) and stores bf16; v: bf16, and the gates of value head h for the
// warp's tokens. Tokens outside [offs[0], offs[n_seqs]) are neither read as data nor written.
// The conv state is only read. kK: conv taps held (K <= kK).
// H200, H_v 16, T 4096 (ncu): 156 us for ~150 MB (DRAM 18%, SM 46%; a first version, a thread
// per channel with 4-byte loads and the norms through shared memory: 165 us). Neither ceiling
// is near; the lead is the instruction count per element. Since then: K = 4 at compile time and
// the fast SiLU (kFast; 0.8B BF16 prefill at 512-token steps +8-10%, bench/RESULTS.md).
template <int kK, bool kFast>
__global__ void __launch_bounds__(128, 4) chunked_prep_kernel(const PrepArgs A) {
    detail::pdl_entry();
    const int role = blockIdx.x, lane = threadIdx.x & 31;
    const int tw = blockIdx.y * kPrepTok + (threadIdx.x >> 5) * kPrepWarpTok;  // the warp's first token
    const int lo = max(tw, A.offs[0]), hi = min(tw + kPrepWarpTok, A.offs[A.n_seqs]);
    if (lo >= hi) return;
    const int key_dim = A.H_k * kPrepD;
    const int kind = role < A.H_k ? 0 : role < 2 * A.H_k ? 1 : 2;  // q, k, v
    const int head = kind == 0 ? role : kind == 1 ? role - A.H_k : role - 2 * A.H_k;
    const int gc = (kind == 0 ? head * kPrepD : kind == 1 ? key_dim + head * kPrepD : 2 * key_dim + head * kPrepD) + 4 * lane;
    const int conv_dim = A.conv_dim, K = A.K, Km1 = K - 1;
    // The tokens' inputs first (independent 16-byte loads in flight).
    float4 xs[kPrepWarpTok];
    const float* col = A.qkv + gc;
#pragma unroll
    for (int i = 0; i < kPrepWarpTok; ++i)
        xs[i] = tw + i >= lo && tw + i < hi ? *reinterpret_cast<const float4*>(col + size_t(tw + i) * conv_dim)
                                            : make_float4(0, 0, 0, 0);
    // The sequence of token lo: the largest s < n_seqs with offs[s] <= lo (skips empty ones).
    int s = 0;
    {
        int l = 0, r = A.n_seqs - 1;
        while (l < r) {
            const int mid = (l + r + 1) >> 1;
            if (A.offs[mid] <= lo) l = mid;
            else r = mid - 1;
        }
        s = l;
    }
    const int t0 = A.offs[s];
    int t1 = A.offs[s + 1];
    float wt[4][kK], win[4][kK];
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
        for (int i = 0; i < kK; ++i) wt[c][i] = i < K ? A.conv_w[size_t(gc + c) * K + i] : 0.0f;
    {
        const float* hist = A.conv_state + (size_t(A.slots ? A.slots[s] : s) * conv_dim + gc) * Km1;  // 4 channels
#pragma unroll
        for (int i = 0; i < kK; ++i) {
            const int tau = lo - Km1 + i;  // >= t0 - Km1
            float4 x = make_float4(0, 0, 0, 0);
            if (i < Km1) {
                if (tau >= t0) {
                    x = *reinterpret_cast<const float4*>(col + size_t(tau) * conv_dim);
                } else {
                    const int j = Km1 + tau - t0;
                    x = make_float4(hist[j], hist[Km1 + j], hist[2 * Km1 + j], hist[3 * Km1 + j]);
                }
            }
            win[0][i] = x.x, win[1][i] = x.y, win[2][i] = x.z, win[3][i] = x.w;
        }
    }
    uint16_t* out = kind == 0 ? A.q : kind == 1 ? A.k : A.v;
    const int heads = kind == 2 ? A.H_v : A.H_k;
#pragma unroll
    for (int i = 0; i < kPrepWarpTok; ++i) {
        const int t = tw + i;
        if (t < lo || t >= hi) continue;
        if (t == t1) {  // the next non-empty sequence starts here: its window is its conv state
            do ++s;
            while (A.offs[s + 1] <= t);
            t1 = A.offs[s + 1];
            const float* hist = A.conv_state + (size_t(A.slots ? A.slots[s] : s) * conv_dim + gc) * Km1;
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
                for (int j = 0; j < kK; ++j) win[c][j] = j < Km1 ? hist[c * Km1 + j] : 0.0f;
        }
        float u[4] = {conv_silu_token<kK, kFast>(wt[0], win[0], xs[i].x, Km1), conv_silu_token<kK, kFast>(wt[1], win[1], xs[i].y, Km1),
                      conv_silu_token<kK, kFast>(wt[2], win[2], xs[i].z, Km1), conv_silu_token<kK, kFast>(wt[3], win[3], xs[i].w, Km1)};
        if (kind != 2) {
            const float ss = warp_sum(u[0] * u[0] + u[1] * u[1] + u[2] * u[2] + u[3] * u[3]);
            float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, A.eps)));
            if (kind == 0) inv = __fmul_rn(inv, A.q_scale);
#pragma unroll
            for (int c = 0; c < 4; ++c) u[c] *= inv;
        }
        *reinterpret_cast<uint2*>(out + (size_t(t) * heads + head) * kPrepD + 4 * lane) =
            make_uint2(bf16x2_bits(u[0], u[1]), bf16x2_bits(u[2], u[3]));
    }
    if (kind == 2 && lane < kPrepWarpTok && tw + lane >= lo && tw + lane < hi) {
        const size_t th = size_t(tw + lane) * A.H_v + head;
        A.g[th] = A.ssm_a[head] * softplusf_(A.a[th] + A.dt_bias[head]);
        A.beta[th] = sigmoidf_(A.b[th]);
    }
}

// The new conv state of every sequence of the call (a thread per channel, the grid's y the
// sequence): the last K-1 inputs of concat(old state, the sequence's qkv rows), as ref. Runs
// after chunked_prep_kernel, which reads the old state.
__global__ void conv_state_kernel(const int32_t* __restrict__ offs, const float* __restrict__ qkv, int conv_dim, int K,
                                  float* __restrict__ conv_state, const int32_t* __restrict__ slots) {
    detail::pdl_entry();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, seq = blockIdx.y;
    if (c >= conv_dim) return;
    const int t0 = offs[seq], n = offs[seq + 1] - t0, Km1 = K - 1;
    if (n == 0) return;
    float* hist = conv_state + ((size_t)(slots ? slots[seq] : seq) * conv_dim + c) * Km1;
    float fresh[kMaxConvK];
#pragma unroll
    for (int i = 0; i < kMaxConvK - 1; ++i) {
        const int tau = n - Km1 + i;  // time in the sequence; < 0: still in the old state
        fresh[i] = i < Km1 ? (tau >= 0 ? qkv[size_t(t0 + tau) * conv_dim + c] : hist[Km1 + tau]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kMaxConvK - 1; ++i)
        if (i < Km1) hist[i] = fresh[i];
}

// ---- fused layer op (serial): one launch for conv + SiLU, the norms and gates, the delta
// rule and the gated RMSNorm ----
//
// A block owns `cols` value columns of one (sequence, value head); the C blocks of a value
// head and the g = H_v / H_k value heads of a key head form one thread-block cluster of
// P = g C blocks (the grid's x is key head, value head of the group, column block). Each of
// the key head's 2 d_k q/k conv channels belongs to one block of the cluster (a contiguous
// share), each v channel to the block of its column, so every conv channel's state is read
// and written by one thread: no block ever reads a window another one rewrites. Per tile of
// up to kTokTile tokens a block
//  1. runs the causal conv + SiLU of its channels; q/k results go to the shared memory of
//     every block of the cluster (distributed shared memory), v results stay local;
//  2. (cluster barrier) runs the delta rule on its columns exactly as delta_serial_kernel
//     (q/k L2 norms by warp reduction, the gates computed once per token), o into shared memory;
//  3. sums o^2 per token over its columns and hands the partial to the C blocks of its value
//     head; (cluster barrier) each adds the C partials in rank order (so the bits never depend
//     on the tile or the call's token count) and writes y = o rsqrt(mean + eps) norm silu(z).
// Remote accesses all happen before the barrier that follows them, so no block touches the
// shared memory of one that has moved on or left.

constexpr int kTokTile = 16;         // tokens per tile; a thread then holds <= one (token, column) of y
constexpr int kFusedMaxWarps = 32;   // per block (1024 threads)
constexpr int kMaxClusterSize = 8;   // the portable limit

struct FusedArgs {
    ref::GdnShape sh;
    const int32_t* offs;
    const float *qkv, *z, *a, *b;
    const float *conv_w, *ssm_a, *dt_bias, *norm;
    float *conv_state, *state, *y;
    const int32_t* slots;  // [n_seqs] state slot of each sequence (nullptr: slot = sequence)
    int K;       // conv taps
    int n_tokens; // rows of qkv, z, a, b (the split kernel's speculative loads stay below it)
    int C;       // blocks per value head
    int cols;    // value columns per block (the last block of a head may have fewer)
    int share;   // q/k channels per block of the cluster (the last ones may have fewer)
    int ustride; // floats per token row of the conv output in shared memory (2 d_k + cols, rounded to 4)
    float eps, q_scale;
    int settled; // the split kernel: state, conv state, offsets and slots loaded before the PDL wait (gdn_fused's state_settled)
    int o_async; // the split kernel: o rows to the value head's blocks by st.async on mbarriers (else a cluster barrier a token)
};

// Dynamic shared memory of the fused kernel, in floats.
__host__ __device__ inline size_t fused_smem_floats(int cols, int share, int ustride, int C, int K) {
    return size_t(kTokTile) * ustride     // u: conv + SiLU output, [q | k | v of the block's columns]
           + size_t(kTokTile) * cols      // o
           + 2 * size_t(kTokTile) * cols  // norm weight and silu(z) per (token, column) of y
           + 2 * kTokTile                 // alpha, beta per token
           + size_t(C) * kTokTile         // sum(o^2) per (block of the value head, token)
           + size_t(share + cols) * (K > 1 ? K - 1 : 0);  // conv windows of the block's channels
}

#ifdef ALLOY_GDN_EXP_CLOCK
// Timing experiment only: per phase of the fused kernel, cycles summed over the blocks of a call
// (thread 0 of each block), their maximum, and the call's span in %globaltimer ns (first block's
// start to last block's end).
__device__ unsigned long long g_fclk[3][16];
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define FCLK(i)                                                                                   \
    do {                                                                                          \
        if (threadIdx.x == 0) {                                                                   \
            const long long now = clock64();                                                      \
            if (i > 0) {                                                                          \
                atomicAdd(&g_fclk[0][i], (unsigned long long)(now - fclk_last));                  \
                atomicMax(&g_fclk[1][i], (unsigned long long)(now - fclk_last));                  \
            }                                                                                     \
            fclk_last = now;                                                                      \
        }                                                                                         \
    } while (0)
#define FCLK_START()                                                                              \
    long long fclk_last = 0;                                                                      \
    if (threadIdx.x == 0) atomicMin(&g_fclk[2][0], gtimer()), atomicAdd(&g_fclk[2][2], 1ull);      \
    FCLK(0)
#define FCLK_END()                                                                                \
    FCLK(15);                                                                                     \
    if (threadIdx.x == 0) atomicMax(&g_fclk[2][1], gtimer())
#else
#define FCLK(i)
#define FCLK_START()
#define FCLK_END()
#endif

// kE: row elements per lane (d_k <= 32 kE); 4 (d_k <= 128) keeps the float4 variant in 64
// registers without spills (ptxas -v; windows sized for K = 4 measured 24 bytes of spill).
template <bool kVec, int kE>
__global__ void __launch_bounds__(kFusedMaxWarps * 32) fused_serial_kernel(const FusedArgs A) {
    detail::pdl_entry();
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    const int d_k = A.sh.d_k, d_v = A.sh.d_v, H_v = A.sh.H_v, H_k = A.sh.H_k, g = H_v / H_k;
    const int K = A.K, Km1 = K - 1, C = A.C, cols = A.cols, us = A.ustride;
    const int seq = blockIdx.y, P = g * C;
    const int kh = blockIdx.x / P, rank = blockIdx.x % P, hi = rank / C, cb = rank % C;
    const int h = A.sh.tiled ? kh + H_k * hi : kh * g + hi;
    const int slot = A.slots ? A.slots[seq] : seq;
    FCLK_START();
    const int t0 = A.offs[seq], t1 = A.offs[seq + 1];
    if (t0 == t1) return;  // the whole cluster (one sequence) leaves: no barrier is left waiting
    FCLK(1);
    // Arrive now, wait before the first remote store: no block writes into the shared memory
    // of one that has not started.
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int col0 = cb * cols, ncols = max(0, min(cols, d_v - col0));
    const int jl0 = warp * kColsPerWarp;  // this warp's first column, local to the block
    const int key_dim = H_k * d_k, conv_dim = 2 * key_dim + H_v * d_v;
    const int qk0 = rank * A.share, nqk = max(0, min(A.share, 2 * d_k - qk0));  // this block's q/k channels
    const int nch = nqk + ncols;

    extern __shared__ float4 smem4[];
    float* u_s = reinterpret_cast<float*>(smem4);
    float* o_s = u_s + size_t(kTokTile) * us;
    float* nz_s = o_s + size_t(kTokTile) * cols;  // [kTokTile][cols][2]
    float* gate_s = nz_s + 2 * size_t(kTokTile) * cols;
    float* part_s = gate_s + 2 * kTokTile;
    float* win_s = part_s + size_t(C) * kTokTile;

    // The state columns first: their loads are the long pole, the conv's overlap them.
    float* S = A.state + ((size_t)slot * H_v + h) * d_v * d_k;
    float s[kColsPerWarp][kE];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
        if (jl0 + c < ncols) load_row<kVec, kE>(S + (size_t)(col0 + jl0 + c) * d_k, d_k, lane, s[c]);
        else
#pragma unroll
            for (int e = 0; e < kE; ++e) s[c][e] = 0.0f;
    }
    float* hist = A.conv_state + (size_t)slot * conv_dim * Km1;

    for (int tb = t0; tb < t1; tb += kTokTile) {
        const int nt = min(kTokTile, t1 - tb);
        if (tb != t0) __syncthreads();  // the last tile's y is out before nz_s is rewritten
        // The gates, g = ssm_a softplus(a + dt_bias) and beta = sigmoid(b), and the norm weight
        // and silu(z) of y, by the threads the conv leaves idle (their loads overlap the conv's).
        for (int i = (int(threadIdx.x) + int(blockDim.x) - nch % int(blockDim.x)) % int(blockDim.x); i < nt + nt * ncols;
             i += blockDim.x) {
            if (i < nt) {
                const size_t th = (size_t)(tb + i) * H_v + h;
                gate_s[2 * i] = expf(A.ssm_a[h] * softplusf_(A.a[th] + A.dt_bias[h]));
                gate_s[2 * i + 1] = sigmoidf_(A.b[th]);
            } else {
                const int tt = (i - nt) / ncols, j = (i - nt) % ncols;
                const float zz = A.z[((size_t)(tb + tt) * H_v + h) * d_v + col0 + j];
                nz_s[2 * (i - nt)] = A.norm[col0 + j];
                nz_s[2 * (i - nt) + 1] = zz * sigmoidf_(zz);
            }
        }

        FCLK(2);
        if (tb == t0) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
        FCLK(3);

        // 1. conv + SiLU: u = silu(sum over taps of w * input), taps oldest first as the
        // reference sums them; the window (last K-1 inputs) from the conv state at the first
        // tile, else from shared memory.
        for (int l = threadIdx.x; l < nch; l += blockDim.x) {
            const int ch = l < nqk ? qk0 + l : 2 * d_k + (l - nqk);  // q | k | own v
            const size_t gc = size_t(ch < d_k ? kh * d_k + ch
                                     : ch < 2 * d_k ? key_dim + kh * d_k + (ch - d_k)
                                                    : 2 * key_dim + h * d_v + col0 + (ch - 2 * d_k));
            float win[kMaxConvK], wt[kMaxConvK];
#pragma unroll
            for (int i = 0; i < kMaxConvK; ++i) {
                win[i] = i < Km1 ? (tb == t0 ? hist[gc * Km1 + i] : win_s[l * Km1 + i]) : 0.0f;
                wt[i] = i < K ? A.conv_w[gc * K + i] : 0.0f;
            }
            for (int tt = 0; tt < nt; ++tt) {
                const float x = A.qkv[(size_t)(tb + tt) * conv_dim + gc];
                float acc = 0.0f;
#pragma unroll
                for (int i = 0; i < kMaxConvK - 1; ++i)
                    if (i < Km1) acc += wt[i] * win[i];
#pragma unroll
                for (int i = 0; i < kMaxConvK; ++i)
                    if (i == Km1) acc += wt[i] * x;
                const float uu = acc * sigmoidf_(acc);
                if (l < nqk)
                    for (int r = 0; r < P; ++r) cluster.map_shared_rank(u_s, unsigned(r))[tt * us + ch] = uu;
                else
                    u_s[tt * us + ch] = uu;
#pragma unroll
                for (int i = 0; i < kMaxConvK - 1; ++i) {
                    if (i + 1 < Km1) win[i] = win[i + 1];
                    else if (i + 1 == Km1) win[i] = x;
                }
            }
#pragma unroll
            for (int i = 0; i < kMaxConvK - 1; ++i)
                if (i < Km1) {
                    if (tb + nt < t1) win_s[l * Km1 + i] = win[i];
                    else hist[gc * Km1 + i] = win[i];  // the new conv state, by the thread that read the old
                }
        }
        FCLK(4);
        cluster.sync();  // every block's q/k conv output is in every block
        FCLK(5);

        // 2. the delta rule on this warp's columns, token by token.
        if (jl0 < ncols) {
            for (int tt = 0; tt < nt; ++tt) {
                const float* qt = u_s + tt * us;
                float kv[kE], qv[kE], kq = 0.0f, sk2 = 0.0f, sq2 = 0.0f;
                load_row<kVec, kE>(qt + d_k, d_k, lane, kv);
                load_row<kVec, kE>(qt, d_k, lane, qv);
#pragma unroll
                for (int e = 0; e < kE; ++e) {
                    sk2 += kv[e] * kv[e];
                    sq2 += qv[e] * qv[e];
                }
                // HF's l2norm: x / sqrt(sum x^2 + eps); q also scaled by 1/sqrt(d_k).
                const float ik = 1.0f / sqrtf(warp_sum(sk2) + A.eps), iq = 1.0f / sqrtf(warp_sum(sq2) + A.eps);
#pragma unroll
                for (int e = 0; e < kE; ++e) {
                    kv[e] *= ik;
                    qv[e] = qv[e] * iq * A.q_scale;
                }
#pragma unroll
                for (int e = 0; e < kE; ++e) kq += kv[e] * qv[e];
                kq = warp_sum(kq);
                const float alpha = gate_s[2 * tt], b = gate_s[2 * tt + 1];
#pragma unroll
                for (int c = 0; c < kColsPerWarp; ++c) {
                    const int jl = jl0 + c;
                    if (jl >= ncols) break;
                    float sk = 0.0f, sq = 0.0f;
#pragma unroll
                    for (int e = 0; e < kE; ++e) {
                        sk += s[c][e] * kv[e];
                        sq += s[c][e] * qv[e];
                    }
                    sk = warp_sum(sk);
                    sq = warp_sum(sq);
                    const float delta = b * (qt[2 * d_k + jl] - alpha * sk);
                    if (lane == 0) o_s[tt * cols + jl] = alpha * sq + delta * kq;
#pragma unroll
                    for (int e = 0; e < kE; ++e) s[c][e] = alpha * s[c][e] + delta * kv[e];
                }
            }
        }
        if (tb + nt >= t1) {  // the last tile: the new state leaves now, under the norm's barriers
#pragma unroll
            for (int c = 0; c < kColsPerWarp; ++c)
                if (jl0 + c < ncols) store_row<kVec, kE>(S + (size_t)(col0 + jl0 + c) * d_k, d_k, lane, s[c]);
        }
        FCLK(6);
        __syncthreads();
        FCLK(7);

        // 3. gated RMSNorm: sum(o^2) over this block's columns per token (a warp per token,
        // a fixed tree) into slot cb of the value head's C blocks, then their C partials in order.
        for (int tt = warp; tt < nt; tt += int(blockDim.x >> 5)) {
            float ss = 0.0f;
            for (int j = lane; j < ncols; j += 32) ss += o_s[tt * cols + j] * o_s[tt * cols + j];
            ss = warp_sum(ss);
            if (lane < C) cluster.map_shared_rank(part_s, unsigned(hi * C + lane))[cb * kTokTile + tt] = ss;
        }
        FCLK(8);
        cluster.sync();
        FCLK(9);
        for (int i = threadIdx.x; i < nt * ncols; i += blockDim.x) {
            const int tt = i / ncols, j = i % ncols;
            float ss = 0.0f;
            for (int c = 0; c < C; ++c) ss += part_s[c * kTokTile + tt];
            const float inv = 1.0f / sqrtf(ss / float(d_v) + A.eps);
            A.y[((size_t)(tb + tt) * H_v + h) * d_v + col0 + j] = o_s[tt * cols + j] * inv * nz_s[2 * i] * nz_s[2 * i + 1];
        }
    }
    FCLK_END();
}

// ---- fused layer op (serial), one launch: the split kernel ----
//
// The decode kernel for d_k <= 128 and d_v <= 128 (every Qwen3.5 shape). C blocks share a
// value head (cols = d_v / C columns each), and the g C blocks of a key head form a cluster
// (g C <= 8). Every block computes the conv + SiLU of its key head's 2 d_k q/k channels itself
// (the blocks of a key head do so from the same inputs, so they agree bit for bit) and of its
// own v channels: no q/k exchange. Per token: conv -> (block barrier) -> the delta rule on the
// block's columns -> o to the C blocks of the value head (st.async into their shared memory,
// counted on their mbarriers; a cluster of one block: a cluster barrier) -> gated RMSNorm over
// the whole row, -> y of the block's columns. The
// cluster's first barrier phase (arrive once the old conv windows are loaded, wait before the
// first remote store) also lets the cluster's rank 0 write the key head's new q/k windows.
//
// The delta rule in 8-lane groups: lane 8 grp + sub holds the elements of the lanes sub, sub + 8,
// sub + 16 and sub + 24 of delta_serial_kernel's layout (4 each), for the column of its group, so
// a warp works on 4 columns at once. A dot product sums each of those lanes' 4 products in the
// same order, adds them as the first two levels of warp_sum's tree do ((l + l+16) + (l+8 +
// l+24)), then runs the tree's last three levels across the group: the same additions in the
// same order. The norm sums the full row in gated_norm_kernel's order. So every value rounds
// exactly as in the three-launch path (conv_silu_kernel, delta_serial_kernel<kPrep>,
// gated_norm_kernel): the launch gate never changes a token's bits.
constexpr int kSplitMaxDk = 128;   // 16 elements per lane
constexpr int kSplitMaxDv = 128;
constexpr int kSplitMaxWarps = 16; // per block
// Auto takes the split kernel while its clusters fit on the device at once.

// The 16 elements of lane sub of a group: m = 0..3 (layout lane sub + 8 m), e = 0..3.
template <bool kVec>
__device__ __forceinline__ void load_row8(const float* __restrict__ p, int d_k, int sub, float (&x)[16]) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int l = sub + 8 * m;
        if constexpr (kVec) {
            const int i = 4 * l;
            const float4 f = i < d_k ? *reinterpret_cast<const float4*>(p + i) : make_float4(0, 0, 0, 0);
            x[4 * m] = f.x, x[4 * m + 1] = f.y, x[4 * m + 2] = f.z, x[4 * m + 3] = f.w;
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = l + 32 * e;
                x[4 * m + e] = i < d_k ? p[i] : 0.0f;
            }
        }
    }
}

template <bool kVec>
__device__ __forceinline__ void store_row8(float* __restrict__ p, int d_k, int sub, const float (&x)[16]) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const int l = sub + 8 * m;
        if constexpr (kVec) {
            const int i = 4 * l;
            if (i < d_k) *reinterpret_cast<float4*>(p + i) = make_float4(x[4 * m], x[4 * m + 1], x[4 * m + 2], x[4 * m + 3]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = l + 32 * e;
                if (i < d_k) p[i] = x[4 * m + e];
            }
        }
    }
}

// Per layout-lane sums of a . b (each in delta_serial_kernel's order), the tree's levels 16 and 8.
__device__ __forceinline__ float dot8_partial(const float (&a)[16], const float (&b)[16]) {
    float l[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc += a[4 * m + e] * b[4 * m + e];
        l[m] = acc;
    }
    return (l[0] + l[2]) + (l[1] + l[3]);
}
// The tree's levels 4, 2, 1 inside the 8-lane group (every lane of the group gets the sum).
__device__ __forceinline__ float group8_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x;
}

// kP: 4-column passes per delta warp (cols <= 4 kP kSplitMaxWarps); kK: conv taps held (K <= kK);
// kCh: conv channels per thread; kSlots: seq_slots given (else slot = sequence, and no load: a
// dependent load there measured +0.26 us at H_v 48, B = 1).
template <bool kVec, int kP, int kK, int kCh, bool kSlots>
__global__ void __launch_bounds__(kSplitMaxWarps * 32, 1) fused_split_kernel(const FusedArgs A) {
    // Settled (decode graphs): what no earlier kernel of the step writes is loaded while the
    // previous kernel drains, and only the token's rows wait for it.
    if (A.settled) detail::pdl_trigger();
    else detail::pdl_entry();
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    const int d_k = A.sh.d_k, d_v = A.sh.d_v, H_v = A.sh.H_v, H_k = A.sh.H_k, g = H_v / H_k;
    const int K = A.K, Km1 = K - 1, C = A.C, cols = A.cols, P = g * C;
    const int seq = blockIdx.y, kh = blockIdx.x / P, rank = blockIdx.x % P, hi = rank / C, cb = rank % C;
    const int h = A.sh.tiled ? kh + H_k * hi : kh * g + hi;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, grp = lane >> 3, sub = lane & 7;
    const int key_dim = H_k * d_k, conv_dim = 2 * key_dim + H_v * d_v;
    const int col0 = cb * cols, ncols = max(0, min(cols, d_v - col0)), nch = 2 * d_k + ncols;
    const int nthreads = int(blockDim.x);

    __shared__ __align__(16) float u_s[2 * kSplitMaxDk + kSplitMaxDv];  // conv output: q | k | v of the block's columns
    __shared__ float o_s[2][kSplitMaxDv];                               // the head's o row, by token parity
    __shared__ float gate_s[2];
    __shared__ __align__(8) uint64_t o_bar[2];                          // o_s[parity] complete (o_async)
    FCLK_START();
    // st.async needs a cluster of two or more blocks (one block: the cluster barrier path).
    const bool o_async = A.o_async && P > 1;
    if (o_async && tid == 0) {  // fenced for the cluster; peers signal them only after the first phase below
        detail::mbar_init(&o_bar[0], 1);
        detail::mbar_init(&o_bar[1], 1);
        detail::mbar_init_fence_cluster();
    }

    // Loads in the order they are needed: the offsets and the rows of token `seq` (the token of
    // sequence seq in a decode batch, offsets 0, 1, .., B: used when offs[seq] == seq, which
    // takes a load latency off the critical path; otherwise loaded again, so any offsets stay
    // correct), the conv weights and windows, the gate parameters, the norm weight, and last
    // the state columns (needed only after the conv).
    const int t0 = A.offs[seq], t1 = A.offs[seq + 1];
    const int slot = kSlots ? A.slots[seq] : seq;
    size_t gcs[kCh];
#pragma unroll
    for (int c = 0; c < kCh; ++c) {
        const int l = tid + c * nthreads;
        gcs[c] = size_t(l < d_k ? kh * d_k + l
                        : l < 2 * d_k ? key_dim + kh * d_k + (l - d_k)
                                      : 2 * key_dim + h * d_v + col0 + (l - 2 * d_k));
    }
    const bool y_thread = tid < ncols, g_thread = tid == nthreads - 1;
    const bool spec_ok = seq < A.n_tokens;
    float x_spec[kCh], z_spec = 0.0f, a_spec = 0.0f, b_spec = 0.0f;
    auto load_spec = [&] {
#pragma unroll
        for (int c = 0; c < kCh; ++c) x_spec[c] = spec_ok && tid + c * nthreads < nch ? A.qkv[(size_t)seq * conv_dim + gcs[c]] : 0.0f;
        if (spec_ok && y_thread) z_spec = A.z[((size_t)seq * H_v + h) * d_v + col0 + tid];
        if (spec_ok && g_thread) a_spec = A.a[(size_t)seq * H_v + h], b_spec = A.b[(size_t)seq * H_v + h];
    };
    if (!A.settled) load_spec();
    float win[kCh][kK], wt[kCh][kK];
#pragma unroll
    for (int c = 0; c < kCh; ++c) {
        const int l = tid + c * nthreads;
        const float* hist = A.conv_state + (size_t)slot * conv_dim * Km1 + gcs[c] * Km1;
#pragma unroll
        for (int i = 0; i < kK; ++i) {
            win[c][i] = l < nch && i < Km1 ? hist[i] : 0.0f;
            wt[c][i] = l < nch && i < K ? A.conv_w[gcs[c] * K + i] : 0.0f;
        }
    }
    const float sa = A.ssm_a[h], dtb = A.dt_bias[h];
    const float nw = y_thread ? A.norm[col0 + tid] : 0.0f;
    float* S = A.state + ((size_t)slot * H_v + h) * d_v * d_k;
    float s[kP][16];
#pragma unroll
    for (int p = 0; p < kP; ++p) {
        const int jl = (warp * kP + p) * 4 + grp;
        if (jl < ncols) load_row8<kVec>(S + (size_t)(col0 + jl) * d_k, d_k, sub, s[p]);
        else
#pragma unroll
            for (int e = 0; e < 16; ++e) s[p][e] = 0.0f;
    }
    if (A.settled) {
        detail::pdl_wait();
        load_spec();
    }
    if (t0 == t1) return;  // the whole cluster (one sequence) leaves together
    const bool spec = t0 == seq;
    // The cluster's first phase: arrive once this thread's old conv windows are in registers
    // (the fold makes the arrive wait for those loads only, not for the state's), so a block of
    // the cluster waits at its first remote store only for the others' start, not their conv.
    // Relaxed, as CUTLASS's cluster_arrive_relaxed after fence.mbarrier_init: the windows'
    // values are used before it (rank 0 overwrites them only after its wait), and the mbarrier
    // initialisations have their own release fence.
    {
        float dep = 0.0f;
#pragma unroll
        for (int c = 0; c < kCh; ++c)
#pragma unroll
            for (int i = 0; i < kK; ++i) dep += win[c][i] * 0.0f;
        asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::"f"(dep) : "memory");
    }
    FCLK(1);

    for (int t = t0; t < t1; ++t) {
        const int par = (t - t0) & 1;
        // 1. conv + SiLU of the block's channels (taps oldest first, as the reference), the
        // gates, and silu(z) for the norm.
#pragma unroll
        for (int c = 0; c < kCh; ++c) {
            const int l = tid + c * nthreads;
            if (l < nch) {
                const float x = t == t0 && spec ? x_spec[c] : A.qkv[(size_t)t * conv_dim + gcs[c]];
                float acc = 0.0f;
#pragma unroll
                for (int i = 0; i < kK - 1; ++i)
                    if (i < Km1) acc += wt[c][i] * win[c][i];
#pragma unroll
                for (int i = 0; i < kK; ++i)
                    if (i == Km1) acc += wt[c][i] * x;
                u_s[l] = acc * sigmoidf_(acc);
#pragma unroll
                for (int i = 0; i < kK - 1; ++i) {
                    if (i + 1 < Km1) win[c][i] = win[c][i + 1];
                    else if (i + 1 == Km1) win[c][i] = x;
                }
            }
        }
        float zs = 0.0f;
        if (y_thread) {
            const float zz = t == t0 && spec ? z_spec : A.z[((size_t)t * H_v + h) * d_v + col0 + tid];
            zs = zz * sigmoidf_(zz);
        }
        if (g_thread) {
            const size_t th = (size_t)t * H_v + h;
            const float ar = t == t0 && spec ? a_spec : A.a[th], br = t == t0 && spec ? b_spec : A.b[th];
            gate_s[0] = expf(sa * softplusf_(ar + dtb));
            gate_s[1] = sigmoidf_(br);
        }
        FCLK(2);
        __syncthreads();
        FCLK(3);

        // 2. the delta rule: the q/k L2 norms (HF's x / sqrt(sum x^2 + eps), q also scaled by
        // 1/sqrt(d_k)), then 4 columns per warp per pass; o to the C blocks of the value head.
        float ov[kP];
        if (warp * kP * 4 < ncols) {
            float kv[16], qv[16];
            load_row8<kVec>(u_s + d_k, d_k, sub, kv);
            load_row8<kVec>(u_s, d_k, sub, qv);
            // All five dot products on the raw conv output at once, the norms folded in after
            // (delta_tokens<kPrep> rounds the same way).
            float skr[kP], sqr[kP];
#pragma unroll
            for (int p = 0; p < kP; ++p) {
                skr[p] = group8_sum(dot8_partial(s[p], kv));
                sqr[p] = group8_sum(dot8_partial(s[p], qv));
            }
            const float kk = group8_sum(dot8_partial(kv, kv)), qq = group8_sum(dot8_partial(qv, qv));
            const float kq = group8_sum(dot8_partial(kv, qv));
            const PrepScale ps = prep_scale(kk, qq, kq, A.eps, A.q_scale);
            const float alpha = gate_s[0], b = gate_s[1];
#pragma unroll
            for (int e = 0; e < 16; ++e) kv[e] = __fmul_rn(kv[e], ps.ik);
#pragma unroll
            for (int p = 0; p < kP; ++p) {
                const int jl = (warp * kP + p) * 4 + grp;
                const float delta = prep_delta(b, jl < ncols ? u_s[2 * d_k + jl] : 0.0f, alpha, skr[p], ps);
                ov[p] = prep_out(alpha, sqr[p], delta, ps);
#pragma unroll
                for (int e = 0; e < 16; ++e) s[p][e] = __fmaf_rn(delta, kv[e], __fmul_rn(alpha, s[p][e]));
            }
        }
        FCLK(4);
        if (t + 1 == t1 && warp * kP * 4 < ncols) {  // the new state leaves before the norm
#pragma unroll
            for (int p = 0; p < kP; ++p) {
                const int jl = (warp * kP + p) * 4 + grp;
                if (jl < ncols) store_row8<kVec>(S + (size_t)(col0 + jl) * d_k, d_k, sub, s[p]);
            }
        }
        // Remote stores only once every block of the cluster has started (first phase).
        if (t == t0) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
        FCLK(5);
        if (o_async) {
            // Each block's o columns by st.async into o_s[par] of the head's C blocks, counted in
            // bytes on their o_bar[par]; a block waits for its own d_v floats only, not for the
            // whole cluster. Two mbarriers, one a parity: bytes of token t + 1 can land before a
            // straggler of token t (different senders), never those of t + 2 (a sender is past
            // its wait for t + 1, so every block sent t + 1, so every block finished reading t's
            // buffer: the block barrier after the conv orders that).
            if (tid == 0) detail::mbar_arrive_expect_tx(&o_bar[par], uint32_t(d_v) * 4u);
            if (warp * kP * 4 < ncols && sub < C) {
                const uint32_t peer = unsigned(hi * C + sub);
                const uint32_t rbar = detail::cluster_smem_u32(&o_bar[par], peer);
#pragma unroll
                for (int p = 0; p < kP; ++p) {
                    const int jl = (warp * kP + p) * 4 + grp;
                    if (jl < ncols) detail::st_async_f32(detail::cluster_smem_u32(&o_s[par][col0 + jl], peer), ov[p], rbar);
                }
            }
            detail::mbar_wait_cluster(&o_bar[par], uint32_t((t - t0) >> 1) & 1u);
        } else {
            if (warp * kP * 4 < ncols && sub < C) {  // lane sub of each group stores to block sub of the head
#pragma unroll
                for (int p = 0; p < kP; ++p) {
                    const int jl = (warp * kP + p) * 4 + grp;
                    if (jl < ncols) cluster.map_shared_rank(&o_s[par][0], unsigned(hi * C + sub))[col0 + jl] = ov[p];
                }
            }
            asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
            asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
        }
        FCLK(6);

        // 3. gated RMSNorm as gated_norm_kernel: the warps holding y's columns each sum o^2
        // over the whole row (lane + 32 i, then the warp tree) and write their columns.
        if (warp * 32 < ncols) {
            float ss = 0.0f;
#pragma unroll
            for (int e = 0; e < kSplitMaxDv / 32; ++e)
                if (lane + 32 * e < d_v) ss += o_s[par][lane + 32 * e] * o_s[par][lane + 32 * e];
            const float inv = 1.0f / sqrtf(warp_sum(ss) / float(d_v) + A.eps);
            if (y_thread) A.y[((size_t)t * H_v + h) * d_v + col0 + tid] = o_s[par][col0 + tid] * inv * nw * zs;
        }
        FCLK(7);
    }

    // The new conv windows: v channels by their block; the key head's q/k channels by the
    // cluster's rank 0 (every block has consumed the old ones: the first phase).
#pragma unroll
    for (int c = 0; c < kCh; ++c) {
        const int l = tid + c * nthreads;
        if (l < nch && (l >= 2 * d_k || rank == 0)) {
            float* hist = A.conv_state + (size_t)slot * conv_dim * Km1 + gcs[c] * Km1;
#pragma unroll
            for (int i = 0; i < kK - 1; ++i)
                if (i < Km1) hist[i] = win[c][i];
        }
    }
    FCLK_END();
}

void check_launch(const char* op) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw Error(std::string(op) + ": launch failed: " + cudaGetErrorString(err));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The delta kernel over n_seqs sequences; float4 rows when every row starts 16-byte aligned.
void launch_delta(const DeltaArgs& A, bool prep, int n_seqs, void* stream, const char* op) {
    const bool vec = A.sh.d_k % 4 == 0 && A.qk_stride % 4 == 0 && aligned16(A.q) && aligned16(A.k) && aligned16(A.state);
    const bool small = A.sh.d_k <= 128;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    // Columns per warp: 2 for small grids (more blocks, so more SMs share the latency chain), 4
    // from kWideHeads (sequence, head) pairs on (twice the bytes in flight per register: B = 32
    // at H_v 32 / 48 measured 42.4 / 60.9 us against 47.2 / 69.0). The bits do not depend on it.
    const bool wide = int64_t(n_seqs) * A.sh.H_v >= kWideHeads;
    const int cols_per_block = (wide ? 4 : 2) * kWarps;
    const dim3 grid((A.sh.d_v + cols_per_block - 1) / cols_per_block, A.sh.H_v, n_seqs);
    // States that outgrow L2 stream through it (evict first): B = 32 at H_v 32 / 48 39.9 / 57.5
    // -> 36.4 / 53.3 us (H200), while B = 32 at H_v 16 (32 MB, which L2 holds between repeats)
    // went 14.0 -> 15.9. ALLOY_GDN_DELTA_CS=0/1 forces it (small test shapes never reach the gate:
    // run test_cuda's GDN tests with =1 to cover the streaming kernel).
    static const int cs_env = [] { const char* e = getenv("ALLOY_GDN_DELTA_CS"); return e ? atoi(e) : -1; }();
    const double state_bytes = double(n_seqs) * A.sh.H_v * A.sh.d_v * A.sh.d_k * 4;
    const bool cs = cs_env >= 0 ? cs_env == 1 : state_bytes > 0.75 * double(detail::l2_bytes());
    auto run = [&](auto kernel) {
        detail::launch(op, kernel, dim3(grid), dim3(kWarps * 32), 0, st, A.sh, A.offs, A.q, A.k, A.v, int(A.qk_stride), int(A.v_stride), A.g, A.beta,
                                             A.a, A.b, A.ssm_a, A.dt_bias, A.eps, A.q_scale, A.state, A.out, A.slots);
    };
    auto pick = [&](auto prep_c) {
        constexpr bool P = decltype(prep_c)::value;
        if (small && wide && vec && cs) run(delta_serial_kernel<true, P, 4, 4, true>);
        else if (small && wide) vec ? run(delta_serial_kernel<true, P, 4, 4>) : run(delta_serial_kernel<false, P, 4, 4>);
        else if (small) vec ? run(delta_serial_kernel<true, P, 4, 2>) : run(delta_serial_kernel<false, P, 4, 2>);
        else if (wide) vec ? run(delta_serial_kernel<true, P, kElems, 4>) : run(delta_serial_kernel<false, P, kElems, 4>);
        else vec ? run(delta_serial_kernel<true, P, kElems, 2>) : run(delta_serial_kernel<false, P, kElems, 2>);
    };
    if (prep) pick(std::true_type{});
    else pick(std::false_type{});
    check_launch(op);
}

// The reference's shape checks (same messages), then what this backend adds.
void check_shape(const ref::GdnShape& shape, int n_seqs, const char* op) {
    ref::detail::check_shape(shape, op);
    if (shape.d_k > kMaxDk) throw Error(std::string(op) + ": d_k " + std::to_string(shape.d_k) + " > " + std::to_string(kMaxDk));
    if (n_seqs > 65535) throw Error(std::string(op) + ": more than 65535 sequences in one call");
}

// The one-launch kernel's shape for one layer shape: C blocks per value head, so a cluster
// holds g C blocks. Aim at 16 columns (8 warps) per block, so that blocks share an SM; at
// least as many blocks as keep a block within 32 warps; a cluster of at most the portable 8
// (15- and 16-block clusters measured slower on the H200). max_clusters: how many such
// clusters the device holds at once (the launch gate's wave). Decided once per shape, so the
// attribute call and the occupancy query stay out of graph captures after the first call.
struct FusedPlan {
    int C = 0, cols = 0, warps = 0, share = 0, ustride = 0, max_clusters = 0;
    size_t smem = 0;
};

using FusedKernel = void (*)(FusedArgs);

// nullopt-like: C == 0 when no cluster of <= 8 blocks holds a key head's value heads.
FusedPlan fused_plan(FusedKernel kernel, int g, int d_k, int d_v, int K) {
    static std::mutex mu;
    static std::map<std::tuple<FusedKernel, int, int, int, int>, FusedPlan> cache;
    const auto key = std::make_tuple(kernel, g, d_k, d_v, K);
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const int per_block_max = kFusedMaxWarps * kColsPerWarp;
    const int c_min = (d_v + per_block_max - 1) / per_block_max, c_ideal = std::max(c_min, (d_v + 15) / 16);
    FusedPlan pl;
    const int C = std::min(c_ideal, kMaxClusterSize / g);
    if (C >= c_min) {
        pl.C = C;
        pl.cols = (d_v + C - 1) / C;
        pl.warps = (pl.cols + kColsPerWarp - 1) / kColsPerWarp;
        pl.share = (2 * d_k + g * C - 1) / (g * C);
        pl.ustride = (2 * d_k + pl.cols + 3) / 4 * 4;
        pl.smem = fused_smem_floats(pl.cols, pl.share, pl.ustride, C, K) * sizeof(float);
        bool ok = pl.smem <= 48 * 1024 ||
                  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(pl.smem)) == cudaSuccess;
        if (ok) {
            cudaLaunchConfig_t cfg{};
            cfg.gridDim = dim3(unsigned(g * C), 1, 1);
            cfg.blockDim = dim3(unsigned(pl.warps * 32), 1, 1);
            cfg.dynamicSmemBytes = pl.smem;
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = unsigned(g * C);
            attr[0].val.clusterDim.y = 1;
            attr[0].val.clusterDim.z = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
            ok = cudaOccupancyMaxActiveClusters(&pl.max_clusters, kernel, &cfg) == cudaSuccess && pl.max_clusters > 0;
        }
        if (!ok) {
            cudaGetLastError();
            pl = FusedPlan{};
        }
    }
    cache.emplace(key, pl);
    return pl;
}
// The split kernel's shape for one layer shape: C blocks per value head (as many as a cluster
// of <= 8 holds the key head's g C blocks, down to 16 columns a block), the delta warps
// (4 kP columns each), and enough threads for one conv channel each. C == 0: not this kernel.
// max_clusters: how many clusters the device holds at once (the gate's wave). Decided once per
// shape, so the occupancy query stays out of graph captures after the first call.
struct SplitPlan {
    int C = 0, cols = 0, warps = 0, max_clusters = 0;
    FusedKernel kernel = nullptr, kernel_slots = nullptr;  // without / with seq_slots
};
// Waves of clusters the gate lets the split kernel run before it takes three launches: 2 since
// the o rows go by st.async (H100, session 43, plain launches: B = 2 one launch 6.17 / 7.45 /
// 8.15 us against three 6.50 / 8.45 / 8.91 at H_v 16 / 32 / 48, where one wave made the gate
// take three; B = 4 one launch 9.22 / 11.17 / 15.43 against 8.43 / 10.28 / 11.39, which two
// waves still send to three).
// ALLOY_GDN_SPLIT_GATE_WAVES=N overrides it (A/B; the same bits either way).
int split_gate_waves() {
    static const int w = [] { const char* e = std::getenv("ALLOY_GDN_SPLIT_GATE_WAVES"); return e ? std::atoi(e) : 2; }();
    return w;
}
#ifndef ALLOY_GDN_SPLIT_MIN_COLS
#define ALLOY_GDN_SPLIT_MIN_COLS 16
#endif
// Blocks per cluster the plan aims at (g C <= this where g allows; a key head's g blocks always
// share one): clusters of 8 measured 7.6 us at H_v 16 against 4.6 for 4 (their blocks start
// up to ~3.5 us apart).
#ifndef ALLOY_GDN_SPLIT_MAX_CLUSTER
#define ALLOY_GDN_SPLIT_MAX_CLUSTER 4
#endif
constexpr int kSplitMaxCluster = ALLOY_GDN_SPLIT_MAX_CLUSTER;
// For g >= 3 value heads per key head: 6 (H_v 48: C = 2, 5.8 us) beat 3 (C = 1: 6.5 us).
#ifndef ALLOY_GDN_SPLIT_MAX_CLUSTER_WIDE
#define ALLOY_GDN_SPLIT_MAX_CLUSTER_WIDE 6
#endif
constexpr int kSplitMaxClusterWide = ALLOY_GDN_SPLIT_MAX_CLUSTER_WIDE;

SplitPlan split_plan(const ref::GdnShape& sh, int K, bool vec) {
    static std::mutex mu;
    static std::map<std::tuple<int, int, int, int, int, bool>, SplitPlan> cache;
    int dev = 0;
    cudaGetDevice(&dev);
    const int g = sh.H_v / sh.H_k;
    const auto key = std::make_tuple(dev, g, sh.d_k, sh.d_v, K, vec);
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    SplitPlan pl;
    if (sh.d_k <= kSplitMaxDk && sh.d_v <= kSplitMaxDv && g <= kMaxClusterSize && K <= 8) {
        const int target = g <= 2 ? kSplitMaxCluster : kSplitMaxClusterWide;
        int C = std::max(1, std::min({std::max(1, target / g), kMaxClusterSize / g, sh.d_v / ALLOY_GDN_SPLIT_MIN_COLS}));
        while (C > 1 && (sh.d_v + C - 1) / C * (C - 1) >= sh.d_v) --C;  // no block without columns
        // 4-column passes a delta warp: 2 wherever a block has more than 16 columns (half the delta
        // warps, each computing k.k, q.q, k.q and the norms once for 8 columns: the delta phase
        // is issue-bound with 16 warps a block, clock64). H100, settled, same call, alternated
        // twice (session 42): 4.15 / 4.87 / 5.38 -> 4.09 / 4.81 / 5.18 us at H_v 16 / 32 / 48 (was
        // 2 only above 64 columns). The same bits (each column's arithmetic does not depend on its warp).
        // ALLOY_GDN_SPLIT_KP1_MAX=N: one pass up to N columns a block (A/B; 64 = the old rule).
        static const int kp1_max = [] { const char* e = std::getenv("ALLOY_GDN_SPLIT_KP1_MAX"); return e ? std::atoi(e) : 16; }();
        const int cols = (sh.d_v + C - 1) / C, kP = cols > kp1_max ? 2 : 1;
        const int dwarps = (cols + 4 * kP - 1) / (4 * kP), nch = 2 * sh.d_k + cols;
        const int warps = std::max(dwarps, (nch + 31) / 32);
        FusedKernel kern = nullptr, kern_s = nullptr;
        if (K <= 4) {
            kern = kP == 1 ? (vec ? fused_split_kernel<true, 1, 4, 1, false> : fused_split_kernel<false, 1, 4, 1, false>)
                           : (vec ? fused_split_kernel<true, 2, 4, 1, false> : fused_split_kernel<false, 2, 4, 1, false>);
            kern_s = kP == 1 ? (vec ? fused_split_kernel<true, 1, 4, 1, true> : fused_split_kernel<false, 1, 4, 1, true>)
                             : (vec ? fused_split_kernel<true, 2, 4, 1, true> : fused_split_kernel<false, 2, 4, 1, true>);
        } else {
            kern = kP == 1 ? (vec ? fused_split_kernel<true, 1, 8, 1, false> : fused_split_kernel<false, 1, 8, 1, false>)
                           : (vec ? fused_split_kernel<true, 2, 8, 1, false> : fused_split_kernel<false, 2, 8, 1, false>);
            kern_s = kP == 1 ? (vec ? fused_split_kernel<true, 1, 8, 1, true> : fused_split_kernel<false, 1, 8, 1, true>)
                             : (vec ? fused_split_kernel<true, 2, 8, 1, true> : fused_split_kernel<false, 2, 8, 1, true>);
        }
        if (warps <= kSplitMaxWarps) {
            cudaLaunchConfig_t cfg{};
            cfg.gridDim = dim3(unsigned(g * C), 1, 1);
            cfg.blockDim = dim3(unsigned(warps * 32), 1, 1);
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = unsigned(g * C);
            attr[0].val.clusterDim.y = 1;
            attr[0].val.clusterDim.z = 1;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
            int mc = 0;
            if (cudaOccupancyMaxActiveClusters(&mc, kern, &cfg) == cudaSuccess && mc > 0) {
                pl.C = C, pl.cols = cols, pl.warps = warps, pl.max_clusters = mc, pl.kernel = kern;
                pl.kernel_slots = kern_s;
            } else {
                cudaGetLastError();
            }
        }
    }
    cache.emplace(key, pl);
    return pl;
}

// y in bf16 for the call's rows (rows_to_bf16_kernel), when the caller asked for it.
void y_to_bf16(const int32_t* offs, int n_seqs, int n_tokens, int64_t n, const float* y, uint16_t* yb, void* stream,
               const char* op) {
    if (!yb) return;
    const unsigned grid = unsigned(std::min<int64_t>((int64_t(n_tokens) * n + 255) / 256, 132 * 8));
    detail::launch(op, rows_to_bf16_kernel, dim3(grid), dim3(256), 0, static_cast<cudaStream_t>(stream), offs, n_seqs, n, y,
                   reinterpret_cast<__nv_bfloat16*>(yb));
    check_launch(op);
}

// The three-launch path: conv + SiLU into the workspace, the delta rule with the norms and
// gates, the gated RMSNorm.
void fused_three_launches(const ref::GdnParams& p, const ref::GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
                          int n_tokens, const float* qkv, const float* z, const float* a, const float* b,
                          float* conv_state, float* state, float* y, void* workspace, void* stream,
                          const int32_t* seq_slots, uint16_t* y_bf16, const char* op) {
    const ref::GdnShape& sh = p.shape;
    if (workspace == nullptr) throw Error(std::string(op) + ": workspace is null (gdn_fused_workspace_bytes)");
    const int key_dim = sh.H_k * sh.d_k, value_dim = sh.H_v * sh.d_v, conv_dim = 2 * key_dim + value_dim;
    // Workspace: u [n_tokens, conv_dim] (conv output: q | k | v), then o [n_tokens, value_dim].
    float* u = static_cast<float*>(workspace);
    float* o = u + size_t(n_tokens) * conv_dim;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    detail::launch(op, conv_silu_kernel, dim3(dim3((conv_dim + 127) / 128, n_seqs)), dim3(128), 0, st, seq_offsets, qkv, conv_dim, p.conv_kernel,
                                                                           w.conv1d, conv_state, u, seq_slots);
    check_launch(op);
    DeltaArgs A{sh, seq_offsets, u, u + key_dim, u + 2 * key_dim, conv_dim, conv_dim, nullptr, nullptr, a, b,
                w.ssm_a, w.dt_bias, p.eps, 1.0f / sqrtf(float(sh.d_k)), state, o, seq_slots};
    launch_delta(A, true, n_seqs, stream, op);
    launch_gated_norm(seq_offsets, n_seqs, n_tokens, sh.H_v, sh.d_v, static_cast<const float*>(o), z, w.norm, p.eps, y, y_bf16, st);
    check_launch(op);
}

// The chunked mode runs on gdn_delta_chunked's shapes only; other shapes take the serial mode.
bool chunked_runs(const ref::GdnParams& p) {
    return p.mode == ref::GdnMode::Chunked && p.shape.d_k == kPrepD && p.shape.d_v == kPrepD && p.chunk_size == 64;
}

// The chunked mode's workspace: bf16 q, k, v, o, fp32 g and beta, then gdn_delta_chunked's own
// (each piece 256-byte aligned). Returns the bytes; fills `ws` when base is not null.
struct ChunkedWs {
    uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    float *g = nullptr, *beta = nullptr;
    void* delta = nullptr;
};
size_t chunked_layout(const ref::GdnShape& sh, int n_seqs, int n_tokens, void* base, ChunkedWs* ws) {
    const size_t T = size_t(std::max(n_tokens, 0));
    auto up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    const size_t qk = up(T * sh.H_k * kPrepD * 2), vo = up(T * sh.H_v * kPrepD * 2), gb = up(T * sh.H_v * 4);
    const size_t offs[6] = {0, qk, 2 * qk, 2 * qk + vo, 2 * qk + 2 * vo, 2 * qk + 2 * vo + gb};
    const size_t delta_at = 2 * qk + 2 * vo + 2 * gb;
    if (base != nullptr) {
        char* p = static_cast<char*>(base);
        ws->q = reinterpret_cast<uint16_t*>(p + offs[0]);
        ws->k = reinterpret_cast<uint16_t*>(p + offs[1]);
        ws->v = reinterpret_cast<uint16_t*>(p + offs[2]);
        ws->o = reinterpret_cast<uint16_t*>(p + offs[3]);
        ws->g = reinterpret_cast<float*>(p + offs[4]);
        ws->beta = reinterpret_cast<float*>(p + offs[5]);
        ws->delta = p + delta_at;
    }
    return delta_at + gdn_delta_chunked_workspace_bytes(sh, std::max(n_seqs, 0), int(T));
}

// The chunked mode (kernels above, then gdn_delta_chunked, then the gated RMSNorm).
void fused_chunked(const ref::GdnParams& p, const ref::GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
                   int n_tokens, const float* qkv, const float* z, const float* a, const float* b, float* conv_state,
                   float* state, float* y, void* workspace, void* stream, const int32_t* seq_slots, uint16_t* y_bf16, const char* op) {
    const ref::GdnShape& sh = p.shape;
    if (workspace == nullptr) throw Error(std::string(op) + ": workspace is null (gdn_fused_workspace_bytes)");
    if (!aligned16(workspace)) throw Error(std::string(op) + ": workspace is not 16-byte aligned");
    if (!aligned16(qkv)) throw Error(std::string(op) + ": qkv is not 16-byte aligned (chunked mode)");
    const int64_t tiles = (int64_t(n_tokens) + kPrepTok - 1) / kPrepTok;
    if (tiles > 65535)
        throw Error(std::string(op) + ": n_tokens " + std::to_string(n_tokens) + " > " + std::to_string(65535 * kPrepTok) +
                    " in the chunked mode (split the call)");
    ChunkedWs ws;
    chunked_layout(sh, n_seqs, n_tokens, workspace, &ws);
    const int key_dim = sh.H_k * kPrepD, conv_dim = 2 * key_dim + sh.H_v * kPrepD, K = p.conv_kernel;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    PrepArgs A{};
    A.offs = seq_offsets;
    A.n_seqs = n_seqs, A.H_k = sh.H_k, A.H_v = sh.H_v, A.conv_dim = conv_dim, A.K = K;
    A.qkv = qkv, A.conv_w = w.conv1d, A.a = a, A.b = b, A.ssm_a = w.ssm_a, A.dt_bias = w.dt_bias;
    A.conv_state = conv_state, A.slots = seq_slots;
    A.eps = p.eps, A.q_scale = 1.0f / sqrtf(float(sh.d_k));
    A.q = ws.q, A.k = ws.k, A.v = ws.v, A.g = ws.g, A.beta = ws.beta;
    const dim3 grid(unsigned(2 * sh.H_k + sh.H_v), unsigned(tiles));
    // ALLOY_GDN_PREP_FAST=0: the exact SiLU (A/B of the fast one, whose error the bf16 rounding hides)
    static const bool fast = [] { const char* e = std::getenv("ALLOY_GDN_PREP_FAST"); return !e || std::atoi(e) != 0; }();
    void (*prep)(const PrepArgs) = K <= 4 ? (fast ? chunked_prep_kernel<4, true> : chunked_prep_kernel<4, false>)
                                          : (fast ? chunked_prep_kernel<kMaxConvK, true> : chunked_prep_kernel<kMaxConvK, false>);
    detail::launch(op, prep, dim3(grid), dim3(128), 0, st, A);
    check_launch(op);
    if (K > 1) {
        detail::launch(op, conv_state_kernel, dim3(dim3((conv_dim + 127) / 128, n_seqs)), dim3(128), 0, st, seq_offsets, qkv, conv_dim, K, conv_state,
                                                                                seq_slots);
        check_launch(op);
    }
    gdn_delta_chunked(sh, n_seqs, seq_offsets, n_tokens, ws.q, ws.k, ws.v, ws.g, ws.beta, state, ws.o, ws.delta, stream,
                      0, seq_slots);
    launch_gated_norm(seq_offsets, n_seqs, n_tokens, sh.H_v, sh.d_v, static_cast<const uint16_t*>(ws.o), z, w.norm, p.eps,
                      y, y_bf16, st);
    check_launch(op);
}

}  // namespace

#ifdef ALLOY_GDN_EXP_CLOCK
void gdn_fused_debug_clocks(unsigned long long* out) {
    cudaMemcpyFromSymbol(out, g_fclk, sizeof(g_fclk));
    unsigned long long init[3][16] = {};
    init[2][0] = ~0ull;
    cudaMemcpyToSymbol(g_fclk, init, sizeof(init));
}
#endif

bool device_available() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void gdn_delta_serial(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                      const float* k, const float* v, const float* g, const float* beta, float* state, float* out,
                      void* stream) {
    const char* op = "cuda::gdn_delta_serial";
    check_shape(shape, n_seqs, op);
    if (n_seqs <= 0) return;
    DeltaArgs A{shape, seq_offsets, q, k, v, int64_t(shape.H_k) * shape.d_k, int64_t(shape.H_v) * shape.d_v,
                g, beta, nullptr, nullptr, nullptr, nullptr, 0.0f, 1.0f, state, out, nullptr};
    launch_delta(A, false, n_seqs, stream, op);
}

size_t gdn_fused_workspace_bytes(const ref::GdnParams& p, int n_seqs, int n_tokens) {
    const ref::GdnShape& sh = p.shape;
    if (chunked_runs(p)) return chunked_layout(sh, n_seqs, n_tokens, nullptr, nullptr);
    const size_t conv_dim = size_t(2) * sh.H_k * sh.d_k + size_t(sh.H_v) * sh.d_v;
    return size_t(n_tokens) * (conv_dim + size_t(sh.H_v) * sh.d_v) * sizeof(float) + 256;
}

void gdn_fused(const ref::GdnParams& p, const ref::GdnWeights& w, int n_seqs, const int32_t* seq_offsets, int n_tokens,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state, float* state,
               float* y, void* workspace, void* stream, GdnFusedPath path, const int32_t* seq_slots, uint16_t* y_bf16,
               bool state_settled) {
    const char* op = "cuda::gdn_fused";
    const ref::GdnShape& sh = p.shape;
    check_shape(sh, n_seqs, op);
    if (p.mode == ref::GdnMode::Chunked && p.chunk_size < 1)
        throw Error(std::string(op) + ": chunk_size=" + std::to_string(p.chunk_size) + " must be >= 1");
    if (p.conv_kernel < 1 || p.conv_kernel > kMaxConvK)
        throw Error(std::string(op) + ": conv_kernel " + std::to_string(p.conv_kernel) + " not in [1, " +
                    std::to_string(kMaxConvK) + "]");
    if (n_tokens < 0) throw Error(std::string(op) + ": n_tokens must be >= 0");
    if (chunked_runs(p)) {
        if (n_seqs <= 0 || n_tokens == 0) return;
        fused_chunked(p, w, n_seqs, seq_offsets, n_tokens, qkv, z, a, b, conv_state, state, y, workspace, stream, seq_slots,
                      y_bf16, op);
        return;
    }
    const int g = sh.H_v / sh.H_k;
    const bool vec = sh.d_k % 4 == 0 && aligned16(state);
    // The split kernel where its registers hold the shape (d_k, d_v <= 128, a key head's blocks
    // in one cluster of <= 8), else the cluster kernel (blocks of columns sharing the q/k conv
    // through distributed shared memory).
    const SplitPlan sp = split_plan(sh, p.conv_kernel, vec);
    const bool split = sp.C > 0;
    const FusedKernel kernel = split ? (seq_slots ? sp.kernel_slots : sp.kernel)
                               : sh.d_k <= 128 ? (vec ? fused_serial_kernel<true, 4> : fused_serial_kernel<false, 4>)
                                               : (vec ? fused_serial_kernel<true, kElems> : fused_serial_kernel<false, kElems>);
    const FusedPlan plan = path == GdnFusedPath::ThreeLaunches || split ? FusedPlan{}
                                                                        : fused_plan(kernel, g, sh.d_k, sh.d_v, p.conv_kernel);
    if (path == GdnFusedPath::OneLaunch && !split && plan.C == 0)
        throw Error(std::string(op) + ": shape.H_v / shape.H_k = " + std::to_string(g) + " with d_v " +
                    std::to_string(sh.d_v) + ": the one-launch kernel's cluster (the value heads of a key head) would "
                    "exceed 8 blocks");
    if (n_seqs <= 0 || n_tokens == 0) return;
    // The gate: one launch while its clusters fit on the device in a few waves (their blocks run
    // a chain of barriers, so more waves cost more than the three short kernels).
    const bool one = path == GdnFusedPath::OneLaunch ||
                     (path == GdnFusedPath::Auto &&
                      (split ? int64_t(sh.H_k) * n_seqs <= int64_t(sp.max_clusters) * split_gate_waves()
                             : plan.C > 0 && int64_t(sh.H_k) * n_seqs <= plan.max_clusters));
    if (!one) {
        fused_three_launches(p, w, n_seqs, seq_offsets, n_tokens, qkv, z, a, b, conv_state, state, y, workspace, stream,
                             seq_slots, y_bf16, op);
        return;
    }
    if (split) {
        FusedArgs A{};
        A.sh = sh;
        A.offs = seq_offsets;
        A.qkv = qkv, A.z = z, A.a = a, A.b = b;
        A.conv_w = w.conv1d, A.ssm_a = w.ssm_a, A.dt_bias = w.dt_bias, A.norm = w.norm;
        A.conv_state = conv_state, A.state = state, A.y = y;
        A.slots = seq_slots;
        A.K = p.conv_kernel;
        A.C = sp.C;
        A.cols = sp.cols;
        A.n_tokens = n_tokens;
        A.eps = p.eps;
        A.q_scale = 1.0f / sqrtf(float(sh.d_k));
        A.settled = state_settled ? 1 : 0;
        // ALLOY_GDN_O_ASYNC=0: the o rows through a cluster barrier a token (A/B; the same bits).
        static const bool o_async = [] { const char* e = std::getenv("ALLOY_GDN_O_ASYNC"); return !e || std::atoi(e) != 0; }();
        A.o_async = o_async ? 1 : 0;
        detail::launch_cluster(op, kernel, dim3(unsigned(sh.H_v * sp.C), unsigned(n_seqs), 1), dim3(unsigned(sp.warps * 32), 1, 1), 0, static_cast<cudaStream_t>(stream),
                               unsigned(g * sp.C), A);
        check_launch(op);
        y_to_bf16(seq_offsets, n_seqs, n_tokens, int64_t(sh.H_v) * sh.d_v, y, y_bf16, stream, op);
        return;
    }
    FusedArgs A{};
    A.sh = sh;
    A.offs = seq_offsets;
    A.qkv = qkv, A.z = z, A.a = a, A.b = b;
    A.conv_w = w.conv1d, A.ssm_a = w.ssm_a, A.dt_bias = w.dt_bias, A.norm = w.norm;
    A.conv_state = conv_state, A.state = state, A.y = y;
    A.slots = seq_slots;
    A.K = p.conv_kernel;
    A.C = plan.C;
    A.cols = plan.cols;
    A.share = plan.share;
    A.ustride = plan.ustride;
    A.eps = p.eps;
    A.q_scale = 1.0f / sqrtf(float(sh.d_k));
    detail::launch_cluster(op, kernel, dim3(unsigned(sh.H_v * plan.C), unsigned(n_seqs), 1), dim3(unsigned(plan.warps * 32), 1, 1), plan.smem, static_cast<cudaStream_t>(stream),
                           unsigned(g * plan.C), A);
    check_launch(op);
    y_to_bf16(seq_offsets, n_seqs, n_tokens, int64_t(sh.H_v) * sh.d_v, y, y_bf16, stream, op);
}
}  // namespace alloy::cuda
