#include "kernels/ref/top_k.h"

#include <algorithm>
#include <string>
#include <vector>

#include "alloy/error.h"

namespace alloy::ref {

void top_k(const float* logits, int64_t rows, int64_t n, int k, float* values, int32_t* ids,
           std::vector<uint64_t>* scratch) {
    if (rows < 0 || n <= 0 || n > 0x7fffffff || k < 1 || k > n)
        throw Error("ref::top_k: bad shape (rows " + std::to_string(rows) + ", n " + std::to_string(n) + ", k " +
                    std::to_string(k) + ")");
    // (key, ~id) as one 64-bit number: the order is its descending order.
    std::vector<uint64_t> own;
    std::vector<uint64_t>& keys = scratch ? *scratch : own;
    keys.resize(size_t(n));
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = logits + r * n;
        for (int64_t i = 0; i < n; ++i)
            keys[size_t(i)] = (uint64_t(top_k_value_key(row[i])) << 32) | (0xffffffffu - uint32_t(i));
        auto first = [](uint64_t a, uint64_t b) { return a > b; };
        if (k == n) std::sort(keys.begin(), keys.end(), first);  // partial_sort would heap-sort it all
        else std::partial_sort(keys.begin(), keys.begin() + k, keys.end(), first);
        for (int j = 0; j < k; ++j) {
            const int32_t id = int32_t(0xffffffffu - uint32_t(keys[size_t(j)] & 0xffffffffu));
            ids[r * k + j] = id;
            values[r * k + j] = row[id];
        }
    }
}

}  // namespace alloy::ref
