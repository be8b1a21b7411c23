// AVX-512 block of cpu::attention (head_dim % 16 == 0), fp32 arithmetic on fp32 or f16 caches.
//
// Per key tile (kKeyTile keys) the block does, for all its rows at once:
//   S = Q K^T      4x4 register tiles: 16 zmm accumulators over hd, one transpose-reduce
//   online softmax per row over the tile (masked by causality only on diagonal tiles)
//   O = alpha * O + P V   4 rows x 64 columns in 16 zmm accumulators, P broadcast from L1
// Q rows are pre-scaled by scale * log2(e) so the softmax is exp2 of a difference.
// Prefill blocks with an f16 K cache (off the decode grid, at most kMaxPrefillRows rows) take
// the transposed path instead for S and the softmax (tile_softmax_t): 11% faster on a
// 512-token chunk at depth 3584 (167 -> 186 GFLOP/s, Zen 4, 2 threads). Such a block holds
// its rows in lane sets of kLanes and converts each K and V tile once for all of them (64
// rows instead of 32: ~186 -> ~198 GFLOP/s, the conversions fell from ~9% to ~5% of the op).
//
// f16 caches: the microkernels are templated on the element type and convert with
// vcvtph2ps as they load (decode: one row tile, each converted vector feeds 4 rows); when a
// tile is reused by several row tiles (prefill) it is converted once into a per-thread fp32
// tile instead. Either way the values are the exact fp32 images of the halves.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx512.h"

