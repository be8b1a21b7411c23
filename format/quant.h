// Scalar conversions and (de)quantization of one row, for every type we read or write.
// Reference quality; the fast matmul paths in kernels/cpu read blocks directly.
#pragma once
#include <cstdint>
#include "format/ggml_types.h"

namespace alloy {

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);  // round to nearest even
inline float bf16_to_fp32(uint16_t h) {
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
uint16_t fp32_to_bf16(float f);  // round to nearest even, NaN kept NaN

// Q8_0 block: f16 scale + 32 int8.
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// The 16 values of the IQ4_NL / IQ4_XS codebook (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4's 16 FP4 (E2M1) values times 2, as int8 (ggml's kvalues_mxfp4); a block's scale is
// mxfp4_half_scale(e) = 2^(e - 128), so value = kMxfp4Values[code] * 2^(e - 128).
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
float mxfp4_half_scale(uint8_t e);

// dst[0..n) = dequantized src row of type t; n a multiple of the type's block size.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);
// dst = quantized row of type t, as ggml's reference quantizer for t writes it (no importance
// matrix): every type we read.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace alloy
