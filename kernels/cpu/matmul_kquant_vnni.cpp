// K-quant decode GEMVs with AVX512-VNNI on 256-bit vectors: matmul_kquant_rows.inc with one
// vpdpwssd for each vpmaddwd + vpaddd of the AVX2 file (the same integers, so the same bits).
// Zen 4 runs 512-bit integer ops as two 256-bit halves, so wider vectors would not move more
// bytes per cycle; the fused multiply-add cuts the instruction count of the per-token part.
// GCC 12's AVX-512 intrinsic headers use _mm512_undefined_* internally and trip these warnings.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/gemv_prefetch.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_kquant.h"

#define KQ_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define KQ_DPWSSD(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))

namespace alloy::cpu::mm {
namespace {
#include "kernels/cpu/matmul_kquant_rows.inc"

#define KQ_ZMM_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// 16 int8 at p sign-extended to 16 int32 lanes.
KQ_ZMM_TARGET inline __m512i r16_i8x16(const uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 16 bytes at p zero-extended to 16 int32 lanes.
KQ_ZMM_TARGET inline __m512i r16_bytes16(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// r16_sum8 (matmul_kquant_rows.inc) on 512 bits.
KQ_ZMM_TARGET inline __m512 r16_sum8_zmm(const __m512* A) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(A[0], A[4]), _mm512_add_ps(A[2], A[6])),
                         _mm512_add_ps(_mm512_add_ps(A[1], A[5]), _mm512_add_ps(A[3], A[7])));
}

// q5_bit4 (matmul_kquant_rows.inc) on 512 bits.
KQ_ZMM_TARGET inline __m512i q5_bit4_zmm(__m512i v, int bit) {
    return _mm512_and_si512(bit <= 4 ? _mm512_slli_epi16(v, 4 - bit) : _mm512_srli_epi16(v, bit - 4), _mm512_set1_epi8(0x10));
}

// The 16 rows' Q4_K scales from the group's three scale dwords (v: dword 0 of the rows, v + 64
// dword 1, v + 128 dword 2; matmul_kquant.h), a row per lane: sc[j] = scale j (int32), mp[k] =
// the min pair (m_2k, m_2k+1) as int16 halves (q4k_r16_half_scales's packing notes, on 512 bits).
KQ_ZMM_TARGET inline void q4k_r16_scales_zmm(const uint8_t* v, __m512i* sc, __m512i* mp) {
    const __m512i v0 = _mm512_loadu_si512(v), v1 = _mm512_loadu_si512(v + 64), v2 = _mm512_loadu_si512(v + 128);
    const __m512i c63 = _mm512_set1_epi32(63), c0f = _mm512_set1_epi32(15), c3f = _mm512_set1_epi32(0x003F003F),
                  c30 = _mm512_set1_epi32(0x00300030);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
        const __m512i b = _mm512_srli_epi32(v0, 8 * j);
        sc[j] = _mm512_and_si512(b, c63);
        // (byte j + 8 & 15) | (byte j >> 6) << 4: bits 0-3 from dword 2, bits 4-5 from b >> 2.
        sc[j + 4] = _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(v2, 8 * j), _mm512_srli_epi32(b, 2), c0f, 0xE4), c63);
    }
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
        const __m512i pick = _mm512_broadcast_i32x4(_mm_add_epi8(_mm_set1_epi32(int32_t(0x80008000u | uint32_t(2 * k + 1) << 16 | uint32_t(2 * k))),
                                                                 _mm_setr_epi32(0, 0x00040004, 0x00080008, 0x000C000C)));
        const __m512i b = _mm512_shuffle_epi8(v1, pick);  // bytes 4 + 2k, 5 + 2k of the scales
        mp[k] = _mm512_and_si512(b, c3f);
        // (byte 8 + 2k >> 4) | ((byte 4 + 2k >> 2) & 0x30), both int16 halves.
        mp[k + 2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(_mm512_shuffle_epi8(v2, pick), 4), _mm512_srli_epi16(b, 2), c30, 0xF8);
    }
}