namespace alloy::cpu::attn {
namespace {

// Sums each of 16 vectors; lane 4r + c of the result is the sum of v[4c + r]
// (four levels of shuffle + add, 45 instructions for 16 full reductions).
ALLOY_TARGET_AVX512 inline __m512 reduce16(const __m512 (&v)[16]) {
    __m512 c[8], e[4], f[2];
    for (int i = 0; i < 8; ++i)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i)
        e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i) {
        const __m512d x = _mm512_castps_pd(e[2 * i]), y = _mm512_castps_pd(e[2 * i + 1]);
        f[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    return _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// A bf16 cache element (an IEEE half is a plain uint16_t).
struct Bf16 {
    uint16_t bits;
};

// 16 consecutive elements of a cache row as fp32 (E = float, uint16_t for IEEE half, Bf16).
template <class E>
ALLOY_TARGET_AVX512 inline __m512 load16(const E* p) {
    if constexpr (std::is_same_v<E, float>)
        return _mm512_loadu_ps(p);
    else if constexpr (std::is_same_v<E, uint16_t>)
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    else
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// Software prefetch of the next key tile, spread over the compute of this one and issued in
// address order: the block's columns of the next tile's K rows, row after row, then its V
// rows. The microkernels call touch() once per cache line they consume from this tile (the
// first row tile only), so the next tile (at most as many lines) is requested at the pace the
// current one is used. Address order matters: the compute walks a tile in another order
// (half rows per KV group, 64-column passes over V), and DRAM served prefetches in that
// order at half the rate of a sequential walk (decode at depth 4096 streamed ~13 GB/s, see
// NOTES.md). To L2 (T1): the next tile's 64 KiB of K and V do not fit in L1 with this one.
class TilePrefetch {
public:
    // Rows of one cache in the next tile: the first at `first`, row_bytes apart, span_bytes of
    // the block's columns each.
    struct Rows {
        const void* first = nullptr;
        int64_t row_bytes = 0, span_bytes = 0;
    };
    TilePrefetch() = default;
    TilePrefetch(Rows k, Rows v, int n_rows) : part_{k, v}, rows_(n_rows) {}
    bool active() const { return rows_ > 0; }
    ALLOY_TARGET_AVX512 __attribute__((always_inline)) void touch() {
        if (row_ >= rows_) {
            if (p_ == 1 || !active()) return;
            p_ = 1;
            row_ = 0;
        }
        const Rows& r = part_[p_];
        _mm_prefetch(static_cast<const char*>(r.first) + row_ * r.row_bytes + line_ * 64, _MM_HINT_T1);
        if (++line_ * 64 >= r.span_bytes) {
            line_ = 0;
            ++row_;
        }
    }

private:
    Rows part_[2];  // K, then V
    int rows_ = 0;
    int p_ = 0, row_ = 0;
    int64_t line_ = 0;
};

template <class E>
constexpr int kLineElems = 64 / int(sizeof(E));

// S[r][c] = Q[r] . K[c] for 4 rows and NK keys. Q: [4, hd] contiguous; K rows at stride ks
// (keys c0.. of the tile; with PF, one pf.touch() per cache line read);
// S: [4, ld].
template <int NK, class E, bool PF>
ALLOY_TARGET_AVX512 inline void qk_tile(const float* Q, int hd, const E* K, int64_t ks, float* S, int ld,
                                        TilePrefetch& pf) {
    __m512 acc[4][NK];
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NK; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 16) {
        if constexpr (PF)
            if (d % kLineElems<E> == 0)
                for (int c = 0; c < NK; ++c) pf.touch();
        __m512 kv[NK];
        for (int c = 0; c < NK; ++c) kv[c] = load16(K + c * ks + d);
        for (int r = 0; r < 4; ++r) {
            const __m512 qv = _mm512_loadu_ps(Q + r * hd + d);
            for (int c = 0; c < NK; ++c) acc[r][c] = _mm512_fmadd_ps(qv, kv[c], acc[r][c]);
        }
    }
    if constexpr (NK == 4) {
        __m512 v[16];
        for (int r = 0; r < 4; ++r)
            for (int c = 0; c < 4; ++c) v[4 * c + r] = acc[r][c];
        const __m512 s = reduce16(v);
        _mm_storeu_ps(S + 0 * ld, _mm512_extractf32x4_ps(s, 0));
        _mm_storeu_ps(S + 1 * ld, _mm512_extractf32x4_ps(s, 1));
        _mm_storeu_ps(S + 2 * ld, _mm512_extractf32x4_ps(s, 2));
        _mm_storeu_ps(S + 3 * ld, _mm512_extractf32x4_ps(s, 3));
    } else {
        for (int r = 0; r < 4; ++r)
            for (int c = 0; c < NK; ++c) S[r * ld + c] = _mm512_reduce_add_ps(acc[r][c]);
    }
}

template <int NK, class E>
ALLOY_TARGET_AVX512 inline void qk_tile_pf(bool pf, const float* Q, int hd, const E* K, int64_t ks, float* S,
                                           int ld, TilePrefetch& tp, int c0) {
    if (pf) qk_tile<NK, E, true>(Q, hd, K + c0 * ks, ks, S + c0, ld, tp);
    else qk_tile<NK, E, false>(Q, hd, K + c0 * ks, ks, S + c0, ld, tp);
}

// S = Q K^T for the row tiles [rb0, Rp) and nk keys (K rows at stride ks); the first row
// tile prefetches the next tile (tp).
template <class E>
ALLOY_TARGET_AVX512 inline void qk_rows(const float* Q, int hd, int rb0, int Rp, const E* K, int64_t ks, int nk,
                                        float* S, int ld, TilePrefetch& tp) {
    for (int rb = rb0; rb < Rp; rb += kRowTile) {
        const float* Qr = Q + int64_t(rb) * hd;
        float* Sr = S + int64_t(rb) * ld;
        const bool pf = rb == rb0 && tp.active();
        int c = 0;
        for (; c + 4 <= nk; c += 4) qk_tile_pf<4>(pf, Qr, hd, K, ks, Sr, ld, tp, c);
        switch (nk - c) {
            case 3: qk_tile_pf<3>(pf, Qr, hd, K, ks, Sr, ld, tp, c); break;
            case 2: qk_tile_pf<2>(pf, Qr, hd, K, ks, Sr, ld, tp, c); break;
            case 1: qk_tile_pf<1>(pf, Qr, hd, K, ks, Sr, ld, tp, c); break;
            default: break;
        }
    }
}

// O[r] = alpha[r] * O[r] + sum_j P[r][j] V[j] for 4 rows, columns [c0, c0 + 16 NC), P[r][j] at
// P[r * prs + j * pks] (row-major scores, or the transposed ones of the prefill path); with
// PF, one tp.touch() per cache line read.
template <int NC, class E, bool PF>
ALLOY_TARGET_AVX512 inline void pv_cols(const float* P, int prs, int pks, int nk, const E* V, int64_t vs, float* O,
                                        int hd, const float* alpha, int c0, TilePrefetch& tp) {
    __m512 acc[4][NC];
    for (int r = 0; r < 4; ++r) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(O + r * hd + c0 + 16 * c));
    }
    for (int j = 0; j < nk; ++j) {
        if constexpr (PF)
            for (int c = 0; c < 16 * NC; c += kLineElems<E>) tp.touch();
        const E* vj = V + j * vs + c0;
        __m512 vv[NC];
        for (int c = 0; c < NC; ++c) vv[c] = load16(vj + 16 * c);
        for (int r = 0; r < 4; ++r) {
            const __m512 p = _mm512_set1_ps(P[r * prs + j * pks]);
            for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(O + r * hd + c0 + 16 * c, acc[r][c]);
}

// O = alpha O + P V for the row tiles [rb0, Rp); the first row tile prefetches the next
// tile (tp).
template <class E>
ALLOY_TARGET_AVX512 inline void pv_rows(const float* S, int prs, int pks, int rb0, int Rp, int nk, const E* V,
                                        int64_t vs, float* O, int hd, const float* alpha, TilePrefetch& tp) {
    for (int rb = rb0; rb < Rp; rb += kRowTile) {
        const float* P = S + int64_t(rb) * prs;
        float* Or = O + int64_t(rb) * hd;
        const bool pf = rb == rb0 && tp.active();
        int c0 = 0;
        for (; c0 + 64 <= hd; c0 += 64)
            pf ? pv_cols<4, E, true>(P, prs, pks, nk, V, vs, Or, hd, alpha + rb, c0, tp)
               : pv_cols<4, E, false>(P, prs, pks, nk, V, vs, Or, hd, alpha + rb, c0, tp);
        for (; c0 < hd; c0 += 16)
            pf ? pv_cols<1, E, true>(P, prs, pks, nk, V, vs, Or, hd, alpha + rb, c0, tp)
               : pv_cols<1, E, false>(P, prs, pks, nk, V, vs, Or, hd, alpha + rb, c0, tp);
    }
}

// ---------------------------------------------------------------------------------------
// Prefill path (blocks off the decode grid, f16 K): keys broadcast against a transposed copy
// of the block's queries, Qt [hd][kLanes], so S^T[j] holds key j's score for every row in
// one lane per row. The dot products need no horizontal sums (qk_tile spends 45
// instructions per 16 scores on them) and the online softmax is vertical across keys. Each
// score sums over d in order; decode and verification keep qk_tile's order (the grid path),
// so they still reproduce each other bit for bit.
constexpr int kLanes = 32;  // row lanes of the transposed path: two zmm per key
constexpr int kMaxLaneSets = kMaxPrefillRows / kLanes;
static_assert(kMaxPrefillRows % kLanes == 0, "prefill blocks hold whole lane sets");
static_assert(kKeyTile % 8 == 0, "the transposed QK tile takes keys 8 at a time");

// PT[j][lane] = sum_d K[j][d] Qt[d][lane] for 8 keys from K (fp32 rows at stride ks). Not
// inlined: inside run_block GCC 12 kept two of the 16 accumulators on the stack (a
// store-to-load chain per d, ~8% of the op's time).
ALLOY_TARGET_AVX512 __attribute__((noinline)) void qk_keys8_t(const float* Qt, int hd, const float* K, int64_t ks, float* PT) {
    __m512 acc[8][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int d = 0; d < hd; ++d) {
        const __m512 q0 = _mm512_load_ps(Qt + d * kLanes), q1 = _mm512_load_ps(Qt + d * kLanes + 16);
        for (int j = 0; j < 8; ++j) {
            const __m512 k = _mm512_set1_ps(K[j * ks + d]);
            acc[j][0] = _mm512_fmadd_ps(k, q0, acc[j][0]);
            acc[j][1] = _mm512_fmadd_ps(k, q1, acc[j][1]);
        }
    }
    for (int j = 0; j < 8; ++j) {
        _mm512_store_ps(PT + j * kLanes, acc[j][0]);
        _mm512_store_ps(PT + j * kLanes + 16, acc[j][1]);
    }
}

// The online softmax step of the transposed path on the scores PT [kKeyTile][kLanes] of keys
// [j0, j0 + nk). lim[lane]: the last key the lane's row may see (-1 for pad lanes). PT
// becomes the probabilities, zero where a key is not visible; m, l, alpha [kLanes] as in
// run_block (alpha = 1 for a lane that sees no key of this tile).
ALLOY_TARGET_AVX512 inline void softmax_t(int nk, int64_t j0, const int32_t* lim, float* PT, float* m, float* l,
                                          float* alpha) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int v = 0; v < 2; ++v) {
        const __m512i L = _mm512_load_si512(lim + 16 * v);
        __m512 mx = ninf;
        for (int j = 0; j < nk; ++j) {
            const __mmask16 vis = _mm512_cmple_epi32_mask(_mm512_set1_epi32(int32_t(j0 + j)), L);
            mx = _mm512_max_ps(mx, _mm512_mask_mov_ps(ninf, vis, _mm512_load_ps(PT + j * kLanes + 16 * v)));
        }
        const __mmask16 any = _mm512_cmp_ps_mask(mx, ninf, _CMP_NEQ_OQ);
        const __m512 m_old = _mm512_load_ps(m + 16 * v), m_new = _mm512_max_ps(m_old, mx);
        // exp2(-inf) = 0 on a lane's first visible tile; lanes without a visible key keep alpha 1.
        const __m512 a = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), any, avx512::exp2(_mm512_sub_ps(m_old, m_new)));
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < nk; ++j) {
            const __mmask16 vis = _mm512_cmple_epi32_mask(_mm512_set1_epi32(int32_t(j0 + j)), L);
            float* pj = PT + j * kLanes + 16 * v;
            const __m512 p = _mm512_maskz_mov_ps(vis, avx512::exp2(_mm512_sub_ps(_mm512_load_ps(pj), m_new)));
            _mm512_store_ps(pj, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_store_ps(alpha + 16 * v, a);
        _mm512_store_ps(l + 16 * v, _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(l + 16 * v), a), sum));
        _mm512_store_ps(m + 16 * v, _mm512_mask_mov_ps(m_old, any, m_new));
    }
}

