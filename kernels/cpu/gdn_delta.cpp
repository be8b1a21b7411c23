// Gated delta rule, recurrent form on the CPU (the decode path). Contract: kernels/cpu/gdn.h;
// math: spec/GDN.md section 1. The state of a head is transposed ([d_v][d_k], column j of S
// contiguous), so for one token and one value column j everything is a pass over d_k floats:
//   sk = S_j . k, sq = S_j . q                  (old state, one read)
//   delta_j = beta (v_j - alpha sk)              (uses the decayed state: alpha S_j . k)
//   o_j = alpha sq + delta_j (k . q)             (= S_j' . q, the read after the write)
//   S_j' = alpha S_j + delta_j k                 (one write)
// AVX-512: 8 columns at a time (their 16 dot products reduced by one transposing tree); for
// T > 1 a group of 4 such blocks (16 KiB) stays in L1 while up to 64 tokens pass over it, so the
// state is read from L2/memory once per 64 tokens, not per token; T = 1 streams it once, in
// address order (see step_avx512).
// Parallel over (sequence, head) only, so each head's arithmetic never depends on the thread
// count, and its per-column operation sequence never depends on how tokens are split over
// calls: both properties are part of the decode/verification contract.
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/gdn.h"
#include "kernels/cpu/gdn_internal.h"
#include "kernels/cpu/gdn_simd.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/ref/gdn_common.h"

