// Scalar conversions and block (de)quantization against values built from the spec's formulas
// (spec/GGUF.md section 2), never from the implementation under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "format/quant.h"
#include "format_test_util.h"

namespace alloy {
namespace {

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// ---------------- fp16 ----------------

TEST(Fp16, KnownValues) {
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
    EXPECT_EQ(fp32_to_fp16(-2.0f), 0xC000);
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7BFF);           // largest finite half
    EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7BFF);         // just below the rounding midpoint
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7C00);           // midpoint ties to even = inf
    EXPECT_EQ(fp32_to_fp16(1e10f), 0x7C00);
    EXPECT_EQ(fp32_to_fp16(-1e10f), 0xFC00);
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> even 0
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
    EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // tie between 1 and 2 units -> even 2
    EXPECT_EQ(fp32_to_fp16(std::ldexp(5.0f, -25)), 0x0002);  // tie between 2 and 3 units -> even 2
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -30)), 0x0000);
    EXPECT_EQ(fp32_to_fp16(-std::ldexp(1.0f, -30)), 0x8000);
    EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even mantissa
    EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even mantissa
    EXPECT_EQ(fp32_to_fp16(2047.0f / 1024.0f * 1.0f + std::ldexp(1.0f, -11)), 0x4000);  // carry into exponent
    EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
    EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7C00);
    const uint16_t nan = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
    EXPECT_EQ(nan & 0x7C00, 0x7C00);
    EXPECT_NE(nan & 0x03FF, 0);
    // A NaN whose payload lives only in low bits must stay NaN, not become inf.
    const uint16_t nan2 = fp32_to_fp16(from_bits(0x7F800001));
    EXPECT_NE(nan2 & 0x03FF, 0);

    EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0f);
    EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(fp16_to_fp32(0x03FF), std::ldexp(1023.0f, -24));
    EXPECT_EQ(fp16_to_fp32(0x7BFF), 65504.0f);
    EXPECT_EQ(bits(fp16_to_fp32(0x8000)), 0x80000000u);
    EXPECT_TRUE(std::isinf(fp16_to_fp32(0xFC00)) && fp16_to_fp32(0xFC00) < 0);
    EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7E00)));
    EXPECT_TRUE(std::isnan(fp16_to_fp32(0x7C01)));
}

TEST(Fp16, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = fp16_to_fp32(static_cast<uint16_t>(h));
        const bool is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
        if (is_nan) {
            ASSERT_TRUE(std::isnan(f)) << h;
            ASSERT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << h;
        } else {
            ASSERT_EQ(fp32_to_fp16(f), h) << h;
        }
#ifdef __FLT16_MAX__
        _Float16 ref;
        const uint16_t hh = static_cast<uint16_t>(h);
        std::memcpy(&ref, &hh, 2);
        if (!is_nan) {
            ASSERT_EQ(bits(f), bits(static_cast<float>(ref))) << h;
        }
#endif
    }
}

#ifdef __FLT16_MAX__
// The compiler's own float -> _Float16 conversion is IEEE round-to-nearest-even: an oracle.
TEST(Fp16, RandomFloatsMatchCompiler) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<uint32_t> any;
    for (int k = 0; k < 300000; ++k) {
        // Bias the exponent into and around the half range, plus fully random patterns.
        uint32_t u = any(rng);
        if (k % 2) u = (u & 0x807FFFFF) | ((100u + u % 50u) << 23);
        const float f = from_bits(u);
        if (std::isnan(f)) continue;
        const _Float16 ref = static_cast<_Float16>(f);
        uint16_t rb;
        std::memcpy(&rb, &ref, 2);
        ASSERT_EQ(fp32_to_fp16(f), rb) << std::hex << u;
    }
}
#endif

// ---------------- bf16 ----------------

TEST(Bf16, KnownValues) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
    EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie -> even
    EXPECT_EQ(fp32_to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie -> even (up)
    EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808001)), 0x3F81);
    EXPECT_EQ(fp32_to_bf16(from_bits(0x3F807FFF)), 0x3F80);
    EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
    EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
    EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
    const uint16_t n = fp32_to_bf16(from_bits(0x7F800001));  // low-payload NaN stays NaN
    EXPECT_TRUE(std::isnan(bf16_to_fp32(n)));
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(from_bits(0xFFFFFFFF)))));
    EXPECT_EQ(bf16_to_fp32(0x4049), from_bits(0x40490000));
}

