// AVX2 K-quant decode GEMVs (Q4_K, Q6_K x Q8_K; math in matmul_kquant.cpp). Run on AVX-512
// CPUs too: at decode the packed weights are memory-bound, and these reach the bandwidth
// floor with 256-bit integer dots (vpmaddubsw: unsigned 4/6-bit weights x signed int8
// activations, pairs summed in int16 without saturation: 2 * 63 * 127 < 32767; then vpmaddwd
// with the sub-block scales into int32). Per output: 8 fp32 lanes of (d_x d) * int32 sums over
// the super-blocks, (for Q4_K) 4 lanes of the min terms, one horizontal sum at the end; the
// same operations whatever NS and NT, so every grouping gives the same bits.
#include <immintrin.h>

#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_kquant.h"
#include "kernels/cpu/vec_math_avx2.h"

namespace alloy::cpu::mm {
namespace {

using avx2::hsum;

ALLOY_TARGET_AVX2 inline float hsum4(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

// Q4_K's 12 scale bytes -> 8 scales then 8 mins as 16 uint8 (ggml's kmask shuffle of the
// 6-bit fields; q4k_unpack_scales is the plain version).
inline __m128i q4k_scales_mins(const uint8_t* s12) {
    constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t u[4];
    std::memcpy(u, s12, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t m_lo = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = m_lo;
    u[0] &= kmask1;
    return _mm_set_epi32(int(u[3]), int(u[2]), int(u[1]), int(u[0]));
}

// _mm256_shuffle_epi8 control that broadcasts the int16 element `lo` of each 128-bit lane to
// the low lane and element `hi` to the high lane.
ALLOY_TARGET_AVX2 inline __m256i bcast16_mask(int lo, int hi) {
    const char a = char(2 * lo), b = char(2 * lo + 1), c = char(2 * hi), d = char(2 * hi + 1);
    return _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, c, d, c, d, c, d, c, d, c, d, c, d, c,
                            d, c, d);
}

// Rows w[0..NS) x NT tokens of Q4_K into out[s * NT + t].
template <int NS, int NT>
ALLOY_TARGET_AVX2 void q4k_rows(const uint8_t* const* w, const ActRows& a, int64_t t0, float* out) {
    const int64_t K = a.K, nb = K / kQK;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[NS * NT];
    __m128 accm[NS * NT];
#pragma GCC unroll 8
    for (int i = 0; i < NS * NT; ++i) acc[i] = _mm256_setzero_ps(), accm[i] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
#pragma GCC unroll 2
        for (int s = 0; s < NS; ++s) {
            const uint8_t* blk = w[s] + b * kQ4KBytes;
            const float d = _cvtsh_ss(load_u16(blk)), dmin = _cvtsh_ss(load_u16(blk + 2));
            const __m128i scm = q4k_scales_mins(blk + 4);
            const __m128i mins = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(scm, scm));
            const __m256i sc2 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));  // 8 scales as int16, twice
            __m256i scl[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) scl[j] = _mm256_shuffle_epi8(sc2, bcast16_mask(j, j));
            __m256i lo[4], hi[4];
#pragma GCC unroll 4
            for (int g = 0; g < 4; ++g) {
                const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * g));
                lo[g] = _mm256_and_si256(q4, m4);
                hi[g] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            }
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                const int64_t tt = t0 + t;
                const int8_t* q8 = a.q + tt * K + b * kQK;
                const int16_t* bs = a.bsums + tt * (K / 16) + b * 16;
                const float dx = a.d[tt * nb + b];
                const __m128i pair = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bs)),
                                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(bs + 8)));
                accm[s * NT + t] = _mm_fmadd_ps(_mm_set1_ps(-dx * dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins, pair)),
                                                accm[s * NT + t]);
                __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int g = 0; g < 4; ++g) {
                    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 64 * g));
                    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 64 * g + 32));
                    const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[g], x0), scl[2 * g]);
                    const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[g], x1), scl[2 * g + 1]);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
                }
                acc[s * NT + t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * d), _mm256_cvtepi32_ps(sumi), acc[s * NT + t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NS * NT; ++i) out[i] = hsum(acc[i]) + hsum4(accm[i]);
}

