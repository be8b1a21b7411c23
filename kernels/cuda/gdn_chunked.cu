// Chunked gated delta rule (prefill) on CUDA (kernels/cuda/gdn.h), d_k = d_v = 128, chunk C = 64,
// bf16 tensor-core products (mma.sync m16n8k16) with fp32 accumulation and an fp32 state.
//
// Math: spec/GDN.md section 2, rearranged so that stage 1 produces only what does not depend on
// the value columns, and stage 2 never needs W = T (beta e^G K) or U = T (beta V):
//   Delta = T (beta V - beta e^G (K S0))      [C, d_v]   ((I + A) Delta = beta V - beta e^G K S0)
//   O     = e^G (Q S0) + (Q K^T .* M) Delta    [C, d_v]
//   S_C   = e^{G_C} S0 + (K .* e^{G_C - G})^T Delta
// Stage 1 (one block per (chunk, value head), all in parallel): G = cumsum g, K K^T and Q K^T
// (tensor cores), A = beta K K^T .* decay, T = (I + A)^-1 in fp32 (16 x 16 diagonal blocks by
// substitution, merged blockwise on tf32 tensor cores), written as a 17 KB record per (chunk,
// head): e^G, beta, e^{G_C - G} in fp32, T and QKM = Q K^T .* M in bf16. That record is the only intermediate that goes through HBM (fla
// writes A, w, u, v_new and a state per chunk, ~7x the minimal bytes).
// Stage 2 (one block per (sequence, value head, slice of BV value columns)): the scan over the
// sequence's chunks with the fp32 state slice S^T [BV, 128] in registers (mma accumulators);
// per chunk five products, every one with the small state-sized operand as the mma's M side so
// that the chunk tiles (K, Q, T, QKM, 56 KB) are read from shared memory once per block:
//   Y^T = S^T K^T, X^T = S^T Q^T          [BV, 64], K = 128
//   Delta'^T = (V^T - Y^T e^G) beta        (elementwise)
//   Delta^T  = Delta'^T T^T                [BV, 64], K = 64 (causal half)
//   O^T      = X^T e^G + Delta^T QKM^T     [BV, 64], K = 64 (causal half)
//   S^T      = e^{G_C} S^T + (Delta^T e^{G_C - G}) K    [BV, 128], K = 64
// The next chunks' tiles stream in with cp.async (2-3 buffers) while the current one computes.
// Splitting the value columns (BV = 16, 32 or 64) gives H_v x 128 / BV blocks, so 16 heads of
// one sequence still spread over the H200's 132 SMs; the launch gate picks the split with the
// fewest waves (gdn_delta_chunked_block_v). Each chunk step is latency-bound (~4k cycles for
// ~1.2k of mma and shared-memory work, clock64; bench/RESULTS.md): wgmma and clusters sharing a
// head's tiles across its v-slices are the next steps.
//
// Never exponentiates a positive number: exp(G_r - G_s) only for s <= r, e^{G_r}, e^{G_C - G_r}.
// Tail chunks are padded in shared memory with zero q, k, v and beta = 0, g = 0 (neither the
// state nor the real rows' outputs change); padded rows are not written.
#include <cuda.h>  // CUtensorMap (the TMA scan variant; encoded through the runtime's driver entry point)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "alloy/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/ref/gdn_common.h"

namespace alloy::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;        // chunk size
constexpr int kD = 128;       // d_k = d_v
constexpr int kThreads = 128; // 4 warps in both stages
// Shared-memory row pitches (elements), padded by 16 bytes so that the 8 row addresses of an
// ldmatrix land in distinct banks (272- and 144-byte rows: 4-word bank steps).
constexpr int kPD = kD + 8;
constexpr int kPC = kC + 8;

// Stage 1's output per (chunk, value head), read by stage 2 with 16-byte copies.
struct alignas(16) ChunkRecord {
    float eG[kC];         // e^{G_r}, G = cumulative log decay in the chunk (padded rows: G[n-1])
    float beta[kC];       // padded rows: 0
    float eGC[kC];        // e^{G_C - G_r}, C = the chunk's last row (exponentials here, not per scan block)
    bf16 T[kC * kC];      // (I + A)^-1, [r][s], unit lower triangular
    bf16 QKM[kC * kC];    // (Q K^T) .* M, [r][s], zero above the diagonal
    // log of a bound on the spectral norm of the chunk's state transition without inputs,
    // prod_r e^{g_r} (I - beta_r k_r k_r^T): sum_r g_r + log max(1, |1 - beta_r |k_r|^2|). A
    // segmented scan starts a segment from a zero state where these sum to <= -kSegLambda over
    // the chunks before it (the dropped part of the state is then below e^-kSegLambda of it).
    float bound;
    float pad_[3];
};

// ---- PTX wrappers ----

using detail::mbar_arrive;
using detail::mbar_arrive_expect_tx;
using detail::mbar_init;
using detail::mbar_test;
using detail::mbar_wait;
using detail::smem_u32;

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is not read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
// c += a b, m16n8k16, bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Pitch tag of a tile that a TMA copy wrote with 128-byte swizzling: 64-row halves of 64
// columns (128-byte rows), the 16-byte chunk c of row r at c ^ (r % 8), each half 1024-byte
// aligned. Padded tiles have pitches kPD / kPC instead (16 bytes of padding a row).
constexpr int kSwz = -1;
// Element (row, col) of a shared tile of pitch P (or kSwz); col a multiple of 8 for kSwz.
__device__ __forceinline__ int tile_off(int P, int row, int col) {
    if (P == kSwz) return ((col >> 6) << 12) + (row << 6) + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
    return row * P + col;
}
// Fragment addresses (lane-dependent) for ldmatrix.x4 on a row-major shared tile of pitch P:
// A operand (16 x 16 at rows m0, cols k0 of an [m][k] tile).
__device__ __forceinline__ const bf16* a_addr(const bf16* t, int P, int m0, int k0, int lane) {
    return t + tile_off(P, m0 + (lane & 15), k0 + ((lane >> 4) << 3));
}
// B operand of two n-tiles (n0, n0 + 8) x k16 from an [n][k] tile: regs {b0, b1} of n0, {b0, b1} of n0 + 8.
__device__ __forceinline__ const bf16* b_addr(const bf16* t, int P, int n0, int k0, int lane) {
    return t + tile_off(P, n0 + (lane & 7) + ((lane >> 4) << 3), k0 + (((lane >> 3) & 1) << 3));
}
// The same from a [k][n] tile, with ldmatrix.trans.
__device__ __forceinline__ const bf16* bt_addr(const bf16* t, int P, int k0, int n0, int lane) {
    return t + tile_off(P, k0 + (lane & 7) + (((lane >> 3) & 1) << 3), n0 + ((lane >> 4) << 3));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
// c += a b, m16n8k8, tf32 operands, fp32 accumulators.
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// C (16 x 16, as two n8 accumulator tiles) += A B for fp32 16 x 16 blocks in shared memory,
// A [m][k] and B [k][n] row-major with pitches lda, ldb.
__device__ __forceinline__ void mma16_tf32(float (&c)[2][4], const float* A, int lda, const float* B, int ldb,
                                           int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < 16; kk += 8) {
        const uint32_t a[4] = {to_tf32(A[g * lda + kk + t]), to_tf32(A[(g + 8) * lda + kk + t]),
                               to_tf32(A[g * lda + kk + t + 4]), to_tf32(A[(g + 8) * lda + kk + t + 4])};
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
            mma_tf32(c[nn], a, to_tf32(B[(kk + t) * ldb + 8 * nn + g]), to_tf32(B[(kk + t + 4) * ldb + 8 * nn + g]));
    }
}
__device__ __forceinline__ void store16(const float (&c)[2][4], float* D, int ld, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nn = 0; nn < 2; ++nn) {
        D[g * ld + 8 * nn + 2 * t] = c[nn][0];
        D[g * ld + 8 * nn + 2 * t + 1] = c[nn][1];
        D[(g + 8) * ld + 8 * nn + 2 * t] = c[nn][2];
        D[(g + 8) * ld + 8 * nn + 2 * t + 1] = c[nn][3];
    }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ int key_head(const ref::GdnShape& sh, int h) {
    return sh.tiled ? h % sh.H_k : h / (sh.H_v / sh.H_k);
}

// ---- start tables (one warp): cstart[s] = sum over s' < s of ceil((offs[s' + 1] - offs[s']) / 64)
// (each sequence's first chunk), cstart[n_seqs] = total; with seg_chunks > 0 also segstart[s] =
// the same sum of ceil(chunks of s' / seg_chunks) (each sequence's first segment). One launch for
// both: a separate segstart launch cost ~3 us of a ~120 us op (ncu, H100, T 4096).

__global__ void start_table_kernel(const int32_t* __restrict__ offs, int n_seqs, int32_t* __restrict__ cstart,
                                   int seg_chunks, int32_t* __restrict__ segstart, int* __restrict__ zero, int n_zero) {
    detail::pdl_entry();
    const int lane = threadIdx.x;
    for (int i = lane; i < n_zero; i += 32) zero[i] = 0;  // the segmented scan's final-state counters
    int carry = 0, seg_carry = 0;
    if (lane == 0) cstart[0] = 0;
    if (lane == 0 && seg_chunks > 0) segstart[0] = 0;
    for (int base = 0; base < n_seqs; base += 32) {
        const int s = base + lane;
        int n = s < n_seqs ? (offs[s + 1] - offs[s] + kC - 1) / kC : 0;
        int m = seg_chunks > 0 ? (n + seg_chunks - 1) / seg_chunks : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, n, o), y = __shfl_up_sync(0xffffffffu, m, o);
            if (lane >= o) n += x, m += y;
        }
        if (s < n_seqs) {
            cstart[s + 1] = carry + n;
            if (seg_chunks > 0) segstart[s + 1] = seg_carry + m;
        }
        carry += __shfl_sync(0xffffffffu, n, 31);
        seg_carry += __shfl_sync(0xffffffffu, m, 31);
    }
}

// ALLOY_GDN_FIN_COPY=1 only (else fin_wait): the segmented scan's final states (fin [n_seqs, H_v, 128, 128]) into the slots, after every
// block has read its sequence's first state; blockIdx = (value head, sequence, eighth of the
// state). One block a head took 11 us for H_v 16 (ncu, H100): 16 blocks cannot keep enough
// loads in flight.
constexpr int kFinParts = 8;
__global__ void segment_states_to_slots_kernel(const int32_t* __restrict__ offs, int H_v, const float* __restrict__ fin,
                                               float* __restrict__ state, const int32_t* __restrict__ slots) {
    detail::pdl_entry();
    const int h = blockIdx.x, seq = blockIdx.y;
    if (offs[seq] == offs[seq + 1]) return;  // an empty sequence keeps its state
    constexpr int kPart = kD * kD / 4 / kFinParts;  // float4s of a part
    const float4* src = reinterpret_cast<const float4*>(fin + ((size_t)seq * H_v + h) * kD * kD) + blockIdx.z * kPart;
    float4* dst = reinterpret_cast<float4*>(state + ((size_t)(slots ? slots[seq] : seq) * H_v + h) * kD * kD) +
                  blockIdx.z * kPart;
    for (int i = threadIdx.x; i < kPart; i += blockDim.x) dst[i] = src[i];
}

// ---- stage 1 ----

// The sequence of chunk c: the largest s with cstart[s] <= c (skips empty sequences).
__device__ __forceinline__ int chunk_seq(const int32_t* cstart, int n_seqs, int c) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cstart[mid] <= c) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// A chunk's 64 rows of 128 bf16 (row t0 + r at col + (t0 + r) stride) into a [64][kPD] tile, rows
// past n zero, by NTH threads (this one: rows r0 + NTH / 16 x it, 16 bytes at column cc). A
// whole chunk takes row pointers by increments without clamps (the tail path's 64-bit row
// products and predicates were most of the two-group state warps' copy instructions, SASS).
template <int NTH, int P = kPD>
__device__ __forceinline__ void copy_row_tile(bf16* dst, const bf16* col, size_t stride, int t0, int n, int r0, int cc) {
    if (n == kC) {
        const bf16* p = col + (size_t)(t0 + r0) * stride;
        const size_t step = (size_t)(NTH / 16) * stride;
#pragma unroll
        for (int it = 0; it < kC * 16 / NTH; ++it, p += step)
            cp_async16(dst + tile_off(P, r0 + it * (NTH / 16), cc), p, true);
    } else {
#pragma unroll
        for (int it = 0; it < kC * 16 / NTH; ++it) {
            const int r = r0 + it * (NTH / 16);
            cp_async16(dst + tile_off(P, r, cc), col + (size_t)(t0 + (r < n ? r : 0)) * stride, r < n);
        }
    }
}
// A stage-1 block's chunk (blockIdx = (chunk, value head)): its sequence's first token of the
// chunk t0 and its rows n (< 64 in a sequence's last chunk); false past the last chunk.
struct ChunkPos {
    int c, h, t0, n;
    __device__ bool init(const int32_t* offs, const int32_t* cstart, int n_seqs) {
        c = blockIdx.x, h = blockIdx.y;
        if (c >= cstart[n_seqs]) return false;
        const int seq = chunk_seq(cstart, n_seqs, c);
        t0 = offs[seq] + (c - cstart[seq]) * kC, n = min(kC, offs[seq + 1] - t0);
        return true;
    }
};

// Row pitch (floats) of A and T: 68 = 4 mod 32 banks. The mma fragments' 4-byte accesses (lane
// = 4 g + t at row g, column t, or row t, column g) and the A stores (row g, column 2 t) then
// meet at most 2-way bank conflicts; the former 65 had 4-way ones on all three (ncu, session 39:
// shared stores 3.3-way, loads 2.4-way, the L1 the busiest unit at 70%). Same bytes as before
// in the union (the K / Q tiles are larger), and even rows let the record read float2.
constexpr int kTP = kC + 4;
// Shared memory of stage 1: the K and Q tiles, then (aliased once the products are done) A and T
// in fp32. (Session 38, H200, ncu at T 16384: the merge scratch X moved into A's unused upper
// blocks, 35.6 KB, cost 4% (141 vs 135 us at H_v 16); Q K^T and K K^T in two passes to hold 32
// accumulators (72 registers, 6 blocks an SM instead of 5) another 7% (151 us); blocks ordered
// head-fastest so that value heads of a key head share L2: within 1%.)
struct alignas(16) Stage1Smem {
    union alignas(16) {
        struct alignas(16) {
            bf16 K[kC * kPD];
            bf16 Q[kC * kPD];
        } in;
        struct {
            float A[kC * kTP];
            float T[kC * kTP];
        } tri;
    } u;
    float X[3][16][17];  // off-diagonal merge scratch
    float G[kC], beta[kC];
    float kn[kC];  // |k_r|^2 (the diagonal of K K^T)
};

#ifdef ALLOY_GDN_EXP_CLOCK
// Timing experiment only: stage 1's cycles per phase summed over all blocks, for warps 0 and 3
// (lane 0); [w][0] counts the blocks.
__device__ unsigned long long g_s1clk[2][16];
#define S1CLK(i)                                                                                    \
    do {                                                                                            \
        if (lane == 0 && (w == 0 || w == 3)) {                                                      \
            const long long now = clock64();                                                        \
            atomicAdd(&g_s1clk[w == 3][i], i > 0 ? (unsigned long long)(now - s1_last) : 1ull);      \
            s1_last = now;                                                                          \
        }                                                                                           \
    } while (0)
#else
#define S1CLK(i) \
    do {         \
    } while (0)
#endif

__global__ void __launch_bounds__(kThreads) stage1_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                          const int32_t* __restrict__ cstart, int n_seqs,
                                                          const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                          const float* __restrict__ g,
                                                          const float* __restrict__ beta,
                                                          ChunkRecord* __restrict__ rec) {
    detail::pdl_entry();
    __shared__ Stage1Smem sm;
    const int c = blockIdx.x, h = blockIdx.y;
    if (c >= cstart[n_seqs]) return;
    const int seq = chunk_seq(cstart, n_seqs, c);
    const int t0 = offs[seq] + (c - cstart[seq]) * kC, n = min(kC, offs[seq + 1] - t0);
    const int kh = key_head(sh, h), H_k = sh.H_k, H_v = sh.H_v;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    ChunkRecord* R = rec + (size_t)c * H_v + h;
#ifdef ALLOY_GDN_EXP_CLOCK
    long long s1_last = 0;
#endif
    S1CLK(0);

    // g and beta of the chunk's rows into warp 0's registers before any tile copy is issued: loaded
    // after the copies, these 4-byte loads queued behind the wave's 32 KB a block of tile traffic
    // and warp 0 spent ~13k cycles of a ~31k-cycle block there while the other warps waited at the
    // barrier (stage-1 clocks, H100, T 4096).
    const int r0 = 2 * lane, r1 = 2 * lane + 1;
    float g0 = 0.0f, g1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
    if (w == 0) {
        if (r0 < n) g0 = g[(size_t)(t0 + r0) * H_v + h], b0 = beta[(size_t)(t0 + r0) * H_v + h];
        if (r1 < n) g1 = g[(size_t)(t0 + r1) * H_v + h], b1 = beta[(size_t)(t0 + r1) * H_v + h];
    }
    // Q and K rows of the chunk (zeros past n).
    {
        const int cc = (tid & 15) * 8;
        const bf16* kc = k + (size_t)kh * kD + cc;
        const bf16* qc = q + (size_t)kh * kD + cc;
#pragma unroll
        for (int it = 0; it < kC * 16 / kThreads; ++it) {
            const int r = (tid >> 4) + it * (kThreads / 16);
            const size_t off = (size_t)(t0 + (r < n ? r : 0)) * H_k * kD;
            cp_async16(sm.u.in.K + r * kPD + cc, kc + off, r < n);
            cp_async16(sm.u.in.Q + r * kPD + cc, qc + off, r < n);
        }
    }
    cp_async_commit();
    // G = inclusive cumsum of g in the chunk (warp 0, two values per lane), beta.
    if (w == 0) {
        float s = g0 + g1;
        for (int o = 1; o < 32; o <<= 1) {
            const float x = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += x;
        }
        const float excl = s - (g0 + g1);
        sm.G[r0] = excl + g0;
        sm.G[r1] = s;
        sm.beta[r0] = b0;
        sm.beta[r1] = b1;
    }
    S1CLK(1);
    cp_async_wait_all();
    __syncthreads();
    S1CLK(2);

    // K K^T and Q K^T for rows [16w, 16w + 16), columns s < 16w + 16 (the rest is masked).
    float kk[8][4], qk[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) kk[i][e] = qk[i][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t ak[4], aq[4];
        ldsm_x4(ak, a_addr(sm.u.in.K, kPD, 16 * w, 16 * ks, lane));
        ldsm_x4(aq, a_addr(sm.u.in.Q, kPD, 16 * w, 16 * ks, lane));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            if (np > w) break;
            uint32_t b[4];
            ldsm_x4(b, b_addr(sm.u.in.K, kPD, 16 * np, 16 * ks, lane));
            mma(kk[2 * np], ak, b[0], b[1]);
            mma(kk[2 * np + 1], ak, b[2], b[3]);
            mma(qk[2 * np], aq, b[0], b[1]);
            mma(qk[2 * np + 1], aq, b[2], b[3]);
        }
    }
    S1CLK(3);
    __syncthreads();  // K, Q dead: A and T reuse their space
    S1CLK(4);

    // A = beta_r (k_r . k_s) e^{G_r - G_s} (s < r) into shared fp32; QKM (s <= r) straight to the record.
    const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = 16 * w + gq + 8 * hh, s = 8 * nt + 2 * tq;
            float a2[2], m2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int ss = s + e;
                const bool in = nt <= 2 * w + 1;  // computed tile
                const float dec = ss <= r ? __expf(sm.G[r] - sm.G[ss]) : 0.0f;
                a2[e] = in && ss < r ? sm.beta[r] * kk[nt][2 * hh + e] * dec : 0.0f;
                m2[e] = in && ss <= r ? qk[nt][2 * hh + e] * dec : 0.0f;
                sm.u.tri.A[r * kTP + ss] = a2[e];
                if (ss == r) sm.kn[r] = kk[nt][2 * hh + e];
            }
            *reinterpret_cast<uint32_t*>(R->QKM + r * kC + s) = pack_bf16(m2[0], m2[1]);
        }
    }
    S1CLK(5);
    __syncthreads();
    S1CLK(6);

    // Diagonal 16 x 16 blocks of T by forward substitution: warp w, lane c (mod 16) owns column c.
    {
        const int cc = lane & 15, base = 16 * w;
        float col[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float v = r == cc ? 1.0f : 0.0f;
#pragma unroll
            for (int s = 0; s < r; ++s) v -= sm.u.tri.A[(base + r) * kTP + base + s] * col[s];
            col[r] = v;
            if (lane < 16) sm.u.tri.T[(base + r) * kTP + base + cc] = v;
        }
    }
    S1CLK(7);
    __syncthreads();
    S1CLK(8);
    // Off-diagonal blocks, by distance d from the diagonal: T_ij = -T_ii sum_{j<=m<i} A_im T_mj.
    // Off-diagonal blocks, by distance d from the diagonal, one warp per block (i, j = i - d):
    // X = sum_{j<=m<i} A_im T_mj, then T_ij = -T_ii X, on tf32 tensor cores (10-bit mantissas,
    // finer than the bf16 T is stored in). Scalar fp32 loops here kept the L1 88% busy (ncu).
    for (int d = 1; d < 4; ++d) {
        if (w < 4 - d) {
            const int j = w, i = w + d;
            float acc[2][4] = {};
            for (int m = j; m < i; ++m)
                mma16_tf32(acc, sm.u.tri.A + 16 * i * kTP + 16 * m, kTP,
                           sm.u.tri.T + 16 * m * kTP + 16 * j, kTP, lane);
            store16(acc, &sm.X[w][0][0], 17, lane);
            __syncwarp();
            float t[2][4] = {};
            mma16_tf32(t, sm.u.tri.T + 16 * i * kTP + 16 * i, kTP, &sm.X[w][0][0], 17, lane);
#pragma unroll
            for (int nn = 0; nn < 2; ++nn)
#pragma unroll
                for (int e = 0; e < 4; ++e) t[nn][e] = -t[nn][e];
            store16(t, sm.u.tri.T + 16 * i * kTP + 16 * j, kTP, lane);
        }
        __syncthreads();
    }
    S1CLK(9);
    // The record: T in bf16 (zero above the diagonal blocks), G, beta.
    for (int idx = tid; idx < kC * kC / 2; idx += kThreads) {
        const int r = idx >> 5, s = (idx & 31) * 2;
        const bool in = (s >> 4) <= (r >> 4);
        const float2 tv = in ? *reinterpret_cast<const float2*>(&sm.u.tri.T[r * kTP + s]) : make_float2(0.0f, 0.0f);
        *reinterpret_cast<uint32_t*>(R->T + r * kC + s) = pack_bf16(tv.x, tv.y);
    }
    S1CLK(10);
    if (tid < kC) {
        R->eG[tid] = expf(sm.G[tid]);
        R->beta[tid] = sm.beta[tid];
        R->eGC[tid] = expf(sm.G[kC - 1] - sm.G[tid]);
    }
    if (w == 0) {  // the transition bound (padded rows: g = beta = 0, no term)
        float lg = 0.0f;
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int r = lane + 32 * u;
            lg += logf(fmaxf(1.0f, fabsf(1.0f - sm.beta[r] * sm.kn[r])));
        }
        for (int o = 16; o > 0; o >>= 1) lg += __shfl_xor_sync(0xffffffffu, lg, o);
        if (lane == 0) R->bound = sm.G[kC - 1] + lg;
    }
    S1CLK(11);
}

// ---- stage 2 ----

#ifdef ALLOY_GDN_EXP_CLOCK
// Timing experiment only: cycles per phase of the scan, summed over the steps of block (0, 0, 0),
// for the first and the last warp (lane 0).
__device__ unsigned long long g_clk[2][16];
#define CLK(i)                                                                                     \
    do {                                                                                           \
        if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && lane == 0 && (w == 0 || w == scan_warps<BV>() - 1)) { \
            const long long now = clock64();                                                       \
            if (i > 0) g_clk[w != 0][i] += now - clk_last;                                         \
            clk_last = now;                                                                        \
        }                                                                                          \
    } while (0)
