// K-quant prefill (GEMM) tiles on AVX2: Q4_K / Q5_K / Q6_K / IQ4_XS weights x Q8_K activations in the
// 16-token panel layout (matmul_kernels.h: q [G, K/4, 16, 4], d [G, K/256, 16], bsums
// [G, K/16, 16] as int32), for CPUs without AVX-512 VNNI (Zen 1-3, older Intel). Before this,
// those CPUs dequantized K-quant rows to fp32 for every prefill product.
//
// The arithmetic of matmul_kquant_avx512.cpp step for step, on two 8-lane halves per 16-token
// group: vpdpbusd becomes vpmaddubsw (unsigned codes x signed int8 activations -> pairs of
// int16: |2 * 63 * 128| < 2^15, no saturation) summed in int16 over a few quads, then one
// vpmaddwd by the sub-block scale (kInt16Run below); integer sums are exact in any order, and
// the scale and min terms and the fp32 steps are the same operations in the same order, so
// both paths give the same bits. IQ4_XS: its codebook values + 128 (u, up to 241, as the VNNI
// tile takes them) would overflow a vpmaddubsw pair, so u = 16 u_hi + u_lo goes in as two
// nibble codes (two vpmaddubsw, each run summed in int16 as Q4_K's) and the sub-block scale ls
// meets them as 16 ls and ls: the same integer sum of u x ls.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/matmul_kquant.h"

#define ALLOY_KQ2_TARGET __attribute__((target("avx2,fma,f16c")))

