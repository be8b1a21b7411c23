// Q8_0 weights x Q8_0-quantized activations on AVX2 (no VNNI): the GEMM tile of the prefill
// path there, on the same activation panels as the AVX-512 tile (matmul_q8_avx512.cpp).
//
// vpmaddubsw multiplies u8 by s8 into int16 pair sums, so the sign of each weight byte moves
// onto the activation: |w| * (sign(w) x) = w x (ggml's AVX2 trick; |w| <= 128, |x| <= 127, so
// a pair sum stays below 2^15). vpmaddwd with ones widens the pairs to int32 quad sums. Block
// sums are exact integers, each scaled by d_w * d_x in fp32 and summed in fp32, in block order,
// as ggml_vec_dot_q8_0_q8_0; the corr field of the panel (VNNI's unsigned offset) is unused.
// Tile: 3 rows x 16 tokens (two ymm): 6 int32 block accumulators in registers; the fp32 sums
// stay in the tile (in L1), updated once per block of 32. The narrow tile (TileKernel::narrow: a
// last group of <= 8 real tokens, batched decode of 5-8 sequences) is the same loop on the
// first ymm alone: half the multiplies, the same bits per (row, token).
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx2.h"


namespace alloy::cpu::mm {
namespace {

constexpr int kBlockBytes = 34;  // f16 scale + 32 int8
constexpr int kRows = 3, kGroups = 1;
constexpr int kKc = 1024;  // the panel slice: 16 tokens x 1 KiB

// H: 8-token halves of the group computed (2: the tile; 1: the narrow tile, lanes 0-7 only).
template <int R, int H>
ALLOY_TARGET_AVX2 void q8_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0, int64_t k1,
                               float* tile, int ldt) {
    const int64_t K = p.K, nb = K / kQ8;
    const size_t rb = W.row_bytes;
    const uint8_t* w = W.row(r0);
    const int64_t gq = K * kGroup;   // bytes per group of q
    const int64_t gs = nb * kGroup;  // elements per group of d
    const int8_t* xq = p.q + g0 * gq;
    const float* xd = p.d + g0 * gs;
    const __m256i ones = _mm256_set1_epi16(1);
    const int next_rows = int(std::min<int64_t>(R, W.n_out - r0 - R));
    if (k0 == 0)
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
            for (int h = 0; h < H; ++h) _mm256_storeu_ps(tile + r * ldt + 8 * h, _mm256_setzero_ps());
    for (int64_t b = k0 / kQ8; b < k1 / kQ8; ++b) {
        // The same block of the next rows, which the next call reads (as the AVX-512 tiles).
        for (int r = 0; r < next_rows; ++r)
            _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * rb + b * kBlockBytes), _MM_HINT_T0);
        __m256i acc[H * R];
#pragma GCC unroll 8
        for (int i = 0; i < H * R; ++i) acc[i] = _mm256_setzero_si256();
        const uint8_t* wb = w + b * kBlockBytes + 2;
        const int8_t* xb = xq + b * kQ8 * kGroup;
        // Not unrolled: GCC would schedule every quad's weight broadcasts first and spill.
#pragma GCC unroll 1
        for (int j = 0; j < kQ8 / 4; ++j) {
            __m256i x[H];
            for (int h = 0; h < H; ++h) x[h] = _mm256_load_si256(reinterpret_cast<const __m256i*>(xb + j * 64 + 32 * h));
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const __m256i wq = _mm256_set1_epi32(load_i32(wb + r * rb + 4 * j));
                const __m256i aw = _mm256_abs_epi8(wq);
                for (int h = 0; h < H; ++h) {
                    const __m256i s = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[h], wq));
                    acc[H * r + h] = _mm256_add_epi32(acc[H * r + h], _mm256_madd_epi16(s, ones));
                }
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const __m256 dw = _mm256_set1_ps(_cvtsh_ss(load_u16(w + r * rb + b * kBlockBytes)));
            float* o = tile + r * ldt;
            for (int h = 0; h < H; ++h) {
                const __m256 dx = _mm256_load_ps(xd + b * kGroup + 8 * h);
                _mm256_storeu_ps(o + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[H * r + h]), _mm256_mul_ps(dw, dx),
                                                            _mm256_loadu_ps(o + 8 * h)));
            }
        }
    }
}

using TileImpl = void (*)(const WeightView&, int64_t, const ActPanel&, int64_t, int64_t, int64_t, float*, int);
const TileImpl kQ8Table[kRows] = {&q8_tile<1, 2>, &q8_tile<2, 2>, &q8_tile<3, 2>};
const TileImpl kQ8NarrowTable[kRows] = {&q8_tile<1, 1>, &q8_tile<2, 1>, &q8_tile<3, 1>};

void q8_tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int /*nv = 1*/, int64_t k0,
                 int64_t k1, float* tile, int ldt) {
    kQ8Table[nr - 1](W, r0, p, g0, k0, k1, tile, ldt);
}
void q8_narrow_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int /*nv = 1*/, int64_t k0,
                   int64_t k1, float* tile, int ldt) {
    kQ8NarrowTable[nr - 1](W, r0, p, g0, k0, k1, tile, ldt);
}

}  // namespace

TileKernel tile_avx2_q8() { return {q8_tile_any, kRows, kGroups, kKc, q8_narrow_any, false}; }

// Activation quantization on AVX2, bit-identical to quantize_q8_scalar (max, the multiply and
// round to nearest even are exact IEEE operations in both; int32 -> int8 cannot saturate, as
// |x * 127 / amax| <= 127).
ALLOY_TARGET_AVX2 void quantize_q8_avx2(const float* x, int64_t K, int8_t* q, float* d, int32_t* corr) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < K / kQ8; ++b) {
        const float* xb = x + b * kQ8;
        __m256 v[4];
        for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h);
        d[b] = _cvtsh_ss(_cvtss_sh(amax / 127.f, _MM_FROUND_TO_NEAREST_INT));
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        __m256i iv[4];
        for (int i = 0; i < 4; ++i)
            iv[i] = _mm256_cvtps_epi32(
                _mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        // Packs work per 128-bit lane: the bytes come out in the order 0 2 4 6 1 3 5 7 of the
        // four-int groups, which one cross-lane dword permutation puts back.
        const __m256i p16 = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQ8),
                            _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        corr[b] = -128 * _mm_cvtsi128_si32(s4);
    }
}

}  // namespace alloy::cpu::mm
