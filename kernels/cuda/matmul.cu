// matmul on CUDA (kernels/cuda/ops.h): cuBLAS for F32 and BF16 weights; for Q8_0 a
// weight-streaming GEMV at decode and dequantize-to-bf16 panels + cuBLAS at prefill.
//
// Layouts: W is row-major [n_out, n_in] (GGUF / PyTorch Linear), which cuBLAS (column-major)
// sees as [n_in, n_out] with ld = n_in; x [T, n_in] is column-major [n_in, T]; y [T, n_out] is
// column-major [n_out, T]. So y = op_T(W) x with m = n_out, n = T, k = n_in.
//
// Q8_0 GEMV: decode is bound by streaming the weight once, 34 bytes per 32 weights. GGUF's
// block (f16 scale + 32 int8) is only 2-byte aligned, so the weights live on the device split
// (split_q8: quants, then scales): lane l of a warp takes half a block (16 quants) of block
// (l / 2) of each 16-block step with one 16-byte load (the warp: 512 contiguous bytes), and the
// pair's scale with a 2-byte one (the warp: 32 contiguous bytes). GGUF's layout read in place
// took five 4-byte loads and a funnel shift per lane, each instruction spanning the step's 17
// sectors: L1 was the bound (ncu, H200, 10240 x 5120: L1/TEX 77%, DRAM 53%). x is
// quantized to int8 per 32 (an fp32 scale each) once per call, so a lane's 16 products per
// token are 4 dp4a and one scaled FMA, and x costs 1 byte per weight of L1 traffic, not 4.
// Small matrices split each row's blocks over several warps of a block (from the shape alone),
// reduced through shared memory in a fixed order, so enough bytes are in flight. Both GEMVs
// take T <= 16 (the CPU's kGemvMaxTokens) with per-row bits that do not depend on T (below).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"

namespace alloy::cuda {

namespace {

using detail::as_stream;
using detail::ceil_div;

constexpr int kQ8Block = 32, kQ8Bytes = 34;
using detail::GemvPart;
using detail::GemvParts;
using detail::gemv_part;
using detail::kGemvThreads;
using detail::kMaxParts;
using detail::launch_pdl;
using detail::ld_stream16;
using detail::pdl_trigger;
using detail::pdl_wait;
using detail::pdl_wait_after;
using detail::store_row_sums;
using detail::with_tokens;
// 16-block steps whose loads a lane issues before using them (4 measured mixed on the H200:
// some 27b shapes +5-10%, the 0.8B's LM head -25%).
constexpr int kGemvUnroll = 2;
constexpr int64_t kGemvMaxT = kQ8GemvMaxT;  // the BF16 GEMV's limit too (16: the CPU's kGemvMaxTokens)

const char* cublas_status(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        default: return "cuBLAS error";
    }
}
#define ALLOY_CUBLAS_CHECK(op, expr)                                                        \
    do {                                                                                    \
        cublasStatus_t s_ = (expr);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) detail::fail(op, cublas_status(s_), __FILE__, __LINE__); \
    } while (0)

// One cuBLAS handle per host thread (a handle must not be shared by threads racing on
// cublasSetStream); created on first use, which allocates, so warm it up before capturing.
cublasHandle_t handle(const char* op) {
    struct Holder {
        cublasHandle_t h = nullptr;
        ~Holder() {
            if (h) cublasDestroy(h);
        }
    };
    thread_local Holder holder;
    if (!holder.h) ALLOY_CUBLAS_CHECK(op, cublasCreate(&holder.h));
    return holder.h;
}

