// The MoE FFN of a qwen35moe layer on CUDA (kernels/cuda/ops.h; reference kernels/ref/moe.h):
// router, top-k routing, the chosen experts' SwiGLU MLPs, the shared expert, the weighted sum.
//
// Decode reads k of E experts' weights per token, so the expert products are GEMVs over
// gathered rows: a "chunk" is one expert and up to kT of its (token, rank) pairs; a block
// takes 32 rows of that expert's matrix for the chunk's pairs, the weights loaded once for
// all of them (a warp 4 rows, a lane 16 quants or 8 16-bit weights of each row per step, as
// the dense GEMVs of matmul.cu). Steps of <= kMoeDirectMaxT tokens (decode, verification) take
// one pair per chunk, in pair order, with no sort: nothing on the host depends on the routing,
// so the step records into a CUDA graph. Longer steps (prefill) group the pairs by expert on
// the device (one block: histogram, scan, scatter) in chunks of kT = 8, so an expert's weights
// are read once per 8 of its tokens. A pair's arithmetic is the same in both (its own
// accumulators; the order of the sums fixed by the shapes), so every row of a call has the
// bits of a one-token call: the contract verification needs.
//
// gate and up run in one kernel (a warp's rows of both share x) and store silu(g) * u, and
// when the down matrix is Q8_0 also its int8 quantization (a block's 32 rows are one 32-value
// quant block of each pair's row), so the down GEMV reads int8.
//
// Prefill with every expert matrix block-quantized (Q8_0, the K-quants: the published files)
// takes int8 tensor cores instead: chunks of up to 32 pairs of one expert are the n side (four
// n8 tiles), a warp's 32 weight rows the m side; the k side is one Q8_0 block on
// mma.m16n8k32.s8 (expert_mma_kernel) or one 16-value segment of the other types on
// mma.m16n8k16.s8 (expert_mma_kquant_kernel), so each int32 sum is exact and is scaled by the
// weight's and the pair's scales into fp32, as the GEMV does. The GEMV kernel there held 8 pairs in 159 registers at
// one block per SM and ran latency-bound (ncu: 30% SM, 7% DRAM; bench/RESULTS.md). The output sums each token's
// experts in increasing expert id, then adds sigmoid(g . x) times the shared expert, as
// transformers and the CPU do.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"

