// K-quant weights x Q8_K activations (matmul_kquant.cpp): the quantizer and the decode GEMVs.
// Internal to kernels/cpu.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul_kernels.h"

namespace alloy::cpu::mm {

constexpr int kQK = 256;         // values per K-quant super-block (and per Q8_K block)
constexpr int kQ4KBytes = 144;   // f16 d, f16 dmin, 12 scale/min bytes, 128 nibble bytes
constexpr int kQ5KBytes = 176;   // as Q4_K, with 32 high-bit bytes before the nibbles
constexpr int kQ6KBytes = 210;   // 128 ql, 64 qh, 16 int8 scales, f16 d
constexpr int kIq4XsBytes = 136; // f16 d, u16 scales_h, 4 scales_l bytes, 128 index bytes

// The weight types whose kernels read Q8_K activations (the GEMVs below, the VNNI tiles, and
// the dequantizing prefill, which rounds its input through Q8_K to compute the same function).
inline bool uses_q8k(GgmlType t) {
    return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::IQ4_XS;
}

// One token row of K values (K % 256 == 0) as Q8_K: q [K], d [K/256], bsums [K/16].
// ggml's quantize_row_q8_K_ref bit for bit.
void quantize_q8k(const float* x, int64_t K, int8_t* q, float* d, int16_t* bsums);
// The same bits on a SIMD path where `isa` has one (AVX2 and AVX-512: the AVX2 version).
void quantize_q8k(Isa isa, const float* x, int64_t K, int8_t* q, float* d, int16_t* bsums);
void quantize_q8k_avx2(const float* x, int64_t K, int8_t* q, float* d, int16_t* bsums);

// x [K] -> its Q8_K values as fp32 (q * d): the activations the K-quant kernels see.
void q8k_round_row(const float* x, int64_t K, float* out);

// Q4_K's 12 packed bytes -> 8 sub-block scales and 8 mins (6 bits each).
void q4k_unpack_scales(const uint8_t* s12, uint8_t* sc, uint8_t* m);

// Decode GEMV (contract of GemvFn, activations in a.q / a.d / a.bsums as Q8_K) for a K-quant
// weight type on the best path up to `isa`; nullptr for types without one.
GemvFn kquant_gemv(GgmlType type, Isa isa);
GemvFn kquant_gemv_avx2(GgmlType type);  // matmul_kquant_avx2.cpp; nullptr if none
GemvFn kquant_gemv_vnni(GgmlType type);  // matmul_kquant_vnni.cpp (AVX512-VNNI, VL)

// Prefill GEMM tiles on the Q8K activation panel (same arithmetic, same bits): VNNI
// (matmul_kquant_avx512.cpp; fn == nullptr without AVX512-VNNI) and AVX2 (vpmaddubsw +
// vpmaddwd, matmul_kquant_tile_avx2.cpp); fn == nullptr for other types.
TileKernel kquant_tile_avx512(GgmlType type);
TileKernel kquant_tile_avx2(GgmlType type);

// The prefill tiles' shared pieces.
// IQ4_XS's codebook (format/quant.h kIq4nlValues) + 128 (1..241: unsigned, as vpdpbusd wants its
// first operand; the tiles take 128 times the activations' block sums off); the tiles look a
// block's codes up with vpshufb.
alignas(16) inline constexpr uint8_t kIq4Plus128[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
constexpr bool iq4_plus128_is_the_codebook() {
    for (int i = 0; i < 16; ++i)
        if (int(kIq4Plus128[i]) != int(kIq4nlValues[i]) + 128) return false;
    return true;
}
static_assert(iq4_plus128_is_the_codebook());
// Sub-block v (values 32 v .. 32 v + 31) of an IQ4_XS block as those bytes, in element order:
// its 16 index bytes' low nibbles, then the high ones, looked up with vpshufb (both tiles).
__attribute__((target("avx2"))) inline __m256i iq4xs_plus128_32(const uint8_t* blk, int v) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 8 + 16 * v));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Plus128))), idx);
}
// IQ4_XS's 8 sub-block scales (ls - 32, -32..31).
inline void iq4xs_scales(const uint8_t* blk, int8_t* sc) {
    const unsigned h = load_u16(blk + 2);
    for (int ib = 0; ib < 8; ++ib)
        sc[ib] = int8_t(int(((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((h >> (2 * ib)) & 3) << 4)) - 32);
}

// Q4_K's 12 scale bytes -> 8 scales then 8 mins as 16 uint8 (the 6-bit fields of spec/GGUF.md
// "Q4_K"; q4k_unpack_scales is the plain version). Reads 16 bytes from s12: the 4 past the
// scales are the block's first nibble bytes, loaded and ignored. In vector registers: the
// scalar unpack with its four GPR->vector inserts cost 11% of the Q4_K GEMV (Zen 4, in L2)
// and 8% of the AVX2 prefill tile (Zen 3). For the AVX2 and AVX-512 builds alike.
__attribute__((target("avx2"))) inline __m128i q4k_scales_mins(const uint8_t* s12) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s12));
    // A: bytes 0-3 | 8-11 | 4-7 | 8-11 (low fields); B: the bytes whose top 2 bits extend them.
    const __m128i A = _mm_shuffle_epi8(x, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i B = _mm_shuffle_epi8(x, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i As = _mm_blend_epi32(A, _mm_srli_epi16(A, 4), 0x8);  // mins 4-7 are the high nibbles
    const __m128i lo = _mm_and_si128(As, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi16(B, 2), _mm_set1_epi8(0x30)));  // (b >> 6) << 4
}

