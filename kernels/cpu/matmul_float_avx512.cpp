// GEMM tiles for BF16 and F32 weights on AVX-512 (F16 and the dequantized types arrive here
// as F32 copies), and the 16 x 16 transposes the driver and the activation panels use.
//  - BF16: activations rounded to bf16; vdpbf16ps (pairs of bf16 products, fp32 sums).
//  - F32: fp32 FMA.
// Each tile broadcasts one weight pair (BF16) or element (F32) per row and meets 16 tokens
// per zmm of the activation panel.
// GCC 12's AVX-512 intrinsic headers use _mm512_undefined_* internally and trip this warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_transpose.h"

#define ALLOY_F_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")))

namespace alloy::cpu::mm {

TileKernel tile_avx512_q8();

namespace {


// ---------------------------------------------------------------------------------------
// GEMM tiles. BF16: per k-pair, one 32-bit broadcast per row (2 bf16) x NV panel vectors.

template <int R, int NV>
ALLOY_F_TARGET void bf16_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0,
                              int64_t k1, float* tile, int ldt) {
    const size_t rb = W.row_bytes;
    const uint8_t* w = W.row(r0);
    const int64_t gb = p.K * kGroup;  // bf16 elements per group
    const uint16_t* xb = p.bf + g0 * gb;
    __m512 acc[R][NV];
    for (auto& r : acc)
        for (auto& v : r) v = _mm512_setzero_ps();
    const int next_rows = int(std::min<int64_t>(R, W.n_out - r0 - R));  // rows of the next tile (<= 0: none)
    for (int64_t k2 = k0 / 2; k2 < k1 / 2; ++k2) {
        // Every 64 bytes of the weight rows, the same line of the next R rows (the next call
        // of gemm_range reads them at this k): without it each call began with R streams
        // from DRAM that the hardware prefetcher had not seen (+4-8% GEMM, T = 64..512).
        if ((k2 & 15) == 0)
            for (int r = 0; r < next_rows; ++r)
                _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * rb + k2 * 4), _MM_HINT_T0);
        __m512i xv[NV];
        for (int v = 0; v < NV; ++v) xv[v] = _mm512_load_si512(xb + v * gb + k2 * 2 * kGroup);
        for (int r = 0; r < R; ++r) {
            const __m512i wv = _mm512_set1_epi32(load_i32(w + r * rb + k2 * 4));
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)wv, (__m512bh)xv[v]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) {
            float* o = tile + r * ldt + v * kGroup;
            // The first chunk adds to zero, not to the tile (same bits as a zeroed tile).
            const __m512 prev = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o);
            _mm512_storeu_ps(o, _mm512_add_ps(prev, acc[r][v]));
        }
}

// F32: per k, one broadcast per row x NV panel vectors.
template <int R, int NV>
ALLOY_F_TARGET void f32_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0,
                             int64_t k1, float* tile, int ldt) {
    const size_t rb = W.row_bytes;
    const uint8_t* w = W.row(r0);
    const int64_t gf = p.K * kGroup;
    const float* xf = p.f + g0 * gf;
    __m512 acc[R][NV];
    for (auto& r : acc)
        for (auto& v : r) v = _mm512_setzero_ps();
    for (int64_t k = k0; k < k1; ++k) {
        __m512 xv[NV];
        for (int v = 0; v < NV; ++v) xv[v] = _mm512_load_ps(xf + v * gf + k * kGroup);
        for (int r = 0; r < R; ++r) {
            const __m512 wv = _mm512_set1_ps(load_f32(w + r * rb + k * 4));
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(wv, xv[v], acc[r][v]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) {
            float* o = tile + r * ldt + v * kGroup;
            // The first chunk adds to zero, not to the tile (same bits as a zeroed tile).
            const __m512 prev = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o);
            _mm512_storeu_ps(o, _mm512_add_ps(prev, acc[r][v]));
        }
}

using TileImpl = void (*)(const WeightView&, int64_t, const ActPanel&, int64_t, int64_t, int64_t, float*, int);

constexpr int kBfRows = 6, kBfGroups = 4;
#define ALLOY_ROW(K, R) {&K<R, 1>, &K<R, 2>, &K<R, 3>, &K<R, 4>}
const TileImpl kBfTable[kBfRows][kBfGroups] = {ALLOY_ROW(bf16_tile, 1), ALLOY_ROW(bf16_tile, 2),
                                               ALLOY_ROW(bf16_tile, 3), ALLOY_ROW(bf16_tile, 4),
                                               ALLOY_ROW(bf16_tile, 5), ALLOY_ROW(bf16_tile, 6)};
constexpr int kF32Rows = 6, kF32Groups = 4;
const TileImpl kF32Table[kF32Rows][kF32Groups] = {ALLOY_ROW(f32_tile, 1), ALLOY_ROW(f32_tile, 2),
                                                  ALLOY_ROW(f32_tile, 3), ALLOY_ROW(f32_tile, 4),
                                                  ALLOY_ROW(f32_tile, 5), ALLOY_ROW(f32_tile, 6)};
#undef ALLOY_ROW

void bf16_tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0,
                   int64_t k1, float* tile, int ldt) {
    kBfTable[nr - 1][nv - 1](W, r0, p, g0, k0, k1, tile, ldt);
}
void f32_tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0,
                  int64_t k1, float* tile, int ldt) {
    kF32Table[nr - 1][nv - 1](W, r0, p, g0, k0, k1, tile, ldt);
}

}  // namespace

