// Internal helper for the CPU's elementwise ops (swiglu, gate, add, rms_norm rows): run a
// range serially when it is small (a pool region costs a few microseconds) and in pool-sized
// chunks when it is large enough for two threads' worth of memory bandwidth to matter.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace alloy::cpu {

constexpr int64_t kElementwiseParallelMin = int64_t(1) << 16;  // elements (256 KiB of fp32)
constexpr int64_t kElementwiseChunk = int64_t(1) << 14;        // elements per pool item

// fn(begin, end) over [0, n) in chunks of `grain` (a multiple of 16 keeps vectors whole).
// `cost` is the work per index in elements (row length for row-wise ops).
template <class Fn>
inline void for_chunks(int64_t n, int64_t cost, Fn&& fn) {
    if (n * cost < kElementwiseParallelMin || n_threads() == 1) {
        fn(int64_t(0), n);
        return;
    }
    const int64_t grain = std::max<int64_t>(1, kElementwiseChunk / std::max<int64_t>(cost, 1));
    parallel_for((n + grain - 1) / grain, [&](int64_t i, int) { fn(i * grain, std::min(n, (i + 1) * grain)); });
}

}  // namespace alloy::cpu
