#include "kernels/cpu/rope.h"

#include <cassert>
#include <cmath>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/vec_math_avx512.h"

namespace alloy::cpu {
namespace {

// One token: rotate the first n_rot dims of each of n_heads heads.
void token_scalar(float* x, const float* c, const float* s, int n_heads, int head_dim, int half) {
    for (int h = 0; h < n_heads; ++h) {
        float* xh = x + int64_t(h) * head_dim;
        for (int i = 0; i < half; ++i) {
            const float a = xh[i], b = xh[i + half];
            xh[i] = a * c[i] - b * s[i];
            xh[i + half] = a * s[i] + b * c[i];
        }
    }
}

// Separate products, no FMA: the reference's roundings, so outputs match it bit for bit. The
// explicit-rounding forms keep GCC from contracting mul + sub into an FMA (-ffp-contract=fast).
constexpr int kRn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
ALLOY_TARGET_AVX512 void token_avx512(float* x, const float* c, const float* s, int n_heads, int head_dim, int half) {
    for (int h = 0; h < n_heads; ++h) {
        float* xh = x + int64_t(h) * head_dim;
        for (int i = 0; i < half; i += 16) {
            const __mmask16 k = __mmask16(half - i >= 16 ? 0xFFFF : (1u << (half - i)) - 1);
            const __m512 cv = _mm512_maskz_loadu_ps(k, c + i), sv = _mm512_maskz_loadu_ps(k, s + i);
            const __m512 a = _mm512_maskz_loadu_ps(k, xh + i), b = _mm512_maskz_loadu_ps(k, xh + half + i);
            _mm512_mask_storeu_ps(xh + i, k, _mm512_sub_round_ps(_mm512_mul_round_ps(a, cv, kRn), _mm512_mul_round_ps(b, sv, kRn), kRn));
            _mm512_mask_storeu_ps(xh + half + i, k, _mm512_add_round_ps(_mm512_mul_round_ps(a, sv, kRn), _mm512_mul_round_ps(b, cv, kRn), kRn));
        }
    }
}

// AVX2: compiled without FMA, so the separate products cannot be contracted into one (the
// reference's roundings, as the _round_ forms above); a tail of fewer than 8 pairs is scalar.
__attribute__((target("avx2"))) void token_avx2(float* x, const float* c, const float* s, int n_heads, int head_dim,
                                                int half) {
    for (int h = 0; h < n_heads; ++h) {
        float* xh = x + int64_t(h) * head_dim;
        int i = 0;
        for (; i + 8 <= half; i += 8) {
            const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
            const __m256 a = _mm256_loadu_ps(xh + i), b = _mm256_loadu_ps(xh + half + i);
            _mm256_storeu_ps(xh + i, _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv)));
            _mm256_storeu_ps(xh + half + i, _mm256_add_ps(_mm256_mul_ps(a, sv), _mm256_mul_ps(b, cv)));
        }
        for (; i < half; ++i) {
            const float a = xh[i], b = xh[i + half];
            xh[i] = a * c[i] - b * s[i];
            xh[i + half] = a * s[i] + b * c[i];
        }
    }
}

using TokenFn = void (*)(float*, const float*, const float*, int, int, int);
TokenFn token_fn(Isa isa) { return isa >= Isa::Avx512 ? token_avx512 : isa >= Isa::Avx2 ? token_avx2 : token_scalar; }

}  // namespace

RopeTable rope_table(const int32_t* pos, int64_t T, int n_rot, float base) {
    assert(n_rot > 0 && n_rot % 2 == 0);
    const int half = n_rot / 2;
    RopeTable tab;
    tab.T = T;
    tab.n_rot = n_rot;
    tab.cos.resize(size_t(T * half));
    tab.sin.resize(size_t(T * half));
    std::vector<float> inv_freq(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(n_rot));
    // sin/cos cost ~20 ns each: a 4096-token table is worth the pool.
    for_chunks(T, 16 * half, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t)
            for (int i = 0; i < half; ++i) {
                const float theta = float(pos[t]) * inv_freq[size_t(i)];
                tab.cos[size_t(t * half + i)] = std::cos(theta);
                tab.sin[size_t(t * half + i)] = std::sin(theta);
            }
    });
    return tab;
}

void rope_partial(const RopeTable& tab, float* x, int n_heads, int head_dim, Isa isa) {
    assert(head_dim >= tab.n_rot);
    const int half = tab.n_rot / 2;
    const TokenFn token = token_fn(isa);
    const int64_t stride = int64_t(n_heads) * head_dim;
    for_chunks(tab.T, int64_t(n_heads) * tab.n_rot, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t)
            token(x + t * stride, tab.cos.data() + t * half, tab.sin.data() + t * half, n_heads, head_dim, half);
    });
}

void rope_partial(const RopeTable& tab, float* x, int n_heads, int head_dim) {
    rope_partial(tab, x, n_heads, head_dim, active_isa());
}

void rms_norm_rope(const RopeTable& tab, const float* x, int64_t x_head_stride, const float* w, float* out, int n_heads,
                   int head_dim, float eps, Isa isa) {
    assert(head_dim >= tab.n_rot);
    const int half = tab.n_rot / 2;
    const TokenFn token = token_fn(isa);
    const RmsNormRow norm = rms_norm_row(isa);
    const int64_t stride = int64_t(n_heads) * head_dim;
    for_chunks(tab.T, 2 * stride, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
            for (int h = 0; h < n_heads; ++h)
                norm(x + (t * n_heads + h) * x_head_stride, w, out + t * stride + int64_t(h) * head_dim, head_dim, eps);
            token(out + t * stride, tab.cos.data() + t * half, tab.sin.data() + t * half, n_heads, head_dim, half);
        }
    });
}

void rms_norm_rope(const RopeTable& tab, const float* x, int64_t x_head_stride, const float* w, float* out, int n_heads,
                   int head_dim, float eps) {
    rms_norm_rope(tab, x, x_head_stride, w, out, n_heads, head_dim, eps, active_isa());
}

void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot, float base) {
    rope_partial(rope_table(pos, T, n_rot, base), x, n_heads, head_dim);
}

}  // namespace alloy::cpu
