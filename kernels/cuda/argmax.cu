// Greedy sampling on CUDA (kernels/cuda/ops.h): the argmax of each logits row, so a decode
// step hands the host one int32 per sequence instead of a 1 MB row of logits.
// Each (value, index) pair becomes a 64-bit key that orders as the pair should: the float's
// bits made order-preserving as an unsigned integer in the high half, the index inverted in
// the low half (equal values: the smaller index wins). Blocks reduce their slice of the row
// and atomicMax the key; max is order-independent, so the result does not depend on which
// block lands first. One launch: the row's last block to finish (a counter per row) unpacks
// the index and clears the key and the counter, so the workspace is left as it was found.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace alloy::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;  // a block covers 2048 logits: 122 blocks for a 248320 vocabulary

__device__ __forceinline__ unsigned long long key(float v, uint32_t i) {
    // -0 is +0 (they compare equal: the lower index wins), and every NaN, whatever its sign
    // and payload, ranks above +inf and equal to the others (the first NaN wins), as the
    // host's greedy_token (runtime/sampler.h) ranks them.
    const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);
    const uint32_t ord = v != v ? 0xffffffffu : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (static_cast<unsigned long long>(ord) << 32) | (0xffffffffu - i);
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* __restrict__ logits, int64_t n,
                                                           unsigned long long* keys, unsigned* done,
                                                           int32_t* __restrict__ out) {
    detail::pdl_entry();
    __shared__ unsigned long long red[kThreads / 32];
    const int64_t r = blockIdx.y;
    const float* row = logits + r * n;
    unsigned long long best = 0;  // below every key of a real value
    for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
        best = max(best, key(row[i], uint32_t(i)));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kThreads / 32; ++w) best = max(best, red[w]);
        atomicMax(keys + r, best);
        __threadfence();  // this block's max is visible before its arrival is counted
        if (atomicAdd(done + r, 1u) == gridDim.x - 1) {
            const unsigned long long k = atomicExch(keys + r, 0ull);  // every block's max is in
            out[r] = int32_t(0xffffffffu - uint32_t(k & 0xffffffffu));
            done[r] = 0;
        }
    }
}

}  // namespace

size_t argmax_workspace_bytes(int64_t rows) { return size_t(std::max<int64_t>(rows, 1)) * 12; }

void argmax(const float* logits, int64_t rows, int64_t n, int32_t* out, void* workspace, void* stream) {
    const char* op = "cuda::argmax";
    if (rows < 0 || n <= 0 || n > 0x7fffffff || rows > 65535) throw Error(std::string(op) + ": bad shape (rows <= 65535)");
    if (rows == 0) return;
    if (!workspace) throw Error(std::string(op) + ": workspace is null");
    cudaStream_t st = detail::as_stream(stream);
    auto* keys = static_cast<unsigned long long*>(workspace);
    auto* done = reinterpret_cast<unsigned*>(keys + rows);
    const dim3 grid(unsigned(std::min<int64_t>(detail::ceil_div(n, kThreads * kPerThread), 1024)), unsigned(rows));
    detail::launch(op, argmax_kernel, dim3(grid), dim3(kThreads), 0, st, logits, n, keys, done, out);
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
