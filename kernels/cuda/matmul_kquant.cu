// The decode GEMV for Q4_0, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS and MXFP4 weights (kernels/cuda/gemv.cuh,
// ops.h matmul): the format most published GGUF files use (Q4_K_M: Q4_K with Q6_K for the LM
// head and some down/value projections) streamed at its own 4.5-6.6 bits a weight.
//
// Lane l of a row's warp takes unit (32 step + l) of the row (quant_blocks.cuh: 16 code bytes,
// 32 values in two segments of 16): one 16-byte streaming load of codes (Q5_K / Q6_K: another
// of high bits, shared by the lanes of a block through L1) and the block's head (scales), all
// issued a unit ahead; the codes widened to bytes in registers; then per token and segment one
// 16-byte load of x (quantized per 32, as for Q8_0), four dp4a and a scaled FMA (Q4_K, Q5_K,
// and the offset codes of Q4_0 and Q6_K: four dp4a more for the segment's sum of x). Warps per row and the order of every sum follow the
// shape only, so each row has the bits of a one-token call whatever T (batch invariance); T
// rides in instances of 1, 2, 4, 8 and 16 tokens with the rest masked (one per count, as the
// Q8_0 GEMV has, would be ~200 instances more to compile); a warp may take two rows (kR).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>

#include "alloy/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"