// q4k_r16_group on all 16 rows of a group in 512-bit vectors (lane r = row r). Per nibble group
// g, the 8 quads of sub-block 2g (low nibbles) and of 2g + 1 (high) are summed by vpdpbusd in
// int32 (a sub-block's dot: |.| <= 32 * 31 * 127), then scaled once by vpmulld: half the VNNI
// work of a vpdpwssd per quad. The integers (sumi, summ) are matmul_kquant.cpp's, so the fp32
// steps (one FMA each a super-block) give its bits. Into out[t * 16 + row]. kQ5: Q5_K.
// A Q5_K code vector's low and high 5-bit values: the nibble, the fifth bit (bit 2g / 2g + 1 of
// the quad's qh byte) at bit 4. Q5BitsBw shifts and masks (9 operations), Q5BitsGfni moves the
// bits with GF(2) affine maps (vgf2p8affineqb: any bit of a byte to any other, the rest zero)
// and one vpternlogd (5 operations).
struct Q5BitsBw {
    __m512i m4;
    KQ_ZMM_TARGET Q5BitsBw() : m4(_mm512_set1_epi8(0x0F)) {}
    KQ_ZMM_TARGET void operator()(__m512i q4, __m512i qh, int g, __m512i& lo, __m512i& hi) const {
        lo = _mm512_or_si512(_mm512_and_si512(q4, m4), q5_bit4_zmm(qh, 2 * g));
        hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q4, 4), m4), q5_bit4_zmm(qh, 2 * g + 1));
    }
};
#define KQ_ZMM_GFNI_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")))
// vgf2p8affineqb's matrix: result bit i = parity(byte 7 - i of the matrix AND the source byte).
constexpr uint64_t gf2_bit_to_4(int k) { return uint64_t(1) << k << 24; }  // source bit k -> bit 4
constexpr uint64_t kGf2HighNibble = 0x10ull << 56 | 0x20ull << 48 | 0x40ull << 40 | 0x80ull << 32;  // bits 4-7 -> 0-3
struct Q5BitsGfni {
    __m512i m4, nib, bit[8];
    KQ_ZMM_GFNI_TARGET Q5BitsGfni() : m4(_mm512_set1_epi8(0x0F)), nib(_mm512_set1_epi64(int64_t(kGf2HighNibble))) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) bit[k] = _mm512_set1_epi64(int64_t(gf2_bit_to_4(k)));
    }
    KQ_ZMM_GFNI_TARGET void operator()(__m512i q4, __m512i qh, int g, __m512i& lo, __m512i& hi) const {
        // lo = (q4 & 0x0F) | bit 2g at 4: vpternlogd (A & C) | B, B clean outside bit 4.
        lo = _mm512_ternarylogic_epi32(q4, _mm512_gf2p8affine_epi64_epi8(qh, bit[2 * g], 0), m4, 0xEC);
        hi = _mm512_or_si512(_mm512_gf2p8affine_epi64_epi8(q4, nib, 0), _mm512_gf2p8affine_epi64_epi8(qh, bit[2 * g + 1], 0));
    }
};
#define KQ_Q4_GROUP q4k_r16_group_zmm
#define KQ_Q4_TARGET KQ_ZMM_TARGET
#define KQ_Q5_BITS Q5BitsBw
#include "kernels/cpu/matmul_kquant_q4_zmm.inc"
#undef KQ_Q4_GROUP
#undef KQ_Q4_TARGET
#undef KQ_Q5_BITS
#define KQ_Q4_GROUP q4k_r16_group_zmm_gfni
#define KQ_Q4_TARGET KQ_ZMM_GFNI_TARGET
#define KQ_Q5_BITS Q5BitsGfni
#include "kernels/cpu/matmul_kquant_q4_zmm.inc"
#undef KQ_Q4_GROUP
#undef KQ_Q4_TARGET
#undef KQ_Q5_BITS

// Per byte: bits 0-3 of lo, bits 4-7 of hi (vpternlogd with imm (A & C) | (B & ~C), C = 0x0F).
KQ_ZMM_TARGET inline __m512i nibble_select(__m512i lo, __m512i hi) {
    return _mm512_ternarylogic_epi32(lo, hi, _mm512_set1_epi8(0x0F), 0xE4);
}