// Rows w[0..NS) x NT tokens of Q6_K into out[s * NT + t]. The weights are widened to their
// unsigned 6-bit codes (0..63); the -32 offset comes back through the block sums:
// sum sc (q - 32) x = sum sc q x - 32 sum_s sc_s bsums_s.
template <int NS, int NT>
ALLOY_TARGET_AVX2 void q6k_rows(const uint8_t* const* w, const ActRows& a, int64_t t0, float* out) {
    const int64_t K = a.K, nb = K / kQK;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[NS * NT];
#pragma GCC unroll 8
    for (int i = 0; i < NS * NT; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
#pragma GCC unroll 2
        for (int s = 0; s < NS; ++s) {
            const uint8_t* blk = w[s] + b * kQ6KBytes;
            const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
            const float d = _cvtsh_ss(load_u16(blk + 208));
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
            __m256i q6[8], scv[8];  // group h * 4 + k: values h * 128 + 32 k + [0, 32)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
                const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
                q6[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                q6[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                q6[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
                q6[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            }
            // Group g's scales: lanes 0-7 scale 2g (its first 16 values), lanes 8-15 scale 2g + 1.
            const __m256i sc_a = _mm256_permute2x128_si256(sc16, sc16, 0x00);  // scales 0-7, twice
            const __m256i sc_b = _mm256_permute2x128_si256(sc16, sc16, 0x11);  // scales 8-15, twice
#pragma GCC unroll 4
            for (int g = 0; g < 4; ++g) {
                scv[g] = _mm256_shuffle_epi8(sc_a, bcast16_mask(2 * g, 2 * g + 1));
                scv[g + 4] = _mm256_shuffle_epi8(sc_b, bcast16_mask(2 * g, 2 * g + 1));
            }
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                const int64_t tt = t0 + t;
                const int8_t* q8 = a.q + tt * K + b * kQK;
                const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums + tt * (K / 16) + b * 16));
                __m256i sumi = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);  // 32 sum sc_s bsums_s, lanes
                sumi = _mm256_sub_epi32(_mm256_setzero_si256(), sumi);
#pragma GCC unroll 8
                for (int g = 0; g < 8; ++g) {
                    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * g));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q6[g], x), scv[g]));
                }
                acc[s * NT + t] =
                    _mm256_fmadd_ps(_mm256_set1_ps(a.d[tt * nb + b] * d), _mm256_cvtepi32_ps(sumi), acc[s * NT + t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NS * NT; ++i) out[i] = hsum(acc[i]);
}

template <bool kQ6, int NS, int NT>
void rows_to_y(const WeightView& W, const int64_t* rows, const ActRows& a, int64_t t0, float* y, int64_t ldy) {
    const uint8_t* w[NS];
    float out[NS * NT];
    for (int s = 0; s < NS; ++s) w[s] = W.row(rows[s]);
    if constexpr (kQ6) q6k_rows<NS, NT>(w, a, t0, out);
    else q4k_rows<NS, NT>(w, a, t0, out);
    for (int s = 0; s < NS; ++s)
        for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy + rows[s]] = out[s * NT + t];
}

// Two rows streamed side by side for 1-2 tokens (two memory streams per thread, as the Q8_0
// and BF16 GEMVs), one row at a time for 3-4.
template <bool kQ6>
void gemv(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y, int64_t ldy) {
    auto run = [&]<int NT>() {
        constexpr int NS = NT <= 2 ? 2 : 1;
        stream_rows<NS>(
            r0, nr, [&](const int64_t* rows) { rows_to_y<kQ6, NS, NT>(W, rows, a, t0, y, ldy); },
            [&](const int64_t* row) { rows_to_y<kQ6, 1, NT>(W, row, a, t0, y, ldy); });
    };
    switch (nt) {
        case 1: return run.template operator()<1>();
        case 2: return run.template operator()<2>();
        case 3: return run.template operator()<3>();
        default: return run.template operator()<4>();
    }
}

}  // namespace

GemvFn kquant_gemv_avx2(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_K: return gemv<false>;
        case GgmlType::Q6_K: return gemv<true>;
        default: return nullptr;
    }
}

}  // namespace alloy::cpu::mm
