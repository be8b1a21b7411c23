#include "kernels/cpu/matmul_act.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/matmul_kquant.h"
#include "kernels/cpu/thread_pool.h"

namespace alloy::cpu::mm {
namespace {

size_t up64(size_t n) { return (n + 63) & ~size_t(63); }

// Carves 64-byte aligned sections out of one buffer.
struct Carver {
    uint8_t* p;
    template <class T>
    T* take(size_t count) {
        T* r = reinterpret_cast<T*>(p);
        p += up64(count * sizeof(T));
        return r;
    }
};

// The per-thread row buffer of prep_panel: a group's 16 token rows converted side by side
// (Q8: k-quads, d and corr; Bf16Bits: k-pairs; Q8K: codes, d and 16-value sums) before they
// are interleaved into the panel. The fp32 panels need none.
size_t panel_row_bytes(ActKind kind, int64_t K) {
    const size_t nb = size_t(K / kQ8);
    switch (kind) {
        case ActKind::Q8: return size_t(kGroup) * size_t(K / 4) * 4 + size_t(kGroup) * nb * 8;
        case ActKind::Bf16Bits: return size_t(kGroup) * size_t(K / 2) * 4 + size_t(kGroup) * nb * 8;
        case ActKind::Q8K:
            return size_t(kGroup * K) + size_t(kGroup * (K / kQK)) * 4 + size_t(kGroup * (K / 16)) * 2;
        case ActKind::Bf16F32:
        case ActKind::F32: return 0;
    }
    return 0;
}

void quantize_q8(Isa isa, const float* x, int64_t K, int8_t* q, float* d, int32_t* corr) {
    if (isa == Isa::Avx512) quantize_q8_avx512(x, K, q, d, corr);
    else if (isa == Isa::Avx2) quantize_q8_avx2(x, K, q, d, corr);
    else quantize_q8_scalar(x, K, q, d, corr);
}
void to_bf16(Isa isa, const float* x, int64_t n, uint16_t* out) {
    if (isa == Isa::Avx512) to_bf16_avx512(x, n, out);
    else to_bf16_scalar(x, n, out);
}

// dst[u * 16 + l] = rows[l * units + u]: 16 token rows of 32-bit units into the panel layout.
void interleave16(Isa isa, const uint32_t* rows, int64_t units, uint32_t* dst) {
    if (isa == Isa::Avx512) {
        interleave16_avx512(rows, units, dst);
        return;
    }
    for (int64_t u = 0; u < units; ++u)
        for (int l = 0; l < kGroup; ++l) dst[u * kGroup + l] = rows[l * units + u];
}

// The Q8_K panel (K-quant GEMM tiles): each token row quantized (quantize_q8k), its k-quads
// interleaved as the Q8_0 panel's, its scales spread to lane l of [G, K/256, 16] and its
// 16-value block sums, two a 32-bit lane (int16 pairs), to lane l of [G, K/32, 16]. Padding
// tokens are zero (d = 0).
void prep_panel_q8k(Isa isa, const float* x, int64_t T, int64_t K, Carver& c, ActPanel& out) {
    const int64_t G = (T + kGroup - 1) / kGroup, nd = K / kQK, ns = K / 16, units = K / 4;
    int8_t* q = c.take<int8_t>(size_t(G * kGroup * K));
    float* d = c.take<float>(size_t(G * kGroup * nd));
    int32_t* bs = c.take<int32_t>(size_t(G * kGroup * (ns / 2)));
    out.q = q, out.d = d, out.bsums = bs;
    const size_t rb_bytes = up64(panel_row_bytes(ActKind::Q8K, K));
    uint8_t* rbs = c.take<uint8_t>(rb_bytes * size_t(n_threads()));
    parallel_for(G, [&](int64_t g, int thread) {
        uint8_t* rb = rbs + rb_bytes * size_t(thread);  // this pool thread's row buffer
        uint32_t* rows = reinterpret_cast<uint32_t*>(rb);
        float* rd = reinterpret_cast<float*>(rb + kGroup * K);
        int16_t* rs = reinterpret_cast<int16_t*>(rd + kGroup * nd);
        for (int l = 0; l < kGroup; ++l) {
            const int64_t t = g * kGroup + l;
            int8_t* row = reinterpret_cast<int8_t*>(rows + l * units);
            if (t < T) {
                quantize_q8k(isa, x + t * K, K, row, rd + l * nd, rs + l * ns);
            } else {
                std::memset(row, 0, size_t(K));
                std::fill(rd + l * nd, rd + (l + 1) * nd, 0.0f);
                std::fill(rs + l * ns, rs + (l + 1) * ns, int16_t(0));
            }
        }
        interleave16(isa, rows, units, reinterpret_cast<uint32_t*>(q + g * kGroup * K));
        for (int l = 0; l < kGroup; ++l) {
            for (int64_t b = 0; b < nd; ++b) d[(g * nd + b) * kGroup + l] = rd[l * nd + b];
            for (int64_t s = 0; s < ns; s += 2)
                bs[(g * (ns / 2) + s / 2) * kGroup + l] =
                    int32_t(uint32_t(uint16_t(rs[l * ns + s])) | uint32_t(uint16_t(rs[l * ns + s + 1])) << 16);
        }
    });
}

}  // namespace

// ggml's x86 quantize_row_q8_0: amax over the block, d = amax / 127 stored as fp16,
// q = round-to-nearest-even(x * (127 / amax)). (ggml's generic reference divides by d and
// rounds half away from zero; the x86 build that llama.cpp runs here does this.)
void quantize_q8_scalar(const float* x, int64_t K, int8_t* q, float* d, int32_t* corr) {
    for (int64_t b = 0; b < K / kQ8; ++b) {
        const float* xb = x + b * kQ8;
        float amax = 0.0f;
        for (int i = 0; i < kQ8; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
        d[b] = fp16_to_fp32(fp32_to_fp16(amax / 127.f));
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < kQ8; ++i) {
            const int32_t v = int32_t(std::nearbyint(xb[i] * id));  // default mode: nearest even
            q[b * kQ8 + i] = int8_t(v);
            sum += v;
        }
        corr[b] = -128 * sum;
    }
}

void q8_round_row(const float* x, int64_t K, float* out) {
    int8_t q[kQ8];
    float d;
    int32_t corr;
    for (int64_t b = 0; b < K / kQ8; ++b) {  // block by block: the same values as one call over K
        quantize_q8_scalar(x + b * kQ8, kQ8, q, &d, &corr);
        for (int j = 0; j < kQ8; ++j) out[b * kQ8 + j] = float(q[j]) * d;
    }
}

void to_bf16_scalar(const float* x, int64_t n, uint16_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_bf16(x[i]);
}

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__)
    static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    return yes;
