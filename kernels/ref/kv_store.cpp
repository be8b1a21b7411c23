#include "kernels/ref/kv_store.h"

#include <cstring>

#include "alloy/error.h"
#include "format/quant.h"

namespace alloy::ref {

void kv_store(const float* src, void* dst, GgmlType type, int64_t n) {
    if (type == GgmlType::F32) {
        std::memcpy(dst, src, size_t(n) * sizeof(float));
    } else if (type == GgmlType::F16) {
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
    } else if (type == GgmlType::BF16) {
        uint16_t* d = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
    } else {
        throw Error("kv_store: unsupported KV cache type " + std::string(type_traits(type).name));
    }
}

float kv_load(const void* src, GgmlType type, int64_t i) {
    if (type == GgmlType::F16) return fp16_to_fp32(static_cast<const uint16_t*>(src)[i]);
    if (type == GgmlType::BF16) return bf16_to_fp32(static_cast<const uint16_t*>(src)[i]);
    return static_cast<const float*>(src)[i];
}

}  // namespace alloy::ref
