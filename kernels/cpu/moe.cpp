#include "kernels/cpu/moe.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_kquant.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/workspace.h"
#include "kernels/ref/activations.h"

namespace alloy::cpu {

namespace {

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

// The workspace (kernels/cpu/workspace.h; before: the calling thread's MoeScratch, grown only):
// routing, the counting sort, the shared expert's rows, every pair's expert output, then per
// pool thread the rows of the expert it runs and a matmul workspace (thread 0's also serves the
// router and the shared expert).
struct MoeLayout {
    float *logits, *wt;
    int32_t *ids, *count, *next, *tok, *slot, *pos, *active;
    float *sg, *sy, *sh, *su;  // shared expert: gate [T], output [T, D], act and up [T, Is]
    float* yp;                 // [T k, D]: pair at(e) + r's expert output (pairs in expert order)
    struct PerThread {
        float *xe, *h, *u;  // the expert's gathered rows [n, D], act and up [n, I]
        void* mm;
    };
    // Pool thread t's section: per_thread bytes at per_base + t per_thread (no allocation a call:
    // a decode step runs this once a layer).
    uint8_t* per_base;
    size_t per_thread, t_d, t_i;  // the section's bytes, and the byte sizes of xe and of h (= of u)
    PerThread th(int t) const {
        uint8_t* b = per_base + size_t(t) * per_thread;
        return {reinterpret_cast<float*>(b), reinterpret_cast<float*>(b + t_d), reinterpret_cast<float*>(b + t_d + t_i),
                b + t_d + 2 * t_i};
    }
    size_t bytes;
};
MoeLayout moe_layout(const ref::MoeWeights& w, int64_t T, Isa isa, void* workspace) {
    const size_t D = size_t(w.n_embd()), I = size_t(w.gate.rows), E = size_t(w.n_expert), t = size_t(T);
    const size_t pairs = t * size_t(w.n_used), Is = w.has_shared() ? size_t(w.shexp_gate.n_out) : 0;
    ws::Carver c(workspace);
    MoeLayout L;
    L.logits = c.take<float>(t * E);
    L.wt = c.take<float>(pairs);
    L.ids = c.take<int32_t>(pairs);
    L.count = c.take<int32_t>(E + 1);
    L.next = c.take<int32_t>(E);
    L.tok = c.take<int32_t>(pairs);
    L.slot = c.take<int32_t>(pairs);
    L.pos = c.take<int32_t>(pairs);
    L.active = c.take<int32_t>(E);
    L.sg = c.take<float>(w.has_shared() ? t : 0);
    L.sy = c.take<float>(w.has_shared() ? t * D : 0);
    L.sh = c.take<float>(t * Is);
    L.su = c.take<float>(t * Is);
    L.yp = c.take<float>(pairs * D);
    // Every product's count holds for calls of up to T tokens (an expert gets at most T).
    size_t mm = matmul_workspace_bytes(w.router, T, isa);
    if (w.has_shared()) {
        mm = std::max(mm, matmul_workspace_bytes(w.shexp_router, T, isa));
        mm = std::max(mm, matmul_swiglu_workspace_bytes(w.shexp_gate, w.shexp_up, T, isa));
        mm = std::max(mm, matmul_workspace_bytes(w.shexp_down, T, isa));
    }
    if (w.n_expert > 0) {
        mm = std::max(mm, matmul_swiglu_workspace_bytes(w.gate.at(0), w.up.at(0), T, isa));  // every expert's shape
        mm = std::max(mm, matmul_workspace_bytes(w.down.at(0), T, isa));
    }
    L.t_d = ws::up(t * D * sizeof(float));
    L.t_i = ws::up(t * I * sizeof(float));
    L.per_thread = ws::up(L.t_d + 2 * L.t_i + mm);
    L.per_base = c.take<uint8_t>(L.per_thread * size_t(n_threads()));
    L.bytes = c.bytes();
    return L;
}

// Rows per product call for an expert of n tokens. K-quant experts with 17..32 tokens run as
// calls of at most 16 (the few-token GEMVs: the batch-invariant bits, and repacked rows read in
// place) instead of the GEMM tiles, which pay whole 16-token tiles and first unpack repacked
// rows: 64 repacked 512 x 2048 Q4_K experts (2 threads, one expert a thread, Xeon, session 51)
// took 5.9 ms at 16 tokens each by GEMV against 11.2 ms at 17 by tiles (11.6 at 32, 15.7 at 48:
// the tiles win from ~33); 35B-A3B pp512 +11%. By type, not layout, so that repacked and GGUF
// rows give the same bits. Otherwise one call.
int64_t expert_step(const ref::MoeWeights& w, int64_t n) {
    const bool few_token_gemv = mm::uses_q8k(w.gate.all.type) && mm::uses_q8k(w.up.all.type);
    return few_token_gemv && n > mm::kGemvMaxTokens && n <= 2 * mm::kGemvMaxTokens ? int64_t(mm::kGemvMaxTokens)
                                                                                    : std::max<int64_t>(n, 1);
}

}  // namespace

size_t moe_ffn_workspace_bytes(const ref::MoeWeights& w, int64_t T, Isa isa) {
    return T > 0 ? moe_layout(w, T, isa, nullptr).bytes : 0;
}

void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T, Isa isa, void* workspace) {
    ref::check_moe_weights(w, "cpu::moe_ffn");
    if (T <= 0) return;
    const MoeLayout s = moe_layout(w, T, isa, workspace);
    const int64_t D = w.n_embd();
    const int E = w.n_expert, k = w.n_used;
    const int64_t n_pairs = T * k, I = w.gate.rows;

    // Routing.
    float* logits = s.logits;
    float* wt = s.wt;
    matmul(w.router, x, logits, T, isa, s.th(0).mm);
    ref::moe_route(logits, T, E, k, s.ids, wt);

    // Counting sort of the (token, rank) pairs by expert: expert e owns entries
    // [count[e], count[e + 1]) of tok (its tokens, increasing) and slot (their pair index).
    std::fill(s.count, s.count + E + 1, 0);
    for (int64_t p = 0; p < n_pairs; ++p) ++s.count[s.ids[p] + 1];
    for (int e = 0; e < E; ++e) s.count[e + 1] += s.count[e];
    std::copy(s.count, s.count + E, s.next);  // next free entry of each expert
    for (int64_t p = 0; p < n_pairs; ++p) {
        const int32_t at = s.next[s.ids[p]]++;
        s.tok[at] = int32_t(p / k);
        s.slot[at] = int32_t(p);
    }

    // The shared expert and its gate over all tokens first; y starts as zero.
    float *sg = nullptr, *sy = nullptr;
    if (w.has_shared()) {
        sg = s.sg;
        sy = s.sy;
        matmul(w.shexp_router, x, sg, T, isa, s.th(0).mm);
        matmul_swiglu(w.shexp_gate, w.shexp_up, x, s.sh, s.su, T, isa, s.th(0).mm);
        matmul(w.shexp_down, s.sh, sy, T, isa, s.th(0).mm);
    }
    std::fill(y, y + T * D, 0.0f);

    // Each chosen expert on one pool thread (experts handed out in increasing id by the pool's
    // counter): its rows gathered, the three products inline on that thread (a parallel_for
    // inside an item runs inline), the output into its pairs' rows of yp. One pool region a call
    // instead of three or four an expert (256 experts of ~16 tokens in a 512-token prefill of
    // 35B-A3B; a decode step's 8 experts on 2 threads). Each product computes every row as it
    // would on the whole pool, so the bits do not depend on which thread ran it.
    // Where the experts are fewer than twice the threads (a decode step's 8 on a many-core host),
    // one expert at a time over the whole pool instead, so that no thread idles: the same
    // products, so the same bits.
    int n_active = 0;
    for (int e = w.expert_begin; e < w.expert_end(); ++e)  // the experts held here (expert parallelism: a part)
        if (s.count[e + 1] > s.count[e]) s.active[n_active++] = e;
    const auto run_expert = [&](int64_t a, int thread) {
        const MoeLayout::PerThread pt = s.th(thread);
        const int e = s.active[a], l = e - w.expert_begin;
        const int64_t r0 = s.count[e], n = s.count[e + 1] - r0;
        for (int64_t r = 0; r < n; ++r) {
            const float* src = x + int64_t(s.tok[r0 + r]) * D;
            std::copy(src, src + D, pt.xe + r * D);
        }
        // Products in calls of at most `step` rows: see expert_step.
        const int64_t step = expert_step(w, n);
        for (int64_t q = 0; q < n; q += step) {
            const int64_t m = std::min(step, n - q);
            matmul_swiglu(w.gate.at(l), w.up.at(l), pt.xe + q * D, pt.h + q * I, pt.u + q * I, m, isa, pt.mm);
            matmul(w.down.at(l), pt.h + q * I, s.yp + (r0 + q) * D, m, isa, pt.mm);
        }
    };
    if (n_active >= 2 * n_threads()) {
        parallel_for(n_active, run_expert);
    } else {
        for (int a = 0; a < n_active; ++a) run_expert(a, 0);
    }

    // Each token adds its experts' outputs in increasing expert id (as transformers sums them,
    // index_add_ per expert): its pairs' positions in expert order, ascending.
    for (int64_t at = 0; at < n_pairs; ++at) s.pos[s.slot[at]] = int32_t(at);
    for_rows(T, D * k, [&](int64_t t) {
        thread_local std::vector<int32_t> at;
        at.assign(s.pos + t * k, s.pos + (t + 1) * k);
        std::sort(at.begin(), at.end());
        float* dst = y + t * D;
        for (int j = 0; j < k; ++j) {
            const int32_t p = s.slot[at[j]];
            if (s.ids[p] < w.expert_begin || s.ids[p] >= w.expert_end()) continue;  // held elsewhere: nothing here
            const float c = wt[p];
            const float* src = s.yp + int64_t(at[j]) * D;
            for (int64_t d = 0; d < D; ++d) dst[d] += c * src[d];
        }
    });

    // + sigmoid(g) * shared, after the experts (transformers' order).
    if (sy)
        for_rows(T, D, [&](int64_t t) {
            const float c = ref::sigmoid(sg[t]);
            const float* st = sy + t * D;
            float* yt = y + t * D;
            for (int64_t d = 0; d < D; ++d) yt[d] += c * st[d];
        });
}

// Without a workspace (tests, test-ops): one of the call's own.
void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T, Isa isa) {
    ref::check_moe_weights(w, "cpu::moe_ffn");  // before the count reads the shapes
    ScratchBuffer ws;
    moe_ffn(w, x, y, T, isa, ws.get(moe_ffn_workspace_bytes(w, T, isa)));
}

void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T) { moe_ffn(w, x, y, T, active_isa()); }

}  // namespace alloy::cpu
