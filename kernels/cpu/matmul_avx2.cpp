// AVX2 + FMA row-dot kernels (the fallback for CPUs without AVX-512 VNNI / BF16).
// One weight row is loaded once and dotted with up to 4 tokens.
//  - Q8_0: one block per ymm. vpmaddubsw needs an unsigned operand, so the sign of each weight
//    byte moves onto the activation (|w| x sign(w)*x, ggml's trick; no int16 overflow since
//    2 * 128 * 127 < 32768), then vpmaddwd with ones gives 8 exact int32 partial sums.
//  - BF16 / F16 / F32: weights widened to fp32, FMA with fp32 (bf16-rounded for BF16) x.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx2.h"


namespace alloy::cpu::mm {
namespace {


using avx2::hsum;

// One block's contribution for NT tokens: acc[t] += (exact block sum) * d_w * d_x.
template <int NT>
ALLOY_TARGET_AVX2 inline void q8_block(const uint8_t* w, const ActRows& a, int64_t t0, int64_t nb, int64_t b,
                                       __m256* acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m256i aw = _mm256_abs_epi8(wq);
    const float dw = _cvtsh_ss(load_u16(w));
    for (int t = 0; t < NT; ++t) {
        const int64_t tt = t0 + t;
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + tt * a.K + b * kQ8));
        const __m256i s16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, wq));
        const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
        acc[t] = _mm256_fmadd_ps(s, _mm256_set1_ps(dw * a.d[tt * nb + b]), acc[t]);
    }
}

// Even and odd blocks in two accumulators per token (independent FMA chains), as float_row.
template <int NT>
ALLOY_TARGET_AVX2 void q8_row(const uint8_t* w, const ActRows& a, int64_t t0, float* out) {
    const int64_t nb = a.K / kQ8;
    __m256 acc[NT], acc2[NT];
    for (auto& v : acc) v = _mm256_setzero_ps();
    for (auto& v : acc2) v = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, w += 68) {
        q8_block<NT>(w, a, t0, nb, b, acc);
        q8_block<NT>(w + 34, a, t0, nb, b + 1, acc2);
    }
    if (b < nb) q8_block<NT>(w, a, t0, nb, b, acc);
    for (int t = 0; t < NT; ++t) out[t] = hsum(_mm256_add_ps(acc[t], acc2[t]));
}

enum class Kind { Bf16, F16, F32 };

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

// Two accumulators per token (even and odd 8-element chunks): with one, every FMA waited for
// the previous one (4 cycles per 8 weights), which held BF16 decode to half the bandwidth
// floor. The same arithmetic for every NT, so 1..4-token calls give the same bits.
template <Kind kind, int NT>
ALLOY_TARGET_AVX2 void float_row(const uint8_t* w, const ActRows& a, int64_t t0, float* out) {
    const int64_t K = a.K;
    __m256 acc[NT], acc2[NT];
    for (auto& v : acc) v = _mm256_setzero_ps();
    for (auto& v : acc2) v = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256 wv = widen8<kind>(w, k), wv2 = widen8<kind>(w, k + 8);
        for (int t = 0; t < NT; ++t) {
            acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.f + (t0 + t) * K + k), acc[t]);
            acc2[t] = _mm256_fmadd_ps(wv2, _mm256_loadu_ps(a.f + (t0 + t) * K + k + 8), acc2[t]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        const __m256 wv = widen8<kind>(w, k);
        for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.f + (t0 + t) * K + k), acc[t]);
    }
    for (int t = 0; t < NT; ++t) {
        float s = hsum(_mm256_add_ps(acc[t], acc2[t]));
        for (int64_t j = k; j < K; ++j) s += widen1<kind>(w, j) * a.f[(t0 + t) * K + j];
        out[t] = s;
    }
}

template <class Row>
void rows_loop(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y, int64_t ldy,
               Row row) {
    float out[kRowDotTokens];
    for (int i = 0; i < nr; ++i) {
        row(W.row(r0 + i), a, t0, nt, out);
        for (int t = 0; t < nt; ++t) y[(t0 + t) * ldy + r0 + i] = out[t];
    }
}

void q8_rowdot(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y,
               int64_t ldy) {
    rows_loop(W, r0, nr, a, t0, nt, y, ldy, [](const uint8_t* w, const ActRows& a, int64_t t0, int nt, float* o) {
        switch (nt) {
            case 1: return q8_row<1>(w, a, t0, o);
            case 2: return q8_row<2>(w, a, t0, o);
            case 3: return q8_row<3>(w, a, t0, o);
            default: return q8_row<4>(w, a, t0, o);
        }
    });
}

template <Kind kind>
void float_rowdot(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y,
                  int64_t ldy) {
    rows_loop(W, r0, nr, a, t0, nt, y, ldy, [](const uint8_t* w, const ActRows& a, int64_t t0, int nt, float* o) {
        switch (nt) {
            case 1: return float_row<kind, 1>(w, a, t0, o);
            case 2: return float_row<kind, 2>(w, a, t0, o);
            case 3: return float_row<kind, 3>(w, a, t0, o);
            default: return float_row<kind, 4>(w, a, t0, o);
        }
    });
}

}  // namespace

RowKernel rowdot_avx2(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return {q8_rowdot, 4};
        case GgmlType::BF16: return {float_rowdot<Kind::Bf16>, 4};
        case GgmlType::F16: return {float_rowdot<Kind::F16>, 4};
        case GgmlType::F32: return {float_rowdot<Kind::F32>, 4};
        default: return {};
    }
}

}  // namespace alloy::cpu::mm