// x fp32 [n] -> bf16 [n], round to nearest even (as format/quant.h's fp32_to_bf16).
__global__ void to_bf16_kernel(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, int64_t n) {
    detail::pdl_entry();
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

void to_bf16(const float* x, void* y, int64_t n, cudaStream_t st, const char* op) {
    const int64_t blocks = std::min<int64_t>(ceil_div(n, 256), 4 * 1024);
    detail::launch(op, to_bf16_kernel, dim3(unsigned(blocks)), dim3(256), 0, st, x, static_cast<__nv_bfloat16*>(y), n);
    ALLOY_CUDA_LAUNCHED(op);
}

// y [T, m] = W [m, k] x [T, k] with W of cuBLAS type wt (A row-major, ld lda elements), x of
// type xt, y fp32, accumulation per `compute`.
void gemm(const char* op, cudaStream_t st, const void* W, cudaDataType wt, int64_t lda, const void* x,
          cudaDataType xt, float* y, int64_t m, int64_t n, int64_t k, cublasComputeType_t compute) {
    cublasHandle_t h = handle(op);
    ALLOY_CUBLAS_CHECK(op, cublasSetStream(h, st));
    const float one = 1.0f, zero = 0.0f;
    ALLOY_CUBLAS_CHECK(op, cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(m), int(n), int(k), &one, W, wt, int(lda), x,
                                        xt, int(k), &zero, y, CUDA_R_32F, int(m), compute, CUBLAS_GEMM_DEFAULT));
}

// A BF16 weight times xb, the input already converted to bf16 (to_bf16) in the workspace.
void bf16_gemm(const WeightView& W, const void* xb, float* y, int64_t T, cudaStream_t st, const char* op) {
    gemm(op, st, W.data, CUDA_R_16BF, W.n_in, xb, CUDA_R_16BF, y, W.n_out, T, W.n_in, CUBLAS_COMPUTE_32F);
}

// ---- Q8_0 ------------------------------------------------------------------------------------

// x [T, n] fp32 -> xq [T, n] int8 and xd [T, n / 32] fp32: per 32 values, d = amax / 127 and
// q = round(x / d). One warp per block of 32.
__global__ void quantize_x_kernel(const float* __restrict__ x, int8_t* __restrict__ xq, float* __restrict__ xd,
                                  int64_t n_blocks) {
    // The GEMV after this kernel (launched with programmatic serialization) may start now:
    // it streams its first weights while x is quantized, and waits before reading xq.
    asm volatile("griddepcontrol.launch_dependents;");
    // Launched with programmatic serialization too: x is the previous kernel's output, and xq
    // may still be read by the previous GEMV.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const int64_t b = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    detail::quantize_block32(x[b * kQ8Block + lane], lane, xq + b * kQ8Block, xd + b);
}


// The Q8_0 GEMV: y [kT, n_out] = W [n_out, nb blocks] x, W split (split_blocks): quants
// [n_out, 32 nb] int8 then scales [n_out, nb] f16. kWpr warps per row (1, 2, 4 or 8), so a
// block of 8 warps covers 8 / kWpr rows. xq / xd: x quantized by quantize_x_kernel.
template <int kT, int kWpr, int kR>
__global__ void __launch_bounds__(kGemvThreads) q8_gemv_kernel(const GemvParts parts, int64_t nb,
                                                                const int8_t* __restrict__ xq,
                                                                const float* __restrict__ xd, int trig) {
    const GemvPart part = gemv_part(parts);
    const int64_t n_out = part.n_out;
    const int64_t n_in = nb * kQ8Block;
    const int8_t* __restrict__ Q = static_cast<const int8_t*>(part.W);
    const unsigned short* __restrict__ S = reinterpret_cast<const unsigned short*>(Q + n_out * n_in);
    float* __restrict__ y = part.y;
    // trig: 1 = trigger the next PDL kernel at once (pdl_trigger); 0 measured the same in a
    // chain of GEMVs (bench/RESULTS.md), kept for neighbours that are PDL-aware.
    constexpr int kU = kR == 1 ? kGemvUnroll : 1;  // 16-block steps in flight per row
    constexpr int kRowsPerBlock = (kGemvThreads / 32) / kWpr * kR;
    __shared__ float red[kGemvThreads / 32][kR][kT];
    if (trig) pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row0 = part.block * int64_t(kRowsPerBlock) + (warp / kWpr) * kR;
    const int wir = warp % kWpr;  // this warp's share of the row
    const int half = lane & 1;    // which 16 quants of the block
    float acc[kR][kT];
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[r][t] = 0.0f;
    constexpr int64_t kStep = int64_t(kWpr) * 16;
    int4 w[kR][kU];
    uint16_t sc[kR][kU];
    // A lane past the matrix loads its row's first bytes and drops them (branch-free; the
    // wait below is what keeps the first loads ahead of it).
    auto load = [&](int64_t b0) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int64_t b = b0 + u * kStep + (lane >> 1);
#pragma unroll
            for (int r = 0; r < kR; ++r) {
                const bool ok = b < nb && row0 + r < n_out;
                const int4 v = ld_stream16(Q + (ok ? (row0 + r) * n_in + b * kQ8Block + 16 * half : 0));
                const uint16_t d = __ldg(S + (ok ? (row0 + r) * nb + b : 0));
                w[r][u] = ok ? v : make_int4(0, 0, 0, 0);
                sc[r][u] = ok ? d : uint16_t(0);
            }
        }
    };
    int64_t b0 = int64_t(wir) * 16;
    load(b0);  // the first weights depend on nothing: in flight before the wait
    // ptxas otherwise schedules the wait (ACQBULK) before these loads (seen in the SASS of
    // every instantiation once the loads were 16 bytes), so the first weights were no longer
    // in flight while the previous kernel drained: +0.4-0.5 us a small GEMV. The wait here
    // reads a value of every first load, which pins the loads ahead of it.
    uint32_t dep = 0;
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int u = 0; u < kU; ++u) dep ^= uint32_t(w[r][u].x) ^ uint32_t(w[r][u].w) ^ sc[r][u];
    pdl_wait_after(dep);
    while (b0 < nb) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int64_t b = b0 + u * kStep + (lane >> 1);
            if (b >= nb) continue;
            float dw[kR];
