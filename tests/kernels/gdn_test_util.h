// Helpers shared by the GDN kernel tests (reference and CPU): seeded random inputs, relative
// error, sequence offsets, L2-normalised rows.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/ref/gdn.h"

namespace alloy::test {

struct Rng {
    std::mt19937 gen;
    explicit Rng(uint32_t seed) : gen(seed) {}
    float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
    std::vector<float> vec(std::size_t n, float lo, float hi) {
        std::vector<float> x(n);
        for (auto& e : x) e = uniform(lo, hi);
        return x;
    }
};

inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double num = 0, den = 0;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<int32_t> offsets_of(const std::vector<int>& lens) {
    std::vector<int32_t> offs{0};
    for (int n : lens) offs.push_back(offs.back() + n);
    return offs;
}

inline void l2_normalise_rows(std::vector<float>& x, int d) {
    for (std::size_t r = 0; r < x.size() / d; ++r) {
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += (double)x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; ++i) x[r * d + i] = (float)(x[r * d + i] / std::sqrt(ss));
    }
}

// Inputs of the delta rule core, generated like llama.cpp's test-backend-ops (g range chosen
// by the caller: [-20, -1e-4] stresses the decay masking, [-1, -0.01] is the trained regime).
struct DeltaCase {
    ref::GdnShape shape;
    std::vector<int32_t> offs;
    std::vector<float> q, k, v, g, beta, state0;
    int n_seqs() const { return (int)offs.size() - 1; }
    int T() const { return offs.back(); }
};

inline DeltaCase make_delta_case(ref::GdnShape shape, const std::vector<int>& lens, float g_lo, float g_hi,
                                 bool init_state, uint32_t seed) {
    Rng rng(seed);
    DeltaCase c;
    c.shape = shape;
    c.offs = offsets_of(lens);
    const std::size_t T = c.T();
    c.q = rng.vec(T * shape.H_k * shape.d_k, -1, 1);
    c.k = rng.vec(T * shape.H_k * shape.d_k, -1, 1);
    l2_normalise_rows(c.q, shape.d_k);
    l2_normalise_rows(c.k, shape.d_k);
    for (auto& e : c.q) e /= std::sqrt((float)shape.d_k);
    c.v = rng.vec(T * shape.H_v * shape.d_v, -0.3f, 5.0f);
    c.g = rng.vec(T * shape.H_v, g_lo, g_hi);
    c.beta = rng.vec(T * shape.H_v, 0, 1);
    const std::size_t ns = (std::size_t)c.n_seqs() * shape.H_v * shape.d_v * shape.d_k;
    c.state0 = init_state ? rng.vec(ns, -1, 1) : std::vector<float>(ns, 0.0f);
    return c;
}

struct DeltaResult {
    std::vector<float> out, state;
};

}  // namespace alloy::test