TileKernel tile_avx512(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return cpu_has_avx512_vnni() ? tile_avx512_q8() : TileKernel{};
        case GgmlType::BF16:
            return cpu_has_avx512_bf16() ? TileKernel{bf16_tile_any, kBfRows, kBfGroups, kBf16Kc} : TileKernel{};
        case GgmlType::F32: return {f32_tile_any, kF32Rows, kF32Groups, kF32Kc};
        default: return {};
    }
}

// y[t * ldy + i] = tile[i * ldt + t] for i < rows, t < tokens, in 16 x 16 register
// transposes instead of one strided scalar store per element.
ALLOY_F_TARGET void store_transposed_avx512(const float* tile, int ldt, int64_t rows, int64_t tokens, float* y,
                                            int64_t ldy, bool stream) {
    // Non-temporal only where every store covers one whole line: 16 rows from a 64-byte
    // aligned start, with a row stride that keeps the next token's start aligned too.
    stream = stream && ((reinterpret_cast<uintptr_t>(y) | uintptr_t(ldy * 4)) & 63) == 0;
    for (int64_t i0 = 0; i0 < rows; i0 += 16) {
        const int64_t ni = rows - i0 < 16 ? rows - i0 : 16;
        const __mmask16 row_mask = __mmask16((1u << ni) - 1);
        for (int64_t t0 = 0; t0 < tokens; t0 += 16) {
            const int64_t nt = tokens - t0 < 16 ? tokens - t0 : 16;
            const __mmask16 tok_mask = __mmask16((1u << nt) - 1);
            __m512 r[16], col[16];
            for (int i = 0; i < 16; ++i)
                r[i] = i < ni ? _mm512_maskz_loadu_ps(tok_mask, tile + (i0 + i) * ldt + t0) : _mm512_setzero_ps();
            transpose16(r, col);
            if (stream && ni == 16) {
                for (int t = 0; t < nt; ++t) _mm512_stream_ps(y + (t0 + t) * ldy + i0, col[t]);
            } else {
                for (int t = 0; t < nt; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy + i0, row_mask, col[t]);
            }
        }
    }
    if (stream) _mm_sfence();  // non-temporal stores are weakly ordered: visible before the item ends
}

ALLOY_F_TARGET void interleave16_avx512(const uint32_t* rows, int64_t units, uint32_t* dst) {
    int64_t u0 = 0;
    for (; u0 + 16 <= units; u0 += 16) {
        __m512 r[16], c[16];
        for (int l = 0; l < 16; ++l) r[l] = _mm512_loadu_ps(reinterpret_cast<const float*>(rows + l * units + u0));
        transpose16(r, c);
        for (int u = 0; u < 16; ++u) _mm512_storeu_ps(reinterpret_cast<float*>(dst + (u0 + u) * 16), c[u]);
    }
    for (; u0 < units; ++u0)
        for (int l = 0; l < 16; ++l) dst[u0 * 16 + l] = rows[l * units + u0];
}

ALLOY_F_TARGET void f16_to_f32_avx512(const uint8_t* src, int64_t n, float* out) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2 * i))));
    if (i < n) {
        const __mmask16 m = __mmask16((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + 2 * i)));
    }
}

// fp32 -> bf16 with integer rounding, bit-identical to to_bf16_scalar.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void to_bf16_avx512(const float* x, int64_t n, uint16_t* out) {
    int64_t i = 0;
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF);
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
    }
    if (i < n) to_bf16_scalar(x + i, n - i, out + i);
}

}  // namespace alloy::cpu::mm
