// GGUF's block-quantized weight types as the CUDA kernels read them (the K-quant GEMV, the
// prefill panels' dequantization and the embedding gather): where each block's bytes live on
// the device, and how one 32-value unit of a block decodes to int8 codes and scales.
//
// The split layout (WeightLayout::Split, made by cuda::split_blocks): a matrix's blocks, in
// row order, with every block's code bytes first, [n_out, blocks a row, kCodeBytes], then every
// block's other bytes (scales, mins; GGUF's order inside them kept), [n_out, blocks a row,
// kHeadBytes]: the same bytes as GGUF's rows. GGUF's blocks are 2-byte aligned at best (Q8_0
// 34, Q4_0 18, Q6_K 210 bytes), the code parts are multiples of 16 bytes, so a lane reads its
// 16 code bytes with one 16-byte load.
//
// A unit is 32 consecutive values of a row... except where the format interleaves them: a
// unit is the 16 code bytes one lane loads, which hold 32 values of the row as two segments of
// 16 (each inside one 32-value block of x, so each segment is one 16-byte load of x quantized
// per 32 and four dp4a), each segment with its own scale and (Q4_K, Q5_K) min:
//   value = scale * code - min, code an int8.
// Q8_0 keeps its own GEMV (matmul.cu); its unit here serves the gather and the panels only.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "format/ggml_types.h"
#include "kernels/ref/weight.h"