namespace alloy::cuda {

namespace {

using detail::ceil_div;

constexpr int kThreads = 256;          // 8 warps
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = 32;      // 8 warps x 4 rows: one Q8_0 block of the down's input
constexpr int kChunkT = 8;             // pairs per chunk when grouped by expert (GEMV kernels)
// The tensor-core path (grouped calls, every expert matrix Q8_0): a chunk of up to 32 pairs is
// four n8 tiles; a warp takes 32 rows (two m16 tiles: one Q8_0 block of the down's input).
constexpr int kTcChunkT = 32;
constexpr int kTcN = kTcChunkT / 8;
constexpr int kTcWarps = 4;
constexpr int kTcRowsPerWarp = 32;
constexpr int kTcRowsPerBlock = kTcWarps * kTcRowsPerWarp;
constexpr int kMaxExperts = 1024;      // the routing and sort kernels hold E values in shared memory
constexpr int kMaxUsed = 32;

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Where a matrix's rows are: expert e's row r is row e * stride + offset + r of the tensor of
// n_all rows; Q8_0 split: quants [n_all, n_in] then f16 scales [n_all, n_in / 32].
struct Mat {
    const uint8_t* data = nullptr;
    int64_t stride = 0, offset = 0, n_all = 0;
};

// The chunks of one call: direct (pair c alone, expert ids[c]) or grouped by expert (sort_kernel).
struct Chunks {
    const int32_t* ids = nullptr;     // [P] each pair's expert (direct)
    const int32_t* expert = nullptr;  // [C] grouped: the chunk's expert,
    const int32_t* first = nullptr;   // [C] its first entry of pair_of,
    const int32_t* count = nullptr;   // [C] its pairs (1..kChunkT, or kTcChunkT),
    const int32_t* pair_of = nullptr; // [P] the pairs sorted by expert,
    const int32_t* n_chunks = nullptr;  // [1] how many chunks there are
    // Expert parallelism (ref::MoeWeights::expert_begin): the experts held, [e_begin, e_end);
    // a chunk of another expert returns at once, and the matrices are indexed e - e_begin.
    int e_begin = 0, e_end = 1 << 30;
};

// One GEMV launch over chunks: kM = 2 (gate, up: out = silu(g) * u, [P, rows]) or 1 (down:
// out = the product, [P, rows]). The input row of pair p is p / in_div (x of its token: k;
// h of its pair: 1). Block-quantized weights (Q8_0, the K-quants) read xq / xd, 16-bit and
// F32 ones x.
struct ExpertGemv {
    Mat m[2];
    int64_t rows, n_in, in_div;
    const float* x;
    const int8_t* xq;
    const float* xd;
    float* out;
    int8_t* oq;  // kM = 2 with a block-quantized down: out's quantization (rows % 32 == 0)
    float* od;
    Chunks ch;
};

// Block types the expert GEMV reads: Q8_0 its own loop, F32 / BF16 theirs, the others
// (quant_blocks.cuh's split types) through the unit decoder of the dense K-quant GEMV.
__host__ __device__ constexpr bool is_kquant(GgmlType t) { return t != GgmlType::Q8_0 && t != GgmlType::BF16 && t != GgmlType::F32; }

using detail::ld_stream16;  // gemv.cuh: 16 bytes past L1

// kKS: warps splitting each row's k range (kKS x 8 warps a block); the parts' butterfly sums
// add in part order, so a kernel's bits do not depend on the call. Decode's gate + up take 2
// (H200, 35b-a3b: 13.4 -> 10.7 us); the down's 16 blocks a row would leave half the lanes idle
// per part (6.9 -> 12.5 us), so it keeps 1.
template <GgmlType kW, int kT, int kM, int kKS>
__global__ void __launch_bounds__(kThreads * kKS) expert_gemv_kernel(const ExpertGemv a) {
    detail::pdl_entry();  // the chunk's expert is an earlier kernel's output
    __shared__ float hs[kT][kRowsPerBlock];
    __shared__ float part[kKS][kM][kT][kRowsPerBlock];
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % (kThreads / 32), kp = (threadIdx.x >> 5) / (kThreads / 32);
    // This block's chunk: its expert and pairs.
    int expert, n = 1;
    int32_t pair[kT];
    const int c = int(blockIdx.x);
    if (a.ch.expert) {
        if (c >= *a.ch.n_chunks) return;
        expert = a.ch.expert[c];
        n = a.ch.count[c];
        const int32_t f = a.ch.first[c];
#pragma unroll
        for (int t = 0; t < kT; ++t) pair[t] = a.ch.pair_of[f + (t < n ? t : 0)];  // padding repeats the first
    } else {
        expert = a.ch.ids[c];
#pragma unroll
        for (int t = 0; t < kT; ++t) pair[t] = c;
    }
    if (expert < a.ch.e_begin || expert >= a.ch.e_end) return;  // held by another rank
    expert -= a.ch.e_begin;
    const int64_t r0 = int64_t(blockIdx.y) * kRowsPerBlock + warp * kRowsPerWarp;
    float acc[kM][kRowsPerWarp][kT];
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
            for (int t = 0; t < kT; ++t) acc[m][r][t] = 0.0f;
    const int64_t n_in = a.n_in;
    if constexpr (kW == GgmlType::Q8_0) {
        const int64_t nb = n_in / 32;
        const int8_t* Q[kM][kRowsPerWarp];
        const unsigned short* S[kM][kRowsPerWarp];
        bool ok[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) ok[r] = r0 + r < a.rows;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            const int64_t base = int64_t(expert) * a.m[m].stride + a.m[m].offset;
            const auto* scales = reinterpret_cast<const unsigned short*>(a.m[m].data + a.m[m].n_all * n_in);
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                const int64_t row = base + (ok[r] ? r0 + r : 0);
                Q[m][r] = reinterpret_cast<const int8_t*>(a.m[m].data) + row * n_in;
                S[m][r] = scales + row * nb;
            }
        }
        const int half = lane & 1;
        const int64_t b_begin = nb * kp / kKS, b_end = nb * (kp + 1) / kKS;
        for (int64_t b0 = b_begin; b0 < b_end; b0 += 16) {
            const int64_t b = b0 + (lane >> 1);
            if (b >= b_end) continue;
            int4 w[kM][kRowsPerWarp];
            float dw[kM][kRowsPerWarp];
#pragma unroll
            for (int m = 0; m < kM; ++m)
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; ++r) {
                    w[m][r] = ld_stream16(Q[m][r] + b * 32 + 16 * half);
                    dw[m][r] = __half2float(__ushort_as_half(__ldg(S[m][r] + b)));
                }
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                const int64_t in_row = pair[t] / a.in_div;
                const int4 xv = __ldg(reinterpret_cast<const int4*>(a.xq + in_row * n_in + b * 32 + 16 * half));
                const float xs = __ldg(a.xd + in_row * nb + b);
#pragma unroll
                for (int m = 0; m < kM; ++m)
#pragma unroll
                    for (int r = 0; r < kRowsPerWarp; ++r) {
                        int s = __dp4a(w[m][r].x, xv.x, 0);
                        s = __dp4a(w[m][r].y, xv.y, s);
                        s = __dp4a(w[m][r].z, xv.z, s);
                        s = __dp4a(w[m][r].w, xv.w, s);
                        acc[m][r][t] = fmaf(dw[m][r] * xs, float(s), acc[m][r][t]);
                    }
            }
        }
    } else if constexpr (is_kquant(kW)) {
        // As the dense K-quant GEMV (matmul_kquant.cu): lane l takes unit 32 i + l of the row
        // (16 code bytes, 32 values in two segments of 16, each inside one 32-value block of x),
        // per pair and segment four dp4a and a scaled FMA; the codes' offset (Q4_0, Q5_0, Q6_K)
        // and the min (Q4_K, Q5_K, Q5_1) through the segment's sum of x in integers.
        using F = detail::BlockFormat<kW>;
        constexpr int kUnits = F::kValues / 32;
        const int64_t bpr = n_in / F::kValues, upr = n_in / 32;
        int64_t rowb[kM][kRowsPerWarp];  // each row's first block in its split matrix
        const uint8_t* codes[kM];
        const uint8_t* heads[kM];
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            const detail::SplitMatrix<kW> sm(a.m[m].data, a.m[m].n_all * bpr);
            codes[m] = sm.codes, heads[m] = sm.heads;
            const int64_t base = int64_t(expert) * a.m[m].stride + a.m[m].offset;
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) rowb[m][r] = (base + (r0 + r < a.rows ? r0 + r : 0)) * bpr;
        }
        const int64_t u_end = upr * (kp + 1) / kKS;
        for (int64_t u = upr * kp / kKS + lane; u < u_end; u += 32) {
            const int64_t blk = u / kUnits;
            const int j = int(u % kUnits);
#pragma unroll
            for (int m = 0; m < kM; ++m) {
                detail::UnitRaw raw[kRowsPerWarp];  // a matrix's rows' loads in flight together
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; ++r) {
                    const int64_t b = rowb[m][r] + blk;
                    const uint8_t* code = codes[m] + b * detail::code_bytes<kW>();
                    raw[r] = detail::load_unit_rest<kW>(ld_stream16(code + detail::unit_code_offset<kW>(j)), code,
                                                        heads[m] + b * F::kHeadBytes, j);
                }
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; ++r) {
                    const detail::Unit w = detail::decode_unit<kW>(raw[r], j);
#pragma unroll
                    for (int t = 0; t < kT; ++t) {
                        const int64_t in_row = pair[t] / a.in_div;
#pragma unroll
                        for (int sg = 0; sg < 2; ++sg) {
                            const int64_t o = in_row * n_in + blk * F::kValues + w.off[sg];
                            const int4 xv = __ldg(reinterpret_cast<const int4*>(a.xq + o));
                            acc[m][r][t] = fmaf(__ldg(a.xd + o / 32), detail::segment_dot<kW>(w, sg, xv), acc[m][r][t]);
                        }
                    }
                }
            }
        }
    } else {
        // 8 weights a lane-step: 16 bytes of BF16, 32 of F32.
        constexpr int kV = kW == GgmlType::F32 ? 2 : 1;
        constexpr int64_t kElem = kW == GgmlType::F32 ? 4 : 2;
        const int64_t nc = n_in / 8;
        const uint4* W[kM][kRowsPerWarp];
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            const int64_t base = int64_t(expert) * a.m[m].stride + a.m[m].offset;
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r) {
                const int64_t row = base + (r0 + r < a.rows ? r0 + r : 0);
                W[m][r] = reinterpret_cast<const uint4*>(a.m[m].data + row * n_in * kElem);
            }
        }
        const int64_t c_begin = nc * kp / kKS, c_end = nc * (kp + 1) / kKS;
        for (int64_t c0 = c_begin; c0 < c_end; c0 += 32) {
            const int64_t cc = c0 + lane;
            if (cc >= c_end) continue;
            float wf[kM][kRowsPerWarp][8];
#pragma unroll
            for (int m = 0; m < kM; ++m)
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; ++r) {
                    if constexpr (kW == GgmlType::F32) {
#pragma unroll
                        for (int v = 0; v < kV; ++v) {
                            const uint4 u = __ldg(W[m][r] + cc * kV + v);
                            wf[m][r][4 * v + 0] = __uint_as_float(u.x);
                            wf[m][r][4 * v + 1] = __uint_as_float(u.y);
                            wf[m][r][4 * v + 2] = __uint_as_float(u.z);
                            wf[m][r][4 * v + 3] = __uint_as_float(u.w);
                        }
                    } else {
                        const uint4 u = __ldg(W[m][r] + cc);
                        const uint32_t ws[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            wf[m][r][2 * i] = __uint_as_float(ws[i] << 16);
                            wf[m][r][2 * i + 1] = __uint_as_float(ws[i] & 0xffff0000u);
                        }
                    }
                }
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                const float4* xp = reinterpret_cast<const float4*>(a.x + (pair[t] / a.in_div) * n_in + cc * 8);
                const float4 p = __ldg(xp), q = __ldg(xp + 1);
