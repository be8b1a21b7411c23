// KV cache store on CUDA (kernels/cuda/ops.h): fp32 rows -> F32 / F16 / BF16 cache elements
// with the bits of ref::kv_store (kernels/ref/kv_store.h). The conversions are the integer
// algorithms of alloy::fp32_to_fp16 / fp32_to_bf16 (format/quant.cpp) written again for the
// device, not the hardware converters: those agree on every finite value (round to nearest
// even, subnormal halves, overflow to inf) but give a canonical NaN, where ref keeps the sign
// and the payload's top bits (a quiet NaN). Memory-bound: 4 elements per thread when the
// pointers allow (16-byte loads, 8-byte stores), a grid-stride loop. F32 is a device copy.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "format/ggml_types.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/ref/kv_store.h"

namespace alloy::cuda {

namespace {

constexpr int kThreads = 256;

// alloy::fp32_to_fp16, line for line.
__device__ __forceinline__ uint16_t to_f16_bits(float f) {
    const uint32_t x = __float_as_uint(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7FFFFFFF;
    if (ax >= 0x7F800000) {
        if (ax == 0x7F800000) return sign | 0x7C00;
        return uint16_t(sign | 0x7E00 | ((ax >> 13) & 0x3FF));  // quiet NaN
    }
    if (ax >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds (to even) past 65504
    const int32_t e = int32_t(ax >> 23) - 127;
    if (e >= -14) {  // normal half: drop 13 mantissa bits, round to nearest even
        const uint32_t mant = ax & 0x7FFFFF;
        uint32_t h = (uint32_t(e + 15) << 10) | (mant >> 13);
        const uint32_t rem = mant & 0x1FFF;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is correct
        return uint16_t(sign | h);
    }
    if (ax <= 0x33000000) return sign;  // <= 2^-25: ties to the even value 0
    const uint32_t biased = ax >> 23;    // subnormal half: units of 2^-24; 102..112
    const uint32_t mant = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - biased;  // 14..24
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;  // may become the smallest normal: correct
    return uint16_t(sign | h);
}

// alloy::fp32_to_bf16, line for line.
__device__ __forceinline__ uint16_t to_bf16_bits(float f) {
    const uint32_t x = __float_as_uint(f);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return uint16_t((x >> 16) | 0x40);  // quiet NaN
    return uint16_t((x + 0x7FFF + ((x >> 16) & 1)) >> 16);
}

template <bool kBf16>
__device__ __forceinline__ uint16_t convert(float f) {
    if constexpr (kBf16) return to_bf16_bits(f);
    else return to_f16_bits(f);
}

// dst[i] = convert(src[i]); kVec: src 16-byte and dst 8-byte aligned, 4 per step, then the tail.
template <bool kBf16, bool kVec>
__global__ void __launch_bounds__(kThreads) kv_store_kernel(const float* __restrict__ src, uint16_t* __restrict__ dst,
                                                          int64_t n) {
    detail::pdl_entry();
    const int64_t stride = int64_t(gridDim.x) * kThreads;
    const int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x;
    int64_t done = 0;
    if constexpr (kVec) {
        const int64_t n4 = n / 4;
        for (int64_t j = i; j < n4; j += stride) {
            const float4 x = reinterpret_cast<const float4*>(src)[j];
            const uint32_t lo = uint32_t(convert<kBf16>(x.x)) | (uint32_t(convert<kBf16>(x.y)) << 16);
            const uint32_t hi = uint32_t(convert<kBf16>(x.z)) | (uint32_t(convert<kBf16>(x.w)) << 16);
            reinterpret_cast<uint2*>(dst)[j] = make_uint2(lo, hi);
        }
        done = n4 * 4;
    }
    for (int64_t j = done + i; j < n; j += stride) dst[j] = convert<kBf16>(src[j]);
}

// kv_store_rows: block (x, t) converts row t's elements x * kThreads * 4 ...; the row's cache
// and place come from the device arrays, so one recorded launch serves any depth and slot.
// kType: 0 F32 (copied), 1 F16, 2 BF16. cols % 4 == 0 and 16-byte aligned rows (checked on the
// host: cache rows of head_dim >= 64 elements, scratch rows from cudaMalloc + aligned offsets).
template <int kType>
__global__ void __launch_bounds__(kThreads) kv_store_rows_kernel(const float* __restrict__ src, int64_t cols,
                                                               void* const* __restrict__ caches,
                                                               const int32_t* __restrict__ slot,
                                                               const int32_t* __restrict__ pos) {
    detail::pdl_entry();
    const int64_t t = blockIdx.y;
    const int64_t j = (blockIdx.x * int64_t(kThreads) + threadIdx.x) * 4;
    if (j >= cols) return;
    const float4 x = *reinterpret_cast<const float4*>(src + t * cols + j);
    const int64_t at = int64_t(pos[t]) * cols + j;  // element index in the sequence's cache
    void* base = caches[slot[t]];
    if constexpr (kType == 0) {
        reinterpret_cast<float4*>(static_cast<float*>(base) + at)[0] = x;
    } else {
        constexpr bool bf = kType == 2;
        const uint32_t lo = uint32_t(convert<bf>(x.x)) | (uint32_t(convert<bf>(x.y)) << 16);
        const uint32_t hi = uint32_t(convert<bf>(x.z)) | (uint32_t(convert<bf>(x.w)) << 16);
        reinterpret_cast<uint2*>(static_cast<uint16_t*>(base) + at)[0] = make_uint2(lo, hi);
    }
}

}  // namespace

void kv_store_rows(const float* src, int64_t T, int64_t cols, void* const* caches, const int32_t* slot,
                   const int32_t* pos, GgmlType type, void* stream) {
    const char* op = "cuda::kv_store_rows";
    if (!ref::kv_type_supported(type))
        throw Error(std::string(op) + ": unsupported KV cache type " + std::string(type_traits(type).name));
    if (T < 0 || cols <= 0 || cols % 4 != 0 || T > 65535)
        throw Error(std::string(op) + ": T " + std::to_string(T) + " x cols " + std::to_string(cols) +
                    " (cols must be a positive multiple of 4, T at most 65535)");
    if (T == 0) return;
    if (!src || !caches || !slot || !pos) throw Error(std::string(op) + ": a null device array");
    if ((reinterpret_cast<uintptr_t>(src) & 15) != 0) throw Error(std::string(op) + ": src is not 16-byte aligned");
    const cudaStream_t st = detail::as_stream(stream);
    const dim3 grid(unsigned(detail::ceil_div(cols, int64_t(kThreads) * 4)), unsigned(T));
    switch (type) {
        case GgmlType::F32: detail::launch(op, kv_store_rows_kernel<0>, dim3(grid), dim3(kThreads), 0, st, src, cols, caches, slot, pos); break;
        case GgmlType::F16: detail::launch(op, kv_store_rows_kernel<1>, dim3(grid), dim3(kThreads), 0, st, src, cols, caches, slot, pos); break;
        default: detail::launch(op, kv_store_rows_kernel<2>, dim3(grid), dim3(kThreads), 0, st, src, cols, caches, slot, pos); break;
    }
    ALLOY_CUDA_LAUNCHED(op);
}

void kv_store(const float* src, void* dst, GgmlType type, int64_t n, void* stream) {
    const char* op = "cuda::kv_store";
    if (!ref::kv_type_supported(type))
        throw Error(std::string(op) + ": unsupported KV cache type " + std::string(type_traits(type).name));
    if (n < 0) throw Error(std::string(op) + ": n " + std::to_string(n) + " is negative");
    if (n == 0) return;
    if (src == nullptr || dst == nullptr) throw Error(std::string(op) + ": null " + (src ? "dst" : "src"));
    const cudaStream_t st = detail::as_stream(stream);
    if (type == GgmlType::F32) {
        ALLOY_CUDA_CHECK(op, cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, st));
        return;
    }
    if ((reinterpret_cast<uintptr_t>(dst) & 1) != 0) throw Error(std::string(op) + ": dst is not 2-byte aligned");
    if ((reinterpret_cast<uintptr_t>(src) & 3) != 0) throw Error(std::string(op) + ": src is not 4-byte aligned");
    const bool vec = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && (reinterpret_cast<uintptr_t>(dst) & 7) == 0;
    const int64_t per = vec ? 4 : 1;
    const unsigned grid = unsigned(std::max<int64_t>(1, std::min<int64_t>(detail::ceil_div(n, kThreads * per),
                                                                          int64_t(detail::sm_count()) * 16)));
    uint16_t* d = static_cast<uint16_t*>(dst);
    const bool bf16 = type == GgmlType::BF16;
    if (bf16 && vec) detail::launch(op, kv_store_kernel<true, true>, dim3(grid), dim3(kThreads), 0, st, src, d, n);
    else if (bf16) detail::launch(op, kv_store_kernel<true, false>, dim3(grid), dim3(kThreads), 0, st, src, d, n);
    else if (vec) detail::launch(op, kv_store_kernel<false, true>, dim3(grid), dim3(kThreads), 0, st, src, d, n);
    else detail::launch(op, kv_store_kernel<false, false>, dim3(grid), dim3(kThreads), 0, st, src, d, n);
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
