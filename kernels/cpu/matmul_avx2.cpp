// AVX2 + FMA row-dot kernels and decode GEMVs (the fallback for CPUs without AVX-512 VNNI /
// BF16). A weight row is loaded once and dotted with up to 4 tokens; the GEMVs stream two
// rows at once.
//  - Q8_0: one block per ymm. vpmaddubsw needs an unsigned operand, so the sign of each weight
//    byte moves onto the activation (|w| x sign(w)*x, ggml's trick; no int16 overflow since
//    2 * 128 * 127 < 32768), then vpmaddwd with ones gives 8 exact int32 partial sums.
//  - BF16 / F16 / F32: weights widened to fp32, FMA with fp32 (bf16-rounded for BF16) x.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx2.h"

namespace alloy::cpu::mm {
namespace {

using avx2::hsum;

// Rows streamed side by side per thread by the decode GEMVs. One stream (row-dot over the
// guided items) left AVX2 decode at 75-81% of the bandwidth floor.
constexpr int kGemvStreams = 2;

// One block's contribution for NS rows and NT tokens: acc[s * NT + t] += (exact block sum)
// * d_w * d_x. Flat accumulator arrays: GCC 12 keeps 2-D vector arrays in memory.
template <int NS, int NT>
ALLOY_TARGET_AVX2 inline void q8_block(const uint8_t* const* w, const ActRows& a, int64_t t0, int64_t nb, int64_t b,
                                       __m256* acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i x[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
        x[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + (t0 + t) * a.K + b * kQ8));
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) {
        const uint8_t* blk = w[s] + b * 34;
        const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        const __m256i aw = _mm256_abs_epi8(wq);
        const float dw = _cvtsh_ss(load_u16(blk));
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
            const __m256i s16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[t], wq));
            const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
            acc[s * NT + t] =
                _mm256_fmadd_ps(sum, _mm256_set1_ps(dw * a.d[(t0 + t) * nb + b]), acc[s * NT + t]);
        }
    }
}

// Rows w[0..NS) x NT tokens into out[s * NT + t]. Even and odd blocks in two accumulators
// per output (independent FMA chains), as float_rows. The arithmetic per output does not
// depend on NS or NT: every grouping gives the same bits.
template <int NS, int NT>
ALLOY_TARGET_AVX2 void q8_rows(const uint8_t* const* w, const ActRows& a, int64_t t0, float* out) {
    const int64_t nb = a.K / kQ8;
    __m256 acc[NS * NT], acc2[NS * NT];
#pragma GCC unroll 8
    for (int i = 0; i < NS * NT; ++i) acc[i] = acc2[i] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        q8_block<NS, NT>(w, a, t0, nb, b, acc);
        q8_block<NS, NT>(w, a, t0, nb, b + 1, acc2);
    }
    if (b < nb) q8_block<NS, NT>(w, a, t0, nb, b, acc);
#pragma GCC unroll 8
    for (int i = 0; i < NS * NT; ++i) out[i] = hsum(_mm256_add_ps(acc[i], acc2[i]));
}

enum class Kind { Q8, Bf16, F16, F32 };  // weight row formats

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
        q8_rows<NS, NT>(w, a, t0, out);
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
        constexpr int NS = NT <= 2 ? kGemvStreams : 1;
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
        case GgmlType::F16: return {rowdot<Kind::F16>, 4};
        case GgmlType::F32: return {rowdot<Kind::F32>, 4};
        default: return {};
    }
}

GemvFn gemv_avx2(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return gemv<Kind::Q8>;
        case GgmlType::BF16: return gemv<Kind::Bf16>;
        case GgmlType::F16: return gemv<Kind::F16>;
        case GgmlType::F32: return gemv<Kind::F32>;
        default: return nullptr;
    }
}

}  // namespace alloy::cpu::mm
