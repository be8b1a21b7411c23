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

#include "kernels/cpu/vec_math_avx512.h"

// (fma for the 256-bit FMAs on the 8-lane vectors; every AVX-512 CPU has it.)
#define ALLOY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,fma")))

namespace alloy::cpu::gdn_simd {

// e^x per lane: the one vector exp of the CPU kernels (vec_math_avx512.h).
ALLOY_AVX512 inline __m512 exp512(__m512 x) { return avx512::exp(x); }

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