// One key tile of the transposed path: scores of keys [j0, j0 + nk) into PT, then softmax_t.
ALLOY_TARGET_AVX512 inline void tile_softmax_t(const float* Qt, int hd, const float* K, int64_t ks, int nk,
                                               int64_t j0, const int32_t* lim, float* PT, float* m, float* l,
                                               float* alpha) {
    for (int j = 0; j < nk; j += 8) qk_keys8_t(Qt, hd, K + j * ks, ks, PT + j * kLanes);  // keys >= nk: masked below
    softmax_t(nk, j0, lim, PT, m, l, alpha);
}

// dst [nk, hd] = the fp32 values of nk 16-bit rows at stride `stride`; prefetches the next
// tile's rows as it goes.
template <class E>
ALLOY_TARGET_AVX512 inline void convert_tile(const E* src, int nk, int64_t stride, int hd, float* dst,
                                             TilePrefetch& tp) {
    for (int j = 0; j < nk; ++j)
        for (int d = 0; d < hd; d += 16) {
            if (d % kLineElems<E> == 0) tp.touch();
            _mm512_storeu_ps(dst + int64_t(j) * hd + d, load16(src + j * stride + d));
        }
}

// ---------------------------------------------------------------------------------------
// bf16 prefill path (transposed blocks with bf16 K and V caches, on AVX512-BF16): the same
// schedule with vdpbf16ps, two products per lane and instruction instead of one FMA's one,
// as GPU flash attention computes: Q and the probabilities P are rounded to bf16 for the two
// products, the sums, softmax and output stay fp32. K and V are already bf16 (no rounding).
// Operands hold bf16 pairs in 32-bit lanes (lo | hi << 16): Qtb [hd/2][kLanes] (dims d, d+1
// of every lane's query), Kb [keys][hd] (the cache rows, whose dims come in pairs already),
// Pb [keys/2][kLanes] and Vb [keys/2][hd] (keys j, j+1). Decode and verification (the grid)
// keep the exact fp32 path, so they still reproduce each other bit for bit.

