// Q8_0 weights x Q8_0-quantized activations on AVX-512 VNNI (vpdpbusd: u8 x s8 -> s32).
//
// vpdpbusd wants one unsigned operand. The weight bytes are flipped to u8 (w ^ 0x80 = w + 128)
// and the activations stay signed, so every block sum comes out as
//   sum((w + 128) * x) = sum(w * x) + 128 * sum(x),
// and the excess is removed by starting the block's int32 accumulator at corr = -128 * sum(x),
// which the activation quantizer already computed. Block sums are exact integers; each is
// scaled by d_w * d_x in fp32 and summed in fp32, as ggml_vec_dot_q8_0_q8_0: per (row, token)
// y = fma(float(isum_b), d_w * d_x, y) over the blocks b in order, from y = 0, on every Q8_0
// path (this tile, the AVX2 tile, both decode GEMVs), so every token count gives the same bits.
// GCC 12's AVX-512 intrinsic headers use _mm512_undefined_* internally and trip this warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"

#define ALLOY_Q8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

namespace alloy::cpu::mm {
namespace {

constexpr int kBlockBytes = 34;       // f16 scale + 32 int8


// ---------------------------------------------------------------------------------------
// Prefill (GEMM): R rows x NV groups of 16 tokens. Per k-quad, each row's 4 weight bytes are
// broadcast (and flipped) once and meet NV activation vectors; per block, the exact int32
// sums are scaled by d_w (broadcast) * d_x (16 tokens) into fp32 accumulators.

// kR16: rows r0..r0 + R - 1 lie in one group of a Q8Rows16 matrix (matmul_kernels.h), read
// in place (row l's quad j of block b at 32 + 64 j + 4 l of the group's block, already flipped;
// its scale at 2 l): the same values in the same order, so the same bits, and no unpacking.
template <int R, int NV, bool kR16 = false>
ALLOY_Q8_TARGET void q8_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0,
                             int64_t k1, float* tile, int ldt) {
    const int64_t K = p.K, nb = K / kQ8;
    const size_t rb = W.row_bytes;
    const uint8_t* w = kR16 ? W.data + size_t(r0 / kQ8R16Rows) * kQ8R16Rows * rb + (r0 % kQ8R16Rows) * 4 : W.row(r0);
    const uint8_t* ws = kR16 ? w - (r0 % kQ8R16Rows) * 2 : w;  // the scales (kR16: of row r0 at ws[0], + 2 a row)
    // Bytes from a row to the next, from a block to the next, from a k-quad to the next.
    constexpr int64_t kRowQ = 4, kRowS = 2, kBlk = kR16 ? kQ8R16Block : kBlockBytes, kQuad = kR16 ? 64 : 4;
    const int64_t row_q = kR16 ? kRowQ : int64_t(rb), row_s = kR16 ? kRowS : int64_t(rb);
    const int64_t q_off = kR16 ? 32 : 2;
    const int64_t gq = K * kGroup;   // bytes per group of q
    const int64_t gs = nb * kGroup;  // elements per group of d and corr
    const int8_t* xq = p.q + g0 * gq;
    const float* xd = p.d + g0 * gs;
    const int32_t* xc = p.corr + g0 * gs;
    const __m512i flip = _mm512_set1_epi8(char(0x80));

    // One fp32 chain per (row, token) over every block of the row, in order: the chunk starts
    // from the tile (zero for the first), so chunking changes no bit and the decode GEMVs
    // (matmul_q8_gemv_avx512.cpp, matmul_avx2.cpp) and the AVX2 tile compute the same chain.
    __m512 f[R][NV];
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) f[r][v] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(tile + r * ldt + v * kGroup);
    // (kR16: the next rows share the group's lines, or start the next group, which the
    // hardware prefetcher streams: no software prefetch.)
    const int next_rows = kR16 ? 0 : int(std::min<int64_t>(R, W.n_out - r0 - R));  // rows of the next tile (<= 0: none)
    const uint8_t* r16_next = kR16 && (r0 / kQ8R16Rows + 2) * kQ8R16Rows <= q8_r16_rows(W)
                                  ? W.data + size_t(r0 / kQ8R16Rows + 1) * kQ8R16Rows * rb
                                  : nullptr;
    const int r16_line = int(r0 % kQ8R16Rows) / 4 * 3;
    for (int64_t b = k0 / kQ8; b < k1 / kQ8; ++b) {
        // The same block of the next R rows, which the next call of gemm_range reads (as in
        // bf16_tile: +4.7% GEMM at T = 512).
        for (int r = 0; r < next_rows; ++r)
            _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * rb + b * kBlockBytes), _MM_HINT_T0);
        if constexpr (kR16) {  // the same block of the next group: its 9 lines shared among the group's 4 tiles
            if (r16_next)
                for (int i = 0; i < 3; ++i)
                    if (r16_line + i < 9)
                        _mm_prefetch(reinterpret_cast<const char*>(r16_next + b * kBlk + (r16_line + i) * 64), _MM_HINT_T0);
        }
        __m512i acc[R][NV];
        for (int v = 0; v < NV; ++v) {
            const __m512i c = _mm512_load_si512(xc + v * gs + b * kGroup);
            for (int r = 0; r < R; ++r) acc[r][v] = c;
        }
        const uint8_t* wb = w + b * kBlk + q_off;
        const int8_t* xb = xq + b * kQ8 * kGroup;
        for (int j = 0; j < kQ8 / 4; ++j) {
            __m512i xv[NV];
            for (int v = 0; v < NV; ++v) xv[v] = _mm512_load_si512(xb + v * gq + j * 64);
            for (int r = 0; r < R; ++r) {
                const __m512i wb4 = _mm512_set1_epi32(load_i32(wb + r * row_q + kQuad * j));
                const __m512i wv = kR16 ? wb4 : _mm512_xor_si512(wb4, flip);
                for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], wv, xv[v]);
            }
        }
        for (int r = 0; r < R; ++r) {
            const __m512 dw = _mm512_set1_ps(_cvtsh_ss(load_u16(ws + r * row_s + b * kBlk)));
            for (int v = 0; v < NV; ++v) {
                const __m512 scale = _mm512_mul_ps(dw, _mm512_load_ps(xd + v * gs + b * kGroup));
                f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][v]), scale, f[r][v]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(tile + r * ldt + v * kGroup, f[r][v]);
}

