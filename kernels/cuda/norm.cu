// RMSNorm and the residual add + RMSNorm on CUDA (kernels/cuda/ops.h; math as ref::rms_norm:
// out = x / sqrt(mean(x^2) + eps) * w). One block per row: a row (n = 1024 in the 0.8B
// model) is read once into registers, its sum of squares reduced in a fixed order, then
// scaled. fp32 sums where ref uses double: ~1e-6 relative.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace alloy::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxPerThread = 16;  // rows up to 4096 stay in registers; longer rows re-read x

// kAdd: x += y first (x written back), then the norm of the sum.
// pk.q: out also quantized per 32 (n % 32 == 0): a thread's elements tid + 256 e put each block
// of 32 in one warp, one value per lane (detail::quantize_block32). pk.b: out also in bf16;
// pk.b_only: only in bf16.
template <bool kAdd>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(float* x, const float* __restrict__ y,
                                                             const float* __restrict__ w, float* out, int64_t n,
                                                             float eps, MatmulInput pk) {
    detail::pdl_entry();
    __shared__ float red[32];
    const int lane = threadIdx.x & 31;
    int8_t* qrow = pk.q ? pk.q + blockIdx.x * n : nullptr;
    float* drow = pk.q ? pk.d + blockIdx.x * (n / 32) : nullptr;
    __nv_bfloat16* brow = pk.b ? reinterpret_cast<__nv_bfloat16*>(pk.b) + blockIdx.x * n : nullptr;
    float* xr = x + blockIdx.x * n;
    float* orow = brow && pk.b_only ? nullptr : out + blockIdx.x * n;
    float v[kMaxPerThread], wv[kMaxPerThread];
    float ss = 0.0f;
    // The weights are loaded with x, before the reduction: a third memory round trip after it
    // was most of a one-row call's time (decode: 48 norms a token).
#pragma unroll
    for (int e = 0; e < kMaxPerThread; ++e) {
        const int64_t i = threadIdx.x + int64_t(e) * kThreads;
        wv[e] = i < n && w ? w[i] : 1.0f;
    }
#pragma unroll
    for (int e = 0; e < kMaxPerThread; ++e) {
        const int64_t i = threadIdx.x + int64_t(e) * kThreads;
        v[e] = 0.0f;
        if (i < n) {
            float a = xr[i];
            if constexpr (kAdd) {
                a += y[blockIdx.x * n + i];
                xr[i] = a;
            }
            v[e] = a;
            ss = fmaf(a, a, ss);
        }
    }
    for (int64_t i = threadIdx.x + int64_t(kMaxPerThread) * kThreads; i < n; i += kThreads) {
        float a = xr[i];
        if constexpr (kAdd) {
            a += y[blockIdx.x * n + i];
            xr[i] = a;
        }
        ss = fmaf(a, a, ss);
    }
    ss = detail::block_sum_all(ss, red);
    const float scale = 1.0f / sqrtf(ss / float(n) + eps);
#pragma unroll
    for (int e = 0; e < kMaxPerThread; ++e) {
        const int64_t i = threadIdx.x + int64_t(e) * kThreads;
        if (i < n) {  // warp-uniform when n % 32 == 0 (the q8 case)
            const float o = v[e] * scale * wv[e];
            if (orow) orow[i] = o;
            if (brow) brow[i] = __float2bfloat16_rn(o);
            if (qrow) detail::quantize_block32(o, lane, qrow + (i - lane), drow + i / 32);
        }
    }
    // Past the register-held part x is re-read; with kAdd it holds the sum this thread wrote.
    for (int64_t i = threadIdx.x + int64_t(kMaxPerThread) * kThreads; i < n; i += kThreads) {
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
    detail::launch(op, rms_norm_kernel<false>, dim3(unsigned(rows)), dim3(kThreads), 0, detail::as_stream(stream), const_cast<float*>(x), nullptr,
                                                                                       w, out, n, eps, pk);
    ALLOY_CUDA_LAUNCHED(op);
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps,
                  void* stream, MatmulInput pk) {
    const char* op = "cuda::add_rms_norm";
    check(rows, n, op, pk);
    if (rows == 0) return;
    detail::launch(op, rms_norm_kernel<true>, dim3(unsigned(rows)), dim3(kThreads), 0, detail::as_stream(stream), x, y, w, out, n, eps, pk);
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
