// RMSNorm and the residual add + RMSNorm on CUDA (kernels/cuda/ops.h; math as ref::rms_norm:
// out = x / sqrt(mean(x^2) + eps) * w). One block per row: a row (n = 1024 in the 0.8B
// model, 5120 in the 27b) is read once into registers, its sum of squares reduced in a fixed
// order, then scaled. fp32 sums where ref uses double: ~1e-6 relative.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace alloy::cuda {

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxPerThread = 8;  // rows up to 8192 stay in registers; longer rows re-read x

// Threads per row: 8 values a thread (at least 256 threads, at most 1024), a multiple of 32 so
// that each block of 32 values sits in one warp. A decode step runs one row per norm, on one
// SM: a 5120-wide row (27b) on 256 threads took 11 us, mostly waiting on its 20 loads a thread
// one after another; 640 threads with every load issued first take a fraction of that.
int row_threads(int64_t n) {
    const int64_t t = ((n + kMaxPerThread - 1) / kMaxPerThread + 31) / 32 * 32;
    return int(std::min<int64_t>(kMaxThreads, std::max<int64_t>(256, t)));
}

// kAdd: x += y first (x written back), then the norm of the sum.
// pk.q: out also quantized per 32 (n % 32 == 0): a thread's elements tid + blockDim e put each
// block of 32 in one warp, one value per lane (detail::quantize_block32). pk.b: out also in
// bf16; pk.b_only: only in bf16. The bits depend on n (the thread count) but not on rows, so a
// row's norm is the same in a decode step and in a prefill.
template <bool kAdd>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(float* x, const float* __restrict__ y,
                                                                const float* __restrict__ w, float* out, int64_t n,
                                                                float eps, MatmulInput pk) {
    detail::pdl_entry();
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, nt = blockDim.x;
    int8_t* qrow = pk.q ? pk.q + blockIdx.x * n : nullptr;
    float* drow = pk.q ? pk.d + blockIdx.x * (n / 32) : nullptr;
    __nv_bfloat16* brow = pk.b ? reinterpret_cast<__nv_bfloat16*>(pk.b) + blockIdx.x * n : nullptr;
    float* xr = x + blockIdx.x * n;
    const float* yr = kAdd ? y + blockIdx.x * n : nullptr;
    float* orow = brow && pk.b_only ? nullptr : out + blockIdx.x * n;
    float v[kMaxPerThread], wv[kMaxPerThread], yv[kMaxPerThread];
    // Every load of the register-held part first (weights, x, y): the add's store of x would
    // otherwise order each next load after it (x may alias y as far as the compiler knows).
#pragma unroll
    for (int e = 0; e < kMaxPerThread; ++e) {
        const int64_t i = threadIdx.x + int64_t(e) * nt;
        wv[e] = i < n && w ? w[i] : 1.0f;
        v[e] = i < n ? xr[i] : 0.0f;
        yv[e] = kAdd && i < n ? yr[i] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerThread; ++e) {
        const int64_t i = threadIdx.x + int64_t(e) * nt;
        if (i < n) {
            if constexpr (kAdd) {
                v[e] += yv[e];
                xr[i] = v[e];
            }
            ss = fmaf(v[e], v[e], ss);
        }
    }
    for (int64_t i = threadIdx.x + int64_t(kMaxPerThread) * nt; i < n; i += nt) {
        float a = xr[i];
        if constexpr (kAdd) {
            a += yr[i];
            xr[i] = a;
        }
        ss = fmaf(a, a, ss);
    }
    ss = detail::block_sum_all(ss, red);
    const float scale = 1.0f / sqrtf(ss / float(n) + eps);
#pragma unroll
    for (int e = 0; e < kMaxPerThread; ++e) {
        const int64_t i = threadIdx.x + int64_t(e) * nt;
        if (i < n) {  // warp-uniform when n % 32 == 0 (the q8 case)
            const float o = v[e] * scale * wv[e];
            if (orow) orow[i] = o;
            if (brow) brow[i] = __float2bfloat16_rn(o);
            if (qrow) detail::quantize_block32(o, lane, qrow + (i - lane), drow + i / 32);
        }
    }
    // Past the register-held part x is re-read; with kAdd it holds the sum this thread wrote.
    for (int64_t i = threadIdx.x + int64_t(kMaxPerThread) * nt; i < n; i += nt) {
        const float o = xr[i] * scale * (w ? w[i] : 1.0f);
        if (orow) orow[i] = o;
        if (brow) brow[i] = __float2bfloat16_rn(o);
        if (qrow) detail::quantize_block32(o, lane, qrow + (i - lane), drow + i / 32);
    }
}

void check(int64_t rows, int64_t n, const char* op, const MatmulInput& pk) {
    if (rows < 0 || n <= 0 || rows > 0x7fffffff) throw Error(std::string(op) + ": bad shape");
    if (pk.q && (n % 32 || !pk.d)) throw Error(std::string(op) + ": a quantized MatmulInput needs n % 32 == 0 and both arrays");
}

}  // namespace

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps, void* stream, MatmulInput pk) {
    const char* op = "cuda::rms_norm";
    check(rows, n, op, pk);
    if (rows == 0) return;
    // out may alias x: each element is read before it is written, by the same thread.
    detail::launch(op, rms_norm_kernel<false>, dim3(unsigned(rows)), dim3(unsigned(row_threads(n))), 0, detail::as_stream(stream), const_cast<float*>(x), nullptr,
                                                                                       w, out, n, eps, pk);
    ALLOY_CUDA_LAUNCHED(op);
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps,
                  void* stream, MatmulInput pk) {
    const char* op = "cuda::add_rms_norm";
    check(rows, n, op, pk);
    if (rows == 0) return;
    detail::launch(op, rms_norm_kernel<true>, dim3(unsigned(rows)), dim3(unsigned(row_threads(n))), 0, detail::as_stream(stream), x, y, w, out, n, eps, pk);
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
