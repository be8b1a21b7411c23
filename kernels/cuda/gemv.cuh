// The pieces the weight-streaming GEMVs share (matmul.cu's Q8_0, BF16 and F32 GEMVs and
// matmul_kquant.cu's K-quant one): the launch with programmatic serialization, the grid's
// split over the parts of a matmul_multi group, the fixed-order reduction of a row's partial
// sums (batch invariance), the streaming load and one instance per token count.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "format/ggml_types.h"
#include "kernels/cuda/common.cuh"

namespace alloy::cuda::detail {

constexpr int kGemvThreads = 256;  // 8 warps

// The GEMVs are launched with programmatic serialization (detail::launch): a GEMV issues its
// first weight loads (which depend on nothing) and then waits (pdl_wait) until the previous
// kernel's writes are visible.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), unsigned grid, unsigned block, size_t smem, cudaStream_t st,
                Args... args) {
    launch("cuda::matmul", kernel, dim3(grid), dim3(block), smem, st, args...);
}

// Batch invariance (T <= kGemvMaxT = 16): a row's arithmetic is fixed by (n_out, n_in) alone:
// which lane takes which weights (kWpr, from the shape only), the order of each lane's FMAs per
// token, the butterfly over the warp and the warps' sum in warp order. T only sets how many
// tokens ride along (each token its own accumulators, the same operations on it) and how many
// rows a warp takes (kR rows share each load of x, which changes nothing per row), so every
// row's bits are those of a T = 1 call, whatever T and the token's position (test
// GemvRowsDoNotDependOnTheBatch). One instance per T (no run-time token count in the loops,
// which kept the compiler from hoisting the x loads: 2-4x slower at T 8-16).

// The end of both GEMVs: each lane's partial sums of its kR rows reduced over the warp, then
// over the row's kWpr warps (through red in shared memory, in warp order, so the bits do not
// depend on timing); the row's first warp stores y[t * n_out + row].
// The same with wpr warps a row and the first n_tok of kT tokens stored, both known at run time
// only (the K-quant GEMV); every block thread calls it (a __syncthreads inside).
template <int kT, int kR> __device__ __forceinline__ void warp_sum_rows(float (&acc)[kR][kT]) {
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[r][t] = detail::warp_sum_all(acc[r][t]);
}

template <int kT, int kR>
__device__ __forceinline__ void store_row_sums_n(float (&acc)[kR][kT], float (*red)[kR][kT], int warp, int wir,
                                                 int wpr, int n_tok, int lane, int64_t row0, int64_t n_out, float* y) {
    warp_sum_rows<kT, kR>(acc);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < kR; ++r)
#pragma unroll
            for (int t = 0; t < kT; ++t) red[warp][r][t] = acc[r][t];
    __syncthreads();
    // Lane (r n_tok + t) of the row's first warp adds the wpr partials of (row r, token t) in
    // warp order.
    if (wir == 0) {
        for (int i = lane; i < kR * n_tok; i += 32) {
            const int r = i / n_tok, t = i % n_tok;
            if (row0 + r >= n_out) continue;
            float s = red[warp][r][t];
            for (int j = 1; j < wpr; ++j) s += red[warp + j][r][t];
            y[t * n_out + row0 + r] = s;
        }
    }
}

template <int kT, int kWpr, int kR>
__device__ __forceinline__ void store_row_sums(float (&acc)[kR][kT], float (*red)[kR][kT], int warp, int wir,
                                               int lane, int64_t row0, int64_t n_out, float* y) {
    if constexpr (kWpr == 1) {
        warp_sum_rows<kT, kR>(acc);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < kR; ++r)
#pragma unroll
                for (int t = 0; t < kT; ++t)
                    if (row0 + r < n_out) y[t * n_out + row0 + r] = acc[r][t];
    } else {
        store_row_sums_n<kT, kR>(acc, red, warp, wir, kWpr, kT, lane, row0, n_out, y);
    }
}