namespace alloy::cuda::detail {

// Per type: values and bytes of a GGUF block, where its head (non-code bytes) is, code bytes.
template <GgmlType> struct BlockFormat;
template <> struct BlockFormat<GgmlType::Q8_0> {  // d, qs[32]
    static constexpr int kValues = 32, kBytes = 34, kHeadOffset = 0, kHeadBytes = 2;
};
template <> struct BlockFormat<GgmlType::Q4_0> {  // d, qs[16]
    static constexpr int kValues = 32, kBytes = 18, kHeadOffset = 0, kHeadBytes = 2;
};
template <> struct BlockFormat<GgmlType::Q5_0> {  // d, qh (u32), qs[16]
    static constexpr int kValues = 32, kBytes = 22, kHeadOffset = 0, kHeadBytes = 6;
};
template <> struct BlockFormat<GgmlType::Q5_1> {  // d, m, qh (u32), qs[16]
    static constexpr int kValues = 32, kBytes = 24, kHeadOffset = 0, kHeadBytes = 8;
};
template <> struct BlockFormat<GgmlType::IQ4_NL> {  // d, qs[16]
    static constexpr int kValues = 32, kBytes = 18, kHeadOffset = 0, kHeadBytes = 2;
};
template <> struct BlockFormat<GgmlType::MXFP4> {  // e (E8M0), qs[16]: 17 bytes, so GGUF's blocks are byte-aligned
    static constexpr int kValues = 32, kBytes = 17, kHeadOffset = 0, kHeadBytes = 1;
};
template <> struct BlockFormat<GgmlType::Q4_K> {  // d, dmin, scales[12], qs[128]
    static constexpr int kValues = 256, kBytes = 144, kHeadOffset = 0, kHeadBytes = 16;
};
template <> struct BlockFormat<GgmlType::Q5_K> {  // d, dmin, scales[12], qh[32], qs[128]
    static constexpr int kValues = 256, kBytes = 176, kHeadOffset = 0, kHeadBytes = 16;
};
template <> struct BlockFormat<GgmlType::Q6_K> {  // ql[128], qh[64], scales[16], d
    static constexpr int kValues = 256, kBytes = 210, kHeadOffset = 192, kHeadBytes = 18;
};
template <> struct BlockFormat<GgmlType::IQ4_XS> {  // d, scales_h, scales_l[4], qs[128]
    static constexpr int kValues = 256, kBytes = 136, kHeadOffset = 0, kHeadBytes = 8;
};

// One unit decoded: codes q[s][0..3] (16 int8 in 4 words) of segment s, which holds values
// [off[s], off[s] + 16) of the block; value = scale[s] * (code - bias) - min[s]. The codes stay
// unsigned where the format offsets them (Q4_0: 8, Q6_K: 32): a dot product subtracts bias times
// the sum of x in integers (exact), which costs four dp4a where widening to signed bytes cost
// eight emulated __vsub4 (sm_90 has no SIMD byte subtract).
struct Unit {
    int q[2][4];
    float scale[2], min[2];
    int off[2];
    int bias;
};

// Every byte a unit reads, loaded before any is used (one round of independent loads: a
// dependent head load after the codes cost a second trip to memory per unit).
struct UnitRaw {
    int4 c;        // the unit's 16 code bytes
    int4 e;        // Q5_K / Q6_K: the 16 high-bit bytes of its values; Q8_0: the block's other 16 codes
    uint32_t h[4];  // head bytes the unit needs (per type, below)
};

__device__ __forceinline__ float f16_bits(uint32_t v) { return __half2float(__ushort_as_half(uint16_t(v))); }
// Byte i (0..11) of the 12 bytes in words a, b, c.
__device__ __forceinline__ int byte12(uint32_t a, uint32_t b, uint32_t c, int i) {
    const uint32_t w = i < 4 ? a : i < 8 ? b : c;
    return int((w >> (8 * (i & 3))) & 0xffu);
}

// Bits 0-3 of b to bit 0 of bytes 0-3.
__device__ __forceinline__ uint32_t spread4(uint32_t b) {
    return (b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21);
}

// 4 table entries for 4 indices (each byte of idx in 0..15): byte k of the result is
// table[byte k of idx], the table's 16 int8 in 4 words (the IQ4 codebook).
__device__ __forceinline__ int lut16(uint32_t idx, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    const uint32_t sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
    const uint32_t lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const uint32_t m = ((idx >> 3) & 0x01010101u) * 0xffu;  // entries 8..15
    return int((lo & ~m) | (hi & m));
}
// kIq4nlValues (format/quant.h) as 4 little-endian words.
constexpr uint32_t kIq4W0 = 0xbfad9881u, kIq4W1 = 0xf6eaddcfu, kIq4W2 = 0x26190d01u, kIq4W3 = 0x71594535u;
// kMxfp4Values (format/quant.h: the FP4 values times 2) likewise.
constexpr uint32_t kFp4W0 = 0x03020100u, kFp4W1 = 0x0c080604u, kFp4W2 = 0xfdfeff00u, kFp4W3 = 0xf4f8fafcu;
// An MXFP4 block's scale 2^(e - 128) (format/quant.cpp mxfp4_half_scale: subnormal for e < 2).
__device__ __forceinline__ float mxfp4_half_scale(uint32_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Where unit u's 16 code bytes start inside its block's code part.
template <GgmlType kType> __device__ __forceinline__ int unit_code_offset(int u) {
    if constexpr (kType == GgmlType::Q5_K) return 32 + 16 * u;  // qs after qh[32]
    else return 16 * u;                                        // Q6_K: ql, units 0-3 the first half's
}

// The loads of unit u (0 .. kValues / 32 - 1) of a block: code its code part, head its head.
// c may be given (the GEMV streams it ahead); stream: read the codes past L1.
template <GgmlType kType>
__device__ __forceinline__ UnitRaw load_unit_rest(const int4 c, const uint8_t* __restrict__ code,
                                                  const uint8_t* __restrict__ head, int u) {
    UnitRaw r;
    r.c = c;
    r.e = make_int4(0, 0, 0, 0);
    r.h[0] = r.h[1] = r.h[2] = r.h[3] = 0;
    if constexpr (kType == GgmlType::Q4_K || kType == GgmlType::Q5_K) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(head));  // d, dmin, scales[12]
        r.h[0] = v.x, r.h[1] = v.y, r.h[2] = v.z, r.h[3] = v.w;
        if constexpr (kType == GgmlType::Q5_K) r.e = __ldg(reinterpret_cast<const int4*>(code + 16 * (u & 1)));  // qh half
    } else if constexpr (kType == GgmlType::Q6_K) {
        const int n = u >> 2, k = u & 3;
        r.e = __ldg(reinterpret_cast<const int4*>(code + 128 + 32 * n + 16 * (k & 1)));
        const int off0 = 128 * n + 16 * (k & 1) + (k < 2 ? 0 : 32);  // the segments' scales: off / 16
        r.h[0] = __ldg(head + off0 / 16);
        r.h[1] = __ldg(head + off0 / 16 + 4);
        r.h[2] = __ldg(reinterpret_cast<const unsigned short*>(head + 16));  // d
    } else if constexpr (kType == GgmlType::IQ4_XS) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(head));  // d, scales_h, scales_l[4]
        r.h[0] = v.x, r.h[1] = v.y;
    } else if constexpr (kType == GgmlType::Q5_0) {
        const auto* h16 = reinterpret_cast<const unsigned short*>(head);  // 6-byte heads: 2-byte loads
        r.h[0] = __ldg(h16);
        r.h[1] = uint32_t(__ldg(h16 + 1)) | uint32_t(__ldg(h16 + 2)) << 16;
    } else if constexpr (kType == GgmlType::Q5_1) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(head));  // d, m, qh
        r.h[0] = v.x, r.h[1] = v.y;
    } else if constexpr (kType == GgmlType::Q8_0) {
        r.e = __ldg(reinterpret_cast<const int4*>(code + 16));
        r.h[0] = __ldg(reinterpret_cast<const unsigned short*>(head));
    } else if constexpr (kType == GgmlType::MXFP4) {
        r.h[0] = __ldg(head);
    } else {  // Q4_0, IQ4_NL
        r.h[0] = __ldg(reinterpret_cast<const unsigned short*>(head));
    }
    return r;
}

