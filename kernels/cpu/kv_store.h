// KV cache store on the CPU: src (fp32 K or V rows of this call) -> cache rows of type F32 or
// F16, same contract as ref::kv_store (kernels/ref/kv_store.h) and bit-identical to it: F16 is
// round to nearest even (vcvtps2ph with _MM_FROUND_TO_NEAREST_INT == alloy::fp32_to_fp16,
// including subnormal halves, overflow to inf and NaN).
#pragma once
#include <cstdint>

#include "format/ggml_types.h"
#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// dst[0..n) = src[0..n) as `type` (F32, F16 or BF16; throws otherwise). Large n runs on the pool.
void kv_store(const float* src, void* dst, GgmlType type, int64_t n);
// Same on an explicit ISA path (tests); on Avx2, f16 converts with F16C and bf16 runs the
// portable path.
void kv_store(const float* src, void* dst, GgmlType type, int64_t n, Isa isa);

}  // namespace alloy::cpu
