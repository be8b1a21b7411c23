// AVX2 K-quant decode GEMVs: matmul_kquant_rows.inc with vpmaddwd + vpaddd. Also the path of
// AVX-512 CPUs without VNNI; at decode the packed weights are memory-bound.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/gemv_prefetch.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_kquant.h"

#define KQ_TARGET __attribute__((target("avx2,fma,f16c")))
#define KQ_DPWSSD(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))

namespace alloy::cpu::mm {
namespace {
#include "kernels/cpu/matmul_kquant_rows.inc"
}  // namespace

// quantize_q8k in 8 lanes, the scalar reference's bits for every input (NaN, inf, a denormal
// maximum included): max |x| by vmaxps with the running maximum second (a NaN lane keeps it, as
// the scalar `ax > amax` skips NaN), then the first value of that magnitude as `max`; q as the
// reference computes it, fl(iscale x) + 1.5 2^23 (the empty asm keeps GCC from contracting the
// two into an FMA) and its mantissa bits minus 2^22, clamped above at 127 and truncated to the
// low byte (the reference's int8_t cast; a saturating pack would differ for inf / NaN inputs).
KQ_TARGET void quantize_q8k_avx2(const float* x, int64_t K, int8_t* q, float* d, int16_t* bsums) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < K / kQK; ++b) {
        const float* xb = x + b * kQK;
        int8_t* qb = q + b * kQK;
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < kQK; j += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)), m);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        if (amax == 0.0f) {
            d[b] = 0.0f;
            std::memset(qb, 0, kQK);
            std::memset(bsums + b * 16, 0, 16 * sizeof(int16_t));
            continue;
        }
        float max = 0.0f;
        const __m256 am = _mm256_set1_ps(amax);
        for (int j = 0; j < kQK; j += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)), am, _CMP_EQ_OQ));
            if (hit) {
                max = xb[j + __builtin_ctz(unsigned(hit))];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 is = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
        const __m256i mant = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000);
        const __m256i c127 = _mm256_set1_epi32(127), low = _mm256_set1_epi32(0xFF);
        for (int j = 0; j < kQK; j += 32) {
            __m256i r[4];
            for (int u = 0; u < 4; ++u) {
                __m256 p = _mm256_mul_ps(is, _mm256_loadu_ps(xb + j + 8 * u));
                asm("" : "+x"(p));
                const __m256i bits = _mm256_castps_si256(_mm256_add_ps(p, magic));
                r[u] = _mm256_and_si256(_mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(bits, mant), half), c127), low);
            }
            // Low bytes 0..255 pack without saturation; the packs' lane order is undone below.
            const __m256i p8 = _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]), _mm256_packus_epi32(r[2], r[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + j),
                                _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
        for (int s = 0; s < 16; ++s) {
            const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + 16 * s)));
            __m128i t = _mm_add_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
            t = _mm_add_epi16(t, _mm_shuffle_epi32(t, 0x4E));
            t = _mm_add_epi16(t, _mm_shuffle_epi32(t, 0xB1));
            t = _mm_add_epi16(t, _mm_shufflelo_epi16(t, 0xB1));
            bsums[b * 16 + s] = int16_t(_mm_extract_epi16(t, 0));
        }
        d[b] = 1 / iscale;
    }
}

GemvFn kquant_gemv_avx2(GgmlType type) { return kq_gemv_for(type); }
GemvFn kq_r16_gemv_avx2(GgmlType type) { return kq_r16_for(type); }

}  // namespace alloy::cpu::mm