// The decoding of a unit's bytes (no loads).
template <GgmlType kType>
__device__ __forceinline__ Unit decode_unit(const UnitRaw& raw, int u) {
    Unit r;
    const uint32_t w[4] = {uint32_t(raw.c.x), uint32_t(raw.c.y), uint32_t(raw.c.z), uint32_t(raw.c.w)};
    const uint32_t e[4] = {uint32_t(raw.e.x), uint32_t(raw.e.y), uint32_t(raw.e.z), uint32_t(raw.e.w)};
    r.bias = 0;
    r.min[0] = r.min[1] = 0.0f;
    if constexpr (kType == GgmlType::Q4_0 || kType == GgmlType::IQ4_NL || kType == GgmlType::MXFP4) {
        // byte j: value j (low nibble) and j + 16 (high)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t lo = w[i] & 0x0f0f0f0fu, hi = (w[i] >> 4) & 0x0f0f0f0fu;
            if constexpr (kType == GgmlType::Q4_0) {
                r.q[0][i] = int(lo), r.q[1][i] = int(hi);
            } else if constexpr (kType == GgmlType::IQ4_NL) {
                r.q[0][i] = lut16(lo, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
                r.q[1][i] = lut16(hi, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
            } else {
                r.q[0][i] = lut16(lo, kFp4W0, kFp4W1, kFp4W2, kFp4W3);
                r.q[1][i] = lut16(hi, kFp4W0, kFp4W1, kFp4W2, kFp4W3);
            }
        }
        if constexpr (kType == GgmlType::Q4_0) r.bias = 8;
        r.scale[0] = r.scale[1] = kType == GgmlType::MXFP4 ? mxfp4_half_scale(raw.h[0]) : f16_bits(raw.h[0]);
        r.off[0] = 0, r.off[1] = 16;
    } else if constexpr (kType == GgmlType::Q5_0 || kType == GgmlType::Q5_1) {
        // As Q4_0, with bit j of qh the fifth bit of value j (Q5_0: offset by 16; Q5_1: value =
        // code d + m, i.e. min = -m).
        const uint32_t qh = raw.h[1];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r.q[0][i] = int((w[i] & 0x0f0f0f0fu) | spread4((qh >> (4 * i)) & 0xFu) << 4);
            r.q[1][i] = int(((w[i] >> 4) & 0x0f0f0f0fu) | spread4((qh >> (16 + 4 * i)) & 0xFu) << 4);
        }
        r.scale[0] = r.scale[1] = f16_bits(raw.h[0]);
        if constexpr (kType == GgmlType::Q5_0) r.bias = 16;
        else r.min[0] = r.min[1] = -f16_bits(raw.h[0] >> 16);
        r.off[0] = 0, r.off[1] = 16;
    } else if constexpr (kType == GgmlType::Q4_K || kType == GgmlType::Q5_K) {
        // Unit u = 2 g + half: qs bytes [32 g + 16 half, +16); low nibbles are values
        // [64 g + 16 half, +16) of sub-block 2 g, high ones [64 g + 32 + 16 half, +16) of 2 g + 1;
        // Q5_K's fifth bits: bits 2 g and 2 g + 1 of qh[16 half .. +16).
        const int g = u >> 1, half = u & 1;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t qh = kType == GgmlType::Q5_K ? e[i] : 0u;
            r.q[0][i] = int((w[i] & 0x0f0f0f0fu) | (((qh >> (2 * g)) & 0x01010101u) << 4));
            r.q[1][i] = int(((w[i] >> 4) & 0x0f0f0f0fu) | (((qh >> (2 * g + 1)) & 0x01010101u) << 4));
        }
        const float d = f16_bits(raw.h[0]), dmin = f16_bits(raw.h[0] >> 16);
        // detail::q4k_scale_min (format/quant.cpp) for sub-blocks 2 g and 2 g + 1
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int j = 2 * g + k;
            int sc, m;
            if (j < 4) {
                sc = byte12(raw.h[1], raw.h[2], raw.h[3], j) & 63;
                m = byte12(raw.h[1], raw.h[2], raw.h[3], j + 4) & 63;
            } else {
                const int hi = byte12(raw.h[1], raw.h[2], raw.h[3], j + 4);
                sc = (hi & 0xF) | ((byte12(raw.h[1], raw.h[2], raw.h[3], j - 4) >> 6) << 4);
                m = (hi >> 4) | ((byte12(raw.h[1], raw.h[2], raw.h[3], j) >> 6) << 4);
            }
            r.scale[k] = __fmul_rn(d, float(sc));
            r.min[k] = __fmul_rn(dmin, float(m));
        }
        r.off[0] = 64 * g + 16 * half, r.off[1] = 64 * g + 32 + 16 * half;
    } else if constexpr (kType == GgmlType::Q6_K) {
        // Half n = u / 4 of the block (128 values: ql[64 n, +64), qh[32 n, +32)); k = u % 4 takes
        // ql bytes [64 n + 16 k, +16) and qh bytes [32 n + 16 (k % 2), +16). Byte l of a half:
        // ql[l] low -> value l (qh bits 0-1), ql[l + 32] low -> l + 32 (bits 2-3), ql[l] high ->
        // l + 64 (bits 4-5), ql[l + 32] high -> l + 96 (bits 6-7); codes offset by 32.
        const int n = u >> 2, k = u & 3;
        const int sh = k < 2 ? 0 : 2;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r.q[0][i] = int((w[i] & 0x0f0f0f0fu) | (((e[i] >> sh) & 0x03030303u) << 4));
            r.q[1][i] = int(((w[i] >> 4) & 0x0f0f0f0fu) | (((e[i] >> (sh + 4)) & 0x03030303u) << 4));
        }
        r.bias = 32;
        r.off[0] = 128 * n + 16 * (k & 1) + (k < 2 ? 0 : 32), r.off[1] = r.off[0] + 64;
        const float d = f16_bits(raw.h[2]);
        r.scale[0] = __fmul_rn(d, float(int8_t(raw.h[0])));
        r.scale[1] = __fmul_rn(d, float(int8_t(raw.h[1])));
    } else if constexpr (kType == GgmlType::IQ4_XS) {
        // Sub-block u: qs bytes [16 u, +16), low nibbles values [32 u, +16), high [32 u + 16, +16).
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            r.q[0][i] = lut16(w[i] & 0x0f0f0f0fu, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
            r.q[1][i] = lut16((w[i] >> 4) & 0x0f0f0f0fu, kIq4W0, kIq4W1, kIq4W2, kIq4W3);
        }
        const float d = f16_bits(raw.h[0]);
        const int scales_h = int(raw.h[0] >> 16);
        const int ls = ((int(raw.h[1] >> (8 * (u / 2))) >> (4 * (u % 2))) & 0xF) | (((scales_h >> (2 * u)) & 3) << 4);
        r.scale[0] = r.scale[1] = __fmul_rn(d, float(ls - 32));
        r.off[0] = 32 * u, r.off[1] = 32 * u + 16;
    } else {  // Q8_0: the unit is the block
#pragma unroll
        for (int i = 0; i < 4; ++i) r.q[0][i] = int(w[i]), r.q[1][i] = int(e[i]);
        r.scale[0] = r.scale[1] = f16_bits(raw.h[0]);
        r.off[0] = 0, r.off[1] = 16;
    }
    return r;
}

