// BF16 decode GEMV on AVX512-BF16: the streaming kernel for T <= 4 tokens.
//
// Per (row, token) the arithmetic is fixed: vdpbf16ps over 32 elements at a time into 16 fp32
// lanes, in order, a masked step for a tail, then one fixed 16-lane reduction. So every T in
// 1..4 gives the same bits per output (verification reproduces decode exactly); the T > 4
// GEMM sums in another order. Two rows stream at once from distant parts of the range, with
// no software prefetch. The host has a slow memory phase (probe ~34 GB/s) and a fast one
// (~53 GB/s); 12 alternated pairs of tg48 on the 0.8B BF16 model (fourth session,
// 2026-11-30): 2 streams vs 4 gave +0.2 to +6% in the slow phase (94-98% of the probed floor)
// and +4 to +13% in the fast one (85-91%). In the fast phase 3 and 1 streams also beat 4
// (30.5-31.1 and 29.9-30.2 vs 27.6-28.3 t/s), 8 streams lost (25.4-25.8), and a software
// prefetch 512 B-2 KiB ahead in every stream lost 8-15%. (The third session, in a slow phase
// only, had 4 streams ahead of 2 within overlapping ranges.)
#include <immintrin.h>

#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_kernels.h"

namespace alloy::cpu::mm {
namespace {

constexpr int kStreams = 2;  // rows streamed side by side per thread (see above)

#define ALLOY_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

template <int NS, int NT>
ALLOY_BF16_TARGET void rows_bf16(const WeightView& W, const int64_t* rows, const ActRows& a, int64_t t0, float* y,
                                 int64_t ldy) {
    const int64_t K = W.n_in;
    const uint16_t* wr[NS];
    for (int s = 0; s < NS; ++s) wr[s] = reinterpret_cast<const uint16_t*>(W.row(rows[s]));
    __m512 acc[NS][NT];
#pragma GCC unroll 16
    for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[s][t] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512i x[NT];
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) x[t] = _mm512_loadu_si512(a.bf + (t0 + t) * K + k);
#pragma GCC unroll 8
        for (int s = 0; s < NS; ++s) {
            const __m512i w = _mm512_loadu_si512(wr[s] + k);
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t)
                acc[s][t] = _mm512_dpbf16_ps(acc[s][t], (__m512bh)x[t], (__m512bh)w);
        }
    }
    if (k < K) {  // tail: zero-masked, so the missing pairs add exact zeros
        const __mmask32 m = __mmask32((1ull << (K - k)) - 1);
        for (int s = 0; s < NS; ++s) {
            const __m512i w = _mm512_maskz_loadu_epi16(m, wr[s] + k);
            for (int t = 0; t < NT; ++t) {
                const __m512i x = _mm512_maskz_loadu_epi16(m, a.bf + (t0 + t) * K + k);
                acc[s][t] = _mm512_dpbf16_ps(acc[s][t], (__m512bh)x, (__m512bh)w);
            }
        }
    }
#pragma GCC unroll 16
    for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy + rows[s]] = _mm512_reduce_add_ps(acc[s][t]);
}

template <int NS, int NT>
void range_bf16(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, float* y, int64_t ldy) {
    stream_rows<NS>(
        r0, nr, [&](const int64_t* rows) { rows_bf16<NS, NT>(W, rows, a, t0, y, ldy); },
        [&](const int64_t* row) { rows_bf16<1, NT>(W, row, a, t0, y, ldy); });
}

}  // namespace

void bf16_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                      int64_t ldy) {
    switch (nt) {
        case 1: range_bf16<kStreams, 1>(W, r0, nr, a, t0, y, ldy); break;
        case 2: range_bf16<kStreams, 2>(W, r0, nr, a, t0, y, ldy); break;
        case 3: range_bf16<kStreams, 3>(W, r0, nr, a, t0, y, ldy); break;
        default: range_bf16<kStreams, 4>(W, r0, nr, a, t0, y, ldy); break;
    }
}

}  // namespace alloy::cpu::mm