#pragma unroll
                for (int m = 0; m < kM; ++m)
#pragma unroll
                    for (int r = 0; r < kRowsPerWarp; ++r) {
                        float s = acc[m][r][t];
                        s = fmaf(wf[m][r][0], p.x, s);
                        s = fmaf(wf[m][r][1], p.y, s);
                        s = fmaf(wf[m][r][2], p.z, s);
                        s = fmaf(wf[m][r][3], p.w, s);
                        s = fmaf(wf[m][r][4], q.x, s);
                        s = fmaf(wf[m][r][5], q.y, s);
                        s = fmaf(wf[m][r][6], q.z, s);
                        s = fmaf(wf[m][r][7], q.w, s);
                        acc[m][r][t] = s;
                    }
            }
        }
    }
    // Butterfly sums (every lane the same bits), the k parts added in order, then the row's
    // value per pair.
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                const float v = detail::warp_sum_all(acc[m][r][t]);
                if (lane == 0) part[kp][m][t][warp * kRowsPerWarp + r] = v;
            }
    __syncthreads();
    for (int i = threadIdx.x; i < kT * kRowsPerBlock; i += kThreads * kKS) {
        const int t = i / kRowsPerBlock, row = i % kRowsPerBlock;
        float v = part[0][0][t][row];
#pragma unroll
        for (int q = 1; q < kKS; ++q) v += part[q][0][t][row];
        if constexpr (kM == 2) {
            float u = part[0][1][t][row];
#pragma unroll
            for (int q = 1; q < kKS; ++q) u += part[q][1][t][row];
            v = v * detail::sigmoid(v) * u;  // silu(g) * u, as elementwise.cu's SwiGLU
        }
        hs[t][row] = v;
    }
    __syncthreads();
    // Warp t stores pair t's 32 values (and, for a Q8_0 down, their quantization).
    const int64_t row = int64_t(blockIdx.y) * kRowsPerBlock + lane;
    for (int t = int(threadIdx.x >> 5); t < kT; t += kThreads * kKS / 32) {
        if (t >= n) break;
        const float v = hs[t][lane];
        if (row < a.rows) a.out[int64_t(pair[t]) * a.rows + row] = v;
        if (kM == 2 && a.oq)  // rows % 32 == 0 here: the block's rows are one whole quant block
            detail::quantize_block32(v, lane, a.oq + int64_t(pair[t]) * a.rows + row - lane,
                                     a.od + int64_t(pair[t]) * (a.rows / 32) + blockIdx.y);
    }
}

// ---- grouped expert products on int8 tensor cores (prefill, Q8_0 experts) ----

// c = a b, m16n8k32, int8 operands, int32 accumulators (exact: 32 products of |q| <= 127).
// The k order inside the block is permuted alike on both sides (a lane's logical k 4 tq + i is
// byte 8 tq + i of the block, 16 + 4 tq + i is byte 8 tq + 4 + i), so every lane loads one
// 8-byte run of each row: the dot product is the same set of 32 products.
__device__ __forceinline__ void mma_s8(int (&c)[4], uint2 a_row, uint2 a_row8, uint2 b) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a_row.x), "r"(a_row8.x), "r"(a_row.y), "r"(a_row8.y), "r"(b.x), "r"(b.y), "r"(0));
}
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
// int32 -> fp32 for |i| < 2^22 without the conversion unit (a quarter-rate instruction): the
// integer added to the mantissa of 1.5 * 2^23, then that subtracted. Exact.
__device__ __forceinline__ float small_int_to_float(int i) {
    return __int_as_float(0x4B400000 + i) - 12582912.0f;
}