// How a type's codes map to values beyond the scale: an offset subtracted from every code (Q4_0,
// Q5_0, Q6_K) and / or a min per segment (Q4_K, Q5_K, Q5_1); either needs the segment's sum of x.
template <GgmlType kType> struct CodeOffsets {
    static constexpr bool kMin = kType == GgmlType::Q4_K || kType == GgmlType::Q5_K || kType == GgmlType::Q5_1;
    static constexpr int kBias = kType == GgmlType::Q4_0 ? 8 : kType == GgmlType::Q5_0 ? 16 : kType == GgmlType::Q6_K ? 32 : 0;
    static constexpr bool kSum = kMin || kBias != 0;
};

// Segment s of a unit against x's 16 int8 codes there (quantized per 32; x's scale not applied):
// scale * (codes . x - bias * sum x) - min * sum x, the offset in integers (exact), four dp4a
// (and four more for the sum). The GEMVs of matmul_kquant.cu and moe.cu.
template <GgmlType kType>
__device__ __forceinline__ float segment_dot(const Unit& w, int s, const int4 xv) {
    using O = CodeOffsets<kType>;
    int dot = __dp4a(w.q[s][0], xv.x, 0);
    dot = __dp4a(w.q[s][1], xv.y, dot);
    dot = __dp4a(w.q[s][2], xv.z, dot);
    dot = __dp4a(w.q[s][3], xv.w, dot);
    int sum = 0;
    if constexpr (O::kSum) {
        sum = __dp4a(0x01010101, xv.x, 0);
        sum = __dp4a(0x01010101, xv.y, sum);
        sum = __dp4a(0x01010101, xv.z, sum);
        sum = __dp4a(0x01010101, xv.w, sum);
    }
    float v = w.scale[s] * float(O::kBias ? dot - O::kBias * sum : dot);
    if constexpr (O::kMin) v = fmaf(-w.min[s], float(sum), v);
    return v;
}

