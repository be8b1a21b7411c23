// Top-k of logits rows on CUDA (kernels/cuda/ops.h; reference kernels/ref/top_k): a sampled
// decode token then costs the host k (value, id) pairs a row instead of a 1 MB row of logits,
// and the host's sampler draws from exactly the pairs it would have picked itself.
// Each (value, index) pair is a 64-bit key that orders as the pairs should (ref::top_k_value_key
// in the high half, the inverted index in the low half), so sorting keys descending is the
// order. Stage 1: each of the row's blocks (at most 64) holds 4096 keys of its slice in shared
// memory, sorts them in runs of 64 (a bitonic network per warp) and merges the runs pairwise
// down to the best 64 (each merge one warp: max(a[i], b[63-i]) then a half-cleaner), carrying
// them into its next 4096 keys; it writes its best k2 (k rounded up to a power of two).
// Stage 2: the row's last block to finish (a counter per row, as cuda::argmax) merges those
// runs the same way and writes the k best pairs, then clears the counter: one launch, the
// workspace left as found. Warps synchronize among themselves; a block barrier comes once per
// merge level (a full bitonic sort of 4096 keys needs 78, and took ~80 us a token).
// The merges are order-exact, so the result does not depend on which block finishes first.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace alloy::cuda {

namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32;
constexpr int kSortKeys = 4096;  // keys a block holds at once (32 KB of shared memory)
constexpr int kRun = 64, kRuns = kSortKeys / kRun;  // sorted runs of 64 keys (>= any k2)

__device__ __forceinline__ unsigned long long key(float v, uint32_t i) {
    const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);  // -0 is +0
    const uint32_t ord = v != v ? 0xffffffffu : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (static_cast<unsigned long long>(ord) << 32) | (0xffffffffu - i);
}

__device__ __forceinline__ void order_desc(unsigned long long* s, int i, int j, bool desc) {
    const unsigned long long a = s[i], b = s[j];
    if ((a < b) == desc) {
        s[i] = b;
        s[j] = a;
    }
}

// Sorts each run of 64 keys of s[0, kSortKeys) descending: a bitonic network per run, each run
// by one warp (only __syncwarp between its stages), between two block barriers.
__device__ void sort_runs(unsigned long long* s) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // the block's threads stored the keys: a run is not its sorting warp's own
    for (int run = warp; run < kRuns; run += kWarps) {
        unsigned long long* r = s + run * kRun;
        for (int size = 2; size <= kRun; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                const int t = lane, i = 2 * stride * (t / stride) + (t % stride);  // 32 pairs: one a lane
                order_desc(r, i, i + stride, size == kRun || (i & size) == 0);
                __syncwarp();
            }
    }
    __syncthreads();
}

// a = the 64 largest of the sorted runs a and b, sorted (by one warp): the larger of a[i] and
// b[63 - i] is a bitonic sequence holding them, which a half-cleaner network sorts.
__device__ void merge_pair(unsigned long long* a, const unsigned long long* b, int lane) {
    for (int i = lane; i < kRun; i += 32) {
        const unsigned long long x = a[i], y = b[kRun - 1 - i];
        a[i] = x > y ? x : y;
    }
    __syncwarp();
    for (int stride = kRun / 2; stride > 0; stride >>= 1) {
        const int i = 2 * stride * (lane / stride) + (lane % stride);
        order_desc(a, i, i + stride, true);
        __syncwarp();
    }
}

// Run 0 of s = the 64 largest keys of its kRuns sorted runs, sorted: a tree of pairwise merges,
// each merge by one warp, one block barrier per level.
__device__ void merge_runs(unsigned long long* s) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int d = 1; d < kRuns; d <<= 1) {
        for (int m = warp; m < kRuns / (2 * d); m += kWarps) merge_pair(s + 2 * m * d * kRun, s + (2 * m + 1) * d * kRun, lane);
        __syncthreads();
    }
}

