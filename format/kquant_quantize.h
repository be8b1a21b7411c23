// Quantizers for the K-quant and IQ4 block types, as ggml's reference quantizers without an
// importance matrix (what llama-quantize runs when no --imatrix is given), so a file that
// `alloy quantize` writes carries the same bytes as llama-quantize's. Used by quantize_row
// (format/quant.h); block layouts in spec/GGUF.md section 2.
//
// The arithmetic is float, in ggml's order, with no FMA contraction (this file is built for
// the baseline ISA, as ggml-base is): any reordering changes roundings and so the chosen
// levels.
#pragma once
#include <cstdint>

namespace alloy::detail {

// Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes (spec/GGUF.md "Q4_K").
void q4k_scale_min(const uint8_t* s12, int j, int& sc, int& m);

// Each takes nb super-blocks of 256 values (32 for IQ4_NL) and writes nb blocks.
void quantize_q4_k(const float* x, uint8_t* dst, int64_t nb);   // 144-byte blocks
void quantize_q5_k(const float* x, uint8_t* dst, int64_t nb);   // 176-byte blocks
void quantize_q6_k(const float* x, uint8_t* dst, int64_t nb);   // 210-byte blocks
void quantize_iq4_xs(const float* x, uint8_t* dst, int64_t nb); // 136-byte blocks
void quantize_iq4_nl(const float* x, uint8_t* dst, int64_t nb); // 18-byte blocks of 32

}  // namespace alloy::detail
