// Q8_0 (and Q4_0, IQ4_NL) decode GEMV on AVX512-VNNI (VL, 256-bit): the streaming kernel for T <= 4 tokens.
//
// Per (row, token) the arithmetic is the GEMM tile's (matmul_q8_avx512.cpp): for each 32-element
// block in order, the exact integer dot (vpdpbusd on 8 lanes, summed across them), converted
// to fp32 and accumulated with one FMA by d_w * d_x, from 0. So every token count gives the
// same bits per output, whichever kernel runs it: decode, speculative verification, a batch of
// sequences, a prompt. Rows sit in the lanes of an xmm (row_sums): one FMA per 4 rows a block.
//
// Bandwidth: one thread streams 4 rows from 4 distant parts of its range at once, with a
// software prefetch 16 blocks ahead. On this host (2026-11-30, tg16 of the 0.8B Q8_0 model,
// three alternating rounds) 4 streams with prefetch gave 34.2-35.8 t/s, 8 with prefetch
// 29.7-34.8, 1 or 2 without 31.7-35.0: the spread is the host's, 4 was never worse.
// GCC 12's AVX-512 intrinsic headers use _mm512_undefined_* internally and trip these warnings.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>

#include "format/quant.h"
#include "kernels/cpu/gemv_prefetch.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_int8_blocks.h"
#include "kernels/cpu/matmul_kernels.h"

namespace alloy::cpu::mm {
namespace {

constexpr int kStreams = 4;

#define ALLOY_Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// Rows rows[0..NS) (NS = 1 or kStreams), NT tokens. Weights are flipped to u8 (w + 128) for
// vpdpbusd and the excess removed with the activation's corr = -128 * sum(x), as the GEMM
// tile: exact for every int8 weight, -128 included.
template <Blocks kB, int NS, int NT>
ALLOY_Q8_TARGET void rows_q8(const WeightView& W, const int64_t* rows, const ActRows& a, int64_t t0, float* y,
                             int64_t ldy) {
    constexpr size_t kBytes = size_t(block_bytes<kB>());
    const int64_t K = W.n_in, nb = K / 32;
    const uint8_t* wr[NS];
    for (int s = 0; s < NS; ++s) wr[s] = W.row(rows[s]);
    const __m256i flip = _mm256_set1_epi8(char(0x80));
    __m128 acc[NT];  // lane s: row s
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) acc[t] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m256i wu[NS];
        float dw[NS];
#pragma GCC unroll 4
        for (int s = 0; s < NS; ++s) {
            const uint8_t* blk = wr[s] + size_t(b) * kBytes;
            _mm_prefetch(reinterpret_cast<const char*>(blk) + 16 * kBytes, _MM_HINT_T0);
            dw[s] = block_scale<kB>(blk);
            wu[s] = _mm256_xor_si256(block_int8<kB>(blk), flip);
        }
        const __m128 dw4 = row_lanes<NS>(dw);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * K + b * 32));
            __m256i dp[NS];
#pragma GCC unroll 4
            for (int s = 0; s < NS; ++s) dp[s] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wu[s], xq);
            const __m128i isum = _mm_add_epi32(row_sums<NS>(dp), _mm_set1_epi32(a.corr[(t0 + t) * nb + b]));
            acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw4, _mm_set1_ps(a.d[(t0 + t) * nb + b])), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
        float lanes[4];
        _mm_storeu_ps(lanes, acc[t]);
        for (int s = 0; s < NS; ++s) y[(t0 + t) * ldy + rows[s]] = lanes[s];
    }
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

// ---------------------------------------------------------------------------------------
// Q8Rows16 (matmul_kernels.h): the 16 rows of a group in the 16 lanes of a zmm. Per block, the
// 8 k-quads of the 16 rows are 8 loads (codes already u8 = w + 128), the 16 scales one
// vcvtph2ps; per token the int32 accumulator starts at corr (-128 * sum(x), as the GGUF
// kernels), takes 8 vpdpbusd with the token's 4 codes of each quad broadcast, and is then the
// exact block sum of every row; y = fma(float(isum), d_w * d_x, y) per block in order from 0:
// the GGUF kernels' chain per (row, token), so their bits. NT <= 8 tokens a pass (8 fp32 and 8
// weight registers); a group's second pass over tokens 8..15 reads it again from L1/L2.
#define ALLOY_Q8_R16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

