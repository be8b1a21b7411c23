// Partial NeoX RoPE on CUDA (kernels/cuda/ops.h; math as ref::rope_partial: within each head
// the first n_rot dims rotate, pairing (i, i + n_rot / 2), theta_i = pos * base^(-2i / n_rot)),
// alone and after the per-head RMSNorm of q or k (ref::rms_norm_rope).
// The inverse frequencies are computed on the host with ref's own expression and passed in the
// launch parameters, so the angle pos * inv_freq is the same fp32 product as ref's; sincosf is
// CUDA's full-range one (a few ulp from glibc's), not __sinf, whose error grows with the angle.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace alloy::cuda {

namespace {

constexpr int kMaxHalf = 128;  // n_rot <= 256

struct InvFreq {
    float v[kMaxHalf];
};

InvFreq inv_freq(int n_rot, float base) {
    InvFreq f{};
    for (int i = 0; i < n_rot / 2; ++i) f.v[i] = 1.0f / std::pow(base, float(2 * i) / float(n_rot));
    return f;
}

void check(int64_t T, int n_heads, int head_dim, int n_rot, const char* op) {
    if (T < 0 || n_heads <= 0 || head_dim <= 0 || n_rot < 0 || n_rot % 2 || n_rot > head_dim || n_rot > 2 * kMaxHalf)
        throw Error(std::string(op) + ": bad shape (n_rot even, <= head_dim, <= 256)");
}

// One block per token, threads over (head, pair) in head-major order.
__global__ void rope_kernel(float* x, const int32_t* __restrict__ pos, int n_heads, int head_dim, int half,
                            const InvFreq f) {
    detail::pdl_entry();
    const int64_t t = blockIdx.x;
    const float p = float(pos[t]);
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        float s, c;
        sincosf(p * f.v[i], &s, &c);
        float* xh = x + (t * n_heads + h) * head_dim;
        const float a = xh[i], b = xh[i + half];
        xh[i] = a * c - b * s;
        xh[i + half] = a * s + b * c;
    }
}

// head_dim > 256: one block per (token, head), one thread per element of the head (blockDim = head_dim
// rounded up to a warp): the norm, then the rotation through shared memory (a pair's two
// elements belong to different threads).
__global__ void rms_norm_rope_kernel(const float* x, int64_t x_head_stride, const float* __restrict__ w, float* out,
                                     const int32_t* __restrict__ pos, int n_heads, int head_dim, int half, float eps,
                                     const InvFreq f) {
    detail::pdl_entry();
    extern __shared__ float y[];  // [head_dim]
    __shared__ float red[32];
    const int64_t row = blockIdx.x;  // t * n_heads + h
    const int64_t t = row / n_heads;
    const int i = threadIdx.x;
    const float a = i < head_dim ? x[row * x_head_stride + i] : 0.0f;
    const float ss = detail::block_sum_all(a * a, red);  // its barriers also order x's reads before out's writes
    const float scale = 1.0f / sqrtf(ss / float(head_dim) + eps);
    if (i < head_dim) y[i] = a * scale * (w ? w[i] : 1.0f);
    __syncthreads();
    float* o = out + row * head_dim;
    if (i < half) {
        float s, c;
        sincosf(float(pos[t]) * f.v[i], &s, &c);
        const float u = y[i], v = y[i + half];
        o[i] = u * c - v * s;
        o[i + half] = u * s + v * c;
    } else if (i >= 2 * half && i < head_dim) {
        o[i] = y[i];
    }
}

// head_dim <= 256: one warp per (token, head), 8 heads per block; lane l holds elements
// l + 32 e. The normalized row goes through the warp's slice of shared memory for the
// rotation (a pair's two elements can sit in different lanes).
constexpr int kRowsPerBlock = 8;
__global__ void __launch_bounds__(kRowsPerBlock * 32) rms_norm_rope_warp_kernel(
    const float* x, int64_t x_head_stride, const float* __restrict__ w, float* out, const int32_t* __restrict__ pos,
    int64_t rows, int n_heads, int head_dim, int half, float eps, const InvFreq f) {
    detail::pdl_entry();
    __shared__ float ys[kRowsPerBlock][256];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + warp;
    if (row >= rows) return;
    const int64_t t = row / n_heads;
    const float* xr = x + row * x_head_stride;
    float v[8];
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int i = lane + 32 * e;
        v[e] = i < head_dim ? xr[i] : 0.0f;
        ss = fmaf(v[e], v[e], ss);
    }
    ss = detail::warp_sum_all(ss);
    const float scale = 1.0f / sqrtf(ss / float(head_dim) + eps);
    float* y = ys[warp];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int i = lane + 32 * e;
        if (i < head_dim) y[i] = v[e] * scale * (w ? w[i] : 1.0f);
    }
    __syncwarp();  // also orders every lane's reads of x before any write of out (aliasing)
    float* o = out + row * head_dim;
    const float p = float(pos[t]);
    for (int i = lane; i < half; i += 32) {
        float s, c;
        sincosf(p * f.v[i], &s, &c);
        const float a = y[i], b = y[i + half];
        o[i] = a * c - b * s;
        o[i + half] = a * s + b * c;
    }
    for (int i = 2 * half + lane; i < head_dim; i += 32) o[i] = y[i];
}

}  // namespace

void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot, float base,
                  void* stream) {
    const char* op = "cuda::rope_partial";
    check(T, n_heads, head_dim, n_rot, op);
    if (T == 0 || n_rot == 0) return;
    const int half = n_rot / 2;
    const int threads = std::min(256, (n_heads * half + 31) / 32 * 32);
    detail::launch(op, rope_kernel, dim3(unsigned(T)), dim3(threads), 0, detail::as_stream(stream), x, pos, n_heads, head_dim, half,
                                                                        inv_freq(n_rot, base));
    ALLOY_CUDA_LAUNCHED(op);
}

void rms_norm_rope(const float* x, int64_t x_head_stride, const float* w, float* out, const int32_t* pos, int64_t T,
                   int n_heads, int head_dim, int n_rot, float base, float eps, void* stream) {
    const char* op = "cuda::rms_norm_rope";
    check(T, n_heads, head_dim, n_rot, op);
    if (head_dim > 1024 || x_head_stride < head_dim) throw Error(std::string(op) + ": head_dim <= 1024, stride >= head_dim");
    if (T == 0) return;
    // When out aliases x (stride == head_dim) each block reads its own row fully before
    // the barrier and writes only that row after it.
    if (head_dim <= 256) {
        const int64_t rows = T * n_heads;
        detail::launch(op, rms_norm_rope_warp_kernel, dim3(unsigned(detail::ceil_div(rows, kRowsPerBlock))), dim3(kRowsPerBlock * 32), 0, detail::as_stream(stream), x, x_head_stride, w, out, pos, rows, n_heads,
                                                                 head_dim, n_rot / 2, eps, inv_freq(n_rot, base));
        ALLOY_CUDA_LAUNCHED(op);
        return;
    }
    const int threads = (head_dim + 31) / 32 * 32;
    detail::launch(op, rms_norm_rope_kernel, dim3(unsigned(T * n_heads)), dim3(threads), size_t(head_dim) * 4, detail::as_stream(stream), 
        x, x_head_stride, w, out, pos, n_heads, head_dim, n_rot / 2, eps, inv_freq(n_rot, base));
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