namespace alloy::cpu {
namespace gdn {
namespace {

// The portable path sums dot products in the reference's fixed eight-partial-sum order.
using ref::detail::dot;

void head_portable(const DeltaIo& io, int seq, int h) {
    const int d_k = io.shape.d_k, d_v = io.shape.d_v, kh = io.shape.key_head(h);
    float* S = io.state_at(seq, h);  // [d_v, d_k]
    for (int64_t t = io.offs[seq]; t < io.offs[seq + 1]; ++t) {
        const float* q = io.q_at(t, kh);  // [d_k]
        const float* k = io.k_at(t, kh);  // [d_k]
        const float* v = io.v_at(t, h);   // [d_v]
        float* o = io.out_at(t, h);       // [d_v]
        const float alpha = std::exp(io.g[t * io.shape.H_v + h]), beta = io.beta[t * io.shape.H_v + h];
        const float kq = dot(k, q, d_k);
        for (int j = 0; j < d_v; ++j) {
            float* col = S + (std::size_t)j * d_k;  // S[:, j]
            const float sk = dot(col, k, d_k), sq = dot(col, q, d_k);
            const float delta = beta * (v[j] - alpha * sk);
            o[j] = alpha * sq + delta * kq;
            for (int i = 0; i < d_k; ++i) col[i] = alpha * col[i] + k[i] * delta;
        }
    }
}

// ---- AVX2 (d_k % 8 == 0) -------------------------------------------------------------------
// head_portable's per-column math with the sums over d_k in 8 lanes, 4 columns at a time: their
// 8 dot products (S_c . k, S_c . q) are reduced together by one hadd tree, then the 4 columns
// (2 KiB at d_k = 128, still in L1) are updated. Per token the same operations whatever the
// token count of the call, so verification reproduces decode.

// Lane i of the result = sum of the 8 lanes of v[i].
ALLOY_TARGET_AVX2 inline __m256 reduce8(const __m256 v[8]) {
    const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// a . b in 8 lanes, n % 8 == 0.
ALLOY_TARGET_AVX2 __m256 dot8_avx2(const float* a, const float* b, int n) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    return acc;
}

// col = alpha col + delta k
ALLOY_TARGET_AVX2 inline void update_col_avx2(float* col, const float* k, int d_k, __m256 alpha, float delta) {
    const __m256 dc = _mm256_set1_ps(delta);
    for (int i = 0; i < d_k; i += 8)
        _mm256_storeu_ps(col + i, _mm256_fmadd_ps(_mm256_loadu_ps(k + i), dc, _mm256_mul_ps(alpha, _mm256_loadu_ps(col + i))));
}

ALLOY_TARGET_AVX2 void head_avx2(const DeltaIo& io, int seq, int h) {
    const int d_k = io.shape.d_k, d_v = io.shape.d_v, kh = io.shape.key_head(h);
    float* S = io.state_at(seq, h);  // [d_v, d_k]
    for (int64_t t = io.offs[seq]; t < io.offs[seq + 1]; ++t) {
        const float* q = io.q_at(t, kh);
        const float* k = io.k_at(t, kh);
        const float* v = io.v_at(t, h);
        float* o = io.out_at(t, h);
        const float alpha = std::exp(io.g[t * io.shape.H_v + h]), beta = io.beta[t * io.shape.H_v + h];
        const float kq = avx2::hsum(dot8_avx2(k, q, d_k));
        const __m256 va = _mm256_set1_ps(alpha);
        int j = 0;
        for (; j + 4 <= d_v; j += 4) {
            float* cols = S + (std::size_t)j * d_k;
            __m256 acc[8];  // [0, 4): S_c . k, [4, 8): S_c . q
            for (auto& a : acc) a = _mm256_setzero_ps();
            for (int c = 0; c < 4; ++c)
                for (int i = 0; i < d_k; i += 8) {
                    const __m256 sv = _mm256_loadu_ps(cols + (std::size_t)c * d_k + i);
                    acc[c] = _mm256_fmadd_ps(sv, _mm256_loadu_ps(k + i), acc[c]);
                    acc[4 + c] = _mm256_fmadd_ps(sv, _mm256_loadu_ps(q + i), acc[4 + c]);
                }
            alignas(32) float sums[8];
            _mm256_store_ps(sums, reduce8(acc));
            float delta[4];
            for (int c = 0; c < 4; ++c) {
                delta[c] = beta * (v[j + c] - alpha * sums[c]);
                o[j + c] = alpha * sums[4 + c] + delta[c] * kq;
            }
            for (int c = 0; c < 4; ++c) update_col_avx2(cols + (std::size_t)c * d_k, k, d_k, va, delta[c]);
        }
        for (; j < d_v; ++j) {  // columns past the last group of 4: one at a time, same math
            float* col = S + (std::size_t)j * d_k;
            const float sk = avx2::hsum(dot8_avx2(col, k, d_k)), sq = avx2::hsum(dot8_avx2(col, q, d_k));
            const float delta = beta * (v[j] - alpha * sk);
            o[j] = alpha * sq + delta * kq;
            update_col_avx2(col, k, d_k, va, delta);
        }
    }
}

// ---- AVX-512 ----------------------------------------------------------------------------

constexpr int kCols = 8;       // value columns per block: 8 S.k + 8 S.q sums = one reduce16
constexpr int kGroup = 4;      // column blocks interleaved per token (16 KiB of state in L1)
constexpr int kTokBlock = 64;  // tokens per sweep over the state: their q, k, v rows (96 KiB) stay in L2

// Lane i of the result = sum of the 16 lanes of v[i]: a transposing tree, 45 shuffles/adds
// for 16 sums instead of ~8 per horizontal sum. The tree leaves its sums in the order
// lane 4L+e = input 4e+L, so the inputs go in transposed.
ALLOY_AVX512 inline __m512 reduce16(const __m512 v[16]) {
    __m512 x[16], r[8], s[4];
    for (int j = 0; j < 16; ++j) x[j] = v[4 * (j % 4) + j / 4];
    for (int m = 0; m < 8; ++m)  // 128-bit lanes 0,1: x[2m]; 2,3: x[2m+1]
        r[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0x44),
                             _mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0xEE));
    for (int p = 0; p < 4; ++p)  // 128-bit lane L: 4 floats of x[4p+L]
        s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * p], r[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(r[2 * p], r[2 * p + 1], 0xDD));
    const __m512 u0 = _mm512_add_ps(_mm512_unpacklo_ps(s[0], s[1]), _mm512_unpackhi_ps(s[0], s[1]));
    const __m512 u1 = _mm512_add_ps(_mm512_unpacklo_ps(s[2], s[3]), _mm512_unpackhi_ps(s[2], s[3]));
    const __m512d a = _mm512_castps_pd(u0), b = _mm512_castps_pd(u1);
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

ALLOY_AVX512 float dot_avx512(const float* a, const float* b, int n) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = gdn_simd::lanes(n - i);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

ALLOY_AVX512 inline __m512 load(const float* p, __mmask16 m, bool masked) {
    return masked ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
}
ALLOY_AVX512 inline void store(float* p, __m512 x, __mmask16 m, bool masked) {
    if (masked)
        _mm512_mask_storeu_ps(p, m, x);
    else
        _mm512_storeu_ps(p, x);
}

// S_c[i:i+16] = alpha S_c[i:i+16] + delta_c k[i:i+16]
ALLOY_AVX512 inline void update_at(float* cols, int d_k, const float* k, int i, __mmask16 m, bool masked,
                                   __m512 alpha, const float* delta) {
    const __m512 kv = load(k + i, m, masked);
    for (int c = 0; c < kCols; ++c) {
        float* p = cols + (std::size_t)c * d_k + i;
        store(p, _mm512_fmadd_ps(kv, _mm512_set1_ps(delta[c]), _mm512_mul_ps(alpha, load(p, m, masked))), m, masked);
    }
}

// One token on kCols columns (cols: [kCols, d_k]); columns past nc are zero padding. Whole
// vectors are loaded and stored unmasked: a masked store does not forward to the next token's
// load of the same address, which stalled the token loop.
ALLOY_AVX512 void step_avx512(float* cols, int d_k, const float* k, const float* q, const float* v,
                              float* o, int nc, float alpha, float beta, float kq) {
    const int full = d_k & ~15;
    const __mmask16 tail = gdn_simd::lanes(d_k - full);
    __m512 acc[2 * kCols];  // [0, 8): S_c . k, [8, 16): S_c . q
    for (auto& a : acc) a = _mm512_setzero_ps();
    // Column by column, so that the reads walk the block's 4 KiB in address order: decode
    // streams the state from memory, and the hardware prefetcher follows one sequential stream
    // far better than 8 interleaved ones 512 bytes apart. Each sum keeps its order over i.
    for (int c = 0; c < kCols; ++c) {
        const float* col = cols + (std::size_t)c * d_k;
        for (int i = 0; i < full; i += 16) {
            const __m512 s = _mm512_loadu_ps(col + i);
            acc[c] = _mm512_fmadd_ps(s, _mm512_loadu_ps(k + i), acc[c]);
            acc[kCols + c] = _mm512_fmadd_ps(s, _mm512_loadu_ps(q + i), acc[kCols + c]);
        }
        if (full < d_k) {
            const __m512 s = _mm512_maskz_loadu_ps(tail, col + full);
            acc[c] = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(tail, k + full), acc[c]);
            acc[kCols + c] = _mm512_fmadd_ps(s, _mm512_maskz_loadu_ps(tail, q + full), acc[kCols + c]);
        }
    }
    const __m512 sums = reduce16(acc);
    const __m256 sk = _mm512_castps512_ps256(sums);
    const __m256 sq = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1));
    const __mmask8 cm = (__mmask8)((1u << nc) - 1u);
    const __m256 va = _mm256_set1_ps(alpha);
    const __m256 delta = _mm256_mul_ps(_mm256_set1_ps(beta), _mm256_fnmadd_ps(va, sk, _mm256_maskz_loadu_ps(cm, v)));
    _mm256_mask_storeu_ps(o, cm, _mm256_fmadd_ps(delta, _mm256_set1_ps(kq), _mm256_mul_ps(va, sq)));
    alignas(32) float d[kCols];
    _mm256_store_ps(d, delta);
    const __m512 a16 = _mm512_set1_ps(alpha);
    for (int i = 0; i < full; i += 16) update_at(cols, d_k, k, i, 0xFFFF, false, a16, d);
    if (full < d_k) update_at(cols, d_k, k, full, tail, true, a16, d);
}

