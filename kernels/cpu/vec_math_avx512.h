// AVX-512 elementwise math shared by the CPU kernels (internal header: include it only from
// functions compiled with ALLOY_TARGET_AVX512, or the intrinsics will not inline).
//
// exp2/exp: range reduction to [-0.5, 0.5] in the base-2 exponent, a degree-7 Taylor
// polynomial for 2^f (truncation error < 6e-9, below fp32 rounding), and vscalefps for the
// 2^n factor, which underflows to 0 and overflows to inf cleanly. Max error ~2 ulp.
#pragma once
#include <immintrin.h>

// GCC 12's intrinsics fill masked-off lanes from _mm512_undefined_ps(), a self-initialised
// variable its -Wuninitialized flags in every inlined caller; the files including this header
// are AVX-512 kernels only.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define ALLOY_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16")))

namespace alloy::cpu::avx512 {

// 2^x for x in [-150, 128]; larger magnitudes are clamped (2^-150 is 0 in fp32).
ALLOY_TARGET_AVX512 inline __m512 exp2(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(128.0f)), _mm512_set1_ps(-150.0f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(x, n);  // exact, |f| <= 0.5
    // 2^f = sum_k (f ln2)^k / k!, Horner in f with coefficients ln2^k / k!.
    __m512 p = _mm512_set1_ps(1.5252733804059841e-05f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381609e-04f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-03f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-02f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-01f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// e^x. x * log2(e) is split into n + f with the product carried in two parts (Cody-Waite in
// the base-2 domain) so the rounding of x * log2(e) does not cost relative accuracy for |x| ~ 80.
ALLOY_TARGET_AVX512 inline __m512 exp(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)), _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // r = x - n ln2, ln2 = hi + lo with hi exact in few bits, so n * hi is exact.
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);  // |r| <= 0.35
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// sigmoid(x) = 1 / (1 + e^-x), evaluated as in ref::sigmoid so no branch exponentiates a large
// positive number: e = e^-|x| in (0, 1]; x >= 0: 1 / (1 + e), x < 0: e / (1 + e).
ALLOY_TARGET_AVX512 inline __m512 sigmoid(__m512 x) {
    const __m512 ax = _mm512_abs_ps(x);
    const __m512 e = exp(_mm512_sub_ps(_mm512_setzero_ps(), ax));
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_mul_ps(inv, neg, inv, e);
}

// Sum of a vector's 16 lanes.
ALLOY_TARGET_AVX512 inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

}  // namespace alloy::cpu::avx512
