// AVX-512 block of cpu::attention (head_dim % 16 == 0), fp32 arithmetic on fp32 or f16 caches.
//
// Per key tile (kKeyTile keys) the block does, for all its rows at once:
//   S = Q K^T      4x4 register tiles: 16 zmm accumulators over hd, one transpose-reduce
//   online softmax per row over the tile (masked by causality only on diagonal tiles)
//   O = alpha * O + P V   4 rows x 64 columns in 16 zmm accumulators, P broadcast from L1
// Q rows are pre-scaled by scale * log2(e) so the softmax is exp2 of a difference.
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

// 16 consecutive elements of a cache row as fp32 (E = float, or uint16_t for IEEE half).
template <class E>
ALLOY_TARGET_AVX512 inline __m512 load16(const E* p) {
    if constexpr (std::is_same_v<E, float>)
        return _mm512_loadu_ps(p);
    else
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// S[r][c] = Q[r] . K[c] for 4 rows and NK keys. Q: [4, hd] contiguous; K rows at stride ks;
// S: [4, ld].
template <int NK, class E>
ALLOY_TARGET_AVX512 inline void qk_tile(const float* Q, int hd, const E* K, int64_t ks, float* S, int ld) {
    __m512 acc[4][NK];
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NK; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 16) {
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

// S = Q K^T for the row tiles [rb0, Rp) and nk keys (K rows at stride ks).
template <class E>
ALLOY_TARGET_AVX512 inline void qk_rows(const float* Q, int hd, int rb0, int Rp, const E* K, int64_t ks, int nk,
                                        float* S, int ld) {
    for (int rb = rb0; rb < Rp; rb += kRowTile) {
        const float* Qr = Q + int64_t(rb) * hd;
        float* Sr = S + int64_t(rb) * ld;
        int c = 0;
        for (; c + 4 <= nk; c += 4) qk_tile<4>(Qr, hd, K + c * ks, ks, Sr + c, ld);
        switch (nk - c) {
            case 3: qk_tile<3>(Qr, hd, K + c * ks, ks, Sr + c, ld); break;
            case 2: qk_tile<2>(Qr, hd, K + c * ks, ks, Sr + c, ld); break;
            case 1: qk_tile<1>(Qr, hd, K + c * ks, ks, Sr + c, ld); break;
            default: break;
        }
    }
}

// O[r] = alpha[r] * O[r] + sum_j P[r][j] V[j] for 4 rows, columns [c0, c0 + 16 NC).
template <int NC, class E>
ALLOY_TARGET_AVX512 inline void pv_cols(const float* P, int ld, int nk, const E* V, int64_t vs, float* O, int hd,
                                        const float* alpha, int c0) {
    __m512 acc[4][NC];
    for (int r = 0; r < 4; ++r) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(O + r * hd + c0 + 16 * c));
    }
    for (int j = 0; j < nk; ++j) {
        const E* vj = V + j * vs + c0;
        __m512 vv[NC];
        for (int c = 0; c < NC; ++c) vv[c] = load16(vj + 16 * c);
        for (int r = 0; r < 4; ++r) {
            const __m512 p = _mm512_set1_ps(P[r * ld + j]);
            for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(p, vv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NC; ++c) _mm512_storeu_ps(O + r * hd + c0 + 16 * c, acc[r][c]);
}

// O = alpha O + P V for the row tiles [rb0, Rp).
template <class E>
ALLOY_TARGET_AVX512 inline void pv_rows(const float* S, int ld, int rb0, int Rp, int nk, const E* V, int64_t vs,
                                        float* O, int hd, const float* alpha) {
    for (int rb = rb0; rb < Rp; rb += kRowTile) {
        const float* P = S + int64_t(rb) * ld;
        float* Or = O + int64_t(rb) * hd;
        int c0 = 0;
        for (; c0 + 64 <= hd; c0 += 64) pv_cols<4>(P, ld, nk, V, vs, Or, hd, alpha + rb, c0);
        for (; c0 < hd; c0 += 16) pv_cols<1>(P, ld, nk, V, vs, Or, hd, alpha + rb, c0);
    }
}

// Touches n rows of hd elements (stride apart) into L1.
template <class E>
ALLOY_TARGET_AVX512 inline void prefetch_rows(const E* X, int n, int64_t stride, int hd) {
    constexpr int kLine = 64 / int(sizeof(E));
    for (int j = 0; j < n; ++j)
        for (int d = 0; d < hd; d += kLine) _mm_prefetch(reinterpret_cast<const char*>(X + j * stride + d), _MM_HINT_T0);
}

// dst [nk, hd] = the fp32 values of nk half rows at stride `stride`.
ALLOY_TARGET_AVX512 inline void convert_tile(const uint16_t* src, int nk, int64_t stride, int hd, float* dst) {
    for (int j = 0; j < nk; ++j)
        for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(dst + int64_t(j) * hd + d, load16(src + j * stride + d));
}

// A tile is converted once (instead of inline by every row tile) from this many row tiles on.
constexpr int kConvertTileFromRowTiles = 2;

template <class EK, class EV>
ALLOY_TARGET_AVX512 void run_block(const Block& b) {
    const int R = b.rows(), Rp = (R + kRowTile - 1) / kRowTile * kRowTile, hd = b.hd;
    constexpr int ld = kKeyTile;
    float* Q = scratch(0, int64_t(Rp) * hd);   // [Rp, hd] q * scale * log2(e), pad rows zero
    float* O = scratch(1, int64_t(Rp) * hd);   // [Rp, hd] unnormalised output
    float* S = scratch(2, int64_t(Rp) * ld);   // [Rp, kKeyTile] scores, then probabilities
    float* st = scratch(3, 3 * int64_t(Rp));   // m [Rp], l [Rp], alpha [Rp]
    float *m = st, *l = st + Rp, *alpha = st + 2 * Rp;
    constexpr bool k16 = !std::is_same_v<EK, float>, v16 = !std::is_same_v<EV, float>;
    float* Kt = k16 ? scratch(4, int64_t(kKeyTile) * hd) : nullptr;  // fp32 copy of an f16 K tile
    float* Vt = v16 ? scratch(5, int64_t(kKeyTile) * hd) : nullptr;
    const EK* Kc = static_cast<const EK*>(b.k);
    const EV* Vc = static_cast<const EV*>(b.v);
    const int64_t ks = b.kv_stride;

    const __m512 qs = _mm512_set1_ps(b.scale * 1.44269504088896341f);
    for (int r = 0; r < Rp; ++r) {
        float* dst = Q + int64_t(r) * hd;
        if (r < R) {
            const float* src = b.q_row(r);
            for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(qs, _mm512_loadu_ps(src + d)));
        } else {
            std::fill(dst, dst + hd, 0.0f);
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    std::fill(O, O + int64_t(Rp) * hd, 0.0f);

    const int64_t key_end = std::min(b.key_end, b.limit(R - 1) + 1);
    for (int64_t j0 = b.key_begin; j0 < key_end; j0 += kKeyTile) {
        const int nk = int(std::min<int64_t>(kKeyTile, key_end - j0));
        // Rows before r_first see none of this tile (diagonal tiles, late key splits): skip
        // their 4-row groups entirely.
        const int r_first = int(std::clamp<int64_t>((j0 - b.n_past - b.t0) * b.group, 0, R));
        const int rb0 = r_first / kRowTile * kRowTile;
        const bool convert = (Rp - rb0) / kRowTile >= kConvertTileFromRowTiles;
        const EK* K = Kc + j0 * ks;
        const EV* V = Vc + j0 * ks;

        // The next K and V tiles on their way while this one computes (decode streams the
        // cache: these keep a tile's worth of lines in flight per thread).
        if (j0 + kKeyTile < key_end) {
            const int nn = int(std::min<int64_t>(kKeyTile, key_end - j0 - kKeyTile));
            prefetch_rows(K + kKeyTile * ks, nn, ks, hd);
            prefetch_rows(V + kKeyTile * ks, nn, ks, hd);
        }

        // S = Q K^T on rows [rb0, Rp).
        if (k16 && convert) {
            convert_tile(reinterpret_cast<const uint16_t*>(K), nk, ks, hd, Kt);
            qk_rows(Q, hd, rb0, Rp, static_cast<const float*>(Kt), hd, nk, S, ld);
        } else {
            qk_rows(Q, hd, rb0, Rp, K, ks, nk, S, ld);
        }

        // Online softmax per row; P overwrites S. Rows with no visible key keep their state
        // (alpha = 1, P = 0): pad rows and rows masked out of this tile.
        for (int r = rb0; r < Rp; ++r) {
            float* Sr = S + int64_t(r) * ld;
            const int nv = r < R ? int(std::clamp<int64_t>(b.limit(r) + 1 - j0, 0, nk)) : 0;
            const __mmask16 k0 = __mmask16(nv >= 16 ? 0xFFFF : (1u << nv) - 1);
            const __mmask16 k1 = __mmask16(nv >= 32 ? 0xFFFF : nv <= 16 ? 0 : (1u << (nv - 16)) - 1);
            if (nv == 0) {
                alpha[r] = 1.0f;
                _mm512_storeu_ps(Sr, _mm512_setzero_ps());
                _mm512_storeu_ps(Sr + 16, _mm512_setzero_ps());
                continue;
            }
            const __m512 ninf = _mm512_set1_ps(-INFINITY);
            const __m512 s0 = _mm512_mask_loadu_ps(ninf, k0, Sr), s1 = _mm512_mask_loadu_ps(ninf, k1, Sr + 16);
            const float mx = std::max(m[r], _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
            const __m512 mv = _mm512_set1_ps(mx);
            const __m512 p0 = _mm512_maskz_mov_ps(k0, avx512::exp2(_mm512_sub_ps(s0, mv)));
            const __m512 p1 = _mm512_maskz_mov_ps(k1, avx512::exp2(_mm512_sub_ps(s1, mv)));
            _mm512_storeu_ps(Sr, p0);
            _mm512_storeu_ps(Sr + 16, p1);
            alpha[r] = std::exp2(m[r] - mx);  // 0 on the row's first tile (m = -inf)
            l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
            m[r] = mx;
        }

        // O = alpha O + P V on rows [rb0, Rp).
        if (v16 && convert) {
            convert_tile(reinterpret_cast<const uint16_t*>(V), nk, ks, hd, Vt);
            pv_rows(S, ld, rb0, Rp, nk, static_cast<const float*>(Vt), hd, O, hd, alpha);
        } else {
            pv_rows(S, ld, rb0, Rp, nk, V, ks, O, hd, alpha);
        }
    }

    for (int r = 0; r < R; ++r) {
        const float* orow = O + int64_t(r) * hd;
        if (b.out) {
            float* dst = b.out_row(r);
            const __m512 inv = _mm512_set1_ps(1.0f / l[r]);  // every row of an unsplit block sees key 0
            for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(dst + d, _mm512_mul_ps(inv, _mm512_loadu_ps(orow + d)));
        } else {
            std::copy(orow, orow + hd, b.part_o + int64_t(r) * hd);
            b.part_ml[2 * r] = m[r];
            b.part_ml[2 * r + 1] = l[r];
        }
    }
}

}  // namespace

void run_block_avx512(const Block& b) {
    if (b.k_f16)
        b.v_f16 ? run_block<uint16_t, uint16_t>(b) : run_block<uint16_t, float>(b);
    else
        b.v_f16 ? run_block<float, uint16_t>(b) : run_block<float, float>(b);
}

}  // namespace alloy::cpu::attn
