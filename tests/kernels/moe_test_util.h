// The MoE op tests' layers and inputs (tests/kernels/test_moe.cpp, tests/cuda/test_moe_cuda.cpp):
// random weights of one layer in any expert type, and inputs whose routing is well separated.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "alloy/error.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/moe.h"
#include "tests/kernels/random_weights.h"

namespace alloy::test {

struct Shape {
    int64_t D, I, Is;  // Is = 0: no shared expert
    int E, k;
    bool fused;        // gate and up in one ffn_gate_up_exps tensor
};

// The weights of one layer, owning their bytes.
struct Layer {
    std::vector<std::vector<uint8_t>> store;
    ref::MoeWeights w;

    WeightView make(GgmlType t, int64_t n_in, int64_t n_out, std::mt19937& rng) {
        store.push_back(random_weights(t, n_in, n_out, rng));
        return WeightView{t, n_in, n_out, store.back().data(), row_bytes(t, n_in)};
    }
    Layer(const Shape& s, GgmlType expert_type, GgmlType router_type, uint32_t seed) {
        store.reserve(16);
        std::mt19937 rng(seed);
        w.n_expert = s.E;
        w.n_used = s.k;
        w.router = make(router_type, s.D, s.E, rng);
        if (s.fused) {
            const WeightView gu = make(expert_type, s.D, 2 * s.I * s.E, rng);
            w.gate = {gu, 2 * s.I, 0, s.I};
            w.up = {gu, 2 * s.I, s.I, s.I};
        } else {
            w.gate = {make(expert_type, s.D, s.I * s.E, rng), s.I, 0, s.I};
            w.up = {make(expert_type, s.D, s.I * s.E, rng), s.I, 0, s.I};
        }
        w.down = {make(expert_type, s.I, s.D * s.E, rng), s.D, 0, s.D};
        if (s.Is > 0) {
            w.shexp_gate = make(expert_type, s.D, s.Is, rng);
            w.shexp_up = make(expert_type, s.D, s.Is, rng);
            w.shexp_down = make(expert_type, s.Is, s.D, rng);
            w.shexp_router = make(router_type, s.D, 1, rng);
        }
    }
};

// x [T, D] uniform in [-1, 1], each row redrawn until its k-th and (k+1)-th router logits are
// at least `gap` apart: every path must pick the same experts, whatever its rounding.
inline std::vector<float> routed_input(const ref::MoeWeights& w, int64_t T, float gap, uint32_t seed) {
    const int64_t D = w.n_embd();
    const int E = w.n_expert, k = w.n_used;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(T * D)), l(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
        float* xt = x.data() + t * D;
        for (int tries = 0;; ++tries) {
            if (tries == 1000) throw Error("routed_input: no well-separated routing found");
            for (int64_t d = 0; d < D; ++d) xt[d] = u(rng);
            ref::matmul(w.router, xt, l.data(), 1);
            std::sort(l.begin(), l.end(), std::greater<float>());
            if (k == E || l[size_t(k - 1)] - l[size_t(k)] >= gap) break;
        }
    }
    return x;
}

}  // namespace alloy::test