TEST(Bf16, RandomMatchesNearestEven) {
    std::mt19937 rng(11);
    std::uniform_int_distribution<uint32_t> any;
    for (int k = 0; k < 200000; ++k) {
        const uint32_t u = any(rng);
        const float f = from_bits(u);
        if (std::isnan(f) || std::isinf(f)) continue;
        // Oracle: the two bf16 neighbours, compared in double.
        const uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
        const double dlo = std::fabs(double(f) - double(from_bits(lo)));
        const double dhi = std::fabs(double(f) - (std::isinf(from_bits(hi)) ? std::ldexp(1.0, 128) * (f < 0 ? -1 : 1)
                                                                             : double(from_bits(hi))));
        uint16_t want = static_cast<uint16_t>((dlo < dhi || (dlo == dhi && ((lo >> 16) & 1) == 0)) ? lo >> 16 : hi >> 16);
        ASSERT_EQ(fp32_to_bf16(f), want) << std::hex << u;
    }
}

// ---------------- dequantization of hand-built blocks ----------------

struct Rng {
    std::mt19937 g;
    explicit Rng(uint32_t seed) : g(seed) {}
    int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
    float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g); }
    // A random non-zero f16 scale, returned as bits and exact value.
    uint16_t scale(float lo, float hi, float& value) {
        float v = uniform(lo, hi) * (uniform_int(0, 1) ? 1.0f : -1.0f);
        uint16_t h = fp32_to_fp16(v);
        value = fp16_to_fp32(h);
        return h;
    }
};

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
    b[at] = static_cast<uint8_t>(v);
    b[at + 1] = static_cast<uint8_t>(v >> 8);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-6f * (1.0f + std::fabs(want[i]))) << what << " element " << i;
    }
}