// q6k_r16_group on all 16 rows of a group in 512-bit vectors: per quad i, group g, one vpdpbusd
// of the 16 rows' 6-bit codes against the token's 4 activation bytes (|dot| <= 4 * 63 * 128,
// an int16), then one vpdpwssd by the scale (sign-extended to 16 bits, the high half 0). The
// same integers and fp32 steps as q6k_r16_group: the same bits. Into out[t * 16 + row].
template <int NT>
KQ_ZMM_TARGET void q6k_r16_group_zmm(const uint8_t* grp, const ActRows& a, int64_t t0, float* out) {
    const int64_t K = a.K, nb = K / kQK;
    const int pf = gemv_prefetch_kquant_bytes();
    const __m512i m33 = _mm512_set1_epi8(0x33), mcc = _mm512_set1_epi8(char(0xCC)), lo16 = _mm512_set1_epi32(0xFFFF);
    __m512 acc[NT][8];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t)
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) acc[t][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = grp + b * kQ6KGroupBlock;
        gemv_prefetch(blk, kQ6KGroupBlock, pf);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
        const uint8_t* s8 = blk + 32;  // scale s of the 16 rows at s8 + 16 s
        __m512 dxd[NT];
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) dxd[t] = _mm512_mul_ps(_mm512_set1_ps(a.d[(t0 + t) * nb + b]), d);
#pragma GCC unroll 2
        for (int ih = 0; ih < 2; ++ih) {
            __m512i scv[8];  // group g's scale for quads 4 ih .. 4 ih + 3: 2g + ih, as (sc, 0) int16
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) scv[g] = _mm512_and_si512(r16_i8x16(s8 + 16 * (2 * g + ih)), lo16);
#pragma GCC unroll 4
            for (int ii = 0; ii < 4; ++ii) {
                const int i = 4 * ih + ii;
                __m512i s0[NT], s1[NT];
#pragma GCC unroll 4
                for (int t = 0; t < NT; ++t) s0[t] = s1[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
                for (int h = 0; h < 2; ++h) {
                    const uint8_t* c = blk + 288 + 192 * (2 * i + h);
                    const __m512i A = _mm512_loadu_si512(c), B = _mm512_loadu_si512(c + 64), Q = _mm512_loadu_si512(c + 128);
                    // q6 = low nibble | two high bits << 4, as one bitwise select a vector
                    // (vpternlogd: bits 0-3 of each byte from the nibble source, 4-7 from the
                    // high-bit source). Q's bits masked first (0x33 / 0xCC) so that what the
                    // select takes from them in bits 6-7 is zero, whatever the 16-bit shifts
                    // carry across bytes (those land in bits 0-3, taken from the nibble side).
                    const __m512i qa = _mm512_and_si512(Q, m33), qb = _mm512_and_si512(Q, mcc);
                    __m512i q6[4];
                    q6[0] = nibble_select(A, _mm512_slli_epi16(qa, 4));
                    q6[1] = nibble_select(B, _mm512_slli_epi16(qb, 2));
                    q6[2] = nibble_select(_mm512_srli_epi16(A, 4), qa);
                    q6[3] = nibble_select(_mm512_srli_epi16(B, 4), _mm512_srli_epi16(qb, 2));
#pragma GCC unroll 4
                    for (int k = 0; k < 4; ++k) {
                        const int g = 4 * h + k;
#pragma GCC unroll 4
                        for (int t = 0; t < NT; ++t) {
                            const int8_t* q8 = a.q + (t0 + t) * K + b * kQK + 32 * g + 4 * i;
                            const __m512i dq = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q6[k], _mm512_set1_epi32(load_i32(q8)));
                            __m512i& sk = k % 2 ? s1[t] : s0[t];
                            sk = _mm512_dpwssd_epi32(sk, dq, scv[g]);
                        }
                    }
                }
                const __m512i scp = _mm512_or_si512(_mm512_and_si512(r16_i8x16(s8 + 16 * (2 * i)), lo16),
                                                    _mm512_slli_epi32(r16_i8x16(s8 + 16 * (2 * i + 1)), 16));
#pragma GCC unroll 4
                for (int t = 0; t < NT; ++t) {
                    const int16_t* bs = a.bsums + (t0 + t) * (K / 16) + b * 16;
                    const __m512i corr = _mm512_slli_epi32(_mm512_madd_epi16(scp, _mm512_set1_epi32(load_i32(bs + 2 * i))), 5);
                    const __m512i sumi = _mm512_sub_epi32(_mm512_add_epi32(s0[t], s1[t]), corr);
                    acc[t][i] = _mm512_fmadd_ps(dxd[t], _mm512_cvtepi32_ps(sumi), acc[t][i]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
        const __m512* A = acc[t];
        _mm512_storeu_ps(out + t * 16, r16_sum8_zmm(A));
    }
}

// iq4xs_r16_group on all 16 rows of a group in 512-bit vectors (lane r = row r). A quad's dot
// can pass an int16 (|w|, |x| <= 127), so no vpdpbusd here: as iq4xs_rows, vpmaddubsw of |w|
// by x negated where w < 0 (AVX-512 has no vpsignb: a masked subtract), then one vpdpwssd by
// (ls - 32, ls - 32): the same integers and fp32 steps, the same bits. Into out[t * 16 + row].
// The code vectors' |w| and signs come from Iq4Codes: vpshufb of the codebook, then vpabsb and
// the sign bits (Iq4CodesBw), or, with AVX512-VBMI, one vpermb each from a 64-entry |codebook|
// (the index's bits 4-5 are don't-cares, so neither nibble needs a mask) and the sign from the
// index's bit 3 (the codebook's first 8 values are the negative ones): 11 operations a code
// vector at one token instead of 15.
struct Iq4CodesBw {
    __m512i m4, book;
    KQ_ZMM_TARGET Iq4CodesBw()
        : m4(_mm512_set1_epi8(0x0F)), book(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)))) {}
    KQ_ZMM_TARGET void operator()(__m512i c, __m512i& al, __m512i& au, __mmask64& nl, __mmask64& nu) const {
        const __m512i wl = _mm512_shuffle_epi8(book, _mm512_and_si512(c, m4));
        const __m512i wu = _mm512_shuffle_epi8(book, _mm512_and_si512(_mm512_srli_epi16(c, 4), m4));
        al = _mm512_abs_epi8(wl), au = _mm512_abs_epi8(wu);
        nl = _mm512_movepi8_mask(wl), nu = _mm512_movepi8_mask(wu);
    }
};
#define KQ_ZMM_VBMI_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))
static_assert(kIq4nlValues[7] < 0 && kIq4nlValues[8] > 0, "Iq4CodesVbmi: the sign is the index's bit 3");
// |codebook| four times over: vpermb's 64-entry table indexed by a code byte's low 6 bits.
struct Iq4Abs64 {
    alignas(64) int8_t v[64];
    constexpr Iq4Abs64() : v{} {
        for (int i = 0; i < 64; ++i) v[i] = int8_t(kIq4nlValues[i & 15] < 0 ? -kIq4nlValues[i & 15] : kIq4nlValues[i & 15]);
    }
};
inline constexpr Iq4Abs64 kIq4Abs64{};
struct Iq4CodesVbmi {
    __m512i abs64, b3, b7;
    KQ_ZMM_VBMI_TARGET Iq4CodesVbmi()
        : abs64(_mm512_load_si512(kIq4Abs64.v)), b3(_mm512_set1_epi8(0x08)), b7(_mm512_set1_epi8(char(0x80))) {}
    KQ_ZMM_VBMI_TARGET void operator()(__m512i c, __m512i& al, __m512i& au, __mmask64& nl, __mmask64& nu) const {
        al = _mm512_permutexvar_epi8(c, abs64);
        au = _mm512_permutexvar_epi8(_mm512_srli_epi16(c, 4), abs64);
        nl = _mm512_testn_epi8_mask(c, b3), nu = _mm512_testn_epi8_mask(c, b7);
    }
};

