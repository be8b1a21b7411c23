#include "kernels/cpu/add.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/vec_math_avx512.h"

namespace alloy::cpu {
namespace {

void add_scalar(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

ALLOY_TARGET_AVX512 void add_avx512(float* x, const float* y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        const __mmask16 k = __mmask16((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(x + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, y + i)));
    }
}

ALLOY_TARGET_AVX2 void add_avx2(float* x, const float* y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    add_scalar(x + i, y + i, n - i);
}

}  // namespace

void add(float* x, const float* y, int64_t n, Isa isa) {
    auto fn = isa >= Isa::Avx512 ? add_avx512 : isa >= Isa::Avx2 ? add_avx2 : add_scalar;
    for_chunks(n, 1, [&](int64_t b, int64_t e) { fn(x + b, y + b, e - b); });
}

void add(float* x, const float* y, int64_t n) { add(x, y, n, active_isa()); }

}  // namespace alloy::cpu