// Q4_K, Q5_K, Q6_K and IQ4_XS rows repacked at load (WeightLayout::KqRows16): each group of 16
// rows keeps the bytes of its 16 rows (16 * row_bytes, so a matrix repacks in place) as
// super-block-major blocks of 16 * the type's block bytes, where SIMD lanes are rows. Per
// super-block b:
// Q4_K (2304 bytes):
//   [0, 32)      the 16 rows' f16 d            [32, 64)  their f16 dmin
//   [64, 256)    the 12 scale bytes as three 64-byte vectors: dword v (bytes 4 v .. 4 v + 3) of
//                row r at 64 + 64 v + 4 r, so that a row's scales sit in its 32-bit lane and
//                vpshufb picks them (q4k_r16_half_scales)
//   [256, 2304)  the codes: for quad i (0..7), nibble group g (0..3): 64 bytes, row r's 4 bytes
//                at 256 + 64 (4 i + g) + 4 r = its bytes 16 + 32 g + 4 i .. + 3 in the GGUF block
// Q5_K (2816 bytes): [0, 256) as Q4_K; then for quad i (0..7) 320 bytes at 256 + 320 i: 64 of
//   the fifth bits (row r's qh[4 i .. 4 i + 3] at + 4 r), then for nibble group g 64 bytes at
//   + 64 + 64 g (row r's GGUF bytes 48 + 32 g + 4 i .. + 3 at + 4 r): a quad's bytes together.
// Q6_K (3360 bytes):
//   [0, 32)      the 16 rows' f16 d            [32, 288) the int8 scales, scale s of row r at 32 + 16 s + r
//   [288, 3360)  for quad i (0..7), half h (0..1): 192 bytes at 288 + 192 (2 i + h): 64 bytes of
//                ql[64 h + 4 i ..], 64 of ql[64 h + 32 + 4 i ..], 64 of qh[32 h + 4 i ..], 4 a row
// IQ4_XS (2176 bytes):
//   [0, 32)      the 16 rows' f16 d            [32, 64)  their u16 scales_h
//   [64, 128)    the 4 scales_l bytes, byte k of row r at 64 + 16 k + r
//   [128, 2176)  for quad j (0..3), sub-block s (0..7): 64 bytes at 128 + 64 (8 j + s), row r's
//                index bytes 8 + 16 s + 4 j .. + 3 (low nibbles: values 4 j .., high: 16 + 4 j ..)
// A last n_out % 16 rows stay as GGUF rows after the groups. The decode GEMVs read it with rows
// in lanes (no horizontal sums, scales unpacked once per 16 rows) and give the bits of the GGUF
// kernels (the same integer lane sums, the same fp32 steps); every other reader unpacks rows.
constexpr int kQ4KGroupRows = 16;
constexpr int kQ4KGroupBlock = kQ4KGroupRows * kQ4KBytes;      // 2304
constexpr int kQ5KGroupBlock = kQ4KGroupRows * kQ5KBytes;      // 2816
constexpr int kQ6KGroupBlock = kQ4KGroupRows * kQ6KBytes;      // 3360
constexpr int kIq4XsGroupBlock = kQ4KGroupRows * kIq4XsBytes;  // 2176
// Whether a weight type has the repacked layout.
inline bool kq_repacks(GgmlType t) {
    return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::IQ4_XS;
}
// 16 GGUF rows of type t and nb super-blocks (row r at src + r * nb * block bytes) -> one
// group's bytes in dst (t: a type kq_repacks takes).
void kq_repack_group(GgmlType t, const uint8_t* src, int64_t nb, uint8_t* dst);
// Row r (0..15) of a group of type t back to its GGUF bytes (nb blocks into out).
void kq_unpack_group_row(GgmlType t, const uint8_t* grp, int64_t nb, int r, uint8_t* out);
// All 16 rows of a group (row r's nb blocks at out + r * nb * block bytes): the same bytes;
// from AVX2 up by dword transposes (~4x the rows' speed: the prefill tiles' items unpack every
// weight byte once a call, 8% of a 0.8B Q4_K_M pp512 on the Intel Xeon row by row).
void kq_unpack_group(GgmlType t, const uint8_t* grp, int64_t nb, uint8_t* out, Isa isa);
// (A whole matrix: cpu::repack_weight, kernels/cpu/matmul.h.)
// Row r of W (GGUF or KqRows16 layout) as GGUF bytes: W.row(r) itself where it is one, else
// unpacked into buf (row_bytes).
const uint8_t* kq_gguf_row(const WeightView& W, int64_t r, uint8_t* buf);
// The decode GEMV of a KqRows16 matrix of type t (GemvFn's contract; any row range, groups cut
// by it computed whole) on the best path up to isa: the bits of kquant_gemv(t, isa) on the GGUF
// rows for the SIMD paths (the scalar one unpacks rows: its bits too).
GemvFn kq_r16_gemv(GgmlType t, Isa isa);
GemvFn kq_r16_gemv_avx2(GgmlType t);  // matmul_kquant_avx2.cpp
GemvFn kq_r16_gemv_vnni(GgmlType t);  // matmul_kquant_vnni.cpp (256-bit)
GemvFn kq_r16_gemv_zmm(GgmlType t);   // matmul_kquant_vnni.cpp: 16 rows in one zmm (AVX512-BW + VNNI)
// The same with (ext) or without the code decoder of a newer extension (IQ4_XS: AVX512-VBMI,
// Q5_K: GFNI; nullptr where the type has none or the CPU lacks it): kq_r16_gemv_zmm(t) takes it
// where it can; both for tests.
GemvFn kq_r16_gemv_zmm(GgmlType t, bool ext);