// expert_mma_kernel's stores: kM = 1 the product rows (a.out), kM = 2 silu(g) * u quantized
// per pair and 32 rows (the warp's) into a.oq / a.od, as quantize_block32 (a.out unused).
template <int kM>
__device__ __forceinline__ void mma_epilogue(const ExpertGemv& a, const float (&acc)[kM][2][kTcN][4], int64_t r0, int f, int n,
                                             int gq, int tq) {
    int32_t col_pair[kTcN][2];  // the pair of column 8 j + 2 tq + e, -1 past the chunk's n
#pragma unroll
    for (int j = 0; j < kTcN; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) col_pair[j][e] = 8 * j + 2 * tq + e < n ? a.ch.pair_of[f + 8 * j + 2 * tq + e] : -1;
    if constexpr (kM == 1) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < kTcN; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int32_t p = col_pair[j][e & 1];
                    if (p >= 0) a.out[int64_t(p) * a.rows + r0 + 16 * i + 8 * (e >> 1) + gq] = acc[0][i][j][e];
                }
    } else {
        // h = silu(g) * u, then each pair's 32 rows (this warp's) as one int8 block: the amax over
        // the lane's 4 rows, then over the 8 lanes of a column (lane bits 2..4), as quantize_block32.
#pragma unroll
        for (int j = 0; j < kTcN; ++j)
#pragma unroll
            for (int col = 0; col < 2; ++col) {
                float v[2][2];
                float amax = 0.0f;
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float g = acc[0][i][j][2 * h + col], u = acc[1][i][j][2 * h + col];
                        v[i][h] = g * detail::sigmoid(g) * u;  // silu(g) * u, as the GEMV kernel
                        amax = fmaxf(amax, fabsf(v[i][h]));
                    }
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                const int32_t p = col_pair[j][col];
                if (p < 0) continue;
                const float sc = amax / 127.0f;
                int8_t* q = a.oq + int64_t(p) * a.rows + r0;
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int h = 0; h < 2; ++h) q[16 * i + 8 * h + gq] = int8_t(sc > 0.0f ? __float2int_rn(v[i][h] / sc) : 0);
                if (gq == 0) a.od[int64_t(p) * (a.rows / 32) + r0 / 32] = sc;
            }
    }
}

// The B side of a chunk's tensor-core products, as 32-bit offsets from a.xq / a.xd
// (tensor_core_path keeps P x n_in below 2^31): lane (g, t)'s x row of pair 8 j + g plus
// lane_k (its k bytes in the fragment) and the scale rows of the epilogue's columns
// 8 j + 2 t + e (padding repeats the chunk's last pair).
__device__ __forceinline__ void chunk_pair_offsets(const ExpertGemv& a, int f, int n, int gq, int tq, int lane_k,
                                                   int (&xo)[kTcN], int (&xdo)[kTcN][2]) {
    const int64_t n_in = a.n_in, nb = n_in / 32;
#pragma unroll
    for (int j = 0; j < kTcN; ++j) {
        xo[j] = int(a.ch.pair_of[f + min(8 * j + gq, n - 1)] / a.in_div * n_in) + lane_k;
#pragma unroll
        for (int e = 0; e < 2; ++e) xdo[j][e] = int(a.ch.pair_of[f + min(8 * j + 2 * tq + e, n - 1)] / a.in_div * nb);
    }
}
template <int kM>
__device__ __forceinline__ void zero(float (&acc)[kM][2][kTcN][4]) {
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int j = 0; j < kTcN; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[m][i][j][e] = 0.0f;
}

// One chunk (an expert and up to kTcChunkT of its pairs) x kTcRowsPerBlock rows; each warp its
// own 32 rows, no block barrier. Same input and output contract as expert_gemv_kernel<Q8, .., kM>
// (a.out for kM = 1; a.oq / a.od only for kM = 2: the down is Q8_0 on this path).
template <int kM>
__global__ void __launch_bounds__(kTcWarps * 32) expert_mma_kernel(const ExpertGemv a) {
    detail::pdl_entry();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int c = int(blockIdx.x);
    if (c >= *a.ch.n_chunks) return;
    const int64_t r0 = int64_t(blockIdx.y) * kTcRowsPerBlock + warp * kTcRowsPerWarp;
    if (r0 >= a.rows) return;  // rows % 32 == 0 on this path: a warp's rows are all in or all out
    if (a.ch.expert[c] < a.ch.e_begin || a.ch.expert[c] >= a.ch.e_end) return;  // held by another rank
    const int expert = a.ch.expert[c] - a.ch.e_begin, n = a.ch.count[c], f = a.ch.first[c];
    const int64_t n_in = a.n_in, nb = n_in / 32;
    // The B side in 32-bit offsets: registers decide the blocks per SM here.
    int xo[kTcN], xdo[kTcN][2];
    chunk_pair_offsets(a, f, n, gq, tq, 8 * tq, xo, xdo);
    // The A side: rows r0 + 16 i + 8 h + gq of each matrix (one pointer a matrix, the four
    // rows at 32-bit offsets: 64-bit pointers per row took the kernel to 255 registers).
    const int8_t* wq[kM];
    const unsigned short* ws[kM];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        const int64_t row = int64_t(expert) * a.m[m].stride + a.m[m].offset + r0 + gq;
        wq[m] = reinterpret_cast<const int8_t*>(a.m[m].data) + row * n_in + 8 * tq;
        ws[m] = reinterpret_cast<const unsigned short*>(a.m[m].data + a.m[m].n_all * n_in) + row * nb;
    }
    const int q_step = int(8 * n_in), s_step = int(8 * nb);  // 8 rows
    float acc[kM][2][kTcN][4];
    zero<kM>(acc);
    // Not unrolled: unrolling twice (226 registers), a 128-register cap (4 blocks an SM), an L2
    // prefetch 4 or 8 blocks ahead and a 3-stage cp.async pipeline through shared memory (192 KB,
    // one block an SM) all measured slower on the H200 (bench/RESULTS.md, session 22).
#pragma unroll 1
    for (int64_t b = 0; b < nb; ++b) {
        uint2 w[kM][2][2];
        float dw[kM][2][2];
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    w[m][i][h] = ld_stream8(wq[m] + (2 * i + h) * q_step + b * 32);
                    dw[m][i][h] = __half2float(__ushort_as_half(__ldg(ws[m] + (2 * i + h) * s_step + b)));
                }
        uint2 x[kTcN];
        float dx[kTcN][2];