#pragma unroll
            for (int r = 0; r < kR; ++r) dw[r] = __half2float(__ushort_as_half(sc[r][u]));
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                const int4 xv = __ldg(reinterpret_cast<const int4*>(xq + t * n_in + b * kQ8Block + 16 * half));
                const float xs = __ldg(xd + t * nb + b);
#pragma unroll
                for (int r = 0; r < kR; ++r) {
                    int s = __dp4a(w[r][u].x, xv.x, 0);
                    s = __dp4a(w[r][u].y, xv.y, s);
                    s = __dp4a(w[r][u].z, xv.z, s);
                    s = __dp4a(w[r][u].w, xv.w, s);
                    acc[r][t] = fmaf(dw[r] * xs, float(s), acc[r][t]);
                }
            }
        }
        b0 += kStep * kU;
        if (b0 < nb) load(b0);
    }
    store_row_sums<kT, kWpr, kR>(acc, red, warp, wir, lane, row0, n_out, y);
}

template <int kT, int kR>
void launch_q8_gemv_r(int wpr, GemvParts p, int64_t nb, const int8_t* xq, const float* xd, int trig, cudaStream_t st) {
    const unsigned grid = p.layout((kGemvThreads / 32) / wpr * kR);
    switch (wpr) {
        case 1: launch_pdl(q8_gemv_kernel<kT, 1, kR>, grid, kGemvThreads, 0, st, p, nb, xq, xd, trig); break;
        case 2: launch_pdl(q8_gemv_kernel<kT, 2, kR>, grid, kGemvThreads, 0, st, p, nb, xq, xd, trig); break;
        case 4: launch_pdl(q8_gemv_kernel<kT, 4, kR>, grid, kGemvThreads, 0, st, p, nb, xq, xd, trig); break;
        default: launch_pdl(q8_gemv_kernel<kT, 8, kR>, grid, kGemvThreads, 0, st, p, nb, xq, xd, trig); break;
    }
}

// Rows per warp (kR): a choice of speed only (each row's arithmetic is the same for any kR),
// so it may follow T and the shape; measured on the H200 (bench/RESULTS.md, 2026-12-01).
// Q8_0: 1 at T 1; at T 2-4 2 when the matrix has >= 6144 row-warps (n_out x warps per row),
// else 1; 4 at T 5-16, 2 for >= 64k row-warps at T >= 12 (the LM head: registers).
// BF16: 2 at T 1, 4 above (fp32 x costs 4 bytes of L1 per weight and token; kR rows share it).
int q8_rows_per_warp(int64_t T, int64_t row_warps) {
    if (T == 1) return 1;
    if (T <= 4) return row_warps >= 6144 ? 2 : 1;
    return T >= 12 && row_warps >= 65536 ? 2 : 4;
}
int bf16_rows_per_warp(int64_t T) { return T == 1 ? 2 : 4; }

