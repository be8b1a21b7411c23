// AVX-512 row-dot kernels for decode (T <= 4): 16 adjacent weight rows per call, one row per
// zmm lane. Each step loads 64 bytes of each of the 16 rows (16 memory streams, which DRAM
// needs to approach its bandwidth), transposes them in registers (transpose16) so a vector
// holds the same k-slice of 16 rows, and meets a broadcast activation element / pair / quad.
//
// Why lanes = rows rather than a horizontal dot per row: this is the GEMM tile's arithmetic
// with rows and tokens swapped. Per output, the operations, their operands and their order
// (sequential over k inside kc chunks, chunk sums added in order) are exactly the tile's, so
// decode, prefill and every T give bit-identical results.
// GCC 12's AVX-512 intrinsic headers use _mm512_undefined_* internally and trip this warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_transpose.h"

#define ALLOY_Q8D_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#define ALLOY_BFD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")))
#define ALLOY_FD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

namespace alloy::cpu::mm {
namespace {

constexpr int kRows = 16;
constexpr int kBlockBytes = 34;       // Q8_0: f16 scale + 32 int8
constexpr int kPrefetchBytes = 1024;  // software prefetch distance along each row


// Row pointers of the call; rows past nr repeat the last row (read, never stored).
struct Rows {
    const uint8_t* p[kRows];
    Rows(const WeightView& W, int64_t r0, int nr) {
        for (int r = 0; r < kRows; ++r) p[r] = W.row(r0 + std::min(r, nr - 1));
    }
};

template <int NT>
ALLOY_FD_TARGET inline void store_rows(const __m512* total, int nr, int64_t r0, int64_t t0, float* y, int64_t ldy) {
    const __mmask16 m = __mmask16((1u << nr) - 1);
    for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy + r0, m, total[t]);
}

// ---------------------------------------------------------------------------------------
// Q8_0: two blocks per step (row r's zmm = block b | block b+1), so the transpose yields
// the 8 k-quads of block b in col[0..7] and of block b+1 in col[8..15]. The 16 row scales
// come in with one gather. Mirrors q8_tile: per block, int32 sum from corr over 8 quads
// (flipped weights), then f = fma(float(sum), d_w * d_x, f); f restarts every kQ8Kc.

template <int NT>
ALLOY_Q8D_TARGET void q8_rows(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, float* y,
                              int64_t ldy) {
    const int64_t K = W.n_in, nb = K / kQ8;
    const Rows rows(W, r0, nr);
    alignas(64) int32_t offs[kRows];
    for (int r = 0; r < kRows; ++r) offs[r] = int32_t(rows.p[r] - rows.p[0]);
    const __m512i gather_idx = _mm512_load_si512(offs);
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    __m512 total[NT];
    for (auto& v : total) v = _mm512_setzero_ps();
    constexpr int64_t chunk_blocks = kQ8Kc / kQ8;
    for (int64_t c0 = 0; c0 < nb; c0 += chunk_blocks) {
        const int64_t c1 = std::min(nb, c0 + chunk_blocks);
        __m512 f[NT];
        for (auto& v : f) v = _mm512_setzero_ps();
        for (int64_t b = c0; b < c1; b += 2) {
            const bool two = b + 1 < c1;
            __m512 w[kRows], col[kRows];
            for (int r = 0; r < kRows; ++r) {
                const uint8_t* p = rows.p[r] + b * kBlockBytes;
                _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
                const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
                const __m256i hi = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBlockBytes + 2))
                                       : _mm256_set1_epi8(char(0x80));  // flips to zero weights
                w[r] = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip));
            }
            transpose16(w, col);
            const uint8_t* base = rows.p[0] + b * kBlockBytes;
            const __m512 dw0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(gather_idx, base, 1)));
            const __m512 dw1 = two ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(
                                         _mm512_i32gather_epi32(gather_idx, base + kBlockBytes, 1)))
                                   : _mm512_setzero_ps();
            for (int t = 0; t < NT; ++t) {
                const int64_t tt = t0 + t;
                const int8_t* xq = a.q + tt * K + b * kQ8;
                const float* xd = a.d + tt * nb;
                const int32_t* xc = a.corr + tt * nb;
                __m512i s0 = _mm512_set1_epi32(xc[b]);
                for (int j = 0; j < 8; ++j)
                    s0 = _mm512_dpbusd_epi32(s0, _mm512_castps_si512(col[j]), _mm512_set1_epi32(load_i32(xq + 4 * j)));
                f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw0, _mm512_set1_ps(xd[b])), f[t]);
                if (two) {
                    __m512i s1 = _mm512_set1_epi32(xc[b + 1]);
                    for (int j = 0; j < 8; ++j)
                        s1 = _mm512_dpbusd_epi32(s1, _mm512_castps_si512(col[8 + j]),
                                                 _mm512_set1_epi32(load_i32(xq + kQ8 + 4 * j)));
                    f[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw1, _mm512_set1_ps(xd[b + 1])), f[t]);
                }
            }
        }
        for (int t = 0; t < NT; ++t) total[t] = _mm512_add_ps(total[t], f[t]);
    }
    store_rows<NT>(total, nr, r0, t0, y, ldy);
}