template <int NT>
ALLOY_Q8_R16_TARGET void r16_group(const uint8_t* grp, const ActRows& a, int64_t t0, float* out, int64_t ldo) {
    const int64_t K = a.K, nb = K / 32;
    const int pf = gemv_prefetch_q8_bytes();
    __m512 f[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) f[t] = _mm512_setzero_ps();
    const int8_t* xq = a.q + t0 * K;
    const int32_t* xc = a.corr + t0 * nb;
    const float* xd = a.d + t0 * nb;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = grp + b * kQ8R16Block;
        gemv_prefetch(blk, kQ8R16Block, pf);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
        __m512i w[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(blk + 32 + 64 * j);
        // P partial int32 sums a token (quads j = p mod P), the tokens' chains interleaved: the
        // vpdpbusd latency is hidden at small NT too. Their sum is the same exact integer.
        constexpr int P = NT == 1 ? 4 : NT <= 3 ? 2 : 1;
        __m512i acc[NT][P];
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
            acc[t][0] = _mm512_set1_epi32(xc[t * nb + b]);
#pragma GCC unroll 4
            for (int i = 1; i < P; ++i) acc[t][i] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j)
#pragma GCC unroll 8
            for (int t = 0; t < NT; ++t)
                acc[t][j % P] = _mm512_dpbusd_epi32(acc[t][j % P], w[j], _mm512_set1_epi32(load_i32(xq + t * K + b * 32 + 4 * j)));
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
            __m512i isum = acc[t][0];
            if constexpr (P == 4) isum = _mm512_add_epi32(_mm512_add_epi32(acc[t][0], acc[t][1]), _mm512_add_epi32(acc[t][2], acc[t][3]));
            else if constexpr (P == 2) isum = _mm512_add_epi32(acc[t][0], acc[t][1]);
            f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, _mm512_set1_ps(xd[t * nb + b])), f[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * ldo, f[t]);
}

// One token, two groups side by side (two memory streams a thread, as the GGUF GEMV's four
// rows): the same per-(row, token) arithmetic as r16_group<1>.
ALLOY_Q8_R16_TARGET void r16_group2_t1(const uint8_t* g0, const uint8_t* g1, const ActRows& a, int64_t t0, float* out0,
                                       float* out1) {
    const int64_t K = a.K, nb = K / 32;
    const int pf = gemv_prefetch_q8_bytes();
    __m512 f[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    const int8_t* xq = a.q + t0 * K;
    const int32_t* xc = a.corr + t0 * nb;
    const float* xd = a.d + t0 * nb;
    const uint8_t* grp[2] = {g0, g1};
    for (int64_t b = 0; b < nb; ++b) {
        const __m512 dx = _mm512_set1_ps(xd[b]);
        __m512i acc[2][4];
#pragma GCC unroll 2
        for (int g = 0; g < 2; ++g) {
            acc[g][0] = _mm512_set1_epi32(xc[b]);
            acc[g][1] = acc[g][2] = acc[g][3] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const __m512i x = _mm512_set1_epi32(load_i32(xq + b * 32 + 4 * j));
#pragma GCC unroll 2
            for (int g = 0; g < 2; ++g)
                acc[g][j % 4] = _mm512_dpbusd_epi32(acc[g][j % 4], _mm512_loadu_si512(grp[g] + b * kQ8R16Block + 32 + 64 * j), x);
        }
#pragma GCC unroll 2
        for (int g = 0; g < 2; ++g) {
            const uint8_t* blk = grp[g] + b * kQ8R16Block;
            gemv_prefetch(blk, kQ8R16Block, pf);
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
            const __m512i isum = _mm512_add_epi32(_mm512_add_epi32(acc[g][0], acc[g][1]), _mm512_add_epi32(acc[g][2], acc[g][3]));
            f[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, dx), f[g]);
        }
    }
    _mm512_storeu_ps(out0, f[0]);
    _mm512_storeu_ps(out1, f[1]);
}