#else
    return false;
#endif
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
    static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    return yes;
#else
    return false;
#endif
}

size_t act_rows_bytes(ActKind kind, int64_t T, int64_t K) {
    const size_t n = size_t(T * K);
    switch (kind) {
        case ActKind::Q8: return up64(n) + 2 * up64(size_t(T * (K / kQ8)) * 4);
        case ActKind::Q8K: return up64(n) + up64(size_t(T * (K / kQK)) * 4) + up64(size_t(T * (K / 16)) * 2);
        case ActKind::Bf16Bits: return up64(n * 2);
        case ActKind::Bf16F32: return up64(n * 4);
        case ActKind::F32: return 0;
    }
    return 0;
}

void prep_rows(ActKind kind, Isa isa, const float* x, int64_t T, int64_t K, uint8_t* buf, ActRows& out) {
    out = ActRows{};
    out.K = K;
    Carver c{buf};
    switch (kind) {
        case ActKind::Q8: {
            const int64_t nb = K / kQ8;
            int8_t* q = c.take<int8_t>(size_t(T * K));
            float* d = c.take<float>(size_t(T * nb));
            int32_t* corr = c.take<int32_t>(size_t(T * nb));
            for (int64_t t = 0; t < T; ++t) quantize_q8(isa, x + t * K, K, q + t * K, d + t * nb, corr + t * nb);
            out.q = q, out.d = d, out.corr = corr;
            return;
        }
        case ActKind::Q8K: {
            int8_t* q = c.take<int8_t>(size_t(T * K));
            float* d = c.take<float>(size_t(T * (K / kQK)));
            int16_t* bs = c.take<int16_t>(size_t(T * (K / 16)));
            for (int64_t t = 0; t < T; ++t) quantize_q8k(isa, x + t * K, K, q + t * K, d + t * (K / kQK), bs + t * (K / 16));
            out.q = q, out.d = d, out.bsums = bs;
            return;
        }
        case ActKind::Bf16Bits: {
            uint16_t* bf = c.take<uint16_t>(size_t(T * K));
            to_bf16(isa, x, T * K, bf);
            out.bf = bf;
            return;
        }
        case ActKind::Bf16F32: {
            float* f = c.take<float>(size_t(T * K));
            for (int64_t i = 0; i < T * K; ++i) f[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
            out.f = f;
            return;
        }
        case ActKind::F32: out.f = x; return;
    }
}

size_t act_panel_bytes(ActKind kind, int64_t T, int64_t K) {
    const size_t G = size_t((T + kGroup - 1) / kGroup), n = G * kGroup * size_t(K);
    const size_t rows = up64(panel_row_bytes(kind, K)) * size_t(n_threads());  // prep_panel's row buffers
    switch (kind) {
        case ActKind::Q8:  // + the narrow last group's octets (q_pairs)
            return up64(n) + 2 * up64(G * kGroup * size_t(K / kQ8) * 4) + up64(size_t(kNarrowTokens * K)) + rows;
        case ActKind::Q8K:
            return up64(n) + up64(G * kGroup * size_t(K / kQK) * 4) + up64(G * kGroup * size_t(K / 32) * 4) + rows;
        case ActKind::Bf16Bits: return up64(n * 2) + rows;
        case ActKind::Bf16F32:
        case ActKind::F32: return up64(n * 4);
    }
    return 0;
}

// Each group of 16 tokens is built by one pool item: a token row is converted into a small
// per-thread row buffer, then its 4-byte units are spread to lane l of every panel vector.
void prep_panel(ActKind kind, Isa isa, const float* x, int64_t T, int64_t K, uint8_t* buf, ActPanel& out) {
    out = ActPanel{};
    out.K = K;
    const int64_t G = (T + kGroup - 1) / kGroup, nb = K / kQ8;
    Carver c{buf};
    if (kind == ActKind::Q8K) {
        prep_panel_q8k(isa, x, T, K, c, out);
        return;
    }
    int8_t* q = nullptr;
    float *d = nullptr, *f = nullptr;
    int32_t* corr = nullptr;
    uint16_t* bf = nullptr;
    uint64_t* q_pairs = nullptr;
    if (kind == ActKind::Q8) {
        q = c.take<int8_t>(size_t(G * kGroup * K));
        d = c.take<float>(size_t(G * kGroup * nb));
        corr = c.take<int32_t>(size_t(G * kGroup * nb));
        out.q = q, out.d = d, out.corr = corr;
        q_pairs = c.take<uint64_t>(size_t(K / 8) * kNarrowTokens);
        // Only the VNNI narrow tile reads them (the AVX-512 converters' plans).
        if (isa == Isa::Avx512 && T - (G - 1) * kGroup <= kNarrowTokens) out.q_pairs = reinterpret_cast<const int8_t*>(q_pairs);
    } else if (kind == ActKind::Bf16Bits) {
        bf = c.take<uint16_t>(size_t(G * kGroup * K));
        out.bf = bf;
    } else {
        f = c.take<float>(size_t(G * kGroup * K));
        out.f = f;
    }
    // One row buffer per pool thread, after the panel in buf (act_panel_bytes counts them): 16
    // token rows of K, 320 KiB at K = 16384 (Q8_0), too large for a worker's stack.
    const size_t rb_bytes = up64(panel_row_bytes(kind, K));
    uint8_t* rbs = c.take<uint8_t>(rb_bytes * size_t(n_threads()));
    parallel_for(G, [&](int64_t g, int thread) {
        if (kind == ActKind::Q8 || kind == ActKind::Bf16Bits) {
            // The group's 16 token rows are converted side by side, then their 32-bit units
            // (k-quads or k-pairs) are interleaved into the panel by 16 x 16 transposes.
            const int64_t units = kind == ActKind::Q8 ? K / 4 : K / 2;  // 32-bit units per token
            uint32_t* rows = reinterpret_cast<uint32_t*>(rbs + rb_bytes * size_t(thread));
            float* rd = reinterpret_cast<float*>(rows + kGroup * units);
            int32_t* rc = reinterpret_cast<int32_t*>(rd + kGroup * nb);
            for (int l = 0; l < kGroup; ++l) {
                const int64_t t = g * kGroup + l;
                uint32_t* row = rows + l * units;
                if (t >= T) {
                    std::memset(row, 0, size_t(units) * 4);
                    if (kind == ActKind::Q8) {
                        std::fill(rd + l * nb, rd + (l + 1) * nb, 0.0f);
                        std::fill(rc + l * nb, rc + (l + 1) * nb, 0);
                    }
                } else if (kind == ActKind::Q8) {
                    quantize_q8(isa, x + t * K, K, reinterpret_cast<int8_t*>(row), rd + l * nb, rc + l * nb);
                } else {
                    to_bf16(isa, x + t * K, K, reinterpret_cast<uint16_t*>(row));
                }
            }
            uint32_t* dst = reinterpret_cast<uint32_t*>(kind == ActKind::Q8 ? static_cast<void*>(q + g * kGroup * K)
                                                                            : static_cast<void*>(bf + g * kGroup * K));
            interleave16(isa, rows, units, dst);
            // The narrow kernel's copy of a last group of <= 8 tokens: k-octet m of token t at
            // q_pairs[m * 8 + t] (ActPanel::q_pairs).
            if (kind == ActKind::Q8 && out.q_pairs && g == G - 1) {
                const uint64_t* src = reinterpret_cast<const uint64_t*>(rows);
                for (int64_t m = 0; m < K / 8; ++m)
                    for (int l = 0; l < kNarrowTokens; ++l) q_pairs[m * kNarrowTokens + l] = src[l * (K / 8) + m];
            }
            if (kind == ActKind::Q8)
                for (int64_t b = 0; b < nb; ++b)
                    for (int l = 0; l < kGroup; ++l) {
                        d[(g * nb + b) * kGroup + l] = rd[l * nb + b];
                        corr[(g * nb + b) * kGroup + l] = rc[l * nb + b];
                    }
            return;
        }
        for (int l = 0; l < kGroup; ++l) {
            const int64_t t = g * kGroup + l;
            const bool real = t < T;
            if (isa == Isa::Avx512 && kind == ActKind::F32) {  // one 16 x K transpose per group
                if (l > 0) continue;
                const int64_t n_real = T - g * kGroup < kGroup ? T - g * kGroup : kGroup;
                float* pf = f + g * kGroup * K;
                if (n_real < kGroup) std::memset(pf, 0, size_t(kGroup * K) * sizeof(float));
                store_transposed_avx512(x + g * kGroup * K, int(K), n_real, K, pf, kGroup);
            } else {
                float* pf = f + g * kGroup * K;
                const float* xt = x + t * K;
                for (int64_t k = 0; k < K; ++k) {
                    float v = real ? xt[k] : 0.0f;
                    if (kind == ActKind::Bf16F32) v = bf16_to_fp32(fp32_to_bf16(v));
                    pf[k * kGroup + l] = v;
                }
            }
        }
    });
}

}  // namespace alloy::cpu::mm
