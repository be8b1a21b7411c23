// Fused Gated DeltaNet layer op on the CPU: everything of spec/MODEL.md section 3 between the
// input projections and out_proj, as ref::gdn_fused (kernels/ref/gdn_fused.cpp), with each
// elementwise stage vectorized and spread over the thread pool:
//   1. causal depthwise conv1d (with carried state) + SiLU   parallel over (seq, tokens, channels)
//   2. L2 norm of q, k per key head (q also / sqrt(d_k)); beta, g   parallel over tokens
//   3. the delta rule, reading q | k | v in place in the conv output (strided rows)
//   4. gated RMSNorm per value head, y = o rsqrt(mean o^2 + eps) norm SiLU(z)   over tokens
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/gdn.h"
#include "kernels/cpu/gdn_internal.h"
#include "kernels/cpu/gdn_simd.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/workspace.h"
#include "kernels/ref/activations.h"
#include "kernels/ref/gdn_common.h"

namespace alloy::cpu {
namespace {

constexpr int kTokBlock = 32;     // tokens per work item of the elementwise stages
constexpr int kChanBlock = 512;   // conv channels per work item (2 KiB per row)
constexpr int kDirectConvTokens = 16;  // longest sequence of the channel-major conv (decode, verification)
constexpr int kDirectConvMaxK = 4;     // widest conv it has an instance for (Qwen3.5: 4)

// Inputs of the conv for one sequence: input time tau < 0 reads the carried state.
struct ConvSeq {
    const float* x;     // [n, conv_dim] this sequence's pre-conv rows
    const float* prev;  // [K-1, conv_dim] state transposed, oldest first
    int n;
    const float* row(int tau, int conv_dim, int K) const {
        return tau < 0 ? prev + (std::size_t)(K - 1 + tau) * conv_dim : x + (std::size_t)tau * conv_dim;
    }
};

// u[t][c] = SiLU(sum_tap wT[tap][c] x[t - (K-1) + tap][c]) for c in [c0, c1).
ALLOY_AVX512 void conv_rows_avx512(const ConvSeq& cs, int conv_dim, int K, const float* wT, int t0, int t1,
                                   int c0, int c1, float* u) {
    for (int t = t0; t < t1; ++t)
        for (int c = c0; c < c1; c += 16) {
            const __mmask16 m = gdn_simd::lanes(c1 - c);
            __m512 acc = _mm512_setzero_ps();
            for (int tap = 0; tap < K; ++tap)
                acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, wT + (std::size_t)tap * conv_dim + c),
                                      _mm512_maskz_loadu_ps(m, cs.row(t - (K - 1) + tap, conv_dim, K) + c), acc);
            _mm512_mask_storeu_ps(u + (std::size_t)t * conv_dim + c, m, gdn_simd::silu512(acc));
        }
}

// The same conv for a short sequence (n <= kDirectConvTokens) straight from the stored layouts:
// taps w [conv_dim, K] and state hist [conv_dim, K-1] (updated in place to the last K-1 inputs).
// Per value: acc = 0, then one FMA per tap, oldest first, as conv_rows_avx512 does. K is a
// template argument so that the per-channel window lives in registers.
// The FMA part, shared by the AVX-512 and AVX2 paths (each applies its own SiLU after it).
template <int K>
ALLOY_TARGET_AVX2 void conv_direct_taps(const float* x, int n, int conv_dim, const float* w, float* hist, int c0,
                                        int c1, float* u) {
    for (int c = c0; c < c1; ++c) {
        const float* wc = w + (std::size_t)c * K;
        float* hc = hist + (std::size_t)c * (K - 1);
        float win[K - 1 + kDirectConvTokens];  // [K-1 state | n inputs] of channel c
        for (int i = 0; i < K - 1; ++i) win[i] = hc[i];
        for (int t = 0; t < n; ++t) win[K - 1 + t] = x[(std::size_t)t * conv_dim + c];
        for (int t = 0; t < n; ++t) {
            float acc = 0.0f;
            for (int tap = 0; tap < K; ++tap) acc = std::fma(wc[tap], win[t + tap], acc);
            u[(std::size_t)t * conv_dim + c] = acc;
        }
        for (int i = 0; i < K - 1; ++i) hc[i] = win[n + i];
    }
}
template <int K>
ALLOY_AVX512 void conv_direct_avx512(const float* x, int n, int conv_dim, const float* w, float* hist, int c0,
                                     int c1, float* u) {
    conv_direct_taps<K>(x, n, conv_dim, w, hist, c0, c1, u);
    for (int t = 0; t < n; ++t)
        for (int c = c0; c < c1; c += 16) {
            const __mmask16 m = gdn_simd::lanes(c1 - c);
            float* p = u + (std::size_t)t * conv_dim + c;
            _mm512_mask_storeu_ps(p, m, gdn_simd::silu512(_mm512_maskz_loadu_ps(m, p)));
        }
}