// The two-group scan: warp 0 (state group) and warp 4 (output group).
#define PCLK(i)                                                                                          \
    do {                                                                                                 \
        if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && lane == 0 && (w == 0 || w == 4)) { \
            const long long now = clock64();                                                             \
            if (i > 0) g_clk[w != 0][i] += now - clk_last;                                               \
            clk_last = now;                                                                              \
        }                                                                                                \
    } while (0)
// The chain scan: state warp 0 and output warp 2 NC (chain 0's first of each).
#define CCLK(i)                                                                                          \
    do {                                                                                                 \
        if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && lane == 0 && (w == 0 || w == 2 * NC)) { \
            const long long now = clock64();                                                             \
            if (i > 0) g_clk[w != 0][i] += now - clk_last;                                               \
            clk_last = now;                                                                              \
        }                                                                                                \
    } while (0)
#else
#define CLK(i) \
    do {       \
    } while (0)
#define PCLK(i) CLK(i)
#define CCLK(i) CLK(i)
#endif

// 8 warps: warp w owns rows r in [8 w, 8 w + 8) of the chunk for Y, X, Delta and O, and state
// columns i in [16 w, 16 w + 16) for the update. (4 warps, one per scheduler, left each
// chunk step latency-bound: 3.7k cycles per step at BV = 16, H_v = 16, ncu.)
// Warps per scan block: 4 for BV <= 32, 8 for BV = 64 (H200, same build: 4 warps ran the
// 16- and 32-column steps 5-6% faster than 8, and the 64-column one 15% slower). Warp w owns
// chunk rows [kC / NW w, kC / NW (w + 1)) for Y, X, Delta and O, and state columns
// [kD / NW w, kD / NW (w + 1)) for the update.
template <int BV>
__host__ __device__ constexpr int scan_warps() { return BV <= 32 ? 4 : 8; }
// Chunk tiles in flight: chunk c + nbuf - 1 is requested while chunk c computes. Three buffers
// while they fit (BV <= 32: 208 KB of shared memory at most), else two.
template <int BV>
__host__ __device__ constexpr int nbuf() { return BV <= 32 ? 3 : 2; }

template <int BV>
struct alignas(16) Stage2Buf {
    bf16 K[kC * kPD];
    bf16 Q[kC * kPD];
    bf16 T[kC * kPC];
    bf16 M[kC * kPC];
    bf16 V[kC * (BV + 8)];
    float eG[kC], beta[kC], eGC[kC];
};
template <int BV>
struct alignas(16) Stage2Smem {
    Stage2Buf<BV> buf[nbuf<BV>()];
    bf16 Sb[BV * kPD];   // S^T in bf16, [j][i]
    bf16 Dp[BV * kPC];   // Delta'^T, [j][s]
    bf16 Dm[BV * kPC];   // Delta^T
    bf16 Dt[BV * kPC];   // Delta^T .* e^{G_C - G}
    float O[kC * (BV + 4)];  // O of the previous chunk, [r][j], for coalesced stores
};

__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p))
                 : "memory");
}
// B fragments of this warp's kNR n-tiles (rows n0.. of an [n][k] tile) for one k16 step.
template <int N>
__device__ __forceinline__ void load_b_rows(uint32_t (&r)[N], const bf16* t, int P, int n0, int k0, int lane) {
    if constexpr (N == 4) {
        ldsm_x4(r, b_addr(t, P, n0, k0, lane));
    } else {
        ldsm_x2(r, t + tile_off(P, n0 + (lane & 7), k0 + (((lane >> 3) & 1) << 3)));
    }
}

// ---- pieces of a chunk step shared by the one- and two-group scans (one code, so one set of bits) ----
// Warps own chunk rows [r_w, r_w + 8 kNR) for Y, Delta and O and state columns [i_w, i_w + 8 kNI)
// for the update; S^T[j][i] sits in the mma accumulator layout, j = 16 mt + gq (+8),
// i = i_w + 8 nt + 2 tq (+1).

// This warp's S^T from / to the fp32 state [d_v][d_k] (rows from v0).
template <int MT, int kNI>
__device__ __forceinline__ void load_state(float (&S)[MT][kNI][4], const float* Sg, int v0, int i_w, int gq, int tq) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const float2 x = *reinterpret_cast<const float2*>(Sg + (size_t)(v0 + 16 * mt + gq + 8 * hh) * kD + i_w +
                                                                  8 * nt + 2 * tq);
                S[mt][nt][2 * hh] = x.x;
                S[mt][nt][2 * hh + 1] = x.y;
            }
}
template <int MT, int kNI>
__device__ __forceinline__ void store_state(const float (&S)[MT][kNI][4], float* Sg, int v0, int i_w, int gq, int tq) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                *reinterpret_cast<float2*>(Sg + (size_t)(v0 + 16 * mt + gq + 8 * hh) * kD + i_w + 8 * nt + 2 * tq) =
                    make_float2(S[mt][nt][2 * hh], S[mt][nt][2 * hh + 1]);
}
// This warp's columns of S^T into Sb in bf16 (the A operand of Y and X).
template <int MT, int kNI>
__device__ __forceinline__ void state_to_bf16(bf16* Sb, const float (&S)[MT][kNI][4], int i_w, int gq, int tq) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                *reinterpret_cast<uint32_t*>(Sb + (16 * mt + gq + 8 * hh) * kPD + i_w + 8 * nt + 2 * tq) =
                    pack_bf16(S[mt][nt][2 * hh], S[mt][nt][2 * hh + 1]);
}
// This warp's rows' scalars (e^G, beta, e^{G_C - G}) and V^T values, read early so that their
// latency hides under the products.
template <int BV, int MT, int kNR, int VP = BV + 8>
__device__ __forceinline__ void row_scalars(float (&rv)[kNR][MT][2][2], float (&re)[kNR][2], float (&rb)[kNR][2],
                                            float (&rf)[kNR][2], const float* eG, const float* beta, const float* eGC,
                                            const bf16* V, int r_w, int gq, int tq) {
#pragma unroll
    for (int nt = 0; nt < kNR; ++nt) {
        const int r = r_w + 8 * nt + 2 * tq;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            re[nt][e] = eG[r + e];
            rb[nt][e] = beta[r + e];
            rf[nt][e] = eGC[r + e];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) rv[nt][mt][hh][e] = __bfloat162float(V[(r + e) * VP + 16 * mt + gq + 8 * hh]);
        }
    }
}
// Delta'^T = (V^T - Y^T e^G) beta into Dp (Y^T = y + y2: even and odd k-steps).
template <int MT, int kNR>
__device__ __forceinline__ void delta_prime(bf16* Dp, const float (&y)[MT][kNR][4], const float (&y2)[MT][kNR][4],
                                            const float (&rv)[kNR][MT][2][2], const float (&re)[kNR][2],
                                            const float (&rb)[kNR][2], int r_w, int gq, int tq) {
#pragma unroll
    for (int nt = 0; nt < kNR; ++nt) {
        const int r = r_w + 8 * nt + 2 * tq;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int j = 16 * mt + gq + 8 * hh;
                float dp[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float yy = y[mt][nt][2 * hh + e] + y2[mt][nt][2 * hh + e];
                    dp[e] = rb[nt][e] * (rv[nt][mt][hh][e] - re[nt][e] * yy);
                }
                *reinterpret_cast<uint32_t*>(Dp + j * kPC + r) = pack_bf16(dp[0], dp[1]);
            }
    }
}
// acc^T += A^T [BV][64] B^T for this warp's rows r (B [64 r][64 s], zero for s > r: only the
// k16 steps s <= r_w + 8 kNR - 1 run).
template <int MT, int kNR, int PB = kPC>
__device__ __forceinline__ void causal_products(float (&acc)[MT][kNR][4], const bf16* A, const bf16* B, int r_w,
                                                int k_causal, int lane) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        if (ks >= k_causal) break;
        uint32_t a[MT][4], b[2 * kNR];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_addr(A, kPC, 16 * mt, 16 * ks, lane));
        load_b_rows(b, B, PB, r_w, 16 * ks, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNR; ++nt) mma(acc[mt][nt], a[mt], b[2 * nt], b[2 * nt + 1]);
    }
}
// Delta^T = Delta'^T T^T (s <= r) into Dm, and Delta^T .* e^{G_C - G} into Dt.
template <int MT, int kNR, int PT = kPC>
__device__ __forceinline__ void delta_products(bf16* Dm, bf16* Dt, const bf16* Dp, const bf16* T, const float (&rf)[kNR][2],
                                               int r_w, int k_causal, int lane, int gq, int tq) {
    float dl[MT][kNR][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dl[mt][nt][e] = 0.0f;
    causal_products<MT, kNR, PT>(dl, Dp, T, r_w, k_causal, lane);
#pragma unroll
    for (int nt = 0; nt < kNR; ++nt) {
        const int r = r_w + 8 * nt + 2 * tq;
        const float f0 = rf[nt][0], f1 = rf[nt][1];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int j = 16 * mt + gq + 8 * hh;
                const float d0 = dl[mt][nt][2 * hh], d1 = dl[mt][nt][2 * hh + 1];
                *reinterpret_cast<uint32_t*>(Dm + j * kPC + r) = pack_bf16(d0, d1);
                *reinterpret_cast<uint32_t*>(Dt + j * kPC + r) = pack_bf16(d0 * f0, d1 * f1);
            }
    }
}
// S^T = e^{G_C} S^T + Dt K for this warp's state columns (odd k-steps into a second accumulator:
// two dependent chains of 2, not one of 4).
template <int MT, int kNI, int PK = kPD>
__device__ __forceinline__ void state_update(float (&S)[MT][kNI][4], float eGC, const bf16* Dt, const bf16* K, int i_w,
                                             int lane) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[mt][nt][e] *= eGC;
    float S2[MT][kNI][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) S2[mt][nt][e] = 0.0f;
    uint32_t a[4][MT][4], bk[4][kNI / 2][4];
    auto load = [&](int ks) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[ks][mt], a_addr(Dt, kPC, 16 * mt, 16 * ks, lane));
#pragma unroll
        for (int p = 0; p < kNI / 2; ++p) ldsm_x4_t(bk[ks][p], bt_addr(K, PK, 16 * ks, i_w + 16 * p, lane));
    };
    load(0);
    load(1);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
        if (ks + 2 < 4) load(ks + 2);
#pragma unroll
        for (int p = 0; p < kNI / 2; ++p)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma(ks & 1 ? S2[mt][2 * p] : S[mt][2 * p], a[ks][mt], bk[ks][p][0], bk[ks][p][1]);
                mma(ks & 1 ? S2[mt][2 * p + 1] : S[mt][2 * p + 1], a[ks][mt], bk[ks][p][2], bk[ks][p][3]);
            }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[mt][nt][e] += S2[mt][nt][e];
}
// A scan block's sequence (blockIdx = (value slice, value head, sequence)): its tokens
// [t_begin, t_end), its chunks [c_first, c_last) and its fp32 state [d_v][d_k] (row j = S^T[j];
// sequence seq's state is slot slots[seq], nullptr: slot seq).
// ---- the segmented scan (two-group kernel) ----
//
// A sequence's chunks cut into segments of `chunks` chunks, each scanned by its own blocks at
// once (the chain per block T / (64 P) steps instead of T / 64). A segment's blocks start the
// state `warmup` chunks before it from zero, where the bounds of those chunks' transitions sum
// to <= -kSegLambda (ChunkRecord::bound): the true state there reaches the segment's start
// scaled by at most e^-20 (~2e-9) of its norm, far under the bf16 rounding of the products
// (~4e-3); where the gates decay too slowly for that, the warmup reaches back to the sequence's
// first chunk and starts from the sequence's state (exact: the unsegmented kernel's bits).
// FlashQLA's intra-card context parallelism starts segments the same way (its threshold e^-10,
// with a transition-matrix fallback instead of the longer warmup).
constexpr float kSegLambda = 20.0f;
struct ScanSegments {
    const int32_t* segstart;  // [n_seqs + 1]: sequence s's first segment (nullptr: one block a sequence)
    int n_seqs, chunks;       // chunks a segment
    float* fin;               // [n_seqs, H_v, 128, 128]: final states (segmented, copied), else nullptr
    int* fin_cnt;             // [n_seqs, H_v, value slices]: final states straight to the slots (fin_arrive / fin_wait)
};
// Segmented scan, final states straight into the slots (fin_cnt; ALLOY_GDN_FIN_COPY=1: through fin
// and segment_states_to_slots_kernel, one more launch: the op 0.4-1% slower at T 4096-16384 H_v 16,
// H100, session 48; the same bits): every state warp
// of every segment block of (sequence, value head, value slice) counts itself once its first state
// is in registers (read from the slot or zero); the last segment's state warps store the final state
// into the slot once the count reaches segments x state warps, so no block can still be reading
// the old state there. Blocks of a sequence's earlier segments have lower indices (dispatched
// first) and never wait for the last one, so the wait at the end of the last one's chain ends.
__device__ __forceinline__ void fin_arrive(int* cnt, int lane) {
    __syncwarp();
    if (lane == 0) {
        __threadfence();  // this warp's state loads before the count
        atomicAdd(cnt, 1);
    }
}
__device__ __forceinline__ void fin_wait(const int* cnt, int target, int lane) {
    if (lane == 0) {
        int v;
        for (;;) {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(cnt) : "memory");
            if (v >= target) break;
            __nanosleep(128);
        }
    }
    __syncwarp();
}
__device__ __forceinline__ int* fin_counter(const ScanSegments& sg, int seq, int H_v, int h) {
    return sg.fin_cnt + ((size_t)seq * H_v + h) * gridDim.x + blockIdx.x;
}
__device__ __forceinline__ int fin_segments(const ScanSegments& sg, int seq) {
    return sg.segstart[seq + 1] - sg.segstart[seq];
}
// The chunk (in its sequence) where segment chunks [i_lo, ...) of value head h starts its state
// (one warp; 0 = the sequence's first chunk, from the sequence's state).
__device__ __forceinline__ int segment_warmup_start(const ChunkRecord* rec, int c_first, int i_lo, int H_v, int h,
                                                    int lane) {
    float acc = 0.0f;
    for (int base = i_lo - 1; base >= 0; base -= 32) {
        const int i = base - lane;  // lane l: chunk base - l; the sum over chunks [i, i_lo)
        float s = i >= 0 ? rec[(size_t)(c_first + i) * H_v + h].bound : 0.0f;
        for (int o = 1; o < 32; o <<= 1) {
            const float x = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += x;
        }
        s += acc;
        const unsigned hit = __ballot_sync(0xffffffffu, i >= 0 && s <= -kSegLambda);
        if (hit) return base - (__ffs(hit) - 1);
        acc = __shfl_sync(0xffffffffu, s, 31);
    }
    return 0;
}

// segment_warmup_start by warp 0, to every thread of the block through `slot` (shared memory;
// a block barrier, which also publishes the mbarrier initialisations before it).
__device__ __forceinline__ int block_warmup_start(int* slot, const ChunkRecord* rec, int c_first, int i_lo, int H_v, int h,
                                                  int w, int lane) {
    if (w == 0) {
        const int i_ws = segment_warmup_start(rec, c_first, i_lo, H_v, h, lane);
        if (lane == 0) *slot = i_ws;
    }
    __syncthreads();
    return *slot;
}
// A segmented-scan block's place (blockIdx.z: a sequence, or with sg.segstart a segment slot):
// its sequence, tokens [t_begin, t_end), first chunk and chunk count, and its chunks [i_lo, i_hi)
// within the sequence. valid = false for a slot past the last segment or an empty sequence (the
// block returns).
struct SegmentBlock {
    int seq, i_lo, i_hi, t_begin, t_end, c_first, n_chunks;
    bool valid;
};
__device__ __forceinline__ SegmentBlock segment_block(const ScanSegments& sg, const int32_t* offs, const int32_t* cstart) {
    SegmentBlock b{int(blockIdx.z), 0, 0, 0, 0, 0, 0, false};
    if (sg.segstart) {
        if ((int)blockIdx.z >= sg.segstart[sg.n_seqs]) return b;
        b.seq = chunk_seq(sg.segstart, sg.n_seqs, blockIdx.z);
        b.i_lo = (blockIdx.z - sg.segstart[b.seq]) * sg.chunks;
    }
    b.t_begin = offs[b.seq], b.t_end = offs[b.seq + 1];
    b.c_first = cstart[b.seq], b.n_chunks = cstart[b.seq + 1] - b.c_first;
    b.i_hi = sg.segstart ? min(b.n_chunks, b.i_lo + sg.chunks) : b.n_chunks;
    b.valid = b.t_begin != b.t_end;
    return b;
}

struct ScanSeq {
    int vs, h, seq, t_begin, t_end, c_first, c_last;
    float* state;
    __device__ ScanSeq(const ref::GdnShape& sh, const int32_t* offs, const int32_t* cstart, float* states,
                       const int32_t* slots)
        : vs(blockIdx.x), h(blockIdx.y), seq(blockIdx.z), t_begin(offs[seq]), t_end(offs[seq + 1]),
          c_first(cstart[seq]), c_last(cstart[seq + 1]),
          state(states + ((size_t)(slots ? slots[seq] : seq) * sh.H_v + h) * kD * kD) {}
};

// The chunk tiles of one scan block (K, Q [64][128], V [64][BV], T, QKM and the record's
// scalars) into a Stage2Buf with cp.async by NTH threads. The per-thread offsets are fixed for
// the whole scan (every warp issues the copies every step: generic strided loops with 64-bit
// index math were ~half of the scan loop's instructions, SASS). Rows past the chunk's end are
// zero-filled.
template <int BV, int NTH>
struct ChunkTiles {
    static constexpr int kVPerRow = BV / 8, kVItems = kC * kVPerRow;  // V: BV / 8 x 16 B per row
    int tid, qk_cc, qk_r0, v_r, v_cc, rec_cc, rec_r0;
    int t_begin, t_end, c_first, H_v, h;
    size_t qk_stride, v_stride;
    const bf16 *k_col, *q_col, *v_col;
    const ChunkRecord* rec;
    __device__ ChunkTiles(const ref::GdnShape& sh, int t_begin_, int t_end_, int c_first_, int h_, int v0,
                          const bf16* q, const bf16* k, const bf16* v, const ChunkRecord* rec_, int tid_)
        : tid(tid_), qk_cc((tid_ & 15) * 8), qk_r0(tid_ >> 4), v_r(tid_ / kVPerRow), v_cc((tid_ % kVPerRow) * 8),
          rec_cc((tid_ & 7) * 8), rec_r0(tid_ >> 3), t_begin(t_begin_), t_end(t_end_), c_first(c_first_),
          H_v(sh.H_v), h(h_), qk_stride((size_t)sh.H_k * kD), v_stride((size_t)sh.H_v * kD), rec(rec_) {
        const int kh = key_head(sh, h_);
        k_col = k + (size_t)kh * kD + qk_cc;  // K, Q: 16 x 16 B per row
        q_col = q + (size_t)kh * kD + qk_cc;
        v_col = v + (size_t)h_ * kD + v0 + v_cc;
    }
    // Chunk c (a global chunk index: its record is rec[c H_v + h]) into B.
    __device__ __forceinline__ void load(int c, Stage2Buf<BV>& B) const {
        const int t0 = t_begin + (c - c_first) * kC, n = min(kC, t_end - t0);
        copy_row_tile<NTH>(B.K, k_col, qk_stride, t0, n, qk_r0, qk_cc);
        copy_row_tile<NTH>(B.Q, q_col, qk_stride, t0, n, qk_r0, qk_cc);
#pragma unroll
        for (int it = 0; it < (kVItems + NTH - 1) / NTH; ++it) {
            const int r = v_r + it * (NTH / kVPerRow);
            if (kVItems >= NTH || tid < kVItems)
                cp_async16(B.V + r * (BV + 8) + v_cc, v_col + (size_t)(t0 + (r < n ? r : 0)) * v_stride, r < n);
        }
        const ChunkRecord* R = rec + (size_t)c * H_v + h;
#pragma unroll
        for (int it = 0; it < kC * 8 / NTH; ++it) {  // T, QKM: 8 x 16 B per row
            const int r = rec_r0 + it * (NTH / 8);
            cp_async16(B.T + r * kPC + rec_cc, R->T + r * kC + rec_cc, true);
            cp_async16(B.M + r * kPC + rec_cc, R->QKM + r * kC + rec_cc, true);
        }
        static_assert(sizeof(B.eG) * 3 == 48 * 16 && offsetof(ChunkRecord, eGC) == 2 * sizeof(B.eG), "record head");
        for (int i = tid; i < 48; i += NTH) cp_async16(B.eG + 4 * i, R->eG + 4 * i, true);  // eG, beta, eGC
    }
};
// This warp's O^T rows into the O tile [r][j].
template <int BV, int MT, int kNR>
__device__ __forceinline__ void o_to_tile(float* O, const float (&x)[MT][kNR][4], int r_w, int gq, int tq) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int j = 16 * mt + gq + 8 * (e >> 1), r = r_w + 8 * nt + 2 * tq + (e & 1);
                O[r * (BV + 4) + j] = x[mt][nt][e];
            }
}
// The O tile's rows < n to `out` (16-byte stores, NT threads; t = this thread's index among them).
template <int BV, int NT, typename OutT>
__device__ __forceinline__ void flush_out_tile(OutT* out, const float* O, size_t v_stride, int h, int v0, int t0, int n,
                                               int t) {
    constexpr int kVec = 16 / sizeof(OutT), kPerRow = BV / kVec, kItems = kC * kPerRow;
#pragma unroll
    for (int it = 0; it < (kItems + NT - 1) / NT; ++it) {
        const int idx = t + it * NT, r = idx / kPerRow, cc = (idx % kPerRow) * kVec;
        if (idx >= kItems || r >= n) break;
        OutT* dst = out + (size_t)(t0 + r) * v_stride + (size_t)h * kD + v0 + cc;
        const float4 lo = *reinterpret_cast<const float4*>(O + r * (BV + 4) + cc);
        if constexpr (sizeof(OutT) == 4) {
            *reinterpret_cast<float4*>(dst) = lo;
        } else {
            const float4 hi = *reinterpret_cast<const float4*>(O + r * (BV + 4) + cc + 4);
            *reinterpret_cast<uint4*>(dst) =
                make_uint4(pack_bf16(lo.x, lo.y), pack_bf16(lo.z, lo.w), pack_bf16(hi.x, hi.y), pack_bf16(hi.z, hi.w));
        }
    }
}

