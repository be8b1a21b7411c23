// Internal interface between the matmul driver (matmul.cpp) and its per-ISA kernel files.
// Not for use outside kernels/cpu and their tests.
//
// Two activation layouts, both prepared once per call by matmul_act.cpp:
//  - ActRows, token-major, read by the row-dot kernels (decode GEMV on AVX-512 and AVX2; every
//    T on the scalar path): each kernel call takes a few adjacent weight rows x up to 4 tokens.
//  - ActPanel, token-vectorised in groups of 16 tokens, read by the GEMM tiles: one zmm (two
//    ymm on AVX2) holds the same k-slice of 16 tokens, so a weight element (or pair, or quad) is
//    broadcast straight from the row-major GGUF row and meets 16 tokens in one instruction.
//    No weight repacking is needed: the weights keep their file layout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/ref/weight.h"

namespace alloy::cpu::mm {

// An unaligned little value out of a GGUF row or activation buffer (memcpy: no aliasing or
// alignment assumptions; compiles to one load).
template <class T>
inline T load_as(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline uint16_t load_u16(const void* p) { return load_as<uint16_t>(p); }
inline int32_t load_i32(const void* p) { return load_as<int32_t>(p); }
inline float load_f32(const void* p) { return load_as<float>(p); }

constexpr int kGroup = 16;   // tokens per ActPanel group (one zmm of int32/fp32 lanes)
constexpr int kNarrowTokens = 8;  // a last group of at most this many tokens: TileKernel::narrow
constexpr int kQ8 = 32;      // Q8_0 block size
constexpr int kRowDotTokens = 4;  // tokens per row-dot / GEMV kernel call
// Calls of up to this many tokens take a type's streaming GEMV when it has one (else the GEMM):
// the GEMV computes each (row, token) output by the same fixed arithmetic whatever the other
// tokens, so such calls give every row the bits of a one-row call. That makes decode steps of
// up to 16 sequences batch-invariant (a request's tokens do not depend on what runs beside
// it) and speculative verification of up to 16 tokens reproduce decode.
constexpr int kGemvMaxTokens = 16;
// Past 4 tokens the GEMV walks an item's rows in runs of this many, every 4-token group over
// one run before the next, so the run's weights come from DRAM once and then from L1/L2.
constexpr int kGemvRunRows = 32;

// Token-major activations. Which members are set depends on the path:
//   Q8_0: q, d, corr;  Q8_K (K-quant decode): q, d, bsums;  BF16 on AVX-512: bf;  else: f.
struct ActRows {
    int64_t K = 0;                  // n_in
    const int8_t* q = nullptr;      // [T, K] Q8_0 values
    const float* d = nullptr;       // [T, K/32] Q8_0 block scales, already rounded to fp16 (Q8_K: [T, K/256])
    const int16_t* bsums = nullptr; // [T, K/16] Q8_K sums of 16 consecutive q
    const int32_t* corr = nullptr;  // [T, K/32] -128 * sum(q) per block (see the q8 kernels)
    const uint16_t* bf = nullptr;   // [T, K] bf16 bits
    const float* f = nullptr;       // [T, K] fp32 (bf16-rounded for BF16 weights)
};

// Token-vectorised activations, G = ceil(T / 16) groups; padding tokens are zero.
struct ActPanel {
    int64_t K = 0;                  // n_in (even for bf, a multiple of 32 for q)
    const int8_t* q = nullptr;      // [G, K/4, 16, 4]: k-quad s of token l at (s * 16 + l) * 4
    const float* d = nullptr;       // [G, K/32, 16]
    const int32_t* corr = nullptr;  // [G, K/32, 16]   (Q8_K: d is [G, K/256, 16])
    // [G, K/32, 16] Q8_K sums of 16 consecutive q, two a lane: int16 pair (sum 2j, sum 2j + 1)
    // of token l in 32-bit lane l of vector j (|sum| <= 16 x 127), so a tile's scale terms
    // take one vpmaddwd / vpdpwssd per pair of sub-blocks.
    const int32_t* bsums = nullptr;
    const uint16_t* bf = nullptr;   // [G, K/2, 16, 2]: k-pair s of token l at (s * 16 + l) * 2
    const float* f = nullptr;       // [G, K, 16]
    // Q8 only, when the last group holds at most kNarrowTokens real tokens: that group's first
    // 8 tokens again, [K/8, 8, 8]: k-octet m of token l at (m * 8 + l) * 8 (the narrow tile).
    const int8_t* q_pairs = nullptr;
};

// Row-dot kernel: for i < nr (<= RowKernel::rows) and t < nt (<= 4),
//   y[(t0 + t) * ldy + r0 + i] = dot(W row r0 + i, activation token t0 + t).
using RowDotFn = void (*)(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y,
                          int64_t ldy);
struct RowKernel {
    RowDotFn fn = nullptr;
    int rows = 0;  // most rows per call
};

// Inner-dimension chunks of the AVX-512 GEMM tiles. The AVX-512 row-dot kernels sum in the
// same chunks and the same order per output, so every T gives the same bits (decode
// reproduces prefill exactly).
// Since the tiles prefetch the next row tile's weights, longer k-chunks won (panel slices in
// L2, not L1; fewer tile reloads): BF16 256 -> 1024 +5.5% GEMM at T = 512 (+5.0% at 128),
// Q8_0 512 -> 1024 +2.4% (alternated in one process, 0.8B matrices).
constexpr int kQ8Kc = 1024;   // 32 blocks: the Q8 panel slice is 48 tokens x 1 KiB
constexpr int kBf16Kc = 1024; // 64 tokens x 1024 x 2 B = 128 KiB
constexpr int kF32Kc = 128;   // 64 tokens x 128 x 4 B
// The AVX2 F32 tile's chunk (panel slice 2 groups x 16 tokens x 256 x 4 B = 32 KiB, L1); the
// AVX2 F32/F16 row-dot sums in the same chunks, so those types give every T the same bits
// there too.
constexpr int kF32KcAvx2 = 256;

// GEMM tile kernel: rows [r0, r0 + nr) (nr <= rows), token groups [g0, g0 + nv)
// (nv <= groups), inner range [k0, k1) (k0 a multiple of kc, k1 = min(k0 + kc, K));
//   tile[i * ldt + v * 16 + l] += partial dot of row r0 + i with token (g0 + v) * 16 + l,
// where the call with k0 == 0 starts from zero instead of the tile (which it may find
// uninitialised): no separate zeroing pass.
using TileFn = void (*)(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv,
                        int64_t k0, int64_t k1, float* tile, int ldt);
struct TileKernel {
    TileFn fn = nullptr;
    int rows = 0;    // most rows per call
    int groups = 0;  // most token groups per call
    int kc = 0;      // inner-dimension chunk: the panel slice groups * 16 * kc stays in L1
    // The same contract for one group (nv = 1) of at most kNarrowTokens real tokens, writing
    // tile lanes [0, kNarrowTokens) only, with the same bits as fn; nullptr: fn serves them.
    TileFn narrow = nullptr;
    bool narrow_reads_pairs = true;  // it reads ActPanel::q_pairs (the VNNI one; AVX2's does not)
};

// Kernels per ISA; nullptr / fn == nullptr where the ISA has none for that weight type.
RowKernel rowdot_scalar(GgmlType type);  // Q8_0, BF16, F16, F32
RowKernel rowdot_avx2(GgmlType type);    // Q8_0, BF16, F16, F32
RowKernel rowdot_avx512(GgmlType type);  // Q8_0 (VNNI), BF16 (AVX512-BF16), F16, F32
TileKernel tile_avx512(GgmlType type);  // Q8_0 (VNNI), BF16 (AVX512-BF16), F32
TileKernel tile_avx2(GgmlType type);    // Q8_0 (vpmaddubsw), BF16 (panel of bf16-rounded fp32), F32

// y[t * ldy + i] = tile[i * ldt + t] for i < rows, t < tokens (GEMM tiles back to [T, n_out]);
// the CPU kernels' one AVX-512 matrix transpose (also activation panels, the GDN state and
// K^T, attention's transposed queries).
// stream: write whole aligned 16-float runs with non-temporal stores (for outputs far larger
// than the caches, which a plain store would first read from memory); ends with an sfence.
void store_transposed_avx512(const float* tile, int ldt, int64_t rows, int64_t tokens, float* y, int64_t ldy,
                             bool stream = false);

// The same on AVX2 (8 x 8 register transposes), always with plain stores.
void store_transposed_avx2(const float* tile, int ldt, int64_t rows, int64_t tokens, float* y, int64_t ldy);

// dst[u * 16 + l] = rows[l * units + u] for l < 16, u < units (32-bit units): 16 token rows
// interleaved into the ActPanel layout, by 16 x 16 register transposes.
void interleave16_avx512(const uint32_t* rows, int64_t units, uint32_t* dst);

// n f16 values (unaligned bytes) -> fp32.
void f16_to_f32_avx512(const uint8_t* src, int64_t n, float* out);

// Q8_0 activation quantization (ggml's x86 quantize_row_q8_0, bit for bit), one token row of
// K elements: q [K], d [K/32] (fp16-rounded), corr [K/32] = -128 * block sum of q.
void quantize_q8_scalar(const float* x, int64_t K, int8_t* q, float* d, int32_t* corr);
// x [K] -> its Q8_0 values as fp32 (q * d): the activations the Q8_0-family kernels see.
void q8_round_row(const float* x, int64_t K, float* out);
void quantize_q8_avx2(const float* x, int64_t K, int8_t* q, float* d, int32_t* corr);
void quantize_q8_avx512(const float* x, int64_t K, int8_t* q, float* d, int32_t* corr);
// fp32 -> bf16 bits, round to nearest even (NaN stays NaN), as ggml's GGML_FP32_TO_BF16.
void to_bf16_scalar(const float* x, int64_t n, uint16_t* out);
void to_bf16_avx512(const float* x, int64_t n, uint16_t* out);

// Decode GEMV: rows [r0, r0 + nr) (a long range: the kernel picks its own row streams),
// tokens [t0, t0 + nt), nt <= 4; y[t * ldy + r] = dot(row r, token t). Batch-invariant for
// T <= 4: each output's arithmetic does not depend on nt (verification reproduces decode).
using GemvFn = void (*)(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                        int64_t ldy);

// Q8_0 rows repacked at load (WeightLayout::Q8Rows16, cpu::repack_weight): each group of 16
// rows (16 * row_bytes bytes, in place) holds per 32-column block b, at b * kQ8R16Block:
//   [0, 32)   the 16 rows' f16 scales d (row l at 2 l),
//   [32, 544) 8 k-quads j, 64 bytes each: row l's codes 4j..4j+3 at 32 + 64 j + 4 l, stored as
//             u8 = w ^ 0x80 (= w + 128: vpdpbusd's unsigned operand, no flip in the kernels).
// So a k-quad of 16 rows is one zmm (rows in the 16 int32 lanes) and a token's 4 codes its
// embedded broadcast: one vpdpbusd = 64 useful MACs. The last n_out % 16 rows stay GGUF.
constexpr int kQ8R16Rows = 16;
constexpr int64_t kQ8R16Block = 16 * 34;  // bytes per block of a group (= 16 GGUF blocks)
// The rows of W in whole groups (W.layout == Q8Rows16), else 0.
inline int64_t q8_r16_rows(const WeightView& W) {
    return W.layout == WeightLayout::Q8Rows16 ? W.n_out / kQ8R16Rows * kQ8R16Rows : 0;
}
// 16 GGUF rows (src, row_bytes rb, nb blocks) into one group at dst (not overlapping).
inline void q8_r16_repack_group(const uint8_t* src, size_t rb, int64_t nb, uint8_t* dst) {
    for (int64_t b = 0; b < nb; ++b, dst += kQ8R16Block)
        for (int l = 0; l < kQ8R16Rows; ++l) {
            const uint8_t* blk = src + size_t(l) * rb + size_t(b) * 34;
            dst[2 * l] = blk[0];
            dst[2 * l + 1] = blk[1];
            for (int j = 0; j < 8; ++j)
                for (int i = 0; i < 4; ++i) dst[32 + 64 * j + 4 * l + i] = uint8_t(blk[2 + 4 * j + i] ^ 0x80);
        }
}
// Row l (0..15) of a group back to its GGUF bytes (nb blocks into out).
inline void q8_r16_unpack_row(const uint8_t* grp, int64_t nb, int l, uint8_t* out) {
    for (int64_t b = 0; b < nb; ++b, grp += kQ8R16Block, out += 34) {
        out[0] = grp[2 * l];
        out[1] = grp[2 * l + 1];
        for (int j = 0; j < 8; ++j)
            for (int i = 0; i < 4; ++i) out[2 + 4 * j + i] = uint8_t(grp[32 + 64 * j + 4 * l + i] ^ 0x80);
    }
}

// Q8_0 GEMV of a Q8Rows16 matrix (AVX512-VNNI zmm): rows [r0, r0 + nr) (any range: a group it
// cuts is computed whole, the GGUF tail through q8_gemv_avx512), tokens [t0, t0 + nt) with
// nt <= kGemvMaxTokens (not 4: the driver passes a call's every token at once). Per (row, token)
// the GGUF kernels' chain (y = fma(float(isum_b), d_w * d_x, y) over blocks in order), so the
// same bits.
void q8_r16_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                        int64_t ldy);

// Q8_0 decode GEMV (AVX512-VNNI, activations in a.q / a.d).
void q8_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                    int64_t ldy);

// Q4_0, IQ4_NL and MXFP4 decode GEMVs (AVX512-VNNI) on the same Q8_0 activations: the weights
// unpacked to int8.
void q4_0_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                      int64_t ldy);
void iq4_nl_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                        int64_t ldy);
void mxfp4_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                       int64_t ldy);

// BF16 decode GEMV (AVX512-BF16), same contract as q8_gemv_avx512 (activations in a.bf).
void bf16_gemv_avx512(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                      int64_t ldy);

// AVX2 decode GEMVs (Q8_0, Q4_0, IQ4_NL and MXFP4 on Q8_0 activations, BF16; activations as for rowdot_avx2),
// nullptr otherwise.
GemvFn gemv_avx2(GgmlType type);

bool cpu_has_avx512_vnni();
bool cpu_has_avx512_bf16();

}  // namespace alloy::cpu::mm