// ---------------------------------------------------------------------------------------
// Narrow GEMM: one token group holding at most 8 real tokens (batched decode of 5-8
// sequences, short verification steps), where the tile above spends half of every vpdpbusd
// on padding tokens. Here a zmm's lanes are (token t, parity e) of the group's first 8 tokens
// and each vpdpbusd takes two k-quads: the row's octet m (quads 2m, 2m + 1) is broadcast as a
// qword straight from the GGUF row and meets the tokens' octets side by side
// (ActPanel::q_pairs), lane (t, e) summing quad 2m + e. Per block, lane (t, 0) starts at the
// token's corr, four vpdpbusd cover the 32 codes, and the two lanes of a token are added (one
// in-lane shuffle): the exact block sum, in both. From there the fp32 chain per (row, token) is
// the tile's (one FMA by d_w * d_x per block, in order), duplicated in the two lanes, so the
// bits are the tile's and the GEMVs'. 4 vpdpbusd a row and block (the least for 8 tokens)
// against the tile's 8; the shuffle, the flips and the broadcasts stay off the multiply pipes.
template <int R>
ALLOY_Q8_TARGET void q8_narrow(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0, int64_t k1,
                               float* tile, int ldt) {
    const int64_t K = p.K, nb = K / kQ8;
    const size_t rb = W.row_bytes;
    const int64_t gs = nb * kGroup;
    const float* xd = p.d + g0 * gs;
    const int32_t* xc = p.corr + g0 * gs;
    const uint8_t* w = W.row(r0);
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);  // token t -> lanes 2t, 2t + 1
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14);
    __m512 f[R];
    for (int r = 0; r < R; ++r)
        f[r] = k0 == 0 ? _mm512_setzero_ps()
                       : _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(tile + r * ldt)));
    const int next_rows = int(std::min<int64_t>(R, W.n_out - r0 - R));
    for (int64_t b = k0 / kQ8; b < k1 / kQ8; ++b) {
        for (int r = 0; r < next_rows; ++r)
            _mm_prefetch(reinterpret_cast<const char*>(w + (R + r) * rb + b * kBlockBytes), _MM_HINT_T0);
        const int8_t* xb = p.q_pairs + b * kQ8 * kNarrowTokens;
        __m512i xv[4];
        for (int m = 0; m < 4; ++m) xv[m] = _mm512_load_si512(xb + m * 64);
        // corr in lane (t, 0), zero in (t, 1): the zero-extension of 8 int32 to 8 int64.
        const __m512i c = _mm512_cvtepu32_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(xc + b * kGroup)));
        const __m512 dx = _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_load_ps(xd + b * kGroup)));
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = w + r * rb + b * kBlockBytes;
            __m512i acc = c;
            for (int m = 0; m < 4; ++m)
                acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(_mm512_set1_epi64(load_as<int64_t>(blk + 2 + 8 * m)), flip),
                                          xv[m]);
            acc = _mm512_add_epi32(acc, _mm512_shuffle_epi32(acc, _MM_PERM_CDAB));
            const __m512 dw = _mm512_set1_ps(_cvtsh_ss(load_u16(blk)));
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(dw, dx), f[r]);
        }
    }
    for (int r = 0; r < R; ++r)
        _mm256_storeu_ps(tile + r * ldt, _mm512_castps512_ps256(_mm512_permutexvar_ps(even, f[r])));
}