#define KQ_IQ4_GROUP iq4xs_r16_group_zmm
#define KQ_IQ4_TARGET KQ_ZMM_TARGET
#define KQ_IQ4_CODES Iq4CodesBw
#include "kernels/cpu/matmul_kquant_iq4_zmm.inc"
#undef KQ_IQ4_GROUP
#undef KQ_IQ4_TARGET
#undef KQ_IQ4_CODES
#define KQ_IQ4_GROUP iq4xs_r16_group_zmm_vbmi
#define KQ_IQ4_TARGET KQ_ZMM_VBMI_TARGET
#define KQ_IQ4_CODES Iq4CodesVbmi
#include "kernels/cpu/matmul_kquant_iq4_zmm.inc"
#undef KQ_IQ4_GROUP
#undef KQ_IQ4_TARGET
#undef KQ_IQ4_CODES

template <KqKind kind, int NT, bool kExt = false>
void kq_r16_rows_zmm(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, float* y,
                     int64_t ldy) {
    const int64_t full = W.n_out / kQ4KGroupRows * kQ4KGroupRows, end = r0 + nr;
    int64_t r = r0;
    for (; r < std::min(end, full); r = r - r % kQ4KGroupRows + kQ4KGroupRows) {
        const int64_t g0 = r - r % kQ4KGroupRows;
        float out[NT * 16];
        const uint8_t* grp = W.data + size_t(g0) * W.row_bytes;
        if constexpr (kind == KqKind::Q6) q6k_r16_group_zmm<NT>(grp, a, t0, out);
        else if constexpr (kind == KqKind::Iq4Xs && kExt) iq4xs_r16_group_zmm_vbmi<NT>(grp, a, t0, out);
        else if constexpr (kind == KqKind::Iq4Xs) iq4xs_r16_group_zmm<NT>(grp, a, t0, out);
        else if constexpr (kind == KqKind::Q5 && kExt) q4k_r16_group_zmm_gfni<true, NT>(grp, a, t0, out);
        else q4k_r16_group_zmm<kind == KqKind::Q5, NT>(grp, a, t0, out);
        const int64_t hi = std::min(end, g0 + 16);
        if (r == g0 && hi == g0 + 16 && NT == 1) {
            std::memcpy(y + t0 * ldy + g0, out, 16 * sizeof(float));
            continue;
        }
        for (int t = 0; t < NT; ++t)
            for (int64_t x = r; x < hi; ++x) y[(t0 + t) * ldy + x] = out[t * 16 + (x - g0)];
    }
    r = std::max(r, full);
    if (r < end) gemv<kind>(W, r, end - r, a, t0, NT, y, ldy);
}