template <int kT>
void launch_q8_gemv(int wpr, const GemvParts& p, int64_t nb, const int8_t* xq, const float* xd, int trig,
                    cudaStream_t st) {
    switch (q8_rows_per_warp(kT, p.total_rows() * wpr)) {
        case 4: launch_q8_gemv_r<kT, 4>(wpr, p, nb, xq, xd, trig, st); break;
        case 2: launch_q8_gemv_r<kT, 2>(wpr, p, nb, xq, xd, trig, st); break;
        default: launch_q8_gemv_r<kT, 1>(wpr, p, nb, xq, xd, trig, st); break;
    }
}

// The BF16 and F32 GEMVs (T <= kGemvMaxT, n_in % 8 == 0): y [kT, n_out] = W [n_out, n_in] x
// with x in fp32 as given (no rounding of x, no conversion kernel). Lane l of a warp takes the
// 8 weights of chunk (32 step + l) of each of its kR rows (16 bytes of BF16, 32 of F32),
// kBf16Unroll / kR steps in flight; kWpr warps per row as the Q8_0 GEMV; x is read through L1
// (2 float4 per token per chunk, shared by the kR rows). F32 weights take it at decode so that
// a verification call has the bits of decode calls (cuBLAS's SGEMM picks its algorithm by T).
constexpr int kBf16Unroll = 4;

template <int kT, int kWpr, int kR, bool kF32>
__global__ void __launch_bounds__(kGemvThreads) gemv16_kernel(const GemvParts parts, int64_t n_in,
                                                               const float* __restrict__ x, int trig) {
    const GemvPart part = gemv_part(parts);
    float* __restrict__ y = part.y;
    const int64_t n_out = part.n_out;
    constexpr int kU = kBf16Unroll / kR;
    constexpr int kV = kF32 ? 2 : 1;  // 16-byte loads per chunk
    constexpr int kRowsPerBlock = (kGemvThreads / 32) / kWpr * kR;
    __shared__ float red[kGemvThreads / 32][kR][kT];
    if (trig) pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row0 = part.block * int64_t(kRowsPerBlock) + (warp / kWpr) * kR;
    const int wir = warp % kWpr;
    const int64_t nc = n_in / 8;  // 8-weight chunks per row
    constexpr int64_t kStep = int64_t(kWpr) * 32;
    const uint4* W = static_cast<const uint4*>(part.W);
    float acc[kR][kT];
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[r][t] = 0.0f;
    uint4 w[kR][kU][kV];
    auto load = [&](int64_t c0) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int64_t c = c0 + u * kStep + lane;
#pragma unroll
            for (int r = 0; r < kR; ++r)
#pragma unroll
                for (int v = 0; v < kV; ++v)
                    w[r][u][v] = (c < nc && row0 + r < n_out) ? __ldg(W + ((row0 + r) * nc + c) * kV + v)
                                                               : make_uint4(0, 0, 0, 0);
        }
    };
    int64_t c0 = int64_t(wir) * 32;
    load(c0);
    pdl_wait();
    while (c0 < nc) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
            const int64_t c = c0 + u * kStep + lane;
            if (c >= nc) continue;
            float wf[kR][8];
#pragma unroll
            for (int r = 0; r < kR; ++r) {
                if constexpr (kF32) {
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        wf[r][4 * v + 0] = __uint_as_float(w[r][u][v].x);
                        wf[r][4 * v + 1] = __uint_as_float(w[r][u][v].y);
                        wf[r][4 * v + 2] = __uint_as_float(w[r][u][v].z);
                        wf[r][4 * v + 3] = __uint_as_float(w[r][u][v].w);
                    }
                } else {
                    // bf16 -> fp32 is the high half of a word: low element << 16, high element & mask.
                    const uint32_t ws[4] = {w[r][u][0].x, w[r][u][0].y, w[r][u][0].z, w[r][u][0].w};
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        wf[r][2 * i] = __uint_as_float(ws[i] << 16);
                        wf[r][2 * i + 1] = __uint_as_float(ws[i] & 0xffff0000u);
                    }
                }
            }
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                const float4* xp = reinterpret_cast<const float4*>(x + t * n_in + c * 8);
                const float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
                for (int r = 0; r < kR; ++r) {
                    float s = acc[r][t];
                    s = fmaf(wf[r][0], a.x, s);
                    s = fmaf(wf[r][1], a.y, s);
                    s = fmaf(wf[r][2], a.z, s);
                    s = fmaf(wf[r][3], a.w, s);
                    s = fmaf(wf[r][4], b.x, s);
                    s = fmaf(wf[r][5], b.y, s);
                    s = fmaf(wf[r][6], b.z, s);
                    s = fmaf(wf[r][7], b.w, s);
                    acc[r][t] = s;
                }
            }
        }
        c0 += kStep * kU;
        if (c0 < nc) load(c0);
    }
    store_row_sums<kT, kWpr, kR>(acc, red, warp, wir, lane, row0, n_out, y);
}

