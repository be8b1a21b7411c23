// cpu::attention: every ISA path this CPU has, called explicitly, against ref::attention on
// random inputs over head_dim {256, 64} x heads {8/2, 6/3, 4/4} x T {1, 2, 7, 63, 64, 65, 200}
// x n_past {0, 1, 37, 300}; plus long decode, peaky scores, odd head_dim and other thread
// counts. Outputs start NaN-poisoned, cache rows past n_past + T are NaN (never to be read).
// Tolerance per output row: relative L2 error <= 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/attention.h"

namespace alloy {
namespace {

using cpu::Isa;

std::vector<Isa> isas() {
    std::vector<Isa> v{Isa::Scalar};
    if (cpu::active_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
    return v;
}

struct Case {
    int n_head, n_head_kv, hd;
    int64_t T, n_past;
    float q_gain = 1.0f;  // > 1: peaky softmax (scores spread over tens of units)
};

std::string label(const Case& c, Isa isa) {
    return std::string(cpu::isa_name(isa)) + " heads=" + std::to_string(c.n_head) + "/" +
           std::to_string(c.n_head_kv) + " hd=" + std::to_string(c.hd) + " T=" + std::to_string(c.T) +
           " n_past=" + std::to_string(c.n_past) + " gain=" + std::to_string(c.q_gain);
}

// Runs one case on every ISA; returns the worst row error seen.
double check(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n_ctx = c.n_past + c.T + 5;
    const int64_t kvw = int64_t(c.n_head_kv) * c.hd;
    std::vector<float> q(size_t(c.T * c.n_head * c.hd));      // [T, n_head, hd]
    std::vector<float> k(size_t(n_ctx * kvw), NAN), v = k;    // [n_ctx, n_kv, hd]
    for (auto& e : q) e = nd(rng) * c.q_gain;
    for (int64_t i = 0; i < (c.n_past + c.T) * kvw; ++i) {
        k[size_t(i)] = nd(rng);
        v[size_t(i)] = nd(rng);
    }
    const ref::AttentionShape s{c.n_head, c.n_head_kv, c.hd, 1.0f / std::sqrt(float(c.hd))};
    std::vector<float> want(q.size());
    ref::attention(s, q.data(), k.data(), v.data(), want.data(), c.T, c.n_past);
    double worst = 0;
    for (Isa isa : isas()) {
        std::vector<float> got(q.size(), NAN);
        cpu::attention(s, q.data(), k.data(), v.data(), got.data(), c.T, c.n_past, isa);
        for (int64_t row = 0; row < c.T * c.n_head; ++row) {
            double num = 0, den = 0;
            for (int d = 0; d < c.hd; ++d) {
                const size_t i = size_t(row * c.hd + d);
                if (!std::isfinite(got[i])) {
                    ADD_FAILURE() << label(c, isa) << ": non-finite at row " << row << " dim " << d;
                    return INFINITY;
                }
                num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
                den += double(want[i]) * want[i];
            }
            const double err = std::sqrt(num / den);
            worst = std::max(worst, err);
            if (err > 1e-5) {
                ADD_FAILURE() << label(c, isa) << ": row " << row << " (t=" << row / c.n_head
                              << ", h=" << row % c.n_head << ") rel err " << err;
                return err;
            }
        }
    }
    return worst;
}

TEST(Attention, CpuMatchesReferenceOnTheGrid) {
    uint32_t seed = 1;
    double worst = 0;
    for (int hd : {256, 64})
        for (auto [nh, nkv] : {std::pair{8, 2}, std::pair{6, 3}, std::pair{4, 4}})
            for (int64_t T : {1, 2, 7, 63, 64, 65, 200})
                for (int64_t n_past : {0, 1, 37, 300}) worst = std::max(worst, check({nh, nkv, hd, T, n_past}, seed++));
    RecordProperty("worst_rel_err", std::to_string(worst));
}

// Long decode: many key splits merged; peaky scores exercise the running-max rescale.
TEST(Attention, LongDecodeAndPeakyScores) {
    check({8, 2, 256, 1, 4096}, 101);
    check({16, 4, 256, 1, 2000}, 102);
    check({24, 4, 256, 3, 1500}, 103);
    check({8, 2, 256, 65, 300, 6.0f}, 104);
    check({8, 2, 64, 1, 1000, 8.0f}, 105);
}

// head_dim 80 (AVX-512 column tail) and 40 (not a multiple of 16: the portable fallback).
TEST(Attention, OddHeadDims) {
    check({8, 2, 80, 33, 17}, 201);
    check({6, 3, 40, 9, 50}, 202);
    check({4, 1, 48, 1, 700}, 203);
}

// The schedule depends on the thread count (blocks vs key splits): 1 and 3 threads too.
TEST(Attention, OtherThreadCounts) {
    const int before = cpu::n_threads();
    for (int n : {1, 3}) {
        cpu::set_n_threads(n);
        check({8, 2, 256, 1, 1234}, 300 + n);
        check({8, 2, 256, 7, 300}, 310 + n);
        check({6, 3, 64, 65, 37}, 320 + n);
    }
    cpu::set_n_threads(before);
}

}  // namespace
}  // namespace alloy