template <KqKind kind, bool kExt = false>
void kq_r16_gemv_zmm_fn(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                        int64_t ldy) {
    switch (nt) {
        case 1: return kq_r16_rows_zmm<kind, 1, kExt>(W, r0, nr, a, t0, y, ldy);
        case 2: return kq_r16_rows_zmm<kind, 2, kExt>(W, r0, nr, a, t0, y, ldy);
        case 3: return kq_r16_rows_zmm<kind, 3, kExt>(W, r0, nr, a, t0, y, ldy);
        default: return kq_r16_rows_zmm<kind, 4, kExt>(W, r0, nr, a, t0, y, ldy);
    }
}

// ext: the kernel with the newer extension's code decoder (IQ4_XS: AVX512-VBMI; Q5_K: GFNI)
// where the CPU has it, else nullptr.
GemvFn kq_r16_zmm_for(GgmlType type, bool ext) {
    if (ext) {
        if (type == GgmlType::IQ4_XS && __builtin_cpu_supports("avx512vbmi")) return kq_r16_gemv_zmm_fn<KqKind::Iq4Xs, true>;
        if (type == GgmlType::Q5_K && __builtin_cpu_supports("gfni")) return kq_r16_gemv_zmm_fn<KqKind::Q5, true>;
        return nullptr;
    }
    switch (type) {
        case GgmlType::Q4_K: return kq_r16_gemv_zmm_fn<KqKind::Q4>;
        case GgmlType::Q5_K: return kq_r16_gemv_zmm_fn<KqKind::Q5>;
        case GgmlType::Q6_K: return kq_r16_gemv_zmm_fn<KqKind::Q6>;
        case GgmlType::IQ4_XS: return kq_r16_gemv_zmm_fn<KqKind::Iq4Xs>;
        default: return nullptr;
    }
}

}  // namespace

GemvFn kquant_gemv_vnni(GgmlType type) { return kq_gemv_for(type); }
GemvFn kq_r16_gemv_vnni(GgmlType type) { return kq_r16_for(type); }
GemvFn kq_r16_gemv_zmm(GgmlType type, bool ext) { return kq_r16_zmm_for(type, ext); }
GemvFn kq_r16_gemv_zmm(GgmlType type) {
    // IQ4_XS's VBMI and Q5_K's GFNI code decoders where the CPU has them (Zen 4, Ice Lake and
    // later; not Cascade Lake).
    const GemvFn v = kq_r16_zmm_for(type, true);
    return v ? v : kq_r16_zmm_for(type, false);
}

}  // namespace alloy::cpu::mm
