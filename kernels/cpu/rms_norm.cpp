#include "kernels/cpu/rms_norm.h"

#include <cmath>

#include "kernels/cpu/add.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/vec_math_avx512.h"

namespace alloy::cpu {
namespace {

void row_scalar(const float* x, const float* w, float* y, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

ALLOY_TARGET_AVX512 void row_avx512(const float* x, const float* w, float* y, int64_t n, float eps) {
    // Sum of squares in double: 2 x 8 lanes per 16 floats, two chains per half.
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    double ss = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (int64_t j = i; j < n; ++j) ss += double(x[j]) * x[j];
    const float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    const __m512 s = _mm512_set1_ps(scale);
    // (x * scale) * w, the reference's order of roundings.
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), s);
        if (w) v = _mm512_mul_ps(v, _mm512_loadu_ps(w + i));
        _mm512_storeu_ps(y + i, v);
    }
    for (; i < n; ++i) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

// The same with 4-lane double sums (two chains), 8 floats per step.
ALLOY_TARGET_AVX2 void row_avx2(const float* x, const float* w, float* y, int64_t n, float eps) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    const __m256d a = _mm256_add_pd(a0, a1);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double ss = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (int64_t j = i; j < n; ++j) ss += double(x[j]) * x[j];
    const float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    const __m256 s = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {  // (x * scale) * w, the reference's order of roundings
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; ++i) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

}  // namespace

RmsNormRow rms_norm_row(Isa isa) {
    return isa >= Isa::Avx512 ? row_avx512 : isa >= Isa::Avx2 ? row_avx2 : row_scalar;
}

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps, Isa isa) {
    const RmsNormRow row = rms_norm_row(isa);
    for_chunks(rows, n, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) row(x + r * n, w, out + r * n, n, eps);
    });
}

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
    rms_norm(x, w, out, rows, n, eps, active_isa());
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps, Isa isa) {
    const RmsNormRow row = rms_norm_row(isa);
    for_chunks(rows, 2 * n, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            add(x + r * n, y + r * n, n, isa);  // one row: no pool region of its own
            row(x + r * n, w, out + r * n, n, eps);
        }
    });
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps) {
    add_rms_norm(x, y, w, out, rows, n, eps, active_isa());
}

}  // namespace alloy::cpu