__global__ void __launch_bounds__(kThreads) top_k_kernel(const float* __restrict__ logits, int64_t n, int k, int k2,
                                                          int64_t per_block, unsigned long long* cand, unsigned* done,
                                                          float* __restrict__ values, int32_t* __restrict__ ids) {
    detail::pdl_entry();
    __shared__ unsigned long long s[kSortKeys];
    __shared__ bool last;
    const int64_t r = blockIdx.y;
    const float* row = logits + r * n;
    const int nb = int(gridDim.x);
    const int64_t lo = int64_t(blockIdx.x) * per_block, hi = n < lo + per_block ? n : lo + per_block;
    // Round 1 fills all kSortKeys; later rounds keep the best run (run 0) and refill the rest.
    for (int64_t i = lo, at = 0;; at = kRun) {
        const int room = kSortKeys - int(at);
        for (int t = threadIdx.x; t < room; t += kThreads) {
            const int64_t e = i + t;
            s[at + t] = e < hi ? key(row[e], uint32_t(e)) : 0ull;  // 0: below every real key
        }
        i += room;
        sort_runs(s);
        merge_runs(s);
        if (i >= hi) break;
    }
    unsigned long long* mine = cand + (r * nb + blockIdx.x) * k2;
    for (int t = threadIdx.x; t < k2; t += kThreads) mine[t] = s[t];
    __threadfence();  // this block's keys are visible before its arrival is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done + r, 1u) == unsigned(nb - 1);
    __syncthreads();
    if (!last) return;
    // Every block's k2 keys, sorted: run j = block j's, padded with zeros (nb <= kRuns).
    const unsigned long long* all = cand + r * nb * int64_t(k2);
    for (int t = threadIdx.x; t < kSortKeys; t += kThreads) {
        const int run = t / kRun, at = t % kRun;
        s[t] = run < nb && at < k2 ? __ldcg(all + run * k2 + at) : 0ull;
    }
    __syncthreads();
    merge_runs(s);
    for (int t = threadIdx.x; t < k; t += kThreads) {
        const int32_t id = int32_t(0xffffffffu - uint32_t(s[t] & 0xffffffffu));
        ids[r * k + t] = id;
        values[r * k + t] = row[id];
    }
    if (threadIdx.x == 0) done[r] = 0;
}

struct Layout {
    int k2, nb;
    int64_t per_block;
};
Layout layout(int64_t n, int k) {
    int k2 = 1;
    while (k2 < k) k2 <<= 1;
    const int64_t chunks = detail::ceil_div(n, int64_t(kSortKeys));
    const int nb = int(std::max<int64_t>(1, std::min<int64_t>(chunks, kRuns)));
    return {k2, nb, detail::ceil_div(n, int64_t(nb))};
}

}  // namespace

size_t top_k_workspace_bytes(int64_t rows, int64_t n, int k) {
    const Layout l = layout(std::max<int64_t>(n, 1), std::clamp(k, 1, kTopKMax));
    const size_t r = size_t(std::max<int64_t>(rows, 1));
    return (r * sizeof(unsigned) + 255) / 256 * 256 + r * size_t(l.nb) * size_t(l.k2) * 8;
}

void top_k(const float* logits, int64_t rows, int64_t n, int k, float* values, int32_t* ids, void* workspace,
           void* stream) {
    const char* op = "cuda::top_k";
    if (rows < 0 || n <= 0 || n > 0x7fffffff || rows > 65535 || k < 1 || k > kTopKMax || k > n)
        throw Error(std::string(op) + ": bad shape (rows " + std::to_string(rows) + " <= 65535, n " + std::to_string(n) +
                    ", k " + std::to_string(k) + " in [1, min(n, " + std::to_string(kTopKMax) + ")])");
    if (rows == 0) return;
    if (!workspace) throw Error(std::string(op) + ": workspace is null");
    const Layout l = layout(n, k);
    auto* done = static_cast<unsigned*>(workspace);
    auto* cand = reinterpret_cast<unsigned long long*>(static_cast<char*>(workspace) +
                                                       (size_t(rows) * sizeof(unsigned) + 255) / 256 * 256);
    detail::launch(op, top_k_kernel, dim3(unsigned(l.nb), unsigned(rows)), dim3(kThreads), 0, detail::as_stream(stream),
                   logits, n, k, l.k2, l.per_block, cand, done, values, ids);
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