#pragma unroll
        for (int j = 0; j < kTcN; ++j) {
            x[j] = __ldg(reinterpret_cast<const uint2*>(a.xq + xo[j] + b * 32));
            dx[j][0] = __ldg(a.xd + xdo[j][0] + b);
            dx[j][1] = __ldg(a.xd + xdo[j][1] + b);
        }
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < kTcN; ++j) {
                    int s[4];
                    mma_s8(s, w[m][i][0], w[m][i][1], x[j]);
#pragma unroll
                    for (int e = 0; e < 4; ++e)  // e: row gq (+8 for e >= 2), column 2 tq + (e & 1)
                        acc[m][i][j][e] = fmaf(dw[m][i][e >> 1] * dx[j][e & 1], small_int_to_float(s[e]), acc[m][i][j][e]);
                }
    }
    mma_epilogue<kM>(a, acc, r0, f, n, gq, tq);
}

// ---- grouped expert products on int8 tensor cores, the other block types (prefill) ----

// c = a b, m16n8k16, int8 operands, int32 accumulators: one 16-value segment (one scale).
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], uint32_t a_row, uint32_t a_row8, uint32_t b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a_row), "r"(a_row8), "r"(b), "r"(0));
}
__device__ __forceinline__ uint32_t pick4(const int (&q)[4], int i) {
    return uint32_t(i == 0 ? q[0] : i == 1 ? q[1] : i == 2 ? q[2] : q[3]);  // selects, not a local array
}

// expert_mma_kernel for the K-quants and the 4/5-bit types: the k side is one segment of a
// unit (quant_blocks.cuh: 16 values with their own scale and min) on mma.m16n8k16.s8, so each
// int32 sum is one segment's exact dot product; per (row, pair) it is then scaled as the GEMV
// does: scale * (dot - bias * sum) - min * sum, times x's scale, where sum (the segment's sum
// of x's int8 codes, per pair) comes from one more mma with an all-ones A. Lane (g, t) decodes
// the units of its four rows (r0 + 8 h + g) and keeps code word t of each segment: the A
// fragment. Same contract as expert_mma_kernel<kM>.
template <GgmlType kType, int kM>
__global__ void __launch_bounds__(kTcWarps * 32) expert_mma_kquant_kernel(const ExpertGemv a) {
    detail::pdl_entry();
    using F = detail::BlockFormat<kType>;
    constexpr int kUnits = F::kValues / 32;
    constexpr bool kMin = detail::CodeOffsets<kType>::kMin, kSum = detail::CodeOffsets<kType>::kSum;
    constexpr int kBias = detail::CodeOffsets<kType>::kBias;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, tq = lane & 3;
    const int c = int(blockIdx.x);
    if (c >= *a.ch.n_chunks) return;
    const int64_t r0 = int64_t(blockIdx.y) * kTcRowsPerBlock + warp * kTcRowsPerWarp;
    if (r0 >= a.rows) return;  // rows % 32 == 0 on this path
    if (a.ch.expert[c] < a.ch.e_begin || a.ch.expert[c] >= a.ch.e_end) return;  // held by another rank
    const int expert = a.ch.expert[c] - a.ch.e_begin, n = a.ch.count[c], f = a.ch.first[c];
    const int64_t n_in = a.n_in, bpr = n_in / F::kValues, upr = n_in / 32;
    int xo[kTcN], xdo[kTcN][2];
    chunk_pair_offsets(a, f, n, gq, tq, 4 * tq, xo, xdo);
    const uint8_t* codes[kM];
    const uint8_t* heads[kM];
    int64_t rowb[kM];  // the first block of row r0 + gq; rows 8 h further are 8 h bpr blocks on
#pragma unroll
    for (int m = 0; m < kM; ++m) {
        const detail::SplitMatrix<kType> sm(a.m[m].data, a.m[m].n_all * bpr);
        codes[m] = sm.codes, heads[m] = sm.heads;
        rowb[m] = (int64_t(expert) * a.m[m].stride + a.m[m].offset + r0 + gq) * bpr;
    }
    float acc[kM][2][kTcN][4];
    zero<kM>(acc);
#pragma unroll 1
    for (int64_t u = 0; u < upr; ++u) {
        const int64_t blk = u / kUnits;
        const int ju = int(u % kUnits);
        uint32_t aq[kM][4][2];
        float sc[kM][4][2], mn[kM][4][2];
        int off[2] = {0, 0};
#pragma unroll
        for (int m = 0; m < kM; ++m) {
            detail::UnitRaw raw[4];
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const int64_t b = rowb[m] + 8 * h * bpr + blk;
                const uint8_t* code = codes[m] + b * detail::code_bytes<kType>();
                raw[h] = detail::load_unit_rest<kType>(ld_stream16(code + detail::unit_code_offset<kType>(ju)), code,
                                                       heads[m] + b * F::kHeadBytes, ju);
            }
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const detail::Unit w = detail::decode_unit<kType>(raw[h], ju);
#pragma unroll
                for (int sg = 0; sg < 2; ++sg) {
                    aq[m][h][sg] = pick4(w.q[sg], tq);
                    sc[m][h][sg] = w.scale[sg];
                    mn[m][h][sg] = w.min[sg];
                    off[sg] = w.off[sg];
                }
            }
        }
#pragma unroll
        for (int sg = 0; sg < 2; ++sg) {
            const int xv = int(blk * F::kValues + off[sg]);  // the segment's first value in x's row
            uint32_t xb[kTcN];
            float dx[kTcN][2];
            int sum[kTcN][4];
#pragma unroll
            for (int j = 0; j < kTcN; ++j) {
                xb[j] = __ldg(reinterpret_cast<const uint32_t*>(a.xq + xo[j] + xv));
                dx[j][0] = __ldg(a.xd + xdo[j][0] + xv / 32);
                dx[j][1] = __ldg(a.xd + xdo[j][1] + xv / 32);
                if constexpr (kSum) mma_s8_k16(sum[j], 0x01010101u, 0x01010101u, xb[j]);  // every row: the column sums
            }
#pragma unroll
            for (int m = 0; m < kM; ++m)
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < kTcN; ++j) {
                        int d[4];
                        mma_s8_k16(d, aq[m][2 * i][sg], aq[m][2 * i + 1][sg], xb[j]);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {  // e: row 8 (e >> 1) + gq of tile i, column 2 tq + (e & 1)
                            const int h = 2 * i + (e >> 1);
                            const int dd = kBias ? d[e] - kBias * sum[j][e & 1] : d[e];
                            float v = sc[m][h][sg] * small_int_to_float(dd);
                            if constexpr (kMin) v = fmaf(-mn[m][h][sg], small_int_to_float(sum[j][e & 1]), v);
                            acc[m][i][j][e] = fmaf(dx[j][e & 1], v, acc[m][i][j][e]);
                        }
                    }
        }
    }
    mma_epilogue<kM>(a, acc, r0, f, n, gq, tq);
}