// Lanes of lo and hi rounded to bf16 and paired: lo | hi << 16.
ALLOY_TARGET_AVX512 inline __m512i pack_pairs(__m512 lo, __m512 hi) {
    const __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(lo));
    const __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(hi));
    return _mm512_or_si512(l, _mm512_slli_epi32(h, 16));
}

// Qtb from the transposed fp32 queries Qt [hd][kLanes] (hd even).
ALLOY_TARGET_AVX512 void pack_qt_bf16(const float* Qt, int hd, uint32_t* Qtb) {
    for (int d = 0; d < hd; d += 2)
        for (int h = 0; h < kLanes; h += 16)
            _mm512_store_si512(Qtb + (d / 2) * kLanes + h,
                               pack_pairs(_mm512_load_ps(Qt + d * kLanes + h), _mm512_load_ps(Qt + (d + 1) * kLanes + h)));
}

// Kb: nk cache rows copied, then zero rows up to a multiple of 8 keys (the QK kernel's step;
// cache rows past the block's keys may be unbacked, so they are never read).
ALLOY_TARGET_AVX512 void copy_k_bf16(const Bf16* K, int nk, int64_t ks, int hd, uint16_t* Kb) {
    for (int j = 0; j < nk; ++j)
        for (int d = 0; d < hd; d += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(Kb + j * hd + d),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(K + j * ks + d)));
    for (int j = nk; j % 8; ++j)
        for (int d = 0; d < hd; d += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(Kb + j * hd + d), _mm256_setzero_si256());
}

