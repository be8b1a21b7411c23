// A view of one weight matrix as GGUF stores it: n_out rows of n_in elements each, every row
// in the tensor's own ggml type (PyTorch's [out, in] Linear layout, ggml ne = {n_in, n_out}).
#pragma once
#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"

namespace alloy {

// How a view's bytes are arranged. Gguf: n_out rows of row_bytes each, as the file stores them
// (everything on the CPU). Split (block-quantized types on the CUDA backend only, made by
// cuda::split_blocks; kernels/cuda/quant_blocks.cuh): the same n_out * row_bytes bytes with
// every block's code bytes first, [n_out, blocks a row, code bytes] (16-byte multiples), then
// every block's scales, [n_out, blocks a row, the rest] (Q8_0: the int8 quants [n_out, n_in],
// then the f16 scales [n_out, n_in / 32]); row() does not apply.
// KqRows16 (Q4_K, Q5_K, Q6_K and IQ4_XS on the CPU backend, repacked at load: kernels/cpu/matmul_kquant.h):
// groups of 16 rows interleaved so that SIMD lanes are rows, the same n_out * row_bytes bytes;
// row() applies only to the last n_out % 16 rows (cpu::weight_row gives any row's GGUF bytes).
// Q8Rows16 (Q8_0 on the CPU backend with AVX512-VNNI, repacked at load: kernels/cpu/matmul_kernels.h
// "Q8Rows16"): each group of 16 rows block-major, per 32-column block the 16 f16 scales then 8
// k-quads of the 16 rows (64 bytes each, codes stored as u8 = w ^ 0x80); the last n_out % 16 rows as GGUF.
enum class WeightLayout : uint8_t { Gguf, Split, KqRows16, Q8Rows16 };

struct WeightView {
    GgmlType type = GgmlType::F32;
    int64_t n_in = 0;    // ne[0]: elements per row
    int64_t n_out = 0;   // ne[1]: rows
    const uint8_t* data = nullptr;
    size_t row_bytes = 0;  // GGUF's bytes per row (also for Split: the matrix's size / n_out)
    WeightLayout layout = WeightLayout::Gguf;
    const uint8_t* row(int64_t r) const { return data + size_t(r) * row_bytes; }
};

}  // namespace alloy