// Code bytes of a block.
template <GgmlType kType> __host__ __device__ constexpr int code_bytes() { return BlockFormat<kType>::kBytes - BlockFormat<kType>::kHeadBytes; }

// Where block b (row-major over the matrix: row r's block i is b = r * blocks_per_row + i) of
// a split matrix of n_blocks blocks keeps its codes and head.
template <GgmlType kType> struct SplitMatrix {
    const uint8_t* codes;
    const uint8_t* heads;
    __device__ __forceinline__ SplitMatrix(const void* data, int64_t n_blocks)
        : codes(static_cast<const uint8_t*>(data)), heads(codes + n_blocks * code_bytes<kType>()) {}
    __device__ __forceinline__ const uint8_t* code(int64_t b) const { return codes + b * code_bytes<kType>(); }
    __device__ __forceinline__ const uint8_t* head(int64_t b) const { return heads + b * BlockFormat<kType>::kHeadBytes; }
};

// Unit u of block b, loaded and decoded.
template <GgmlType kType>
__device__ __forceinline__ Unit load_unit(const SplitMatrix<kType>& m, int64_t b, int u) {
    const uint8_t* code = m.code(b);
    const int4 c = __ldg(reinterpret_cast<const int4*>(code + unit_code_offset<kType>(u)));
    return decode_unit<kType>(load_unit_rest<kType>(c, code, m.head(b), u), u);
}
// Value i (0..15) of segment s, as format/quant.cpp's dequantize_row computes it (the same
// products, no FMA contraction).
__device__ __forceinline__ float unit_value(const Unit& r, int s, int i) {
    const int code = int(int8_t(uint32_t(r.q[s][i >> 2]) >> (8 * (i & 3)))) - r.bias;
    return __fsub_rn(__fmul_rn(r.scale[s], float(code)), r.min[s]);
}

// Calls f(std::integral_constant<GgmlType, t>{}) for the block types the CUDA kernels read in
// the split layout; false (f not called) for any other type.
template <class F> bool with_block_type(GgmlType t, F&& f) {
    switch (t) {
#define ALLOY_BT(x) case GgmlType::x: f(std::integral_constant<GgmlType, GgmlType::x>{}); return true;
        ALLOY_BT(Q8_0) ALLOY_BT(Q4_0) ALLOY_BT(Q5_0) ALLOY_BT(Q5_1) ALLOY_BT(IQ4_NL) ALLOY_BT(Q4_K) ALLOY_BT(Q5_K) ALLOY_BT(Q6_K) ALLOY_BT(IQ4_XS)
        ALLOY_BT(MXFP4)
#undef ALLOY_BT
        default: return false;
    }
}

// Rows [r0, r0 + rows) of split matrix W (n_in values a row) -> bf16 [rows, n_in], each value
// rounded to nearest even from dequantize_row's fp32 (kernels/cuda/quant_blocks.cu).
void blocks_to_bf16(const WeightView& W, int64_t r0, int64_t rows, void* out, cudaStream_t st, const char* op);

}  // namespace alloy::cuda::detail