TEST(Dequant, Q8_0HandBuilt) {
    Rng r(1);
    const int nb = 5;  // odd block count
    std::vector<uint8_t> b(nb * 34);
    std::vector<float> want(nb * 32);
    for (int k = 0; k < nb; ++k) {
        float d;
        put16(b, k * 34, r.scale(0.001f, 2.0f, d));
        for (int i = 0; i < 32; ++i) {
            const int q = r.uniform_int(-128, 127);
            b[k * 34 + 2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
            want[k * 32 + i] = d * static_cast<float>(q);
        }
    }
    std::vector<float> got(want.size());
    dequantize_row(GgmlType::Q8_0, b.data(), got.data(), static_cast<int64_t>(got.size()));
    expect_close(got, want, "q8_0");
}

TEST(Dequant, Q4_0HandBuilt) {
    Rng r(2);
    const int nb = 3;
    std::vector<uint8_t> b(nb * 18);
    std::vector<float> want(nb * 32);
    for (int k = 0; k < nb; ++k) {
        float d;
        put16(b, k * 18, r.scale(0.001f, 2.0f, d));
        int q[32];
        for (int i = 0; i < 32; ++i) q[i] = r.uniform_int(0, 15);
        // Element j (< 16) is the low nibble of byte j, element j + 16 its high nibble.
        for (int j = 0; j < 16; ++j) b[k * 18 + 2 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
        for (int i = 0; i < 32; ++i) want[k * 32 + i] = d * static_cast<float>(q[i] - 8);
    }
    std::vector<float> got(want.size());
    dequantize_row(GgmlType::Q4_0, b.data(), got.data(), static_cast<int64_t>(got.size()));
    expect_close(got, want, "q4_0");
}

// Q4_K / Q5_K's 12 scale bytes from 8 (sc, m) pairs of 6 bits, the inverse of the spec's
// unpacking: low 6 bits of bytes 0-3 / 4-7 hold sc/m of sub-blocks 0-3; sub-blocks 4-7 keep
// their low 4 bits in bytes 8-11 and their top 2 bits in the top of bytes 0-3 (sc) and 4-7 (m).
void pack_q4k_scales(uint8_t* s, const int* sc, const int* m) {
    for (int j = 0; j < 4; ++j) {
        s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        s[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

TEST(Dequant, Q4_KHandBuilt) {
    Rng r(3);
    const int nb = 3;
    std::vector<uint8_t> b(nb * 144);
    std::vector<float> want(nb * 256);
    for (int k = 0; k < nb; ++k) {
        uint8_t* blk = b.data() + k * 144;
        float d, dmin;
        put16(b, k * 144, r.scale(0.0005f, 0.05f, d));
        put16(b, k * 144 + 2, r.scale(0.0005f, 0.05f, dmin));
        int sc[8], m[8];
        for (int j = 0; j < 8; ++j) {
            sc[j] = r.uniform_int(0, 63);
            m[j] = r.uniform_int(0, 63);
        }
        pack_q4k_scales(blk + 4, sc, m);
        // Element i belongs to sub-block i / 32. Within group g of 64 outputs, the first 32
        // are the low nibbles of qs[32g..32g+31] and the next 32 their high nibbles.
        int q[256];
        for (int i = 0; i < 256; ++i) q[i] = r.uniform_int(0, 15);
        for (int g = 0; g < 4; ++g) {
            for (int l = 0; l < 32; ++l) blk[16 + 32 * g + l] = static_cast<uint8_t>(q[64 * g + l] | (q[64 * g + 32 + l] << 4));
        }
        for (int i = 0; i < 256; ++i) {
            const int j = i / 32;
            want[k * 256 + i] = d * static_cast<float>(sc[j]) * static_cast<float>(q[i]) - dmin * static_cast<float>(m[j]);
        }
    }
    std::vector<float> got(want.size());
    dequantize_row(GgmlType::Q4_K, b.data(), got.data(), static_cast<int64_t>(got.size()));
    expect_close(got, want, "q4_K");
}

// Q5_K: Q4_K's layout with 32 high-bit bytes (offset 16) before the nibbles (offset 48):
// element 64g + l (l < 32) takes bit 2g of qh[l], element 64g + 32 + l bit 2g + 1.
TEST(Dequant, Q5_KHandBuilt) {
    Rng r(13);
    const int nb = 2;
    std::vector<uint8_t> b(nb * 176);
    std::vector<float> want(nb * 256);
    for (int k = 0; k < nb; ++k) {
        uint8_t* blk = b.data() + k * 176;
        float d, dmin;
        put16(b, k * 176, r.scale(0.0005f, 0.05f, d));
        put16(b, k * 176 + 2, r.scale(0.0005f, 0.05f, dmin));
        int sc[8], m[8];
        for (int j = 0; j < 8; ++j) sc[j] = r.uniform_int(0, 63), m[j] = r.uniform_int(0, 63);
        pack_q4k_scales(blk + 4, sc, m);
        int q[256];
        for (int i = 0; i < 256; ++i) q[i] = r.uniform_int(0, 31);
        for (int g = 0; g < 4; ++g)
            for (int l = 0; l < 32; ++l) {
                const int lo = q[64 * g + l], hi = q[64 * g + 32 + l];
                blk[48 + 32 * g + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
                blk[16 + l] = static_cast<uint8_t>(blk[16 + l] | ((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
            }
        for (int i = 0; i < 256; ++i)
            want[k * 256 + i] = d * static_cast<float>(sc[i / 32]) * static_cast<float>(q[i]) - dmin * static_cast<float>(m[i / 32]);
    }
    std::vector<float> got(want.size());
    dequantize_row(GgmlType::Q5_K, b.data(), got.data(), static_cast<int64_t>(got.size()));
    expect_close(got, want, "q5_K");
}

// IQ4_NL (blocks of 32) and IQ4_XS (256, 6-bit sub-block scales offset by 32: low 4 bits in
// scales_l[ib / 2] nibble ib % 2, top 2 in bits 2ib of scales_h) over ggml's 16-value codebook.
TEST(Dequant, Iq4HandBuilt) {
    static const int kCodebook[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    Rng r(14);
    {
        std::vector<uint8_t> b(18 * 2);
        std::vector<float> want(64);
        for (int k = 0; k < 2; ++k) {
            float d;
            put16(b, k * 18, r.scale(0.0005f, 0.05f, d));
            for (int j = 0; j < 16; ++j) {
                const int lo = r.uniform_int(0, 15), hi = r.uniform_int(0, 15);
                b[size_t(k * 18 + 2 + j)] = static_cast<uint8_t>(lo | (hi << 4));
                want[size_t(k * 32 + j)] = d * static_cast<float>(kCodebook[lo]);
                want[size_t(k * 32 + 16 + j)] = d * static_cast<float>(kCodebook[hi]);
            }
        }
        std::vector<float> got(want.size());
        dequantize_row(GgmlType::IQ4_NL, b.data(), got.data(), 64);
        expect_close(got, want, "iq4_nl");
    }
    std::vector<uint8_t> b(136);
    std::vector<float> want(256);
    float d;
    put16(b, 0, r.scale(0.0005f, 0.05f, d));
    unsigned scales_h = 0;
    int ls[8];
    for (int ib = 0; ib < 8; ++ib) {
        ls[ib] = r.uniform_int(0, 63);
        b[size_t(4 + ib / 2)] = static_cast<uint8_t>(b[size_t(4 + ib / 2)] | ((ls[ib] & 0xF) << (4 * (ib % 2))));
        scales_h |= unsigned(ls[ib] >> 4) << (2 * ib);
    }
    put16(b, 2, static_cast<uint16_t>(scales_h));
    for (int ib = 0; ib < 8; ++ib)
        for (int j = 0; j < 16; ++j) {
            const int lo = r.uniform_int(0, 15), hi = r.uniform_int(0, 15);
            b[size_t(8 + 16 * ib + j)] = static_cast<uint8_t>(lo | (hi << 4));
            want[size_t(32 * ib + j)] = d * static_cast<float>(ls[ib] - 32) * static_cast<float>(kCodebook[lo]);
            want[size_t(32 * ib + 16 + j)] = d * static_cast<float>(ls[ib] - 32) * static_cast<float>(kCodebook[hi]);
        }
    std::vector<float> got(256);
    dequantize_row(GgmlType::IQ4_XS, b.data(), got.data(), 256);
    expect_close(got, want, "iq4_xs");
}

TEST(Dequant, Q6_KHandBuilt) {
    Rng r(4);
    const int nb = 3;
    std::vector<uint8_t> b(nb * 210);
    std::vector<float> want(nb * 256);
    for (int k = 0; k < nb; ++k) {
        uint8_t* blk = b.data() + k * 210;
        uint8_t* ql = blk;
        uint8_t* qh = blk + 128;
        float d;
        put16(b, k * 210 + 208, r.scale(0.0005f, 0.05f, d));
        int sc[16];
        for (int j = 0; j < 16; ++j) {
            sc[j] = r.uniform_int(-128, 127);
            blk[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(sc[j]));
        }
        // Element i = 128n + 32k + l (k = quarter, l < 32) is a 6-bit q: its low 4 bits sit in
        // ql[64n + l + 32(k&1)] (low nibble for k < 2, high for k >= 2), its top 2 bits in
        // bits 2k..2k+1 of qh[32n + l]. Its scale is sc[i / 16].
        int q[256];
        for (int i = 0; i < 256; ++i) q[i] = r.uniform_int(0, 63);
        for (int i = 0; i < 256; ++i) {
            const int n = i / 128, quarter = (i % 128) / 32, l = i % 32;
            uint8_t& lo = ql[64 * n + l + 32 * (quarter & 1)];
            lo = static_cast<uint8_t>(lo | ((q[i] & 0xF) << (quarter >= 2 ? 4 : 0)));
            qh[32 * n + l] = static_cast<uint8_t>(qh[32 * n + l] | ((q[i] >> 4) << (2 * quarter)));
            want[k * 256 + i] = d * static_cast<float>(sc[i / 16]) * static_cast<float>(q[i] - 32);
        }
    }
    std::vector<float> got(want.size());
    dequantize_row(GgmlType::Q6_K, b.data(), got.data(), static_cast<int64_t>(got.size()));
    expect_close(got, want, "q6_K");
}

TEST(Dequant, PlainFloats) {
    Rng r(5);
    const int n = 37;
    std::vector<float> src(n);
    for (float& x : src) x = r.uniform(-3.0f, 3.0f);
    std::vector<uint16_t> h(n), bf(n);
    for (int i = 0; i < n; ++i) {
        h[i] = fp32_to_fp16(src[i]);
        bf[i] = fp32_to_bf16(src[i]);
    }
    std::vector<float> out(n);
    dequantize_row(GgmlType::F32, src.data(), out.data(), n);
    EXPECT_EQ(out, src);
    dequantize_row(GgmlType::F16, h.data(), out.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], fp16_to_fp32(h[i]));
    dequantize_row(GgmlType::BF16, bf.data(), out.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(out[i], bf16_to_fp32(bf[i]));
}

TEST(Dequant, RejectsPartialBlocks) {
    std::vector<uint8_t> b(34 * 2);
    std::vector<float> out(64);
    test::expect_error([&] { dequantize_row(GgmlType::Q8_0, b.data(), out.data(), 33); }, {"33", "q8_0"});
    test::expect_error([&] { quantize_row(GgmlType::Q4_K, out.data(), b.data(), 100); }, {"100", "q4_K", "256"});
}

// ---------------- quantization ----------------

TEST(Quant, Q8_0MatchesGgmlAndErrorBound) {
    Rng r(6);
    const int nb = 7;
    std::vector<float> src(nb * 32);
    for (int k = 0; k < nb; ++k) {
        const float mag = std::ldexp(1.0f, r.uniform_int(-8, 6));  // blocks of very different scale
        for (int i = 0; i < 32; ++i) src[k * 32 + i] = r.uniform(-mag, mag);
    }
    std::vector<BlockQ8_0> q(nb);
    quantize_row(GgmlType::Q8_0, src.data(), q.data(), static_cast<int64_t>(src.size()));
    std::vector<float> back(src.size());
    dequantize_row(GgmlType::Q8_0, q.data(), back.data(), static_cast<int64_t>(src.size()));
    for (int k = 0; k < nb; ++k) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[k * 32 + i]));
        const float d = amax / 127.0f;
        const float d16 = fp16_to_fp32(fp32_to_fp16(d));
        EXPECT_EQ(q[k].d, fp32_to_fp16(d));
        for (int i = 0; i < 32; ++i) {
            const float x = src[k * 32 + i];
            EXPECT_EQ(q[k].qs[i], static_cast<int8_t>(std::roundf(x * (1.0f / d))));
            // Rounding error d/2, plus the f16 rounding of the scale times |q| <= 127.
            const float bound = 0.5f * d + 127.0f * std::fabs(d - d16) + 1e-6f * amax;
            EXPECT_LE(std::fabs(back[k * 32 + i] - x), bound) << k << " " << i;
        }
    }
}

TEST(Quant, Q4_0ErrorBound) {
    Rng r(8);
    const int nb = 5;
    std::vector<float> src(nb * 32);
    for (float& x : src) x = r.uniform(-1.5f, 1.5f);
    std::vector<uint8_t> q(nb * 18);
    quantize_row(GgmlType::Q4_0, src.data(), q.data(), static_cast<int64_t>(src.size()));
    std::vector<float> back(src.size());
    dequantize_row(GgmlType::Q4_0, q.data(), back.data(), static_cast<int64_t>(src.size()));
    for (int k = 0; k < nb; ++k) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[k * 32 + i]));
        const float d = amax / 8.0f;
        // The extreme value maps to -8 exactly; the opposite end can clip from +8 to +7.
        for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(back[k * 32 + i] - src[k * 32 + i]), d * 1.01f);
    }
}

TEST(Quant, FloatTypesRoundTrip) {
    Rng r(9);
    const int n = 29;
    std::vector<float> src(n);
    for (float& x : src) x = r.uniform(-100.0f, 100.0f);
    std::vector<uint16_t> h(n);
    std::vector<float> back(n);
    quantize_row(GgmlType::F16, src.data(), h.data(), n);
    dequantize_row(GgmlType::F16, h.data(), back.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(back[i], src[i], std::fabs(src[i]) * 0x1p-11f);
    quantize_row(GgmlType::BF16, src.data(), h.data(), n);
    dequantize_row(GgmlType::BF16, h.data(), back.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(back[i], src[i], std::fabs(src[i]) * 0x1p-8f);
}


// The K-quant / IQ4 quantizers (ggml's reference ones, restated). Their exact bytes are
// checked against llama-quantize in tests/quantize; here: the error each type must stay
// within on Gaussian rows with outliers and blocks of very different scale, and the edge
// cases (all-zero and tiny blocks decode to zeros, the largest value keeps its sign).
struct KquantCase {
    GgmlType type;
    int block;
    double max_rel_rmse;  // RMSE / RMS of the input, over all rows
};

class KquantRoundTrip : public ::testing::TestWithParam<KquantCase> {};

TEST_P(KquantRoundTrip, ErrorWithinTheTypesBound) {
    const KquantCase c = GetParam();
    Rng r(11);
    const int n = 256 * 7;  // 7 super-blocks (56 IQ4_NL blocks)
    std::vector<float> src(n);
    for (int k = 0; k < n / 256; ++k) {
        const float mag = std::ldexp(1.0f, r.uniform_int(-10, 4));
        for (int i = 0; i < 256; ++i) {
            // Sum of uniforms ~ Gaussian, one outlier in 32.
            float g = 0;
            for (int u = 0; u < 4; ++u) g += r.uniform(-1.0f, 1.0f);
            if (r.uniform_int(0, 31) == 0) g *= 6.0f;
            src[k * 256 + i] = mag * g;
        }
    }
    const size_t bytes = static_cast<size_t>(n / c.block) * type_traits(c.type).block_bytes;
    std::vector<uint8_t> q(bytes);
    quantize_row(c.type, src.data(), q.data(), n);
    std::vector<float> back(n);
    dequantize_row(c.type, q.data(), back.data(), n);
    // Relative error per super-block (their scales differ by 2^14), averaged.
    double worst = 0;
    for (int k = 0; k < n / 256; ++k) {
        double e2 = 0, x2 = 0;
        for (int i = k * 256; i < (k + 1) * 256; ++i) {
            e2 += double(back[i] - src[i]) * double(back[i] - src[i]);
            x2 += double(src[i]) * double(src[i]);
        }
        worst = std::max(worst, std::sqrt(e2 / x2));
    }
    EXPECT_LE(worst, c.max_rel_rmse) << type_traits(c.type).name;
    EXPECT_GT(worst, c.max_rel_rmse / 4) << type_traits(c.type).name << ": suspiciously exact";
}

TEST_P(KquantRoundTrip, ZeroAndTinyBlocksDecodeToZero) {
    const KquantCase c = GetParam();
    const int n = 512;
    std::vector<float> src(n, 0.0f);
    for (int i = 256; i < n; ++i) src[i] = (i % 3 - 1) * 1e-20f;  // below ggml's 1e-15 threshold
    std::vector<uint8_t> q(static_cast<size_t>(n / c.block) * type_traits(c.type).block_bytes, 0xAB);
    quantize_row(c.type, src.data(), q.data(), n);
    std::vector<float> back(n, 1.0f);
    dequantize_row(c.type, q.data(), back.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(back[i], 0.0f, 1e-18f) << type_traits(c.type).name << " " << i;
}

INSTANTIATE_TEST_SUITE_P(Types, KquantRoundTrip,
                         ::testing::Values(KquantCase{GgmlType::Q4_K, 256, 0.13}, KquantCase{GgmlType::Q5_K, 256, 0.065},
                                           KquantCase{GgmlType::Q6_K, 256, 0.038}, KquantCase{GgmlType::IQ4_XS, 256, 0.15},
                                           KquantCase{GgmlType::IQ4_NL, 32, 0.15}, KquantCase{GgmlType::Q5_0, 32, 0.10},
                                           KquantCase{GgmlType::Q5_1, 32, 0.08}, KquantCase{GgmlType::MXFP4, 32, 0.22}),
                         [](const auto& info) { return std::string(type_traits(info.param.type).name); });

}  // namespace
}  // namespace alloy
