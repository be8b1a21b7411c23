#include "kernels/cpu/kv_store.h"

#include <cstring>
#include <string>

#include "alloy/error.h"
#include "format/quant.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/vec_math_avx512.h"

namespace alloy::cpu {
namespace {

void store_f16_scalar(const float* src, uint16_t* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

// 32 elements per iteration in two independent conversions; masked tail.
ALLOY_TARGET_AVX512 void store_f16_avx512(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i a = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        const __m256i b = _mm512_cvtps_ph(_mm512_loadu_ps(src + i + 16), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), a);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16), b);
    }
    for (; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
        const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(dst + i, k, h);
    }
}

// F16C: 8 elements per conversion (the same rounding: nearest even, subnormals, inf, NaN).
ALLOY_TARGET_AVX2 void store_f16_avx2(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    store_f16_scalar(src + i, dst + i, n - i);
}

}  // namespace

void kv_store(const float* src, void* dst, GgmlType type, int64_t n, Isa isa) {
    if (type == GgmlType::F32) {
        for_chunks(n, 1, [&](int64_t b, int64_t e) {
            std::memcpy(static_cast<float*>(dst) + b, src + b, size_t(e - b) * sizeof(float));
        });
        return;
    }
    if (type == GgmlType::BF16) {  // the matmul's activation converters (the same rounding)
        auto fn = isa >= Isa::Avx512 ? mm::to_bf16_avx512 : mm::to_bf16_scalar;
        uint16_t* d = static_cast<uint16_t*>(dst);
        for_chunks(n, 1, [&](int64_t b, int64_t e) { fn(src + b, e - b, d + b); });
        return;
    }
    if (type != GgmlType::F16)
        throw Error("kv_store: unsupported KV cache type " + std::string(type_traits(type).name));
    auto fn = isa >= Isa::Avx512 ? store_f16_avx512 : isa >= Isa::Avx2 ? store_f16_avx2 : store_f16_scalar;
    uint16_t* d = static_cast<uint16_t*>(dst);
    for_chunks(n, 1, [&](int64_t b, int64_t e) { fn(src + b, d + b, e - b); });
}

void kv_store(const float* src, void* dst, GgmlType type, int64_t n) { kv_store(src, dst, type, n, active_isa()); }

}  // namespace alloy::cpu
