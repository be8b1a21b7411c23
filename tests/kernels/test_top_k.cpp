// ref::top_k against an independent ranking (a stable sort by the stated order: NaN first,
// then larger values, -0 equal to +0, the lower id on ties).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ref/top_k.h"
#include "alloy/error.h"

namespace alloy {
namespace {

std::vector<int32_t> ranked(const float* row, int n) {
    std::vector<int32_t> idx(static_cast<size_t>(n), 0);
    for (int i = 0; i < n; ++i) idx[size_t(i)] = i;
    auto before = [&](int32_t a, int32_t b) {  // a strictly before b (ids break ties via stable_sort)
        const float x = row[a], y = row[b];
        if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && !std::isnan(y);
        return x > y;  // -0 > +0 is false both ways: equal
    };
    std::stable_sort(idx.begin(), idx.end(), before);
    return idx;
}

std::vector<float> test_rows(int rows, int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> x(size_t(rows) * size_t(n));
    for (float& v : x) v = nd(rng);
    for (int i = 0; i < n; i += 2) x[size_t(i)] = std::round(x[size_t(i)]);  // row 0: ties
    if (rows > 1) {  // row 1: NaNs of both signs, infinities, signed zeros as the largest
        float* r = x.data() + n;
        for (int i = 0; i < n; ++i) r[i] = -std::fabs(r[i]) - 1.0f;
        r[n - 1] = 0.0f;
        r[n / 2] = -0.0f;
        r[n / 3] = NAN;
        r[1] = -NAN;
        r[2] = INFINITY;
        r[n - 2] = -INFINITY;
    }
    return x;
}

TEST(TopK, RanksAsTheStatedOrder) {
    for (int n : {1, 2, 9, 257, 5000}) {
        const int rows = n >= 8 ? 3 : 1;
        const auto x = test_rows(rows, n, uint32_t(n));
        for (int k : {1, 2, 7, 40, n}) {
            if (k > n) continue;
            std::vector<float> v(size_t(rows) * size_t(k));
            std::vector<int32_t> id(v.size());
            ref::top_k(x.data(), rows, n, k, v.data(), id.data());
            for (int r = 0; r < rows; ++r) {
                const auto want = ranked(x.data() + size_t(r) * size_t(n), n);
                for (int j = 0; j < k; ++j) {
                    const size_t at = size_t(r) * size_t(k) + size_t(j);
                    ASSERT_EQ(id[at], want[size_t(j)]) << "n " << n << " k " << k << " row " << r << " rank " << j;
                    EXPECT_EQ(std::memcmp(&v[at], &x[size_t(r) * size_t(n) + size_t(id[at])], 4), 0);
                }
            }
        }
    }
    std::vector<float> v(2);
    std::vector<int32_t> id(2);
    const float one[1] = {0.5f};
    EXPECT_THROW(ref::top_k(one, 1, 1, 2, v.data(), id.data()), Error);
    EXPECT_THROW(ref::top_k(one, 1, 1, 0, v.data(), id.data()), Error);
}

}  // namespace
}  // namespace alloy
