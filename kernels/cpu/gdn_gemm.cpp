// Small fp32 GEMMs of the chunked GDN form: AVX-512 and AVX2 register-tiled kernels and the
// portable loops. Contract in kernels/cpu/gdn_gemm.h.
#include "kernels/cpu/gdn_gemm.h"

#include <algorithm>

#include "kernels/cpu/gdn_simd.h"
#include "kernels/cpu/vec_math_avx2.h"

namespace alloy::cpu::gdn {
namespace {

using gdn_simd::lanes;

// Register tile: MR rows x NV vectors of 16 columns. 6 x 4 = 24 accumulators + 4 B vectors
// fill the 32 zmm registers; per k step 4 loads + 6 broadcasts feed 24 FMAs, so the FMA
// pipes, not the load ports, are the limit.
constexpr int kMr = 6;
constexpr int kNv = 4;

// The accumulators are named variables, not an array: GCC keeps a 24-vector array in memory
// and stores it back on every k step (measured: the tile ran store-bound at ~1/4 speed).
#define ALLOY_ROW_DECL(m) __m512 c##m##0 = _mm512_setzero_ps(), c##m##1 = c##m##0, c##m##2 = c##m##0, c##m##3 = c##m##0
#define ALLOY_ROW_FMA(m)                                                                 \
    if constexpr (MR > m) {                                                              \
        const __m512 a = _mm512_set1_ps(A[(long)m * lda + k]);                           \
        c##m##0 = _mm512_fmadd_ps(a, b0, c##m##0);                                       \
        if constexpr (NV > 1) c##m##1 = _mm512_fmadd_ps(a, b1, c##m##1);                 \
        if constexpr (NV > 2) c##m##2 = _mm512_fmadd_ps(a, b2, c##m##2);                 \
        if constexpr (NV > 3) c##m##3 = _mm512_fmadd_ps(a, b3, c##m##3);                 \
    }
#define ALLOY_ROW_STORE(m)                                                               \
    if constexpr (MR > m) {                                                              \
        float* Cm = C + (long)m * ldc;                                                   \
        store_c<NV>(Cm, 0, c##m##0, c_scale, last);                                      \
        if constexpr (NV > 1) store_c<NV>(Cm, 1, c##m##1, c_scale, last);                \
        if constexpr (NV > 2) store_c<NV>(Cm, 2, c##m##2, c_scale, last);                \
        if constexpr (NV > 3) store_c<NV>(Cm, 3, c##m##3, c_scale, last);                \
    }

// Full vectors load and store plainly; only a panel's last vector is masked.
template <int NV>
ALLOY_AVX512 inline __m512 load_b(const float* Bk, int v, __mmask16 last) {
    return v == NV - 1 ? _mm512_maskz_loadu_ps(last, Bk + 16 * v) : _mm512_loadu_ps(Bk + 16 * v);
}

// C[v] = r + c_scale C[v]
template <int NV>
ALLOY_AVX512 inline void store_c(float* Cm, int v, __m512 r, float c_scale, __mmask16 last) {
    const __mmask16 mk = v == NV - 1 ? last : (__mmask16)0xFFFF;
    if (c_scale != 0.0f) r = _mm512_fmadd_ps(_mm512_set1_ps(c_scale), _mm512_maskz_loadu_ps(mk, Cm + 16 * v), r);
    _mm512_mask_storeu_ps(Cm + 16 * v, mk, r);
}

template <int MR, int NV>
ALLOY_AVX512 void tile_avx512(int kend, const float* A, int lda, const float* B, int ldb, float* C,
                              int ldc, float c_scale, __mmask16 last) {
    static_assert(MR >= 1 && MR <= kMr && NV >= 1 && NV <= kNv);
    ALLOY_ROW_DECL(0);
    ALLOY_ROW_DECL(1);
    ALLOY_ROW_DECL(2);
    ALLOY_ROW_DECL(3);
    ALLOY_ROW_DECL(4);
    ALLOY_ROW_DECL(5);
    for (int k = 0; k < kend; ++k) {
        const float* Bk = B + (long)k * ldb;
        const __m512 b0 = load_b<NV>(Bk, 0, last);
        const __m512 b1 = NV > 1 ? load_b<NV>(Bk, 1, last) : b0;
        const __m512 b2 = NV > 2 ? load_b<NV>(Bk, 2, last) : b0;
        const __m512 b3 = NV > 3 ? load_b<NV>(Bk, 3, last) : b0;
        ALLOY_ROW_FMA(0);
        ALLOY_ROW_FMA(1);
        ALLOY_ROW_FMA(2);
        ALLOY_ROW_FMA(3);
        ALLOY_ROW_FMA(4);
        ALLOY_ROW_FMA(5);
    }
    ALLOY_ROW_STORE(0);
    ALLOY_ROW_STORE(1);
    ALLOY_ROW_STORE(2);
    ALLOY_ROW_STORE(3);
    ALLOY_ROW_STORE(4);
    ALLOY_ROW_STORE(5);
}
#undef ALLOY_ROW_DECL
#undef ALLOY_ROW_FMA
#undef ALLOY_ROW_STORE

using TileFn = void (*)(int, const float*, int, const float*, int, float*, int, float, __mmask16);

template <int MR>
constexpr TileFn tile_for(int nv) {
    return nv == 1 ? tile_avx512<MR, 1> : nv == 2 ? tile_avx512<MR, 2> : nv == 3 ? tile_avx512<MR, 3> : tile_avx512<MR, 4>;
}

TileFn pick_tile(int mr, int nv) {
    switch (mr) {
        case 1: return tile_for<1>(nv);
        case 2: return tile_for<2>(nv);
        case 3: return tile_for<3>(nv);
        case 4: return tile_for<4>(nv);
        case 5: return tile_for<5>(nv);
        default: return tile_for<6>(nv);
    }
}

// Column panels of 64 outside, row tiles inside, so that the K x 64 panel of B (32 KiB at
// K = 128) stays in L1 across the row tiles.
ALLOY_AVX512 void gemm_avx512(const Gemm& g) {
    for (int n0 = 0; n0 < g.N; n0 += 16 * kNv) {
        for (int m0 = 0; m0 < g.M; m0 += kMr) {
            const int mr = std::min(kMr, g.M - m0);
            int nw = std::min(16 * kNv, g.N - n0);
            if (g.tri == Tri::LowerC) nw = std::min(nw, m0 + mr - n0);  // rows need s <= r only
            if (nw <= 0) continue;
            const int nv = (nw + 15) / 16;
            const int kend = g.tri == Tri::LowerA ? std::min(g.K, m0 + mr) : g.K;
            pick_tile(mr, nv)(kend, g.A + (long)m0 * g.lda, g.lda, g.B + n0, g.ldb,
                              g.C + (long)m0 * g.ldc + n0, g.ldc, g.c_scale, lanes(nw - 16 * (nv - 1)));
        }
    }
}

// ---- AVX2 + FMA: MR rows x NV vectors of 8 columns (6 x 2: 12 accumulators, 2 B vectors and
// one broadcast of the 16 ymm registers), the same panel order as the AVX-512 kernel. A
// panel's last vector is masked (vmaskmov) where the width is not a multiple of 8.
constexpr int kMr2 = 6;
constexpr int kNv2 = 2;

ALLOY_TARGET_AVX2 inline __m256i lanes8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int MR, int NV>
ALLOY_TARGET_AVX2 void tile_avx2(int kend, const float* A, int lda, const float* B, int ldb, float* C, int ldc, float c_scale,
                          __m256i last) {
    __m256 acc[MR * NV];  // flat, loops unrolled: GCC 12 keeps a 2-D array of vectors in memory
#pragma GCC unroll 16
    for (int i = 0; i < MR * NV; ++i) acc[i] = _mm256_setzero_ps();
    for (int k = 0; k < kend; ++k) {
        const float* Bk = B + (long)k * ldb;
        __m256 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = v == NV - 1 ? _mm256_maskload_ps(Bk + 8 * v, last) : _mm256_loadu_ps(Bk + 8 * v);
#pragma GCC unroll 8
        for (int m = 0; m < MR; ++m) {
            const __m256 a = _mm256_broadcast_ss(A + (long)m * lda + k);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[m * NV + v] = _mm256_fmadd_ps(a, b[v], acc[m * NV + v]);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            float* c = C + (long)m * ldc + 8 * v;
            __m256 r = acc[m * NV + v];
            if (v == NV - 1) {
                if (c_scale != 0.0f) r = _mm256_fmadd_ps(_mm256_set1_ps(c_scale), _mm256_maskload_ps(c, last), r);
                _mm256_maskstore_ps(c, last, r);
            } else {
                if (c_scale != 0.0f) r = _mm256_fmadd_ps(_mm256_set1_ps(c_scale), _mm256_loadu_ps(c), r);
                _mm256_storeu_ps(c, r);
            }
        }
}

using TileFn2 = void (*)(int, const float*, int, const float*, int, float*, int, float, __m256i);

template <int MR>
constexpr TileFn2 tile2_for(int nv) {
    return nv == 1 ? tile_avx2<MR, 1> : tile_avx2<MR, 2>;
}

TileFn2 pick_tile2(int mr, int nv) {
    switch (mr) {
        case 1: return tile2_for<1>(nv);
        case 2: return tile2_for<2>(nv);
        case 3: return tile2_for<3>(nv);
        case 4: return tile2_for<4>(nv);
        case 5: return tile2_for<5>(nv);
        default: return tile2_for<6>(nv);
    }
}

ALLOY_TARGET_AVX2 void gemm_avx2(const Gemm& g) {
    for (int n0 = 0; n0 < g.N; n0 += 8 * kNv2) {
        for (int m0 = 0; m0 < g.M; m0 += kMr2) {
            const int mr = std::min(kMr2, g.M - m0);
            int nw = std::min(8 * kNv2, g.N - n0);
            if (g.tri == Tri::LowerC) nw = std::min(nw, m0 + mr - n0);  // rows need s <= r only
            if (nw <= 0) continue;
            const int nv = (nw + 7) / 8;
            const int kend = g.tri == Tri::LowerA ? std::min(g.K, m0 + mr) : g.K;
            pick_tile2(mr, nv)(kend, g.A + (long)m0 * g.lda, g.lda, g.B + n0, g.ldb, g.C + (long)m0 * g.ldc + n0,
                               g.ldc, g.c_scale, lanes8(nw - 8 * (nv - 1)));
        }
    }
}

void gemm_portable(const Gemm& g) {
    for (int r = 0; r < g.M; ++r) {
        float* Cr = g.C + (long)r * g.ldc;
        const int ncols = g.tri == Tri::LowerC ? std::min(g.N, r + 1) : g.N;
        const int kend = g.tri == Tri::LowerA ? std::min(g.K, r + 1) : g.K;
        for (int j = 0; j < ncols; ++j) Cr[j] = g.c_scale == 0.0f ? 0.0f : g.c_scale * Cr[j];
        for (int k = 0; k < kend; ++k) {
            const float a = g.A[(long)r * g.lda + k];
            const float* Bk = g.B + (long)k * g.ldb;
            for (int j = 0; j < ncols; ++j) Cr[j] += a * Bk[j];
        }
    }
}

}  // namespace

void gemm(Isa isa, const Gemm& g) {
    if (g.M <= 0 || g.N <= 0) return;
    if (isa == Isa::Avx512)
        gemm_avx512(g);
    else if (isa == Isa::Avx2)
        gemm_avx2(g);
    else
        gemm_portable(g);
}

void tri_inverse(Isa isa, int n, const float* A, int lda, float* T, int ldt, float* scratch) {
    constexpr int kB = 16;  // diagonal block size
    for (int I0 = 0; I0 < n; I0 += kB) {
        const int nb = std::min(kB, n - I0);
        // Diagonal block by forward substitution: T_II[r][:] = e_r - sum_{s<r} A_II[r][s] T_II[s][:].
        for (int r = 0; r < nb; ++r) {
            float* row = T + (long)(I0 + r) * ldt;
            for (int c = I0; c < n; ++c) row[c] = 0.0f;  // the diagonal block and everything right of it
            for (int s = 0; s < r; ++s) {
                const float a = A[(long)(I0 + r) * lda + I0 + s];
                const float* Ts = T + (long)(I0 + s) * ldt + I0;
                for (int c = 0; c <= s; ++c) row[I0 + c] -= a * Ts[c];
            }
            row[I0 + r] = 1.0f;
        }
        if (I0 == 0) continue;
        // Block row I left of the diagonal: R = A[I, :I] T[:I, :I] ([nb, I0]), then
        // T[I, :I] = (-T_II) R.
        float* R = scratch;                    // [nb, I0], ld n
        float* nTII = scratch + (long)kB * n;  // [nb, nb], ld kB
        gemm(isa, {nb, I0, I0, A + (long)I0 * lda, lda, T, ldt, R, n, 0.0f, Tri::None});
        for (int r = 0; r < nb; ++r)
            for (int c = 0; c < nb; ++c) nTII[r * kB + c] = -T[(long)(I0 + r) * ldt + I0 + c];
        gemm(isa, {nb, I0, nb, nTII, kB, R, n, T + (long)I0 * ldt, ldt, 0.0f, Tri::LowerA});
    }
}

}  // namespace alloy::cpu::gdn
