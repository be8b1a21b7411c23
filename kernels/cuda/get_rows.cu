// The embedding gather on CUDA (kernels/cuda/ops.h): out[t] = dequantized row ids[t] of a
// table in F32, F16, BF16 or split Q8_0 (as the model's "embed" step does with dequantize_row).
// One block per token; each thread converts whole elements, so every type is exact.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

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
        } else if constexpr (kType == GgmlType::BF16) {
            v = __uint_as_float(uint32_t(reinterpret_cast<const unsigned short*>(row)[i]) << 16);
        } else {  // Q8_0, split (cuda::split_q8): quants [n_rows, n], then scales [n_rows, n / 32]
            const auto* S = reinterpret_cast<const unsigned short*>(table + n_rows * n);
            const float d = __half2float(__ushort_as_half(S[id * (n / 32) + i / 32]));
            v = float(reinterpret_cast<const int8_t*>(table)[id * n + i]) * d;
        }
        o[i] = v;
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
        case GgmlType::Q8_0:
            if (n % 32) throw Error(std::string(op) + ": Q8_0 rows must be whole blocks");
            if (table.layout != WeightLayout::Q8Split)
                throw Error(std::string(op) + ": a Q8_0 table on the device must be split first (cuda::split_q8)");
            detail::launch(op, get_rows_kernel<GgmlType::Q8_0>, dim3(grid), dim3(kThreads), 0, st, table.data, table.row_bytes, table.n_out, ids, out, n);
            break;
        default:
            throw Error(std::string(op) + ": table type " + std::to_string(int(table.type)) +
                        " not supported (F32, F16, BF16, Q8_0)");
    }
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace alloy::cuda