// Lane tables of conv_direct4_avx512 for the [16 channels, 3 slots] conv state (48 floats in
// three vectors B0..B2): slot i of channel j is element 3j + i, taken from (B0, B1) below 32
// and from (B1, B2) at 3j + i - 16 otherwise; back, element e of output vector o holds slot
// e % 3 of channel e / 3 (slots 0, 1 from (S0, S1), slot 2 from S2). Built at compile time.
struct ConvStateLanes {
    alignas(64) int32_t lo[3][16] = {}, hi[3][16] = {}, back01[3][16] = {}, back2[3][16] = {};
    __mmask16 from_hi[3] = {0, 0, 0}, is2[3] = {0, 0, 0};
    constexpr ConvStateLanes() {
        for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 16; ++j) {
                const int e = 3 * j + i, f = 16 * i + j, slot = f % 3, ch = f / 3;
                lo[i][j] = e < 31 ? e : 31;
                hi[i][j] = e > 16 ? e - 16 : 0;
                if (e >= 32) from_hi[i] = __mmask16(from_hi[i] | (1u << j));
                back01[i][j] = slot == 0 ? ch : slot == 1 ? 16 + ch : 0;
                back2[i][j] = ch;
                if (slot == 2) is2[i] = __mmask16(is2[i] | (1u << j));
            }
    }
};
constexpr ConvStateLanes kConvStateLanes;

// conv_direct_avx512<4> with 16 channels per step: the [16, 4] taps and [16, 3] states are
// de-interleaved into one vector per tap / state slot by lane permutes (and the new state
// interleaved back), so the per-channel window lives in zmm registers. Per value the same
// operations in the same order as the scalar loop (acc = 0, one FMA per tap, SiLU), so the
// same bits; the tail of fewer than 16 channels takes the scalar loop.
ALLOY_AVX512 void conv_direct4_avx512(const float* x, int n, int conv_dim, const float* w, float* hist, int c0,
                                      int c1, float* u) {
    constexpr int K = 4;
    // Taps: permutex2var over [16 ch x 4 taps] halves gives [tap t of ch 0-7 | tap t+1 of ch 0-7].
    const __m512i tap01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i tap23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    const ConvStateLanes& L = kConvStateLanes;
    int c = c0;
    for (; c + 16 <= c1; c += 16) {
        const float* wc = w + (std::size_t)c * K;
        const __m512 a0 = _mm512_loadu_ps(wc), a1 = _mm512_loadu_ps(wc + 16), a2 = _mm512_loadu_ps(wc + 32),
                     a3 = _mm512_loadu_ps(wc + 48);
        const __m512 l01 = _mm512_permutex2var_ps(a0, tap01, a1), h01 = _mm512_permutex2var_ps(a2, tap01, a3);
        const __m512 l23 = _mm512_permutex2var_ps(a0, tap23, a1), h23 = _mm512_permutex2var_ps(a2, tap23, a3);
        const __m512 tap[K] = {_mm512_shuffle_f32x4(l01, h01, 0x44), _mm512_shuffle_f32x4(l01, h01, 0xEE),
                               _mm512_shuffle_f32x4(l23, h23, 0x44), _mm512_shuffle_f32x4(l23, h23, 0xEE)};
        float* hc = hist + (std::size_t)c * (K - 1);
        const __m512 b0 = _mm512_loadu_ps(hc), b1 = _mm512_loadu_ps(hc + 16), b2 = _mm512_loadu_ps(hc + 32);
        __m512 win[K - 1 + kDirectConvTokens];  // [3 state slots | n inputs], 16 channels each
        for (int i = 0; i < K - 1; ++i)
            win[i] = _mm512_mask_blend_ps(L.from_hi[i],
                                          _mm512_permutex2var_ps(b0, _mm512_load_si512(L.lo[i]), b1),
                                          _mm512_permutex2var_ps(b1, _mm512_load_si512(L.hi[i]), b2));
        for (int t = 0; t < n; ++t) win[K - 1 + t] = _mm512_loadu_ps(x + (std::size_t)t * conv_dim + c);
        for (int t = 0; t < n; ++t) {
            __m512 acc = _mm512_setzero_ps();
            for (int k = 0; k < K; ++k) acc = _mm512_fmadd_ps(tap[k], win[t + k], acc);
            _mm512_storeu_ps(u + (std::size_t)t * conv_dim + c, gdn_simd::silu512(acc));
        }
        const __m512 s0 = win[n], s1 = win[n + 1], s2 = win[n + 2];  // the new state slots
        for (int o = 0; o < K - 1; ++o)
            _mm512_storeu_ps(hc + 16 * o, _mm512_mask_blend_ps(L.is2[o],
                                                               _mm512_permutex2var_ps(s0, _mm512_load_si512(L.back01[o]), s1),
                                                               _mm512_permutexvar_ps(_mm512_load_si512(L.back2[o]), s2)));
    }
    if (c < c1) conv_direct_avx512<4>(x, n, conv_dim, w, hist, c, c1, u);
}

