// GEMM tiles for BF16 and F32 weights on AVX2 + FMA (CPUs without AVX-512: most laptops and
// desktops, Zen 1-3), the prefill path of matmul.cpp there. Same panel and tile contract as the
// AVX-512 tiles (matmul_kernels.h), with a 16-token group as two ymm of fp32:
//  - F32 (and F16 / dequantized types as F32 copies): one broadcast weight per row and k.
//  - BF16: the activations rounded to bf16 and widened back (ActKind::Bf16F32, as the AVX2
//    row-dot reads them); each weight is widened to fp32 as it is broadcast, so the weights keep
//    their file layout here too.
// Tile: 3 rows x 2 groups (32 tokens) = 12 accumulators + 3 weights + 1 panel vector, the 16 ymm
// registers. Each output sums its k in order within a k-chunk, chunks in order.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx2.h"


namespace alloy::cpu::mm {
namespace {

constexpr int kRows = 3, kGroups = 2;
constexpr int kKc = kF32KcAvx2;

// Adds the accumulators ([R][2 NV], flat) to the tile (the first k-chunk adds to zero, not to
// the tile, which may be uninitialised).
template <int R, int NV>
ALLOY_TARGET_AVX2 __attribute__((always_inline)) inline void add_to_tile(const __m256* acc, bool first, float* tile,
                                                                           int ldt) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * NV; ++v) {
            float* o = tile + r * ldt + v * 8;
            const __m256 prev = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o);
            _mm256_storeu_ps(o, _mm256_add_ps(prev, acc[r * 2 * NV + v]));
        }
}

// Every 64 bytes of the weight rows, the same line of the next tile's rows (the next call reads
// them at this k), as the AVX-512 tiles do.
inline void prefetch_next_rows(const uint8_t* w, size_t rb, int R, int next_rows, size_t byte) {
    for (int r = 0; r < next_rows; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * rb + byte), _MM_HINT_T0);
}

// One k step of a tile: acc[r][v] += wv[r] * panel vector v at k. The accumulators are a flat
// array with every loop unrolled by pragma: GCC 12 keeps a [R][V] array of vectors in memory
// and stores all of it on every k step.
template <int R, int NV>
ALLOY_TARGET_AVX2 __attribute__((always_inline)) inline void k_step(__m256* acc, const __m256* wv, const float* xk,
                                                                      int64_t gf) {
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NV; ++v) {
        const __m256 x = _mm256_load_ps(xk + (v / 2) * gf + (v % 2) * 8);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r * 2 * NV + v] = _mm256_fmadd_ps(wv[r], x, acc[r * 2 * NV + v]);
    }
}

// Weight element k of a row, broadcast as fp32. BF16: broadcast to every 16-bit half, then
// shifted up 16 bits within each 32-bit lane, it is its fp32 value in every lane (two
// instructions, no mask register).
template <bool kBf16>
ALLOY_TARGET_AVX2 __attribute__((always_inline)) inline __m256 weight_at(const uint8_t* row, int64_t k) {
    if constexpr (kBf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_set1_epi16(short(load_u16(row + k * 2))), 16));
    else
        return _mm256_broadcast_ss(reinterpret_cast<const float*>(row + k * 4));
}

// BF16 (kBf16) or F32 weights.
template <bool kBf16, int R, int NV>
ALLOY_TARGET_AVX2 void float_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0,
                                  int64_t k1, float* tile, int ldt) {
    constexpr int kElemBytes = kBf16 ? 2 : 4;
    const size_t rb = W.row_bytes;
    const uint8_t* w = W.row(r0);
    const int64_t gf = p.K * kGroup;
    const float* xf = p.f + g0 * gf;
    const int next_rows = int(std::min<int64_t>(R, W.n_out - r0 - R));
    __m256 acc[R * 2 * NV];
#pragma GCC unroll 16
    for (int i = 0; i < R * 2 * NV; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
        if ((k & (64 / kElemBytes - 1)) == 0) prefetch_next_rows(w, rb, R, next_rows, size_t(k) * kElemBytes);
        __m256 wv[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) wv[r] = weight_at<kBf16>(w + r * rb, k);
        k_step<R, NV>(acc, wv, xf + k * kGroup, gf);
    }
    add_to_tile<R, NV>(acc, k0 == 0, tile, ldt);
}
template <int R, int NV>
void bf16_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0, int64_t k1, float* tile,
               int ldt) {
    float_tile<true, R, NV>(W, r0, p, g0, k0, k1, tile, ldt);
}
template <int R, int NV>
void f32_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0, int64_t k1, float* tile,
              int ldt) {
    float_tile<false, R, NV>(W, r0, p, g0, k0, k1, tile, ldt);
}

using TileImpl = void (*)(const WeightView&, int64_t, const ActPanel&, int64_t, int64_t, int64_t, float*, int);
#define ALLOY_ROW(K, R) {&K<R, 1>, &K<R, 2>}
const TileImpl kBf16Table[kRows][kGroups] = {ALLOY_ROW(bf16_tile, 1), ALLOY_ROW(bf16_tile, 2), ALLOY_ROW(bf16_tile, 3)};
const TileImpl kF32Table[kRows][kGroups] = {ALLOY_ROW(f32_tile, 1), ALLOY_ROW(f32_tile, 2), ALLOY_ROW(f32_tile, 3)};
#undef ALLOY_ROW

void bf16_tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0,
                   int64_t k1, float* tile, int ldt) {
    kBf16Table[nr - 1][nv - 1](W, r0, p, g0, k0, k1, tile, ldt);
}
void f32_tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0,
                  int64_t k1, float* tile, int ldt) {
    kF32Table[nr - 1][nv - 1](W, r0, p, g0, k0, k1, tile, ldt);
}

}  // namespace

TileKernel tile_avx2_q8();  // matmul_q8_avx2.cpp

TileKernel tile_avx2(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return tile_avx2_q8();
        case GgmlType::BF16: return {bf16_tile_any, kRows, kGroups, kKc};
        case GgmlType::F32: return {f32_tile_any, kRows, kGroups, kKc};
        default: return {};
    }
}

// y[t * ldy + i] = tile[i * ldt + t]: whole 8 x 8 blocks by register transposes, the edges one
// value at a time. (No streamed variant: a plain store for every output size.)
ALLOY_TARGET_AVX2 void store_transposed_avx2(const float* tile, int ldt, int64_t rows, int64_t tokens, float* y,
                                             int64_t ldy) {
    const int64_t rows8 = rows & ~int64_t(7), tokens8 = tokens & ~int64_t(7);
    for (int64_t i0 = 0; i0 < rows8; i0 += 8)
        for (int64_t t0 = 0; t0 < tokens8; t0 += 8) {
            __m256 r[8], c[8];
            for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(tile + (i0 + i) * ldt + t0);
            avx2::transpose8(r, c);
            for (int t = 0; t < 8; ++t) _mm256_storeu_ps(y + (t0 + t) * ldy + i0, c[t]);
        }
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t t = i < rows8 ? tokens8 : 0; t < tokens; ++t) y[t * ldy + i] = tile[i * ldt + t];
}

}  // namespace alloy::cpu::mm
