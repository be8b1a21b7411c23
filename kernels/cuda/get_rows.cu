// The embedding gather on CUDA (kernels/cuda/ops.h): out[t] = dequantized row ids[t] of a
// table in F32, F16, BF16 or a split block type (as the model's "embed" step does with
// dequantize_row). One block per token; each thread converts whole elements (block types: whole
// 32-value units, quant_blocks.cuh, with dequantize_row's products), so every type is exact.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"

namespace alloy::cuda {

namespace {

constexpr int kThreads = 256;

template <GgmlType kType>
__global__ void __launch_bounds__(kThreads) get_rows_kernel(const uint8_t* __restrict__ table, size_t row_bytes,
                                                             int64_t n_rows, const int32_t* __restrict__ ids,
                                                             float* __restrict__ out, int64_t n) {
    detail::pdl_entry();
    const int64_t t = blockIdx.x;
    const int64_t id = ids[t];
    const uint8_t* row = table + size_t(id) * row_bytes;
    float* o = out + t * n;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
        float v;
        if constexpr (kType == GgmlType::F32) {
            v = reinterpret_cast<const float*>(row)[i];
        } else if constexpr (kType == GgmlType::F16) {
            v = __half2float(__ushort_as_half(reinterpret_cast<const unsigned short*>(row)[i]));
        } else {
            static_assert(kType == GgmlType::BF16, "16-bit and 32-bit floats only");
            v = __uint_as_float(uint32_t(reinterpret_cast<const unsigned short*>(row)[i]) << 16);
        }
        o[i] = v;
    }
}

// Block types: thread i takes unit i of the row (32 values).
template <GgmlType kType>
__global__ void __launch_bounds__(kThreads) get_block_rows_kernel(const void* __restrict__ table, int64_t n_rows,
                                                                   const int32_t* __restrict__ ids,
                                                                   float* __restrict__ out, int64_t n) {
    detail::pdl_entry();
    using F = detail::BlockFormat<kType>;
    constexpr int kUnits = F::kValues / 32;
    const int64_t bpr = n / F::kValues;
    const detail::SplitMatrix<kType> m(table, n_rows * bpr);
    const int64_t t = blockIdx.x;
    const int64_t id = ids[t];
    float* o = out + t * n;
    for (int64_t i = threadIdx.x; i < n / 32; i += kThreads) {
        const int64_t b = i / kUnits;
        const detail::Unit r = detail::load_unit<kType>(m, id * bpr + b, int(i % kUnits));
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int j = 0; j < 16; ++j) o[b * F::kValues + r.off[s] + j] = detail::unit_value(r, s, j);
    }
}

}  // namespace

void get_rows(const WeightView& table, const int32_t* ids, float* out, int64_t T, void* stream) {
    const char* op = "cuda::get_rows";
    if (T < 0 || table.n_in <= 0 || T > 0x7fffffff) throw Error(std::string(op) + ": bad shape");
    if (T == 0) return;
    cudaStream_t st = detail::as_stream(stream);
    const unsigned grid = unsigned(T);
    const int64_t n = table.n_in;
    switch (table.type) {
        case GgmlType::F32:
            detail::launch(op, get_rows_kernel<GgmlType::F32>, dim3(grid), dim3(kThreads), 0, st, table.data, table.row_bytes, table.n_out, ids, out, n);
            break;
        case GgmlType::F16:
            detail::launch(op, get_rows_kernel<GgmlType::F16>, dim3(grid), dim3(kThreads), 0, st, table.data, table.row_bytes, table.n_out, ids, out, n);
            break;
        case GgmlType::BF16:
            detail::launch(op, get_rows_kernel<GgmlType::BF16>, dim3(grid), dim3(kThreads), 0, st, table.data, table.row_bytes, table.n_out, ids, out, n);
            break;
        default: {
            const bool ok = detail::with_block_type(table.type, [&](auto kt) {
                if (n % detail::BlockFormat<kt.value>::kValues || table.layout != WeightLayout::Split)
                    throw Error(std::string(op) + ": a " + type_traits(table.type).name +
                                " table on the device must be whole blocks, split first (cuda::split_blocks)");
                detail::launch(op, get_block_rows_kernel<kt.value>, dim3(grid), dim3(kThreads), 0, st,
                               static_cast<const void*>(table.data), table.n_out, ids, out, n);
            });
            if (!ok)
                throw Error(std::string(op) + ": table type " + type_traits(table.type).name +
                            " not supported (F32, F16, BF16, " + kSplitBlockTypes + ")");
        }
    }
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
