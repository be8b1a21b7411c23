// Serial gated delta rule (decode, verification) on CUDA. Math: spec/GDN.md section 1, in
// the state layout of kernels/ref/gdn.h ([seq, H_v, d_v, d_k]: value column j of a head is
// d_k contiguous floats). Per token and column j:
//   sk = S_j . k, sq = S_j . q
//   delta_j = beta (v_j - alpha sk)
//   o_j = alpha sq + delta_j (k . q)
//   S_j' = alpha S_j + delta_j k
// A warp owns kColsPerWarp columns of one (sequence, head): each lane holds d_k / 32 elements
// of each (in float4 runs when d_k % 4 == 0, else strided), for every token of the sequence, so the state
// moves between HBM and registers once per call. Dot products reduce down the warp in a fixed
// tree and lane 0's sum is broadcast, so every lane updates with the same delta and the bits
// never depend on the call's token count.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "alloy/error.h"
#include "kernels/cuda/gdn.h"

namespace alloy::cuda {

namespace {

constexpr int kMaxDk = 256;               // 8 elements per lane
constexpr int kElems = kMaxDk / 32;
constexpr int kWarps = 4;                 // per block
// Columns per warp. 4 (more bytes in flight per warp) measured slower at B = 32 on the H200
// (H_v 16/32/48: 18.2/48.9/71.8 us against 16.9/47.0/67.9) and gives B = 1 half the blocks.
constexpr int kColsPerWarp = 2;

// Sum over the warp, in a fixed tree, returned to every lane (lane 0's value).
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    return __shfl_sync(0xffffffffu, x, 0);
}

// Element e of lane `lane` (e < kElems): strided (lane + 32 e: any d_k), or in float4 runs
// (128 (e / 4) + 4 lane + e % 4: d_k % 4 == 0, each lane moves 16 bytes per access, so a
// warp reads a 512-byte column of the state in one instruction).
template <bool kVec>
__device__ __forceinline__ int elem_index(int lane, int e) {
    return kVec ? 128 * (e / 4) + 4 * lane + (e % 4) : lane + 32 * e;
}

// kElems values of a d_k-long row into registers (zero past d_k).
template <bool kVec>
__device__ __forceinline__ void load_row(const float* __restrict__ p, int d_k, int lane, float (&x)[kElems]) {
    if constexpr (kVec) {
#pragma unroll
        for (int e4 = 0; e4 < kElems / 4; ++e4) {
            const int i = 128 * e4 + 4 * lane;
            const float4 f = i < d_k ? *reinterpret_cast<const float4*>(p + i) : make_float4(0, 0, 0, 0);
            x[4 * e4] = f.x, x[4 * e4 + 1] = f.y, x[4 * e4 + 2] = f.z, x[4 * e4 + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
            const int i = lane + 32 * e;
            x[e] = i < d_k ? p[i] : 0.0f;
        }
    }
}

template <bool kVec>
__device__ __forceinline__ void store_row(float* __restrict__ p, int d_k, int lane, const float (&x)[kElems]) {
    if constexpr (kVec) {
#pragma unroll
        for (int e4 = 0; e4 < kElems / 4; ++e4) {
            const int i = 128 * e4 + 4 * lane;
            if (i < d_k) *reinterpret_cast<float4*>(p + i) = make_float4(x[4 * e4], x[4 * e4 + 1], x[4 * e4 + 2], x[4 * e4 + 3]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
            const int i = lane + 32 * e;
            if (i < d_k) p[i] = x[e];
        }
    }
}

template <bool kVec>
__global__ void __launch_bounds__(kWarps * 32) delta_serial_kernel(
    ref::GdnShape sh, const int32_t* __restrict__ offs, const float* __restrict__ q, const float* __restrict__ k,
    const float* __restrict__ v, const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ state,
    float* __restrict__ out) {
    const int seq = blockIdx.z, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = (blockIdx.x * kWarps + warp) * kColsPerWarp;
    const int t0 = offs[seq], t1 = offs[seq + 1];
    if (t0 == t1 || j0 >= sh.d_v) return;
    const int d_k = sh.d_k, d_v = sh.d_v, H_v = sh.H_v;
    const int kh = sh.tiled ? h % sh.H_k : h / (H_v / sh.H_k);  // ref::GdnShape::key_head (host-only)
    float* S = state + ((size_t)seq * H_v + h) * d_v * d_k;

    float s[kColsPerWarp][kElems];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
        if (j0 + c < d_v) load_row<kVec>(S + (size_t)(j0 + c) * d_k, d_k, lane, s[c]);
        else
#pragma unroll
            for (int e = 0; e < kElems; ++e) s[c][e] = 0.0f;
    }

    for (int t = t0; t < t1; ++t) {
        const float* qt = q + ((size_t)t * sh.H_k + kh) * d_k;
        const float* kt = k + ((size_t)t * sh.H_k + kh) * d_k;
        float kv[kElems], qv[kElems], kq = 0.0f;
        load_row<kVec>(kt, d_k, lane, kv);
        load_row<kVec>(qt, d_k, lane, qv);
#pragma unroll
        for (int e = 0; e < kElems; ++e) kq += kv[e] * qv[e];
        kq = warp_sum(kq);
        const float alpha = expf(g[(size_t)t * H_v + h]), b = beta[(size_t)t * H_v + h];
#pragma unroll
        for (int c = 0; c < kColsPerWarp; ++c) {
            const int j = j0 + c;
            if (j >= d_v) break;
            float sk = 0.0f, sq = 0.0f;
#pragma unroll
            for (int e = 0; e < kElems; ++e) {
                sk += s[c][e] * kv[e];
                sq += s[c][e] * qv[e];
            }
            sk = warp_sum(sk);
            sq = warp_sum(sq);
            const float delta = b * (v[((size_t)t * H_v + h) * d_v + j] - alpha * sk);
            if (lane == 0) out[((size_t)t * H_v + h) * d_v + j] = alpha * sq + delta * kq;
#pragma unroll
            for (int e = 0; e < kElems; ++e) s[c][e] = alpha * s[c][e] + delta * kv[e];
        }
    }

#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c)
        if (j0 + c < d_v) store_row<kVec>(S + (size_t)(j0 + c) * d_k, d_k, lane, s[c]);
}

}  // namespace

bool device_available() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void gdn_delta_serial(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                      const float* k, const float* v, const float* g, const float* beta, float* state, float* out,
                      void* stream) {
    const char* op = "cuda::gdn_delta_serial";
    if (shape.H_k <= 0 || shape.H_v <= 0 || shape.H_v % shape.H_k || shape.d_k <= 0 || shape.d_v <= 0)
        throw Error(std::string(op) + ": invalid head shape (H_k " + std::to_string(shape.H_k) + ", H_v " +
                    std::to_string(shape.H_v) + ", d_k " + std::to_string(shape.d_k) + ", d_v " +
                    std::to_string(shape.d_v) + ")");
    if (shape.d_k > kMaxDk) throw Error(std::string(op) + ": d_k " + std::to_string(shape.d_k) + " > " + std::to_string(kMaxDk));
    if (n_seqs <= 0) return;
    if (n_seqs > 65535) throw Error(std::string(op) + ": more than 65535 sequences in one call");
    // float4 accesses when every row starts 16-byte aligned (cudaMalloc'd arrays, d_k % 4 == 0).
    auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
    const bool vec = shape.d_k % 4 == 0 && aligned(q) && aligned(k) && aligned(state);
    const int cols_per_block = kColsPerWarp * kWarps;
    const dim3 grid((shape.d_v + cols_per_block - 1) / cols_per_block, shape.H_v, n_seqs);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (vec)
        delta_serial_kernel<true><<<grid, kWarps * 32, 0, st>>>(shape, seq_offsets, q, k, v, g, beta, state, out);
    else
        delta_serial_kernel<false><<<grid, kWarps * 32, 0, st>>>(shape, seq_offsets, q, k, v, g, beta, state, out);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw Error(std::string(op) + ": launch failed: " + cudaGetErrorString(err));
}

}  // namespace alloy::cuda