namespace alloy::cpu::mm {
namespace {

// 16 token lanes as two AVX2 halves.
struct I16 {
    __m256i lo, hi;
};
struct F16 {
    __m256 lo, hi;
};

ALLOY_KQ2_TARGET inline I16 load_i16(const void* p) {
    const auto* v = static_cast<const __m256i*>(p);
    return {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
}

// Quads summed in int16 before one vpmaddwd by the sub-block's scale: a vpmaddubsw lane is
// c0 x0 + c1 x1 with codes c <= 15 / 31 / 63 and Q8_K values |x| <= 128, so 8 / 4 / 2 quads
// stay below 2^15 (30720 / 31744 / 32256) and vpaddw is exact. Integer sums are exact in any
// order, so the result is the VNNI tile's (sum of codes x activations, times the scale).
template <KqKind kKind>
constexpr int kInt16Run = kKind == KqKind::Q4 || kKind == KqKind::Iq4 ? 8 : kKind == KqKind::Q5 ? 4 : 2;

template <KqKind kKind, int R, int NV>
ALLOY_KQ2_TARGET void kq_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0,
                              int64_t k1, float* tile, int ldt) {
    using In = KqTileIn<kKind>;
    constexpr bool kQ6 = In::kQ6, kIq4 = In::kIq4, kSigned = kQ6 || kIq4;  // signed scales in sc6
    constexpr int kSub = In::kSub, kSubs = In::kSubs;
    constexpr int kRun = kInt16Run<kKind>;
    const In in(W, r0, p, g0, R);

    F16 f[R * NV];
    for (auto& v : f) v = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    // Each row's 256 codes of the block, one byte each in element order; a quad's four bytes
    // are then broadcast straight from memory (a load, no shuffle-port uop as vpermd was).
    // IQ4_XS: codes = u_hi, codes_lo = u_lo.
    alignas(32) uint8_t codes[R][kQK];
    alignas(32) uint8_t codes_lo[kIq4 ? R : 1][kQK];
    for (int64_t b = k0 / kQK; b < k1 / kQK; ++b) {
        in.prefetch_next(R, b);
        uint8_t sc[R][16], mn[R][8];
        int8_t sc6[R][16];
        for (int r = 0; r < R; ++r) {
            in.scales(r, b, sc[r], mn[r], sc6[r]);
            for (int v = 0; v < kQK / 32; ++v) {
                const __m256i c = kq_code_vector<kKind>(in.block(r, b), v);
                if constexpr (kIq4) {
                    const __m256i m4 = _mm256_set1_epi8(0x0F);
                    _mm256_store_si256(reinterpret_cast<__m256i*>(codes[r] + 32 * v), _mm256_and_si256(_mm256_srli_epi16(c, 4), m4));
                    _mm256_store_si256(reinterpret_cast<__m256i*>(codes_lo[r] + 32 * v), _mm256_and_si256(c, m4));
                } else {
                    _mm256_store_si256(reinterpret_cast<__m256i*>(codes[r] + 32 * v), c);
                }
            }
        }
        I16 tot[R * NV];
        for (auto& v : tot) v = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int s = 0; s < kSubs; ++s) {
#pragma GCC unroll 4
            for (int j0 = 0; j0 < kSub / 4; j0 += kRun) {
                I16 acc[R * NV], acc_lo[kIq4 ? R * NV : 1];
#pragma GCC unroll 8
                for (int j = j0; j < j0 + kRun; ++j) {
                    const int qd = s * (kSub / 4) + j;
                    I16 xv[NV];
#pragma GCC unroll 4
                    for (int v = 0; v < NV; ++v) xv[v] = load_i16(in.quads(v, b) + qd * 64);
#pragma GCC unroll 4
                    for (int r = 0; r < R; ++r) {
                        const __m256i wv = _mm256_set1_epi32(load_as<int32_t>(codes[r] + 4 * qd));
#pragma GCC unroll 4
                        for (int v = 0; v < NV; ++v) {
                            const __m256i lo = _mm256_maddubs_epi16(wv, xv[v].lo), hi = _mm256_maddubs_epi16(wv, xv[v].hi);
                            I16& a = acc[r * NV + v];
                            a.lo = j == j0 ? lo : _mm256_add_epi16(a.lo, lo);
                            a.hi = j == j0 ? hi : _mm256_add_epi16(a.hi, hi);
                            // Opaque to the optimizer: GCC otherwise reassociates the run into
                            // a tree of all its products first and spills half of them.
                            asm("" : "+x"(a.lo), "+x"(a.hi));
                            if constexpr (kIq4) {
                                const __m256i wl = _mm256_set1_epi32(load_as<int32_t>(codes_lo[r] + 4 * qd));
                                const __m256i l2 = _mm256_maddubs_epi16(wl, xv[v].lo), h2 = _mm256_maddubs_epi16(wl, xv[v].hi);
                                I16& c = acc_lo[r * NV + v];
                                c.lo = j == j0 ? l2 : _mm256_add_epi16(c.lo, l2);
                                c.hi = j == j0 ? h2 : _mm256_add_epi16(c.hi, h2);
                                asm("" : "+x"(c.lo), "+x"(c.hi));
                            }
                        }
                    }
                }
#pragma GCC unroll 4
                for (int r = 0; r < R; ++r) {
                    const int ls = kSigned ? int(sc6[r][s]) : int(sc[r][s]);
                    const __m256i scale = _mm256_set1_epi16(int16_t(kIq4 ? 16 * ls : ls));  // IQ4_XS: u_hi's weight
#pragma GCC unroll 4
                    for (int v = 0; v < NV; ++v) {
                        I16& t = tot[r * NV + v];
                        t.lo = _mm256_add_epi32(t.lo, _mm256_madd_epi16(acc[r * NV + v].lo, scale));
                        t.hi = _mm256_add_epi32(t.hi, _mm256_madd_epi16(acc[r * NV + v].hi, scale));
                        if constexpr (kIq4) {
                            const __m256i s1 = _mm256_set1_epi16(int16_t(ls));
                            t.lo = _mm256_add_epi32(t.lo, _mm256_madd_epi16(acc_lo[r * NV + v].lo, s1));
                            t.hi = _mm256_add_epi32(t.hi, _mm256_madd_epi16(acc_lo[r * NV + v].hi, s1));
                        }
                    }
                }
            }
        }
        // The block-sum terms: Q6_K's -32 sum sc_s bsums_s, Q4_K's mins (kept apart for dmin).
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = in.block(r, b);
            const float d = _cvtsh_ss(load_u16(blk + (kQ6 ? 208 : 0)));
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                const int32_t* bs = in.bsums(v, b);
                // One vpmaddwd per pair of 16-value sums (bsums vector j) by the pair's two
                // multipliers as int16: the same exact integers as a product per sum.
                I16 corr = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j) {
                    const I16 x = load_i16(bs + j * kGroup);
                    const __m256i m = _mm256_set1_epi32(kq_scale_pair<kKind>(sc6[r], mn[r], j));
                    corr.lo = _mm256_add_epi32(corr.lo, _mm256_madd_epi16(x.lo, m));
                    corr.hi = _mm256_add_epi32(corr.hi, _mm256_madd_epi16(x.hi, m));
                }
                const float* dxp = in.dx(v, b);
                const __m256 dx[2] = {_mm256_loadu_ps(dxp), _mm256_loadu_ps(dxp + 8)};
                const __m256i tv[2] = {tot[r * NV + v].lo, tot[r * NV + v].hi};
                const __m256i cv[2] = {corr.lo, corr.hi};
                __m256* fv[2] = {&f[r * NV + v].lo, &f[r * NV + v].hi};
                for (int h = 0; h < 2; ++h) {
                    __m256 blockf;
                    if constexpr (kSigned) {
                        blockf = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(
                                                                      tv[h], _mm256_slli_epi32(cv[h], kIq4 ? 7 : 5))));
                    } else {
                        const float dmin = _cvtsh_ss(load_u16(blk + 2));
                        blockf = _mm256_fmsub_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(tv[h]),
                                                 _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(cv[h])));
                    }
                    *fv[h] = _mm256_fmadd_ps(dx[h], blockf, *fv[h]);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) {
            float* o = tile + r * ldt + v * kGroup;
            const __m256 prev_lo = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o);
            const __m256 prev_hi = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o + 8);
            _mm256_storeu_ps(o, _mm256_add_ps(prev_lo, f[r * NV + v].lo));
            _mm256_storeu_ps(o + 8, _mm256_add_ps(prev_hi, f[r * NV + v].hi));
        }
}

