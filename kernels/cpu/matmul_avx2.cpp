// AVX2 + FMA row-dot kernels and decode GEMVs (the fallback for CPUs without AVX-512 VNNI /
// BF16). A weight row is loaded once and dotted with up to 4 tokens; the GEMVs stream two
// rows at once.
//  - Q8_0: one block per ymm. vpmaddubsw needs an unsigned operand, so the sign of each weight
//    byte moves onto the activation (|w| x sign(w)*x, ggml's trick; no int16 overflow since
//    2 * 128 * 127 < 32768), then vpmaddwd with ones gives 8 exact int32 partial sums.
//  - BF16: weights widened to fp32, FMA with bf16-rounded fp32 x, 8 lanes over k.
//  - F16 / F32: rows in lanes (float_cols), summed in the GEMM tile's order.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_int8_blocks.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx2.h"

namespace alloy::cpu::mm {
namespace {

using avx2::hsum;

// Rows streamed side by side per thread by the decode GEMVs. One stream (row-dot over the
// guided items) left AVX2 decode at 75-81% of the bandwidth floor.
constexpr int kGemvStreams = 2;

// Rows w[0..NS) x NT tokens into out[s * NT + t], rows in lanes (row_sums): per (row, token)
// y = fma(float(isum_b), d_w * d_x, y) over the blocks b in order from 0, the Q8_0 GEMM
// tiles' chain (matmul_q8_avx2.cpp, matmul_q8_avx512.cpp), so every grouping of rows and
// tokens, and the GEMM, give the same bits. Q4_0, IQ4_NL and MXFP4 weights take the same
// arithmetic once unpacked (ggml's vec_dot_q4_0_q8_0 / vec_dot_iq4_nl_q8_0 on Q8_0 activations).
template <Blocks kB, int NS, int NT>
ALLOY_TARGET_AVX2 void q8_rows(const uint8_t* const* w, const ActRows& a, int64_t t0, float* out) {
    const int64_t nb = a.K / kQ8;
    const __m256i ones = _mm256_set1_epi16(1);
    __m128 acc[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) acc[t] = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m256i wq[NS];
        float dw[NS];
#pragma GCC unroll 4
        for (int s = 0; s < NS; ++s) {
            const uint8_t* blk = w[s] + b * block_bytes<kB>();
            wq[s] = block_int8<kB>(blk);
            dw[s] = block_scale<kB>(blk);
        }
        const __m128 dw4 = row_lanes<NS>(dw);
        // Tokens outer, rows inner: NS + NS + NT registers (|w| is recomputed per token, one
        // instruction, rather than held: 4 rows x 4 tokens would not fit the 16 ymm).
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * a.K + b * kQ8));
            __m256i dp[NS];
#pragma GCC unroll 4
            for (int s = 0; s < NS; ++s)
                dp[s] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wq[s]), _mm256_sign_epi8(x, wq[s])), ones);
            acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(row_sums<NS>(dp)), _mm_mul_ps(dw4, _mm_set1_ps(a.d[(t0 + t) * nb + b])),
                                  acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
        float lanes[4];
        _mm_storeu_ps(lanes, acc[t]);
        for (int s = 0; s < NS; ++s) out[s * NT + t] = lanes[s];
    }
}

enum class Kind { Q8, Q4_0, Iq4Nl, Mxfp4, Bf16, F16, F32 };  // weight row formats

template <Kind kind>
ALLOY_TARGET_AVX2 inline __m256 widen8(const uint8_t* w, int64_t k) {
    if constexpr (kind == Kind::Bf16) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else if constexpr (kind == Kind::F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k)));
    } else {
        return _mm256_loadu_ps(reinterpret_cast<const float*>(w + 4 * k));
    }
}

template <Kind kind>
ALLOY_TARGET_AVX2 inline float widen1(const uint8_t* w, int64_t k) {
    if constexpr (kind == Kind::Bf16) {
        const uint32_t u = uint32_t(load_u16(w + 2 * k)) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    } else if constexpr (kind == Kind::F16) {
        return _cvtsh_ss(load_u16(w + 2 * k));
    } else {
        float f;
        std::memcpy(&f, w + 4 * k, 4);
        return f;
    }
}

