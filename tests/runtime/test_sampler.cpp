// The sampler's draw from a row's k best pairs (Sampler::sample_top, what the engine does when
// a GPU sends only the pairs) against its draw from the whole row (Sampler::sample).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/ref/top_k.h"
#include "runtime/sampler.h"

namespace alloy {
namespace {

// A seeded sampler draws the same tokens from the k best pairs as from the whole row (the
// engine's GPU path hands it only the pairs), for every cut of the chain, over many draws.
TEST(TopK, SamplerDrawsTheSameFromThePairs) {
    const int n = 3001;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> row(static_cast<size_t>(n));
    for (const SamplerParams p : {SamplerParams{0.8f, 40, 0.95f, 0.05f, 7}, SamplerParams{1.5f, 20, 1.0f, 0.0f, 8},
                                  SamplerParams{0.3f, 64, 0.5f, 0.0f, 9}, SamplerParams{1.0f, 3, 1.0f, 0.2f, 10},
                                  SamplerParams{0.7f, 0, 0.9f, 0.0f, 11}}) {
        Sampler whole(p), pairs(p);
        const int k = pairs.candidates_needed(n);
        EXPECT_EQ(k, p.top_k > 0 ? p.top_k : n);
        std::vector<float> v(static_cast<size_t>(k));
        std::vector<int32_t> id(static_cast<size_t>(k));
        int distinct = 0, last = -1;
        for (int draw = 0; draw < 300; ++draw) {
            for (float& x : row) x = nd(rng);
            ref::top_k(row.data(), 1, n, k, v.data(), id.data());
            const int32_t a = whole.sample(row.data(), n), b = pairs.sample_top(v.data(), id.data(), k);
            ASSERT_EQ(a, b) << "top_k " << p.top_k << " draw " << draw;
            distinct += a != last;
            last = a;
        }
        EXPECT_GT(distinct, 100) << "the draws should vary";
    }
}

}  // namespace
}  // namespace alloy
