#include "kernels/ref/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "kernels/ref/activations.h"
#include "kernels/ref/matmul.h"

namespace alloy::ref {

namespace {

// The message is built only on failure: cpu::moe_ffn checks its weights on every call.
template <class Msg>
void require(bool ok, const char* op, const Msg& what) {
    if (!ok) throw Error(std::string(op) + ": " + what());
}

std::string dims(const WeightView& w) {
    std::string s = "[";
    s += std::to_string(w.n_out);
    s += ", ";
    s += std::to_string(w.n_in);
    s += "]";
    return s;
}

// down(silu(gate x) * up x) for T rows of x.
void swiglu_mlp(const WeightView& gate, const WeightView& up, const WeightView& down, const float* x, float* y,
                int64_t T) {
    std::vector<float> g(size_t(T * gate.n_out)), u(size_t(T * up.n_out));
    matmul(gate, x, g.data(), T);
    matmul(up, x, u.data(), T);
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
    matmul(down, g.data(), y, T);
}

}  // namespace

void check_moe_weights(const MoeWeights& w, const char* op) {
    const int64_t D = w.router.n_in, I = w.gate.rows;
    auto n = [](int64_t v) { return std::to_string(v); };
    require(w.expert_begin >= 0 && w.expert_count >= 0 && w.expert_end() <= w.n_expert, op, [&] {
        return "held experts [" + n(w.expert_begin) + ", " + n(w.expert_end()) + ") not within the " + n(w.n_expert);
    });
    const int64_t E = w.n_local();  // the experts the tensors hold
    require(E > 0 && w.router.n_out == w.n_expert, op,
            [&] { return "router (ffn_gate_inp) has " + n(w.router.n_out) + " rows for " + n(w.n_expert) + " experts"; });
    require(w.n_used > 0 && w.n_used <= w.n_expert, op,
            [&] { return "experts per token " + n(w.n_used) + " not in [1, " + n(w.n_expert) + "]"; });
    require(I > 0 && w.up.rows == I && w.down.all.n_in == I, op, [&] {
        return "expert widths differ: gate " + n(I) + ", up " + n(w.up.rows) + ", down input " + n(w.down.all.n_in);
    });
    for (const ExpertMatrix* m : {&w.gate, &w.up})
        require(m->all.n_in == D && m->all.n_out >= (E - 1) * m->stride + m->offset + m->rows, op, [&] {
            return "expert gate/up tensor " + dims(m->all) + " does not hold " + n(E) + " experts of [" + n(I) + ", " +
                   n(D) + "]";
        });
    require(w.down.rows == D && w.down.all.n_out >= (E - 1) * w.down.stride + w.down.offset + D, op, [&] {
        return "expert down tensor " + dims(w.down.all) + " does not hold " + n(E) + " experts of [" + n(D) + ", " +
               n(I) + "]";
    });
    if (w.has_shared()) {
        const int64_t Is = w.shexp_gate.n_out;
        require(w.shexp_gate.n_in == D && w.shexp_up.n_in == D && w.shexp_up.n_out == Is && w.shexp_down.n_in == Is &&
                    w.shexp_down.n_out == D,
                op, [&] {
                    return "shared expert shapes gate " + dims(w.shexp_gate) + ", up " + dims(w.shexp_up) + ", down " +
                           dims(w.shexp_down) + " do not fit D = " + n(D);
                });
        require(w.shexp_router.n_in == D && w.shexp_router.n_out == 1, op, [&] {
            return "shared expert gate (ffn_gate_inp_shexp) is " + dims(w.shexp_router) + ", expected [1, " + n(D) + "]";
        });
    }
}

void moe_route(const float* logits, int64_t T, int E, int k, int32_t* ids, float* weights) {
    std::vector<float> p(static_cast<size_t>(E));
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
        const float* l = logits + t * E;
        const float mx = *std::max_element(l, l + E);
        float sum = 0.0f;
        for (int e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(l[e] - mx);
        for (int e = 0; e < E; ++e) p[size_t(e)] /= sum;
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
            return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
        });
        float top = 0.0f;
        for (int i = 0; i < k; ++i) top += p[size_t(order[size_t(i)])];
        for (int i = 0; i < k; ++i) {
            ids[t * k + i] = order[size_t(i)];
            weights[t * k + i] = p[size_t(order[size_t(i)])] / top;
        }
    }
}

void moe_ffn(const MoeWeights& w, const float* x, float* y, int64_t T) {
    check_moe_weights(w, "ref::moe_ffn");
    const int64_t D = w.n_embd();
    const int E = w.n_expert, k = w.n_used;
    std::vector<float> logits(size_t(T * E)), wt(size_t(T * k)), e_out(static_cast<size_t>(D));
    std::vector<int32_t> ids(size_t(T * k));
    matmul(w.router, x, logits.data(), T);
    moe_route(logits.data(), T, E, k, ids.data(), wt.data());
    for (int64_t t = 0; t < T; ++t) {
        const float* xt = x + t * D;
        float* yt = y + t * D;
        std::fill(yt, yt + D, 0.0f);
        for (int e = w.expert_begin; e < w.expert_end(); ++e)  // in increasing expert id, as transformers sums them
            for (int i = 0; i < k; ++i) {
                if (ids[size_t(t * k + i)] != e) continue;
                const int l = e - w.expert_begin;
                swiglu_mlp(w.gate.at(l), w.up.at(l), w.down.at(l), xt, e_out.data(), 1);
                for (int64_t d = 0; d < D; ++d) yt[d] += wt[size_t(t * k + i)] * e_out[size_t(d)];
            }
        if (w.has_shared()) {
            float g = 0.0f;
            matmul(w.shexp_router, xt, &g, 1);
            swiglu_mlp(w.shexp_gate, w.shexp_up, w.shexp_down, xt, e_out.data(), 1);
            const float s = sigmoid(g);
            for (int64_t d = 0; d < D; ++d) yt[d] += s * e_out[size_t(d)];
        }
    }
}

}  // namespace alloy::ref