// Router logits [T, E] -> ids [T, k] by decreasing probability (ties to the lower id) and
// weights [T, k] renormalised over the k, as ref::moe_route. One warp a token.
__global__ void __launch_bounds__(32) route_kernel(const float* __restrict__ logits, int E, int k,
                                                   int32_t* __restrict__ ids, float* __restrict__ wt) {
    detail::pdl_entry();
    __shared__ float p[kMaxExperts];
    const int lane = threadIdx.x;
    const float* l = logits + int64_t(blockIdx.x) * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += p[e] = expf(l[e] - mx);
    sum = detail::warp_sum_all(sum);
    for (int e = lane; e < E; e += 32) p[e] /= sum;
    __syncwarp();
    // Rank i's id and probability stay in lane i's registers: the old loop stored each weight
    // to global memory and read it back to renormalise, a dependent round trip per rank (the
    // kernel took 7.7 us at decode, ncu).
    float top = 0.0f, mine_w = 0.0f;
    int32_t mine_id = 0;
    for (int i = 0; i < k; ++i) {
        float bv = -1.0f;
        int bi = E;
        for (int e = lane; e < E; e += 32)
            if (p[e] > bv) bv = p[e], bi = e;  // increasing e: the first of equals stays
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        top += bv;
        if (lane == i) mine_w = bv, mine_id = bi;
        __syncwarp();
        if (lane == 0) p[bi] = -2.0f;  // taken (probabilities are >= 0)
        __syncwarp();
    }
    if (lane < k) {
        ids[int64_t(blockIdx.x) * k + lane] = mine_id;
        wt[int64_t(blockIdx.x) * k + lane] = mine_w / top;
    }
}

// The P pairs grouped by expert, in chunks of up to `chunk`: one block. The order of the
// pairs inside an expert follows atomics (each pair's result does not depend on it).
__global__ void __launch_bounds__(1024) sort_kernel(const int32_t* __restrict__ ids, int P, int E, int chunk, int32_t* expert,
                                                    int32_t* first, int32_t* count, int32_t* pair_of, int32_t* n_chunks) {
    detail::pdl_entry();
    __shared__ int cnt[kMaxExperts], start[kMaxExperts], cbase[kMaxExperts], next[kMaxExperts];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0, next[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, cb = 0;
        for (int e = 0; e < E; ++e) {
            start[e] = s, cbase[e] = cb;
            s += cnt[e];
            cb += (cnt[e] + chunk - 1) / chunk;
        }
        *n_chunks = cb;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        const int e = ids[p];
        pair_of[start[e] + atomicAdd(&next[e], 1)] = p;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int j = 0; j * chunk < cnt[e]; ++j) {
            expert[cbase[e] + j] = e;
            first[cbase[e] + j] = start[e] + j * chunk;
            count[cbase[e] + j] = min(chunk, cnt[e] - j * chunk);
        }
}