// Rows w[0..NS) x NT tokens into out[s * NT + t]. Two accumulators per output (even and odd
// 8-element chunks): with one, every FMA waited for the previous one (4 cycles per 8
// weights), which held BF16 decode to half the bandwidth floor. The same arithmetic for every
// NS and NT, so 1..4-token calls give the same bits.
template <Kind kind, int NS, int NT>
ALLOY_TARGET_AVX2 void float_rows(const uint8_t* const* w, const ActRows& a, int64_t t0, float* out) {
    const int64_t K = a.K;
    __m256 acc[NS * NT], acc2[NS * NT];
#pragma GCC unroll 8
    for (int i = 0; i < NS * NT; ++i) acc[i] = acc2[i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 x[NT], x2[NT];
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            x[t] = _mm256_loadu_ps(a.f + (t0 + t) * K + k);
            x2[t] = _mm256_loadu_ps(a.f + (t0 + t) * K + k + 8);
        }
#pragma GCC unroll 4
        for (int s = 0; s < NS; ++s) {
            const __m256 wv = widen8<kind>(w[s], k), wv2 = widen8<kind>(w[s], k + 8);
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                acc[s * NT + t] = _mm256_fmadd_ps(wv, x[t], acc[s * NT + t]);
                acc2[s * NT + t] = _mm256_fmadd_ps(wv2, x2[t], acc2[s * NT + t]);
            }
        }
    }
    for (; k + 8 <= K; k += 8)
        for (int s = 0; s < NS; ++s) {
            const __m256 wv = widen8<kind>(w[s], k);
            for (int t = 0; t < NT; ++t)
                acc[s * NT + t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.f + (t0 + t) * K + k), acc[s * NT + t]);
        }
    for (int s = 0; s < NS; ++s)
        for (int t = 0; t < NT; ++t) {
            float sum = hsum(_mm256_add_ps(acc[s * NT + t], acc2[s * NT + t]));
            for (int64_t j = k; j < K; ++j) sum += widen1<kind>(w[s], j) * a.f[(t0 + t) * K + j];
            out[s * NT + t] = sum;
        }
}

// Rows rows[0..NS) of W, tokens [t0, t0 + NT), into y.
template <Kind kind, int NS, int NT>
void rows_to_y(const WeightView& W, const int64_t* rows, const ActRows& a, int64_t t0, float* y, int64_t ldy) {
    const uint8_t* w[NS];
    float out[NS * NT];
    for (int s = 0; s < NS; ++s) w[s] = W.row(rows[s]);
    if constexpr (kind == Kind::Q8)
        q8_rows<Blocks::Q8_0, NS, NT>(w, a, t0, out);
    else if constexpr (kind == Kind::Q4_0)
        q8_rows<Blocks::Q4_0, NS, NT>(w, a, t0, out);
    else if constexpr (kind == Kind::Iq4Nl)
        q8_rows<Blocks::IQ4_NL, NS, NT>(w, a, t0, out);
    else if constexpr (kind == Kind::Mxfp4)
        q8_rows<Blocks::MXFP4, NS, NT>(w, a, t0, out);
    else
        float_rows<kind, NS, NT>(w, a, t0, out);
    for (int s = 0; s < NS; ++s)
        for (int t = 0; t < NT; ++t) y[(t0 + t) * ldy + rows[s]] = out[s * NT + t];
}

// f.template operator()<NT>() for the token count nt in 1..4 (the kernels' NT is compile-time).
template <class F>
void with_tokens(int nt, F&& f) {
    switch (nt) {
        case 1: return f.template operator()<1>();
        case 2: return f.template operator()<2>();
        case 3: return f.template operator()<3>();
        default: return f.template operator()<4>();
    }
}

// F32 and F16 row-dot: 8 adjacent rows per call, one row per ymm lane, as the AVX-512 row-dot
// does with 16. Each step widens 8 elements of each of the 8 rows, transposes them (col[j] =
// element kb + j of the 8 rows) and meets a broadcast activation element. Per output this is
// exactly the AVX2 F32 tile's arithmetic (matmul_float_avx2.cpp) with rows and tokens
// swapped: acc = fma(w, x, acc) sequentially over k inside chunks of kF32KcAvx2, chunk sums
// added in order from zero. So decode, verification and prefill (the tile, T > 4; F16 runs it
// on an exact fp32 copy) give every token's row the same bits, which the last-layer row
// pruning and the model's verification tests need. (float_rows' horizontal sums do not.)
constexpr int kColRows = 8;

template <Kind kind>
ALLOY_TARGET_AVX2 inline __m256 widen_n(const uint8_t* w, int64_t k, int64_t n) {
    if (n == 8) return widen8<kind>(w, k);
    alignas(32) float tmp[8] = {};
    for (int64_t j = 0; j < n; ++j) tmp[j] = widen1<kind>(w, k + j);
    return _mm256_load_ps(tmp);
}

