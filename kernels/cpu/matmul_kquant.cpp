// K-quant weights (Q4_K, Q5_K, Q6_K, and IQ4_XS on the same super-blocks) against Q8_K activations: the decode path (T <= 4) of the
// format most published GGUF files use (Q4_K_M = Q4_K with Q6_K for some tensors).
//
// Why Q8_K activations: it is ggml's vec_dot_type for every K-quant, so the products are the
// ones llama.cpp computes (same rounding of the activations, exact integer sums per
// super-block); and the weights stay packed, so a decode step reads 4.5 / 6.6 bits per weight
// instead of the fp32 rows the dequantizing path wrote and re-read.
//
// Q8_K (ggml's block_q8_K): per 256 values, float d, int8 q[256], int16 bsums[16] (sums of
// 16 consecutive q). quantize_q8k is ggml's quantize_row_q8_K_ref bit for bit (the x86 build
// calls the reference too): max = the first value of largest magnitude, iscale = -127 / max,
// q = min(127, nearest-even(iscale x)), d = 1 / iscale.
//
// Per (row, token, super-block) the dot is an exact integer sum, then
//   Q4_K, Q5_K: acc += (d_x d) sumi - (d_x dmin) summ,  sumi = sum_j sc_j (q . q8)_j,
//         summ = sum_j m_j (bsums[2j] + bsums[2j+1])   (8 sub-blocks of 32, 6-bit sc/m)
//   Q6_K: acc += (d_x d) (sum_s sc_s (q6 . q8)_s - 32 sum_s sc_s bsums_s)   (16 of 16)
// The scalar kernels below sum super-blocks in order, one fp32 expression each; the SIMD ones
// (matmul_kquant_rows.inc, matmul_kquant_vnni.cpp: every layout and ISA gives the same bits)
// keep Q6_K / IQ4_XS in 8 fp32 lanes and Q4_K / Q5_K in two FMA chains (acc, accm) added at the
// end. Each kernel's arithmetic per output does not depend on how many rows or tokens share
// the call, so verification reproduces decode bit for bit.
#include "kernels/cpu/matmul_kquant.h"

#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "format/quant.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul_gemv_rows.h"

namespace alloy::cpu::mm {

void quantize_q8k(const float* x, int64_t K, int8_t* q, float* d, int16_t* bsums) {
    for (int64_t b = 0; b < K / kQK; ++b) {
        const float* xb = x + b * kQK;
        int8_t* qb = q + b * kQK;
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < kQK; ++j) {
            const float ax = std::fabs(xb[j]);
            if (ax > amax) amax = ax, max = xb[j];
        }
        if (amax == 0.0f) {
            d[b] = 0.0f;
            std::memset(qb, 0, kQK);
            std::memset(bsums + b * 16, 0, 16 * sizeof(int16_t));
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < kQK; ++j) {
            // ggml's nearest_int: the 1.5 * 2^23 trick, i.e. round to nearest even.
            float v = iscale * xb[j] + 12582912.f;
            int32_t i;
            std::memcpy(&i, &v, 4);
            const int r = (i & 0x007fffff) - 0x00400000;
            qb[j] = int8_t(r < 127 ? r : 127);
        }
        for (int s = 0; s < 16; ++s) {
            int sum = 0;
            for (int i = 0; i < 16; ++i) sum += qb[s * 16 + i];
            bsums[b * 16 + s] = int16_t(sum);
        }
        d[b] = 1 / iscale;
    }
}

void quantize_q8k(Isa isa, const float* x, int64_t K, int8_t* q, float* d, int16_t* bsums) {
    if (isa == Isa::Avx512 || isa == Isa::Avx2) quantize_q8k_avx2(x, K, q, d, bsums);
    else quantize_q8k(x, K, q, d, bsums);
}

void q8k_round_row(const float* x, int64_t K, float* out) {
    int8_t q[kQK];
    float d;
    int16_t bs[16];
    for (int64_t b = 0; b < K / kQK; ++b) {
        quantize_q8k(x + b * kQK, kQK, q, &d, bs);
        for (int j = 0; j < kQK; ++j) out[b * kQK + j] = float(q[j]) * d;
    }
}