template <int K>
ALLOY_TARGET_AVX2 void conv_direct_avx2(const float* x, int n, int conv_dim, const float* w, float* hist, int c0, int c1,
                                        float* u);
// conv_direct_avx512 or conv_direct_avx2 for the K of the call (2 <= K <= kDirectConvMaxK).
void conv_direct(bool avx512, int K, const float* x, int n, int conv_dim, const float* w, float* hist, int c0, int c1,
                 float* u) {
    switch (K) {
        case 2: return (avx512 ? conv_direct_avx512<2> : conv_direct_avx2<2>)(x, n, conv_dim, w, hist, c0, c1, u);
        case 3: return (avx512 ? conv_direct_avx512<3> : conv_direct_avx2<3>)(x, n, conv_dim, w, hist, c0, c1, u);
        default: return (avx512 ? conv_direct4_avx512 : conv_direct_avx2<4>)(x, n, conv_dim, w, hist, c0, c1, u);
    }
}

void conv_rows_portable(const ConvSeq& cs, int conv_dim, int K, const float* wT, int t0, int t1, int c0,
                        int c1, float* u) {
    for (int t = t0; t < t1; ++t) {
        float* ut = u + (std::size_t)t * conv_dim;
        for (int c = c0; c < c1; ++c) ut[c] = 0.0f;
        for (int tap = 0; tap < K; ++tap) {
            const float* w = wT + (std::size_t)tap * conv_dim;
            const float* x = cs.row(t - (K - 1) + tap, conv_dim, K);
            for (int c = c0; c < c1; ++c) ut[c] += w[c] * x[c];
        }
        for (int c = c0; c < c1; ++c) ut[c] = ref::silu(ut[c]);
    }
}

// ---- AVX2 versions of the conv, the L2 norm and the gated norm (the rest of the op's
// AVX2 path is portable, but for the chunked products: gdn_gemm.cpp).

