#include "kernels/cpu/matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "format/quant.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

namespace alloy::cpu {
namespace {

constexpr int kRowBlock = 16;  // output rows dequantized together: 16 x n_in floats stay in L2

float dot_scalar(const float* a, const float* b, int64_t n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    float s = 0;
    for (; i < n; ++i) s += a[i] * b[i];
    for (int j = 0; j < 8; ++j) s += acc[j];
    return s;
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    acc0 = _mm256_add_ps(acc0, acc1);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
    s4 = _mm_hadd_ps(s4, s4);
    s4 = _mm_hadd_ps(s4, s4);
    float s = _mm_cvtss_f32(s4);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

__attribute__((target("avx512f"))) float dot_avx512(const float* a, const float* b, int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    if (i + 16 <= n) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        i += 16;
    }
    if (i < n) {
        const __mmask16 m = __mmask16((1u << (n - i)) - 1);
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

using DotFn = float (*)(const float*, const float*, int64_t);

DotFn pick_dot() {
    switch (active_isa()) {
        case Isa::Avx512: return dot_avx512;
        case Isa::Avx2: return dot_avx2;
        default: return dot_scalar;
    }
}

}  // namespace

void matmul(const WeightView& W, const float* x, float* y, int64_t T) {
    const DotFn dot = pick_dot();
    const int64_t n_in = W.n_in, n_out = W.n_out;
    const int64_t n_blocks = (n_out + kRowBlock - 1) / kRowBlock;
    const bool plain = W.type == GgmlType::F32;  // rows usable in place
    std::vector<std::vector<float>> scratch(static_cast<size_t>(n_threads()));
    parallel_for(n_blocks, [&](int64_t b, int thread) {
        {
            std::vector<float>& rows = scratch[size_t(thread)];
            if (!plain && rows.empty()) rows.resize(size_t(kRowBlock * n_in));
            const int64_t r0 = b * kRowBlock, r1 = std::min(n_out, r0 + kRowBlock);
            const float* base[kRowBlock];
            for (int64_t r = r0; r < r1; ++r) {
                if (plain) {
                    base[r - r0] = reinterpret_cast<const float*>(W.row(r));
                } else {
                    float* dst = rows.data() + (r - r0) * n_in;
                    dequantize_row(W.type, W.row(r), dst, n_in);
                    base[r - r0] = dst;
                }
            }
            for (int64_t t = 0; t < T; ++t) {
                const float* xt = x + t * n_in;
                float* yt = y + t * n_out;
                for (int64_t r = r0; r < r1; ++r) yt[r] = dot(base[r - r0], xt, n_in);
            }
        }
    });
}

}  // namespace alloy::cpu
