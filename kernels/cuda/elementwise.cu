// Elementwise ops on CUDA (kernels/cuda/ops.h): residual add, SwiGLU, the attention output
// gate. Memory-bound: float4 accesses where the pointers and n allow, a grid-stride loop;
// the activations use ref's formulas (kernels/ref/activations.h) with full-precision expf.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace alloy::cuda {

namespace {

constexpr int kThreads = 256;

using detail::sigmoid;

struct AddOp {
    __device__ float operator()(float x, float y) const { return x + y; }
};
struct SwiGluOp {  // (gate, up)
    __device__ float operator()(float g, float u) const { return g * sigmoid(g) * u; }
};
struct GateOp {  // (x, g)
    __device__ float operator()(float x, float g) const { return x * sigmoid(g); }
};

// out[i] = f(a[i], b[i]) over n, 4 at a time (kVec: every pointer 16-byte aligned).
template <class F, bool kVec>
__global__ void __launch_bounds__(kThreads) binary_kernel(const float* a, const float* b, float* out, int64_t n, F f) {
    detail::pdl_entry();
    const int64_t stride = int64_t(gridDim.x) * kThreads;
    int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x;
    if constexpr (kVec) {
        const int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            const float4 x = reinterpret_cast<const float4*>(a)[j], y = reinterpret_cast<const float4*>(b)[j];
            reinterpret_cast<float4*>(out)[j] = make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w));
        }
        for (int64_t j = n4 * 4 + i; j < n; j += stride) out[j] = f(a[j], b[j]);
    } else {
        for (int64_t j = i; j < n; j += stride) out[j] = f(a[j], b[j]);
    }
}

template <class F>
void binary(const float* a, const float* b, float* out, int64_t n, cudaStream_t st, const char* op) {
    if (n < 0) throw Error(std::string(op) + ": negative n");
    if (n == 0) return;
    const bool vec = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                       reinterpret_cast<uintptr_t>(out)) & 15) == 0;
    const int64_t per = vec ? 4 : 1;
    const unsigned grid = unsigned(std::min<int64_t>(detail::ceil_div(n, kThreads * per), 132 * 16));
    if (vec)
        detail::launch(op, binary_kernel<F, true>, dim3(grid), dim3(kThreads), 0, st, a, b, out, n, F{});
    else
        detail::launch(op, binary_kernel<F, false>, dim3(grid), dim3(kThreads), 0, st, a, b, out, n, F{});
    ALLOY_CUDA_LAUNCHED(op);
}

// x [rows, n] *= sigmoid(g row r at g + r g_stride), over the flattened rows (a row of one
// head is only 256 floats: a block per row left the grid mostly launch overhead), in float4
// units when n, g_stride and the pointers allow.
template <bool kVec>
__global__ void __launch_bounds__(kThreads) gate_rows_kernel(float* x, const float* __restrict__ g, int64_t rows,
                                                             int64_t n, int64_t g_stride) {
    detail::pdl_entry();
    constexpr int V = kVec ? 4 : 1;
    const int64_t nv = n / V, total = rows * nv;
    for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
        const int64_t r = i / nv, c = (i - r * nv) * V;
        if constexpr (kVec) {
            float4 v = reinterpret_cast<float4*>(x)[i];
            const float4 gv = *reinterpret_cast<const float4*>(g + r * g_stride + c);
            v.x *= sigmoid(gv.x), v.y *= sigmoid(gv.y), v.z *= sigmoid(gv.z), v.w *= sigmoid(gv.w);
            reinterpret_cast<float4*>(x)[i] = v;
        } else {
            x[i] *= sigmoid(g[r * g_stride + c]);
        }
    }
}

