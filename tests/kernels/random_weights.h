// Random inputs of the matmul-based kernel tests (test_matmul.cpp, test_moe.cpp): weights of
// any GGUF type and the relative L2 error the tolerances are stated in.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "format/quant.h"

namespace alloy {

// ||a - b|| / ||b||
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

// Random weights of any type: quantized from N(0, 1) where we have a quantizer, else random
// bytes with sane f16 scales (every bit pattern of the quants is a valid block).
inline std::vector<uint8_t> random_weights(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
    const size_t rb = row_bytes(type, n_in);
    std::vector<uint8_t> bytes(rb * size_t(n_out));
    if (type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16 && type != GgmlType::Q8_0) {
        for (auto& b : bytes) b = uint8_t(rng());
        const size_t blk = type_traits(type).block_bytes;
        for (size_t off = 0; off < bytes.size(); off += blk) {
            const uint16_t d = fp32_to_fp16(0.01f * float(1 + rng() % 7));
            if (type == GgmlType::Q6_K) std::memcpy(&bytes[off + blk - 2], &d, 2);
            else std::memcpy(&bytes[off], &d, 2);
            if (type == GgmlType::Q4_K || type == GgmlType::Q5_K || type == GgmlType::Q5_1) std::memcpy(&bytes[off + 2], &d, 2);  // dmin / Q5_1's min
            if (type == GgmlType::MXFP4) bytes[off] = uint8_t(120 + rng() % 8);  // e8m0: scales 2^-8 .. 2^-1
        }
    } else {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> w(static_cast<size_t>(n_in));
        for (int64_t r = 0; r < n_out; ++r) {
            for (auto& v : w) v = nd(rng);
            quantize_row(type, w.data(), bytes.data() + size_t(r) * rb, n_in);
        }
    }
    return bytes;
}

}  // namespace alloy