// 16 ymm registers: 2 rows x 1 group keeps acc, tot and f (4 each) and the activations in them.
constexpr int kRows = 2, kGroups = 1;

using TileImpl = void (*)(const WeightView&, int64_t, const ActPanel&, int64_t, int64_t, int64_t, float*, int);
const TileImpl kTables[4][kRows] = {{&kq_tile<KqKind::Q4, 1, 1>, &kq_tile<KqKind::Q4, 2, 1>},
                                    {&kq_tile<KqKind::Q5, 1, 1>, &kq_tile<KqKind::Q5, 2, 1>},
                                    {&kq_tile<KqKind::Q6, 1, 1>, &kq_tile<KqKind::Q6, 2, 1>},
                                    {&kq_tile<KqKind::Iq4, 1, 1>, &kq_tile<KqKind::Iq4, 2, 1>}};

template <KqKind kKind>
void tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0, int64_t k1,
              float* tile, int ldt) {
    (void)nv;  // always 1 (kGroups)
    kTables[int(kKind)][nr - 1](W, r0, p, g0, k0, k1, tile, ldt);
}

}  // namespace

TileKernel kquant_tile_avx2(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_K: return {tile_any<KqKind::Q4>, kRows, kGroups, kQ8Kc};
        case GgmlType::Q5_K: return {tile_any<KqKind::Q5>, kRows, kGroups, kQ8Kc};
        case GgmlType::Q6_K: return {tile_any<KqKind::Q6>, kRows, kGroups, kQ8Kc};
        case GgmlType::IQ4_XS: return {tile_any<KqKind::Iq4>, kRows, kGroups, kQ8Kc};
        default: return {};
    }
}

}  // namespace alloy::cpu::mm