template <int BV, typename OutT>
__global__ void __launch_bounds__(32 * scan_warps<BV>(), 1) stage2_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                        const int32_t* __restrict__ cstart,
                                                        const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                        const bf16* __restrict__ v,
                                                        const ChunkRecord* __restrict__ rec,
                                                        float* __restrict__ state, OutT* __restrict__ out,
                                                        const int32_t* __restrict__ slots) {
    detail::pdl_entry();
    constexpr int MT = BV / 16;  // m-tiles of value columns
    constexpr int kNBuf = nbuf<BV>();
    constexpr int kW2 = scan_warps<BV>(), kT2 = 32 * kW2;
    constexpr int kRW = kC / kW2, kNR = kRW / 8;  // chunk rows per warp, their n8 tiles
    constexpr int kIW = kD / kW2, kNI = kIW / 8;  // state columns per warp, their n8 tiles
    static_assert(kNR == 1 || kNR == 2, "row tiles per warp");
    static_assert(kNI % 2 == 0, "state tiles per warp come in pairs");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Stage2Smem<BV>& sm = *reinterpret_cast<Stage2Smem<BV>*>(smem_raw);
    const ScanSeq sq(sh, offs, cstart, state, slots);
    if (sq.t_begin == sq.t_end) return;
    const int h = sq.h, t_begin = sq.t_begin, t_end = sq.t_end, c_first = sq.c_first, c_last = sq.c_last;
    const int H_v = sh.H_v, v0 = sq.vs * BV;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int r_w = kRW * w, i_w = kIW * w;  // this warp's first chunk row and state column
    float* Sg = sq.state;

    // S^T[j][i], j = 16 mt + gq (+8), i = i_w + 8 nt + 2 tq (+1): the accumulator layout.
    float S[MT][kNI][4];
    load_state(S, Sg, v0, i_w, gq, tq);

    const ChunkTiles<BV, kT2> tiles(sh, t_begin, t_end, c_first, h, v0, q, k, v, rec, tid);
    auto load_chunk = [&](int c, int b) { tiles.load(c, sm.buf[b]); };
    const size_t v_stride = (size_t)H_v * kD;
    // O of the chunk before, from shared memory to `out`.
    auto flush_out = [&](int t0, int n) { flush_out_tile<BV, kT2>(out, sm.O, v_stride, h, v0, t0, n, tid); };

    // Every step commits one group (empty past the end), so "all but the newest kNBuf - 2"
    // is always chunk c's.
    for (int p = 0; p < kNBuf - 1; ++p) {
        if (c_first + p < c_last) load_chunk(c_first + p, p);
        cp_async_commit();
    }
    int prev_t0 = 0, prev_n = 0;
#ifdef ALLOY_GDN_EXP_CLOCK
    long long clk_last = 0;
#endif
    // k16 steps of the causal products for this warp's rows: s <= r < r_w + kRW.
    const int k_causal = (r_w + kRW - 1) / 16 + 1;
    for (int c = c_first; c < c_last; ++c) {
        const int b = (c - c_first) % kNBuf;
        const Stage2Buf<BV>& B = sm.buf[b];
        const int t0 = t_begin + (c - c_first) * kC, n = min(kC, t_end - t0);
        CLK(0);
        // (1) this warp's columns of S^T to shared memory in bf16 (the A operand of Y and X).
        state_to_bf16(sm.Sb, S, i_w, gq, tq);
        cp_async_wait<kNBuf - 2>();
        __syncthreads();  // #1: chunk c's tiles and Sb visible; everyone is done with chunk c - 1
        CLK(1);
        // This warp's rows' scalars, read now so that their latency hides under the products.
        float rv[kNR][MT][2][2], re[kNR][2], rb[kNR][2], rf[kNR][2];
        row_scalars<BV>(rv, re, rb, rf, B.eG, B.beta, B.eGC, B.V, r_w, gq, tq);
        const float eGC = B.eG[kC - 1];

        // (2) Y^T, X^T for this warp's rows. Fragments two k-steps ahead of the products (the
        // asm statements keep program order, so ldmatrix latency hides under earlier mma).
        // Even and odd k-steps accumulate apart (two dependent mma chains of 4, not one of 8).
        float y[MT][kNR][4], x[MT][kNR][4], y2[MT][kNR][4], x2[MT][kNR][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) y[mt][nt][e] = x[mt][nt][e] = y2[mt][nt][e] = x2[mt][nt][e] = 0.0f;
        {
            uint32_t a[kD / 16][MT][4], bk[kD / 16][2 * kNR], bq[kD / 16][2 * kNR];
            auto load = [&](int ks) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[ks][mt], a_addr(sm.Sb, kPD, 16 * mt, 16 * ks, lane));
                load_b_rows(bk[ks], B.K, kPD, r_w, 16 * ks, lane);
                load_b_rows(bq[ks], B.Q, kPD, r_w, 16 * ks, lane);
            };
            load(0);
            load(1);
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks) {
                if (ks + 2 < kD / 16) load(ks + 2);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < kNR; ++nt) {
                        mma(ks & 1 ? y2[mt][nt] : y[mt][nt], a[ks][mt], bk[ks][2 * nt], bk[ks][2 * nt + 1]);
                        mma(ks & 1 ? x2[mt][nt] : x[mt][nt], a[ks][mt], bq[ks][2 * nt], bq[ks][2 * nt + 1]);
                    }
            }
        }
        CLK(2);
        // The next chunk's copies and the last chunk's output, issued while the products run.
        if (c + kNBuf - 1 < c_last) load_chunk(c + kNBuf - 1, (b + kNBuf - 1) % kNBuf);
        cp_async_commit();
        if (prev_n > 0) flush_out(prev_t0, prev_n);
        // (3) Delta'^T = (V^T - Y^T e^G) beta to shared; X^T e^G stays as the start of O^T.
        delta_prime(sm.Dp, y, y2, rv, re, rb, r_w, gq, tq);
#pragma unroll
        for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) x[mt][nt][e] = (x[mt][nt][e] + x2[mt][nt][e]) * re[nt][e & 1];
        CLK(3);
        __syncthreads();  // #2
        CLK(4);
        // (4) Delta^T = Delta'^T T^T (s <= r).
        delta_products<MT, kNR>(sm.Dm, sm.Dt, sm.Dp, B.T, rf, r_w, k_causal, lane, gq, tq);
        CLK(5);
        __syncthreads();  // #3
        CLK(6);
        // (6, issued first: the next chunk waits on it, not on O) S^T = e^{G_C} S^T + Dt K for this warp's state columns.
        state_update(S, eGC, sm.Dt, B.K, i_w, lane);
        // (5) O^T += Delta^T QKM^T, then into the shared O tile (written out after the next #1).
        causal_products(x, sm.Dm, B.M, r_w, k_causal, lane);
        o_to_tile<BV>(sm.O, x, r_w, gq, tq);
        CLK(7);
        prev_t0 = t0;
        prev_n = n;
    }
    __syncthreads();
    flush_out(prev_t0, prev_n);
    store_state(S, Sg, v0, i_w, gq, tq);
}

// ---- stage 2, two warp groups ----
//
// The one-group scan issues every product of a chunk step from the same 4 warps, so the
// output's products (X^T = S^T Q^T, O^T += Delta^T QKM^T: 24 of a warp's 64 mma) and the output
// stores sit in the chain from one chunk's state to the next. Here warps 0-3 (the state group)
// run only that chain: Y^T, Delta'^T, Delta^T and the state update; warps 4-7 (the output
// group) compute each chunk's O^T from the bf16 state S^T and Delta^T that the state group
// leaves in shared memory, double-buffered, while the state group goes on with the next chunk.
// The hand-over is three pairs of mbarriers (state written, Delta written, both read). Each
// group streams its own tiles (K, T, V and the row scalars; Q, QKM and e^G) with cp.async into
// its own ring. Every output element is the same mma sequence as in the one-group kernel (rows
// of 16 per warp, the same even / odd k-step accumulators): the two kernels give the same bits.
// (The mbarrier wrappers: kernels/cuda/mbarrier.cuh.)
// `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared by the copy
// engine, counted on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
// A 2- / 3-d box of a tensor map (TMA) global -> shared at element coordinates c0 (fastest), c1
// (, c2), counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
        : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
            smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
        : "memory");
}
// A chunk's [64][128] rows of q or k (row t0, columns col0..col0 + 127 of the map) into a
// swizzled tile: two 64 x 64 boxes.
__device__ __forceinline__ void tma_load_row_tile(bf16* dst, const CUtensorMap* map, int col0, int t0, uint64_t* bar) {
    tma_load_2d(dst, map, col0, t0, bar);
    tma_load_2d(dst + kC * 64, map, col0 + 64, t0, bar);
}
// A record's [64][64] tile (T or QKM) into a swizzled tile by one warp's cp.async.
__device__ __forceinline__ void warp_copy_record_tile(bf16* dst, const bf16* src, int lane) {
    for (int it = 0; it < kC * 8 / 32; ++it) {
        const int r = (lane >> 3) + 4 * it, c = (lane & 7) * 8;
        cp_async16(dst + tile_off(kSwz, r, c), src + r * kC + c, true);
    }
}
// One warp's cp.async landed, then one arrival completes the ring buffer's phase.
__device__ __forceinline__ void warp_copies_landed(uint64_t* bar, int lane) {
    cp_async_commit();
    cp_async_wait_all();
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
}
// Barrier of one warp group (128 threads): id 1 = the state group, 2 = the output group.
__device__ __forceinline__ void group_sync(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }

constexpr int kPairThreads = 256;
#ifdef ALLOY_GDN_EXP_TIMING
// Timing experiment only (launch_scan): the two-group scan copies only its first chunks' tiles.
__device__ int g_exp_skip_loads = 0;
#define ALLOY_GDN_EXP_SKIP(i, n) \
    if (g_exp_skip_loads && (i) >= (n)) return
// Which group's products the two-group scan skips (bit 1: the output group's, bit 2: the state
// group's Y^T and state update), barriers and hand-overs kept: which group bounds the step.
__device__ int g_exp_light = 0;
#define ALLOY_GDN_EXP_LIGHT(bit) (g_exp_light & (bit))
#else
#define ALLOY_GDN_EXP_SKIP(i, n)
#define ALLOY_GDN_EXP_LIGHT(bit) 0
#endif
// Shared memory of the two-group scan. kTma: the K, Q, T and QKM tiles as TMA writes them
// (128-byte swizzle, kSwz: dense 64 x 64 halves, each 1024-byte aligned; the kernel rounds the
// base up to 1024 bytes, the launch adds 1 KB), else padded rows (kPD / kPC) for cp.async.
template <int BV, bool kTma>
struct alignas(kTma ? 1024 : 16) PairStateBuf {
    bf16 K[kC * (kTma ? kD : kPD)];
    bf16 T[kC * (kTma ? kC : kPC)];
    bf16 V[kC * (BV + 8)];  // (the producer-warp variant: pitch BV)
    float eG[kC], beta[kC], eGC[kC];
};
template <bool kTma>
struct alignas(kTma ? 1024 : 16) PairOutBuf {
    bf16 Q[kC * (kTma ? kD : kPD)];
    bf16 M[kC * (kTma ? kC : kPC)];
    float eG[kC];
};
// The state group's ring: chunk c + 2 streams in while c computes (c + 1 at 64 columns, whose
// tiles leave no room for a third buffer). (Session 41: the 16-column producer kernel with rings
// of 2 / 1 so that two blocks share an SM was 26-41% slower on an H100.)
template <int BV>
__host__ __device__ constexpr int pair_bufs_s() { return BV >= 64 ? 2 : 3; }
template <int BV>
__host__ __device__ constexpr int pair_bufs_out() { return BV <= 16 ? 3 : 2; }
template <int BV, bool kTma>
struct alignas(kTma ? 1024 : 16) PairSmem {
    PairStateBuf<BV, kTma> sb[pair_bufs_s<BV>()];
    PairOutBuf<kTma> ob[pair_bufs_out<BV>()];
    bf16 Sb[2][BV * kPD];  // S^T in bf16 at the chunk's start, [j][i], by chunk parity
    bf16 Dp[BV * kPC];     // Delta'^T (state group only)
    bf16 Dm[2][BV * kPC];  // Delta^T, by chunk parity
    bf16 Dt[BV * kPC];     // Delta^T .* e^{G_C - G} (state group only)
    float O[kC * (BV + 4)];  // the output group's O tile, [r][j]
    uint64_t full_s[2], full_d[2], empty[2];
    uint64_t tiles_s[pair_bufs_s<BV>()], tiles_o[3];  // TMA variants: a ring buffer's tiles landed
    uint64_t s_free[pair_bufs_s<BV>()], o_free[3];    // producer-warp variant: a ring buffer's readers are done
    int i_ws;  // the chunk (in the sequence) where the state group starts (segmented scan)
};
template <int BV, bool kTma>
constexpr size_t pair_smem_bytes() { return sizeof(PairSmem<BV, kTma>) + (kTma ? 1024 : 0); }
static_assert(pair_smem_bytes<32, false>() <= 232448 && pair_smem_bytes<32, true>() <= 232448 &&
                  pair_smem_bytes<16, true>() <= 232448,
              "two-group scan: shared memory over 227 KB");
static_assert(pair_smem_bytes<64, true>() <= 232448, "two-group scan at 64 columns: shared memory over 227 KB");
// The TMA variant's tensor maps (host-encoded, kernel parameters): k and q as [n_tokens][H_k
// 128] bf16 in 64 x 64 boxes, the records' T and QKM as [records][64][64] in 64 x 64 x 1 boxes.
struct PairMaps {
    CUtensorMap k, q, T, M;
    CUtensorMap v;  // producer-warp variant: v [n_tokens][H_v 128] in dense BV x 64 boxes
};

// The producer warp of the two-group and chain scans: the state ring's chunks [i_ws, i_hi) (K, T,
// V and the row scalars) and the output ring's [i_lo, i_hi) (Q, QKM, e^G), each into its buffer
// (kNS / kNO of them) once that buffer's last readers arrived on its "free" mbarrier: TMA for
// whole chunks (V as a dense [64][BV] box), the warp's own cp.async for a partial one (rows past
// the sequence zero, into the same layouts).
template <int BV, int kNS, int kNO>
__device__ __forceinline__ void produce_tiles(PairStateBuf<BV, true>* sb, PairOutBuf<true>* ob, uint64_t* tiles_s,
                                              uint64_t* tiles_o, uint64_t* s_free, uint64_t* o_free, const PairMaps& maps,
                                              const bf16* q, const bf16* k, const bf16* v, const ChunkRecord* rec,
                                              const ref::GdnShape& sh, int t_begin, int t_end, int c_first, int h, int v0,
                                              int i_ws, int i_lo, int i_hi, int lane) {
    const int H_v = sh.H_v, kh = key_head(sh, h);
    const size_t qk_stride = (size_t)sh.H_k * kD, v_stride = (size_t)H_v * kD;
    const int cc = (lane & 15) * 8, r0 = lane >> 4;  // copy_row_tile with 32 threads
    auto load_state = [&](int i, int b) {
        auto& B = sb[b];
        const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
        const size_t rc = (size_t)(c_first + i) * H_v + h;
        if (n == kC) {
            if (lane == 0) {
                mbar_arrive_expect_tx(&tiles_s[b], kC * kD * 2 + kC * kC * 2 + kC * BV * 2 + 768);
                tma_load_row_tile(B.K, &maps.k, kh * kD, t0, &tiles_s[b]);
                tma_load_3d(B.T, &maps.T, 0, 0, int(rc), &tiles_s[b]);
                tma_load_2d(B.V, &maps.v, h * kD + v0, t0, &tiles_s[b]);
                bulk_copy(B.eG, rec[rc].eG, 768, &tiles_s[b]);  // eG, beta, eGC
            }
            return;
        }
        copy_row_tile<32, kSwz>(B.K, k + (size_t)kh * kD + cc, qk_stride, t0, n, r0, cc);
        const ChunkRecord* R = rec + rc;
        warp_copy_record_tile(B.T, R->T, lane);
        for (int idx = lane; idx < kC * (BV / 8); idx += 32) {
            const int r = idx / (BV / 8), c = (idx % (BV / 8)) * 8;
            cp_async16(B.V + r * BV + c, v + (size_t)(t0 + (r < n ? r : 0)) * v_stride + (size_t)h * kD + v0 + c, r < n);
        }
        for (int idx = lane; idx < 48; idx += 32) cp_async16(B.eG + 4 * idx, R->eG + 4 * idx, true);
        warp_copies_landed(&tiles_s[b], lane);
    };
    auto load_out = [&](int i, int b) {
        auto& B = ob[b];
        const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
        const size_t rc = (size_t)(c_first + i) * H_v + h;
        if (n == kC) {
            if (lane == 0) {
                mbar_arrive_expect_tx(&tiles_o[b], kC * kD * 2 + kC * kC * 2 + 256);
                tma_load_row_tile(B.Q, &maps.q, kh * kD, t0, &tiles_o[b]);
                tma_load_3d(B.M, &maps.M, 0, 0, int(rc), &tiles_o[b]);
                bulk_copy(B.eG, rec[rc].eG, 256, &tiles_o[b]);
            }
            return;
        }
        copy_row_tile<32, kSwz>(B.Q, q + (size_t)kh * kD + cc, qk_stride, t0, n, r0, cc);
        const ChunkRecord* R = rec + rc;
        warp_copy_record_tile(B.M, R->QKM, lane);
        if (lane < 16) cp_async16(B.eG + 4 * lane, R->eG + 4 * lane, true);
        warp_copies_landed(&tiles_o[b], lane);
    };
    int si = i_ws, oi = i_lo;  // the next chunk of each ring
    while (si < i_hi || oi < i_hi) {
        bool did = false;
        if (si < i_hi) {
            const int u = si - i_ws, b = u % kNS;
            const bool ready = __shfl_sync(0xffffffffu, u < kNS || mbar_test(&s_free[b], ((u / kNS) - 1) & 1), 0);
            if (ready) load_state(si++, b), did = true;
        }
        if (oi < i_hi) {
            const int u = oi - i_lo, b = u % kNO;
            const bool ready = __shfl_sync(0xffffffffu, u < kNO || mbar_test(&o_free[b], ((u / kNO) - 1) & 1), 0);
            if (ready) load_out(oi++, b), did = true;
        }
        if (!did) __nanosleep(64);
    }
}

// kTma (GdnScan::TwoGroupsTma): a whole chunk's K and T (state group) and Q and QKM (output
// group) tiles arrive by TMA tensor copies, 3 a group and chunk from one thread, counted on an
// mbarrier per ring buffer, in the 128-byte swizzled layout (kSwz); the row scalars by one bulk
// copy; V by cp.async. The 16-byte cp.async of every tile from every thread cost ~1.1k (state)
// and ~0.9k (output) of a ~3.9k-cycle step (clock64, H100, session 37). A sequence's last,
// partial chunk keeps cp.async (TMA cannot zero the rows past the sequence), into the same
// swizzled layout. The same data and products, so the same bits. (Session 36's variant here,
// 193 / 129 per-row bulk copies a chunk, was 3.6x slower.)
//
// kProd (with kTma; GdnScan::TwoGroupsProducer, Auto's pick at 16 / 32 columns in sessions 38-41 and at 64 since 41,
// the same bits as the others on an H100 there): a ninth warp, the producer, issues every copy of both rings (TMA for whole
// chunks, V too, as a dense [64][BV] box; its own cp.async for a partial chunk) as soon as the
// ring buffer's readers have arrived on its "free" mbarrier, so no consumer warp spends its
// step issuing copies (clock64 with kTma alone: lane 0's copy issue held its warp ~765 / 578
// cycles a step).
template <int BV, bool kTma, typename OutT, bool kProd = false>
__global__ void __launch_bounds__(kPairThreads + (kProd ? 32 : 0), 1) stage2_pair_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                                      const int32_t* __restrict__ cstart,
                                                                      const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                                      const bf16* __restrict__ v,
                                                                      const ChunkRecord* __restrict__ rec,
                                                                      float* __restrict__ state, OutT* __restrict__ out,
                                                                      const int32_t* __restrict__ slots, ScanSegments sg,
                                                                      const __grid_constant__ PairMaps maps) {
    detail::pdl_entry();
    constexpr int MT = BV / 16, kPairBufS = pair_bufs_s<BV>();
    constexpr int kNR = 2, kRW = 16;  // chunk rows per warp (16) as two n8 tiles
    constexpr int kNI = 4, kIW = 32;  // state columns per warp (32) as four n8 tiles
    constexpr int kGT = 128;          // threads per group
    constexpr int kKP = kTma ? kSwz : kPD, kTP = kTma ? kSwz : kPC;  // pitches of the K / Q and T / QKM tiles
    constexpr int kVP = kProd ? BV : BV + 8;                           // pitch of the V tile
    static_assert(!kProd || kTma, "the producer warp issues TMA copies");
    using Smem = PairSmem<BV, kTma>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // (TMA's swizzled tiles: the base rounded up to 1024 bytes; launch_stage2_pair adds 1 KB.)
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw + (kTma ? (1024 - (smem_u32(smem_raw) & 1023)) & 1023 : 0));
    const int vs = blockIdx.x, h = blockIdx.y;
    // This block's sequence and its chunks [i_lo, i_hi) (indices within the sequence).
    const SegmentBlock sb_ = segment_block(sg, offs, cstart);
    if (!sb_.valid) return;
    const int seq = sb_.seq, i_lo = sb_.i_lo, i_hi = sb_.i_hi, t_begin = sb_.t_begin, t_end = sb_.t_end;
    const int c_first = sb_.c_first, n_chunks = sb_.n_chunks;
    const int H_k = sh.H_k, H_v = sh.H_v, kh = key_head(sh, h), v0 = vs * BV;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int gt = tid & (kGT - 1), gw = w & 3;  // thread and warp within the group
    const int r_w = kRW * gw, k_causal = gw + 1;  // this warp's chunk rows; k16 steps of s <= r
    const size_t qk_stride = (size_t)H_k * kD, v_stride = (size_t)H_v * kD;
    const int qk_cc = (gt & 15) * 8, qk_r0 = gt >> 4;    // K, Q: 16 x 16 B per row
    const int rec_cc = (gt & 7) * 8, rec_r0 = gt >> 3;   // T, QKM: 8 x 16 B per row
    if (tid == 0) {
        for (int p = 0; p < 2; ++p) {
            mbar_init(&sm.full_s[p], kGT);
            mbar_init(&sm.full_d[p], kGT);
            mbar_init(&sm.empty[p], kGT);
        }
        if constexpr (kProd) {
            for (int p = 0; p < kPairBufS; ++p) mbar_init(&sm.s_free[p], kGT);
            for (int p = 0; p < 3; ++p) mbar_init(&sm.o_free[p], kGT);
        }
        if constexpr (kTma) {
            for (int p = 0; p < kPairBufS; ++p) mbar_init(&sm.tiles_s[p], 1);
            for (int p = 0; p < 3; ++p) mbar_init(&sm.tiles_o[p], 1);
        }
    }
    // The state group runs chunks [i_ws, i_hi), from the sequence's state when i_ws = 0, else
    // from zero (the warmup chunks [i_ws, i_lo) without outputs); the output group [i_lo, i_hi).
    // Hand-overs between the groups count output chunks j = i - i_lo only.
    const int i_ws = block_warmup_start(&sm.i_ws, rec, c_first, i_lo, H_v, h, w, lane);
#ifdef ALLOY_GDN_EXP_CLOCK
    long long clk_last = 0;