// The matrices of one GEMV launch (matmul_multi: up to kMaxParts weights on the same x, of one
// type and n_in): part m takes blocks [block_end[m - 1], block_end[m]) of the grid, rows of
// W[m] into y[m] [kT, n_out[m]]. One matmul is one part.
constexpr int kMaxParts = 4;
struct GemvParts {
    const void* W[kMaxParts];
    float* y[kMaxParts];
    int64_t n_out[kMaxParts];
    unsigned block_end[kMaxParts];
    int n = 0;
    int64_t total_rows() const {
        int64_t r = 0;
        for (int m = 0; m < n; ++m) r += n_out[m];
        return r;
    }
    // The grid's blocks for rows_per_block rows a block (fills block_end); the grid's size.
    unsigned layout(int64_t rows_per_block) {
        unsigned b = 0;
        for (int m = 0; m < n; ++m) block_end[m] = b += unsigned(ceil_div(n_out[m], rows_per_block));
        return b;
    }
};
// This block's part and its block index within the part.
struct GemvPart {
    const void* W;
    float* y;
    int64_t n_out;
    unsigned block;
};
// Constant indices only: a run-time index into the kernel's by-value parameter made the
// compiler copy the whole struct to a local-memory stack frame in every thread (120 bytes,
// ptxas -v), which nearly doubled the decode GEMVs' time (H200, 0.8B Q8_0 tg128: 1440 -> 805 us
// of GPU time a token once it was gone).
__device__ __forceinline__ GemvPart gemv_part(const GemvParts& p) {
    GemvPart r{p.W[0], p.y[0], p.n_out[0], blockIdx.x};
#pragma unroll
    for (int m = 1; m < kMaxParts; ++m)
        if (m < p.n && blockIdx.x >= p.block_end[m - 1]) r = {p.W[m], p.y[m], p.n_out[m], blockIdx.x - p.block_end[m - 1]};
    return r;
}

// griddepcontrol.wait once `v` is known (both arms wait: the predicate only adds the data
// dependency, so the loads that produced v are issued before the wait).
__device__ __forceinline__ void pdl_wait_after(uint32_t v) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %0, 0x9e3779b9;\n\t@p griddepcontrol.wait;\n\t@!p griddepcontrol.wait;\n\t}" ::"r"(v)
        : "memory");
}

// 16 bytes through the read-only path, not kept in L1 (each weight is read once; L1 keeps x).
__device__ __forceinline__ int4 ld_stream16(const void* p) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Calls f(std::integral_constant<int, T>) for T in 1..16: one kernel instance per token count.
template <class F> void with_tokens(int64_t T, F&& f) {
    switch (T) {
#define ALLOY_T(n) case n: f(std::integral_constant<int, n>{}); break;
        ALLOY_T(1) ALLOY_T(2) ALLOY_T(3) ALLOY_T(4) ALLOY_T(5) ALLOY_T(6) ALLOY_T(7) ALLOY_T(8)
        ALLOY_T(9) ALLOY_T(10) ALLOY_T(11) ALLOY_T(12) ALLOY_T(13) ALLOY_T(14) ALLOY_T(15) ALLOY_T(16)
#undef ALLOY_T
        default: break;
    }
}


// Warps per row of a GEMV launch: doubled (up to 8) while the launch has fewer than
// warps_per_sm row-warps an SM (the bytes in flight HBM needs) and the row has at least two
// steps (a lane's share of one pass) a warp. From the shape alone: it sets each row's order of
// summation (batch invariance).
inline int warps_per_row(int64_t rows, int64_t steps_per_row, int warps_per_sm) {
    const int64_t want = int64_t(sm_count()) * warps_per_sm;
    int wpr = 1;
    while (wpr < 8 && rows * wpr < want && int64_t(wpr) * 2 <= steps_per_row) wpr *= 2;
    return wpr;
}

// The K-quant GEMV (kernels/cuda/matmul_kquant.cu): y[m] [T, n_out[m]] = W[m] x for the parts
// of p, split weights of one block type other than Q8_0 (Q4_0, Q5_0, Q5_1, IQ4_NL, Q4_K,
// Q5_K, Q6_K, IQ4_XS) and n_in values a row, x given quantized as the Q8_0 GEMV takes it (xq [T, n_in]
// int8, xd [T, n_in / 32] fp32); T <= kQ8GemvMaxT. Each row's bits depend on the group's shape
// only (batch invariance, as the Q8_0 GEMV).
void kquant_gemv(GgmlType type, GemvParts p, int64_t n_in, int64_t T, const int8_t* xq, const float* xd,
                 cudaStream_t st);

}  // namespace alloy::cuda::detail
