// Gated delta rule, chunked form on the CPU (prefill). Contract: kernels/cpu/gdn.h; math:
// spec/GDN.md section 2, same splits as the reference (kernels/ref/gdn_delta.cpp) but every
// product is a small register-tiled GEMM (gdn_gemm.h), and a chunk's stage-1 products
// (~147 KiB per chunk and head at C = 64, d = 128) are consumed soon after they are made
// instead of being kept for the whole prompt. Two schedules, picked at launch (delta_chunked):
// pipelined (per (sequence, head), stage 1 then stage 2 chunk by chunk in one thread) when the
// pairs keep every thread busy, else batched (stage 1 of a batch of chunks in parallel over
// (chunk, head), then stage 2). The arithmetic per chunk is the same: the bits are too.
//
// Per chunk of n <= C tokens of one (sequence, value head), t0 its first token:
//   stage 1 (parallel over (sequence, chunk, head) of the batch):
//     G = cumsum(g)                                   [n]
//     A = beta * (K K^T) .* exp(G_r - G_s), s < r     [n, n]
//     T = (I + A)^-1                                  [n, n]  blocked substitution
//     U = T (beta V), Wn = -T (beta e^G K)            [n, d_v], [n, d_k]
//     QKM = (Q K^T) .* exp(G_r - G_s), s <= r         [n, n]
//     Qg = e^G Q, Ktd = (K e^(G_C - G))^T             [n, d_k], [d_k, n]
//   stage 2 (per (sequence, head), chunks in order), on S in natural layout [d_k, d_v]:
//     Delta = U + Wn S;  O = Qg S + QKM Delta;  S = e^(G_C) S + Ktd Delta
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/cpu/gdn.h"
#include "kernels/cpu/gdn_gemm.h"
#include "kernels/cpu/gdn_internal.h"
#include "kernels/cpu/gdn_simd.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/workspace.h"