void q4k_unpack_scales(const uint8_t* s12, uint8_t* sc, uint8_t* m) {
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            sc[j] = s12[j] & 63;
            m[j] = s12[j + 4] & 63;
        } else {
            sc[j] = uint8_t((s12[j + 4] & 0xF) | ((s12[j - 4] >> 6) << 4));
            m[j] = uint8_t((s12[j + 4] >> 4) | ((s12[j] >> 6) << 4));
        }
    }
}

namespace {

// Each type's group block (matmul_kquant.h) as the byte runs of row r that it moves:
// copy(at, from, n) for the n bytes at `from` in the row's GGUF block that stand at `at` in the
// group block. One map serves both directions, so repacking and unpacking cannot disagree.
// The bytes before a type's codes in its group block (d, dmin / scales, 16 rows at once), and
// the codes: map = head + codes.
template <class Copy>
void q4k_head(int r, Copy&& copy) {
    copy(2 * r, 0, 2);       // d
    copy(32 + 2 * r, 2, 2);  // dmin
    for (int v = 0; v < 3; ++v) copy(64 + 64 * v + 4 * r, 4 + 4 * v, 4);  // scale dwords
}
template <bool kQ5, class Copy>
void q4k_map(int r, Copy&& copy) {
    q4k_head(r, copy);
    for (int i = 0; i < 8; ++i) {
        if constexpr (kQ5) {
            const int quad = 256 + 320 * i;
            copy(quad + 4 * r, 16 + 4 * i, 4);  // the fifth bits of the quad's 4 positions
            for (int g = 0; g < 4; ++g) copy(quad + 64 + 64 * g + 4 * r, 48 + 32 * g + 4 * i, 4);
        } else {
            for (int g = 0; g < 4; ++g) copy(256 + 64 * (4 * i + g) + 4 * r, 16 + 32 * g + 4 * i, 4);
        }
    }
}

template <class Copy>
void q6k_head(int r, Copy&& copy) {
    copy(2 * r, 208, 2);
    for (int k = 0; k < 16; ++k) copy(32 + 16 * k + r, 192 + k, 1);
}
template <class Copy>
void q6k_map(int r, Copy&& copy) {
    q6k_head(r, copy);
    for (int i = 0; i < 8; ++i)
        for (int h = 0; h < 2; ++h) {
            const int c = 288 + 192 * (2 * i + h) + 4 * r;
            copy(c, 64 * h + 4 * i, 4);
            copy(c + 64, 64 * h + 32 + 4 * i, 4);
            copy(c + 128, 128 + 32 * h + 4 * i, 4);
        }
}

template <class Copy>
void iq4xs_head(int r, Copy&& copy) {
    copy(2 * r, 0, 2);       // d
    copy(32 + 2 * r, 2, 2);  // scales_h
    for (int k = 0; k < 4; ++k) copy(64 + 16 * k + r, 4 + k, 1);
}
template <class Copy>
void iq4xs_map(int r, Copy&& copy) {
    iq4xs_head(r, copy);
    for (int j = 0; j < 4; ++j)
        for (int s = 0; s < 8; ++s) copy(128 + 64 * (8 * j + s) + 4 * r, 8 + 16 * s + 4 * j, 4);
}

// f(map, block bytes) with t's map (a generic lambda taking (r, copy)), or with kHead its head
// map only: the type chosen once.
template <bool kHead = false, class F>
void with_map(GgmlType t, F&& f) {
    switch (t) {
        case GgmlType::Q4_K:
            if constexpr (kHead) return f([](int r, auto&& c) { q4k_head(r, c); }, kQ4KBytes);
            else return f([](int r, auto&& c) { q4k_map<false>(r, c); }, kQ4KBytes);
        case GgmlType::Q5_K:
            if constexpr (kHead) return f([](int r, auto&& c) { q4k_head(r, c); }, kQ5KBytes);
            else return f([](int r, auto&& c) { q4k_map<true>(r, c); }, kQ5KBytes);
        case GgmlType::Q6_K:
            if constexpr (kHead) return f([](int r, auto&& c) { q6k_head(r, c); }, kQ6KBytes);
            else return f([](int r, auto&& c) { q6k_map(r, c); }, kQ6KBytes);
        case GgmlType::IQ4_XS:
            if constexpr (kHead) return f([](int r, auto&& c) { iq4xs_head(r, c); }, kIq4XsBytes);
            else return f([](int r, auto&& c) { iq4xs_map(r, c); }, kIq4XsBytes);
        default: return;
    }
}

// A group block's codes as dword transposes, for kq_unpack_group: n vectors of the 16 rows'
// dwords (row r's at 4 r), vector j at src + j * stride in the group block, are row r's 4 n
// bytes at `to` in its GGUF block. The code copies of the maps above, grouped by destination
// run (KqRepack.GroupUnpackGivesEveryRowsBytes compares the two on every type).
struct CodeRun {
    int src, stride, n, to;
};
struct GroupCodes {
    int n_runs = 0;
    CodeRun runs[8];
};
GroupCodes group_codes(GgmlType t) {
    GroupCodes c;
    auto add = [&](int src, int stride, int n, int to) { c.runs[c.n_runs++] = {src, stride, n, to}; };
    switch (t) {
        case GgmlType::Q4_K:
            for (int g = 0; g < 4; ++g) add(256 + 64 * g, 256, 8, 16 + 32 * g);
            break;
        case GgmlType::Q5_K:
            add(256, 320, 8, 16);
            for (int g = 0; g < 4; ++g) add(256 + 64 + 64 * g, 320, 8, 48 + 32 * g);
            break;
        case GgmlType::Q6_K:
            for (int h = 0; h < 2; ++h) {
                add(288 + 192 * h, 384, 8, 64 * h);
                add(288 + 192 * h + 64, 384, 8, 64 * h + 32);
                add(288 + 192 * h + 128, 384, 8, 128 + 32 * h);
            }
            break;
        case GgmlType::IQ4_XS:
            for (int s = 0; s < 8; ++s) add(128 + 64 * s, 512, 4, 8 + 16 * s);
            break;
        default: break;
    }
    return c;
}

// One run for all 16 rows (row r's block at out + r * rb): per half of the rows an 8 x 8 (or
// 4 x 8) dword transpose in ymm registers.
__attribute__((target("avx2"))) void transpose_run(const uint8_t* grp, const CodeRun& c, uint8_t* out, size_t rb) {
    for (int half = 0; half < 2; ++half) {
        const uint8_t* s = grp + c.src + 32 * half;
        uint8_t* o = out + size_t(8 * half) * rb + c.to;
#define ld(j) _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + size_t(j) * c.stride))
        if (c.n == 8) {
            __m256i a[8], t[8], u[8];
            for (int j = 0; j < 8; ++j) a[j] = ld(j);
            for (int j = 0; j < 8; j += 2) t[j] = _mm256_unpacklo_epi32(a[j], a[j + 1]), t[j + 1] = _mm256_unpackhi_epi32(a[j], a[j + 1]);
            // u[4 q + k]: rows k and k + 4 of vectors 4 q .. 4 q + 3 (128-bit lanes)
            for (int q = 0; q < 2; ++q) {
                u[4 * q + 0] = _mm256_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
                u[4 * q + 1] = _mm256_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
                u[4 * q + 2] = _mm256_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
                u[4 * q + 3] = _mm256_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
            }
            for (int k = 0; k < 4; ++k) {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + size_t(k) * rb), _mm256_permute2x128_si256(u[k], u[4 + k], 0x20));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + size_t(k + 4) * rb), _mm256_permute2x128_si256(u[k], u[4 + k], 0x31));
            }
        } else {  // n == 4: 16 bytes a row
            const __m256i t0 = _mm256_unpacklo_epi32(ld(0), ld(1)), t1 = _mm256_unpackhi_epi32(ld(0), ld(1));
            const __m256i t2 = _mm256_unpacklo_epi32(ld(2), ld(3)), t3 = _mm256_unpackhi_epi32(ld(2), ld(3));
            const __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2), _mm256_unpacklo_epi64(t1, t3),
                                  _mm256_unpackhi_epi64(t1, t3)};
            for (int k = 0; k < 4; ++k) {
                _mm_storeu_si128(reinterpret_cast<__m128i*>(o + size_t(k) * rb), _mm256_castsi256_si128(u[k]));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(o + size_t(k + 4) * rb), _mm256_extracti128_si256(u[k], 1));
            }
        }