enum class KqKind { Q4, Q5, Q6, Iq4 };

// Values 32 v .. 32 v + 31 of a super-block's codes, one byte each in element order; both
// prefill tiles unpack a block's codes with it once a row. Q4_K / Q5_K: element 64 g + l is
// the low (l < 32) or high nibble of byte 32 g + (l & 31) of the codes, Q5_K with bit
// 2 g + (l >= 32) of qh[l & 31] as bit 4; Q6_K: element 128 h + 32 k + l is the low (k < 2) or
// high nibble of ql[64 h + 32 (k & 1) + l] with bits 2k, 2k + 1 of qh[32 h + l] as bits 4-5
// (spec/GGUF.md); IQ4_XS: its codebook values + 128. 16-bit shifts: the bits a shift carries
// across bytes are masked off.
template <KqKind kKind>
__attribute__((target("avx2"))) inline __m256i kq_code_vector(const uint8_t* blk, int v) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if constexpr (kKind == KqKind::Iq4) {
        return iq4xs_plus128_32(blk, v);
    } else if constexpr (kKind == KqKind::Q6) {
        const int h = v / 4, k = v % 4;
        const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (k & 1)));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
        const __m256i lo = _mm256_and_si256(k < 2 ? ql : _mm256_srli_epi16(ql, 4), m4);
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    } else {
        const int g = v / 2, upper = v % 2;
        const int qs = kKind == KqKind::Q5 ? 48 : 16;
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + qs + 32 * g));
        __m256i c = _mm256_and_si256(upper ? _mm256_srli_epi16(q, 4) : q, m4);
        if constexpr (kKind == KqKind::Q5) {
            const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
            const __m256i bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g + upper)), _mm256_set1_epi8(1));
            c = _mm256_or_si256(c, _mm256_slli_epi16(bit, 4));
        }
        return c;
    }
}


