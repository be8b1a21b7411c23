// Helpers shared by the .cu files of kernels/cuda (not part of the ops' interface): status
// checks that throw alloy::Error naming the op and the line, the stream cast, warp reductions.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "alloy/error.h"

namespace alloy::cuda::detail {

[[noreturn]] inline void fail(const char* op, const std::string& what, const char* file, int line) {
    throw Error(std::string(op) + ": " + what + " (" + file + ":" + std::to_string(line) + ")");
}

#define ALLOY_CUDA_CHECK(op, expr)                                                              \
    do {                                                                                        \
        cudaError_t e_ = (expr);                                                                \
        if (e_ != cudaSuccess) ::alloy::cuda::detail::fail(op, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
// After a launch: a bad configuration shows up here, not at the next synchronization.
#define ALLOY_CUDA_LAUNCHED(op) ALLOY_CUDA_CHECK(op, cudaGetLastError())

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// ---- programmatic dependent launch (sm_90) ----
// Decode is a chain of ~250 small kernels a token, each too short to hide its own launch; with
// PDL a kernel is scheduled while the one before it drains. Every kernel of kernels/cuda is
// launched through launch() and follows one rule: it calls pdl_wait() before it reads anything
// an earlier kernel wrote or writes anything an earlier kernel reads (and before any early
// return, so a grid never completes ahead of its predecessor), and may call pdl_trigger() at
// entry so that the next kernel is scheduled at once. Work that depends on no earlier kernel
// (weights, a GDN layer's own state) may come before the wait. Both are no-ops in a kernel
// launched without the attribute. `ALLOY_CUDA_PDL=0` launches everything plainly (A/B).
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Both, first thing in a kernel that has nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_entry() {
    pdl_trigger();
    pdl_wait();
}

inline bool pdl_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("ALLOY_CUDA_PDL");
        return !(e && e[0] == '0');
    }();
    return on;
}

// kernel<<<grid, block, smem, st>>>(args...) with programmatic serialization (when enabled)
// and, for cluster_x > 1, thread-block clusters of cluster_x blocks along x; throws naming op
// when the launch is refused.
template <class... Params, class... Args>
void launch_cluster(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                    unsigned cluster_x, Args... args) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (pdl_enabled()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    if (cluster_x > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster_x;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    ALLOY_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, kernel, args...));
}

template <class... Params, class... Args>
void launch(const char* op, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
            Args... args) {
    launch_cluster(op, kernel, grid, block, smem, st, 1u, args...);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int sm_count() {
    static const int n = [] {
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return 132;
        return sms;
    }();
    return n;
}

// The device's L2 in bytes (the H200's 50 MB when the query fails).
inline int64_t l2_bytes() {
    static const int64_t n = [] {
        int dev = 0, bytes = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev) != cudaSuccess)
            return int64_t(50) << 20;
        return int64_t(bytes);
    }();
    return n;
}

// Sum over the warp by xor butterfly: every lane ends with the same bits (each step adds the
// same two operands in every lane, and fp32 addition commutes).
__device__ __forceinline__ float warp_sum_all(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Sum over a block of blockDim.x threads (a multiple of 32, <= 1024) in a fixed order;
// every thread gets the result. `red` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum_all(float x, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    x = warp_sum_all(x);
    __syncthreads();  // red may still be read by an earlier call
    if (lane == 0) red[warp] = x;
    __syncthreads();
    float s = lane < nw ? red[lane] : 0.0f;
    return warp_sum_all(s);
}

// ref::sigmoid (kernels/ref/activations.h) with full-precision expf: neither branch
// exponentiates a large positive number.
__device__ __forceinline__ float sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}

// The Q8_0 GEMV's quantization of x (ops.h MatmulInput), one block of 32 values held one per lane
// of a warp (every lane active): d = amax / 127, q = round(v / d) to nearest even; q[lane] and
// (lane 0) *d written. The quantize kernel and the producers that write a MatmulInput beside their
// fp32 output share it, so both give the same bytes.
__device__ __forceinline__ void quantize_block32(float v, int lane, int8_t* q, float* d) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float s = amax / 127.0f;
    q[lane] = int8_t(s > 0.0f ? __float2int_rn(v / s) : 0);
    if (lane == 0) *d = s;
}

}  // namespace alloy::cuda::detail