#undef ld
    }
}

}  // namespace

void kq_repack_group(GgmlType t, const uint8_t* src, int64_t nb, uint8_t* dst) {
    with_map(t, [&](auto map, int bb) {
        const size_t rb = size_t(nb) * bb;
        for (int64_t b = 0; b < nb; ++b, dst += kQ4KGroupRows * bb)
            for (int r = 0; r < kQ4KGroupRows; ++r) {
                const uint8_t* blk = src + r * rb + b * bb;
                map(r, [&](int at, int from, int n) { std::memcpy(dst + at, blk + from, size_t(n)); });
            }
    });
}

void kq_unpack_group_row(GgmlType t, const uint8_t* grp, int64_t nb, int r, uint8_t* out) {
    with_map(t, [&](auto map, int bb) {
        for (int64_t b = 0; b < nb; ++b, grp += kQ4KGroupRows * bb, out += bb)
            map(r, [&](int at, int from, int n) { std::memcpy(out + from, grp + at, size_t(n)); });
    });
}

void kq_unpack_group(GgmlType t, const uint8_t* grp, int64_t nb, uint8_t* out, Isa isa) {
    const size_t rb = size_t(nb) * type_traits(t).block_bytes;
    if (isa < Isa::Avx2) {
        for (int r = 0; r < kQ4KGroupRows; ++r) kq_unpack_group_row(t, grp, nb, r, out + r * rb);
        return;
    }
    const GroupCodes codes = group_codes(t);
    with_map<true>(t, [&](auto head, int bb) {
        for (int64_t b = 0; b < nb; ++b, grp += kQ4KGroupRows * bb, out += bb) {
            for (int r = 0; r < kQ4KGroupRows; ++r)
                head(r, [&](int at, int from, int n) { std::memcpy(out + r * rb + from, grp + at, size_t(n)); });
            for (int i = 0; i < codes.n_runs; ++i) transpose_run(grp, codes.runs[i], out, rb);
        }
    });
}

