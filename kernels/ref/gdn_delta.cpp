// Gated delta rule core, reference versions: the recurrence (serial) and the chunked form.
// Math: spec/GDN.md sections 1 (recurrence), 2 (chunked), 3 (numerics), 4 (inverse).
// Contract and layouts: kernels/ref/gdn.h. All math in fp32.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/ref/gdn.h"
#include "kernels/ref/gdn_common.h"

namespace alloy::ref {

using detail::axpy;
using detail::dot;

namespace {

void check_delta_args(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                      const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out, const char* op) {
    detail::check_shape(shape, op);
    detail::check_seq_offsets(n_seqs, seq_offsets, op);
    if (n_seqs > 0) detail::check_ptr(state, op, "state");
    if (n_seqs > 0 && seq_offsets[n_seqs] > seq_offsets[0]) {
        detail::check_ptr(q, op, "q");
        detail::check_ptr(k, op, "k");
        detail::check_ptr(v, op, "v");
        detail::check_ptr(g, op, "g");
        detail::check_ptr(beta, op, "beta");
        detail::check_ptr(out, op, "out");
    }
}

}  // namespace

void gdn_delta_serial(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                      const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out) {
    check_delta_args(shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out, "gdn_delta_serial");
    const int H_k = shape.H_k, H_v = shape.H_v, d_k = shape.d_k, d_v = shape.d_v;

    // One independent recurrence per (sequence, value head).
    const double work = 3.0 * (seq_offsets[n_seqs] - seq_offsets[0]) * H_v * d_k * d_v;
#pragma omp parallel for schedule(dynamic) if (work >= detail::kMinParallelWork)
    for (int sh = 0; sh < n_seqs * H_v; ++sh) {
        const int seq = sh / H_v, h = sh % H_v, kh = shape.key_head(h);
        float* S = state + (std::size_t)sh * d_v * d_k;  // [d_v, d_k]: row j = column j of S
        for (int t = seq_offsets[seq]; t < seq_offsets[seq + 1]; ++t) {
            const float* q_t = q + ((std::size_t)t * H_k + kh) * d_k;  // [d_k]
            const float* k_t = k + ((std::size_t)t * H_k + kh) * d_k;  // [d_k]
            const float* v_t = v + ((std::size_t)t * H_v + h) * d_v;   // [d_v]
            float* o_t = out + ((std::size_t)t * H_v + h) * d_v;       // [d_v]
            const float alpha = std::exp(g[(std::size_t)t * H_v + h]);  // g <= 0: alpha in (0, 1]
            const float b = beta[(std::size_t)t * H_v + h];
            // Columns of S are independent: decay, delta, rank-1 write and read per column j.
            for (int j = 0; j < d_v; ++j) {
                float* col = S + (std::size_t)j * d_k;                     // S[:, j], [d_k]
                const float delta = b * (v_t[j] - alpha * dot(col, k_t, d_k));  // uses decayed S
                for (int i = 0; i < d_k; ++i) col[i] = alpha * col[i] + k_t[i] * delta;
                o_t[j] = dot(col, q_t, d_k);  // read after the write
            }
        }
    }
}

void gdn_tri_inverse(int n, const float* A, float* T, TriInverse inverse) {
    if (n <= 0) return;
    const std::size_t nn = (std::size_t)n * n;
    if (inverse == TriInverse::Substitution) {
        // T[r][:] = e_r - sum_{s<r} A[r][s] T[s][:]; row s of T is zero beyond column s.
        for (int r = 0; r < n; ++r) {
            float* Tr = T + (std::size_t)r * n;
            for (int c = 0; c < n; ++c) Tr[c] = 0.0f;
            for (int s = 0; s < r; ++s) axpy(Tr, -A[(std::size_t)r * n + s], T + (std::size_t)s * n, s + 1);
            Tr[r] = 1.0f;
        }
        return;
    }
    // Squaring: N = -A (strictly lower, so N^n = 0) and (I + A)^-1 = sum_{i<n} N^i
    // = prod_{m<L} (I + N^(2^m)) with 2^L >= n. P accumulates the product, Q = N^(2^m).
    std::vector<float> Q(nn, 0.0f), tmp(nn);
    for (int r = 0; r < n; ++r)
        for (int s = 0; s < r; ++s) Q[(std::size_t)r * n + s] = -A[(std::size_t)r * n + s];
    for (std::size_t i = 0; i < nn; ++i) T[i] = Q[i];
    for (int r = 0; r < n; ++r) T[(std::size_t)r * n + r] = 1.0f;  // P = I + N
    // Z = X Y for lower-triangular X, Y ([n, n]): Z[r][c] = sum_{c <= s <= r} X[r][s] Y[s][c];
    // the skipped terms are exact zeros, so this is the dense product with 1/6 of the FMAs.
    auto matmul = [n](const float* X, const float* Y, float* Z) {
        for (int r = 0; r < n; ++r) {
            float* Zr = Z + (std::size_t)r * n;
            for (int c = 0; c < n; ++c) Zr[c] = 0.0f;
            for (int s = 0; s <= r; ++s) axpy(Zr, X[(std::size_t)r * n + s], Y + (std::size_t)s * n, s + 1);
        }
    };
    for (int span = 2; span < n; span *= 2) {  // factors 2..L: L = ceil(log2 n)
        matmul(Q.data(), Q.data(), tmp.data());
        Q.swap(tmp);                            // Q <- Q^2
        matmul(T, Q.data(), tmp.data());
        for (std::size_t i = 0; i < nn; ++i) T[i] += tmp[i];  // P <- P (I + Q)
    }
}

void gdn_delta_chunked(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size) {
    gdn_delta_chunked(shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out, chunk_size,
                      TriInverse::Substitution);
}

// Tail chunks are NOT padded: a chunk of a sequence covers its real n <= C tokens and every
// matrix below is n x n / n x d (padding with beta = 0, g = 0 would give the same numbers).
void gdn_delta_chunked(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size,
                       TriInverse inverse) {
    check_delta_args(shape, n_seqs, seq_offsets, q, k, v, g, beta, state, out, "gdn_delta_chunked");
    if (chunk_size < 1)
        throw Error("gdn_delta_chunked: chunk_size=" + std::to_string(chunk_size) + " must be >= 1");
    const int H_k = shape.H_k, H_v = shape.H_v, d_k = shape.d_k, d_v = shape.d_v;
    // A chunk never spans sequences, so a chunk size beyond the longest sequence acts as that
    // length (and must not size the buffers below).
    int longest = 1;
    for (int s = 0; s < n_seqs; ++s) longest = std::max(longest, seq_offsets[s + 1] - seq_offsets[s]);
    const int C = std::min(chunk_size, longest);

    // Chunks of all sequences, in order; a sequence's chunks are contiguous in this list.
    struct Chunk { int seq, t0, n; };
    std::vector<Chunk> chunks;
    std::vector<int> first_chunk(n_seqs + 1);
    for (int s = 0; s < n_seqs; ++s) {
        first_chunk[s] = (int)chunks.size();
        for (int t0 = seq_offsets[s]; t0 < seq_offsets[s + 1]; t0 += C)
            chunks.push_back({s, t0, std::min(C, seq_offsets[s + 1] - t0)});
    }
    first_chunk[n_seqs] = (int)chunks.size();
    const int n_slots = (int)chunks.size() * H_v;  // one slot per (chunk, value head)

    // Stage-1 products per slot (rows beyond the chunk's n are unused); all slots are kept,
    // (2d + C + 1) floats per token and head, ~1.3 KB at d = 128, C = 64:
    std::vector<float> U((std::size_t)n_slots * C * d_v);  // [slot, C, d_v]  T (beta V)
    std::vector<float> W((std::size_t)n_slots * C * d_k);  // [slot, C, d_k]  T (beta e^G K)
    std::vector<float> QKM((std::size_t)n_slots * C * C);  // [slot, C, C]    (Q K^T) .* M
    std::vector<float> G((std::size_t)n_slots * C);        // [slot, C]       cumulative log decay

    // Stage 1: everything that does not depend on the state, independent per slot.
    const double work = 3.0 * (seq_offsets[n_seqs] - seq_offsets[0]) * H_v * (C + d_k) * d_v;
#pragma omp parallel if (work >= detail::kMinParallelWork)
    {
        std::vector<float> A((std::size_t)C * C), Tinv((std::size_t)C * C);  // [n, n] each
        std::vector<float> bk((std::size_t)C * d_k), bv((std::size_t)C * d_v);
#pragma omp for schedule(dynamic)
        for (int slot = 0; slot < n_slots; ++slot) {
            const Chunk ch = chunks[slot / H_v];
            const int h = slot % H_v, kh = shape.key_head(h), n = ch.n;
            auto q_r = [&](int r) { return q + ((std::size_t)(ch.t0 + r) * H_k + kh) * d_k; };
            auto k_r = [&](int r) { return k + ((std::size_t)(ch.t0 + r) * H_k + kh) * d_k; };
            auto v_r = [&](int r) { return v + ((std::size_t)(ch.t0 + r) * H_v + h) * d_v; };
            auto at = [&](const float* x, int r) { return x[(std::size_t)(ch.t0 + r) * H_v + h]; };
            float* Gs = G.data() + (std::size_t)slot * C;
            float* Us = U.data() + (std::size_t)slot * C * d_v;
            float* Ws = W.data() + (std::size_t)slot * C * d_k;
            float* Ms = QKM.data() + (std::size_t)slot * C * C;

            // G_r = sum_{s<=r} g_s, restarting at the chunk start. Non-increasing.
            float acc = 0.0f;
            for (int r = 0; r < n; ++r) Gs[r] = acc += at(g, r);

            // A[r][s] = beta_r (k_r . k_s) exp(G_r - G_s), s < r: exponent <= 0 (section 3).
            for (int r = 0; r < n; ++r)
                for (int s = 0; s < n; ++s)
                    A[(std::size_t)r * n + s] =
                        s < r ? at(beta, r) * dot(k_r(r), k_r(s), d_k) * std::exp(Gs[r] - Gs[s]) : 0.0f;
            gdn_tri_inverse(n, A.data(), Tinv.data(), inverse);  // [n, n] unit lower

            // Right-hand sides: rows beta_s v_s and beta_s e^{G_s} k_s (e^{G_s} <= 1).
            for (int s = 0; s < n; ++s) {
                const float b = at(beta, s), be = b * std::exp(Gs[s]);
                for (int j = 0; j < d_v; ++j) bv[(std::size_t)s * d_v + j] = b * v_r(s)[j];
                for (int i = 0; i < d_k; ++i) bk[(std::size_t)s * d_k + i] = be * k_r(s)[i];
            }
            // U = T (beta V), W = T (beta e^G K); T lower triangular: s <= r only.
            for (int r = 0; r < n; ++r) {
                float* Ur = Us + (std::size_t)r * d_v;
                float* Wr = Ws + (std::size_t)r * d_k;
                for (int j = 0; j < d_v; ++j) Ur[j] = 0.0f;
                for (int i = 0; i < d_k; ++i) Wr[i] = 0.0f;
                for (int s = 0; s <= r; ++s) {
                    const float t = Tinv[(std::size_t)r * n + s];
                    axpy(Ur, t, bv.data() + (std::size_t)s * d_v, d_v);
                    axpy(Wr, t, bk.data() + (std::size_t)s * d_k, d_k);
                }
            }
            // (Q K^T) .* M, M[r][s] = exp(G_r - G_s) for s <= r (diagonal 1), 0 above.
            for (int r = 0; r < n; ++r)
                for (int s = 0; s < n; ++s)
                    Ms[(std::size_t)r * C + s] =
                        s <= r ? dot(q_r(r), k_r(s), d_k) * std::exp(Gs[r] - Gs[s]) : 0.0f;
        }
    }

    // Stage 2: scan over the chunks of each sequence, one (sequence, head) per task. Every
    // column j of S evolves independently given the stage-1 products, so the chunk step is
    // written per column (a contiguous d_k row of the transposed state).
#pragma omp parallel if (work >= detail::kMinParallelWork)
    {
        std::vector<float> delta(C), o(C);  // [n] for one column j
        std::vector<float> eG(C), eGC(C);    // [n] e^{G_r} and e^{G_C - G_r}, both <= 1
#pragma omp for schedule(dynamic)
        for (int sh = 0; sh < n_seqs * H_v; ++sh) {
            const int seq = sh / H_v, h = sh % H_v, kh = shape.key_head(h);
            float* S = state + (std::size_t)sh * d_v * d_k;  // [d_v, d_k]
            for (int c = first_chunk[seq]; c < first_chunk[seq + 1]; ++c) {
                const Chunk ch = chunks[c];
                const int n = ch.n;
                const std::size_t slot = (std::size_t)c * H_v + h;
                const float* Gs = G.data() + slot * C;
                const float* Us = U.data() + slot * C * d_v;
                const float* Ws = W.data() + slot * C * d_k;
                const float* Ms = QKM.data() + slot * C * C;
                const float decay_chunk = std::exp(Gs[n - 1]);  // e^{G_C}
                for (int r = 0; r < n; ++r) {
                    eG[r] = std::exp(Gs[r]);
                    eGC[r] = std::exp(Gs[n - 1] - Gs[r]);
                }
                for (int j = 0; j < d_v; ++j) {
                    float* col = S + (std::size_t)j * d_k;  // S0[:, j], [d_k]
                    for (int r = 0; r < n; ++r) {
                        const float* q_r = q + ((std::size_t)(ch.t0 + r) * H_k + kh) * d_k;
                        delta[r] = Us[(std::size_t)r * d_v + j] - dot(Ws + (std::size_t)r * d_k, col, d_k);
                        o[r] = eG[r] * dot(q_r, col, d_k);  // (Q e^G) S0
                    }
                    for (int r = 0; r < n; ++r) {
                        float acc = o[r];
                        for (int s = 0; s <= r; ++s) acc += Ms[(std::size_t)r * C + s] * delta[s];
                        out[((std::size_t)(ch.t0 + r) * H_v + h) * d_v + j] = acc;
                    }
                    // S = e^{G_C} S0 + (K e^{G_C - G})^T Delta
                    for (int i = 0; i < d_k; ++i) col[i] *= decay_chunk;
                    for (int r = 0; r < n; ++r) {
                        const float* k_r = k + ((std::size_t)(ch.t0 + r) * H_k + kh) * d_k;
                        axpy(col, delta[r] * eGC[r], k_r, d_k);
                    }
                }
            }
        }
    }
}

}  // namespace alloy::ref