// conv_rows_portable, 8 channels at a time (FMA per tap, oldest first); a channel past the
// last whole vector of [c0, c1) is always the portable one, whatever T.
ALLOY_TARGET_AVX2 void conv_rows_avx2(const ConvSeq& cs, int conv_dim, int K, const float* wT, int t0, int t1, int c0,
                                      int c1, float* u) {
    const int c8 = c0 + (c1 - c0) / 8 * 8;
    for (int t = t0; t < t1; ++t)
        for (int c = c0; c < c8; c += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int tap = 0; tap < K; ++tap)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(wT + (std::size_t)tap * conv_dim + c),
                                      _mm256_loadu_ps(cs.row(t - (K - 1) + tap, conv_dim, K) + c), acc);
            _mm256_storeu_ps(u + (std::size_t)t * conv_dim + c, avx2::silu(acc));
        }
    if (c8 < c1) conv_rows_portable(cs, conv_dim, K, wT, t0, t1, c8, c1, u);
}

// conv_rows_avx2 for decode and verification (n <= kDirectConvTokens) straight from the stored
// layouts, as conv_direct_avx512: per value acc = 0, one FMA per tap oldest first, avx2::silu,
// so conv_rows_avx2's bits ((c1 - c0) % 8 == 0: no portable tail). The transposes of the taps and
// states into rows (and of the new state back) that the rows path needs were serial strided
// copies, ~35% of the AVX2 op's time at decode (0.8B shapes, Zen 4, session 44).
template <int K>
ALLOY_TARGET_AVX2 void conv_direct_avx2(const float* x, int n, int conv_dim, const float* w, float* hist, int c0, int c1,
                                        float* u) {
    conv_direct_taps<K>(x, n, conv_dim, w, hist, c0, c1, u);
    for (int t = 0; t < n; ++t)
        for (int c = c0; c < c1; c += 8) {
            float* p = u + (std::size_t)t * conv_dim + c;
            _mm256_storeu_ps(p, avx2::silu(_mm256_loadu_ps(p)));
        }
}
// x *= scale / sqrt(sum x^2 + eps); n % 8 == 0.
ALLOY_TARGET_AVX2 void l2norm_avx2(float* x, int n, float eps, float scale) {
    __m256 ss = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) ss = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(x + i), ss);
    const __m256 f = _mm256_set1_ps(scale / std::sqrt(avx2::hsum(ss) + eps));
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), f));
}

// y = o rsqrt(mean(o^2) + eps) norm SiLU(z); n % 8 == 0.
ALLOY_TARGET_AVX2 void gated_norm_avx2(const float* o, const float* z, const float* norm, float* y, int n, float eps) {
    __m256 ss = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) ss = _mm256_fmadd_ps(_mm256_loadu_ps(o + i), _mm256_loadu_ps(o + i), ss);
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(avx2::hsum(ss) / (float)n + eps));
    for (int i = 0; i < n; i += 8) {
        const __m256 on = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(o + i), inv), _mm256_loadu_ps(norm + i));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(on, avx2::silu(_mm256_loadu_ps(z + i))));
    }
}

// x *= scale / sqrt(sum x^2 + eps)
ALLOY_AVX512 void l2norm_avx512(float* x, int n, float eps, float scale) {
    __m512 ss = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(gdn_simd::lanes(n - i), x + i);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 f = _mm512_set1_ps(scale / std::sqrt(_mm512_reduce_add_ps(ss) + eps));
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = gdn_simd::lanes(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), f));
    }
}

void l2norm_portable(float* x, int n, float eps, float scale) {
    ref::l2norm(x, (std::size_t)n, eps);
    for (int i = 0; i < n; ++i) x[i] *= scale;
}

// y = o rsqrt(mean(o^2) + eps) norm SiLU(z), one value head ([n] each).
ALLOY_AVX512 void gated_norm_avx512(const float* o, const float* z, const float* norm, float* y, int n, float eps) {
    __m512 ss = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        const __m512 v = _mm512_maskz_loadu_ps(gdn_simd::lanes(n - i), o + i);
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / (float)n + eps));
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = gdn_simd::lanes(n - i);
        const __m512 on = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, o + i), inv),
                                        _mm512_maskz_loadu_ps(m, norm + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(on, gdn_simd::silu512(_mm512_maskz_loadu_ps(m, z + i))));
    }
}

