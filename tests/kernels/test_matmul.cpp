// matmul: the CPU kernel (every ISA path this machine has) against the reference, for every
// weight type, on random inputs with odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "format/quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/ref/matmul.h"

namespace alloy {
namespace {

struct Case { GgmlType type; int64_t n_in, n_out, T; };

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

TEST(Matmul, CpuMatchesReferenceForEveryType) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const Case cases[] = {
        {GgmlType::F32, 37, 19, 5}, {GgmlType::F32, 1, 3, 1},     {GgmlType::F16, 64, 33, 7},
        {GgmlType::BF16, 96, 17, 3}, {GgmlType::Q8_0, 64, 35, 9}, {GgmlType::Q8_0, 1024, 16, 1},
        {GgmlType::Q4_0, 128, 21, 4}, {GgmlType::Q4_K, 256, 13, 3}, {GgmlType::Q6_K, 512, 9, 2},
    };
    for (const Case& c : cases) {
        const size_t rb = row_bytes(c.type, c.n_in);
        std::vector<uint8_t> bytes(rb * size_t(c.n_out));
        if (c.type == GgmlType::Q4_0 || c.type == GgmlType::Q4_K || c.type == GgmlType::Q6_K) {
            // No quantizer for these: random bytes are valid blocks once the f16 scales are sane.
            for (auto& b : bytes) b = uint8_t(rng());
            const size_t blk = type_traits(c.type).block_bytes;
            for (size_t off = 0; off < bytes.size(); off += blk) {
                const uint16_t d = fp32_to_fp16(0.01f * (1 + rng() % 7));
                if (c.type == GgmlType::Q6_K) std::memcpy(&bytes[off + blk - 2], &d, 2);
                else std::memcpy(&bytes[off], &d, 2);
                if (c.type == GgmlType::Q4_K) std::memcpy(&bytes[off + 2], &d, 2);
            }
        } else {
            std::vector<float> w(size_t(c.n_in));
            for (int64_t r = 0; r < c.n_out; ++r) {
                for (auto& v : w) v = nd(rng);
                quantize_row(c.type, w.data(), bytes.data() + size_t(r) * rb, c.n_in);
            }
        }
        WeightView W{c.type, c.n_in, c.n_out, bytes.data(), rb};
        std::vector<float> x(size_t(c.T * c.n_in));
        for (auto& v : x) v = nd(rng);
        std::vector<float> want(size_t(c.T * c.n_out)), got(want.size(), NAN);
        ref::matmul(W, x.data(), want.data(), c.T);
        cpu::matmul(W, x.data(), got.data(), c.T);
        for (float v : got) ASSERT_TRUE(std::isfinite(v)) << type_traits(c.type).name;
        EXPECT_LT(rel_err(got, want), 1e-5) << type_traits(c.type).name << " " << c.n_in << "x" << c.n_out;
    }
}

}  // namespace
}  // namespace alloy