// y [T, D] = sum of w * ye over each token's k pairs in increasing expert id, then
// + sigmoid(sg) * sy (sg null: no shared expert). Blocks (token, 256 columns): one block a
// token walked D in a loop and took 17 us at decode (ncu, 35b-a3b).
__global__ void __launch_bounds__(kThreads) combine_kernel(const float* __restrict__ ye, const int32_t* __restrict__ ids,
                                                           const float* __restrict__ wt, int k, int64_t D,
                                                           const float* __restrict__ sg, const float* __restrict__ sy,
                                                           float* __restrict__ y, int e_begin, int e_end) {
    detail::pdl_entry();
    __shared__ int order[kMaxUsed], id[kMaxUsed];
    const int64_t t = blockIdx.x;
    if (threadIdx.x < k) id[threadIdx.x] = ids[t * k + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {  // the token's ranks by increasing expert id (k is small), in shared memory
        for (int i = 0; i < k; ++i) order[i] = i;
        for (int i = 1; i < k; ++i)
            for (int j = i; j > 0 && id[order[j]] < id[order[j - 1]]; --j) {
                const int o = order[j];
                order[j] = order[j - 1], order[j - 1] = o;
            }
    }
    __syncthreads();
    const float s = sg ? detail::sigmoid(sg[t]) : 0.0f;
    for (int64_t d = int64_t(blockIdx.y) * kThreads + threadIdx.x; d < D; d += int64_t(gridDim.y) * kThreads) {
        float acc = 0.0f;
        for (int i = 0; i < k; ++i) {
            if (id[order[i]] < e_begin || id[order[i]] >= e_end) continue;  // another rank's expert
            const int64_t p = t * k + order[i];
            acc += wt[p] * ye[p * D + d];
        }
        if (sg) acc += s * sy[t * D + d];
        y[t * D + d] = acc;
    }
}

// Weights read as blocks with x quantized per 32 (Q8_0 and the split K-quant types).
bool block_type(GgmlType t) { return t != GgmlType::F32 && t != GgmlType::BF16 && split_blocks_supported(t); }

// The call's scratch, carved from the caller's workspace in this order.
struct MoeLayout {
    float* logits;   // [T, E]
    int32_t* ids;    // [P]
    float* wt;       // [P]
    int32_t *c_expert, *c_first, *c_count, *pair_of, *n_chunks;  // grouped calls: [C], [C], [C], [P], [1]
    MatmulInput xq;      // x quantized [T, D] (Q8_0 gate / up)
    float* h;        // [P, I]
    MatmulInput hq;      // h quantized (Q8_0 down)
    float* ye;       // [P, D]
    float *sg, *sh, *su, *sy;  // shared expert: gate [T], [T, Is] twice, output [T, D]
    void* mm;        // the shared expert's and router's matmul workspace
    size_t bytes;
};

// The tensor-core path: grouped calls with every expert matrix block-quantized (Q8_0, the
// K-quants, ...), whose pair rows index in 32 bits (P x max(D, I) < 2^31).
// ALLOY_CUDA_MOE_TC=0 keeps grouped calls on the GEMV kernels (A/B; read once).
bool tensor_cores_allowed() {
    static const bool on = [] {
        const char* e = std::getenv("ALLOY_CUDA_MOE_TC");
        return !(e && std::string(e) == "0");
    }();
    return on;
}
bool tensor_core_path(const ref::MoeWeights& w, int64_t T) {
    return T > kMoeDirectMaxT && tensor_cores_allowed() && block_type(w.gate.all.type) && block_type(w.up.all.type) && block_type(w.down.all.type) &&
           T * w.n_used * std::max(w.n_embd(), w.gate.rows) < (int64_t(1) << 31);
}
int chunk_pairs(const ref::MoeWeights& w, int64_t T) { return tensor_core_path(w, T) ? kTcChunkT : kChunkT; }
int64_t max_chunks(int64_t P, int E, int chunk) { return std::min<int64_t>(P, P / chunk + E); }

MoeLayout moe_layout(const ref::MoeWeights& w, int64_t T, uint8_t* base) {
    const int64_t D = w.n_embd(), I = w.gate.rows, E = w.n_expert, P = T * w.n_used;
    const int64_t Is = w.has_shared() ? w.shexp_gate.n_out : 0, C = max_chunks(P, int(E), chunk_pairs(w, T));
    size_t at = 0;
    auto take = [&](size_t bytes) {
        uint8_t* p = base ? base + at : nullptr;
        at += align256(bytes);
        return p;
    };
    MoeLayout L{};
    L.logits = reinterpret_cast<float*>(take(size_t(T * E) * 4));
    L.ids = reinterpret_cast<int32_t*>(take(size_t(P) * 4));
    L.wt = reinterpret_cast<float*>(take(size_t(P) * 4));
    const bool grouped = T > kMoeDirectMaxT;
    L.c_expert = reinterpret_cast<int32_t*>(take(grouped ? size_t(C) * 4 : 0));
    L.c_first = reinterpret_cast<int32_t*>(take(grouped ? size_t(C) * 4 : 0));
    L.c_count = reinterpret_cast<int32_t*>(take(grouped ? size_t(C) * 4 : 0));
    L.pair_of = reinterpret_cast<int32_t*>(take(grouped ? size_t(P) * 4 : 0));
    L.n_chunks = reinterpret_cast<int32_t*>(take(grouped ? 4 : 0));
    if (block_type(w.gate.all.type)) {
        L.xq.q = reinterpret_cast<int8_t*>(take(size_t(T * D)));
        L.xq.d = reinterpret_cast<float*>(take(size_t(T * (D / 32)) * 4));
    }
    // h in fp32 only where a kernel reads it: the tensor-core path keeps h as int8 alone (the
    // fp32 copy was P x I x 4 bytes of workspace nothing read: 512 MB at 32k tokens, k 8, I 512).
    L.h = tensor_core_path(w, T) ? nullptr : reinterpret_cast<float*>(take(size_t(P * I) * 4));
    if (block_type(w.down.all.type)) {
        L.hq.q = reinterpret_cast<int8_t*>(take(size_t(P * I)));
        L.hq.d = reinterpret_cast<float*>(take(size_t(P * (I / 32)) * 4));
    }
    L.ye = reinterpret_cast<float*>(take(size_t(P * D) * 4));
    L.sg = reinterpret_cast<float*>(take(size_t(Is ? T : 0) * 4));
    L.sh = reinterpret_cast<float*>(take(size_t(T * Is) * 4));
    L.su = reinterpret_cast<float*>(take(size_t(T * Is) * 4));
    L.sy = reinterpret_cast<float*>(take(size_t(Is ? T * D : 0) * 4));
    size_t mm = matmul_workspace_bytes(w.router, T);
    if (Is) {
        const WeightView* gu[2] = {&w.shexp_gate, &w.shexp_up};
        mm = std::max({mm, matmul_multi_workspace_bytes(gu, 2, T), matmul_workspace_bytes(w.shexp_down, T),
                       matmul_workspace_bytes(w.shexp_router, T)});
    }
    L.mm = take(mm);
    L.bytes = at;
    return L;
}

void check_moe(const ref::MoeWeights& w, int64_t T, const char* op) {
    ref::check_moe_weights(w, op);
    auto fail = [&](const std::string& what) { throw Error(std::string(op) + ": " + what); };
    if (w.n_expert > kMaxExperts) fail(std::to_string(w.n_expert) + " experts (at most " + std::to_string(kMaxExperts) + ")");
    if (w.n_used > kMaxUsed) fail(std::to_string(w.n_used) + " experts per token (at most " + std::to_string(kMaxUsed) + ")");
    if (w.gate.all.type != w.up.all.type) fail("expert gate and up tensors of different types");
    if (T * w.n_used > (int64_t(1) << 31) - 1) fail("too many (token, expert) pairs");
    for (const ref::ExpertMatrix* m : {&w.gate, &w.up, &w.down}) {
        const WeightView& v = m->all;
        const std::string tn = type_traits(v.type).name;
        if (block_type(v.type)) {
            if (v.layout != WeightLayout::Split) fail(tn + " expert weights on the device must be split first (cuda::split_blocks)");
            if (v.n_in % type_traits(v.type).block_elems || reinterpret_cast<uintptr_t>(v.data) % 16)
                fail(tn + " expert rows must be whole blocks, 16-byte aligned");
        } else if (v.type == GgmlType::BF16 || v.type == GgmlType::F32) {
            if (v.n_in % 8 || reinterpret_cast<uintptr_t>(v.data) % 16)
                fail("16-bit / F32 expert rows must hold a multiple of 8 weights, 16-byte aligned");
        } else {
            fail("expert weight type " + tn + " (CUDA runs F32, BF16 and the split block types: " + kSplitBlockTypes + ")");
        }
    }
}

template <GgmlType kW, int kM>
void launch_expert_gemv(const ExpertGemv& a, unsigned chunks, bool grouped, cudaStream_t st, const char* op) {
    const dim3 grid(chunks, unsigned(ceil_div(a.rows, kRowsPerBlock)));
    constexpr int kKS = kM == 2 ? 2 : 1;
    if (grouped) detail::launch(op, expert_gemv_kernel<kW, kChunkT, kM, 1>, grid, dim3(kThreads), 0, st, a);
    else detail::launch(op, expert_gemv_kernel<kW, 1, kM, kKS>, grid, dim3(kKS * kThreads), 0, st, a);
    ALLOY_CUDA_LAUNCHED(op);
}

template <int kM>
void expert_gemv(GgmlType type, const ExpertGemv& a, unsigned chunks, bool grouped, cudaStream_t st, const char* op) {
    if (type == GgmlType::BF16) return launch_expert_gemv<GgmlType::BF16, kM>(a, chunks, grouped, st, op);
    if (type == GgmlType::F32) return launch_expert_gemv<GgmlType::F32, kM>(a, chunks, grouped, st, op);
    const bool known = detail::with_block_type(type, [&](auto t) { launch_expert_gemv<decltype(t)::value, kM>(a, chunks, grouped, st, op); });
    if (!known) throw Error(std::string(op) + ": no expert GEMV for " + type_traits(type).name);  // check_moe refused it already
}

// One tensor-core launch of kM matrices of `type` (Q8_0: whole 32-value blocks on k32; the
// others: 16-value segments on k16).
template <int kM>
void expert_mma(GgmlType type, const ExpertGemv& a, dim3 grid, cudaStream_t st, const char* op) {
    const dim3 blk(kTcWarps * 32);
    if (type == GgmlType::Q8_0) {
        detail::launch(op, expert_mma_kernel<kM>, grid, blk, 0, st, a);
    } else {
        const bool known = detail::with_block_type(type, [&](auto t) {
            if constexpr (decltype(t)::value != GgmlType::Q8_0)
                detail::launch(op, expert_mma_kquant_kernel<decltype(t)::value, kM>, grid, blk, 0, st, a);
        });
        if (!known) throw Error(std::string(op) + ": no expert tensor-core kernel for " + type_traits(type).name);
    }
    ALLOY_CUDA_LAUNCHED(op);
}

Mat mat(const ref::ExpertMatrix& m) { return {m.all.data, m.stride, m.offset, m.all.n_out}; }

}  // namespace