template <Kind kind, int NT>
ALLOY_TARGET_AVX2 void float_cols(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, float* y,
                                  int64_t ldy) {
    constexpr int kPrefetchBytes = 1024;
    const int64_t K = W.n_in;
    const uint8_t* rows[kColRows];
    for (int r = 0; r < kColRows; ++r) rows[r] = W.row(r0 + std::min(r, nr - 1));  // extra lanes: never stored
    __m256 total[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) total[t] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += kF32KcAvx2) {
        const int64_t k1 = std::min<int64_t>(K, k0 + kF32KcAvx2);
        __m256 acc[NT];
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
        for (int64_t kb = k0; kb < k1; kb += 8) {
            const int64_t n = std::min<int64_t>(8, k1 - kb);
            __m256 w[kColRows], col[kColRows];
#pragma GCC unroll 8
            for (int r = 0; r < kColRows; ++r) {
                _mm_prefetch(reinterpret_cast<const char*>(rows[r]) + (kind == Kind::F16 ? 2 : 4) * kb + kPrefetchBytes,
                             _MM_HINT_T0);
                w[r] = widen_n<kind>(rows[r], kb, n);
            }
            avx2::transpose8(w, col);
#pragma GCC unroll 4
            for (int t = 0; t < NT; ++t) {
                const float* x = a.f + (t0 + t) * K + kb;
                if (n == 8) {
#pragma GCC unroll 8
                    for (int j = 0; j < 8; ++j) acc[t] = _mm256_fmadd_ps(col[j], _mm256_broadcast_ss(x + j), acc[t]);
                } else {
                    for (int j = 0; j < n; ++j) acc[t] = _mm256_fmadd_ps(col[j], _mm256_broadcast_ss(x + j), acc[t]);
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) total[t] = _mm256_add_ps(total[t], acc[t]);
    }
    for (int t = 0; t < NT; ++t) {
        alignas(32) float out[8];
        _mm256_store_ps(out, total[t]);
        for (int r = 0; r < nr; ++r) y[(t0 + t) * ldy + r0 + r] = out[r];
    }
}

// Row-dot contract (matmul_kernels.h) for F32/F16: nr <= kColRows neighbouring rows at once.
template <Kind kind>
void colrowdot(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y, int64_t ldy) {
    with_tokens(nt, [&]<int NT>() { float_cols<kind, NT>(W, r0, nr, a, t0, y, ldy); });
}


// Row-dot contract (matmul_kernels.h): nr <= 4 neighbouring rows, one at a time.
template <Kind kind>
void rowdot(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y, int64_t ldy) {
    with_tokens(nt, [&]<int NT>() {
        for (int64_t r = r0; r < r0 + nr; ++r) rows_to_y<kind, 1, NT>(W, &r, a, t0, y, ldy);
    });
}

// Decode GEMV contract (matmul_kernels.h): a long row range, kGemvStreams rows from distant
// parts of it streamed side by side (matmul_gemv_rows.h) for 1 and 2 tokens; 3 and 4
// (verification) keep one row at a time, their accumulators filling the 16 registers.
template <Kind kind>
void gemv(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y, int64_t ldy) {
    with_tokens(nt, [&]<int NT>() {
        // Q8_0-like rows fill an xmm's 4 lanes (q8_rows: one reduction and one FMA per 4 rows).
        constexpr bool int8_rows = kind == Kind::Q8 || kind == Kind::Q4_0 || kind == Kind::Iq4Nl || kind == Kind::Mxfp4;
        constexpr int NS = int8_rows ? 4 : NT <= 2 ? kGemvStreams : 1;
        stream_rows<NS>(
            r0, nr, [&](const int64_t* rows) { rows_to_y<kind, NS, NT>(W, rows, a, t0, y, ldy); },
            [&](const int64_t* row) { rows_to_y<kind, 1, NT>(W, row, a, t0, y, ldy); });
    });
}

}  // namespace

RowKernel rowdot_avx2(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return {rowdot<Kind::Q8>, 4};
        case GgmlType::BF16: return {rowdot<Kind::Bf16>, 4};
        case GgmlType::F16: return {colrowdot<Kind::F16>, kColRows};
        case GgmlType::F32: return {colrowdot<Kind::F32>, kColRows};
        default: return {};
    }
}

GemvFn gemv_avx2(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return gemv<Kind::Q8>;
        case GgmlType::Q4_0: return gemv<Kind::Q4_0>;
        case GgmlType::IQ4_NL: return gemv<Kind::Iq4Nl>;
        case GgmlType::MXFP4: return gemv<Kind::Mxfp4>;
        case GgmlType::BF16: return gemv<Kind::Bf16>;
        default: return nullptr;  // F32/F16 decode runs the row-dot (float_cols): the tile's order

    }
}

}  // namespace alloy::cpu::mm
