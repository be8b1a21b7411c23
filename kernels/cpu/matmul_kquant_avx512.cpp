// K-quant prefill (GEMM) tiles on AVX-512 VNNI: Q4_K / Q5_K / Q6_K / IQ4_XS weights x Q8_K activations in the
// 16-token panel layout (matmul_kernels.h: q [G, K/4, 16, 4], d [G, K/256, 16], bsums
// [G, K/16, 16] as int32). Same arithmetic as the decode kernels per super-block (exact
// integer sums, then fp32), in another order of the fp32 steps.
//
// vpdpbusd wants its first operand unsigned: here that is the weights, whose codes are
// unsigned (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63), so the signed int8 activations go in as they are and no
// correction is needed for the codes themselves. Per row and block the 256 code bytes are
// unpacked once by vector ops (kq_code_vector); per k-quad the row's 4 bytes are broadcast from
// there (a load) and meet NV activation vectors.
//   Q4_K, Q5_K: per sub-block j of 32 (8 quads): s_j = sum q4 x (16 token lanes, int32);
//         tot += s_j * sc_j; the mins: mm = sum_j m_j (bsums[2j] + bsums[2j+1]);
//         f += d_x (d tot - dmin mm).
//   Q6_K: per sub-block s of 16 (4 quads): tot += (sum q6 x) * sc_s, then
//         tot -= 32 sum_s sc_s bsums_s (the codes' +32 offset); f += d_x d tot.
//   IQ4_XS: the codebook values + 128 (kIq4Plus128) per sub-block s of 32: tot += (sum u x) *
//         ls_s, then tot -= 128 sum_s ls_s (bsums[2s] + bsums[2s+1]); f += d_x d tot: ggml's
//         integer sum of codebook values x activations per super-block, exactly.
// GCC 12's AVX-512 intrinsic headers use _mm512_undefined_* internally and trip this warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/matmul_kquant.h"

#define ALLOY_KQ512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))

namespace alloy::cpu::mm {
namespace {

template <KqKind kKind, int R, int NV>
ALLOY_KQ512_TARGET void kq_tile(const WeightView& W, int64_t r0, const ActPanel& p, int64_t g0, int64_t k0,
                                int64_t k1, float* tile, int ldt) {
    using In = KqTileIn<kKind>;
    constexpr bool kQ6 = In::kQ6, kIq4 = In::kIq4, kSigned = kQ6 || kIq4;  // signed scales in sc6
    constexpr int kSub = In::kSub, kSubs = In::kSubs;
    const In in(W, r0, p, g0, R);

    __m512 f[R * NV];
#pragma GCC unroll 16
    for (int i = 0; i < R * NV; ++i) f[i] = _mm512_setzero_ps();
    // Each row's 256 code bytes of the block (IQ4_XS: its codebook values + 128), unpacked once
    // with vector ops and then broadcast a quad at a time from memory: a load, where extracting
    // a quad from the packed bytes in general registers cost ~4 scalar ops and a vector-port
    // broadcast per quad and row (Q6_K ran at about half of Q4_K's MAC rate that way).
    alignas(64) uint8_t u[R][kQK];
    for (int64_t b = k0 / kQK; b < k1 / kQK; ++b) {
        in.prefetch_next(R, b);
        uint8_t sc[R][16], mn[R][8];
        int8_t sc6[R][16];
        for (int r = 0; r < R; ++r) in.scales(r, b, sc[r], mn[r], sc6[r]);
        for (int r = 0; r < R; ++r)
            for (int v = 0; v < kQK / 32; ++v)
                _mm256_store_si256(reinterpret_cast<__m256i*>(u[r] + 32 * v), kq_code_vector<kKind>(in.block(r, b), v));
        __m512i tot[R * NV];
#pragma GCC unroll 16
        for (int i = 0; i < R * NV; ++i) tot[i] = _mm512_setzero_si512();
        for (int s = 0; s < kSubs; ++s) {
            __m512i acc[R * NV];
#pragma GCC unroll 16
            for (int i = 0; i < R * NV; ++i) acc[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int j = 0; j < kSub / 4; ++j) {
                const int qd = s * (kSub / 4) + j;
                __m512i xv[NV];
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) xv[v] = _mm512_load_si512(in.quads(v, b) + qd * 64);
#pragma GCC unroll 4
                for (int r = 0; r < R; ++r) {
                    const __m512i wv = _mm512_set1_epi32(load_i32(u[r] + 4 * qd));
#pragma GCC unroll 4
                    for (int v = 0; v < NV; ++v) acc[r * NV + v] = _mm512_dpbusd_epi32(acc[r * NV + v], wv, xv[v]);
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
                const __m512i scale = _mm512_set1_epi32(kSigned ? int(sc6[r][s]) : int(sc[r][s]));
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v)
                    tot[r * NV + v] = _mm512_add_epi32(tot[r * NV + v], _mm512_mullo_epi32(acc[r * NV + v], scale));
            }
        }
        // The block-sum terms: Q6_K's -32 sum sc_s bsums_s, IQ4_XS's -128 sum ls_s bsums_s,
        // Q4_K's mins (kept apart for dmin).
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
            const uint8_t* blk = in.block(r, b);
            const float d = _cvtsh_ss(load_u16(blk + (kQ6 ? 208 : 0)));
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) {
                const int32_t* bs = in.bsums(v, b);
                // One vpdpwssd per pair of 16-value sums (bsums vector j) by the pair's two
                // multipliers as int16: the same exact integers as a product per sum.
                __m512i corr = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int j = 0; j < 8; ++j)
                    corr = _mm512_dpwssd_epi32(corr, _mm512_load_si512(bs + j * kGroup),
                                               _mm512_set1_epi32(kq_scale_pair<kKind>(sc6[r], mn[r], j)));
                const __m512 dx = _mm512_load_ps(in.dx(v, b));
                __m512 blockf;
                if constexpr (kSigned) {
                    blockf = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_sub_epi32(
                                                                  tot[r * NV + v], _mm512_slli_epi32(corr, kIq4 ? 7 : 5))));
                } else {
                    const float dmin = _cvtsh_ss(load_u16(blk + 2));
                    blockf = _mm512_fmsub_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(tot[r * NV + v]),
                                             _mm512_mul_ps(_mm512_set1_ps(dmin), _mm512_cvtepi32_ps(corr)));
                }
                f[r * NV + v] = _mm512_fmadd_ps(dx, blockf, f[r * NV + v]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float* o = tile + r * ldt + v * kGroup;
            const __m512 prev = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(o);
            _mm512_storeu_ps(o, _mm512_add_ps(prev, f[r * NV + v]));
        }
}