// Prefetch the cache lines of x[0, n) into L2.
inline void prefetch_row(const float* x, int n) {
    for (int i = 0; i < n; i += 16) _mm_prefetch((const char*)(x + i), _MM_HINT_T1);
}

// pad: [kCols, d_k] scratch for a last block of fewer than kCols columns. Blocks of a group
// take turns per token: their chains are independent, so one block's reduction and update
// overlap the next block's dot products (one block alone is a latency-bound chain per token).
ALLOY_AVX512 void head_avx512(const DeltaIo& io, int seq, int h, float* pad) {
    const int d_k = io.shape.d_k, d_v = io.shape.d_v, H_v = io.shape.H_v, kh = io.shape.key_head(h);
    float* S = io.state_at(seq, h);  // [d_v, d_k]
    float alpha[kTokBlock], beta[kTokBlock], kq[kTokBlock];
    for (int64_t t0 = io.offs[seq]; t0 < io.offs[seq + 1]; t0 += kTokBlock) {
        const int n = (int)std::min<int64_t>(kTokBlock, io.offs[seq + 1] - t0);
        for (int r = 0; r < n; ++r) {
            // The rows of q, k, v are 8 KiB apart in the token-major inputs: without a prefetch
            // each one is a cache miss inside the dependent per-token chain of the first group.
            prefetch_row(io.k_at(t0 + r, kh), d_k);
            prefetch_row(io.q_at(t0 + r, kh), d_k);
            prefetch_row(io.v_at(t0 + r, h), d_v);
        }
        for (int r = 0; r < n; ++r) {
            alpha[r] = std::exp(io.g[(t0 + r) * H_v + h]);
            beta[r] = io.beta[(t0 + r) * H_v + h];
            kq[r] = dot_avx512(io.k_at(t0 + r, kh), io.q_at(t0 + r, kh), d_k);
        }
        for (int g0 = 0; g0 < d_v; g0 += kCols * kGroup) {
            float* cols[kGroup];  // [nc[b], d_k] each, L1-resident across the n tokens
            int nc[kGroup], nb = 0;
            for (int j0 = g0; j0 < std::min(d_v, g0 + kCols * kGroup); j0 += kCols, ++nb) {
                nc[nb] = std::min(kCols, d_v - j0);
                cols[nb] = S + (std::size_t)j0 * d_k;
                if (nc[nb] < kCols) {  // only the last block of the head
                    std::fill(pad, pad + (std::size_t)kCols * d_k, 0.0f);
                    std::copy(cols[nb], cols[nb] + (std::size_t)nc[nb] * d_k, pad);
                    cols[nb] = pad;
                }
            }
            // No software prefetch of the next group: decode streams the state in address order
            // and the hardware prefetcher keeps up; a 16 KiB prefetch burst per group made the
            // 1 MiB decode pass take 56 us instead of 42 (microbenchmark in NOTES.md).
            for (int r = 0; r < n; ++r)
                for (int b = 0; b < nb; ++b)
                    step_avx512(cols[b], d_k, io.k_at(t0 + r, kh), io.q_at(t0 + r, kh),
                                io.v_at(t0 + r, h) + g0 + b * kCols, io.out_at(t0 + r, h) + g0 + b * kCols, nc[b],
                                alpha[r], beta[r], kq[r]);
            if (cols[nb - 1] == pad) std::copy(pad, pad + (std::size_t)nc[nb - 1] * d_k, S + (std::size_t)(g0 + (nb - 1) * kCols) * d_k);
        }
    }
}

}  // namespace