const uint8_t* kq_gguf_row(const WeightView& W, int64_t r, uint8_t* buf) {
    if (W.layout != WeightLayout::KqRows16 || r >= W.n_out / kQ4KGroupRows * kQ4KGroupRows) return W.row(r);
    kq_unpack_group_row(W.type, W.row(r - r % kQ4KGroupRows), W.n_in / kQK, int(r % kQ4KGroupRows), buf);
    return buf;
}

namespace {

// Row w (Q4_K, or Q5_K with its fifth bits) . token (Q8_K q, d, bsums), K / 256 super-blocks.
template <bool kQ5>
float q4k_dot(const uint8_t* w, const int8_t* q8, const float* dx, const int16_t* bs, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b, w += kQ5 ? kQ5KBytes : kQ4KBytes, q8 += kQK, bs += 16) {
        const float d = fp16_to_fp32(load_u16(w)), dmin = fp16_to_fp32(load_u16(w + 2));
        uint8_t sc[8], m[8];
        q4k_unpack_scales(w + 4, sc, m);
        const uint8_t* qh = w + 16;
        const uint8_t* qs = w + (kQ5 ? 48 : 16);
        int32_t sumi = 0, summ = 0;
        for (int g = 0; g < 4; ++g) {
            int32_t lo = 0, hi = 0;
            for (int l = 0; l < 32; ++l) {
                const int h0 = kQ5 ? ((qh[l] >> (2 * g)) & 1) << 4 : 0, h1 = kQ5 ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0;
                lo += ((qs[g * 32 + l] & 0xF) | h0) * q8[g * 64 + l];
                hi += ((qs[g * 32 + l] >> 4) | h1) * q8[g * 64 + 32 + l];
            }
            sumi += sc[2 * g] * lo + sc[2 * g + 1] * hi;
        }
        for (int j = 0; j < 8; ++j) summ += m[j] * (bs[2 * j] + bs[2 * j + 1]);
        acc += (dx[b] * d) * float(sumi) - (dx[b] * dmin) * float(summ);
    }
    return acc;
}

