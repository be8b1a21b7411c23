// Q8_0 (and Q4_0, IQ4_NL) decode GEMV on AVX512-VNNI (VL, 256-bit): the streaming kernel for T <= 4 tokens.
//
// Per (row, token) the arithmetic is fixed: for each 32-element block in order, the exact
// integer dot |x| . sign(w, x) by vpdpbusd, converted to fp32 and accumulated into 8 lanes
// with an FMA by d_w * d_x; at the end the 8 lanes are summed by one fixed tree. So every
// T in 1..4 gives the same bits per output (speculative verification of up to 4 tokens
// reproduces decode exactly); the T > 4 GEMM sums in another order.
//
// Bandwidth: one thread streams 4 rows from 4 distant parts of its range at once, with a
// software prefetch 16 blocks ahead. On this host (2026-11-30, tg16 of the 0.8B Q8_0 model,
// three alternating rounds) 4 streams with prefetch gave 34.2-35.8 t/s, 8 with prefetch
// 29.7-34.8, 1 or 2 without 31.7-35.0: the spread is the host's, 4 was never worse.
#include <immintrin.h>

#include <algorithm>

#include "format/quant.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_int8_blocks.h"
#include "kernels/cpu/matmul_kernels.h"

namespace alloy::cpu::mm {
namespace {

constexpr int kStreams = 4;

#define ALLOY_Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

ALLOY_Q8_TARGET inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Rows rows[0..NS) (NS <= kStreams), NT tokens.
template <Blocks kB, int NS, int NT>
ALLOY_Q8_TARGET void rows_q8(const WeightView& W, const int64_t* rows, const ActRows& a, int64_t t0, float* y,
                             int64_t ldy) {
    constexpr size_t kBytes = size_t(block_bytes<kB>());
    const int64_t K = W.n_in, nb = K / 32;
    const uint8_t* wr[NS];
    for (int s = 0; s < NS; ++s) wr[s] = W.row(rows[s]);
    __m256 acc[NS][NT];
#pragma GCC unroll 16
    for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[s][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m256i xq[NT];
        float dx[NT];
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            xq[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * K + b * 32));
            dx[t] = a.d[(t0 + t) * nb + b];
        }
#pragma GCC unroll 4
        for (int s = 0; s < NS; ++s) {
            const uint8_t* blk = wr[s] + size_t(b) * kBytes;
            _mm_prefetch(reinterpret_cast<const char*>(blk) + 16 * kBytes, _MM_HINT_T0);
            const float dw = block_scale<kB>(blk);
            const __m256i w = block_int8<kB>(blk);
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                const __m256i dp = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(xq[t]),
                                                       _mm256_sign_epi8(w, xq[t]));
                acc[s][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_set1_ps(dw * dx[t]), acc[s][t]);
            }
        }
    }
#pragma GCC unroll 16
    for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy + rows[s]] = hsum8(acc[s][t]);
}

template <Blocks kB, int NT>
void range_q8(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, float* y, int64_t ldy) {
    stream_rows<kStreams>(
        r0, nr, [&](const int64_t* rows) { rows_q8<kB, kStreams, NT>(W, rows, a, t0, y, ldy); },
        [&](const int64_t* row) { rows_q8<kB, 1, NT>(W, row, a, t0, y, ldy); });
}

template <Blocks kB>
void gemv(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y, int64_t ldy) {
    switch (nt) {
        case 1: range_q8<kB, 1>(W, r0, nr, a, t0, y, ldy); break;
        case 2: range_q8<kB, 2>(W, r0, nr, a, t0, y, ldy); break;
        case 3: range_q8<kB, 3>(W, r0, nr, a, t0, y, ldy); break;
        default: range_q8<kB, 4>(W, r0, nr, a, t0, y, ldy); break;
    }
}

}  // namespace

void q8_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                    int64_t ldy) {
    gemv<Blocks::Q8_0>(W, r0, nr, a, t0, nt, y, ldy);
}

void q4_0_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                      int64_t ldy) {
    gemv<Blocks::Q4_0>(W, r0, nr, a, t0, nt, y, ldy);
}

void iq4_nl_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                        int64_t ldy) {
    gemv<Blocks::IQ4_NL>(W, r0, nr, a, t0, nt, y, ldy);
}

void mxfp4_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                       int64_t ldy) {
    gemv<Blocks::MXFP4>(W, r0, nr, a, t0, nt, y, ldy);
}

}  // namespace alloy::cpu::mm