#endif

    if constexpr (kProd) {
        if (w == 8) {
            // The producer warp: every copy of both rings.
            produce_tiles<BV, kPairBufS, pair_bufs_out<BV>()>(sm.sb, sm.ob, sm.tiles_s, sm.tiles_o, sm.s_free, sm.o_free,
                                                              maps, q, k, v, rec, sh, t_begin, t_end, c_first, h, v0,
                                                              i_ws, i_lo, i_hi, lane);
            return;
        }
    }

    if (w < 4) {
        // ---- the state group ----
        const int i_w = kIW * gw;  // this warp's state columns
        float* Sg = state + ((size_t)(slots ? slots[seq] : seq) * H_v + h) * kD * kD;
        float S[MT][kNI][4];
        if (i_ws == 0) {
            load_state(S, Sg, v0, i_w, gq, tq);
        } else {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) S[mt][nt][e] = 0.0f;
        }
        if (sg.fin_cnt) fin_arrive(fin_counter(sg, seq, H_v, h), lane);
        constexpr int kVPerRow = BV / 8, kVItems = kC * kVPerRow;
        const int v_r = gt / kVPerRow, v_cc = (gt % kVPerRow) * 8;
        const bf16* k_col = k + (size_t)kh * kD + qk_cc;
        const bf16* v_col = v + (size_t)h * kD + v0 + v_cc;
        auto load_chunk = [&](int i, int b) {
            auto& B = sm.sb[b];
            const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
            bool tiles_done = false;  // K, T and the row scalars arrived by TMA / a bulk copy
            if constexpr (kTma) {
                if (n == kC) {
                    if (gt == 0) {
                        const size_t rc = (size_t)(c_first + i) * H_v + h;
                        mbar_arrive_expect_tx(&sm.tiles_s[b], kC * kD * 2 + kC * kC * 2 + 768);
                        tma_load_row_tile(B.K, &maps.k, kh * kD, t0, &sm.tiles_s[b]);
                        tma_load_3d(B.T, &maps.T, 0, 0, int(rc), &sm.tiles_s[b]);
                        bulk_copy(B.eG, rec[rc].eG, 768, &sm.tiles_s[b]);  // eG, beta, eGC
                    }
                    tiles_done = true;
                } else if (gt == 0) {
                    mbar_arrive(&sm.tiles_s[b]);  // the phase completes; cp.async below
                }
            }
            ALLOY_GDN_EXP_SKIP(i, kPairBufS);  // the cp.async variant only
            if (!tiles_done) copy_row_tile<kGT, kKP>(B.K, k_col, qk_stride, t0, n, qk_r0, qk_cc);
            if (n == kC) {
                const bf16* vp = v_col + (size_t)(t0 + v_r) * v_stride;
                const size_t vstep = (size_t)(kGT / kVPerRow) * v_stride;
#pragma unroll
                for (int it = 0; it < (kVItems + kGT - 1) / kGT; ++it, vp += vstep)
                    if (kVItems >= kGT || gt < kVItems)
                        cp_async16(B.V + (v_r + it * (kGT / kVPerRow)) * (BV + 8) + v_cc, vp, true);
            } else {
#pragma unroll
                for (int it = 0; it < (kVItems + kGT - 1) / kGT; ++it) {
                    const int r = v_r + it * (kGT / kVPerRow);
                    if (kVItems >= kGT || gt < kVItems)
                        cp_async16(B.V + r * (BV + 8) + v_cc, v_col + (size_t)(t0 + (r < n ? r : 0)) * v_stride, r < n);
                }
            }
            if (tiles_done) return;
            const ChunkRecord* R = rec + (size_t)(c_first + i) * H_v + h;
#pragma unroll
            for (int it = 0; it < kC * 8 / kGT; ++it) {
                const int r = rec_r0 + it * (kGT / 8);
                cp_async16(B.T + tile_off(kTP, r, rec_cc), R->T + r * kC + rec_cc, true);
            }
            if (gt < 48) cp_async16(B.eG + 4 * gt, R->eG + 4 * gt, true);  // eG, beta, eGC
        };
        for (int p = 0; p < kPairBufS - 1; ++p) {
            if (!kProd && i_ws + p < i_hi) load_chunk(i_ws + p, p);
            cp_async_commit();
        }
        PCLK(0);  // (phase 1 then counts the state update only)
        for (int i = i_ws; i < i_hi; ++i) {
            const int b = (i - i_ws) % kPairBufS, j = i - i_lo;  // j < 0: a warmup chunk
            const auto& B = sm.sb[b];
            bf16* Sb = sm.Sb[j & 1];
            bf16* Dm = sm.Dm[j & 1];
            PCLK(1);  // (from the last phase of the step before: the state update)
            // The output group is done with chunk j - 2's Sb and Dm (this parity's buffers).
            if (j >= 2) mbar_wait(&sm.empty[j & 1], ((j >> 1) - 1) & 1);
            PCLK(2);
            state_to_bf16(Sb, S, i_w, gq, tq);
            if (j >= 0) mbar_arrive(&sm.full_s[j & 1]);
            PCLK(3);
            cp_async_wait<kPairBufS - 2>();
            if constexpr (kTma) mbar_wait(&sm.tiles_s[b], ((i - i_ws) / kPairBufS) & 1);
            group_sync(1);  // chunk i's tiles and Sb visible; the group is done with chunk i - 1
            PCLK(4);
            float rv[kNR][MT][2][2], re[kNR][2], rb[kNR][2], rf[kNR][2];
            row_scalars<BV, MT, kNR, kVP>(rv, re, rb, rf, B.eG, B.beta, B.eGC, B.V, r_w, gq, tq);
            const float eGC = B.eG[kC - 1];
            // Y^T = S^T K^T for this warp's rows (even / odd k-steps apart, as the one-group kernel).
            float y[MT][kNR][4], y2[MT][kNR][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) y[mt][nt][e] = y2[mt][nt][e] = 0.0f;
            if (!ALLOY_GDN_EXP_LIGHT(2)) {
                uint32_t a[kD / 16][MT][4], bk[kD / 16][2 * kNR];
                auto load = [&](int ks) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[ks][mt], a_addr(Sb, kPD, 16 * mt, 16 * ks, lane));
                    load_b_rows(bk[ks], B.K, kKP, r_w, 16 * ks, lane);
                };
                load(0);
                load(1);
#pragma unroll
                for (int ks = 0; ks < kD / 16; ++ks) {
                    if (ks + 2 < kD / 16) load(ks + 2);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int nt = 0; nt < kNR; ++nt)
                            mma(ks & 1 ? y2[mt][nt] : y[mt][nt], a[ks][mt], bk[ks][2 * nt], bk[ks][2 * nt + 1]);
                }
            }
            PCLK(5);
            if (!kProd && i + kPairBufS - 1 < i_hi) load_chunk(i + kPairBufS - 1, (b + kPairBufS - 1) % kPairBufS);
            cp_async_commit();
            PCLK(6);
            // Delta'^T = (V^T - Y^T e^G) beta.
            delta_prime(sm.Dp, y, y2, rv, re, rb, r_w, gq, tq);
            group_sync(1);
            PCLK(7);
            // Delta^T = Delta'^T T^T (s <= r).
            delta_products<MT, kNR, kTP>(Dm, sm.Dt, sm.Dp, B.T, rf, r_w, k_causal, lane, gq, tq);
            if (j >= 0) mbar_arrive(&sm.full_d[j & 1]);
            PCLK(8);
            group_sync(1);
            PCLK(9);
            // S^T = e^{G_C} S^T + Dt K for this warp's state columns.
            if (!ALLOY_GDN_EXP_LIGHT(2)) state_update<MT, kNI, kKP>(S, eGC, sm.Dt, B.K, i_w, lane);
            if constexpr (kProd) mbar_arrive(&sm.s_free[b]);  // this thread's reads of the buffer are done
        }
        // The sequence's last segment leaves the final state: in the slot once no block can still
        // read the old one there (fin_wait), or in sg.fin for segment_states_to_slots (ALLOY_GDN_FIN_COPY=1).
        if (i_hi == n_chunks) {
            if (sg.fin_cnt) fin_wait(fin_counter(sg, seq, H_v, h), 4 * fin_segments(sg, seq), lane);
            store_state(S, sg.fin ? sg.fin + ((size_t)seq * H_v + h) * kD * kD : Sg, v0, i_w, gq, tq);
        }
    } else {
        // ---- the output group: O^T = (S^T Q^T) e^G + Delta^T QKM^T, one chunk behind ----
        constexpr int kNO = pair_bufs_out<BV>();
        const bf16* q_col = q + (size_t)kh * kD + qk_cc;
        auto load_chunk = [&](int i, int b) {
            auto& B = sm.ob[b];
            const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
            if constexpr (kTma) {
                if (n == kC) {
                    if (gt == 0) {
                        const size_t rc = (size_t)(c_first + i) * H_v + h;
                        mbar_arrive_expect_tx(&sm.tiles_o[b], kC * kD * 2 + kC * kC * 2 + 256);
                        tma_load_row_tile(B.Q, &maps.q, kh * kD, t0, &sm.tiles_o[b]);
                        tma_load_3d(B.M, &maps.M, 0, 0, int(rc), &sm.tiles_o[b]);
                        bulk_copy(B.eG, rec[rc].eG, 256, &sm.tiles_o[b]);
                    }
                    return;
                }
                if (gt == 0) mbar_arrive(&sm.tiles_o[b]);  // the phase completes; cp.async below
            }
            ALLOY_GDN_EXP_SKIP(i, kNO);  // the cp.async variant only
            copy_row_tile<kGT, kKP>(B.Q, q_col, qk_stride, t0, n, qk_r0, qk_cc);
            const ChunkRecord* R = rec + (size_t)(c_first + i) * H_v + h;
#pragma unroll
            for (int it = 0; it < kC * 8 / kGT; ++it) {
                const int r = rec_r0 + it * (kGT / 8);
                cp_async16(B.M + tile_off(kTP, r, rec_cc), R->QKM + r * kC + rec_cc, true);
            }
            if (gt < 16) cp_async16(B.eG + 4 * gt, R->eG + 4 * gt, true);
        };
        for (int p = 0; p < kNO - 1; ++p) {
            if (!kProd && i_lo + p < i_hi) load_chunk(i_lo + p, p);
            cp_async_commit();
        }
        PCLK(0);
        for (int j = 0; j < i_hi - i_lo; ++j) {
            const int i = i_lo + j, b = j % kNO;
            const auto& B = sm.ob[b];
            const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
            PCLK(1);  // (from the step before's output flush)
            cp_async_wait<kNO - 2>();
            if constexpr (kTma) mbar_wait(&sm.tiles_o[b], (j / kNO) & 1);
            group_sync(2);  // chunk i's tiles visible; the group is done with chunk i - 1 (its buffer, the O tile)
            PCLK(2);
            if (!kProd && i + kNO - 1 < i_hi) load_chunk(i + kNO - 1, (b + kNO - 1) % kNO);
            cp_async_commit();
            PCLK(3);
            float re[kNR][2];
#pragma unroll
            for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) re[nt][e] = B.eG[r_w + 8 * nt + 2 * tq + e];
            float x[MT][kNR][4], x2[MT][kNR][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) x[mt][nt][e] = x2[mt][nt][e] = 0.0f;
            const bf16* Sb = sm.Sb[j & 1];
            const bf16* Dm = sm.Dm[j & 1];
            mbar_wait(&sm.full_s[j & 1], (j >> 1) & 1);
            PCLK(4);
            if (!ALLOY_GDN_EXP_LIGHT(1)) {
                uint32_t a[kD / 16][MT][4], bq[kD / 16][2 * kNR];
                auto load = [&](int ks) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[ks][mt], a_addr(Sb, kPD, 16 * mt, 16 * ks, lane));
                    load_b_rows(bq[ks], B.Q, kKP, r_w, 16 * ks, lane);
                };
                load(0);
                load(1);
#pragma unroll
                for (int ks = 0; ks < kD / 16; ++ks) {
                    if (ks + 2 < kD / 16) load(ks + 2);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int nt = 0; nt < kNR; ++nt)
                            mma(ks & 1 ? x2[mt][nt] : x[mt][nt], a[ks][mt], bq[ks][2 * nt], bq[ks][2 * nt + 1]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        x[mt][nt][e] = (x[mt][nt][e] + x2[mt][nt][e]) * re[nt][e & 1];
            PCLK(5);
            mbar_wait(&sm.full_d[j & 1], (j >> 1) & 1);
            PCLK(6);
            if (!ALLOY_GDN_EXP_LIGHT(1)) causal_products<MT, kNR, kTP>(x, Dm, B.M, r_w, k_causal, lane);
            mbar_arrive(&sm.empty[j & 1]);  // this thread's reads of Sb and Dm are done
            if constexpr (kProd) mbar_arrive(&sm.o_free[b]);  // and of the ring buffer
            PCLK(7);
            o_to_tile<BV>(sm.O, x, r_w, gq, tq);
            group_sync(2);
            PCLK(8);
            flush_out_tile<BV, kGT>(out, sm.O, v_stride, h, v0, t0, n, gt);
            PCLK(9);
        }
    }
}

// ---- stage 2, every warp its own 16 state rows (GdnScan::WarpRows) ----
//
// The one- and two-group scans split a chunk step's products across warps by chunk rows and
// state columns, so the state S^T, Delta'^T and Delta^T go through shared memory in bf16 between
// products and the warps meet at two or three barriers a step (ldmatrix waits 30%, barriers 10%
// of a 3.9k-cycle step, ncu). Here a warp owns 16 value columns j of S^T [16][128] (all 128 state
// columns i, 64 accumulators a thread) and runs the whole step for them alone. The accumulators
// of a 16 x 16 block of an mma result (two n8 tiles) are in the A-operand fragment layout of a
// k16 step (a0 = tile 2ks rows gq, a1 = rows gq + 8, a2 / a3 = tile 2ks + 1), so each product's
// result packs to bf16 and feeds the next product from registers:
//   Y^T, X^T = S^T K^T, S^T Q^T (A = S^T)        -> Delta'^T (elementwise)
//   Delta^T = Delta'^T T^T (A = Delta'^T)         -> Delta^T, Delta^T .* e^{G_C - G}
//   O^T = X^T e^G + Delta^T QKM^T, S^T = e^{G_C} S^T + Dt K (A = Delta^T, Dt)
// The warps of a block (NW, 16 NW value columns) share the chunk tiles (cp.async ring) and meet
// once a step, where a tile buffer is recycled. Every output element is the same mma sequence,
// operand roundings and even / odd k-step accumulators as in stage2_kernel (products of rows r
// run the causal k-steps s <= r of the one-group kernel's 16-row warps): the same bits.
template <int NW>
__host__ __device__ constexpr int warp_scan_bufs() { return NW >= 8 ? 2 : 3; }
template <int NW>
struct alignas(16) WarpScanSmem {
    Stage2Buf<16 * NW> buf[warp_scan_bufs<NW>()];
    float O[NW][kC * (16 + 4)];  // each warp's O tile [r][j] of the step, for coalesced stores
};
static_assert(sizeof(WarpScanSmem<4>) <= 232448 && sizeof(WarpScanSmem<8>) <= 232448,
              "warp-rows scan: shared memory over 227 KB");

// The causal products' steps of the register-passing scans (rows of tile pair p, s-step ks <= p),
// in the order (0,0) (1,0) (1,1) (2,0) ...: per output tile the k-steps ascend, as in
// stage2_kernel. Rows [0, 32) are steps [0, 3), rows [32, 64) steps [3, 10).
constexpr int kCausal = kC / 16 * (kC / 16 + 1) / 2;
__host__ __device__ constexpr int causal_p(int i) { return i < 1 ? 0 : i < 3 ? 1 : i < 6 ? 2 : 3; }
__host__ __device__ constexpr int causal_k(int i) { return i < 1 ? i : i < 3 ? i - 1 : i < 6 ? i - 3 : i - 6; }
static_assert(kC / 16 == 4 && kCausal == 10, "causal step tables are for 4 s-steps");

// The A fragments of a k16 step from the accumulators of its two n8 tiles c0, c1, in bf16.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// Dt = Delta^T .* e^{G_C - G} of s-step ks as A fragments, from Delta^T's accumulators d0, d1
// (its n8 tiles 2 ks, 2 ks + 1) and the chunk's e^{G_C - G} row scalars.
__device__ __forceinline__ void dt_to_a(uint32_t (&a)[4], const float (&d0)[4], const float (&d1)[4], const float* eGC, int ks,
                                        int tq) {
    auto scaled = [&](float (&f)[4], const float (&d)[4], int r) {  // rows r, r + 1 of the tile
        const float f0 = eGC[r], f1 = eGC[r + 1];
        f[0] = d[0] * f0, f[1] = d[1] * f1, f[2] = d[2] * f0, f[3] = d[3] * f1;
    };
    float f0[4], f1[4];
    scaled(f0, d0, 16 * ks + 2 * tq);
    scaled(f1, d1, 16 * ks + 8 + 2 * tq);
    acc_to_a(a, f0, f1);
}

template <int NW, typename OutT>
__global__ void __launch_bounds__(32 * NW, 1) stage2_warp_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                                 const int32_t* __restrict__ cstart,
                                                                 const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                                 const bf16* __restrict__ v,
                                                                 const ChunkRecord* __restrict__ rec,
                                                                 float* __restrict__ state, OutT* __restrict__ out,
                                                                 const int32_t* __restrict__ slots) {
    detail::pdl_entry();
    constexpr int BV = 16 * NW, kNBuf = warp_scan_bufs<NW>(), kT = 32 * NW;
    constexpr int kNI = kD / 8;  // state n8 tiles a warp holds (all 128 columns)
    extern __shared__ __align__(16) unsigned char smem_raw[];
    WarpScanSmem<NW>& sm = *reinterpret_cast<WarpScanSmem<NW>*>(smem_raw);
    const ScanSeq sq(sh, offs, cstart, state, slots);
    if (sq.t_begin == sq.t_end) return;
    const int h = sq.h, t_begin = sq.t_begin, t_end = sq.t_end, c_first = sq.c_first, c_last = sq.c_last;
    const int H_v = sh.H_v, v0 = sq.vs * BV;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int j_w = 16 * w;  // this warp's value columns within the block
    float* Sg = sq.state;
    float S[1][kNI][4];  // S^T[j][i], j = j_w + gq (+8), i = 8 nt + 2 tq (+1)
    load_state(S, Sg, v0 + j_w, 0, gq, tq);

    const ChunkTiles<BV, kT> tiles(sh, t_begin, t_end, c_first, h, v0, q, k, v, rec, tid);
    auto load_chunk = [&](int c, int b) { tiles.load(c, sm.buf[b]); };
    const size_t v_stride = (size_t)H_v * kD;
    for (int p = 0; p < kNBuf - 1; ++p) {
        if (c_first + p < c_last) load_chunk(c_first + p, p);
        cp_async_commit();
    }
    float* O = sm.O[w];
    for (int c = c_first; c < c_last; ++c) {
        const int b = (c - c_first) % kNBuf;
        const Stage2Buf<BV>& B = sm.buf[b];
        const int t0 = t_begin + (c - c_first) * kC, n = min(kC, t_end - t0);
        cp_async_wait<kNBuf - 2>();
        __syncthreads();  // chunk c's tiles visible; every warp is done with chunk c - 1's buffer
        if (c + kNBuf - 1 < c_last) load_chunk(c + kNBuf - 1, (b + kNBuf - 1) % kNBuf);
        cp_async_commit();
        const float eGC = B.eG[kC - 1];

        // S^T in bf16 as the A operand, k-step ks = state columns [16 ks, 16 ks + 16).
        uint32_t sa[kD / 16][4];
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks) acc_to_a(sa[ks], S[0][2 * ks], S[0][2 * ks + 1]);

        // Y^T, X^T over the chunk rows a quarter (16 rows, two n8 tiles) at a time, then
        // Delta'^T = (V^T - Y^T e^G) beta as the A fragments of s-step qr, and X^T e^G as the
        // start of O^T. mma and ldmatrix are volatile asm (kept in program order), so each step's
        // fragments are requested one step ahead by hand.
        uint32_t dpa[kC / 16][4];
        float xo[1][kC / 8][4];
#pragma unroll
        for (int qr = 0; qr < kC / 16; ++qr) {
            float re[2][2], rb[2][2], rv[2][2][2];  // [tile][e] (row 16 qr + 8 u + 2 tq + e), rv [u][e][hh]
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int r = 16 * qr + 8 * u + 2 * tq + e;
                    re[u][e] = B.eG[r];
                    rb[u][e] = B.beta[r];
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) rv[u][e][hh] = __bfloat162float(B.V[r * (BV + 8) + j_w + gq + 8 * hh]);
                }
            float y[2][4], y2[2][4], x[2][4], x2[2][4];
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int e = 0; e < 4; ++e) y[u][e] = y2[u][e] = x[u][e] = x2[u][e] = 0.0f;
            uint32_t bk[2][4], bq[2][4];  // by k-step parity: n8 tiles (16 qr, 16 qr + 8), regs {b0, b1} each
            ldsm_x4(bk[0], b_addr(B.K, kPD, 16 * qr, 0, lane));
            ldsm_x4(bq[0], b_addr(B.Q, kPD, 16 * qr, 0, lane));
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks) {
                const int cur = ks & 1;
                if (ks + 1 < kD / 16) {
                    ldsm_x4(bk[cur ^ 1], b_addr(B.K, kPD, 16 * qr, 16 * (ks + 1), lane));
                    ldsm_x4(bq[cur ^ 1], b_addr(B.Q, kPD, 16 * qr, 16 * (ks + 1), lane));
                }
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    mma(cur ? y2[u] : y[u], sa[ks], bk[cur][2 * u], bk[cur][2 * u + 1]);
                    mma(cur ? x2[u] : x[u], sa[ks], bq[cur][2 * u], bq[cur][2 * u + 1]);
                }
            }
            float dp[2][4];
#pragma unroll
            for (int u = 0; u < 2; ++u)
#pragma unroll
                for (int e = 0; e < 2; ++e)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const float yy = y[u][2 * hh + e] + y2[u][2 * hh + e];
                        dp[u][2 * hh + e] = rb[u][e] * (rv[u][e][hh] - re[u][e] * yy);
                        xo[0][2 * qr + u][2 * hh + e] = (x[u][2 * hh + e] + x2[u][2 * hh + e]) * re[u][e];
                    }
            acc_to_a(dpa[qr], dp[0], dp[1]);
        }

        // Delta^T = Delta'^T T^T.
        float dl[kC / 8][4];
#pragma unroll
        for (int nt = 0; nt < kC / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) dl[nt][e] = 0.0f;
        {
            uint32_t bt[2][4];
            ldsm_x4(bt[0], b_addr(B.T, kPC, 0, 0, lane));
#pragma unroll
            for (int i = 0; i < kCausal; ++i) {
                const int cur = i & 1;
                if (i + 1 < kCausal) ldsm_x4(bt[cur ^ 1], b_addr(B.T, kPC, 16 * causal_p(i + 1), 16 * causal_k(i + 1), lane));
                mma(dl[2 * causal_p(i)], dpa[causal_k(i)], bt[cur][0], bt[cur][1]);
                mma(dl[2 * causal_p(i) + 1], dpa[causal_k(i)], bt[cur][2], bt[cur][3]);
            }
        }
        // The first state-update fragments, requested before the packing below.
        uint32_t bs[2][4];
        ldsm_x4_t(bs[0], bt_addr(B.K, kPD, 0, 0, lane));
        // Delta^T (for O) and Delta^T .* e^{G_C - G} (for the state) as A fragments.
        uint32_t dma[kC / 16][4], dta[kC / 16][4];
#pragma unroll
        for (int ks = 0; ks < kC / 16; ++ks) {
            acc_to_a(dma[ks], dl[2 * ks], dl[2 * ks + 1]);
            dt_to_a(dta[ks], dl[2 * ks], dl[2 * ks + 1], B.eGC, ks, tq);
        }

        // S^T = e^{G_C} S^T + Dt K: steps (half ih of the state columns, s-step ks, column pair
        // p), odd s-steps into S2 (added at the end of each half).
#pragma unroll
        for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) S[0][nt][e] *= eGC;
#pragma unroll
        for (int ih = 0; ih < 2; ++ih) {
            float S2[kNI / 2][4];
#pragma unroll
            for (int nt = 0; nt < kNI / 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S2[nt][e] = 0.0f;
            constexpr int kSteps = kC / 16 * (kNI / 4);
#pragma unroll
            for (int i = 0; i < kSteps; ++i) {
                const int ks = i / (kNI / 4), p = i % (kNI / 4), cur = (ih * kSteps + i) & 1;
                const int in = ih * kSteps + i + 1;  // the next step overall
                if (in < 2 * kSteps) {
                    const int nih = in / kSteps, nks = (in % kSteps) / (kNI / 4), np = in % (kNI / 4);
                    ldsm_x4_t(bs[cur ^ 1], bt_addr(B.K, kPD, 16 * nks, 64 * nih + 16 * np, lane));
                }
                float(&s0)[4] = ks & 1 ? S2[2 * p] : S[0][kNI / 2 * ih + 2 * p];
                float(&s1)[4] = ks & 1 ? S2[2 * p + 1] : S[0][kNI / 2 * ih + 2 * p + 1];
                mma(s0, dta[ks], bs[cur][0], bs[cur][1]);
                mma(s1, dta[ks], bs[cur][2], bs[cur][3]);
            }
#pragma unroll
            for (int nt = 0; nt < kNI / 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[0][kNI / 2 * ih + nt][e] += S2[nt][e];
        }

        // O^T += Delta^T QKM^T (s <= r), then this warp's O tile to `out`.
        {
            uint32_t bm[2][4];
            ldsm_x4(bm[0], b_addr(B.M, kPC, 0, 0, lane));
#pragma unroll
            for (int i = 0; i < kCausal; ++i) {
                const int cur = i & 1;
                if (i + 1 < kCausal) ldsm_x4(bm[cur ^ 1], b_addr(B.M, kPC, 16 * causal_p(i + 1), 16 * causal_k(i + 1), lane));
                mma(xo[0][2 * causal_p(i)], dma[causal_k(i)], bm[cur][0], bm[cur][1]);
                mma(xo[0][2 * causal_p(i) + 1], dma[causal_k(i)], bm[cur][2], bm[cur][3]);
            }
        }
        __syncwarp();  // the last step's flush has read the O tile
        o_to_tile<16>(O, xo, 0, gq, tq);
        __syncwarp();
        flush_out_tile<16, 32>(out, O, v_stride, h, v0 + j_w, t0, n, lane);
    }
    store_state(S, Sg, v0 + j_w, 0, gq, tq);
}