// PT[j][lane] = sum over d of K[j][d] Q[lane][d] for 8 keys, in bf16 pairs.
ALLOY_TARGET_AVX512 __attribute__((noinline)) void qk_keys8_bf16(const uint32_t* Qtb, int hd, const uint16_t* Kb,
                                                                 float* PT) {
    __m512 acc[8][2];
    for (auto& a : acc) a[0] = a[1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int dp = 0; dp < hd / 2; ++dp) {
        const __m512bh q0 = (__m512bh)_mm512_load_si512(Qtb + dp * kLanes);
        const __m512bh q1 = (__m512bh)_mm512_load_si512(Qtb + dp * kLanes + 16);
        for (int j = 0; j < 8; ++j) {
            uint32_t kp;
            __builtin_memcpy(&kp, Kb + j * hd + 2 * dp, 4);
            const __m512bh k = (__m512bh)_mm512_set1_epi32(int(kp));
            acc[j][0] = _mm512_dpbf16_ps(acc[j][0], k, q0);
            acc[j][1] = _mm512_dpbf16_ps(acc[j][1], k, q1);
        }
    }
    for (int j = 0; j < 8; ++j) {
        _mm512_store_ps(PT + j * kLanes, acc[j][0]);
        _mm512_store_ps(PT + j * kLanes + 16, acc[j][1]);
    }
}

// Vb from nk cache rows (an odd last key paired with zeros); one tp.touch() per cache line.
ALLOY_TARGET_AVX512 void pair_v_bf16(const Bf16* V, int nk, int64_t vs, int hd, uint32_t* Vb, TilePrefetch& tp) {
    for (int j = 0; j < nk; j += 2)
        for (int d = 0; d < hd; d += 16) {
            if (d % 32 == 0) tp.touch();
            const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(V + j * vs + d)));
            const __m512i hi =
                j + 1 < nk ? _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(V + (j + 1) * vs + d)))
                           : _mm512_setzero_si512();
            _mm512_store_si512(Vb + (j / 2) * hd + d, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
}

// Pb from the probabilities PT [kKeyTile][kLanes] of nk keys (an odd last key paired with 0).
ALLOY_TARGET_AVX512 void pair_p_bf16(const float* PT, int nk, uint32_t* Pb) {
    for (int j = 0; j < nk; j += 2)
        for (int h = 0; h < kLanes; h += 16) {
            const __m512 hi = j + 1 < nk ? _mm512_load_ps(PT + (j + 1) * kLanes + h) : _mm512_setzero_ps();
            _mm512_store_si512(Pb + (j / 2) * kLanes + h, pack_pairs(_mm512_load_ps(PT + j * kLanes + h), hi));
        }
}

// O[r] = alpha[r] O[r] + sum over key pairs of Pb[jp][r] . Vb[jp] for 4 lanes r, columns
// [c0, c0 + 16 NC).
template <int NC>
ALLOY_TARGET_AVX512 inline void pv_cols_bf16(const uint32_t* Pb, int np, const uint32_t* Vb, float* O, int hd,
                                             const float* alpha, int c0) {
    __m512 acc[4][NC];
    for (int r = 0; r < 4; ++r) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(O + r * hd + c0 + 16 * c));
    }
    for (int jp = 0; jp < np; ++jp) {
        __m512bh vv[NC];
        for (int c = 0; c < NC; ++c) vv[c] = (__m512bh)_mm512_load_si512(Vb + jp * hd + c0 + 16 * c);
        for (int r = 0; r < 4; ++r) {
            const __m512bh p = (__m512bh)_mm512_set1_epi32(int(Pb[jp * kLanes + r]));
            for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], p, vv[c]);
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(O + r * hd + c0 + 16 * c, acc[r][c]);
}

// One lane set: O [kLanes, hd] = alpha O + P V.
ALLOY_TARGET_AVX512 void pv_lanes_bf16(const uint32_t* Pb, int np, const uint32_t* Vb, float* O, int hd,
                                       const float* alpha) {
    for (int r = 0; r < kLanes; r += kRowTile) {
        int c0 = 0;
        for (; c0 + 64 <= hd; c0 += 64) pv_cols_bf16<4>(Pb + r, np, Vb, O + r * hd, hd, alpha + r, c0);
        for (; c0 < hd; c0 += 16) pv_cols_bf16<1>(Pb + r, np, Vb, O + r * hd, hd, alpha + r, c0);
    }
}