template <int kT, int kR, bool kF32>
void launch_gemv16_r(int wpr, GemvParts p, int64_t n_in, const float* x, int trig, cudaStream_t st) {
    const unsigned grid = p.layout((kGemvThreads / 32) / wpr * kR);
    switch (wpr) {
        case 1: launch_pdl(gemv16_kernel<kT, 1, kR, kF32>, grid, kGemvThreads, 0, st, p, n_in, x, trig); break;
        case 2: launch_pdl(gemv16_kernel<kT, 2, kR, kF32>, grid, kGemvThreads, 0, st, p, n_in, x, trig); break;
        case 4: launch_pdl(gemv16_kernel<kT, 4, kR, kF32>, grid, kGemvThreads, 0, st, p, n_in, x, trig); break;
        default: launch_pdl(gemv16_kernel<kT, 8, kR, kF32>, grid, kGemvThreads, 0, st, p, n_in, x, trig); break;
    }
}

template <int kT, bool kF32>
void launch_gemv16(int wpr, const GemvParts& p, int64_t n_in, const float* x, int trig, cudaStream_t st) {
    switch (bf16_rows_per_warp(kT)) {
        case 4: launch_gemv16_r<kT, 4, kF32>(wpr, p, n_in, x, trig, st); break;
        case 2: launch_gemv16_r<kT, 2, kF32>(wpr, p, n_in, x, trig, st); break;
        default: launch_gemv16_r<kT, 1, kF32>(wpr, p, n_in, x, trig, st); break;
    }
}

// Warps per row (detail::warps_per_row): 24 row-warps an SM for Q8_0, 48 for BF16 (measured,
// 48 for both before; 24 lets most Q8_0 matrices of the 0.8B take one warp per row, with no
// shared-memory reduction); a step is 16 blocks of a row.
int q8_warps_per_row(int64_t n_out, int64_t nb, bool q8) { return detail::warps_per_row(n_out, nb / 16, q8 ? 24 : 48); }

// Rows [0, rows) of a split Q8_0 matrix (Q: their quants [rows, 32 nb], S: their scales
// [rows, nb]) -> bf16 [rows, n_in]: each thread 4 quants (one word) times the block's scale.
__global__ void q8_to_bf16_kernel(const uint32_t* __restrict__ Q, const unsigned short* __restrict__ S, int64_t nb,
                                  int64_t rows, __nv_bfloat16* __restrict__ out) {
    detail::pdl_entry();
    const int64_t n_words = rows * nb * 8;  // 8 words of 4 quants per block
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words;
         i += int64_t(gridDim.x) * blockDim.x) {
        const uint32_t v = __ldg(Q + i);
        const float d = __half2float(__ushort_as_half(__ldg(S + (i >> 3))));
        __nv_bfloat16* o = out + 4 * i;
        const __nv_bfloat162 lo = __floats2bfloat162_rn(float(int8_t(v & 0xff)) * d, float(int8_t((v >> 8) & 0xff)) * d);
        const __nv_bfloat162 hi = __floats2bfloat162_rn(float(int8_t((v >> 16) & 0xff)) * d, float(int8_t(v >> 24)) * d);
        reinterpret_cast<__nv_bfloat162*>(o)[0] = lo;
        reinterpret_cast<__nv_bfloat162*>(o)[1] = hi;
    }
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