constexpr int kQ8Rows = 4, kQ8Groups = 3;
static_assert(kQ8Rows == 4, "q8_narrow_any covers 1 to 4 rows");

using TileImpl = void (*)(const WeightView&, int64_t, const ActPanel&, int64_t, int64_t, int64_t, float*, int);
#define ALLOY_Q8_ROW(R) {&q8_tile<R, 1>, &q8_tile<R, 2>, &q8_tile<R, 3>}
const TileImpl kQ8Table[kQ8Rows][kQ8Groups] = {ALLOY_Q8_ROW(1), ALLOY_Q8_ROW(2), ALLOY_Q8_ROW(3), ALLOY_Q8_ROW(4)};
#undef ALLOY_Q8_ROW

#define ALLOY_Q8_ROW(R) {&q8_tile<R, 1, true>, &q8_tile<R, 2, true>, &q8_tile<R, 3, true>}
const TileImpl kQ8R16Table[kQ8Rows][kQ8Groups] = {ALLOY_Q8_ROW(1), ALLOY_Q8_ROW(2), ALLOY_Q8_ROW(3), ALLOY_Q8_ROW(4)};
#undef ALLOY_Q8_ROW

// Rows [r0, r0 + nr) of a Q8Rows16 matrix inside one group (the driver's row tiles of 4 start at
// multiples of 4, and the GGUF tail at a multiple of 16).
bool in_r16_group(const WeightView& W, int64_t r0) { return r0 < q8_r16_rows(W); }

void q8_tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0,
                 int64_t k1, float* tile, int ldt) {
    (in_r16_group(W, r0) ? kQ8R16Table : kQ8Table)[nr - 1][nv - 1](W, r0, p, g0, k0, k1, tile, ldt);
}

// nv is 1 here (the driver calls the narrow kernel for one group only).
void q8_narrow_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0,
                   int64_t k1, float* tile, int ldt) {
    (void)nv;
    // A Q8Rows16 group: the full tile (the narrow one broadcasts two adjacent GGUF quads; the
    // same bits either way; lanes past the group's tokens are computed and ignored).
    if (in_r16_group(W, r0)) return kQ8R16Table[nr - 1][0](W, r0, p, g0, k0, k1, tile, ldt);
    switch (nr) {
        case 1: q8_narrow<1>(W, r0, p, g0, k0, k1, tile, ldt); break;
        case 2: q8_narrow<2>(W, r0, p, g0, k0, k1, tile, ldt); break;
        case 3: q8_narrow<3>(W, r0, p, g0, k0, k1, tile, ldt); break;
        default: q8_narrow<4>(W, r0, p, g0, k0, k1, tile, ldt); break;
    }
}

}  // namespace

TileKernel tile_avx512_q8() { return {q8_tile_any, kQ8Rows, kQ8Groups, kQ8Kc, q8_narrow_any}; }

// ---------------------------------------------------------------------------------------
// Activation quantization, bit-identical to quantize_q8_scalar (max, mul and round to
// nearest even are exact IEEE operations in both).

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c"))) void quantize_q8_avx512(
    const float* x, int64_t K, int8_t* q, float* d, int32_t* corr) {
    for (int64_t b = 0; b < K / kQ8; ++b) {
        const __m512 v0 = _mm512_loadu_ps(x + b * kQ8), v1 = _mm512_loadu_ps(x + b * kQ8 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        d[b] = _cvtsh_ss(_cvtss_sh(amax / 127.f, _MM_FROUND_TO_NEAREST_INT));
        const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
        constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, id), kRne));
        const __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, id), kRne));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQ8), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQ8 + 16), _mm512_cvtsepi32_epi8(i1));
        corr[b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

}  // namespace alloy::cpu::mm