// ---- stage 2 as chains: two state warps and two output warps per 16 value columns (GdnScan::Chains) ----
//
// Chain c of a block (NC chains, BV = 16 NC columns) is the value columns [16 c, 16 c + 16). Its
// two state warps hold S^T in registers for the whole scan, split by state columns (warp h:
// i in [64 h, 64 h + 64)), and split each chunk step's products by chunk rows (warp h: rows
// [32 h, 32 h + 32)) for Y^T and Delta^T, by state columns for the update; results pass from
// product to product as A fragments in registers. Three exchanges a step between the pair, each
// one 64-thread named barrier: the S^T fragments of the other half (through the hand-over buffer
// the output warps read), the Delta'^T fragments (Delta^T's row tiles 0 and 3 by warp 0, 1 and 2
// by warp 1: five causal steps each; 0-1 / 2-3 was 3 against 7), and each warp's Dt fragments
// (the update sums over all 64 rows). The two output warps of the
// chain compute O^T = X^T e^G + Delta^T QKM^T for rows [32 h, 32 h + 32) from the S^T and
// Delta^T fragments the state warps leave in shared memory (full_s / full_d / empty mbarriers by
// chunk parity); warp 4 NC is the two-group scan's producer (produce_tiles). (Session 42, one
// state warp and one output warp a chain: within 5% of the two-group kernel, clock64: the state
// warp's 148 mma a step, ~2.5k cycles, on one scheduler bounded it.) Every output element is
// warp rows' mma sequence with its operand roundings: the same bits as every other scan.
// NC <= 2 (a third chain's 13 warps would leave ~100 registers a thread).
// Ring buffers: state tiles (4 at one chain a block, where they fit) and output tiles.
template <int NC>
__host__ __device__ constexpr int chain_bufs_s() { return NC == 1 ? 4 : 3; }
constexpr int kChainBufsOut = 3;
template <int NC>
struct alignas(1024) ChainSmem {
    PairStateBuf<16 * NC, true> sb[chain_bufs_s<NC>()];
    PairOutBuf<true> ob[kChainBufsOut];
    uint4 sa[NC][2][kD / 16][32];  // S^T at a chunk's start as bf16 A fragments [k-step][lane], by chunk parity
    uint4 da[NC][2][kC / 16][32];  // Delta^T as A fragments, by chunk parity
    uint4 xd[NC][2][2][32];        // each state warp's Delta'^T fragments (its two s-steps) for the other
    uint4 xt[NC][kC / 16][32];     // Dt = Delta^T .* e^{G_C - G} fragments, both state warps' halves
    float O[NC][2][32 * (16 + 4)]; // output warp h's O rows [32 h, 32 h + 32) of the chunk, [r][j]
    uint64_t full_s[NC][2], full_d[NC][2], empty[NC][2];
    uint64_t tiles_s[chain_bufs_s<NC>()], tiles_o[kChainBufsOut], s_free[chain_bufs_s<NC>()], o_free[kChainBufsOut];
    int i_ws;  // the chunk (in the sequence) where the state warps start (segmented scan)
};
template <int NC>
constexpr size_t chain_smem_bytes() { return sizeof(ChainSmem<NC>) + 1024; }
static_assert(chain_smem_bytes<1>() <= 232448 && chain_smem_bytes<2>() <= 232448, "chain scan: shared memory over 227 KB");
constexpr int chain_threads(int nc) { return 32 * (4 * nc + 1); }

__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void to_frag(uint32_t (&a)[4], const uint4& x) { a[0] = x.x, a[1] = x.y, a[2] = x.z, a[3] = x.w; }
__device__ __forceinline__ uint4 from_frag(const uint32_t (&a)[4]) { return make_uint4(a[0], a[1], a[2], a[3]); }

// acc (even k-steps) + acc2 (odd) = S^T R^T for the chunk rows [32 H, 32 H + 32) (four n8 tiles)
// of a swizzled [64][128] tile R (K for Y^T, Q for X^T), S^T as the A fragments sa; the tile's
// fragments requested two k-steps ahead (mma and ldmatrix are volatile asm, kept in program
// order: one step ahead left the chain waiting on ldmatrix latency).
template <int H>
__device__ __forceinline__ void chain_rows_product(float (&acc)[4][4], float (&acc2)[4][4], const uint32_t (&sa)[kD / 16][4],
                                                   const bf16* R, int lane) {
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[u][e] = acc2[u][e] = 0.0f;
    uint32_t b[3][2][4];
    auto ld = [&](int ks) {
#pragma unroll
        for (int qq = 0; qq < 2; ++qq) ldsm_x4(b[ks % 3][qq], b_addr(R, kSwz, 32 * H + 16 * qq, 16 * ks, lane));
    };
    ld(0);
    ld(1);
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
        if (ks + 2 < kD / 16) ld(ks + 2);
#pragma unroll
        for (int u = 0; u < 4; ++u)
            mma(ks & 1 ? acc2[u] : acc[u], sa[ks], b[ks % 3][u >> 1][2 * (u & 1)], b[ks % 3][u >> 1][2 * (u & 1) + 1]);
    }
}

template <int NC, typename OutT>
__global__ void __launch_bounds__(chain_threads(NC), 1) stage2_chain_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                                            const int32_t* __restrict__ cstart,
                                                                            const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                                            const bf16* __restrict__ v,
                                                                            const ChunkRecord* __restrict__ rec,
                                                                            float* __restrict__ state, OutT* __restrict__ out,
                                                                            const int32_t* __restrict__ slots, ScanSegments sg,
                                                                            const __grid_constant__ PairMaps maps) {
    detail::pdl_entry();
    constexpr int BV = 16 * NC, kNB = kChainBufsOut, kNS = chain_bufs_s<NC>();
    using Smem = ChainSmem<NC>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Smem& sm = *reinterpret_cast<Smem*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
    const int vs = blockIdx.x, h = blockIdx.y;
    const SegmentBlock sb_ = segment_block(sg, offs, cstart);
    if (!sb_.valid) return;
    const int seq = sb_.seq, i_lo = sb_.i_lo, i_hi = sb_.i_hi, t_begin = sb_.t_begin, t_end = sb_.t_end;
    const int c_first = sb_.c_first, n_chunks = sb_.n_chunks;
    const int H_v = sh.H_v, v0 = vs * BV;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    if (tid == 0) {
        for (int c = 0; c < NC; ++c)
            for (int p = 0; p < 2; ++p) {
                mbar_init(&sm.full_s[c][p], 64);
                mbar_init(&sm.full_d[c][p], 64);
                mbar_init(&sm.empty[c][p], 64);
            }
        for (int b = 0; b < kNS; ++b) {
            mbar_init(&sm.tiles_s[b], 1);
            mbar_init(&sm.s_free[b], 64 * NC);
        }
        for (int b = 0; b < kNB; ++b) {
            mbar_init(&sm.tiles_o[b], 1);
            mbar_init(&sm.o_free[b], 64 * NC);
        }
    }
    // The state warps run chunks [i_ws, i_hi) (from the sequence's state when i_ws = 0, else from
    // zero: warmup chunks [i_ws, i_lo) leave nothing for the output warps); the output warps
    // [i_lo, i_hi). Hand-overs count output chunks j = i - i_lo.
    const int i_ws = block_warmup_start(&sm.i_ws, rec, c_first, i_lo, H_v, h, w, lane);
#ifdef ALLOY_GDN_EXP_CLOCK
    long long clk_last = 0;
#endif
    if (w == 4 * NC) {
        produce_tiles<BV, kNS, kNB>(sm.sb, sm.ob, sm.tiles_s, sm.tiles_o, sm.s_free, sm.o_free, maps, q, k, v, rec, sh,
                                    t_begin, t_end, c_first, h, v0, i_ws, i_lo, i_hi, lane);
        return;
    }
    // ---- state warp H of chain c ----
    auto state_warp = [&](auto half) {
        constexpr int H = decltype(half)::value;
        // Row tiles p of Delta^T (= s-steps of Dt) this warp computes: {0, 3} (warp 0), {1, 2};
        // slot of p in dl, this warp's s-steps and the other's.
        auto own_p = [](int p) { return H == 0 ? p == 0 || p == 3 : p == 1 || p == 2; };
        auto p_slot = [](int p) { return H == 0 ? (p == 0 ? 0 : 1) : (p == 1 ? 0 : 1); };
        auto own_k = [](int kk) { return H == 0 ? 3 * kk : 1 + kk; };
        auto other_k = [](int kk) { return H == 0 ? 1 + kk : 3 * kk; };
        const int c = w >> 1, jc = 16 * c, bar_s = 1 + 3 * c, bar_d = 2 + 3 * c, bar_t = 3 + 3 * c;
        float* Sg = state + ((size_t)(slots ? slots[seq] : seq) * H_v + h) * kD * kD;
        float S[1][8][4];  // S^T[j][i], j = jc + gq (+8), i = 64 H + 8 nt + 2 tq (+1)
        if (i_ws == 0) {
            load_state(S, Sg, v0 + jc, 64 * H, gq, tq);
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[0][nt][e] = 0.0f;
        }
        if (sg.fin_cnt) fin_arrive(fin_counter(sg, seq, H_v, h), lane);
        for (int i = i_ws; i < i_hi; ++i) {
            const int b = (i - i_ws) % kNS, j = i - i_lo;  // j < 0: a warmup chunk
            const auto& B = sm.sb[b];
            CCLK(0);
            // S^T in bf16 as the A operand (k-step ks = state columns [16 ks, 16 ks + 16)): this
            // warp's four k-steps into the hand-over buffer, the other warp's four from it.
            uint32_t sa[kD / 16][4];
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) acc_to_a(sa[4 * H + kk], S[0][2 * kk], S[0][2 * kk + 1]);
            if (j >= 2) mbar_wait(&sm.empty[c][j & 1], ((j >> 1) - 1) & 1);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) sm.sa[c][j & 1][4 * H + kk][lane] = from_frag(sa[4 * H + kk]);
            if (j >= 0) mbar_arrive(&sm.full_s[c][j & 1]);
            named_sync(bar_s, 64);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) to_frag(sa[4 * (1 - H) + kk], sm.sa[c][j & 1][4 * (1 - H) + kk][lane]);
            CCLK(1);
            mbar_wait(&sm.tiles_s[b], ((i - i_ws) / kNS) & 1);
            CCLK(2);
            const float eGC = B.eG[kC - 1];
            // Y^T = S^T K^T for rows [32 H, 32 H + 32), then Delta'^T = (V^T - Y^T e^G) beta as the
            // A fragments of s-steps 2 H, 2 H + 1.
            uint32_t dpa[kC / 16][4];
            {
                float re[4][2], rb[4][2], rv[4][2][2];  // rows 32 H + 8 u + 2 tq + e
#pragma unroll
                for (int u = 0; u < 4; ++u)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int r = 32 * H + 8 * u + 2 * tq + e;
                        re[u][e] = B.eG[r];
                        rb[u][e] = B.beta[r];
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) rv[u][e][hh] = __bfloat162float(B.V[r * BV + jc + gq + 8 * hh]);
                    }
                float y[4][4], y2[4][4];
                chain_rows_product<H>(y, y2, sa, B.K, lane);
#pragma unroll
                for (int qq = 0; qq < 2; ++qq) {
                    float dp[2][4];
#pragma unroll
                    for (int uu = 0; uu < 2; ++uu) {
                        const int u = 2 * qq + uu;
#pragma unroll
                        for (int e = 0; e < 2; ++e)
#pragma unroll
                            for (int hh = 0; hh < 2; ++hh) {
                                const float yy = y[u][2 * hh + e] + y2[u][2 * hh + e];
                                dp[uu][2 * hh + e] = rb[u][e] * (rv[u][e][hh] - re[u][e] * yy);
                            }
                    }
                    acc_to_a(dpa[2 * H + qq], dp[0], dp[1]);
                }
            }
            CCLK(3);
            // Delta^T = Delta'^T T^T, output row tiles (16 rows each) p = 0 and 3 by warp 0, 1 and 2
            // by warp 1 (five causal steps each; their T fragments requested at once); each needs
            // the other's Delta'^T s-steps.
            uint32_t bt[5][4];
#pragma unroll
            for (int ci = 0, n = 0; ci < kCausal; ++ci)
                if (own_p(causal_p(ci))) ldsm_x4(bt[n++], b_addr(B.T, kSwz, 16 * causal_p(ci), 16 * causal_k(ci), lane));
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) sm.xd[c][H][kk][lane] = from_frag(dpa[2 * H + kk]);
            named_sync(bar_d, 64);
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) to_frag(dpa[2 * (1 - H) + kk], sm.xd[c][1 - H][kk][lane]);
            float dl[4][4];  // n8 tiles 2 p, 2 p + 1 of this warp's row tiles p (slot p_slot(p))
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) dl[nt][e] = 0.0f;
#pragma unroll
            for (int ci = 0, n = 0; ci < kCausal; ++ci)
                if (own_p(causal_p(ci))) {
                    const int sl = p_slot(causal_p(ci));
                    mma(dl[2 * sl], dpa[causal_k(ci)], bt[n][0], bt[n][1]);
                    mma(dl[2 * sl + 1], dpa[causal_k(ci)], bt[n][2], bt[n][3]);
                    ++n;
                }
            CCLK(4);
            // The update's K fragments (state columns [64 H, 64 H + 64); steps (s-step ks, column
            // pair p)), three steps ahead, the first three before the packing below.
            uint32_t bs[4][4];
            auto lds = [&](int st) {
                ldsm_x4_t(bs[st % 4], bt_addr(B.K, kSwz, 16 * (st / 4), 64 * H + 16 * (st % 4), lane));
            };
            lds(0);
            lds(1);
            lds(2);
            // Delta^T (for the output warps) and Dt = Delta^T .* e^{G_C - G} of this warp's s-steps
            // (= its row tiles) as A fragments; then the other warp's Dt.
            uint32_t dta[kC / 16][4];
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                const int ks = own_k(kk);
                uint32_t dma[4];
                acc_to_a(dma, dl[2 * kk], dl[2 * kk + 1]);
                if (j >= 0) sm.da[c][j & 1][ks][lane] = from_frag(dma);
                dt_to_a(dta[ks], dl[2 * kk], dl[2 * kk + 1], B.eGC, ks, tq);
                sm.xt[c][ks][lane] = from_frag(dta[ks]);
            }
            if (j >= 0) mbar_arrive(&sm.full_d[c][j & 1]);
            named_sync(bar_t, 64);
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) to_frag(dta[other_k(kk)], sm.xt[c][other_k(kk)][lane]);
            CCLK(5);
            // S^T = e^{G_C} S^T + Dt K for this warp's state columns, odd s-steps into S2 (added at
            // the end), as warp rows' half H.
            float S2[8][4];
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[0][nt][e] *= eGC, S2[nt][e] = 0.0f;
#pragma unroll
            for (int st = 0; st < 16; ++st) {
                const int ks = st / 4, p = st % 4;
                if (st + 3 < 16) lds(st + 3);
                float(&s0)[4] = ks & 1 ? S2[2 * p] : S[0][2 * p];
                float(&s1)[4] = ks & 1 ? S2[2 * p + 1] : S[0][2 * p + 1];
                mma(s0, dta[ks], bs[st % 4][0], bs[st % 4][1]);
                mma(s1, dta[ks], bs[st % 4][2], bs[st % 4][3]);
            }
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[0][nt][e] += S2[nt][e];
            mbar_arrive(&sm.s_free[b]);  // this thread's reads of the ring buffer are done
            CCLK(6);
        }
        // The sequence's last segment leaves the final state: in the slot once no block can still
        // read the old one there (fin_wait), or in sg.fin for segment_states_to_slots (ALLOY_GDN_FIN_COPY=1).
        if (i_hi == n_chunks) {
            if (sg.fin_cnt) fin_wait(fin_counter(sg, seq, H_v, h), 2 * NC * fin_segments(sg, seq), lane);
            store_state(S, sg.fin ? sg.fin + ((size_t)seq * H_v + h) * kD * kD : Sg, v0 + jc, 64 * H, gq, tq);
        }
    };

    // ---- output warp H of chain c: O^T = (S^T Q^T) e^G + Delta^T QKM^T for rows [32 H, 32 H + 32) ----
    auto output_warp = [&](auto half) {
        constexpr int H = decltype(half)::value, ci0 = H ? 3 : 0, ci1 = H ? kCausal : 3;
        const int c = (w - 2 * NC) >> 1, jc = 16 * c;
        const size_t v_stride = (size_t)H_v * kD;
        float* O = sm.O[c][H];
        for (int j = 0; j < i_hi - i_lo; ++j) {
            const int i = i_lo + j, b = j % kNB;
            const auto& B = sm.ob[b];
            const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
            CCLK(0);
            mbar_wait(&sm.tiles_o[b], (j / kNB) & 1);
            CCLK(1);
            mbar_wait(&sm.full_s[c][j & 1], (j >> 1) & 1);
            CCLK(2);
            uint32_t sa[kD / 16][4];
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks) to_frag(sa[ks], sm.sa[c][j & 1][ks][lane]);
            // X^T = S^T Q^T; X^T e^G is the start of O^T.
            float xo[1][4][4];
            {
                float x[4][4], x2[4][4];
                chain_rows_product<H>(x, x2, sa, B.Q, lane);
#pragma unroll
                for (int u = 0; u < 4; ++u)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float re = B.eG[32 * H + 8 * u + 2 * tq + e];
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) xo[0][u][2 * hh + e] = (x[u][2 * hh + e] + x2[u][2 * hh + e]) * re;
                    }
            }
            CCLK(3);
            uint32_t bm[ci1 - ci0][4];  // this warp's causal steps' QKM fragments at once
#pragma unroll
            for (int ci = ci0; ci < ci1; ++ci) ldsm_x4(bm[ci - ci0], b_addr(B.M, kSwz, 16 * causal_p(ci), 16 * causal_k(ci), lane));
            mbar_wait(&sm.full_d[c][j & 1], (j >> 1) & 1);
            uint32_t dma[kC / 16][4];
#pragma unroll
            for (int ks = 0; ks < 2 * (H + 1); ++ks) to_frag(dma[ks], sm.da[c][j & 1][ks][lane]);
            mbar_arrive(&sm.empty[c][j & 1]);  // this thread's reads of the hand-over buffers are done
            CCLK(4);
            // O^T += Delta^T QKM^T (s <= r).
#pragma unroll
            for (int ci = ci0; ci < ci1; ++ci) {
                mma(xo[0][2 * causal_p(ci) - 4 * H], dma[causal_k(ci)], bm[ci - ci0][0], bm[ci - ci0][1]);
                mma(xo[0][2 * causal_p(ci) + 1 - 4 * H], dma[causal_k(ci)], bm[ci - ci0][2], bm[ci - ci0][3]);
            }
            mbar_arrive(&sm.o_free[b]);  // and of the ring buffer
            CCLK(5);
            __syncwarp();  // the last step's flush has read the O tile
            o_to_tile<16>(O, xo, 0, gq, tq);
            __syncwarp();
            flush_out_tile<16, 32>(out, O, v_stride, h, v0 + jc, t0 + 32 * H, min(32, n - 32 * H), lane);
            CCLK(6);
        }
    };

    if (w < 2 * NC) {
        if (w & 1) state_warp(std::integral_constant<int, 1>{});
        else state_warp(std::integral_constant<int, 0>{});
    } else {
        if (w & 1) output_warp(std::integral_constant<int, 1>{});
        else output_warp(std::integral_constant<int, 0>{});
    }
}

// ---- the W-form scan on wgmma (GdnScan::Wgmma) ----
//
// Rearranged as fla's kernels do, so that a chunk step is two products: with
//   W = T diag(beta e^G) K [C, d_k],  U = T diag(beta) V [C, d_v],  Kd^T = (diag(e^{G_C - G}) K)^T [d_k, C]
// (stage 1b, below, one block per (chunk, value head), from stage 1's T):
//   Delta = U - W S0,   S_C = e^{G_C} S0 + Kd^T Delta,   O = e^G (Q S0) + QKM Delta.
// The scan's products are wgmma (Hopper's warpgroup MMA, operands in shared memory): the state
// group (warps 0-3) issues Y = W S (m64 nBV k16 x 8) and S += Kd^T Delta (2 x m64 nBV k16 x 4);
// the output group (warps 4-7) X = Q S and O = e^G X + QKM Delta, one chunk behind, as in the
// two-group kernel. Every operand is K-major in the "core matrix" layout of the no-swizzle mode
// (8 rows x 16 bytes contiguous; LBO = bytes between core matrices adjacent in K, SBO = adjacent
// in M / N, checked on the H200); the state's and Delta's bf16 copies (the B operands) are
// written from the accumulators by stmatrix.trans. Different bits from the other two kernels
// (U and W rounded to bf16 / fp32 as fla rounds its u and w).
// W and Kd^T are stored in the scan's shared-memory layout (cm_off: K-major core matrices) and U
// as [d_v / 16][C][16] (a block's columns contiguous), so that each lands with one bulk copy.
struct alignas(16) WRecord {
    bf16 W[kC * kD];    // [s][i]
    bf16 KdT[kD * kC];  // [i][s]
    float U[kC * kD];   // [j / 16][s][j % 16]
};
// Byte offset of element (row, col) in a K-major core-matrix tile of `cols` columns (K-fastest
// core matrices: LBO 128, SBO cols / 8 x 128).
__host__ __device__ constexpr int cm_off(int row, int col, int cols) {
    return ((row >> 3) * (cols >> 3) + (col >> 3)) * 128 + (row & 7) * 16 + (col & 7) * 2;
}

// T diag(beta e^G) into TG (pitch kPC) and T diag(beta) into TB (pitch tb_pitch; shared or
// global) from the record's T, NTH threads (T is zero above its diagonal blocks).
template <int NTH>
__device__ __forceinline__ void scaled_t(const ChunkRecord* R, const float* eG, const float* beta, bf16* TG, bf16* TB,
                                         int tb_pitch, int tid) {
    for (int idx = tid; idx < kC * kC / 2; idx += NTH) {
        const int r = idx >> 5, s = (idx & 31) * 2;
        const float t0v = __bfloat162float(R->T[r * kC + s]), t1v = __bfloat162float(R->T[r * kC + s + 1]);
        const float b0 = beta[s], b1 = beta[s + 1];
        *reinterpret_cast<uint32_t*>(TG + r * kPC + s) = pack_bf16(t0v * b0 * eG[s], t1v * b1 * eG[s + 1]);
        *reinterpret_cast<uint32_t*>(TB + r * tb_pitch + s) = pack_bf16(t0v * b0, t1v * b1);
    }
}

// Stage 1b: W, U and Kd^T of (chunk, value head) from stage 1's record and the chunk's K, V.
struct alignas(16) Stage1bSmem {
    bf16 K[kC * kPD];
    bf16 V[kC * kPD];
    bf16 TG[kC * kPC];  // T diag(beta e^G)
    bf16 TB[kC * kPC];  // T diag(beta)
    float eG[kC], beta[kC], eGC[kC];
};

__global__ void __launch_bounds__(kThreads) stage1b_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                           const int32_t* __restrict__ cstart, int n_seqs,
                                                           const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                           const ChunkRecord* __restrict__ rec, WRecord* __restrict__ wrec) {
    detail::pdl_entry();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Stage1bSmem& sm = *reinterpret_cast<Stage1bSmem*>(smem_raw);
    ChunkPos pos;
    if (!pos.init(offs, cstart, n_seqs)) return;
    const int c = pos.c, h = pos.h, t0 = pos.t0, n = pos.n;
    const int kh = key_head(sh, h), H_k = sh.H_k, H_v = sh.H_v;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const ChunkRecord* R = rec + (size_t)c * H_v + h;
    WRecord* WR = wrec + (size_t)c * H_v + h;
    {
        const int cc = (tid & 15) * 8;
        copy_row_tile<kThreads>(sm.K, k + (size_t)kh * kD + cc, (size_t)H_k * kD, t0, n, tid >> 4, cc);
        copy_row_tile<kThreads>(sm.V, v + (size_t)h * kD + cc, (size_t)H_v * kD, t0, n, tid >> 4, cc);
        if (tid < 48) cp_async16(sm.eG + 4 * tid, R->eG + 4 * tid, true);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    scaled_t<kThreads>(R, sm.eG, sm.beta, sm.TG, sm.TB, kPC, tid);
    __syncthreads();
    // W = TG K and U = TB V for rows [16 w, 16 w + 16): k16 steps s <= rows (T is lower triangular).
#pragma unroll 1
    for (int np = 0; np < kD / 16; ++np) {  // pairs of n8 tiles
        float aw[2][4] = {}, au[2][4] = {};
        for (int ks = 0; ks <= w; ++ks) {
            uint32_t ag[4], ab[4], bk[4], bv[4];
            ldsm_x4(ag, a_addr(sm.TG, kPC, 16 * w, 16 * ks, lane));
            ldsm_x4(ab, a_addr(sm.TB, kPC, 16 * w, 16 * ks, lane));
            ldsm_x4_t(bk, bt_addr(sm.K, kPD, 16 * ks, 16 * np, lane));
            ldsm_x4_t(bv, bt_addr(sm.V, kPD, 16 * ks, 16 * np, lane));
            mma(aw[0], ag, bk[0], bk[1]);
            mma(aw[1], ag, bk[2], bk[3]);
            mma(au[0], ab, bv[0], bv[1]);
            mma(au[1], ab, bv[2], bv[3]);
        }
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int r = 16 * w + gq + 8 * hh, col = 16 * np + 8 * nn + 2 * tq;
                *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(WR->W) + cm_off(r, col, kD)) =
                    pack_bf16(aw[nn][2 * hh], aw[nn][2 * hh + 1]);
                *reinterpret_cast<float2*>(WR->U + (col >> 4) * (kC * 16) + r * 16 + (col & 15)) =
                    make_float2(au[nn][2 * hh], au[nn][2 * hh + 1]);
            }
    }
    // Kd^T[i][s] = K[s][i] e^{G_C - G_s}, pairs of s per thread.
    for (int idx = tid; idx < kD * kC / 2; idx += kThreads) {
        const int i = idx >> 5, s = (idx & 31) * 2;
        *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(WR->KdT) + cm_off(i, s, kC)) =
            pack_bf16(__bfloat162float(sm.K[s * kPD + i]) * sm.eGC[s], __bfloat162float(sm.K[(s + 1) * kPD + i]) * sm.eGC[s + 1]);
    }
}

