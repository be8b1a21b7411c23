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
    std::vector<float> logits, wt, xe, h, u, ye, shared_g, shared_h, shared_u, shared_y;
    std::vector<int32_t> ids, count, next, tok, slot;
};

// fn(r) for rows [0, n) of `width` floats each: on the pool when there is enough of it, else
// inline (a decode step's one row is cheaper to copy than a pool region is to start).
template <class Fn>
void for_rows(int64_t n, int64_t width, const Fn& fn) {
    if (n * width < (int64_t(1) << 15)) {
        for (int64_t r = 0; r < n; ++r) fn(r);
    } else {
        parallel_for(n, [&](int64_t r, int) { fn(r); });
    }
}

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

    // Counting sort of the (token, rank) pairs by expert: expert e owns entries
    // [count[e], count[e + 1]) of tok (its tokens, increasing) and slot (their pair index).
    s.count.assign(size_t(E) + 1, 0);
    for (int64_t p = 0; p < n_pairs; ++p) ++s.count[size_t(s.ids[size_t(p)]) + 1];
    for (int e = 0; e < E; ++e) s.count[size_t(e) + 1] += s.count[size_t(e)];
    s.tok.resize(size_t(n_pairs));
    s.slot.resize(size_t(n_pairs));
    s.next.assign(s.count.begin(), s.count.end() - 1);  // next free entry of each expert
    for (int64_t p = 0; p < n_pairs; ++p) {
        const int32_t at = s.next[size_t(s.ids[size_t(p)])]++;
        s.tok[size_t(at)] = int32_t(p / k);
        s.slot[size_t(at)] = int32_t(p);
    }

    // The shared expert and its gate over all tokens first; y starts as zero.
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
    std::fill(y, y + T * D, 0.0f);

    // Each chosen expert, in increasing id, over its tokens (at most T): gather their rows, the
    // three products, then add w * output into each token's row. A token's experts are thus
    // summed in increasing id whatever the call, as transformers sums them (index_add_ per
    // expert). The pool's threads see their own thread_local scratch, so the lambdas take
    // plain pointers to the calling thread's.
    const int32_t* tok = s.tok.data();
    const int32_t* slot = s.slot.data();
    float* xe = grow(s.xe, T * D);
    float* h = grow(s.h, T * I);
    float* u = grow(s.u, T * I);
    float* ye = grow(s.ye, T * D);
    for (int e = 0; e < E; ++e) {
        const int64_t r0 = s.count[size_t(e)], n = s.count[size_t(e) + 1] - r0;
        if (n == 0) continue;
        for_rows(n, D, [&](int64_t r) {
            const float* src = x + int64_t(tok[r0 + r]) * D;
            std::copy(src, src + D, xe + r * D);
        });
        matmul_swiglu(w.gate.at(e), w.up.at(e), xe, h, u, n, isa, s.mm);
        matmul(w.down.at(e), h, ye, n, isa, s.mm);
        for_rows(n, D, [&](int64_t r) {
            const float c = wt[slot[r0 + r]];
            const float* src = ye + r * D;
            float* dst = y + int64_t(tok[r0 + r]) * D;
            for (int64_t d = 0; d < D; ++d) dst[d] += c * src[d];
        });
    }

    // + sigmoid(g) * shared, after the experts (transformers' order).
    if (sy)
        for_rows(T, D, [&](int64_t t) {
            const float c = ref::sigmoid(sg[t]);
            const float* st = sy + t * D;
            float* yt = y + t * D;
            for (int64_t d = 0; d < D; ++d) yt[d] += c * st[d];
        });
}

void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T) { moe_ffn(w, x, y, T, active_isa()); }

}  // namespace alloy::cpu
