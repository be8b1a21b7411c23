// Scalar float conversions and one-row (de)quantization. Reference quality: the layouts
// follow spec/GGUF.md section 2 literally; fast paths live in kernels/cpu.
#include "format/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "alloy/error.h"
#include "format/kquant_quantize.h"

namespace alloy {

namespace {

uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

float bits_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

void store_u16(uint8_t* p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
}

void check_row(GgmlType t, int64_t n, const char* what) {
    const TypeTraits& tr = type_traits(t);
    if (n < 0 || n % tr.block_elems != 0) {
        throw Error(std::string(what) + ": row of " + std::to_string(n) + " elements is not a multiple of the " +
                    tr.name + " block size " + std::to_string(tr.block_elems));
    }
}

void dequant_q8_0(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 34, dst += 32) {
        const float d = fp16_to_fp32(load_u16(src));
        const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
        for (int i = 0; i < 32; ++i) dst[i] = d * static_cast<float>(qs[i]);
    }
}

void dequant_q4_0(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 18, dst += 32) {
        const float d = fp16_to_fp32(load_u16(src));
        const uint8_t* qs = src + 2;
        for (int j = 0; j < 16; ++j) {
            dst[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
            dst[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
        }
    }
}

// Q4_K, and Q5_K (kQ5): the same super-block with 32 high-bit bytes before the nibbles, bit 2g
// of qh[l] the fifth bit of group g's low nibbles and bit 2g + 1 of its high ones.
template <bool kQ5>
void dequant_q4_k_or_q5_k(const uint8_t* src, float* dst, int64_t nb) {
    constexpr int kBytes = kQ5 ? 176 : 144;
    for (int64_t b = 0; b < nb; ++b, src += kBytes) {
        const float d = fp16_to_fp32(load_u16(src));
        const float dmin = fp16_to_fp32(load_u16(src + 2));
        const uint8_t* scales = src + 4;
        const uint8_t* qh = src + 16;
        const uint8_t* qs = src + (kQ5 ? 48 : 16);
        // 4 groups of 64 outputs; low nibbles use sub-block 2g, high nibbles 2g+1.
        for (int g = 0; g < 4; ++g, qs += 32) {
            int sc, m;
            detail::q4k_scale_min(scales, 2 * g, sc, m);
            const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
            detail::q4k_scale_min(scales, 2 * g + 1, sc, m);
            const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
            for (int l = 0; l < 32; ++l)
                *dst++ = d1 * static_cast<float>((qs[l] & 0xF) | (kQ5 ? ((qh[l] >> (2 * g)) & 1) << 4 : 0)) - m1;
            for (int l = 0; l < 32; ++l)
                *dst++ = d2 * static_cast<float>((qs[l] >> 4) | (kQ5 ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0)) - m2;
        }
    }
}

void dequant_iq4_nl(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 18, dst += 32) {
        const float d = fp16_to_fp32(load_u16(src));
        for (int j = 0; j < 16; ++j) {
            dst[j] = d * static_cast<float>(kIq4nlValues[src[2 + j] & 0xF]);
            dst[j + 16] = d * static_cast<float>(kIq4nlValues[src[2 + j] >> 4]);
        }
    }
}

void dequant_iq4_xs(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 136) {
        const float d = fp16_to_fp32(load_u16(src));
        const unsigned scales_h = load_u16(src + 2);
        const uint8_t* scales_l = src + 4;
        const uint8_t* qs = src + 8;
        // 8 sub-blocks of 32, each with a 6-bit scale (4 low bits in scales_l, 2 in scales_h)
        // offset by 32, over the same 16-entry codebook as IQ4_NL.
        for (int ib = 0; ib < 8; ++ib, qs += 16, dst += 32) {
            const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
            const float dl = d * static_cast<float>(ls - 32);
            for (int j = 0; j < 16; ++j) {
                dst[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
                dst[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
            }
        }
    }
}

void dequant_q6_k(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 210) {
        const uint8_t* ql = src;
        const uint8_t* qh = src + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192);
        const float d = fp16_to_fp32(load_u16(src + 208));
        // Two halves of 128 outputs, each from 64 ql bytes, 32 qh bytes and 8 scales.
        for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, dst += 128) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                dst[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
                dst[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
                dst[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
                dst[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
            }
        }
    }
}

// ggml's quantize_row_q8_0_ref: d = amax/127, q = round(x / d), d stored as f16.
void quant_q8_0(const float* src, uint8_t* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(src[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_u16(dst, fp32_to_fp16(d));
        for (int i = 0; i < 32; ++i) {
            dst[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(src[i] * id)));
        }
    }
}

// ggml's quantize_row_q4_0_ref: the value of largest magnitude maps to -8 exactly.
void quant_q4_0(const float* src, uint8_t* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; ++i) {
            if (std::fabs(src[i]) > amax) {
                amax = std::fabs(src[i]);
                max = src[i];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        store_u16(dst, fp32_to_fp16(d));
        for (int j = 0; j < 16; ++j) {
            const int lo = std::min(15, static_cast<int>(src[j] * id + 8.5f));
            const int hi = std::min(15, static_cast<int>(src[j + 16] * id + 8.5f));
            dst[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
        }
    }
}


// Q5_0 / Q5_1 (32 values): nibbles as Q4_0 (byte j: value j low, j + 16 high), the fifth bit
// of value j in bit j of the little-endian u32 qh. Q5_0 codes are offset by 16 (d = max / -16);
// Q5_1 has d and a min m (value = code * d + m), as ggml's reference (de)quantizers.
template <bool kHasMin>
void dequant_q5(const uint8_t* src, float* dst, int64_t nb) {
    constexpr int kBytes = kHasMin ? 24 : 22, kQh = kHasMin ? 4 : 2;
    for (int64_t b = 0; b < nb; ++b, src += kBytes, dst += 32) {
        const float d = fp16_to_fp32(load_u16(src));
        const float m = kHasMin ? fp16_to_fp32(load_u16(src + 2)) : 0.0f;
        uint32_t qh;
        std::memcpy(&qh, src + kQh, 4);
        const uint8_t* qs = src + kQh + 4;
        for (int j = 0; j < 16; ++j) {
            const int lo = (qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
            const int hi = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
            if constexpr (kHasMin) {
                dst[j] = static_cast<float>(lo) * d + m;
                dst[j + 16] = static_cast<float>(hi) * d + m;
            } else {
                dst[j] = static_cast<float>(lo - 16) * d;
                dst[j + 16] = static_cast<float>(hi - 16) * d;
            }
        }
    }
}

template <bool kHasMin>
void quant_q5(const float* src, uint8_t* dst, int64_t nb) {
    constexpr int kBytes = kHasMin ? 24 : 22, kQh = kHasMin ? 4 : 2;
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += kBytes) {
        float d, id, min = 0.0f;
        if constexpr (kHasMin) {
            float lo = std::numeric_limits<float>::max(), hi = -std::numeric_limits<float>::max();
            for (int i = 0; i < 32; ++i) {
                if (src[i] < lo) lo = src[i];
                if (src[i] > hi) hi = src[i];
            }
            min = lo;
            d = (hi - lo) / 31;
            store_u16(dst + 2, fp32_to_fp16(min));
        } else {
            float amax = 0.0f, max = 0.0f;
            for (int i = 0; i < 32; ++i) {
                if (amax < std::fabs(src[i])) {
                    amax = std::fabs(src[i]);
                    max = src[i];
                }
            }
            d = max / -16;
        }
        id = d != 0.0f ? 1.0f / d : 0.0f;
        store_u16(dst, fp32_to_fp16(d));
        uint32_t qh = 0;
        uint8_t* qs = dst + kQh + 4;
        for (int j = 0; j < 16; ++j) {
            int c0, c1;
            if constexpr (kHasMin) {
                c0 = static_cast<uint8_t>((src[j] - min) * id + 0.5f);
                c1 = static_cast<uint8_t>((src[j + 16] - min) * id + 0.5f);
            } else {
                c0 = std::min(31, static_cast<int>(static_cast<int8_t>(src[j] * id + 16.5f)));
                c1 = std::min(31, static_cast<int>(static_cast<int8_t>(src[j + 16] * id + 16.5f)));
            }
            qs[j] = static_cast<uint8_t>((c0 & 0x0F) | ((c1 & 0x0F) << 4));
            qh |= ((static_cast<uint32_t>(c0) & 0x10u) >> 4) << j;
            qh |= ((static_cast<uint32_t>(c1) & 0x10u) >> 4) << (j + 16);
        }
        std::memcpy(dst + kQh, &qh, 4);
    }
}

// MXFP4 (32 values): byte 0 the shared exponent e, bytes 1-16 the codes (byte j: value j low,
// j + 16 high). ggml's reference quantizer: e = floor(log2(amax)) - 2 + 127, each value the
// code whose kMxfp4Values[c] * 2^(e - 128) is nearest (first of equals).
void dequant_mxfp4(const uint8_t* src, float* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 17, dst += 32) {
        const float d = mxfp4_half_scale(src[0]);
        for (int j = 0; j < 16; ++j) {
            dst[j] = static_cast<float>(kMxfp4Values[src[1 + j] & 0x0F]) * d;
            dst[j + 16] = static_cast<float>(kMxfp4Values[src[1 + j] >> 4]) * d;
        }
    }
}

int nearest_mxfp4(float x, float e) {
    int best = 0;
    float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * e - x);
    for (int i = 1; i < 16; ++i) {
        const float err = std::fabs(static_cast<float>(kMxfp4Values[i]) * e - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void quant_mxfp4(const float* src, uint8_t* dst, int64_t nb) {
    for (int64_t b = 0; b < nb; ++b, src += 32, dst += 17) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) {
            if (amax < std::fabs(src[i])) amax = std::fabs(src[i]);
        }
        const uint8_t e = amax > 0.0f ? static_cast<uint8_t>(std::floor(std::log2(amax)) - 2 + 127) : 0;
        const float d = mxfp4_half_scale(e);
        dst[0] = e;
        for (int j = 0; j < 16; ++j) {
            dst[1 + j] = static_cast<uint8_t>(nearest_mxfp4(src[j], d) | (nearest_mxfp4(src[j + 16], d) << 4));
        }
    }
}
}  // namespace