void gated_norm_portable(const float* o, const float* z, const float* norm, float* y, int n, float eps) {
    float ss = 0.0f;
    for (int j = 0; j < n; ++j) ss += o[j] * o[j];
    const float inv = 1.0f / std::sqrt(ss / (float)n + eps);
    for (int j = 0; j < n; ++j) y[j] = o[j] * inv * norm[j] * ref::silu(z[j]);
}


// The workspace (kernels/cpu/workspace.h), in this order: the conv output u [T, conv_dim]
// (q | k | v rows, normalized in place), the delta rule's output o [T, H_v, d_v], then for the
// chunked mode delta_chunked's own. These were buffers of the calling thread kept across calls,
// so that a layer call reused warm pages (at T = 4096 u alone is 100 MB); a plan's workspace is
// reused the same way.
struct FusedLayout {
    float* u = nullptr;
    float* o = nullptr;
    void* chunked = nullptr;
    size_t bytes = 0;
};
FusedLayout fused_layout(const GdnParams& p, int n_seqs, int n_tokens, void* workspace) {
    const GdnShape& sh = p.shape;
    const std::size_t T = (std::size_t)std::max(0, n_tokens), value_dim = (std::size_t)sh.H_v * sh.d_v;
    ws::Carver c(workspace);
    FusedLayout L;
    L.u = c.take<float>(T * (2 * (std::size_t)sh.H_k * sh.d_k + value_dim));
    L.o = c.take<float>(T * value_dim);
    if (p.mode != GdnMode::Serial) {
        const std::size_t n = gdn::delta_chunked_workspace_bytes(sh, n_seqs, n_tokens, p.chunk_size);
        L.chunked = c.take<uint8_t>(n);
    }
    L.bytes = c.bytes();
    return L;
}

}  // namespace

size_t gdn_fused_workspace_bytes(const GdnParams& p, int n_seqs, int n_tokens) {
    return fused_layout(p, n_seqs, n_tokens, nullptr).bytes;
}