size_t moe_ffn_workspace_bytes(const ref::MoeWeights& w, int64_t T) {
    return T > 0 ? moe_layout(w, T, nullptr).bytes : 0;
}

void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T, void* workspace, void* stream) {
    const char* op = "cuda::moe_ffn";
    check_moe(w, T, op);
    if (T <= 0) return;
    if (!workspace) throw Error(std::string(op) + ": workspace is null");
    cudaStream_t st = detail::as_stream(stream);
    const MoeLayout L = moe_layout(w, T, static_cast<uint8_t*>(workspace));
    const int64_t D = w.n_embd(), I = w.gate.rows;
    const int E = w.n_expert, k = w.n_used;
    const int64_t P = T * k;
    const bool grouped = T > kMoeDirectMaxT;

    // Routing.
    matmul(w.router, x, L.logits, T, L.mm, st);
    detail::launch(op, route_kernel, dim3(unsigned(T)), dim3(32), 0, st, static_cast<const float*>(L.logits), E, k, L.ids,
                   L.wt);
    ALLOY_CUDA_LAUNCHED(op);
    Chunks ch;
    unsigned chunks = unsigned(P);
    if (grouped) {
        const int chunk = chunk_pairs(w, T);
        detail::launch(op, sort_kernel, dim3(1), dim3(1024), 0, st, static_cast<const int32_t*>(L.ids), int(P), E, chunk,
                       L.c_expert, L.c_first, L.c_count, L.pair_of, L.n_chunks);
        ALLOY_CUDA_LAUNCHED(op);
        ch = {nullptr, L.c_expert, L.c_first, L.c_count, L.pair_of, L.n_chunks};
        chunks = unsigned(max_chunks(P, E, chunk));
    } else {
        ch.ids = L.ids;
    }
    ch.e_begin = w.expert_begin;
    ch.e_end = w.expert_end();

    // The experts: gate and up -> h (and its quantization), then down -> ye.
    if (L.xq.q) quantize_q8_input(x, T, D, L.xq, st);
    ExpertGemv gu{{mat(w.gate), mat(w.up)}, I, D, k, x, L.xq.q, L.xq.d, L.h, L.hq.q, L.hq.d, ch};
    ExpertGemv dn{{mat(w.down), {}}, D, I, 1, L.h, L.hq.q, L.hq.d, L.ye, nullptr, nullptr, ch};
    if (tensor_core_path(w, T)) {
        expert_mma<2>(w.gate.all.type, gu, dim3(chunks, unsigned(ceil_div(I, kTcRowsPerBlock))), st, op);
        expert_mma<1>(w.down.all.type, dn, dim3(chunks, unsigned(ceil_div(D, kTcRowsPerBlock))), st, op);
    } else {
        expert_gemv<2>(w.gate.all.type, gu, chunks, grouped, st, op);
        expert_gemv<1>(w.down.all.type, dn, chunks, grouped, st, op);
    }

    // The shared expert and its gate (the matmuls' own paths; x's quantization reused).
    if (w.has_shared()) {
        const int64_t Is = w.shexp_gate.n_out;
        const WeightView* gu2[2] = {&w.shexp_gate, &w.shexp_up};
        float* outs[2] = {L.sh, L.su};
        const MatmulInput* xq = w.shexp_gate.type == GgmlType::Q8_0 && L.xq.q ? &L.xq : nullptr;
        matmul_multi(gu2, outs, 2, x, T, L.mm, st, xq);
        swiglu(L.sh, L.su, L.sh, T * Is, st);
        matmul(w.shexp_down, L.sh, L.sy, T, L.mm, st);
        matmul(w.shexp_router, x, L.sg, T, L.mm, st, w.shexp_router.type == GgmlType::Q8_0 && L.xq.q ? &L.xq : nullptr);
    }
    detail::launch(op, combine_kernel, dim3(unsigned(T), unsigned(ceil_div(D, kThreads))), dim3(kThreads), 0, st, static_cast<const float*>(L.ye),
                   static_cast<const int32_t*>(L.ids), static_cast<const float*>(L.wt), k, D,
                   static_cast<const float*>(w.has_shared() ? L.sg : nullptr), static_cast<const float*>(L.sy), y,
                   w.expert_begin, w.expert_end());
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
