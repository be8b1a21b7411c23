#include "kernels/cpu/moe.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/activations.h"

namespace alloy::cpu {

namespace {

// Buffers of the calling thread, kept across calls (they only grow).
struct MoeScratch {
    MatmulScratch mm;
    std::vector<float> logits, wt, xs, h, u, ys, shared_g, shared_h, shared_u, shared_y;
    std::vector<int32_t> ids, pos, count;
};

float* grow(std::vector<float>& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
}

}  // namespace

void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T, Isa isa) {
    ref::check_moe_weights(w, "cpu::moe_ffn");
    if (T <= 0) return;
    thread_local MoeScratch s;
    const int64_t D = w.n_embd(), I = w.gate.rows;
    const int E = w.n_expert, k = w.n_used;
    const int64_t n_pairs = T * k;

    // Routing.
    float* logits = grow(s.logits, T * E);
    float* wt = grow(s.wt, n_pairs);
    s.ids.resize(size_t(n_pairs));
    matmul(w.router, x, logits, T, isa, s.mm);
    ref::moe_route(logits, T, E, k, s.ids.data(), wt);

    // Counting sort of the (token, rank) pairs by expert: pair p = t * k + i lands at row
    // pos[p] of the expert-ordered buffers, expert e owning rows [off[e], off[e + 1]), its
    // tokens in increasing order.
    s.count.assign(size_t(E) + 1, 0);
    for (int64_t p = 0; p < n_pairs; ++p) ++s.count[size_t(s.ids[size_t(p)]) + 1];
    for (int e = 0; e < E; ++e) s.count[size_t(e) + 1] += s.count[size_t(e)];
    const std::vector<int32_t> off = s.count;
    s.pos.resize(size_t(n_pairs));
    {
        std::vector<int32_t> next(off.begin(), off.end() - 1);
        for (int64_t p = 0; p < n_pairs; ++p) s.pos[size_t(p)] = next[size_t(s.ids[size_t(p)])]++;
    }
    // (The pool's threads see their own thread_local scratch: the lambdas below take plain
    // pointers to the calling thread's.)
    const int32_t* pos = s.pos.data();
    float* xs = grow(s.xs, n_pairs * D);  // token rows, expert-ordered
    parallel_for(n_pairs, [&](int64_t p, int) {
        const float* src = x + (p / k) * D;
        std::copy(src, src + D, xs + int64_t(pos[p]) * D);
    });

    // Each chosen expert over its tokens.
    float* h = grow(s.h, n_pairs * I);
    float* u = grow(s.u, n_pairs * I);
    float* ys = grow(s.ys, n_pairs * D);
    for (int e = 0; e < E; ++e) {
        const int64_t r0 = off[size_t(e)], n = off[size_t(e) + 1] - r0;
        if (n == 0) continue;
        matmul_swiglu(w.gate.at(e), w.up.at(e), xs + r0 * D, h + r0 * I, u + r0 * I, n, isa, s.mm);
        matmul(w.down.at(e), h + r0 * I, ys + r0 * D, n, isa, s.mm);
    }

    // The shared expert and its gate over all tokens.
    float *sg = nullptr, *sy = nullptr;
    if (w.has_shared()) {
        const int64_t Is = w.shexp_gate.n_out;
        sg = grow(s.shared_g, T);
        sy = grow(s.shared_y, T * D);
        matmul(w.shexp_router, x, sg, T, isa, s.mm);
        float* sh = grow(s.shared_h, T * Is);
        matmul_swiglu(w.shexp_gate, w.shexp_up, x, sh, grow(s.shared_u, T * Is), T, isa, s.mm);
        matmul(w.shexp_down, sh, sy, T, isa, s.mm);
    }

    // y[t] = sum over ranks of w * expert output, then + sigmoid(g) * shared.
    parallel_for(T, [&](int64_t t, int) {
        float* yt = y + t * D;
        std::fill(yt, yt + D, 0.0f);
        for (int i = 0; i < k; ++i) {
            const float c = wt[t * k + i];
            const float* e_out = ys + int64_t(pos[t * k + i]) * D;
            for (int64_t d = 0; d < D; ++d) yt[d] += c * e_out[d];
        }
        if (sy) {
            const float c = ref::sigmoid(sg[t]);
            const float* st = sy + t * D;
            for (int64_t d = 0; d < D; ++d) yt[d] += c * st[d];
        }
    });
}

void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T) { moe_ffn(w, x, y, T, active_isa()); }

}  // namespace alloy::cpu