void gdn_fused(Isa isa, const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state,
               float* state, float* y, const int32_t* seq_slots, void* workspace) {
    const char* op = "cpu::gdn_fused";
    gdn::check_isa(isa, op);
    ref::detail::check_fused_args(p, w, n_seqs, seq_offsets, qkv, z, a, b, conv_state, state, y, op);
    if (n_seqs == 0) return;
    const bool avx512 = isa == Isa::Avx512;
    const GdnShape& sh = p.shape;
    // The AVX2 norms need whole vectors (every Qwen3.5 head: 128).
    const bool avx2 = isa == Isa::Avx2 && sh.d_k % 8 == 0 && sh.d_v % 8 == 0;
    const auto l2norm = avx512 ? l2norm_avx512 : avx2 ? l2norm_avx2 : l2norm_portable;
    const auto gated_norm = avx512 ? gated_norm_avx512 : avx2 ? gated_norm_avx2 : gated_norm_portable;
    const auto conv_rows = avx512 ? conv_rows_avx512 : isa == Isa::Avx2 ? conv_rows_avx2 : conv_rows_portable;
    const int H_k = sh.H_k, H_v = sh.H_v, d_k = sh.d_k, d_v = sh.d_v, K = p.conv_kernel;
    const int key_dim = H_k * d_k, value_dim = H_v * d_v, conv_dim = 2 * key_dim + value_dim;
    const int base = seq_offsets[0], T = seq_offsets[n_seqs] - base;
    if (T == 0) return;
    std::vector<int32_t> offs(n_seqs + 1);  // tokens re-indexed from 0
    for (int s = 0; s <= n_seqs; ++s) offs[s] = seq_offsets[s] - base;
    const std::size_t t0 = (std::size_t)base;
    auto slot = [&](int s) -> std::size_t { return seq_slots ? (std::size_t)seq_slots[s] : (std::size_t)s; };

    // 1. conv + SiLU, then (2.) the L2 norms of the q and k heads each item just convolved,
    // while they are in L1 (a separate pass read and wrote the 8 MiB of q and k again at
    // T = 512), and in the same pool region the gates. Channel blocks are whole heads in the
    // q and k regions, so every head is normalized by the item that made it. Decode and
    // verification (every sequence at most kDirectConvTokens long) read taps and state in
    // their stored channel-major layout; longer inputs transpose them to [K, conv_dim] once
    // per call so that a tap is a contiguous row like the inputs. Both paths do the same
    // operations per value, so they give the same bits.
    const FusedLayout scratch = fused_layout(p, n_seqs, T, workspace);
    float* u = scratch.u;  // [T, conv_dim] = [Q | K | V]
    std::vector<int> cb;  // channel block bounds
    {
        const int head_block = std::max(1, kChanBlock / d_k) * d_k;
        for (int c = 0; c < key_dim; c += head_block) cb.push_back(c);
        for (int c = key_dim; c < 2 * key_dim; c += head_block) cb.push_back(c);
        for (int c = 2 * key_dim; c < conv_dim; c += kChanBlock) cb.push_back(c);
        cb.push_back(conv_dim);
    }
    const int n_cblocks = (int)cb.size() - 1;
    const float q_scale = 1.0f / std::sqrt((float)d_k);
    // L2 norm of the q and k heads in channels [c0, c1) of rows [t0r, t1r) of u.
    auto norm_heads = [&](int t0r, int t1r, int c0, int c1) {
        if (c0 >= 2 * key_dim) return;
        const bool is_q = c0 < key_dim;
        for (int t = t0r; t < t1r; ++t)
            for (int c = c0; c < c1; c += d_k) l2norm(u + (std::size_t)t * conv_dim + c, d_k, p.eps, is_q ? q_scale : 1.0f);
    };
    std::vector<float> g((std::size_t)T * H_v), beta((std::size_t)T * H_v);  // [T, H_v] each
    const int n_tblocks = (T + kTokBlock - 1) / kTokBlock;
    auto gates = [&](int64_t blk) {
        for (int t = (int)blk * kTokBlock; t < std::min(T, (int)(blk + 1) * kTokBlock); ++t)
            for (int h = 0; h < H_v; ++h) {
                const std::size_t th = (std::size_t)t * H_v + h, src = (t0 + t) * H_v + h;
                beta[th] = ref::sigmoid(b[src]);
                g[th] = w.ssm_a[h] * ref::softplus(a[src] + w.dt_bias[h]);
            }
    };
    int longest = 0;
    for (int s = 0; s < n_seqs; ++s) longest = std::max(longest, offs[s + 1] - offs[s]);
    // (AVX2: the channel blocks are whole vectors when d_k and d_v are, as `avx2` requires.)
    if ((avx512 || avx2) && longest <= kDirectConvTokens && K >= 2 && K <= kDirectConvMaxK) {
        const int64_t n_conv = (int64_t)n_seqs * n_cblocks;
        parallel_for(n_conv + n_tblocks, [&](int64_t i, int) {
            if (i >= n_conv) return gates(i - n_conv);
            const int s = (int)(i / n_cblocks), n = offs[s + 1] - offs[s];
            const int c0 = cb[i % n_cblocks], c1 = cb[i % n_cblocks + 1];
            if (n == 0) return;
            conv_direct(avx512, K, qkv + (t0 + offs[s]) * conv_dim, n, conv_dim, w.conv1d,
                        conv_state + slot(s) * conv_dim * (K - 1), c0, c1, u + (std::size_t)offs[s] * conv_dim);
            norm_heads(offs[s], offs[s + 1], c0, c1);
        });
    } else {
        std::vector<float> wT((std::size_t)K * conv_dim), prev((std::size_t)n_seqs * (K - 1) * conv_dim);
        for (int c = 0; c < conv_dim; ++c)
            for (int tap = 0; tap < K; ++tap) wT[(std::size_t)tap * conv_dim + c] = w.conv1d[(std::size_t)c * K + tap];
        std::vector<ConvSeq> seqs(n_seqs);
        for (int s = 0; s < n_seqs; ++s) {
            float* ps = prev.data() + (std::size_t)s * (K - 1) * conv_dim;
            const float* hs = conv_state + slot(s) * conv_dim * (K - 1);
            for (int c = 0; c < conv_dim; ++c)
                for (int i = 0; i < K - 1; ++i) ps[(std::size_t)i * conv_dim + c] = hs[(std::size_t)c * (K - 1) + i];
            seqs[s] = {qkv + (t0 + offs[s]) * conv_dim, ps, offs[s + 1] - offs[s]};
        }
        struct ConvItem {
            int seq, t0, t1;
        };
        std::vector<ConvItem> conv_items;
        for (int s = 0; s < n_seqs; ++s)
            for (int t = 0; t < seqs[s].n; t += kTokBlock) conv_items.push_back({s, t, std::min(seqs[s].n, t + kTokBlock)});
        const int64_t n_conv = (int64_t)conv_items.size() * n_cblocks;
        parallel_for(n_conv + n_tblocks, [&](int64_t i, int) {
            if (i >= n_conv) return gates(i - n_conv);
            const ConvItem& it = conv_items[i / n_cblocks];
            const int c0 = cb[i % n_cblocks], c1 = cb[i % n_cblocks + 1];
            float* us = u + (std::size_t)offs[it.seq] * conv_dim;
            conv_rows(seqs[it.seq], conv_dim, K, wT.data(), it.t0, it.t1, c0, c1, us);
            norm_heads(offs[it.seq] + it.t0, offs[it.seq] + it.t1, c0, c1);
        });
        // New conv state = the last K-1 inputs of concat(old state, x) (still partly the old
        // state when the sequence is shorter than K-1); empty sequences keep theirs.
        for (int s = 0; s < n_seqs; ++s) {
            if (seqs[s].n == 0) continue;
            float* hs = conv_state + slot(s) * conv_dim * (K - 1);
            for (int i = 0; i < K - 1; ++i) {
                const float* src = seqs[s].row(seqs[s].n - (K - 1) + i, conv_dim, K);
                for (int c = 0; c < conv_dim; ++c) hs[(std::size_t)c * (K - 1) + i] = src[c];
            }
        }
    }

    // 3. the delta rule on views of u.
    float* o = scratch.o;  // [T, H_v, d_v]
    gdn::DeltaIo io;
    io.shape = sh;
    io.n_seqs = n_seqs;
    io.offs = offs.data();
    io.q = u;
    io.k = u + key_dim;
    io.v = u + 2 * key_dim;
    io.g = g.data();
    io.beta = beta.data();
    io.state = state;
    io.slots = seq_slots;
    io.out = o;
    io.qk_stride = io.v_stride = conv_dim;
    if (p.mode == GdnMode::Serial)
        gdn::delta_serial(isa, io);
    else
        gdn::delta_chunked(isa, io, p.chunk_size, scratch.chunked);

    // 4. gated RMSNorm.
    parallel_for(n_tblocks, [&](int64_t blk, int) {
        for (int t = (int)blk * kTokBlock; t < std::min(T, (int)(blk + 1) * kTokBlock); ++t)
            for (int h = 0; h < H_v; ++h) {
                const std::size_t row = ((t0 + t) * H_v + h) * d_v;
                gated_norm(o + ((std::size_t)t * H_v + h) * d_v, z + row, w.norm, y + row, d_v, p.eps);
            }
    });
}

// Without a workspace (tests, test-ops): one of the call's own.
void gdn_fused(Isa isa, const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state,
               float* state, float* y, const int32_t* seq_slots) {
    const int n_tokens = n_seqs > 0 && seq_offsets ? seq_offsets[n_seqs] - seq_offsets[0] : 0;
    ScratchBuffer ws;
    gdn_fused(isa, p, w, n_seqs, seq_offsets, qkv, z, a, b, conv_state, state, y, seq_slots,
              ws.get(gdn_fused_workspace_bytes(p, n_seqs, n_tokens)));
}

void gdn_fused(const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state,
               float* state, float* y, const int32_t* seq_slots) {
    gdn_fused(active_isa(), p, w, n_seqs, seq_offsets, qkv, z, a, b, conv_state, state, y, seq_slots);
}

}  // namespace alloy::cpu