// The packing forms (ops.h MatmulInput): each warp takes blocks of 32 consecutive values, one
// per lane, computes them with the op and stores them (fp32 unless pk.b_only), their bf16 copy
// (pk.b) and their quantization (pk.q). rows x n values, block b of row r at value r n + 32 b;
// the op's inputs by (row, column).
template <class Value>
__global__ void __launch_bounds__(kThreads) packed_rows_kernel(float* out, int64_t rows, int64_t n, MatmulInput pk,
                                                               Value f) {
    detail::pdl_entry();
    const int lane = threadIdx.x & 31;
    const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
    const int64_t nb = n / 32, total = rows * nb;
    __nv_bfloat16* bf = reinterpret_cast<__nv_bfloat16*>(pk.b);
    const bool fp32 = !(bf && pk.b_only);
    for (int64_t b = (blockIdx.x * int64_t(kThreads) + threadIdx.x) / 32; b < total; b += warps) {
        const int64_t r = b / nb, c = (b - r * nb) * 32 + lane;
        const float v = f(r, c);
        if (fp32) out[r * n + c] = v;
        if (bf) bf[r * n + c] = __float2bfloat16_rn(v);
        if (pk.q) detail::quantize_block32(v, lane, pk.q + r * n + c - lane, pk.d + b);
    }
}

template <class Value>
void packed_rows(float* out, int64_t rows, int64_t n, const MatmulInput& pk, Value f, cudaStream_t st, const char* op) {
    if (n % 32 || (pk.q && !pk.d)) throw Error(std::string(op) + ": a MatmulInput needs whole blocks of 32 (and d with q)");
    const unsigned grid = unsigned(std::min<int64_t>(detail::ceil_div(rows * (n / 32), kThreads / 32), 132 * 16));
    detail::launch(op, packed_rows_kernel<Value>, dim3(grid), dim3(kThreads), 0, st, out, rows, n, pk, f);
    ALLOY_CUDA_LAUNCHED(op);
}

struct SwiGluAt {
    const float *g, *u;
    int64_t n;
    __device__ float operator()(int64_t r, int64_t c) const { return SwiGluOp{}(g[r * n + c], u[r * n + c]); }
};
struct GateAt {
    const float *x, *g;
    int64_t n, g_stride;
    __device__ float operator()(int64_t r, int64_t c) const { return GateOp{}(x[r * n + c], g[r * g_stride + c]); }
};

}  // namespace

void add(float* x, const float* y, int64_t n, void* stream) {
    binary<AddOp>(x, y, x, n, detail::as_stream(stream), "cuda::add");
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, void* stream, MatmulInput packed) {
    if ((packed.q || packed.b) && n > 0) {  // out may alias gate or up: each value is read by the lane that writes it
        packed_rows(out, 1, n, packed, SwiGluAt{gate, up, n}, detail::as_stream(stream), "cuda::swiglu");
        return;
    }
    binary<SwiGluOp>(gate, up, out, n, detail::as_stream(stream), "cuda::swiglu");
}

void sigmoid_gate_mul(float* x, const float* g, int64_t n, void* stream) {
    binary<GateOp>(x, g, x, n, detail::as_stream(stream), "cuda::sigmoid_gate_mul");
}

void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride, void* stream,
                      MatmulInput packed) {
    const char* op = "cuda::sigmoid_gate_mul";
    if (rows < 0 || n < 0 || g_stride < n) throw Error(std::string(op) + ": bad shape");
    if (rows == 0 || n == 0) return;
    if (packed.q || packed.b) {
        packed_rows(x, rows, n, packed, GateAt{x, g, n, g_stride}, detail::as_stream(stream), op);
        return;
    }
    const bool vec = n % 4 == 0 && g_stride % 4 == 0 &&
                     ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(g)) & 15) == 0;
    const int64_t units = rows * (vec ? n / 4 : n);
    const unsigned grid = unsigned(std::min<int64_t>(detail::ceil_div(units, kThreads), 132 * 16));
    if (vec)
        detail::launch(op, gate_rows_kernel<true>, dim3(grid), dim3(kThreads), 0, detail::as_stream(stream), x, g, rows, n, g_stride);
    else
        detail::launch(op, gate_rows_kernel<false>, dim3(grid), dim3(kThreads), 0, detail::as_stream(stream), x, g, rows, n, g_stride);
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
