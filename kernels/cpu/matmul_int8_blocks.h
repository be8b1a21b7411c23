// The int8-block weight types the Q8_0 arithmetic serves, decoded for the AVX2 and the
// AVX512-VNNI GEMVs alike (matmul_avx2.cpp, matmul_q8_gemv_avx512.cpp): their functions are
// compiled for AVX2, a subset of both callers' targets, so they inline into either.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "format/quant.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx2.h"

namespace alloy::cpu::mm {

// Q8_0 (34-byte blocks of f16 d + 32
// int8), Q4_0 and IQ4_NL (18 bytes: f16 d + 16 bytes, byte j holding value j in its low nibble
// and j + 16 in its high one; Q4_0 codes are offset by 8, IQ4_NL's index kIq4nlValues), and
// MXFP4 (17 bytes: a shared exponent, then the codes as IQ4_NL's, indexing kMxfp4Values).
enum class Blocks { Q8_0, Q4_0, IQ4_NL, MXFP4 };

template <Blocks kB>
constexpr int64_t block_bytes() { return kB == Blocks::Q8_0 ? 34 : kB == Blocks::MXFP4 ? 17 : 18; }

// The block's scale: f16 d, or MXFP4's shared exponent as 2^(e - 128) (format/quant.h).
template <Blocks kB>
ALLOY_TARGET_AVX2 inline float block_scale(const uint8_t* blk) {
    if constexpr (kB == Blocks::MXFP4) return mxfp4_half_scale(blk[0]);
    return _cvtsh_ss(load_u16(blk));
}

// A block's 32 weights as signed int8 (exact: d w stays the value the block encodes).
template <Blocks kB>
ALLOY_TARGET_AVX2 inline __m256i block_int8(const uint8_t* blk) {
    if constexpr (kB == Blocks::Q8_0) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    } else {
        constexpr int kCodes = kB == Blocks::MXFP4 ? 1 : 2;
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kCodes));
        const __m256i n = _mm256_and_si256(_mm256_setr_m128i(q, _mm_srli_epi16(q, 4)), _mm256_set1_epi8(0x0F));
        if constexpr (kB == Blocks::Q4_0) return _mm256_sub_epi8(n, _mm256_set1_epi8(8));
        const int8_t* values = kB == Blocks::MXFP4 ? kMxfp4Values : kIq4nlValues;
        const __m256i book = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
        return _mm256_shuffle_epi8(book, n);
    }
}

// The decode GEMVs keep rows in lanes: lane s (s < NS, NS in {1, 2, 4}; the other lanes repeat
// them) of an xmm belongs to row s, so a block's step is one fma for NS rows, the same
// y = fma(float(isum), d_w * d_x, y) per (row, token) as the GEMM tiles' lanes.
// row_sums: lane s = the exact sum of dp[s]'s 8 int32 lanes (a block's integer dot product).
template <int NS>
ALLOY_TARGET_AVX2 inline __m128i row_sums(const __m256i* dp) {
    static_assert(NS == 1 || NS == 2 || NS == 4);
    __m256i h;
    if constexpr (NS == 4) {
        h = _mm256_hadd_epi32(_mm256_hadd_epi32(dp[0], dp[1]), _mm256_hadd_epi32(dp[2], dp[3]));
    } else {
        h = _mm256_hadd_epi32(dp[0], dp[NS - 1]);
        h = _mm256_hadd_epi32(h, h);
    }
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
// row_lanes: lane s = v[s], in row_sums' lane order.
template <int NS>
ALLOY_TARGET_AVX2 inline __m128 row_lanes(const float* v) {
    if constexpr (NS == 4) return _mm_setr_ps(v[0], v[1], v[2], v[3]);
    else if constexpr (NS == 2) return _mm_setr_ps(v[0], v[1], v[0], v[1]);
    else return _mm_set1_ps(v[0]);
}

}  // namespace alloy::cpu::mm