// wgmma pieces (sm_90a).
__device__ __forceinline__ uint64_t wg_desc(const void* p, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = smem_u32(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d (m64 nN, f32, N / 2 registers a thread) = (accumulate ? d : 0) + A B, A [64][16] and B [N][16] K-major.
template <int N>
__device__ __forceinline__ void wgmma_bf16(float* d, uint64_t da, uint64_t db, int accumulate);
template <>
__device__ __forceinline__ void wgmma_bf16<16>(float* d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(da), "l"(db), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_bf16<32>(float* d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "%16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmma_bf16<64>(float* d, uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}
// Four 8x8 b16 fragments (the mma accumulator layout: lane l holds row l / 4, columns 2 (l % 4), +1)
// stored transposed: lane l gives the address of row l % 8 of fragment l / 8's transpose.
__device__ __forceinline__ void stsm_x4_t(void* p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_u32(p)), "r"(r0),
                 "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}
// 16-byte copies of a [rows][cols] bf16 tile (global row pitch gp elements, rows >= n zero) into
// the core-matrix layout, by `nth` threads.
template <int ROWS, int COLS>
__device__ __forceinline__ void load_cm(bf16* dst, const bf16* src, size_t gp, int n, int tid, int nth) {
    constexpr int kPer = COLS / 8;
    for (int idx = tid; idx < ROWS * kPer; idx += nth) {
        const int r = idx / kPer, c8 = (idx % kPer) * 8;
        cp_async16(reinterpret_cast<char*>(dst) + cm_off(r, c8, COLS), src + (size_t)(r < n ? r : 0) * gp + c8, r < n);
    }
}

template <int BV>
struct alignas(16) WgSmem {
    bf16 W[2][kC * kD];     // state ring: W, Kd^T, U slice (fp32 [s][BV]), e^{G_C}
    bf16 KdT[2][kD * kC];
    float U[2][kC * BV];
    float eGC[2][4];
    bf16 Q[2][kC * kD];     // output ring: Q, QKM, e^G
    bf16 M[2][kC * kC];
    float eG[2][kC];
    bf16 Sb[2][BV * kD];    // S^T in bf16 ([j][i], core layout), by chunk parity
    bf16 Db[2][BV * kC];    // Delta^T in bf16 ([j][s], core layout), by chunk parity
    uint64_t full_s[2], full_d[2], empty[2];
    uint64_t r_full[2];  // the state ring's bulk copies landed
};

template <int BV, typename OutT>
__global__ void __launch_bounds__(256, 1) stage2_wg_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                           const int32_t* __restrict__ cstart,
                                                           const bf16* __restrict__ q, const ChunkRecord* __restrict__ rec,
                                                           const WRecord* __restrict__ wrec, float* __restrict__ state,
                                                           OutT* __restrict__ out, const int32_t* __restrict__ slots) {
    detail::pdl_entry();
    constexpr int NJ = BV / 8;  // n8 blocks
    extern __shared__ __align__(16) unsigned char smem_raw[];
    WgSmem<BV>& sm = *reinterpret_cast<WgSmem<BV>*>(smem_raw);
    const int vs = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
    const int t_begin = offs[seq], t_end = offs[seq + 1];
    if (t_begin == t_end) return;
    const int c_first = cstart[seq], n_chunks = cstart[seq + 1] - c_first;
    const int H_k = sh.H_k, H_v = sh.H_v, kh = key_head(sh, h), v0 = vs * BV;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int gt = tid & 127, gw = w & 3;
    if (tid == 0) {
        for (int p = 0; p < 2; ++p) {
            mbar_init(&sm.full_s[p], 128);
            mbar_init(&sm.full_d[p], 128);
            mbar_init(&sm.empty[p], 128);
            mbar_init(&sm.r_full[p], 1);
        }
    }
    __syncthreads();
    // stmatrix.trans addressing: this lane's fragment f = lane / 8 of an x4 group and row lane % 8.
    const int fr = lane >> 3, rr = lane & 7;
    if (w < 4) {
        float* Sg = state + ((size_t)(slots ? slots[seq] : seq) * H_v + h) * kD * kD;
        // S[i][j] as two m64 tiles (i = 64 T + 16 gw + gq (+8)), j = 8 jb + 2 tq (+1): accumulators.
        float S[2][BV / 2];
#pragma unroll
        for (int T = 0; T < 2; ++T)
#pragma unroll
            for (int jb = 0; jb < NJ; ++jb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = 64 * T + 16 * gw + gq + 8 * (e >> 1), j = 8 * jb + 2 * tq + (e & 1);
                    S[T][4 * jb + e] = Sg[(size_t)(v0 + j) * kD + i];
                }
        // The state ring by bulk copies from one thread: no cp.async in this group, so its
        // fence.proxy.async (a MEMBAR) never waits for copies in flight (ncu: the cp.async version
        // spent most of its time there and in the copies' address arithmetic).
        auto load_chunk = [&](int i, int b) {
            if (gt != 0) return;
            const WRecord* WR = wrec + (size_t)(c_first + i) * H_v + h;
            mbar_arrive_expect_tx(&sm.r_full[b], uint32_t(sizeof(sm.W[0]) + sizeof(sm.KdT[0]) + sizeof(sm.U[0]) + 16));
            bulk_copy(sm.W[b], WR->W, sizeof(sm.W[0]), &sm.r_full[b]);
            bulk_copy(sm.KdT[b], WR->KdT, sizeof(sm.KdT[0]), &sm.r_full[b]);
            bulk_copy(sm.U[b], WR->U + (v0 >> 4) * (kC * 16), sizeof(sm.U[0]), &sm.r_full[b]);
            bulk_copy(sm.eGC[b], rec[(size_t)(c_first + i) * H_v + h].eG + kC - 4, 16, &sm.r_full[b]);
        };
        load_chunk(0, 0);
        for (int i = 0; i < n_chunks; ++i) {
            const int b = i & 1;
            bf16* Sb = sm.Sb[b];
            bf16* Db = sm.Db[b];
            if (i >= 2) mbar_wait(&sm.empty[b], ((i >> 1) - 1) & 1);
            // S^T to Sb: fragment (T, half hh, block jb) = rows i of core matrix (jb, 8 T + 2 gw + hh) transposed.
#pragma unroll
            for (int T = 0; T < 2; ++T)
#pragma unroll
                for (int jp = 0; jp < NJ / 2; ++jp) {  // x4 = (hh, jb) for hh in 0..1, jb in {2 jp, 2 jp + 1}
                    const int jb = 2 * jp + (fr >> 1), hh = fr & 1;
                    char* p = reinterpret_cast<char*>(Sb) + (jb * (kD / 8) + 8 * T + 2 * gw + hh) * 128 + rr * 16;
                    stsm_x4_t(p, pack_bf16(S[T][8 * jp + 0], S[T][8 * jp + 1]), pack_bf16(S[T][8 * jp + 2], S[T][8 * jp + 3]),
                              pack_bf16(S[T][8 * jp + 4], S[T][8 * jp + 5]), pack_bf16(S[T][8 * jp + 6], S[T][8 * jp + 7]));
                }
            fence_async_smem();
            mbar_arrive(&sm.full_s[b]);
            mbar_wait(&sm.r_full[b], (i >> 1) & 1);  // chunk i's tiles landed
            group_sync(1);  // the whole Sb visible; the group is done with chunk i - 1
            if (i + 1 < n_chunks) load_chunk(i + 1, b ^ 1);
            // Y = W S: [64 s][BV j], K = d_k.
            float Y[BV / 2] = {};
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks)
                wgmma_bf16<BV>(Y, wg_desc(reinterpret_cast<const char*>(sm.W[b]) + 256 * ks, 128, kD / 8 * 128),
                               wg_desc(reinterpret_cast<const char*>(Sb) + 256 * ks, 128, kD / 8 * 128), ks > 0);
            wg_commit();
            wg_wait0();
            // Delta = U - Y, to Db as Delta^T (fragment (hh, jb) = rows s of core matrix (jb, 2 gw + hh)).
            float D[BV / 2];
#pragma unroll
            for (int jb = 0; jb < NJ; ++jb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int s = 16 * gw + gq + 8 * (e >> 1), j = 8 * jb + 2 * tq + (e & 1);
                    D[4 * jb + e] = sm.U[b][(j >> 4) * (kC * 16) + s * 16 + (j & 15)] - Y[4 * jb + e];
                }
#pragma unroll
            for (int jp = 0; jp < NJ / 2; ++jp) {
                const int jb = 2 * jp + (fr >> 1), hh = fr & 1;
                char* p = reinterpret_cast<char*>(Db) + (jb * (kC / 8) + 2 * gw + hh) * 128 + rr * 16;
                stsm_x4_t(p, pack_bf16(D[8 * jp + 0], D[8 * jp + 1]), pack_bf16(D[8 * jp + 2], D[8 * jp + 3]),
                          pack_bf16(D[8 * jp + 4], D[8 * jp + 5]), pack_bf16(D[8 * jp + 6], D[8 * jp + 7]));
            }
            fence_async_smem();
            mbar_arrive(&sm.full_d[b]);
            group_sync(1);  // the whole Db visible
            // S = e^{G_C} S + Kd^T Delta: two m64 tiles of i, K = s.
            const float eGC = sm.eGC[b][3];
#pragma unroll
            for (int T = 0; T < 2; ++T)
#pragma unroll
                for (int e = 0; e < BV / 2; ++e) S[T][e] *= eGC;
            wg_fence();
#pragma unroll
            for (int T = 0; T < 2; ++T)
#pragma unroll
                for (int ks = 0; ks < kC / 16; ++ks)
                    wgmma_bf16<BV>(S[T],
                                   wg_desc(reinterpret_cast<const char*>(sm.KdT[b]) + T * 8 * 1024 + 256 * ks, 128, kC / 8 * 128),
                                   wg_desc(reinterpret_cast<const char*>(Db) + 256 * ks, 128, kC / 8 * 128), 1);
            wg_commit();
            wg_wait0();
        }
#pragma unroll
        for (int T = 0; T < 2; ++T)
#pragma unroll
            for (int jb = 0; jb < NJ; ++jb)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = 64 * T + 16 * gw + gq + 8 * (e >> 1), j = 8 * jb + 2 * tq + (e & 1);
                    Sg[(size_t)(v0 + j) * kD + i] = S[T][4 * jb + e];
                }
    } else {
        const size_t qk_stride = (size_t)H_k * kD, v_stride = (size_t)H_v * kD;
        auto load_chunk = [&](int i, int b) {
            const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
            load_cm<kC, kD>(sm.Q[b], q + (size_t)t0 * qk_stride + (size_t)kh * kD, qk_stride, n, gt, 128);
            const ChunkRecord* R = rec + (size_t)(c_first + i) * H_v + h;
            load_cm<kC, kC>(sm.M[b], R->QKM, kC, kC, gt, 128);
            if (gt < 16) cp_async16(sm.eG[b] + 4 * gt, R->eG + 4 * gt, true);
        };
        load_chunk(0, 0);
        cp_async_commit();
        for (int i = 0; i < n_chunks; ++i) {
            const int b = i & 1;
            const int t0 = t_begin + i * kC, n = min(kC, t_end - t0);
            cp_async_wait_all();
            fence_async_smem();
            group_sync(2);
            if (i + 1 < n_chunks) load_chunk(i + 1, b ^ 1);
            cp_async_commit();
            float X[BV / 2] = {};
            mbar_wait(&sm.full_s[b], (i >> 1) & 1);
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < kD / 16; ++ks)
                wgmma_bf16<BV>(X, wg_desc(reinterpret_cast<const char*>(sm.Q[b]) + 256 * ks, 128, kD / 8 * 128),
                               wg_desc(reinterpret_cast<const char*>(sm.Sb[b]) + 256 * ks, 128, kD / 8 * 128), ks > 0);
            wg_commit();
            wg_wait0();
            const float e0 = sm.eG[b][16 * gw + gq], e1 = sm.eG[b][16 * gw + gq + 8];
#pragma unroll
            for (int e = 0; e < BV / 2; ++e) X[e] *= (e & 2) ? e1 : e0;
            mbar_wait(&sm.full_d[b], (i >> 1) & 1);
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < kC / 16; ++ks)
                wgmma_bf16<BV>(X, wg_desc(reinterpret_cast<const char*>(sm.M[b]) + 256 * ks, 128, kC / 8 * 128),
                               wg_desc(reinterpret_cast<const char*>(sm.Db[b]) + 256 * ks, 128, kC / 8 * 128), 1);
            wg_commit();
            wg_wait0();
            mbar_arrive(&sm.empty[b]);
#pragma unroll
            for (int jb = 0; jb < NJ; ++jb)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int r = 16 * gw + gq + 8 * hh, j = 8 * jb + 2 * tq;
                    if (r >= n) continue;
                    OutT* dst = out + (size_t)(t0 + r) * v_stride + (size_t)h * kD + v0 + j;
                    if constexpr (sizeof(OutT) == 4) {
                        *reinterpret_cast<float2*>(dst) = make_float2(X[4 * jb + 2 * hh], X[4 * jb + 2 * hh + 1]);
                    } else {
                        *reinterpret_cast<uint32_t*>(dst) = pack_bf16(X[4 * jb + 2 * hh], X[4 * jb + 2 * hh + 1]);
                    }
                }
        }
    }
}

// ---- transition scan (GdnScan::Transition) ----
//
// The chunk step as one affine map of the state, so that the chain from one chunk's state to
// the next is a single product (k-depth 128) instead of three (Y = K S, Delta = T Delta',
// S += Kd^T Delta: k-depth 128 + 64 + 64, two hand-overs between warps):
//   Delta = U - W S0,              U = T diag(beta) V,  W = T diag(beta e^G) K       [C, d]
//   S_C   = e^{G_C} S0 + Pn S0 + Kd^T U,    Pn = -(Kd^T W) = -(K^T diag(e^{G_C - G}) W)   [d_k, d_k]
//   O     = Qt S0 + QKM U,          Qt = diag(e^G) Q - QKM W                           [C, d_k]
// Stage 1t (one block per (chunk, value head), after stage 1) writes Pn, Qt and T diag(beta) in
// bf16; the scan (value slices of BV = 16 or 32 columns, 8 warps) keeps S^T [BV][128] in fp32
// accumulators, warp w owning state columns [16 w, 16 w + 16) and chunk rows [8 w, 8 w + 8) of U
// and O, and per chunk:
//   U^T = V^T (T diag(beta))^T  [BV, 64]   (off the chain: computed a step ahead)
//   S^T = e^{G_C} S^T + (U^T .* e^{G_C - G}) K + S^T Pn^T
//   O^T = S^T Qt^T + U^T QKM^T
// Other bits than the other scans (Pn, Qt, U rounded to bf16 where they round Delta' and Delta);
// closer to an fp64 recurrence (2.9e-3 / 1.6e-3 out / state, two groups 3.3e-3 / 2.4e-3). Half
// the two-group scan's speed on the H100 (bench/RESULTS.md, session 35): a step moves 83 KB a
// block (Pn alone is 32 KB per chunk and head) and stage 1t is 2.2x stage 1, so the gate never
// picks it; kept as the per-chunk transition a segmented scan would multiply.
struct alignas(16) TRecord {
    bf16 Pn[kD * kD];  // [i][k]
    bf16 Qt[kC * kD];  // [r][i]
    bf16 TB[kC * kC];  // T diag(beta), [r][s]
};

// A operand from a [k][m] tile (row-major, pitch P) with ldmatrix.trans: A[m][k] = t[k][m].
__device__ __forceinline__ const bf16* at_addr(const bf16* t, int P, int m0, int k0, int lane) {
    return t + (k0 + (lane & 7) + ((lane >> 4) << 3)) * P + m0 + (((lane >> 3) & 1) << 3);
}

// Stage 1t's shared memory. W, TG and M are dead once Qt is done: Pn is staged there ([i][k],
// pitch kPD) for coalesced stores; Qt overwrites Q in place.
struct alignas(16) Stage1tSmem {
    bf16 K[kC * kPD];
    bf16 Q[kC * kPD];   // then Qt
    bf16 Wd[kC * kPD];  // diag(e^{G_C - G}) W
    union alignas(16) {
        struct alignas(16) {
            bf16 W[kC * kPD];   // T diag(beta e^G) K
            bf16 TG[kC * kPC];  // T diag(beta e^G)
            bf16 M[kC * kPC];   // QKM
        } a;
        bf16 Pn[kD * kPD];
    } u;
    float eG[kC], beta[kC], eGC[kC];
};
constexpr int kS1tThreads = 256;  // 8 warps

// A [rows][128] bf16 tile at pitch kPD to a dense [rows][128] array, 16-byte stores.
template <int ROWS>
__device__ __forceinline__ void store_tile128(bf16* dst, const bf16* src, int tid) {
#pragma unroll
    for (int it = 0; it < ROWS * 16 / kS1tThreads; ++it) {
        const int idx = tid + it * kS1tThreads, r = idx >> 4, cc = (idx & 15) * 8;
        *reinterpret_cast<uint4*>(dst + r * kD + cc) = *reinterpret_cast<const uint4*>(src + r * kPD + cc);
    }
}

__global__ void __launch_bounds__(kS1tThreads) stage1t_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                              const int32_t* __restrict__ cstart, int n_seqs,
                                                              const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                              const ChunkRecord* __restrict__ rec, TRecord* __restrict__ trec) {
    detail::pdl_entry();
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Stage1tSmem& sm = *reinterpret_cast<Stage1tSmem*>(smem_raw);
    ChunkPos pos;
    if (!pos.init(offs, cstart, n_seqs)) return;
    const int c = pos.c, h = pos.h, t0 = pos.t0, n = pos.n;
    const int kh = key_head(sh, h), H_k = sh.H_k, H_v = sh.H_v;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    // W and Qt: warp w takes rows [16 (w & 3), +16) and column pairs [4 (w >> 2), +4).
    const int rw = 16 * (w & 3), np0 = 4 * (w >> 2), kc = (w & 3) + 1;
    const ChunkRecord* R = rec + (size_t)c * H_v + h;
    TRecord* TR = trec + (size_t)c * H_v + h;
    {
        const int cc = (tid & 15) * 8;
        copy_row_tile<kS1tThreads>(sm.K, k + (size_t)kh * kD + cc, (size_t)H_k * kD, t0, n, tid >> 4, cc);
        copy_row_tile<kS1tThreads>(sm.Q, q + (size_t)kh * kD + cc, (size_t)H_k * kD, t0, n, tid >> 4, cc);
#pragma unroll
        for (int it = 0; it < kC * 8 / kS1tThreads; ++it) {
            const int r = (tid >> 3) + it * (kS1tThreads / 8), c8 = (tid & 7) * 8;
            cp_async16(sm.u.a.M + r * kPC + c8, R->QKM + r * kC + c8, true);
        }
        if (tid < 48) cp_async16(sm.eG + 4 * tid, R->eG + 4 * tid, true);  // eG, beta, eGC
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
    scaled_t<kS1tThreads>(R, sm.eG, sm.beta, sm.u.a.TG, TR->TB, kC, tid);  // TB straight to the record
    __syncthreads();
    // W = TG K and Wd = diag(e^{G_C - G}) W (k16 steps s <= rows).
#pragma unroll
    for (int np = np0; np < np0 + 4; ++np) {
        float aw[2][4] = {};
        for (int ks = 0; ks < kc; ++ks) {
            uint32_t ag[4], bk[4];
            ldsm_x4(ag, a_addr(sm.u.a.TG, kPC, rw, 16 * ks, lane));
            ldsm_x4_t(bk, bt_addr(sm.K, kPD, 16 * ks, 16 * np, lane));
            mma(aw[0], ag, bk[0], bk[1]);
            mma(aw[1], ag, bk[2], bk[3]);
        }
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int r = rw + gq + 8 * hh, col = 16 * np + 8 * nn + 2 * tq;
                const float f = sm.eGC[r];
                *reinterpret_cast<uint32_t*>(sm.u.a.W + r * kPD + col) = pack_bf16(aw[nn][2 * hh], aw[nn][2 * hh + 1]);
                *reinterpret_cast<uint32_t*>(sm.Wd + r * kPD + col) = pack_bf16(aw[nn][2 * hh] * f, aw[nn][2 * hh + 1] * f);
            }
    }
    __syncthreads();
    // Qt = diag(e^G) Q - QKM W (QKM is zero above the diagonal), over Q in place.
#pragma unroll
    for (int np = np0; np < np0 + 4; ++np) {
        float acc[2][4] = {};
        for (int ks = 0; ks < kc; ++ks) {
            uint32_t am[4], bw[4];
            ldsm_x4(am, a_addr(sm.u.a.M, kPC, rw, 16 * ks, lane));
            ldsm_x4_t(bw, bt_addr(sm.u.a.W, kPD, 16 * ks, 16 * np, lane));
            mma(acc[0], am, bw[0], bw[1]);
            mma(acc[1], am, bw[2], bw[3]);
        }
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int r = rw + gq + 8 * hh, col = 16 * np + 8 * nn + 2 * tq;
                const float e = sm.eG[r];
                bf16* qp = sm.Q + r * kPD + col;
                const float q0 = __bfloat162float(qp[0]), q1 = __bfloat162float(qp[1]);
                *reinterpret_cast<uint32_t*>(qp) = pack_bf16(e * q0 - acc[nn][2 * hh], e * q1 - acc[nn][2 * hh + 1]);
            }
    }
    __syncthreads();  // Qt complete; W, TG, M dead
    store_tile128<kC>(TR->Qt, sm.Q, tid);
    // Pn = -(K^T Wd), rows i in [16 w, 16 w + 16): A = K^T from the [r][i] tile (ldmatrix.trans).
#pragma unroll 2
    for (int np = 0; np < kD / 16; ++np) {
        float acc[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < kC / 16; ++ks) {
            uint32_t a[4], bw[4];
            ldsm_x4_t(a, at_addr(sm.K, kPD, 16 * w, 16 * ks, lane));
            ldsm_x4_t(bw, bt_addr(sm.Wd, kPD, 16 * ks, 16 * np, lane));
            mma(acc[0], a, bw[0], bw[1]);
            mma(acc[1], a, bw[2], bw[3]);
        }
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int i = 16 * w + gq + 8 * hh, col = 16 * np + 8 * nn + 2 * tq;
                *reinterpret_cast<uint32_t*>(sm.u.Pn + i * kPD + col) = pack_bf16(-acc[nn][2 * hh], -acc[nn][2 * hh + 1]);
            }
    }
    __syncthreads();
    store_tile128<kD>(TR->Pn, sm.u.Pn, tid);
}