namespace alloy::cuda::detail {

namespace {

template <GgmlType kType, int kT, int kR>
__global__ void __launch_bounds__(kGemvThreads) kquant_gemv_kernel(const GemvParts parts, int64_t n_in, int wpr, int T,
                                                                    const int8_t* __restrict__ xq,
                                                                    const float* __restrict__ xd) {
    using F = BlockFormat<kType>;
    constexpr int kUnits = F::kValues / 32;
    const GemvPart part = gemv_part(parts);
    const int64_t n_out = part.n_out;
    const int64_t bpr = n_in / F::kValues, upr = n_in / 32;
    __shared__ float red[kGemvThreads / 32][kR][kT];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // kR rows a warp (each row's arithmetic the same for any kR: a choice of speed only)
    const int64_t row0 = part.block * int64_t((kGemvThreads / 32) / wpr * kR) + (warp / wpr) * kR;
    const int wir = warp % wpr;
    const SplitMatrix<kType> m(part.W, n_out * bpr);
    float acc[kR][kT];
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int t = 0; t < kT; ++t) acc[r][t] = 0.0f;
    const int64_t step = int64_t(wpr) * 32;
    int64_t u = int64_t(wir) * 32 + lane;
    // Every load of a unit is issued one unit ahead of its use (the codes streamed past L1; the
    // heads and high bits, shared by a block's lanes, through it). A row past the matrix loads
    // row 0's bytes and drops its sums.
    auto load = [&](int r, int64_t v) {
        const int64_t row = row0 + r < n_out ? row0 + r : 0;
        const int64_t b = row * bpr + v / kUnits;
        const int j = int(v % kUnits);
        const uint8_t* code = m.code(b);
        return load_unit_rest<kType>(ld_stream16(code + unit_code_offset<kType>(j)), code, m.head(b), j);
    };
    UnitRaw raw[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) raw[r] = u < upr ? load(r, u) : UnitRaw{};
    // The first loads depend on nothing: in flight before the wait (as the Q8_0 GEMV's).
    pdl_wait_after(uint32_t(raw[0].c.x) ^ uint32_t(raw[kR - 1].c.w) ^ raw[0].h[0]);
    while (u < upr) {
        const int64_t next = u + step;
        UnitRaw raw_next[kR];
#pragma unroll
        for (int r = 0; r < kR; ++r) raw_next[r] = next < upr ? load(r, next) : UnitRaw{};
        const int64_t blk = u / kUnits;
#pragma unroll
        for (int r = 0; r < kR; ++r) {
            const Unit w = decode_unit<kType>(raw[r], int(u % kUnits));
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                if (t >= T) break;
#pragma unroll
                for (int s = 0; s < 2; ++s) {
                    const int64_t o = t * n_in + blk * F::kValues + w.off[s];
                    const int4 xv = __ldg(reinterpret_cast<const int4*>(xq + o));
                    acc[r][t] = fmaf(__ldg(xd + o / 32), segment_dot<kType>(w, s, xv), acc[r][t]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < kR; ++r) raw[r] = raw_next[r];
        u = next;
    }
    // Over the warp (butterfly), then the row's warps in warp order through shared memory.
    store_row_sums_n<kT, kR>(acc, red, warp, wir, wpr, T, lane, row0, n_out, part.y);
}

// Rows a warp: 2 (two rows' loads in flight a lane) for matrices of >= 64k row-warps (the LM
// head) at T <= 2, else 1. ALLOY_CUDA_KQ_ROWS=1 / 2 forces it (A/B; read once).
int rows_per_warp(int64_t row_warps, int64_t T) {
    static const int forced = [] {
        const char* e = std::getenv("ALLOY_CUDA_KQ_ROWS");
        return e ? std::atoi(e) : 0;
    }();
    if (forced == 1 || forced == 2) return forced;
    return row_warps >= 65536 && T <= 2 ? 2 : 1;
}

template <GgmlType kType, int kR>
void launch_rows(GemvParts p, int wpr, int64_t n_in, int64_t T, const int8_t* xq, const float* xd, cudaStream_t st) {
    const unsigned grid = p.layout((kGemvThreads / 32) / wpr * kR);
    const int t = int(T);
    if (T <= 1) launch_pdl(kquant_gemv_kernel<kType, 1, kR>, grid, kGemvThreads, 0, st, p, n_in, wpr, t, xq, xd);
    else if (T <= 2) launch_pdl(kquant_gemv_kernel<kType, 2, kR>, grid, kGemvThreads, 0, st, p, n_in, wpr, t, xq, xd);
    else if (T <= 4) launch_pdl(kquant_gemv_kernel<kType, 4, kR>, grid, kGemvThreads, 0, st, p, n_in, wpr, t, xq, xd);
    else if (T <= 8) launch_pdl(kquant_gemv_kernel<kType, 8, kR>, grid, kGemvThreads, 0, st, p, n_in, wpr, t, xq, xd);
    else launch_pdl(kquant_gemv_kernel<kType, 16, kR>, grid, kGemvThreads, 0, st, p, n_in, wpr, t, xq, xd);
}

template <GgmlType kType>
void launch_typed(GemvParts p, int64_t n_in, int64_t T, const int8_t* xq, const float* xd, cudaStream_t st) {
    const int wpr = warps_per_row(p.total_rows(), n_in / 32 / 32, 24);  // steps of 32 units, as Q8_0's 24 an SM
    if (rows_per_warp(p.total_rows() * wpr, T) == 2) launch_rows<kType, 2>(p, wpr, n_in, T, xq, xd, st);
    else launch_rows<kType, 1>(p, wpr, n_in, T, xq, xd, st);
}

}  // namespace

void kquant_gemv(GgmlType type, GemvParts p, int64_t n_in, int64_t T, const int8_t* xq, const float* xd,
                 cudaStream_t st) {
    if (T < 1 || T > kQ8GemvMaxT) throw Error("cuda::matmul: the K-quant GEMV takes 1 to 16 tokens");
    switch (type) {
        case GgmlType::Q4_0: launch_typed<GgmlType::Q4_0>(p, n_in, T, xq, xd, st); break;
        case GgmlType::Q5_0: launch_typed<GgmlType::Q5_0>(p, n_in, T, xq, xd, st); break;
        case GgmlType::Q5_1: launch_typed<GgmlType::Q5_1>(p, n_in, T, xq, xd, st); break;
        case GgmlType::IQ4_NL: launch_typed<GgmlType::IQ4_NL>(p, n_in, T, xq, xd, st); break;
        case GgmlType::Q4_K: launch_typed<GgmlType::Q4_K>(p, n_in, T, xq, xd, st); break;
        case GgmlType::Q5_K: launch_typed<GgmlType::Q5_K>(p, n_in, T, xq, xd, st); break;
        case GgmlType::Q6_K: launch_typed<GgmlType::Q6_K>(p, n_in, T, xq, xd, st); break;
        case GgmlType::IQ4_XS: launch_typed<GgmlType::IQ4_XS>(p, n_in, T, xq, xd, st); break;
        case GgmlType::MXFP4: launch_typed<GgmlType::MXFP4>(p, n_in, T, xq, xd, st); break;
        default: throw Error(std::string("cuda::matmul: no K-quant GEMV for ") + type_traits(type).name);
    }
    ALLOY_CUDA_LAUNCHED("cuda::matmul");
}

}  // namespace alloy::cuda::detail