void r16_group_any(const uint8_t* grp, const ActRows& a, int64_t t0, int nt, float* out, int64_t ldo) {
    switch (nt) {
        case 1: r16_group<1>(grp, a, t0, out, ldo); break;
        case 2: r16_group<2>(grp, a, t0, out, ldo); break;
        case 3: r16_group<3>(grp, a, t0, out, ldo); break;
        case 4: r16_group<4>(grp, a, t0, out, ldo); break;
        case 5: r16_group<5>(grp, a, t0, out, ldo); break;
        case 6: r16_group<6>(grp, a, t0, out, ldo); break;
        case 7: r16_group<7>(grp, a, t0, out, ldo); break;
        default: r16_group<8>(grp, a, t0, out, ldo); break;
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

namespace alloy::cpu::mm {

void q8_r16_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                        int64_t ldy) {
    constexpr int kPass = 8;
    const int64_t full = q8_r16_rows(W), r1 = r0 + nr;
    const size_t group_bytes = size_t(kQ8R16Rows) * W.row_bytes;
    int64_t first = (r0 + kQ8R16Rows - 1) / kQ8R16Rows * kQ8R16Rows;  // whole groups [first, last)
    const int64_t last = std::min(r1, full) / kQ8R16Rows * kQ8R16Rows;
    static const bool two = [] { const char* e = std::getenv("ALLOY_Q8_R16_STREAMS"); return e && std::atoi(e) == 2; }();
    // ALLOY_Q8_R16_STREAMS=2: one token in two streams (groups i and i + half); lost to one
    // stream in the model (0.8B tg, Zen 4, session 28), so off by default.
    if (nt == 1 && two && last > first) {
        const int64_t n = (last - first) / kQ8R16Rows, half = n / 2;
        for (int64_t i = 0; i < half; ++i) {
            const int64_t ga = first + i * kQ8R16Rows, gb = first + (i + half) * kQ8R16Rows;
            r16_group2_t1(W.data + size_t(ga / kQ8R16Rows) * group_bytes, W.data + size_t(gb / kQ8R16Rows) * group_bytes, a,
                          t0, y + t0 * ldy + ga, y + t0 * ldy + gb);
        }
        if (n % 2) {
            const int64_t g = first + (2 * half) * kQ8R16Rows;
            r16_group_any(W.data + size_t(g / kQ8R16Rows) * group_bytes, a, t0, 1, y + t0 * ldy + g, ldy);
        }
    } else {
        first = last;  // (every group below)
    }
    for (int64_t g0 = r0 / kQ8R16Rows * kQ8R16Rows; g0 < std::min(r1, full); g0 += kQ8R16Rows) {
        if (g0 >= first && g0 < last && nt == 1 && two) continue;  // (done above)
        const uint8_t* grp = W.data + size_t(g0 / kQ8R16Rows) * group_bytes;
        const bool whole = g0 >= r0 && g0 + kQ8R16Rows <= r1;
        for (int t = 0; t < nt; t += kPass) {
            const int n = std::min(kPass, nt - t);
            if (whole) {
                r16_group_any(grp, a, t0 + t, n, y + (t0 + t) * ldy + g0, ldy);
            } else {  // a group the range cuts: computed whole, its rows in the range stored
                alignas(64) float tmp[kPass * kQ8R16Rows];
                r16_group_any(grp, a, t0 + t, n, tmp, kQ8R16Rows);
                for (int i = 0; i < n; ++i)
                    for (int64_t r = std::max(r0, g0); r < std::min(r1, g0 + kQ8R16Rows); ++r)
                        y[(t0 + t + i) * ldy + r] = tmp[i * kQ8R16Rows + (r - g0)];
            }
        }
    }
    const int64_t tail0 = std::max(r0, full);  // the GGUF rows
    if (tail0 < r1)
        for (int t = 0; t < nt; t += kRowDotTokens)
            q8_gemv_avx512(W, tail0, r1 - tail0, a, t0 + t, std::min(kRowDotTokens, nt - t), y, ldy);
}

}  // namespace alloy::cpu::mm