void delta_serial(Isa isa, const DeltaIo& io) {
    const int n_items = io.n_seqs * io.shape.H_v;
    std::vector<std::vector<float>> pad(n_threads());
    auto head = [&](int64_t item, int thread) {
        const int seq = (int)(item / io.shape.H_v), h = (int)(item % io.shape.H_v);
        if (io.offs[seq + 1] == io.offs[seq]) return;
        if (isa == Isa::Avx512) {
            auto& p = pad[thread];
            if (p.empty()) p.resize((std::size_t)kCols * io.shape.d_k);
            head_avx512(io, seq, h, p.data());
        } else if (isa == Isa::Avx2 && io.shape.d_k % 8 == 0) {
            head_avx2(io, seq, h);
        } else {
            head_portable(io, seq, h);
        }
    };
    // Decode and verification (every sequence at most kFixedSplitTokens tokens: near-equal
    // items): each thread takes the same heads every call, so a state stays with the thread (and
    // the CCD) that wrote it; longer calls balance by the pool's counter. ALLOY_GDN_FIXED=0:
    // always the counter.
    constexpr int kFixedSplitTokens = 16;
    static const bool fixed_ok = [] {
        const char* e = std::getenv("ALLOY_GDN_FIXED");
        return !(e && e[0] == '0');
    }();
    int longest = 0;
    for (int s = 0; s < io.n_seqs; ++s) longest = std::max<int>(longest, io.offs[s + 1] - io.offs[s]);
    if (fixed_ok && longest <= kFixedSplitTokens) parallel_for_fixed(n_items, head);
    else parallel_for(n_items, head);
}

// The reference's argument checks (kernels/ref/gdn_delta.cpp), same messages.
void check_delta_args(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                      const float* k, const float* v, const float* g, const float* beta, float* state,
                      float* out, const char* op) {
    ref::detail::check_shape(shape, op);
    ref::detail::check_seq_offsets(n_seqs, seq_offsets, op);
    if (n_seqs > 0) ref::detail::check_ptr(state, op, "state");
    if (n_seqs > 0 && seq_offsets[n_seqs] > seq_offsets[0]) {
        ref::detail::check_ptr(q, op, "q");
        ref::detail::check_ptr(k, op, "k");
        ref::detail::check_ptr(v, op, "v");
        ref::detail::check_ptr(g, op, "g");
        ref::detail::check_ptr(beta, op, "beta");
        ref::detail::check_ptr(out, op, "out");
    }
}

DeltaIo dense_io(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                 const float* k, const float* v, const float* g, const float* beta, float* state,
                 float* out) {
    DeltaIo io;
    io.shape = shape;
    io.n_seqs = n_seqs;
    io.offs = seq_offsets;
    io.q = q;
    io.k = k;
    io.v = v;
    io.g = g;
    io.beta = beta;
    io.state = state;
    io.out = out;
    io.qk_stride = (int64_t)shape.H_k * shape.d_k;
    io.v_stride = (int64_t)shape.H_v * shape.d_v;
    return io;
}

}  // namespace gdn

void gdn_delta_serial(Isa isa, const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                      const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out) {
    const char* op = "cpu::gdn_delta_serial";
    gdn::check_isa(isa, op);
    gdn::check_delta_args(shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out, op);
    gdn::delta_serial(isa, gdn::dense_io(shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out));
}

void gdn_delta_serial(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                      const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out) {
    gdn_delta_serial(active_isa(), shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out);
}

}  // namespace alloy::cpu
