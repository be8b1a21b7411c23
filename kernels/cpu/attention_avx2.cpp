// AVX2 + FMA block of cpu::attention (head_dim % 8 == 0): the portable block's schedule
// (run_block_rows, attention_scalar.cpp) with its per-row products in 8-lane vectors, for CPUs
// without AVX-512. f16 and bf16 tiles are converted once per tile (F16C; a shift: exact). Every row is computed on
// its own (scores of 4 keys at a time, each key's dot product in its own accumulator), so a
// row's arithmetic does not depend on the block it is in: decode and verification get the same
// bits (attention_block.h). The exponentials are scalar std::exp2, 32 per row and tile.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/vec_math_avx2.h"


namespace alloy::cpu::attn {
namespace {

using avx2::hsum;

// Rows [j0, j0 + nk) of a cache at element stride `stride`, as fp32 rows of hd: the cache
// itself when fp32 (stride kept), else converted into buf (stride becomes hd).
ALLOY_TARGET_AVX2 const float* tile(const void* cache, Elem e, int64_t j0, int nk, int64_t& stride, int hd,
                                    float* buf) {
    if (e == Elem::F32) return static_cast<const float*>(cache) + j0 * stride;
    const uint16_t* src = static_cast<const uint16_t*>(cache) + j0 * stride;
    auto halves = [&](int j, int d) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j * stride + d)); };
    if (e == Elem::F16)
        for (int j = 0; j < nk; ++j)
            for (int d = 0; d < hd; d += 8) _mm256_store_ps(buf + int64_t(j) * hd + d, _mm256_cvtph_ps(halves(j, d)));
    else  // bf16: the upper half of an fp32
        for (int j = 0; j < nk; ++j)
            for (int d = 0; d < hd; d += 8)
                _mm256_store_ps(buf + int64_t(j) * hd + d,
                                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves(j, d)), 16)));
    stride = hd;
    return buf;
}

// S[j] = q . K[j] for j < nv, 4 keys at a time.
ALLOY_TARGET_AVX2 void scores(const float* q, const float* K, int64_t ks, int nv, int hd, float* S) {
    int j = 0;
    for (; j + 4 <= nv; j += 4) {
        const float* k0 = K + j * ks;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d += 8) {
            const __m256 qv = _mm256_load_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + ks + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * ks + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * ks + d), a3);
        }
        S[j] = hsum(a0), S[j + 1] = hsum(a1), S[j + 2] = hsum(a2), S[j + 3] = hsum(a3);
    }
    for (; j < nv; ++j) {
        const float* kj = K + j * ks;
        __m256 a = _mm256_setzero_ps();
        for (int d = 0; d < hd; d += 8) a = _mm256_fmadd_ps(_mm256_load_ps(q + d), _mm256_loadu_ps(kj + d), a);
        S[j] = hsum(a);
    }
}

// o = o * alpha + sum_j P[j] V[j], 64 output lanes (8 ymm) at a time, keys in order.
ALLOY_TARGET_AVX2 void update_o(float* o, float alpha, const float* P, const float* V, int64_t vs, int nv, int hd) {
    const __m256 va = _mm256_set1_ps(alpha);
    int d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_mul_ps(_mm256_load_ps(o + d0 + 8 * i), va);
        for (int j = 0; j < nv; ++j) {
            const __m256 p = _mm256_set1_ps(P[j]);
            const float* vj = V + j * vs + d0;
#pragma GCC unroll 8
            for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vj + 8 * i), acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) _mm256_store_ps(o + d0 + 8 * i, acc[i]);
    }
    for (; d0 < hd; d0 += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_load_ps(o + d0), va);
        for (int j = 0; j < nv; ++j) acc = _mm256_fmadd_ps(_mm256_set1_ps(P[j]), _mm256_loadu_ps(V + j * vs + d0), acc);
        _mm256_store_ps(o + d0, acc);
    }
}

// dst = src * f; hd % 8 == 0.
ALLOY_TARGET_AVX2 void scale(const float* src, float* dst, int hd, float f) {
    const __m256 fv = _mm256_set1_ps(f);
    for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), fv));
}

}  // namespace

void run_block_avx2(const Block& b) { run_block_rows(b, {tile, scale, scores, update_o}); }

}  // namespace alloy::cpu::attn