void check_weight(const WeightView& W, int64_t T, const char* op) {
    if (W.n_in <= 0 || W.n_out <= 0 || T < 0 || !W.data)
        throw Error(std::string(op) + ": empty weight or negative T");
    if (W.n_in > (int64_t(1) << 31) - 1 || W.n_out > (int64_t(1) << 31) - 1 || T > (int64_t(1) << 31) - 1)
        throw Error(std::string(op) + ": dimension past cuBLAS's int range");
    switch (W.type) {
        case GgmlType::F32:
            if (W.row_bytes != size_t(W.n_in) * 4) throw Error(std::string(op) + ": F32 rows must be dense");
            return;
        case GgmlType::BF16:
            if (W.row_bytes != size_t(W.n_in) * 2) throw Error(std::string(op) + ": BF16 rows must be dense");
            return;
        default: {
            const bool split = detail::with_block_type(W.type, [&](auto kt) {
                using F = detail::BlockFormat<kt.value>;
                if (W.n_in % F::kValues || W.row_bytes != size_t(W.n_in / F::kValues) * F::kBytes)
                    throw Error(std::string(op) + ": " + type_traits(W.type).name + " rows must be whole " +
                                std::to_string(F::kBytes) + "-byte blocks");
            });
            if (!split) break;
            if (W.layout != WeightLayout::Split)
                throw Error(std::string(op) + ": " + type_traits(W.type).name +
                            " weights on the device must be split first (cuda::split_blocks)");
            if (reinterpret_cast<uintptr_t>(W.data) % 16)
                throw Error(std::string(op) + ": " + type_traits(W.type).name + " data must be 16-byte aligned");
            return;
        }
    }
    throw Error(std::string(op) + ": weight type " + type_traits(W.type).name +
                " not supported on CUDA (F32, BF16, " + kSplitBlockTypes + ")");
}

}  // namespace

size_t matmul_workspace_bytes(const WeightView& W, int64_t T) {
    switch (W.type) {
        case GgmlType::BF16: return align256(size_t(T * W.n_in) * 2);
        default:
            if (!split_blocks_supported(W.type)) return 0;
            // Block types: x quantized for the GEMVs, or x in bf16 and a panel of bf16 rows.
            if (T <= kQ8GemvMaxT) return align256(size_t(T * W.n_in)) + align256(size_t(T * (W.n_in / kQ8Block)) * 4);
            return align256(size_t(T * W.n_in) * 2) + align256(size_t(std::min(W.n_out, kQ8PanelRows) * W.n_in) * 2);
    }
}

namespace {

// The GEMV path (T <= kGemvMaxT) for n weights of one type and n_in on the same x, in one
// launch (and one quantization of x for Q8_0); false when it does not apply (F32 / BF16 rows
// not a multiple of 8 weights or not 16-byte aligned), and nothing ran. Warps per row follow
// the group's total rows, so a row's bits are fixed by the group's shape (batch invariance).
bool gemv(const WeightView* const* W, float* const* y, int n, const float* x, int64_t T, uint8_t* ws, cudaStream_t st,
          const char* op, const MatmulInput* given) {
    if (T > kGemvMaxT || n < 1 || n > kMaxParts) return false;
    const GgmlType type = W[0]->type;
    const int64_t n_in = W[0]->n_in;
    GemvParts p;
    p.n = n;
    for (int m = 0; m < n; ++m) {
        if (W[m]->type != type || W[m]->n_in != n_in) return false;
        if ((type == GgmlType::F32 || type == GgmlType::BF16) && (n_in % 8 || reinterpret_cast<uintptr_t>(W[m]->data) % 16))
            return false;
        p.W[m] = W[m]->data;
        p.y[m] = y[m];
        p.n_out[m] = W[m]->n_out;
    }
    const int64_t rows = p.total_rows();
    if (type == GgmlType::F32 || type == GgmlType::BF16) {
        // 16-byte chunks per lane; warps per row as the Q8_0 GEMV with 8 weights a lane-step.
        const int wpr = q8_warps_per_row(rows, n_in / 16, false);
        if (type == GgmlType::F32)
            with_tokens(T, [&](auto kt) { launch_gemv16<kt.value, true>(wpr, p, n_in, x, 1, st); });
        else
            with_tokens(T, [&](auto kt) { launch_gemv16<kt.value, false>(wpr, p, n_in, x, 1, st); });
        ALLOY_CUDA_LAUNCHED(op);
        return true;
    }
    if (!split_blocks_supported(type)) return false;
    const int64_t nb = n_in / kQ8Block;
    const int8_t* xq = given ? given->q : reinterpret_cast<int8_t*>(ws);
    const float* xd = given ? given->d : reinterpret_cast<float*>(ws + align256(size_t(T * n_in)));
    if (!given) {
        const int64_t blocks = T * nb;
        // PDL-chained too: it waits for the kernel before it inside (griddepcontrol.wait).
        launch_pdl(quantize_x_kernel, unsigned(ceil_div(blocks * 32, 256)), 256, 0, st, x, const_cast<int8_t*>(xq),
                   const_cast<float*>(xd), blocks);
    }
    if (type != GgmlType::Q8_0) {
        detail::kquant_gemv(type, p, n_in, T, xq, xd, st);
        return true;
    }
    const int wpr = q8_warps_per_row(rows, nb, true);
    with_tokens(T, [&](auto kt) { launch_q8_gemv<kt.value>(wpr, p, nb, xq, xd, 1, st); });
    ALLOY_CUDA_LAUNCHED(op);
    return true;
}

}  // namespace