// The two int16 multipliers of bsums pair j (sub-blocks 2j, 2j + 1 of 16 values) in a tile's
// block-sum term, as one 32-bit lane (low half: 2j): Q6_K its scales sc_2j, sc_2j+1; Q4_K /
// Q5_K the min m_j of the 32 values twice; IQ4_XS the scale ls_j twice.
template <KqKind kKind>
inline int32_t kq_scale_pair(const int8_t* sc6, const uint8_t* mn, int j) {
    int a, b;
    if constexpr (kKind == KqKind::Q6) a = sc6[2 * j], b = sc6[2 * j + 1];
    else if constexpr (kKind == KqKind::Iq4) a = b = sc6[j];
    else a = b = mn[j];
    return int32_t(uint32_t(uint16_t(int16_t(a))) | uint32_t(uint16_t(int16_t(b))) << 16);
}

// What a prefill tile of R rows (from r0) reads: the weight rows and the Q8_K panel from group
// g0 (layout in matmul_kernels.h), the same for the VNNI and the AVX2 tiles.
template <KqKind kKind>
struct KqTileIn {
    static constexpr bool kQ6 = kKind == KqKind::Q6, kIq4 = kKind == KqKind::Iq4;
    static constexpr int kBytes = kQ6 ? kQ6KBytes : kIq4 ? kIq4XsBytes : kKind == KqKind::Q5 ? kQ5KBytes : kQ4KBytes;
    static constexpr int kSub = kQ6 ? 16 : 32;  // elements per scale
    static constexpr int kSubs = kQK / kSub;
    const uint8_t* w;       // row r0
    size_t rb;              // bytes per row
    int64_t gq, gd, gs;     // per panel group: bytes of q, floats of d, int32 lanes of bsums pairs
    const int8_t* xq;
    const float* xd;
    const int32_t* xs;
    int next_rows;          // rows of the next tile (<= 0: none), whose blocks are prefetched

    KqTileIn(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int R)
        : w(W.row(r0)), rb(W.row_bytes), gq(p.K * kGroup), gd(p.K / kQK * kGroup), gs(p.K / 32 * kGroup),
          xq(p.q + g0 * gq), xd(p.d + g0 * gd), xs(p.bsums + g0 * gs),
          next_rows(int(std::min<int64_t>(R, W.n_out - r0 - R))) {}
    const uint8_t* block(int r, int64_t b) const { return w + r * rb + b * kBytes; }
    // Token group v of block b: its 64 k-quads of 64 bytes, its 8 vectors of bsums pairs
    // (vector j: sub-blocks 2j, 2j + 1 of 16 values), its d_x.
    const int8_t* quads(int v, int64_t b) const { return xq + v * gq + b * (kQK / 4) * 64; }
    const int32_t* bsums(int v, int64_t b) const { return xs + v * gs + b * 8 * kGroup; }
    const float* dx(int v, int64_t b) const { return xd + v * gd + b * kGroup; }
    void prefetch_next(int R, int64_t b) const {
        for (int r = 0; r < next_rows; ++r)
            for (int c = 0; c < kBytes; c += 64) _mm_prefetch(reinterpret_cast<const char*>(block(R + r, b) + c), _MM_HINT_T0);
    }
    // Row r's scales of block b: Q6_K's 16 int8 ones, IQ4_XS's 8 (in sc6), or Q4_K/Q5_K's 8
    // scales and 8 mins (q4k_unpack_scales's bytes by vector ops: the scalar unpack was 5% of a
    // VNNI Q4_K tile). Only the tiles call it, all built for AVX2 or above.
    __attribute__((target("avx2"))) void scales(int r, int64_t b, uint8_t* sc, uint8_t* mn, int8_t* sc6) const {
        const uint8_t* blk = block(r, b);
        if constexpr (kQ6) {
            for (int s = 0; s < 16; ++s) sc6[s] = int8_t(blk[192 + s]);
        } else if constexpr (kIq4) {
            iq4xs_scales(blk, sc6);
        } else {
            const __m128i scm = q4k_scales_mins(blk + 4);
            _mm_storel_epi64(reinterpret_cast<__m128i*>(sc), scm);
            _mm_storel_epi64(reinterpret_cast<__m128i*>(mn), _mm_unpackhi_epi64(scm, scm));
        }
    }
};

}  // namespace alloy::cpu::mm
