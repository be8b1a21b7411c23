// Helpers shared by the GDN kernel tests (reference and CPU): seeded random inputs, relative
// error, sequence offsets, L2-normalised rows.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

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

}  // namespace alloy::test