// A tile is converted once (instead of inline by every row tile) from this many row tiles on.
constexpr int kConvertTileFromRowTiles = 2;

template <class EK, class EV>
ALLOY_TARGET_AVX512 void run_block(const Block& b) {
    constexpr bool k16 = !std::is_same_v<EK, float>, v16 = !std::is_same_v<EV, float>;
    // The transposed path pads every group's rows to whole lane sets of kLanes rows; every
    // converted K and V tile serves all the block's lane sets.
    const bool transposed = k16 && !b.grid && b.rows() <= kMaxLaneSets * kLanes;
    const int nl = transposed ? (b.rows() + kLanes - 1) / kLanes : 0;  // lane sets per group
    const int R = b.rows(), Rp = transposed ? nl * kLanes : (R + kRowTile - 1) / kRowTile * kRowTile, hd = b.hd;
    const int ng = b.ng;
    constexpr int ld = kKeyTile;
    static_assert(kLanes == kKeyTile, "S holds [Rp][kKeyTile] scores or [kKeyTile][kLanes] transposed ones");
    // Per group gi, rows [gi * Rp, (gi + 1) * Rp) of (sections of b.scratch, in the order
    // block_scratch_bytes counts them):
    ws::Carver sc(b.scratch);
    float* Q = sc.take<float>(size_t(ng) * Rp * hd);  // [Rp, hd] q * scale * log2(e), pad rows zero
    float* O = sc.take<float>(size_t(ng) * Rp * hd);  // [Rp, hd] unnormalised output
    float* S = sc.take<float>(size_t(ng) * Rp * ld);  // [Rp, kKeyTile] scores, then probabilities
    float* st = sc.take<float>(3 * size_t(ng) * Rp);  // m, l, alpha, [ng * Rp] each
    float *m = st, *l = st + ng * Rp, *alpha = st + 2 * ng * Rp;
    float* Qt = transposed ? sc.take<float>(size_t(ng) * Rp * hd) : nullptr;  // [hd][kLanes] per group and lane set
    int32_t* lim = transposed ? sc.take<int32_t>(size_t(Rp)) : nullptr;
    float* Kt = k16 ? sc.take<float>(size_t(kKeyTile) * hd) : nullptr;  // fp32 copy of a 16-bit K tile
    float* Vt = v16 ? sc.take<float>(size_t(kKeyTile) * hd) : nullptr;
    // bf16 caches on AVX512-BF16: the transposed path in bf16 pairs (Kt and Vt hold Kb, Vb).
    constexpr bool bf16_caches = std::is_same_v<EK, Bf16> && std::is_same_v<EV, Bf16>;
    const bool bf16_dot = bf16_caches && transposed && mm::cpu_has_avx512_bf16();
    uint32_t* Qtb = bf16_dot ? sc.take<uint32_t>(size_t(ng) * Rp * hd / 2) : nullptr;
    uint32_t* Pb = bf16_dot ? sc.take<uint32_t>(size_t(kKeyTile / 2) * kLanes) : nullptr;
    const EK* Kc = static_cast<const EK*>(b.k);
    const EV* Vc = static_cast<const EV*>(b.v);
    const int64_t ks = b.kv_stride;

    const int64_t key_end = std::min(b.key_end, b.limit(R - 1) + 1);
    const __m512 qs = _mm512_set1_ps(b.scale * 1.44269504088896341f);
    for (int gi = 0; gi < ng; ++gi)
        for (int r = 0; r < Rp; ++r) {
            const int gr = gi * Rp + r;
            float* dst = Q + int64_t(gr) * hd;
            if (r < R) {
                const float* src = b.q_row(r, gi);
                for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(qs, _mm512_loadu_ps(src + d)));
            } else {
                std::fill(dst, dst + hd, 0.0f);
            }
            m[gr] = -INFINITY;
            l[gr] = 0.0f;
        }
    std::fill(O, O + int64_t(ng) * Rp * hd, 0.0f);
    if (transposed) {
        for (int gl = 0; gl < ng * nl; ++gl)  // per group and lane set: Qt[d][lane] = Q[lane][d]
            mm::store_transposed_avx512(Q + int64_t(gl) * kLanes * hd, hd, kLanes, hd, Qt + int64_t(gl) * hd * kLanes,
                                        kLanes, false);
        for (int r = 0; r < Rp; ++r) lim[r] = r < R ? int32_t(b.limit(r)) : -1;
        if (bf16_dot)
            for (int gl = 0; gl < ng * nl; ++gl)
                pack_qt_bf16(Qt + int64_t(gl) * hd * kLanes, hd, Qtb + int64_t(gl) * hd / 2 * kLanes);
    }

    for (int64_t j0 = b.key_begin; j0 < key_end; j0 += kKeyTile) {
        const int nk = int(std::min<int64_t>(kKeyTile, key_end - j0));
        // Rows of the next tile: of this block, or on its last tile the first tile of the block
        // this thread runs next (prefetch_end).
        const int n_next = int(std::clamp<int64_t>(std::max(key_end, b.prefetch_end) - j0 - kKeyTile, 0, kKeyTile));
        TilePrefetch next({Kc + (j0 + kKeyTile) * ks, ks * int64_t(sizeof(EK)), int64_t(ng) * hd * int64_t(sizeof(EK))},
                          {Vc + (j0 + kKeyTile) * ks, ks * int64_t(sizeof(EV)), int64_t(ng) * hd * int64_t(sizeof(EV))},
                          n_next);
        TilePrefetch none;  // for reads of the converted fp32 tiles, already in cache
        // Rows before r_first see none of this tile (diagonal tiles, late key splits): skip
        // their 4-row groups entirely.
        const int r_first = int(std::clamp<int64_t>((j0 - b.n_past - b.t0) * b.group, 0, R));
        const int rb0 = r_first / kRowTile * kRowTile;
        const bool convert = (Rp - rb0) / kRowTile >= kConvertTileFromRowTiles;

        for (int gi = 0; gi < ng; ++gi) {
            const EK* K = Kc + j0 * ks + int64_t(gi) * hd;
            const EV* V = Vc + j0 * ks + int64_t(gi) * hd;
            float* Sg = S + int64_t(gi) * Rp * ld;
            float* Og = O + int64_t(gi) * Rp * hd;
            float *mg = m + gi * Rp, *lg = l + gi * Rp, *ag = alpha + gi * Rp;

            if constexpr (k16) {
                if (transposed) {
                    // Lane sets before l_first see none of this tile (diagonal tiles): their
                    // state stays as it is.
                    const int l_first = r_first / kLanes;
                    if constexpr (bf16_caches) {
                        if (bf16_dot) {
                            uint16_t* Kb = reinterpret_cast<uint16_t*>(Kt);
                            uint32_t* Vb = reinterpret_cast<uint32_t*>(Vt);
                            const int np = (nk + 1) / 2;
                            copy_k_bf16(K, nk, ks, hd, Kb);
                            pair_v_bf16(V, nk, ks, hd, Vb, next);
                            for (int ls = l_first; ls < nl; ++ls) {
                                const int o = ls * kLanes;
                                float* PT = Sg + o * ld;
                                const uint32_t* Qs = Qtb + (int64_t(gi) * nl + ls) * hd / 2 * kLanes;
                                for (int j = 0; j < nk; j += 8) qk_keys8_bf16(Qs, hd, Kb + j * hd, PT + j * kLanes);
                                softmax_t(nk, j0, lim + o, PT, mg + o, lg + o, ag + o);
                                pair_p_bf16(PT, nk, Pb);
                                pv_lanes_bf16(Pb, np, Vb, Og + int64_t(o) * hd, hd, ag + o);
                            }
                            continue;
                        }
                    }
                    // The next tile is prefetched during the first P V row tile (measured a
                    // little faster than a burst of it during the conversions).
                    convert_tile(K, nk, ks, hd, Kt, none);
                    for (int ls = l_first; ls < nl; ++ls) {
                        const int o = ls * kLanes;
                        tile_softmax_t(Qt + (int64_t(gi) * nl + ls) * hd * kLanes, hd, Kt, hd, nk, j0, lim + o,
                                       Sg + o * ld, mg + o, lg + o, ag + o);
                    }
                    if constexpr (v16) convert_tile(V, nk, ks, hd, Vt, none);
                    for (int ls = l_first; ls < nl; ++ls) {
                        const int o = ls * kLanes;
                        if constexpr (v16)
                            pv_rows(Sg + o * ld, 1, kLanes, 0, kLanes, nk, static_cast<const float*>(Vt), hd,
                                    Og + int64_t(o) * hd, hd, ag + o, ls == l_first ? next : none);
                        else
                            pv_rows(Sg + o * ld, 1, kLanes, 0, kLanes, nk, V, ks, Og + int64_t(o) * hd, hd, ag + o,
                                    ls == l_first ? next : none);
                    }
                    continue;
                }
            }

            // S = Q K^T on rows [rb0, Rp).
            if constexpr (k16) {
                if (convert) {
                    convert_tile(K, nk, ks, hd, Kt, next);
                    qk_rows(Q + int64_t(gi) * Rp * hd, hd, rb0, Rp, static_cast<const float*>(Kt), hd, nk, Sg, ld, none);
                } else {
                    qk_rows(Q + int64_t(gi) * Rp * hd, hd, rb0, Rp, K, ks, nk, Sg, ld, next);
                }
            } else {
                qk_rows(Q + int64_t(gi) * Rp * hd, hd, rb0, Rp, K, ks, nk, Sg, ld, next);
            }

            // Online softmax per row; P overwrites S. Rows with no visible key keep their
            // state (alpha = 1, P = 0): pad rows and rows masked out of this tile.
            for (int r = rb0; r < Rp; ++r) {
                float* Sr = Sg + int64_t(r) * ld;
                const int nv = r < R ? int(std::clamp<int64_t>(b.limit(r) + 1 - j0, 0, nk)) : 0;
                const __mmask16 k0 = __mmask16(nv >= 16 ? 0xFFFF : (1u << nv) - 1);
                const __mmask16 k1 = __mmask16(nv >= 32 ? 0xFFFF : nv <= 16 ? 0 : (1u << (nv - 16)) - 1);
                if (nv == 0) {
                    ag[r] = 1.0f;
                    _mm512_storeu_ps(Sr, _mm512_setzero_ps());
                    _mm512_storeu_ps(Sr + 16, _mm512_setzero_ps());
                    continue;
                }
                const __m512 ninf = _mm512_set1_ps(-INFINITY);
                const __m512 s0 = _mm512_mask_loadu_ps(ninf, k0, Sr), s1 = _mm512_mask_loadu_ps(ninf, k1, Sr + 16);
                const float mx = std::max(mg[r], _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
                const __m512 mv = _mm512_set1_ps(mx);
                const __m512 p0 = _mm512_maskz_mov_ps(k0, avx512::exp2(_mm512_sub_ps(s0, mv)));
                const __m512 p1 = _mm512_maskz_mov_ps(k1, avx512::exp2(_mm512_sub_ps(s1, mv)));
                _mm512_storeu_ps(Sr, p0);
                _mm512_storeu_ps(Sr + 16, p1);
                ag[r] = std::exp2(mg[r] - mx);  // 0 on the row's first tile (m = -inf)
                // One rounding, written out: GCC contracted it for every cache type until the
                // scratch came from the caller, then no longer for fp32 K (other bits).
                lg[r] = std::fma(lg[r], ag[r], _mm512_reduce_add_ps(_mm512_add_ps(p0, p1)));
                mg[r] = mx;
            }

            // O = alpha O + P V on rows [rb0, Rp).
            if constexpr (v16) {
                if (convert) {
                    convert_tile(V, nk, ks, hd, Vt, next);
                    pv_rows(Sg, ld, 1, rb0, Rp, nk, static_cast<const float*>(Vt), hd, Og, hd, ag, none);
                } else {
                    pv_rows(Sg, ld, 1, rb0, Rp, nk, V, ks, Og, hd, ag, next);
                }
            } else {
                pv_rows(Sg, ld, 1, rb0, Rp, nk, V, ks, Og, hd, ag, next);
            }
        }
    }

    for (int gi = 0; gi < ng; ++gi)
        for (int r = 0; r < R; ++r) {
            const int gr = gi * Rp + r;
            const float* orow = O + int64_t(gr) * hd;
            if (b.out) {
                float* dst = b.out_row(r, gi);
                const __m512 inv = _mm512_set1_ps(1.0f / l[gr]);  // every row of an unsplit block sees key 0
                for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(inv, _mm512_loadu_ps(orow + d)));
            } else {
                const int64_t pr = int64_t(gi) * b.part_rows + r;
                std::copy(orow, orow + hd, b.part_o + pr * hd);
                b.part_ml[2 * pr] = m[gr];
                b.part_ml[2 * pr + 1] = l[gr];
            }
        }
}

template <class EK>
void run_block_v(const Block& b) {
    switch (b.v_elem) {
        case Elem::F32: return run_block<EK, float>(b);
        case Elem::F16: return run_block<EK, uint16_t>(b);
        case Elem::Bf16: return run_block<EK, Bf16>(b);
    }
}

}  // namespace

void run_block_avx512(const Block& b) {
    switch (b.k_elem) {
        case Elem::F32: return run_block_v<float>(b);
        case Elem::F16: return run_block_v<uint16_t>(b);
        case Elem::Bf16: return run_block_v<Bf16>(b);
    }
}

}  // namespace alloy::cpu::attn
