#include "kernels/cpu/gate.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/vec_math_avx512.h"
#include "kernels/ref/activations.h"

namespace alloy::cpu {
namespace {

void gate_scalar(float* x, const float* g, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] *= ref::sigmoid(g[i]);
}

ALLOY_TARGET_AVX512 void gate_avx512(float* x, const float* g, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), avx512::sigmoid(_mm512_loadu_ps(g + i))));
    if (i < n) {
        const __mmask16 k = __mmask16((1u << (n - i)) - 1);
        const __m512 s = avx512::sigmoid(_mm512_maskz_loadu_ps(k, g + i));
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), s));
    }
}

ALLOY_TARGET_AVX2 void gate_avx2(float* x, const float* g, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), avx2::sigmoid(_mm256_loadu_ps(g + i))));
    if (i < n) {  // the tail through the same vector formula: an element's bits never depend on n
        const __m256i m = avx2::tail_mask(n - i);
        _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), avx2::sigmoid(_mm256_maskload_ps(g + i, m))));
    }
}

}  // namespace

void sigmoid_gate_mul(float* x, const float* g, int64_t n, Isa isa) {
    auto fn = isa >= Isa::Avx512 ? gate_avx512 : isa >= Isa::Avx2 ? gate_avx2 : gate_scalar;
    for_chunks(n, 1, [&](int64_t b, int64_t e) { fn(x + b, g + b, e - b); });
}

void sigmoid_gate_mul(float* x, const float* g, int64_t n) { sigmoid_gate_mul(x, g, n, active_isa()); }

void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride, Isa isa) {
    auto fn = isa >= Isa::Avx512 ? gate_avx512 : isa >= Isa::Avx2 ? gate_avx2 : gate_scalar;
    for_chunks(rows, n, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) fn(x + r * n, g + r * g_stride, n);
    });
}

void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride) {
    sigmoid_gate_mul(x, g, rows, n, g_stride, active_isa());
}

}  // namespace alloy::cpu
