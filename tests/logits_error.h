// Shared by the end-to-end tests (tests/model, tests/cli): the error measure used against the
// transformers fixtures, max over positions of ||a_t - b_t|| / ||b_t|| for [n, V] logits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace alloy::test {

inline double max_row_rel_error(const std::vector<float>& a, const std::vector<float>& b, size_t V) {
    double worst = 0;
    for (size_t r = 0; r < a.size() / V; ++r) {
        double num = 0, den = 0;
        for (size_t v = 0; v < V; ++v) {
            const double d = double(a[r * V + v]) - b[r * V + v];
            num += d * d;
            den += double(b[r * V + v]) * b[r * V + v];
        }
        worst = std::max(worst, std::sqrt(num / den));
    }
    return worst;
}

}  // namespace alloy::test