// Row w (Q6_K) . token.
float q6k_dot(const uint8_t* w, const int8_t* q8, const float* dx, const int16_t* bs, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b, w += kQ6KBytes, q8 += kQK, bs += 16) {
        const uint8_t* ql = w;
        const uint8_t* qh = w + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
        const float d = fp16_to_fp32(load_u16(w + 208));
        int32_t sumi = 0;
        for (int h = 0; h < 2; ++h) {
            int32_t part[8] = {};  // 4 groups of 32 x 2 scales of 16
            for (int l = 0; l < 32; ++l) {
                const uint8_t a = ql[h * 64 + l], c = ql[h * 64 + 32 + l], e = qh[h * 32 + l];
                const int q0 = (a & 0xF) | ((e & 3) << 4), q1 = (c & 0xF) | (((e >> 2) & 3) << 4);
                const int q2 = (a >> 4) | (((e >> 4) & 3) << 4), q3 = (c >> 4) | (((e >> 6) & 3) << 4);
                const int8_t* x = q8 + h * 128 + l;
                part[0 + l / 16] += q0 * x[0];
                part[2 + l / 16] += q1 * x[32];
                part[4 + l / 16] += q2 * x[64];
                part[6 + l / 16] += q3 * x[96];
            }
            for (int s = 0; s < 8; ++s) sumi += sc[h * 8 + s] * part[s];
        }
        int32_t corr = 0;
        for (int s = 0; s < 16; ++s) corr += sc[s] * bs[s];
        acc += (dx[b] * d) * float(sumi - 32 * corr);
    }
    return acc;
}