// Q4_K packs 8 (scale, min) pairs of 6 bits into 12 bytes; see spec/GGUF.md "Q4_K".
void detail::q4k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

float mxfp4_half_scale(uint8_t e) {
    // 2^(e - 128): subnormal for e < 2 (ggml's ggml_e8m0_to_fp32_half).
    return bits_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1F;
    const uint32_t mant = h & 0x3FF;
    if (exp == 0) {
        // zero or subnormal: mant * 2^-24, exact in fp32
        const float mag = std::ldexp(static_cast<float>(mant), -24);
        return sign ? -mag : mag;
    }
    if (exp == 31) return bits_float(sign | 0x7F800000u | (mant << 13));  // inf / NaN (payload kept)
    return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
    const uint32_t x = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFF;
    if (ax >= 0x7F800000) {
        if (ax == 0x7F800000) return sign | 0x7C00;
        return static_cast<uint16_t>(sign | 0x7E00 | ((ax >> 13) & 0x3FF));  // quiet NaN
    }
    if (ax >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds (to even) past 65504
    const int32_t e = static_cast<int32_t>(ax >> 23) - 127;
    if (e >= -14) {  // normal half: drop 13 mantissa bits, round to nearest even
        const uint32_t mant = ax & 0x7FFFFF;
        uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | (mant >> 13);
        const uint32_t rem = mant & 0x1FFF;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is correct
        return static_cast<uint16_t>(sign | h);
    }
    if (ax <= 0x33000000) return sign;  // <= 2^-25: ties to the even value 0
    // subnormal half: units of 2^-24
    const uint32_t biased = ax >> 23;          // 102..112
    const uint32_t mant = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - biased;       // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;  // may become the smallest normal: correct
    return static_cast<uint16_t>(sign | h);
}

uint16_t fp32_to_bf16(float f) {
    const uint32_t x = float_bits(f);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
    return static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
    check_row(t, n, "dequantize_row");
    if (n == 0) return;
    const uint8_t* s = static_cast<const uint8_t*>(src);
    switch (t) {
        case GgmlType::F32: std::memcpy(dst, s, static_cast<size_t>(n) * 4); return;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(s + 2 * i));
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(s + 2 * i));
            return;
        case GgmlType::Q8_0: dequant_q8_0(s, dst, n / 32); return;
        case GgmlType::Q4_0: dequant_q4_0(s, dst, n / 32); return;
        case GgmlType::Q5_0: dequant_q5<false>(s, dst, n / 32); return;
        case GgmlType::Q5_1: dequant_q5<true>(s, dst, n / 32); return;
        case GgmlType::Q4_K: dequant_q4_k_or_q5_k<false>(s, dst, n / 256); return;
        case GgmlType::Q5_K: dequant_q4_k_or_q5_k<true>(s, dst, n / 256); return;
        case GgmlType::Q6_K: dequant_q6_k(s, dst, n / 256); return;
        case GgmlType::IQ4_NL: dequant_iq4_nl(s, dst, n / 32); return;
        case GgmlType::IQ4_XS: dequant_iq4_xs(s, dst, n / 256); return;
        case GgmlType::MXFP4: dequant_mxfp4(s, dst, n / 32); return;
    }
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
    check_row(t, n, "quantize_row");
    if (n == 0) return;
    uint8_t* d = static_cast<uint8_t*>(dst);
    switch (t) {
        case GgmlType::F32: std::memcpy(d, src, static_cast<size_t>(n) * 4); return;
        case GgmlType::F16:
            for (int64_t i = 0; i < n; ++i) store_u16(d + 2 * i, fp32_to_fp16(src[i]));
            return;
        case GgmlType::BF16:
            for (int64_t i = 0; i < n; ++i) store_u16(d + 2 * i, fp32_to_bf16(src[i]));
            return;
        case GgmlType::Q8_0: quant_q8_0(src, d, n / 32); return;
        case GgmlType::Q4_0: quant_q4_0(src, d, n / 32); return;
        case GgmlType::Q5_0: quant_q5<false>(src, d, n / 32); return;
        case GgmlType::Q5_1: quant_q5<true>(src, d, n / 32); return;
        case GgmlType::Q4_K: detail::quantize_q4_k(src, d, n / 256); return;
        case GgmlType::Q5_K: detail::quantize_q5_k(src, d, n / 256); return;
        case GgmlType::Q6_K: detail::quantize_q6_k(src, d, n / 256); return;
        case GgmlType::IQ4_NL: detail::quantize_iq4_nl(src, d, n / 32); return;
        case GgmlType::IQ4_XS: detail::quantize_iq4_xs(src, d, n / 256); return;
        case GgmlType::MXFP4: quant_mxfp4(src, d, n / 32); return;
    }
    throw Error(std::string("quantize_row: writing ") + type_traits(t).name + " is not supported");
}

}  // namespace alloy