void quantize_q8_input(const float* x, int64_t T, int64_t n, MatmulInput out, void* stream) {
    if (n % kQ8Block || T < 0 || !out.q || !out.d) throw Error("cuda::quantize_q8_input: needs n % 32 == 0 and both arrays");
    const int64_t blocks = T * (n / kQ8Block);
    if (blocks == 0) return;
    launch_pdl(quantize_x_kernel, unsigned(ceil_div(blocks * 32, 256)), 256, 0, as_stream(stream), x, out.q, out.d, blocks);
    ALLOY_CUDA_LAUNCHED("cuda::quantize_q8_input");
}

size_t matmul_multi_workspace_bytes(const WeightView* const* W, int n, int64_t T) {
    size_t b = 0;
    for (int m = 0; m < n; ++m) b = std::max(b, matmul_workspace_bytes(*W[m], T));
    return b;
}

namespace {

// The prefill GEMM (T > kQ8GemvMaxT) of a BF16 or Q8_0 weight on xb, the input already in
// bf16 ([T, n_in], from to_bf16 or from its producer: MatmulInput::b). ws: the workspace,
// whose part past x's bf16 copy (matmul_workspace_bytes) holds a Q8_0 weight's bf16 panels.
void bf16_input_gemm(const WeightView& W, const void* xb, float* y, int64_t T, uint8_t* ws, cudaStream_t st,
                     const char* op) {
    if (W.type == GgmlType::BF16) {
        bf16_gemm(W, xb, y, T, st, op);
        return;
    }
    // Block types: the panel's bf16 copy costs 2 bytes written + read per weight against 2 T FLOPs
    // per weight of GEMM, small once T is in the hundreds.
    const int64_t nb = W.n_in / kQ8Block;
    auto* wb = reinterpret_cast<__nv_bfloat16*>(ws + align256(size_t(T * W.n_in) * 2));
    // y's panel columns are strided by n_out: one GEMM per panel with ldc = n_out.
    for (int64_t r0 = 0; r0 < W.n_out; r0 += kQ8PanelRows) {
        const int64_t rows = std::min(kQ8PanelRows, W.n_out - r0);
        const int64_t words = rows * nb * 8;
        if (W.type == GgmlType::Q8_0) {
            const auto* Q = reinterpret_cast<const uint32_t*>(W.data + r0 * W.n_in);
            const auto* S = reinterpret_cast<const unsigned short*>(W.data + W.n_out * W.n_in) + r0 * nb;
            detail::launch(op, q8_to_bf16_kernel, dim3(unsigned(std::min<int64_t>(ceil_div(words, 256), 8 * 1024))),
                           dim3(256), 0, st, Q, S, nb, rows, wb);
            ALLOY_CUDA_LAUNCHED(op);
        } else {
            detail::blocks_to_bf16(W, r0, rows, wb, st, op);
        }
        cublasHandle_t h = handle(op);
        ALLOY_CUBLAS_CHECK(op, cublasSetStream(h, st));
        const float one = 1.0f, zero = 0.0f;
        ALLOY_CUBLAS_CHECK(op, cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(T), int(W.n_in), &one, wb,
                                            CUDA_R_16BF, int(W.n_in), xb, CUDA_R_16BF, int(W.n_in), &zero, y + r0,
                                            CUDA_R_32F, int(W.n_out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

bool takes_bf16_input(GgmlType t) { return t == GgmlType::BF16 || split_blocks_supported(t); }

// x's bf16 copy for the prefill GEMMs: the producer's (xq->b) or one made now at ws.
const void* bf16_input(const float* x, int64_t T, int64_t n_in, uint8_t* ws, const MatmulInput* xq, cudaStream_t st,
                       const char* op) {
    if (xq && xq->b) return xq->b;
    to_bf16(x, ws, T * n_in, st, op);
    return ws;
}

}  // namespace

void matmul_multi(const WeightView* const* W, float* const* y, int n, const float* x, int64_t T, void* workspace,
                  void* stream, const MatmulInput* xq) {
    const char* op = "cuda::matmul_multi";
    for (int m = 0; m < n; ++m) check_weight(*W[m], T, op);
    if (T == 0 || n == 0) return;
    uint8_t* ws = static_cast<uint8_t*>(workspace);
    if (matmul_multi_workspace_bytes(W, n, T) && !ws) throw Error(std::string(op) + ": workspace is null");
    cudaStream_t st = as_stream(stream);
    if (gemv(W, y, n, x, T, ws, st, op, xq && xq->q ? xq : nullptr)) return;
    if (T <= kQ8GemvMaxT) {
        // Weights of several types (a Q4_K_M file's q/k/v with a Q6_K one): one GEMV launch per
        // run of consecutive weights of one type and n_in (grouped by the weights alone, so a
        // row's bits are the same at every T <= 16), a lone matmul where a group has no GEMV.
        // Never the bf16 panels at T <= 16: the workspace is sized for the GEMVs
        // (matmul_workspace_bytes), which a panel overran (2026-12-04: garbage decode tokens
        // of a Q4_K_M file under the engine).
        for (int m0 = 0; m0 < n;) {
            int m1 = m0 + 1;
            while (m1 < n && W[m1]->type == W[m0]->type && W[m1]->n_in == W[m0]->n_in) ++m1;
            if (!gemv(W + m0, y + m0, m1 - m0, x, T, ws, st, op, xq && xq->q ? xq : nullptr))
                for (int m = m0; m < m1; ++m) matmul(*W[m], x, y[m], T, workspace, stream, xq);
            m0 = m1;
        }
        return;
    }
    // BF16 / block-quantized weights sharing the input (q/k/v, gate and up): the input's bf16
    // copy is made once (or given by its producer).
    bool all_bf16_input = true;
    for (int m = 0; m < n; ++m) all_bf16_input = all_bf16_input && takes_bf16_input(W[m]->type);
    if (all_bf16_input) {
        const void* xb = bf16_input(x, T, W[0]->n_in, ws, xq, st, op);
        for (int m = 0; m < n; ++m) bf16_input_gemm(*W[m], xb, y[m], T, ws, st, op);
        return;
    }
    for (int m = 0; m < n; ++m) matmul(*W[m], x, y[m], T, workspace, stream, xq);
}

void matmul(const WeightView& W, const float* x, float* y, int64_t T, void* workspace, void* stream, const MatmulInput* xq) {
    const char* op = "cuda::matmul";
    check_weight(W, T, op);
    if (T == 0) return;
    cudaStream_t st = as_stream(stream);
    uint8_t* ws = static_cast<uint8_t*>(workspace);
    if (matmul_workspace_bytes(W, T) && !ws) throw Error(std::string(op) + ": workspace is null");
    const WeightView* w1 = &W;
    if (gemv(&w1, &y, 1, x, T, ws, st, op, xq && xq->q ? xq : nullptr)) return;
    if (W.type == GgmlType::F32) {
        // PEDANTIC: fp32 FMAs, never TF32 (even with NVIDIA_TF32_OVERRIDE): the oracle path.
        gemm(op, st, W.data, CUDA_R_32F, W.n_in, x, CUDA_R_32F, y, W.n_out, T, W.n_in, CUBLAS_COMPUTE_32F_PEDANTIC);
        return;
    }
    if (takes_bf16_input(W.type)) bf16_input_gemm(W, bf16_input(x, T, W.n_in, ws, xq, st, op), y, T, ws, st, op);
    // other types: check_weight threw
}

}  // namespace alloy::cuda
