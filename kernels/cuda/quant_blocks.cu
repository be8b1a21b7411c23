// The split layout of block-quantized weights (kernels/cuda/quant_blocks.cuh): the split made
// once at upload, and the prefill panels' dequantization to bf16.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "alloy/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"

namespace alloy::cuda {

namespace {

using detail::BlockFormat;
using detail::ceil_div;

// GGUF's blocks [blocks] -> codes [blocks, code bytes] then heads [blocks, head bytes]; one
// thread a block, copied as 2-byte words (GGUF's alignment where every part is an even size),
// or bytes (MXFP4's 17-byte blocks).
template <GgmlType kType>
__global__ void split_blocks_kernel(const void* __restrict__ in_, int64_t blocks, void* __restrict__ out_) {
    detail::pdl_entry();
    using F = BlockFormat<kType>;
    using Word = std::conditional_t<F::kBytes % 2 == 0 && F::kHeadBytes % 2 == 0, unsigned short, unsigned char>;
    constexpr int kW = int(sizeof(Word));
    constexpr int kCode = detail::code_bytes<kType>() / kW, kHead = F::kHeadBytes / kW, kOff = F::kHeadOffset / kW;
    const Word* in = static_cast<const Word*>(in_);
    Word* out = static_cast<Word*>(out_);
    Word* heads = out + blocks * kCode;
    for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x) {
        const Word* blk = in + b * (F::kBytes / kW);
        for (int i = 0; i < kHead; ++i) heads[b * kHead + i] = blk[kOff + i];
        // the codes: the block without its head (a prefix or a suffix)
        const Word* code = blk + (kOff == 0 ? kHead : 0);
        for (int i = 0; i < kCode; ++i) out[b * kCode + i] = code[i];
    }
}

// One thread a 32-value unit of rows [r0, r0 + rows): 32 bf16 out.
template <GgmlType kType>
__global__ void blocks_to_bf16_kernel(const void* __restrict__ W, int64_t n_blocks, int64_t bpr, int64_t r0, int64_t rows,
                                      __nv_bfloat16* __restrict__ out) {
    detail::pdl_entry();
    using F = BlockFormat<kType>;
    constexpr int kUnits = F::kValues / 32;
    const detail::SplitMatrix<kType> m(W, n_blocks);
    const int64_t n_units = rows * bpr * kUnits;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_units; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t b = i / kUnits;  // block within the panel
        const int u = int(i % kUnits);
        const detail::Unit r = detail::load_unit<kType>(m, r0 * bpr + b, u);
        __nv_bfloat16* o = out + b * F::kValues;
        // each segment's 16 values as two 16-byte stores
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                uint32_t w[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const __nv_bfloat162 v = __floats2bfloat162_rn(detail::unit_value(r, s, 8 * h + 2 * j),
                                                                   detail::unit_value(r, s, 8 * h + 2 * j + 1));
                    w[j] = *reinterpret_cast<const uint32_t*>(&v);
                }
                *reinterpret_cast<uint4*>(o + r.off[s] + 8 * h) = make_uint4(w[0], w[1], w[2], w[3]);
            }
    }
}

}  // namespace

bool split_blocks_supported(GgmlType t) {
    return detail::with_block_type(t, [](auto) {});
}

WeightView split_blocks(const WeightView& gguf, void* out, void* stream) {
    const char* op = "cuda::split_blocks";
    if (gguf.layout != WeightLayout::Gguf || gguf.n_in <= 0 || gguf.n_out <= 0 || !gguf.data || !out)
        throw Error(std::string(op) + ": needs GGUF rows and an output");
    if (reinterpret_cast<uintptr_t>(gguf.data) % 2 || reinterpret_cast<uintptr_t>(out) % 16)
        throw Error(std::string(op) + ": input must be 2-byte and output 16-byte aligned");
    const TypeTraits& tr = type_traits(gguf.type);
    const bool ok = detail::with_block_type(gguf.type, [&](auto kt) {
        using F = BlockFormat<kt.value>;
        if (gguf.n_in % F::kValues || gguf.row_bytes != size_t(gguf.n_in / F::kValues) * F::kBytes)
            throw Error(std::string(op) + ": " + tr.name + " rows must be whole " + std::to_string(F::kBytes) + "-byte blocks");
        const int64_t blocks = gguf.n_out * (gguf.n_in / F::kValues);
        detail::launch(op, split_blocks_kernel<kt.value>, dim3(unsigned(std::min<int64_t>(ceil_div(blocks, 256), 16 * 1024))),
                       dim3(256), 0, detail::as_stream(stream), static_cast<const void*>(gguf.data), blocks, out);
    });
    if (!ok) throw Error(std::string(op) + ": " + tr.name + " has no split layout (" + kSplitBlockTypes + ")");
    ALLOY_CUDA_LAUNCHED(op);
    WeightView v = gguf;
    v.data = static_cast<const uint8_t*>(out);
    v.layout = WeightLayout::Split;
    return v;
}

namespace detail {

void blocks_to_bf16(const WeightView& W, int64_t r0, int64_t rows, void* out, cudaStream_t st, const char* op) {
    const bool ok = with_block_type(W.type, [&](auto kt) {
        using F = BlockFormat<kt.value>;
        const int64_t bpr = W.n_in / F::kValues;
        const int64_t units = rows * bpr * (F::kValues / 32);
        launch(op, blocks_to_bf16_kernel<kt.value>, dim3(unsigned(std::min<int64_t>(ceil_div(units, 256), 8 * 1024))),
               dim3(256), 0, st, static_cast<const void*>(W.data), W.n_out * bpr, bpr, r0, rows,
               static_cast<__nv_bfloat16*>(out));
    });
    if (!ok) throw Error(std::string(op) + ": no block dequantization for " + type_traits(W.type).name);
    ALLOY_CUDA_LAUNCHED(op);
}

}  // namespace detail

}  // namespace alloy::cuda
