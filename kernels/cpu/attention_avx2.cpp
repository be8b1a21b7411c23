// AVX2 + FMA block of cpu::attention (head_dim % 8 == 0): the portable block's tiled online
// softmax (attention_scalar.cpp) with its inner products in 8-lane vectors, for CPUs without
// AVX-512. f16 tiles are converted once per tile with F16C (exact). Every row is computed on
// its own (scores of 4 keys at a time, each key's dot product in its own accumulator), so a
// row's arithmetic does not depend on the block it is in: decode and verification get the same
// bits (attention_block.h). The exponentials are scalar std::exp2, 32 per row and tile.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/attention_block.h"

#define ALLOY_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

namespace alloy::cpu::attn {
namespace {

ALLOY_AVX2_TARGET inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Rows [j0, j0 + nk) of a cache at element stride `stride`, as fp32 rows of hd: the cache
// itself when fp32 (stride kept), else converted into buf (stride becomes hd).
ALLOY_AVX2_TARGET const float* tile(const void* cache, bool f16, int64_t j0, int nk, int64_t& stride, int hd,
                                    float* buf) {
    if (!f16) return static_cast<const float*>(cache) + j0 * stride;
    const uint16_t* src = static_cast<const uint16_t*>(cache) + j0 * stride;
    for (int j = 0; j < nk; ++j)
        for (int d = 0; d < hd; d += 8)
            _mm256_store_ps(buf + int64_t(j) * hd + d,
                            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j * stride + d))));
    stride = hd;
    return buf;
}

// S[j] = q . K[j] for j < nv, 4 keys at a time.
ALLOY_AVX2_TARGET void scores(const float* q, const float* K, int64_t ks, int nv, int hd, float* S) {
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
ALLOY_AVX2_TARGET void update_o(float* o, float alpha, const float* P, const float* V, int64_t vs, int nv, int hd) {
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

}  // namespace

ALLOY_AVX2_TARGET void run_block_avx2(const Block& b) {
    const int R = b.rows(), hd = b.hd, ng = b.ng, NR = ng * R;  // row gi * R + r: row r of group gi
    float* Q = scratch(0, int64_t(NR) * hd);  // [NR, hd] q * scale * log2(e)
    float* O = scratch(1, int64_t(NR) * hd);  // [NR, hd] unnormalised output
    float* S = scratch(2, kKeyTile);          // [kKeyTile] one row's scores, then probabilities
    float* ml = scratch(3, 2 * int64_t(NR));  // [NR, 2] running max (log2 units), running sum
    float* kbuf = b.k_f16 ? scratch(4, int64_t(kKeyTile) * hd) : nullptr;
    float* vbuf = b.v_f16 ? scratch(5, int64_t(kKeyTile) * hd) : nullptr;
    const __m256 qs = _mm256_set1_ps(b.scale * 1.44269504088896341f);
    for (int gi = 0; gi < ng; ++gi)
        for (int r = 0; r < R; ++r) {
            const float* src = b.q_row(r, gi);
            const int64_t gr = int64_t(gi) * R + r;
            for (int d = 0; d < hd; d += 8) _mm256_store_ps(Q + gr * hd + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), qs));
            ml[2 * gr] = -INFINITY;
            ml[2 * gr + 1] = 0.0f;
        }
    std::fill(O, O + int64_t(NR) * hd, 0.0f);

    const size_t kb = b.k_f16 ? 2 : 4, vb = b.v_f16 ? 2 : 4;
    const int64_t key_end = std::min(b.key_end, b.limit(R - 1) + 1);
    for (int64_t j0 = b.key_begin; j0 < key_end; j0 += kKeyTile) {
        const int nk = int(std::min<int64_t>(kKeyTile, key_end - j0));
        for (int gi = 0; gi < ng; ++gi) {
            int64_t ks = b.kv_stride, vs = b.kv_stride;
            const float* K = tile(static_cast<const char*>(b.k) + size_t(gi) * size_t(hd) * kb, b.k_f16, j0, nk, ks,
                                  hd, kbuf);
            const float* V = tile(static_cast<const char*>(b.v) + size_t(gi) * size_t(hd) * vb, b.v_f16, j0, nk, vs,
                                  hd, vbuf);
            for (int r = 0; r < R; ++r) {
                const int nv = int(std::clamp<int64_t>(b.limit(r) + 1 - j0, 0, nk));  // causal
                if (nv == 0) continue;
                const int64_t gr = int64_t(gi) * R + r;
                scores(Q + gr * hd, K, ks, nv, hd, S);
                float mx = ml[2 * gr];
                for (int j = 0; j < nv; ++j) mx = std::max(mx, S[j]);
                const float alpha = std::exp2(ml[2 * gr] - mx);  // exp2(-inf) = 0 on the first tile
                float sum = 0.0f;
                for (int j = 0; j < nv; ++j) sum += (S[j] = std::exp2(S[j] - mx));
                ml[2 * gr] = mx;
                ml[2 * gr + 1] = ml[2 * gr + 1] * alpha + sum;
                update_o(O + gr * hd, alpha, S, V, vs, nv, hd);
            }
        }
    }

    for (int gi = 0; gi < ng; ++gi)
        for (int r = 0; r < R; ++r) {
            const int64_t gr = int64_t(gi) * R + r;
            const float* orow = O + gr * hd;
            if (b.out) {
                float* dst = b.out_row(r, gi);
                const __m256 inv = _mm256_set1_ps(1.0f / ml[2 * gr + 1]);  // every row of an unsplit block sees key 0
                for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_load_ps(orow + d), inv));
            } else {
                const int64_t pr = int64_t(gi) * b.part_rows + r;
                std::copy(orow, orow + hd, b.part_o + pr * hd);
                b.part_ml[2 * pr] = ml[2 * gr];
                b.part_ml[2 * pr + 1] = ml[2 * gr + 1];
            }
        }
}

}  // namespace alloy::cpu::attn