// 2 rows x 4 token groups (64 tokens): 8 accumulators, 8 block sums and 8 outputs in registers,
// one broadcast per 4 vpdpbusd (4 rows x 2 groups: per 2). Xeon, 0.8B pp512, two rounds:
// Q5_K_M 262 -> 313 t/s, Q4_K_M +2-8%, IQ4_XS equal (before the codes were unpacked once).
constexpr int kRows = 2, kGroups = 4;

using TileImpl = void (*)(const WeightView&, int64_t, const ActPanel&, int64_t, int64_t, int64_t, float*, int);
#define ALLOY_KQ_ROW(K, R) {&kq_tile<K, R, 1>, &kq_tile<K, R, 2>, &kq_tile<K, R, 3>, &kq_tile<K, R, 4>}
#define ALLOY_KQ_TABLE(K) {ALLOY_KQ_ROW(K, 1), ALLOY_KQ_ROW(K, 2)}
const TileImpl kTables[4][kRows][kGroups] = {ALLOY_KQ_TABLE(KqKind::Q4), ALLOY_KQ_TABLE(KqKind::Q5),
                                             ALLOY_KQ_TABLE(KqKind::Q6), ALLOY_KQ_TABLE(KqKind::Iq4)};
#undef ALLOY_KQ_TABLE
#undef ALLOY_KQ_ROW

template <KqKind kKind>
void tile_any(const WeightView& W, int64_t r0, int nr, const ActPanel& p, int64_t g0, int nv, int64_t k0, int64_t k1,
              float* tile, int ldt) {
    kTables[int(kKind)][nr - 1][nv - 1](W, r0, p, g0, k0, k1, tile, ldt);
}

}  // namespace

TileKernel kquant_tile_avx512(GgmlType type) {
    if (!cpu_has_avx512_vnni()) return {};
    switch (type) {
        case GgmlType::Q4_K: return {tile_any<KqKind::Q4>, kRows, kGroups, kQ8Kc};
        case GgmlType::Q5_K: return {tile_any<KqKind::Q5>, kRows, kGroups, kQ8Kc};
        case GgmlType::Q6_K: return {tile_any<KqKind::Q6>, kRows, kGroups, kQ8Kc};
        case GgmlType::IQ4_XS: return {tile_any<KqKind::Iq4>, kRows, kGroups, kQ8Kc};
        default: return {};
    }
}

}  // namespace alloy::cpu::mm