// Transition-scan blocks take BV = 16 or 32 value columns (4 warps); one buffer each for the
// bf16 state, U^T and O (each is written between the step's two barriers), two for the tiles.
template <int BV>
struct alignas(16) TransBuf {
    bf16 K[kC * kPD];
    bf16 Pn[kD * kPD];
    bf16 Qt[kC * kPD];
    bf16 TB[kC * kPC];
    bf16 M[kC * kPC];
    bf16 V[kC * (BV + 8)];
    float eG[kC], beta[kC], eGC[kC];
};
template <int BV>
struct alignas(16) TransSmem {
    TransBuf<BV> buf[2];
    bf16 Sb[BV * kPD];  // S^T at the chunk's start in bf16, [j][i]
    bf16 Ub[BV * kPC];  // U^T, [j][r]
    bf16 Ue[BV * kPC];  // U^T .* e^{G_C - G}
    float O[kC * (BV + 4)];
};
static_assert(sizeof(TransSmem<32>) <= 232448, "transition scan: shared memory over 227 KB");

// Chunk c's tiles into B (NTH threads; rows past the chunk's end zero).
template <int BV, int NTH>
struct TransTiles {
    static constexpr int kVPerRow = BV / 8, kVItems = kC * kVPerRow;  // V: BV / 8 x 16 B per row
    int tid, qk_cc, qk_r0, t_begin, t_end, c_first, H_v, h;
    size_t qk_stride, v_stride;
    const bf16 *k_col, *v_col;
    const ChunkRecord* rec;
    const TRecord* trec;
    __device__ TransTiles(const ref::GdnShape& sh, int t_begin_, int t_end_, int c_first_, int h_, int v0, const bf16* k,
                          const bf16* v, const ChunkRecord* rec_, const TRecord* trec_, int tid_)
        : tid(tid_), qk_cc((tid_ & 15) * 8), qk_r0(tid_ >> 4), t_begin(t_begin_), t_end(t_end_), c_first(c_first_),
          H_v(sh.H_v), h(h_), qk_stride((size_t)sh.H_k * kD), v_stride((size_t)sh.H_v * kD), rec(rec_), trec(trec_) {
        k_col = k + (size_t)key_head(sh, h_) * kD + qk_cc;
        v_col = v + (size_t)h_ * kD + v0;
    }
    __device__ __forceinline__ void load(int c, TransBuf<BV>& B) const {
        const int t0 = t_begin + (c - c_first) * kC, n = min(kC, t_end - t0);
        copy_row_tile<NTH>(B.K, k_col, qk_stride, t0, n, qk_r0, qk_cc);
#pragma unroll
        for (int it = 0; it < (kVItems + NTH - 1) / NTH; ++it) {
            const int idx = tid + it * NTH, r = idx / kVPerRow, cc = (idx % kVPerRow) * 8;
            if (kVItems >= NTH || idx < kVItems)
                cp_async16(B.V + r * (BV + 8) + cc, v_col + cc + (size_t)(t0 + (r < n ? r : 0)) * v_stride, r < n);
        }
        const TRecord* TR = trec + (size_t)c * H_v + h;
        const ChunkRecord* R = rec + (size_t)c * H_v + h;
#pragma unroll
        for (int it = 0; it < kD * 16 / NTH; ++it) {
            const int idx = tid + it * NTH, r = idx >> 4, cc = (idx & 15) * 8;
            cp_async16(B.Pn + r * kPD + cc, TR->Pn + r * kD + cc, true);
        }
#pragma unroll
        for (int it = 0; it < kC * 16 / NTH; ++it) {
            const int idx = tid + it * NTH, r = idx >> 4, cc = (idx & 15) * 8;
            cp_async16(B.Qt + r * kPD + cc, TR->Qt + r * kD + cc, true);
        }
#pragma unroll
        for (int it = 0; it < kC * 8 / NTH; ++it) {
            const int idx = tid + it * NTH, r = idx >> 3, cc = (idx & 7) * 8;
            cp_async16(B.TB + r * kPC + cc, TR->TB + r * kC + cc, true);
            cp_async16(B.M + r * kPC + cc, R->QKM + r * kC + cc, true);
        }
        if (tid < 48) cp_async16(B.eG + 4 * tid, R->eG + 4 * tid, true);  // eG, beta, eGC
    }
};

// U^T [BV][64] of the chunk in B, this warp's rows r in [r_w, r_w + 8 kNR), into Ub and (times
// e^{G_C - G_r}) Ue.
template <int BV, int kNR>
__device__ __forceinline__ void trans_u(bf16* Ub, bf16* Ue, const TransBuf<BV>& B, int r_w, int k_causal, int lane) {
    constexpr int MT = BV / 16;
    const int gq = lane >> 2, tq = lane & 3;
    float u[MT][kNR][4] = {};
    for (int ks = 0; ks < k_causal; ++ks) {
        uint32_t a[MT][4], b[2 * kNR];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4_t(a[mt], at_addr(B.V, BV + 8, 16 * mt, 16 * ks, lane));
        load_b_rows(b, B.TB, kPC, r_w, 16 * ks, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNR; ++nt) mma(u[mt][nt], a[mt], b[2 * nt], b[2 * nt + 1]);
    }
#pragma unroll
    for (int nt = 0; nt < kNR; ++nt) {
        const int r = r_w + 8 * nt + 2 * tq;
        const float f0 = B.eGC[r], f1 = B.eGC[r + 1];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int j = 16 * mt + gq + 8 * hh;
                *reinterpret_cast<uint32_t*>(Ub + j * kPC + r) = pack_bf16(u[mt][nt][2 * hh], u[mt][nt][2 * hh + 1]);
                *reinterpret_cast<uint32_t*>(Ue + j * kPC + r) =
                    pack_bf16(u[mt][nt][2 * hh] * f0, u[mt][nt][2 * hh + 1] * f1);
            }
    }
}

// NW warps (4 or 8): warp w owns state columns [128 / NW w, +128 / NW) and chunk rows
// [64 / NW w, +64 / NW) of U and O.
template <int BV, int NW, typename OutT>
__global__ void __launch_bounds__(32 * NW, 1) stage2_trans_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                                  const int32_t* __restrict__ cstart,
                                                                  const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                                  const ChunkRecord* __restrict__ rec,
                                                                  const TRecord* __restrict__ trec,
                                                                  float* __restrict__ state, OutT* __restrict__ out,
                                                                  const int32_t* __restrict__ slots) {
    detail::pdl_entry();
    constexpr int MT = BV / 16, NTH = 32 * NW;
    constexpr int kIW = kD / NW, kNI = kIW / 8, kNP = kNI / 2;  // state columns a warp, n8 tiles, pairs
    constexpr int kRW = kC / NW, kNR = kRW / 8;                 // chunk rows a warp, n8 tiles
    extern __shared__ __align__(16) unsigned char smem_raw[];
    TransSmem<BV>& sm = *reinterpret_cast<TransSmem<BV>*>(smem_raw);
    const ScanSeq sq(sh, offs, cstart, state, slots);
    if (sq.t_begin == sq.t_end) return;
    const int h = sq.h, t_begin = sq.t_begin, t_end = sq.t_end, c_first = sq.c_first, c_last = sq.c_last;
    const int v0 = sq.vs * BV;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const int i_w = kIW * w, r_w = kRW * w;  // this warp's state columns and chunk rows
    const int k_causal = (r_w + kRW - 1) / 16 + 1;
    float* Sg = sq.state;
    float S[MT][kNI][4];
    load_state(S, Sg, v0, i_w, gq, tq);
    const TransTiles<BV, NTH> tiles(sh, t_begin, t_end, c_first, h, v0, k, v, rec, trec, tid);
    const size_t v_stride = (size_t)sh.H_v * kD;

    tiles.load(c_first, sm.buf[0]);
    cp_async_commit();
    if (c_first + 1 < c_last) tiles.load(c_first + 1, sm.buf[1]);
    cp_async_commit();
    state_to_bf16(sm.Sb, S, i_w, gq, tq);
    cp_async_wait<1>();
    __syncthreads();
    trans_u<BV, kNR>(sm.Ub, sm.Ue, sm.buf[0], r_w, k_causal, lane);
    __syncthreads();
    for (int c = c_first; c < c_last; ++c) {
        const int x = (c - c_first) & 1;
        const TransBuf<BV>& B = sm.buf[x];
        const int t0 = t_begin + (c - c_first) * kC, n = min(kC, t_end - t0);
        // The chain: S^T = e^{G_C} S^T + Ue^T K + S^T Pn^T (Ue^T K and the odd k-steps into S2).
        const float eGCc = B.eG[kC - 1];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[mt][nt][e] *= eGCc;
        float S2[MT][kNI][4] = {}, xo[MT][kNR][4] = {}, xo2[MT][kNR][4] = {};
#pragma unroll
        for (int ks = 0; ks < kC / 16; ++ks) {
            uint32_t a[MT][4], bk[kNP][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_addr(sm.Ue, kPC, 16 * mt, 16 * ks, lane));
#pragma unroll
            for (int p = 0; p < kNP; ++p) ldsm_x4_t(bk[p], bt_addr(B.K, kPD, 16 * ks, i_w + 16 * p, lane));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int p = 0; p < kNP; ++p) {
                    mma(S2[mt][2 * p], a[mt], bk[p][0], bk[p][1]);
                    mma(S2[mt][2 * p + 1], a[mt], bk[p][2], bk[p][3]);
                }
        }
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks) {
            uint32_t a[MT][4], bp[kNP][4], bq[2 * kNR];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_addr(sm.Sb, kPD, 16 * mt, 16 * ks, lane));
#pragma unroll
            for (int p = 0; p < kNP; ++p) ldsm_x4(bp[p], b_addr(B.Pn, kPD, i_w + 16 * p, 16 * ks, lane));
            load_b_rows(bq, B.Qt, kPD, r_w, 16 * ks, lane);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
                for (int p = 0; p < kNP; ++p) {
                    mma(ks & 1 ? S2[mt][2 * p] : S[mt][2 * p], a[mt], bp[p][0], bp[p][1]);
                    mma(ks & 1 ? S2[mt][2 * p + 1] : S[mt][2 * p + 1], a[mt], bp[p][2], bp[p][3]);
                }
#pragma unroll
                for (int nt = 0; nt < kNR; ++nt)
                    mma(ks & 1 ? xo2[mt][nt] : xo[mt][nt], a[mt], bq[2 * nt], bq[2 * nt + 1]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNI; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[mt][nt][e] += S2[mt][nt][e];
        // O^T = S^T Qt^T + U^T QKM^T for this warp's rows (s <= r).
        causal_products(xo2, sm.Ub, B.M, r_w, k_causal, lane);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNR; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) xo[mt][nt][e] += xo2[mt][nt][e];
        o_to_tile<BV>(sm.O, xo, r_w, gq, tq);
        if (c + 1 < c_last) cp_async_wait_all();
        __syncthreads();  // chunk c + 1 landed; O visible; everyone is done with buffer x, Sb, Ub, Ue
        flush_out_tile<BV, NTH>(out, sm.O, v_stride, h, v0, t0, n, tid);
        if (c + 1 < c_last) {
            state_to_bf16(sm.Sb, S, i_w, gq, tq);
            trans_u<BV, kNR>(sm.Ub, sm.Ue, sm.buf[x ^ 1], r_w, k_causal, lane);
            if (c + 2 < c_last) tiles.load(c + 2, sm.buf[x]);
            cp_async_commit();
        }
        __syncthreads();  // S^T and U^T of chunk c + 1 visible; the O tile free
    }
    store_state(S, Sg, v0, i_w, gq, tq);
}

// fp32 -> bf16 (round to nearest even), 8 values per thread.
__global__ void to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, size_t n) {
    detail::pdl_entry();
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 4 <= n) {
        const float4 f = *reinterpret_cast<const float4*>(x + i);
        uint2 p;
        p.x = pack_bf16(f.x, f.y);
        p.y = pack_bf16(f.z, f.w);
        *reinterpret_cast<uint2*>(y + i) = p;
    } else {
        for (size_t j = i; j < n; ++j) y[j] = __float2bfloat16_rn(x[j]);
    }
}

void check_launch(const char* op) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw Error(std::string(op) + ": launch failed: " + cudaGetErrorString(err));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

size_t chunk_slots(int n_seqs, int n_tokens) { return (size_t(n_tokens) + size_t(kC - 1) * n_seqs) / kC; }
// cstart and segstart, [n_seqs + 1] int32 each.
size_t table_bytes(int n_seqs) { return 2 * ((size_t(n_seqs + 1) * sizeof(int32_t) + 255) / 256 * 256); }
int32_t* segstart_table(void* workspace, int n_seqs) {
    return reinterpret_cast<int32_t*>(static_cast<char*>(workspace) + table_bytes(n_seqs) / 2);
}

void check_chunked_shape(const ref::GdnShape& shape, int n_seqs, const char* op) {
    ref::detail::check_shape(shape, op);
    if (shape.d_k != kD) throw Error(std::string(op) + ": d_k " + std::to_string(shape.d_k) + " not supported (only 128)");
    if (shape.d_v != kD) throw Error(std::string(op) + ": d_v " + std::to_string(shape.d_v) + " not supported (only 128)");
    if (n_seqs < 0 || n_seqs > 65535)
        throw Error(std::string(op) + ": n_seqs " + std::to_string(n_seqs) + " not in [0, 65535]");
    if (shape.H_v > 65535) throw Error(std::string(op) + ": H_v " + std::to_string(shape.H_v) + " > 65535");
}

// A scan kernel's launch with `smem` bytes of dynamic shared memory (over the 48 KB default: the
// attribute is per kernel, set once per process).
template <auto Kernel, typename... Args>
void launch_scan(size_t smem, dim3 grid, dim3 block, cudaStream_t st, Args... args) {
#ifdef ALLOY_GDN_EXP_TIMING
    // Timing experiments, in a bench built by hand with -DALLOY_GDN_EXP_TIMING only (outputs are
    // wrong): ALLOY_GDN_EXP_ONE_SLICE=1 runs the first value slice of each head alone (the step
    // time without the other slices' L2 traffic); ALLOY_GDN_EXP_SKIP_LOADS=1 makes the two-group
    // scan reuse its first chunks' tiles (the step time without tile traffic); ALLOY_GDN_EXP_LIGHT=1
    // / 2 / 3 drops the output group's / the state group's / both groups' products.
    static const bool one_slice = [] { const char* e = std::getenv("ALLOY_GDN_EXP_ONE_SLICE"); return e && *e == '1'; }();
    if (one_slice) grid.x = 1;
    static const bool skip_loads = [] {
        const char* e = std::getenv("ALLOY_GDN_EXP_SKIP_LOADS");
        const int on = e && *e == '1';
        if (on) cudaMemcpyToSymbol(g_exp_skip_loads, &on, sizeof(on));
        return on;
    }();
    (void)skip_loads;
    static const bool light = [] {
        const char* e = std::getenv("ALLOY_GDN_EXP_LIGHT");
        const int v = e ? std::atoi(e) : 0;
        if (v) cudaMemcpyToSymbol(g_exp_light, &v, sizeof(v));
        return v != 0;
    }();
    (void)light;
#endif
    static bool configured = false;
    if (!configured) {
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        configured = true;
    }
    detail::launch("cuda::gdn_delta_chunked", Kernel, grid, block, smem, st, args...);
}

template <int BV, typename OutT>
void launch_stage2(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, const int32_t* cstart, const bf16* q,
                   const bf16* k, const bf16* v, const ChunkRecord* rec, float* state, OutT* out, const int32_t* slots,
                   cudaStream_t st) {
    launch_scan<stage2_kernel<BV, OutT>>(sizeof(Stage2Smem<BV>), dim3(kD / BV, sh.H_v, n_seqs), dim3(32 * scan_warps<BV>()),
                                         st, sh, offs, cstart, q, k, v, rec, state, out, slots);
}

// grid_z: n_seqs, or the segment slots of a segmented scan (sg.segstart set).
// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled() {
    static const EncodeTiledFn fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult res{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &res) != cudaSuccess ||
            res != cudaDriverEntryPointSuccess)
            p = nullptr;
        return reinterpret_cast<EncodeTiledFn>(p);
    }();
    return fn;
}
// A bf16 tensor map of rank 2 or 3 in 128-byte swizzled boxes (dims fastest first; strides of
// dims 1.. in bytes).
CUtensorMap bf16_tensor_map(const char* op, const void* base, cuuint32_t rank, const cuuint64_t* dims,
                            const cuuint64_t* strides, const cuuint32_t* box,
                            CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
    const EncodeTiledFn encode = encode_tiled();
    if (!encode) throw Error(std::string(op) + ": the TMA scan needs the driver's cuTensorMapEncodeTiled (not found)");
    CUtensorMap m;
    const cuuint32_t unit[3] = {1, 1, 1};
    const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), dims, strides, box, unit,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw Error(std::string(op) + ": cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ")");
    return m;
}

// The TMA scan's maps: k and q [n_tokens][H_k 128] in 64 x 64 boxes; the records' T and QKM
// [n_records][64][64] in 64 x 64 x 1 boxes.
PairMaps pair_maps(const char* op, const ref::GdnShape& sh, int n_tokens, const bf16* q, const bf16* k,
                   const ChunkRecord* rec, size_t n_records, const bf16* v = nullptr, int block_v = 0) {
    PairMaps m{};
    if (v) {  // the producer warp's V boxes: dense [64][block_v]
        const cuuint64_t v_dims[2] = {cuuint64_t(sh.H_v) * kD, cuuint64_t(n_tokens)};
        const cuuint64_t v_strides[1] = {cuuint64_t(sh.H_v) * kD * sizeof(bf16)};
        const cuuint32_t v_box[2] = {cuuint32_t(block_v), kC};
        m.v = bf16_tensor_map(op, v, 2, v_dims, v_strides, v_box, CU_TENSOR_MAP_SWIZZLE_NONE);
    }
    const cuuint64_t qk_dims[2] = {cuuint64_t(sh.H_k) * kD, cuuint64_t(n_tokens)};
    const cuuint64_t qk_strides[1] = {cuuint64_t(sh.H_k) * kD * sizeof(bf16)};
    const cuuint32_t qk_box[2] = {64, kC};
    m.k = bf16_tensor_map(op, k, 2, qk_dims, qk_strides, qk_box);
    m.q = bf16_tensor_map(op, q, 2, qk_dims, qk_strides, qk_box);
    const cuuint64_t rec_dims[3] = {kC, kC, cuuint64_t(n_records)};
    const cuuint64_t rec_strides[2] = {kC * sizeof(bf16), sizeof(ChunkRecord)};
    const cuuint32_t rec_box[3] = {kC, kC, 1};
    const char* r = reinterpret_cast<const char*>(rec);
    m.T = bf16_tensor_map(op, r + offsetof(ChunkRecord, T), 3, rec_dims, rec_strides, rec_box);
    m.M = bf16_tensor_map(op, r + offsetof(ChunkRecord, QKM), 3, rec_dims, rec_strides, rec_box);
    return m;
}

template <int BV, bool kTma, typename OutT, bool kProd = false>
void launch_stage2_pair(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, const int32_t* cstart, const bf16* q,
                        const bf16* k, const bf16* v, const ChunkRecord* rec, float* state, OutT* out,
                        const int32_t* slots, cudaStream_t st, const ScanSegments& sg, unsigned grid_z, int n_tokens,
                        size_t n_records) {
    const PairMaps maps = kTma ? pair_maps("cuda::gdn_delta_chunked", sh, n_tokens, q, k, rec, n_records,
                                           kProd ? v : nullptr, BV)
                               : PairMaps{};
    launch_scan<stage2_pair_kernel<BV, kTma, OutT, kProd>>(pair_smem_bytes<BV, kTma>(),
                                                           dim3(kD / BV, sh.H_v, grid_z),
                                                           dim3(kPairThreads + (kProd ? 32 : 0)), st, sh, offs, cstart,
                                                           q, k, v, rec, state, out, slots, sg, maps);
}

// The chain scan (GdnScan::Chains): NC = BV / 16 chains a block.
template <int NC, typename OutT>
void launch_stage2_chain(const ref::GdnShape& sh, const int32_t* offs, const int32_t* cstart, const bf16* q,
                         const bf16* k, const bf16* v, const ChunkRecord* rec, float* state, OutT* out,
                         const int32_t* slots, cudaStream_t st, const ScanSegments& sg, unsigned grid_z, int n_tokens,
                         size_t n_records) {
    const PairMaps maps = pair_maps("cuda::gdn_delta_chunked", sh, n_tokens, q, k, rec, n_records, v, 16 * NC);
    launch_scan<stage2_chain_kernel<NC, OutT>>(chain_smem_bytes<NC>(), dim3(kD / (16 * NC), sh.H_v, grid_z),
                                               dim3(chain_threads(NC)), st, sh, offs, cstart, q, k, v, rec, state, out,
                                               slots, sg, maps);
}

template <int BV, typename OutT>
void launch_stage2_wg(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, const int32_t* cstart, const bf16* q,
                      const ChunkRecord* rec, const WRecord* wrec, float* state, OutT* out, const int32_t* slots,
                      cudaStream_t st) {
    launch_scan<stage2_wg_kernel<BV, OutT>>(sizeof(WgSmem<BV>), dim3(kD / BV, sh.H_v, n_seqs), dim3(256), st, sh, offs,
                                            cstart, q, rec, wrec, state, out, slots);
}

template <int NW, typename OutT>
void launch_stage2_warp(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, const int32_t* cstart, const bf16* q,
                        const bf16* k, const bf16* v, const ChunkRecord* rec, float* state, OutT* out,
                        const int32_t* slots, cudaStream_t st) {
    launch_scan<stage2_warp_kernel<NW, OutT>>(sizeof(WarpScanSmem<NW>), dim3(kD / (16 * NW), sh.H_v, n_seqs),
                                              dim3(32 * NW), st, sh, offs, cstart, q, k, v, rec, state, out, slots);
}

template <int BV, int NW, typename OutT>
void launch_stage2_trans(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, const int32_t* cstart, const bf16* k,
                         const bf16* v, const ChunkRecord* rec, const TRecord* trec, float* state, OutT* out,
                         const int32_t* slots, cudaStream_t st) {
    launch_scan<stage2_trans_kernel<BV, NW, OutT>>(sizeof(TransSmem<BV>), dim3(kD / BV, sh.H_v, n_seqs),
                                                   dim3(32 * NW), st, sh, offs, cstart, k, v, rec, trec, state, out, slots);
}

int num_sms() {
    static int n = [] {
        int dev = 0, sms = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        return sms > 0 ? sms : 132;
    }();
    return n;
}

}  // namespace

// The launch gate: the value split with the least (waves of blocks over the SMs) x (cycles of
// one chunk step at that split, relative: 16 -> 1, 32 -> 1.25 (4 warps; H200 timings), 64 ->
// 2.5 (warp rows, 4 warps; session 40, H100, H_v 48: one wave of 64-column blocks took as long
// as two waves of 32-column ones). Stage 1 stays one block per (chunk, value head): sharing
// K K^T and Q K^T among the value heads of a key head (one block per key head, 168 registers,
// 3 blocks per SM) measured 2-3% slower at H_v 32 and 48.
// The 64-column split's scan: the two-group producer kernel (a ring of 2 state buffers; its chunk
// step measured ~1.65x a 32-column one's on an H100, session 41: unsegmented at H_v 16 / 32 / 48,
// T 65536, 3056 / 3411 / 3788 us against 32 columns' 1170 x 2 segments, 2323, 3505 x 2, stage 1
// taken out), so 2.1 in 16-column units; or warp rows (2.5) with ALLOY_GDN_SPLIT64_PAIR=0 (A/B).
// At H_v 48, T 2048 (no segments) the gate's split moves 32 -> 64 columns: 151.8 -> 136.0 us.
// The plan does not segment it (below), though the kernel can (`segments` given). (Without the
// driver's tensor-map encoder, which the producer warp's TMA copies need, run_chunked runs warp
// rows there instead: the same bits; the plan stays the same on every machine.)
static bool split64_pair() {
    static const bool on = [] { const char* e = std::getenv("ALLOY_GDN_SPLIT64_PAIR"); return !e || std::atoi(e) != 0; }();
    return on;
}
// A chunk step's relative cost at a value split (16, 32 or 64 columns a block). (Measured on the
// two-group scan. With the chain scan at 16 / 32 columns since session 42 a 32-column step costs
// ~1.5 16-column ones, but the costs stay: their plans measured fastest, and 1.5 would move H_v
// 48 at T >= 16384 from 32 x 2 segments (chains, 838.5 us at 16384, H100) to one wave of
// 64-column blocks (964.7 us).)
static double split_step_cost(int block_v) {
    return block_v == 16 ? 1.0 : block_v == 32 ? 1.25 : split64_pair() ? 2.1 : 2.5;
}
int gdn_delta_chunked_block_v(int heads, int sms) {
    int best = 16;
    double best_t = 1e30;
    for (int bv : {16, 32, 64}) {
        const int blocks = heads * (kD / bv);
        const double t = double((blocks + sms - 1) / sms) * split_step_cost(bv);
        if (t < best_t - 1e-9) best_t = t, best = bv;
    }
    return best;
}

