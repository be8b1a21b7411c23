#include "kernels/cpu/swiglu.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/vec_math_avx512.h"
#include "kernels/ref/activations.h"

namespace alloy::cpu {
namespace {

void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = ref::silu(gate[i]) * up[i];
}

ALLOY_TARGET_AVX512 void swiglu_avx512(const float* gate, const float* up, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 g = _mm512_loadu_ps(gate + i);
        const __m512 silu = _mm512_mul_ps(g, avx512::sigmoid(g));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
    }
    if (i < n) {
        const __mmask16 k = __mmask16((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
        const __m512 silu = _mm512_mul_ps(g, avx512::sigmoid(g));
        _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(k, up + i)));
    }
}

ALLOY_TARGET_AVX2 void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(out + i, _mm256_mul_ps(avx2::silu(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
    }
    if (i < n) {  // the tail through the same vector formula: an element's bits never depend on n
        const __m256i m = avx2::tail_mask(n - i);
        _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(avx2::silu(_mm256_maskload_ps(gate + i, m)), _mm256_maskload_ps(up + i, m)));
    }
}

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n, Isa isa) {
    auto fn = isa >= Isa::Avx512 ? swiglu_avx512 : isa >= Isa::Avx2 ? swiglu_avx2 : swiglu_scalar;
    for_chunks(n, 1, [&](int64_t b, int64_t e) { fn(gate + b, up + b, out + b, e - b); });
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) { swiglu(gate, up, out, n, active_isa()); }

}  // namespace alloy::cpu