namespace alloy::cpu {
namespace gdn {
namespace {

// Stage-1 products kept per batch: about this many bytes, but at least one chunk per head.
constexpr std::size_t kBatchBytes = std::size_t(8) << 20;

struct Chunk {
    int seq;
    int64_t t0;
    int n;
};

// y[i] = e^x[i]
ALLOY_AVX512 void exp_row_avx512(const float* x, float* y, int n) {
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = gdn_simd::lanes(n - i);
        _mm512_mask_storeu_ps(y + i, m, gdn_simd::exp512(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

// The same with the AVX2 exp (vec_math_avx2.h), the tail by libm.
ALLOY_TARGET_AVX2 void exp_row_avx2(const float* x, float* y, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, avx2::exp(_mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = std::exp(x[i]);
}

void exp_row(Isa isa, const float* x, float* y, int n) {
    if (isa == Isa::Avx512)
        exp_row_avx512(x, y, n);
    else if (isa == Isa::Avx2)
        exp_row_avx2(x, y, n);
    else
        for (int i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

// dst[c][r] = src[r][c] for an [rows, cols] matrix, in 16 x 16 tiles (both sides stay in L1).
void transpose_portable(const float* src, int ld_src, float* dst, int ld_dst, int rows, int cols) {
    for (int r0 = 0; r0 < rows; r0 += 16)
        for (int c0 = 0; c0 < cols; c0 += 16)
            for (int r = r0; r < std::min(rows, r0 + 16); ++r)
                for (int c = c0; c < std::min(cols, c0 + 16); ++c)
                    dst[(std::size_t)c * ld_dst + r] = src[(std::size_t)r * ld_src + c];
}

// On AVX-512 and AVX2 the matmul's register transposes do the same (16 x 16 or 8 x 8 blocks).
void transpose(Isa isa, const float* src, int ld_src, float* dst, int ld_dst, int rows, int cols) {
    if (isa == Isa::Avx512)
        mm::store_transposed_avx512(src, ld_src, rows, cols, dst, ld_dst);
    else if (isa == Isa::Avx2)
        mm::store_transposed_avx2(src, ld_src, rows, cols, dst, ld_dst);
    else
        transpose_portable(src, ld_src, dst, ld_dst, rows, cols);
}

// Where the products of one (chunk, head) slot live; C is the chunk size.
struct SlotLayout {
    int C, d_k, d_v;
    std::size_t U() const { return 0; }                                   // [C, d_v] U, then Delta
    std::size_t Wn() const { return U() + (std::size_t)C * d_v; }         // [C, d_k]
    std::size_t Qg() const { return Wn() + (std::size_t)C * d_k; }        // [C, d_k]
    std::size_t QKM() const { return Qg() + (std::size_t)C * d_k; }       // [C, C]
    std::size_t Ktd() const { return QKM() + (std::size_t)C * C; }        // [d_k, C]
    std::size_t size() const { return Ktd() + (std::size_t)d_k * C; }
};

// Per-thread scratch of stage 1.
struct Scratch1 {
    std::vector<float> A, T, Tb, Tk, G, eG, beta, x, row, inv;  // Tb, Tk: T with scaled columns
    Scratch1(int C)
        : A((std::size_t)C * C), T((std::size_t)C * C), Tb((std::size_t)C * C), Tk((std::size_t)C * C),
          G(C), eG(C), beta(C), x(C), row(C), inv((std::size_t)16 * C + 256) {}
};

// Stage 1 of one chunk. Its elementwise loops (exponent differences, scalings of A, T, Q and
// K^T) are plain C++: inlined into stage1_avx512 they compile to AVX-512 vectors, elsewhere
// to the baseline's. Multiplies only, so the vector width changes no bit.
__attribute__((always_inline)) inline void stage1_body(Isa isa, const DeltaIo& io, const Chunk& ch, int h,
                                                       const SlotLayout& L, float* slot, float* gC, Scratch1& w) {
    const int n = ch.n, C = L.C, d_k = L.d_k, d_v = L.d_v, H_v = io.shape.H_v, kh = io.shape.key_head(h);
    float* U = slot + L.U();
    float* Wn = slot + L.Wn();
    float* Qg = slot + L.Qg();
    float* QKM = slot + L.QKM();
    float* Kt = slot + L.Ktd();  // K^T first, scaled into Ktd at the end
    float* A = w.A.data();
    float* G = w.G.data();
    float* eG = w.eG.data();
    float* beta = w.beta.data();
    float* D = w.row.data();

    // G_r = sum_{s<=r} g_s, restarting at the chunk; non-increasing, so every exponent below is <= 0.
    float acc = 0.0f;
    for (int r = 0; r < n; ++r) {
        G[r] = acc += io.g[(ch.t0 + r) * H_v + h];
        beta[r] = io.beta[(ch.t0 + r) * H_v + h];
    }
    exp_row(isa, G, eG, n);
    *gC = G[n - 1];

    transpose(isa, io.k_at(ch.t0, kh), (int)io.qk_stride, Kt, C, n, d_k);  // [d_k, n]
    gemm(isa, {n, n, d_k, io.k_at(ch.t0, kh), (int)io.qk_stride, Kt, C, A, C, 0.0f, Tri::LowerC});    // K K^T
    gemm(isa, {n, n, d_k, io.q_at(ch.t0, kh), (int)io.qk_stride, Kt, C, QKM, C, 0.0f, Tri::LowerC});  // Q K^T
    for (int r = 0; r < n; ++r) {
        for (int s = 0; s <= r; ++s) w.x[s] = G[r] - G[s];
        exp_row(isa, w.x.data(), D, r + 1);  // D[s] = exp(G_r - G_s), s <= r
        float* Ar = A + (std::size_t)r * C;
        float* Mr = QKM + (std::size_t)r * C;
        for (int s = 0; s < r; ++s) Ar[s] *= beta[r] * D[s];
        for (int s = r; s < n; ++s) Ar[s] = 0.0f;
        for (int s = 0; s <= r; ++s) Mr[s] *= D[s];
        for (int s = r + 1; s < n; ++s) Mr[s] = 0.0f;  // read as zeros by the LowerA product
    }
    tri_inverse(isa, n, A, C, w.T.data(), C, w.inv.data());

    // U = T diag(beta) V and Wn = T diag(-beta e^G) K: the diagonal scales go on T's columns
    // (n x n) so that V and K are read in place.
    float* Tb = w.Tb.data();  // [n, n] T diag(beta)
    float* Tk = w.Tk.data();  // [n, n] T diag(-beta e^G)
    for (int r = 0; r < n; ++r)
        for (int s = 0; s < n; ++s) {
            const float t = w.T[(std::size_t)r * C + s];
            Tb[(std::size_t)r * C + s] = t * beta[s];
            Tk[(std::size_t)r * C + s] = t * -(beta[s] * eG[s]);
        }
    gemm(isa, {n, d_v, n, Tb, C, io.v_at(ch.t0, h), (int)io.v_stride, U, d_v, 0.0f, Tri::LowerA});
    gemm(isa, {n, d_k, n, Tk, C, io.k_at(ch.t0, kh), (int)io.qk_stride, Wn, d_k, 0.0f, Tri::LowerA});

    for (int r = 0; r < n; ++r) {
        const float* q = io.q_at(ch.t0 + r, kh);
        float* qg = Qg + (std::size_t)r * d_k;
        for (int i = 0; i < d_k; ++i) qg[i] = eG[r] * q[i];
    }
    for (int s = 0; s < n; ++s) w.x[s] = G[n - 1] - G[s];
    exp_row(isa, w.x.data(), D, n);  // e^{G_C - G_s}
    for (int i = 0; i < d_k; ++i) {
        float* Ki = Kt + (std::size_t)i * C;
        for (int s = 0; s < n; ++s) Ki[s] *= D[s];
    }
}

ALLOY_AVX512 void stage1_avx512(Isa isa, const DeltaIo& io, const Chunk& ch, int h, const SlotLayout& L, float* slot,
                                float* gC, Scratch1& w) {
    stage1_body(isa, io, ch, h, L, slot, gC, w);
}

void stage1(Isa isa, const DeltaIo& io, const Chunk& ch, int h, const SlotLayout& L, float* slot, float* gC,
            Scratch1& w) {
    if (isa == Isa::Avx512) stage1_avx512(isa, io, ch, h, L, slot, gC, w);
    else stage1_body(isa, io, ch, h, L, slot, gC, w);
}

// One chunk's scan step on the natural-layout state S [d_k, d_v].
void stage2(Isa isa, const DeltaIo& io, const Chunk& ch, int h, const SlotLayout& L, float* slot, float gC,
            float* S) {
    const int n = ch.n, C = L.C, d_k = L.d_k, d_v = L.d_v;
    const int ldo = io.shape.H_v * d_v;
    float* Delta = slot + L.U();
    float* O = io.out_at(ch.t0, h);  // rows of [n, d_v] with stride H_v d_v
    gemm(isa, {n, d_v, d_k, slot + L.Wn(), d_k, S, d_v, Delta, d_v, 1.0f, Tri::None});      // U + Wn S
    gemm(isa, {n, d_v, d_k, slot + L.Qg(), d_k, S, d_v, O, ldo, 0.0f, Tri::None});          // Qg S
    gemm(isa, {n, d_v, n, slot + L.QKM(), C, Delta, d_v, O, ldo, 1.0f, Tri::LowerA});       // + QKM Delta
    gemm(isa, {d_k, d_v, n, slot + L.Ktd(), C, Delta, d_v, S, d_v, std::exp(gC), Tri::None});  // S update
}

// Batched schedule only (pairs < 2 threads): the stage-1 products of a batch, at most
// max(kBatchBytes, one chunk per head) (delta_chunked sizes its batches so).
bool may_batch(int H_v) { return (int64_t)H_v < 2 * (int64_t)n_threads(); }

}  // namespace

// The workspace: the states in natural layout [n_seqs, H_v, d_k, d_v], then the batched
// schedule's stage-1 products (kBatchBytes or one chunk per head of the sequences that can be
// batched: fewer than 2 threads' worth of (sequence, head) pairs).
size_t delta_chunked_workspace_bytes(const GdnShape& shape, int n_seqs, int n_tokens, int chunk_size) {
    ws::Carver w;
    if (n_seqs <= 0 || n_tokens <= 0) return w.bytes();
    w.take<float>((std::size_t)n_seqs * shape.H_v * shape.d_k * shape.d_v);
    if (may_batch(shape.H_v)) {
        const int C = std::max(1, std::min(chunk_size, n_tokens));
        const std::size_t slot = SlotLayout{C, shape.d_k, shape.d_v}.size();
        const int64_t seqs = std::min<int64_t>({n_seqs, n_tokens, (2 * (int64_t)n_threads() - 1) / shape.H_v});
        w.take<float>(std::max(kBatchBytes / sizeof(float), (std::size_t)seqs * shape.H_v * slot));
    }
    return w.bytes();
}

void delta_chunked(Isa isa, const DeltaIo& io, int chunk_size, void* workspace) {
    const int n_seqs = io.n_seqs, H_v = io.shape.H_v, d_k = io.shape.d_k, d_v = io.shape.d_v;
    // A chunk never spans sequences: a chunk size beyond the longest sequence acts as that length.
    int longest = 0, active = 0, max_chunks = 0;
    for (int s = 0; s < n_seqs; ++s) {
        const int len = io.offs[s + 1] - io.offs[s];
        longest = std::max(longest, len);
        active += len > 0;
    }
    if (longest == 0) return;
    const int C = std::min(chunk_size, longest);
    std::vector<int> n_chunks(n_seqs);
    for (int s = 0; s < n_seqs; ++s) {
        n_chunks[s] = (io.offs[s + 1] - io.offs[s] + C - 1) / C;
        max_chunks = std::max(max_chunks, n_chunks[s]);
    }

    // The state of every (sequence, head) in natural layout [d_k, d_v] for the GEMMs, converted
    // once per call (the transposed layout is the decode path's).
    ws::Carver w(workspace);  // in delta_chunked_workspace_bytes' order
    float* S_nat = w.take<float>((std::size_t)n_seqs * H_v * d_k * d_v);
    auto nat = [&](int64_t sh) { return S_nat + (std::size_t)sh * d_k * d_v; };
    auto st = [&](int64_t sh) { return io.state_at(int(sh / H_v), int(sh % H_v)); };
    auto nonempty = [&](int64_t sh) { return io.offs[sh / H_v + 1] > io.offs[sh / H_v]; };
    const SlotLayout L{C, d_k, d_v};
    std::vector<std::unique_ptr<Scratch1>> scratch(n_threads());

    // Variant chosen at launch from the shape and the thread count:
    //  - pipelined, when the (sequence, head) pairs alone keep every thread busy: each pair
    //    runs stage 1 and stage 2 chunk by chunk in one thread, so a chunk's products go from
    //    stage 1 to stage 2 through the core's own cache (one slot, ~147 KiB at C = 64) and
    //    there is a single pool region;
    //  - batched, otherwise (few heads or one long sequence on many threads): stage 1 of a
    //    batch of chunks in parallel over (chunk, head), then stage 2 over (sequence, head).
    // Same arithmetic per chunk either way: the results are bit-identical.
    const int64_t pairs = (int64_t)active * H_v;
    if (pairs >= 2 * (int64_t)n_threads()) {
        std::vector<std::vector<float>> slot_buf(n_threads());
        parallel_for((int64_t)n_seqs * H_v, [&](int64_t sh, int thread) {
            if (!nonempty(sh)) return;
            if (!scratch[thread]) scratch[thread] = std::make_unique<Scratch1>(C);
            std::vector<float>& slot = slot_buf[thread];
            slot.resize(L.size());
            const int s = (int)(sh / H_v), h = (int)(sh % H_v);
            transpose(isa, st(sh), d_k, nat(sh), d_v, d_v, d_k);
            for (int c = 0; c < n_chunks[s]; ++c) {
                const int64_t t0 = io.offs[s] + (int64_t)c * C;
                const Chunk ch{s, t0, (int)std::min<int64_t>(C, io.offs[s + 1] - t0)};
                float gC = 0.0f;
                stage1(isa, io, ch, h, L, slot.data(), &gC, *scratch[thread]);
                stage2(isa, io, ch, h, L, slot.data(), gC, nat(sh));
            }
            transpose(isa, nat(sh), d_v, st(sh), d_k, d_k, d_v);
        });
        return;
    }
    {
        // Chunks per sequence in a batch: as many as the byte budget holds (one per head at least).
        // Each batch costs two pool regions, and a region waits for its slowest thread, so few
        // large batches beat many small ones (on a loaded machine by far).
        const std::size_t slot_bytes = L.size() * sizeof(float), heads = (std::size_t)active * H_v;
        const int fit = (int)std::max<std::size_t>(1, kBatchBytes / (heads * slot_bytes));
        const int per_batch = std::max(1, std::min(fit, max_chunks));
        float* slots = w.take<float>(heads * per_batch * L.size());  // [item, H_v, slot]
        std::vector<float> gC(heads * per_batch);                               // [item, H_v]

        parallel_for((int64_t)n_seqs * H_v, [&](int64_t sh, int) {
            if (nonempty(sh)) transpose(isa, st(sh), d_k, nat(sh), d_v, d_v, d_k);
        });
        std::vector<Chunk> items;
        std::vector<int> first_item(n_seqs + 1);
        for (int b0 = 0; b0 < max_chunks; b0 += per_batch) {
            items.clear();
            for (int s = 0; s < n_seqs; ++s) {
                first_item[s] = (int)items.size();
                for (int c = b0; c < std::min(b0 + per_batch, n_chunks[s]); ++c) {
                    const int64_t t0 = io.offs[s] + (int64_t)c * C;
                    items.push_back({s, t0, (int)std::min<int64_t>(C, io.offs[s + 1] - t0)});
                }
            }
            first_item[n_seqs] = (int)items.size();
            parallel_for((int64_t)items.size() * H_v, [&](int64_t slot, int thread) {
                if (!scratch[thread]) scratch[thread] = std::make_unique<Scratch1>(C);
                stage1(isa, io, items[slot / H_v], (int)(slot % H_v), L, slots + slot * L.size(), &gC[slot],
                       *scratch[thread]);
            });
            parallel_for((int64_t)n_seqs * H_v, [&](int64_t sh, int) {
                const int s = (int)(sh / H_v), h = (int)(sh % H_v);
                for (int it = first_item[s]; it < first_item[s + 1]; ++it) {
                    const int64_t slot = (int64_t)it * H_v + h;
                    stage2(isa, io, items[it], h, L, slots + slot * L.size(), gC[slot], nat(sh));
                }
            });
        }
        parallel_for((int64_t)n_seqs * H_v, [&](int64_t sh, int) {
            if (nonempty(sh)) transpose(isa, nat(sh), d_v, st(sh), d_k, d_k, d_v);
        });
    }
}

}  // namespace gdn

void gdn_delta_chunked(Isa isa, const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size) {
    const char* op = "cpu::gdn_delta_chunked";
    gdn::check_isa(isa, op);
    gdn::check_delta_args(shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out, op);
    if (chunk_size < 1)
        throw Error(std::string(op) + ": chunk_size=" + std::to_string(chunk_size) + " must be >= 1");
    ScratchBuffer w;  // the call's own workspace (tests, test-ops)
    const int n_tokens = n_seqs > 0 ? seq_offsets[n_seqs] - seq_offsets[0] : 0;
    gdn::delta_chunked(isa, gdn::dense_io(shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out), chunk_size,
                       w.get(gdn::delta_chunked_workspace_bytes(shape, n_seqs, n_tokens, chunk_size)));
}

void gdn_delta_chunked(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size) {
    gdn_delta_chunked(active_isa(), shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out, chunk_size);
}

}  // namespace alloy::cpu