// Row w (IQ4_XS) . token: 8 sub-blocks of 32 codebook values, scale ls - 32 each.
float iq4xs_dot(const uint8_t* w, const int8_t* q8, const float* dx, const int16_t*, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b, w += kIq4XsBytes, q8 += kQK) {
        const float d = fp16_to_fp32(load_u16(w));
        const unsigned sh = load_u16(w + 2);
        int32_t sumi = 0;
        for (int ib = 0; ib < 8; ++ib) {
            const int ls = ((w[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
            int32_t dot = 0;
            for (int j = 0; j < 16; ++j) {
                const uint8_t c = w[8 + 16 * ib + j];
                dot += kIq4nlValues[c & 0xF] * q8[32 * ib + j] + kIq4nlValues[c >> 4] * q8[32 * ib + 16 + j];
            }
            sumi += (ls - 32) * dot;
        }
        acc += (dx[b] * d) * float(sumi);
    }
    return acc;
}

template <float (*Dot)(const uint8_t*, const int8_t*, const float*, const int16_t*, int64_t)>
void gemv_scalar(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                 int64_t ldy) {
    const int64_t nb = a.K / kQK;
    for (int64_t r = r0; r < r0 + nr; ++r)
        for (int t = 0; t < nt; ++t) {
            const int64_t tt = t0 + t;
            y[tt * ldy + r] = Dot(W.row(r), a.q + tt * a.K, a.d + tt * nb, a.bsums + tt * (a.K / 16), nb);
        }
}

// The scalar GEMV of a KqRows16 matrix: each row unpacked to its GGUF bytes, then its dot.
template <float (*Dot)(const uint8_t*, const int8_t*, const float*, const int16_t*, int64_t)>
void kq_r16_gemv_scalar(const WeightView& W, int64_t r0, int64_t nr, const ActRows& a, int64_t t0, int nt, float* y,
                         int64_t ldy) {
    const int64_t nb = a.K / kQK;
    std::vector<uint8_t> buf(W.row_bytes);
    for (int64_t r = r0; r < r0 + nr; ++r) {
        const uint8_t* row = kq_gguf_row(W, r, buf.data());
        for (int t = 0; t < nt; ++t) {
            const int64_t tt = t0 + t;
            y[tt * ldy + r] = Dot(row, a.q + tt * a.K, a.d + tt * nb, a.bsums + tt * (a.K / 16), nb);
        }
    }
}

}  // namespace

// Whether the 256-bit VNNI GEMVs over GGUF rows (the same bits as the AVX2 ones) are taken:
// on every AVX512-VNNI CPU unless ALLOY_KQ_VNNI=0 (A/B). Sessions before 2026-12-05 kept the
// AVX2 ones on Intel (their vpdpwssd chains were slower there); since the Q4_K / Q5_K kernels
// sum a super-block in int32 first, VNNI is 3-7% faster on the Intel Xeon too (0.8B tg64 with
// ALLOY_KQ_REPACK=0, 2026-12-05: Q4_K_M 37.4 -> 40.0, Q5_K_M 35.8 -> 36.9, IQ4_XS 36.9 -> 38.3).
static bool kq_vnni_rows() {
    static const bool on = [] { const char* e = std::getenv("ALLOY_KQ_VNNI"); return !e || std::atoi(e) != 0; }();
    return on;
}

GemvFn kquant_gemv(GgmlType type, Isa isa) {
    if (isa >= Isa::Avx512 && cpu_has_avx512_vnni() && kq_vnni_rows()) {
        if (GemvFn f = kquant_gemv_vnni(type)) return f;
    }
    if (isa >= Isa::Avx2) {
        if (GemvFn f = kquant_gemv_avx2(type)) return f;
    }
    switch (type) {
        case GgmlType::Q4_K: return gemv_scalar<q4k_dot<false>>;
        case GgmlType::Q5_K: return gemv_scalar<q4k_dot<true>>;
        case GgmlType::Q6_K: return gemv_scalar<q6k_dot>;
        case GgmlType::IQ4_XS: return gemv_scalar<iq4xs_dot>;
        default: return nullptr;
    }
}

GemvFn kq_r16_gemv(GgmlType t, Isa isa) {
    if (!kq_repacks(t)) return nullptr;
    // On AVX-512 with VNNI the 512-bit kernels (16 rows a vector, a sub-block's sums by
    // vpdpbusd in int32) on every vendor: on the Intel Xeon (KVM, family 6 model 167) they
    // decode the 0.8B Q4_K_M / Q5_K_M / IQ4_XS at 47 / 44 / 49 t/s where the AVX2 ones (the
    // earlier choice there) gave 32 / 31 / 35 (2026-12-05).
    // ALLOY_KQ_R16_ZMM=0 takes the 256-bit kernels of kquant_gemv's choice instead (A/B, the
    // same bits).
    if (isa >= Isa::Avx512 && cpu_has_avx512_vnni()) {
        static const bool zmm = [] { const char* e = std::getenv("ALLOY_KQ_R16_ZMM"); return !e || std::atoi(e) != 0; }();
        if (zmm) return kq_r16_gemv_zmm(t);
        if (kq_vnni_rows()) return kq_r16_gemv_vnni(t);
    }
    if (isa >= Isa::Avx2) return kq_r16_gemv_avx2(t);
    switch (t) {
        case GgmlType::Q4_K: return kq_r16_gemv_scalar<q4k_dot<false>>;
        case GgmlType::Q5_K: return kq_r16_gemv_scalar<q4k_dot<true>>;
        case GgmlType::Q6_K: return kq_r16_gemv_scalar<q6k_dot>;
        default: return kq_r16_gemv_scalar<iq4xs_dot>;
    }
}

}  // namespace alloy::cpu::mm