// ---------------------------------------------------------------------------------------
// BF16: 32 elements (16 pairs) per row per step; col[j] = pair j of the 16 rows. Mirrors
// bf16_tile: acc = dpbf16(acc, w pair, x pair) over the pairs of a kBf16Kc chunk.

template <int NT>
ALLOY_BFD_TARGET void bf16_rows(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, float* y,
                                int64_t ldy) {
    const int64_t K = W.n_in;
    const Rows rows(W, r0, nr);
    __m512 total[NT];
    for (auto& v : total) v = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += kBf16Kc) {
        const int64_t k1 = std::min<int64_t>(K, k0 + kBf16Kc);
        __m512 acc[NT];
        for (auto& v : acc) v = _mm512_setzero_ps();
        for (int64_t kb = k0; kb < k1; kb += 32) {
            const int64_t n = std::min<int64_t>(32, k1 - kb);  // odd only at the end of an odd K
            const __mmask32 m = n == 32 ? ~__mmask32(0) : __mmask32((1u << n) - 1);
            __m512 w[kRows], col[kRows];
            for (int r = 0; r < kRows; ++r) {
                const uint8_t* p = rows.p[r] + 2 * kb;
                _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
                w[r] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, p));
            }
            transpose16(w, col);
            for (int t = 0; t < NT; ++t) {
                const uint16_t* x = a.bf + (t0 + t) * K + kb;
                for (int j = 0; j < (n + 1) / 2; ++j) {
                    // A lone last element pairs with 0 (its weight half is 0 too): never read past x.
                    const int32_t pair = 2 * j + 1 < n ? load_i32(x + 2 * j) : int32_t(x[2 * j]);
                    acc[t] = _mm512_dpbf16_ps(acc[t], (__m512bh)col[j], (__m512bh)_mm512_set1_epi32(pair));
                }
            }
        }
        for (int t = 0; t < NT; ++t) total[t] = _mm512_add_ps(total[t], acc[t]);
    }
    store_rows<NT>(total, nr, r0, t0, y, ldy);
}

// ---------------------------------------------------------------------------------------
// F32 and F16: 16 elements per row per step (F16 widened exactly); col[j] = element j of the
// 16 rows. Mirrors f32_tile: acc = fma(w, x, acc) over the elements of a kF32Kc chunk.

template <bool f16, int NT>
ALLOY_FD_TARGET void float_rows(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, float* y,
                                int64_t ldy) {
    const int64_t K = W.n_in;
    const Rows rows(W, r0, nr);
    __m512 total[NT];
    for (auto& v : total) v = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += kF32Kc) {
        const int64_t k1 = std::min<int64_t>(K, k0 + kF32Kc);
        __m512 acc[NT];
        for (auto& v : acc) v = _mm512_setzero_ps();
        for (int64_t kb = k0; kb < k1; kb += 16) {
            const int64_t n = std::min<int64_t>(16, k1 - kb);
            const __mmask16 m = __mmask16((1u << n) - 1);
            __m512 w[kRows], col[kRows];
            for (int r = 0; r < kRows; ++r) {
                const uint8_t* p = rows.p[r] + (f16 ? 2 : 4) * kb;
                _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
                w[r] = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)) : _mm512_maskz_loadu_ps(m, p);
            }
            transpose16(w, col);
            for (int t = 0; t < NT; ++t) {
                const float* x = a.f + (t0 + t) * K + kb;
                for (int j = 0; j < n; ++j) acc[t] = _mm512_fmadd_ps(col[j], _mm512_set1_ps(x[j]), acc[t]);
            }
        }
        for (int t = 0; t < NT; ++t) total[t] = _mm512_add_ps(total[t], acc[t]);
    }
    store_rows<NT>(total, nr, r0, t0, y, ldy);
}

template <template <int> class Kernel>
void by_tokens(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y,
               int64_t ldy) {
    switch (nt) {
        case 1: return Kernel<1>::run(W, r0, nr, a, t0, y, ldy);
        case 2: return Kernel<2>::run(W, r0, nr, a, t0, y, ldy);
        case 3: return Kernel<3>::run(W, r0, nr, a, t0, y, ldy);
        default: return Kernel<4>::run(W, r0, nr, a, t0, y, ldy);
    }
}

template <int NT>
struct Q8 {
    static constexpr auto run = q8_rows<NT>;
};
template <int NT>
struct Bf16 {
    static constexpr auto run = bf16_rows<NT>;
};
template <int NT>
struct F16 {
    static constexpr auto run = float_rows<true, NT>;
};
template <int NT>
struct F32 {
    static constexpr auto run = float_rows<false, NT>;
};

}  // namespace

RowKernel rowdot_avx512(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return cpu_has_avx512_vnni() ? RowKernel{by_tokens<Q8>, kRows} : RowKernel{};
        case GgmlType::BF16: return cpu_has_avx512_bf16() ? RowKernel{by_tokens<Bf16>, kRows} : RowKernel{};
        case GgmlType::F16: return {by_tokens<F16>, kRows};
        case GgmlType::F32: return {by_tokens<F32>, kRows};
        default: return {};
    }
}

}  // namespace alloy::cpu::mm