// The segmented scan's gate (two-group kernel only): P segments of a 32-column split of the
// heads (n_seqs H_v) where its waves of blocks x (chunks / P + 1 warmup) steps at that split's
// cost beat the unsegmented gate's by 10%: few heads (two segments' blocks fit the SMs at once),
// or heads whose blocks fill the SMs unevenly (H_v 48: 192 blocks, 2 waves unsegmented, 3 waves
// of half chains with 2 segments; H200, same call, session 40: the gate 289.1 -> 239.4 us at T
// 4096, 1112.4 -> 881.4 at 16384, 4460.8 -> 3492.6 at 65536, against one wave of 64-column warp
// rows; gates of ~-1e-4, whose warmup reaches the start: 1111.9 -> 1155.9 at 16384).
// ALLOY_GDN_SEGMENTS=P forces P segments (1: never) wherever the final states fit the
// workspace. Measured (H100, same call, 2026-12-05; H_v 16, 2 segments of 32 columns against the
// unsegmented 16): gates of ~-0.5 a token (one warmup chunk) 162 -> 116 us at T 4096, 603 -> 376
// at 16384, 2518 -> 1413 at 65536; gates of ~-1e-4 (the warmup reaches the start) 162 -> 157 and
// 592 -> 543, but 35.7 -> 42.7 at T 512 (two more launches and the final-state copy), hence
// sequences of >= 64 chunks only. A head whose gates decay slowly runs its whole chain, so a
// model with a few such heads (synth's dt in [1e-3, 1e-1], as HF initialises Qwen3.5) gains
// little: 0.8B BF16 pp4096 +0.7%.
static int forced_segments() {
    static const int env = [] { const char* e = std::getenv("ALLOY_GDN_SEGMENTS"); return e ? std::atoi(e) : 0; }();
    return env;
}
// Sequences whose final states the workspace holds for a segmented scan.
static int segment_seqs_cap(int H_v, int sms) { return std::max(1, sms / (4 * std::max(H_v, 1))); }

GdnChunkedPlan gdn_delta_chunked_plan(int H_v, int n_seqs, int n_tokens, int sms) {
    GdnChunkedPlan plan{gdn_delta_chunked_block_v(H_v * n_seqs, sms), 1};
    if (n_seqs <= 0 || n_tokens <= 0 || n_seqs > segment_seqs_cap(H_v, sms)) return plan;
    const int cps = int((size_t(n_tokens) + size_t(kC - 1) * n_seqs) / kC / n_seqs);  // chunks a sequence, about
    const int forced = forced_segments();
    if (forced >= 1) {
        plan.segments = std::max(1, std::min(forced, cps));
        return plan;
    }
    const int heads = H_v * n_seqs;
    // In 16-column chunk steps (gdn_delta_chunked_block_v's costs): the unsegmented plan against
    // P segments of a 32-column split, whose P times more blocks may take more waves but each
    // runs chunks / P (+ 1 warmup) steps. Waves matter where the blocks do not fill the SMs
    // evenly: H_v 16 (64 blocks of 32 columns: 2 segments, one wave) and H_v 48 (192 blocks:
    // 2 waves unsegmented, 3 waves of half chains with 2 segments).
    const int blocks = heads * (kD / plan.block_v), waves = (blocks + sms - 1) / sms;
    const double now = double(waves) * split_step_cost(plan.block_v) * cps;
    if (cps >= 64) {
        double best = 0.9 * now;
        // (Segments of the 64-column split were 6-11% faster than this gate's with gates of
        // ~-0.5 a token, but 26-39% slower where the warmup reaches the start, and the 0.8B BF16
        // model's pp4096 lost 3.5%: a slow head runs its whole chain at the 64-column step's cost.
        // H100, same call, session 41; bench/RESULTS.md.)
        for (int p = 2; p <= 8; ++p) {
            const int seg_waves = (heads * (kD / 32) * p + sms - 1) / sms;
            const double seg = double(seg_waves) * (double((cps + p - 1) / p) + 1.0) * split_step_cost(32);
            if (seg < best - 1e-9) best = seg, plan = {32, p};
        }
    }
    return plan;
}

// The scan kernel for a split: ALLOY_GDN_SCAN=1 / 2 / 3 / 5 / 6 / 7 forces one / two warp groups
// on cp.async / warp rows / two groups on TMA issued by the groups / two groups on TMA issued by
// a producer warp (session 41's gate) / chains at every split (A/B; 2 and 5 at the 64-column
// split = one group and warp rows: its only two-group kernel is the producer one); otherwise
// chains at 16 and 32 columns (two groups on cp.async where the driver has no tensor-map
// encoder) and two groups with the producer warp at 64 (warp rows with ALLOY_GDN_SPLIT64_PAIR=0).
// All give the same bits. Chains against the producer two-group scan, H100, session 42 (same
// plan, same bits): the gate -3 to -7% at T 4096-65536 (one call, bench/RESULTS.md); unsegmented
// 16 columns at H_v 16 -13% / -15% / -15% (T 4096 / 16384 / 65536, one call: 118.6 -> 102.6,
// 416.5 -> 353.5, 1601.8 -> 1365.0 us; the final kernel 2-3% faster again in the next call);
// gates decaying ~1e-4 a token (the warmup reaches the start) -5 to -8% at T 4096 / 16384; 0.8B
// BF16 pp4096 +1.0-1.5%; 27b 4-layer pp16384 +1-2.5%. At 64
// columns chains run as 32 (192 blocks at H_v 48: two waves), 0.6% slower than the producer
// scan's one wave in the 27b model at pp4096, so 64 keeps the two-group scan.
// Producer warp against the groups issuing TMA themselves, H100, same call (session 38): the
// gate 102.1 -> 98.1 us (H_v 16, T 4096), 173.8 -> 164.1 (H_v 32), 341.1 -> 321.1 (H_v 16, T
// 16384). TMA against cp.async tiles, H100, same call (session 37): 16 columns 162.5 -> 121.4 us (H_v 16, T 4096), 600.9 -> 427.4 (16384); 32
// columns 185.9 -> 170.0 (H_v 32, 4096), 710.1 -> 624.7; the gate (H_v 16, 32 x 2 segments)
// 111.0 -> 102.1, 370.1 -> 337.9. Warp rows, H200, same call (2026-12-05): H_v 48 (the gate's 64-column split)
// 1-4% faster than one group at T 512-65536; at H_v 16 / 32 with 1 or 2 warps a block 1.3-1.6x
// slower than two groups: one warp per scheduler issues ~1.2-1.5k instructions a step at 3.2-4.6
// cycles each (ncu: fixed-latency and shared-memory dependencies), where the two-group kernel
// spreads the step over 8 warps.
GdnScan gdn_delta_chunked_scan(int block_v) {
    static const int env = [] { const char* e = std::getenv("ALLOY_GDN_SCAN"); return e ? std::atoi(e) : 0; }();
    if (env == 7) return GdnScan::Chains;
    if (env == 6) return block_v == 64 && !split64_pair() ? GdnScan::WarpRows : GdnScan::TwoGroupsProducer;  // session 41's gate
    if (env == 5) return block_v == 64 ? GdnScan::WarpRows : GdnScan::TwoGroupsTma;
    if (env == 4) return GdnScan::Transition;
    if (env == 3) return GdnScan::WarpRows;
    if (env == 1) return GdnScan::OneGroup;
    if (block_v == 64) return env == 2 ? GdnScan::OneGroup : split64_pair() ? GdnScan::TwoGroupsProducer : GdnScan::WarpRows;
    return env == 2 ? GdnScan::TwoGroups : GdnScan::Chains;
}

namespace {

template <typename OutT>
void run_chunked(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, int n_tokens, const bf16* q, const bf16* k,
                 const bf16* v, const float* g, const float* beta, float* state, OutT* out, void* workspace,
                 cudaStream_t st, int block_v, const char* op, const int32_t* slots = nullptr,
                 GdnScan scan = GdnScan::Auto, int forced = 0) {
    if (n_seqs == 0 || n_tokens == 0) return;
    int32_t* cstart = static_cast<int32_t*>(workspace);
    ChunkRecord* rec = reinterpret_cast<ChunkRecord*>(static_cast<char*>(workspace) + table_bytes(n_seqs));
    const size_t chunks = chunk_slots(n_seqs, n_tokens);
    if (chunks > 0x7fffffff) throw Error(std::string(op) + ": n_tokens " + std::to_string(n_tokens) + " too large");
    // Launch gate (block_v == 0): gdn_delta_chunked_plan's split and segments (its costs and
    // measurements are at gdn_delta_chunked_block_v and the plan above).
    const bool gate_split = block_v == 0;
    const GdnChunkedPlan plan = gdn_delta_chunked_plan(sh.H_v, n_seqs, n_tokens, num_sms());
    // A caller that turns the segments off (segments = 1) gets the unsegmented gate's split.
    if (block_v == 0) block_v = forced == 1 ? gdn_delta_chunked_block_v(sh.H_v * n_seqs, num_sms()) : plan.block_v;
    if (scan == GdnScan::Auto) {
        scan = gdn_delta_chunked_scan(block_v);
        if (block_v == 64 && scan == GdnScan::TwoGroupsProducer && encode_tiled() == nullptr) scan = GdnScan::WarpRows;
        if (scan == GdnScan::Chains && encode_tiled() == nullptr) scan = GdnScan::TwoGroups;  // cp.async tiles; same bits
    }
    // Segments (gdn_delta_chunked_plan; two-group kernels only): the caller's, the gate's, or
    // ALLOY_GDN_SEGMENTS's with a given split. Decided here so that one table launch writes both
    // the chunk and the segment starts.
    const bool two_groups =
        scan == GdnScan::TwoGroups || scan == GdnScan::TwoGroupsTma || scan == GdnScan::TwoGroupsProducer;
    const bool segmentable =
        (two_groups && (block_v != 64 || scan == GdnScan::TwoGroupsProducer)) || scan == GdnScan::Chains;
    const int segments = !segmentable                             ? 1
                         : forced >= 1                            ? forced
                         : gate_split || forced_segments() >= 1 ? plan.segments
                                                                  : 1;
    if (segments > 1 && n_seqs > segment_seqs_cap(sh.H_v, num_sms()))
        throw Error(std::string(op) + ": segments " + std::to_string(segments) + " with n_seqs " +
                    std::to_string(n_seqs) + " (the workspace holds final states of " +
                    std::to_string(segment_seqs_cap(sh.H_v, num_sms())) + " sequences)");
    ScanSegments sg{nullptr, n_seqs, 0, nullptr, nullptr};
    int32_t* segstart = segments > 1 ? segstart_table(workspace, n_seqs) : nullptr;
    int n_fin_cnt = 0;
    if (segments > 1) {
        sg.chunks = int((chunks / size_t(n_seqs) + segments - 1) / segments);
        sg.segstart = segstart;
        void* fin = reinterpret_cast<char*>(rec) + chunks * sh.H_v * sizeof(ChunkRecord);
        static const bool fin_copy = [] { const char* e = std::getenv("ALLOY_GDN_FIN_COPY"); return e && *e == '1'; }();
        if (fin_copy) {
            sg.fin = static_cast<float*>(fin);
        } else {  // counters in the final states' space: n_seqs x H_v x (at most 8 value slices) ints
            sg.fin_cnt = static_cast<int*>(fin);
            n_fin_cnt = n_seqs * sh.H_v * (kD / 16);
        }
    }
    detail::launch(op, start_table_kernel, dim3(1), dim3(32), 0, st, offs, n_seqs, cstart, sg.chunks, segstart,
                   sg.fin_cnt, n_fin_cnt);
    check_launch(op);
    detail::launch(op, stage1_kernel, dim3(dim3(unsigned(chunks), sh.H_v)), dim3(kThreads), 0, st, sh, offs, cstart, n_seqs,
                   q, k, g, beta, rec);
    check_launch(op);
    if (scan == GdnScan::Transition) {
        if (gate_split) block_v = sh.H_v * n_seqs * 8 <= num_sms() ? 16 : 32;
        if (block_v != 16 && block_v != 32)
            throw Error(std::string(op) + ": block_v " + std::to_string(block_v) + " has no transition scan (16 or 32)");
        TRecord* trec = reinterpret_cast<TRecord*>(reinterpret_cast<char*>(rec) + chunks * sh.H_v * sizeof(ChunkRecord));
        static bool configured = false;
        if (!configured) {
            cudaFuncSetAttribute(stage1t_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Stage1tSmem)));
            configured = true;
        }
        detail::launch(op, stage1t_kernel, dim3(dim3(unsigned(chunks), sh.H_v)), dim3(kS1tThreads), sizeof(Stage1tSmem), st, sh,
                       offs, cstart, n_seqs, q, k, rec, trec);
        check_launch(op);
        // 8 warps a block: 1-2% faster than 4 (H100, same call, 2026-12-05).
        if (block_v == 16) launch_stage2_trans<16, 8>(sh, n_seqs, offs, cstart, k, v, rec, trec, state, out, slots, st);
        else launch_stage2_trans<32, 8>(sh, n_seqs, offs, cstart, k, v, rec, trec, state, out, slots, st);
        check_launch(op);
        return;
    }
    if (scan == GdnScan::WarpRows) {
        if (block_v == 128) launch_stage2_warp<8>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st);
        else if (block_v == 64) launch_stage2_warp<4>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st);
        else if (block_v == 32) launch_stage2_warp<2>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st);
        else if (block_v == 16) launch_stage2_warp<1>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st);
        else throw Error(std::string(op) + ": block_v " + std::to_string(block_v) + " not in {0, 16, 32, 64, 128}");
        check_launch(op);
        return;
    }
    if (block_v != 16 && block_v != 32 && block_v != 64)
        throw Error(std::string(op) + ": block_v " + std::to_string(block_v) + " not in {0, 16, 32, 64}");
    if (scan == GdnScan::Wgmma) {
        WRecord* wrec = reinterpret_cast<WRecord*>(reinterpret_cast<char*>(rec) + chunks * sh.H_v * sizeof(ChunkRecord));
        static bool configured = false;
        if (!configured) {
            cudaFuncSetAttribute(stage1b_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Stage1bSmem)));
            configured = true;
        }
        detail::launch(op, stage1b_kernel, dim3(dim3(unsigned(chunks), sh.H_v)), dim3(kThreads), sizeof(Stage1bSmem), st, sh,
                       offs, cstart, n_seqs, k, v, rec, wrec);
        check_launch(op);
        if (block_v == 64) launch_stage2_wg<64>(sh, n_seqs, offs, cstart, q, rec, wrec, state, out, slots, st);
        else if (block_v == 32) launch_stage2_wg<32>(sh, n_seqs, offs, cstart, q, rec, wrec, state, out, slots, st);
        else launch_stage2_wg<16>(sh, n_seqs, offs, cstart, q, rec, wrec, state, out, slots, st);
    } else if (two_groups || scan == GdnScan::Chains) {
        // TMA tiles, unless the driver does not give the tensor-map encoder (then cp.async: same bits).
        const bool tma = (scan == GdnScan::TwoGroupsTma || scan == GdnScan::TwoGroupsProducer) && encode_tiled() != nullptr;
        const bool prod = tma && scan == GdnScan::TwoGroupsProducer;
        // Segment slots: at most one more than the chunks' segments per sequence (blocks past a
        // sequence's last segment return).
        const unsigned grid_z =
            segments > 1 ? unsigned((chunks + sg.chunks - 1) / sg.chunks + n_seqs) : unsigned(n_seqs);
        auto launch_chain = [&](auto nc) {
            if (encode_tiled() == nullptr)
                throw Error(std::string(op) + ": the chain scan (GdnScan::Chains) needs the driver's cuTensorMapEncodeTiled");
            launch_stage2_chain<decltype(nc)::value, OutT>(sh, offs, cstart, q, k, v, rec, state, out, slots, st, sg,
                                                           grid_z, n_tokens, chunks * sh.H_v);
        };
        // One launch site for the six (split, tile copies) instantiations.
        auto launch_pair = [&](auto bv, auto tma_tiles, auto producer) {
            launch_stage2_pair<decltype(bv)::value, decltype(tma_tiles)::value, OutT, decltype(producer)::value>(
                sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st, sg, grid_z, n_tokens, chunks * sh.H_v);
        };
        using No = std::false_type;
        using Yes = std::true_type;
        if (scan == GdnScan::Chains) {  // (block_v 64 runs as 32: two chains a block at most; same bits)
            if (block_v == 16) launch_chain(std::integral_constant<int, 1>{});
            else launch_chain(std::integral_constant<int, 2>{});
        } else if (block_v == 64) {
            if (!prod)
                throw Error(std::string(op) + ": block_v 64's two-group scan is the producer-warp one (TwoGroupsProducer, " +
                            "which needs the driver's cuTensorMapEncodeTiled)");
            launch_pair(std::integral_constant<int, 64>{}, Yes{}, Yes{});
        } else if (block_v == 32) {
            if (prod) launch_pair(std::integral_constant<int, 32>{}, Yes{}, Yes{});
            else if (tma) launch_pair(std::integral_constant<int, 32>{}, Yes{}, No{});
            else launch_pair(std::integral_constant<int, 32>{}, No{}, No{});
        } else {
            if (prod) launch_pair(std::integral_constant<int, 16>{}, Yes{}, Yes{});
            else if (tma) launch_pair(std::integral_constant<int, 16>{}, Yes{}, No{});
            else launch_pair(std::integral_constant<int, 16>{}, No{}, No{});
        }
        if (segments > 1 && sg.fin) {
            check_launch(op);
            detail::launch(op, segment_states_to_slots_kernel, dim3(unsigned(sh.H_v), unsigned(n_seqs), kFinParts), dim3(256), 0, st,
                           offs, sh.H_v, sg.fin, state, slots);
        }
    } else if (block_v == 64) launch_stage2<64>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st);
    else if (block_v == 32) launch_stage2<32>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st);
    else launch_stage2<16>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, slots, st);
    check_launch(op);
}

}  // namespace

#ifdef ALLOY_GDN_EXP_CLOCK
void gdn_chunked_debug_clocks(unsigned long long* out) {
    cudaMemcpyFromSymbol(out, g_clk, sizeof(g_clk));
    static const unsigned long long zero[32] = {};
    cudaMemcpyToSymbol(g_clk, zero, sizeof(zero));
}
void gdn_stage1_debug_clocks(unsigned long long* out) {
    cudaMemcpyFromSymbol(out, g_s1clk, sizeof(g_s1clk));
    static const unsigned long long zero[32] = {};
    cudaMemcpyToSymbol(g_s1clk, zero, sizeof(zero));
}
#endif

size_t gdn_delta_chunked_workspace_bytes(const ref::GdnShape& shape, int n_seqs, int n_tokens, GdnScan scan) {
    const size_t per = sizeof(ChunkRecord) + (scan == GdnScan::Wgmma        ? sizeof(WRecord)
                                               : scan == GdnScan::Transition ? sizeof(TRecord)
                                                                             : 0);
    const int H_v = std::max(shape.H_v, 0);
    // The segmented scan's final states (two-group kernels), for as many sequences as it runs.
    const size_t fin =
        size_t(std::min(std::max(n_seqs, 0), segment_seqs_cap(H_v, num_sms()))) * H_v * kD * kD * sizeof(float);
    return table_bytes(std::max(n_seqs, 0)) + chunk_slots(std::max(n_seqs, 0), std::max(n_tokens, 0)) * size_t(H_v) * per +
           fin;
}

void gdn_delta_chunked(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, int n_tokens,
                       const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* g, const float* beta,
                       float* state, uint16_t* out, void* workspace, void* stream, int block_v,
                       const int32_t* seq_slots, GdnScan scan, int segments) {
    const char* op = "cuda::gdn_delta_chunked";
    check_chunked_shape(shape, n_seqs, op);
    if (n_tokens < 0) throw Error(std::string(op) + ": n_tokens " + std::to_string(n_tokens) + " is negative");
    if (n_seqs == 0 || n_tokens == 0) return;
    const void* need[] = {seq_offsets, q, k, v, g, beta, state, out, workspace};
    const char* names[] = {"seq_offsets", "q", "k", "v", "g", "beta", "state", "out", "workspace"};
    for (int i = 0; i < 9; ++i) {
        if (need[i] == nullptr) throw Error(std::string(op) + ": " + names[i] + " is null");
        if (i != 4 && i != 5 && !aligned16(need[i]))
            throw Error(std::string(op) + ": " + names[i] + " is not 16-byte aligned");
    }
    run_chunked(shape, n_seqs, seq_offsets, n_tokens, reinterpret_cast<const bf16*>(q),
                reinterpret_cast<const bf16*>(k), reinterpret_cast<const bf16*>(v), g, beta, state,
                reinterpret_cast<bf16*>(out), workspace, static_cast<cudaStream_t>(stream), block_v, op, seq_slots,
                scan, segments);
}

void gdn_delta_chunked(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                       const float* k, const float* v, const float* g, const float* beta, float* state, float* out,
                       int chunk_size, void* stream) {
    const char* op = "cuda::gdn_delta_chunked";
    check_chunked_shape(shape, n_seqs, op);
    if (chunk_size != kC)
        throw Error(std::string(op) + ": chunk_size " + std::to_string(chunk_size) + " not supported (only 64)");
    if (n_seqs == 0) return;
    if (seq_offsets == nullptr) throw Error(std::string(op) + ": seq_offsets is null");
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    int32_t ends[2] = {0, 0};
    if (cudaMemcpyAsync(&ends[0], seq_offsets, 4, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaMemcpyAsync(&ends[1], seq_offsets + n_seqs, 4, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess)
        throw Error(std::string(op) + ": cannot read seq_offsets");
    const int n_tokens = ends[1];
    if (n_tokens <= ends[0]) return;
    const void* need[] = {q, k, v, g, beta, state, out};
    const char* names[] = {"q", "k", "v", "g", "beta", "state", "out"};
    for (int i = 0; i < 7; ++i) {
        if (need[i] == nullptr) throw Error(std::string(op) + ": " + names[i] + " is null");
        if (i != 3 && i != 4 && !aligned16(need[i]))
            throw Error(std::string(op) + ": " + names[i] + " is not 16-byte aligned");
    }
    // bf16 copies of q, k, v (rows [0, n_tokens)), then the bf16 path with an fp32 output.
    const size_t nqk = size_t(n_tokens) * shape.H_k * kD, nv = size_t(n_tokens) * shape.H_v * kD;
    const size_t ws_bytes = gdn_delta_chunked_workspace_bytes(shape, n_seqs, n_tokens);
    const size_t copies = ((2 * nqk + nv) * sizeof(bf16) + 255) / 256 * 256;
    void* ws = nullptr;
    if (cudaMallocAsync(&ws, ws_bytes + copies, st) != cudaSuccess)
        throw Error(std::string(op) + ": cannot allocate " + std::to_string(ws_bytes + copies) + " bytes of workspace");
    bf16* qb = reinterpret_cast<bf16*>(static_cast<char*>(ws) + ws_bytes);
    bf16* kb = qb + nqk;
    bf16* vb = kb + nqk;
    auto convert = [&](const float* x, bf16* y, size_t n) {
        detail::launch(op, to_bf16_kernel, dim3(unsigned((n / 4 + 255) / 256 + 1)), dim3(256), 0, st, x, y, n);
    };
    convert(q, qb, nqk);
    convert(k, kb, nqk);
    convert(v, vb, nv);
    check_launch(op);
    run_chunked(shape, n_seqs, seq_offsets, n_tokens, qb, kb, vb, g, beta, state, out, ws, st, 0, op);
    cudaFreeAsync(ws, st);
}

}  // namespace alloy::cuda
