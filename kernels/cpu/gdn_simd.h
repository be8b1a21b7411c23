// AVX-512 helpers of the CPU GDN kernels (gdn_delta.cpp, gdn_chunked.cpp, gdn_fused.cpp):
// a vector exp and the activations built on it. Functions carry the target attribute
// themselves because the build is not -march=native; call them only from AVX-512 code.
#pragma once

// GCC 12 reports its own _mm512_undefined_ps() operands inside the shuffle/extract intrinsics
// as "(may be) used uninitialized" once they are inlined (a known false positive); the files
// that include this header are the GDN AVX-512 kernels. (The state at the intrinsics'
// definitions is what counts, hence before the include.)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

// (fma for the 256-bit FMAs on the 8-lane vectors; every AVX-512 CPU has it.)
#define ALLOY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,fma")))

namespace alloy::cpu::gdn_simd {

// e^x per lane, ~1 ulp: x = n ln2 + r, |r| <= ln2/2, e^r by its degree-7 Taylor polynomial
// (truncation < 5e-9 relative), then scaled by 2^n with vscalefps, which also produces the
// denormals and the exact 0 that std::exp gives far below -87. Inputs are clamped to
// [-104, 88.7] so that n stays finite; e^88.7 is still a finite float.
ALLOY_AVX512 inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-104.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // ln2 split in a high part exact in a few bits and a low correction (Cody-Waite).
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
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

// SiLU(x) = x / (1 + e^-x). For x < -88.7 the clamped exp keeps the denominator finite and
// the result is the correctly tiny x / 3e38 (~0), as in the reference.
ALLOY_AVX512 inline __m512 silu512(__m512 x) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// Mask of the first n lanes (n in [0, 16]).
ALLOY_AVX512 inline __mmask16 lanes(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
}

}  // namespace alloy::cpu::gdn_simd
