// cuda::moe_ffn (kernels/cuda/moe.cu) against ref::moe_ffn on random layers: F32, BF16, Q8_0
// and the other split block types' experts (Q4_0 .. IQ4_XS: published Q4_K_M MoE files), odd
// expert counts and widths, separate and fused gate/up, with and without the shared expert,
// token counts on both sides of kMoeDirectMaxT (one pair per chunk / grouped by expert: chunks
// of 1..8 pairs on the GEMV kernels, of 1..32 on the int8 tensor-core kernels that grouped
// block-typed calls take); calls of up to kMoeDirectMaxT tokens reproduce 1-token calls bit for
// bit; unsupported weights are refused by name. Skips without a CUDA device (CI).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "kernels/cuda/gdn.h"  // device_available
#include "kernels/cuda/ops.h"
#include "kernels/ref/moe.h"
#include "tests/cuda/device_array.h"
#include "tests/kernels/moe_test_util.h"

namespace alloy {
namespace {

using test::DeviceArray;
using test::DeviceWeight;
using test::Layer;
using test::Shape;

// A layer's matrices on the device, in the views cuda::moe_ffn takes.
struct DeviceLayer {
    std::vector<std::unique_ptr<DeviceWeight>> own;
    ref::MoeWeights w;
    explicit DeviceLayer(const ref::MoeWeights& h) : w(h) {
        auto dev = [&](const WeightView& v) {
            own.push_back(std::make_unique<DeviceWeight>(v));
            return own.back()->view;
        };
        w.router = dev(h.router);
        w.gate.all = dev(h.gate.all);
        w.up.all = dev(h.up.all);
        w.down.all = dev(h.down.all);
        if (h.has_shared()) {
            w.shexp_gate = dev(h.shexp_gate);
            w.shexp_up = dev(h.shexp_up);
            w.shexp_down = dev(h.shexp_down);
            w.shexp_router = dev(h.shexp_router);
        }
    }
};

std::vector<float> run(const ref::MoeWeights& w, const std::vector<float>& x, int64_t T) {
    DeviceArray<float> dx(x), dy(std::vector<float>(x.size(), NAN));
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::moe_ffn_workspace_bytes(w, T), 0xff));
    cuda::moe_ffn(w, dx.p, dy.p, T, ws.p, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return dy.host();
}

std::string name(const Shape& s, GgmlType t, int64_t T) {
    return std::string(type_traits(t).name) + " D=" + std::to_string(s.D) + " I=" + std::to_string(s.I) +
           " Is=" + std::to_string(s.Is) + " E=" + std::to_string(s.E) + " k=" + std::to_string(s.k) +
           (s.fused ? " fused" : "") + " T=" + std::to_string(T);
}

// Relative L2 error: F32 rounds only the sums; BF16 experts take x in fp32 (the shared expert
// past 16 tokens rounds x to bf16 in cuBLAS); the block types round x and h to int8 per 32.
double tolerance(GgmlType t) { return t == GgmlType::F32 ? 2e-5 : t == GgmlType::BF16 ? 1e-2 : 5e-2; }

// One call of T tokens on the device against ref::moe_ffn on the host weights h.
void expect_reference(const ref::MoeWeights& h, const ref::MoeWeights& d, int64_t T, uint32_t seed, double tol,
                      const std::string& what) {
    const auto x = test::routed_input(h, T, 0.05f, seed);
    std::vector<float> want(x.size());
    ref::moe_ffn(h, x.data(), want.data(), T);
    const std::vector<float> got = run(d, x, T);
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what;
    EXPECT_LE(rel_err(got, want), tol) << what;
}

class CudaMoe : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    }
};

TEST_F(CudaMoe, EveryTypeAndShapeAgainstReference) {
    // Q8_0 rows are whole 32-blocks; the 16-bit kernels take multiples of 8.
    // {256, 128, ...}: D and I multiples of 128, the published shapes' case (whole 4-block
    // stages for the pipelined tensor-core kernel).
    const std::vector<Shape> blocks = {{96, 64, 32, 7, 3, false}, {64, 32, 0, 4, 2, true}, {64, 96, 32, 130, 8, false},
                                       {256, 128, 64, 9, 3, false}};
    const std::vector<Shape> odd = {{40, 24, 16, 5, 2, false}, {40, 24, 0, 5, 5, true}, {72, 48, 40, 6, 1, false}};
    uint32_t seed = 1;
    for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0}) {
        std::vector<Shape> shapes = blocks;
        if (t != GgmlType::Q8_0) shapes.insert(shapes.end(), odd.begin(), odd.end());
        for (const Shape& s : shapes) {
            const Layer L(s, t, GgmlType::F32, seed++);
            const DeviceLayer D(L.w);
            // 17, 45, 100: grouped by expert (4 experts, k 2, T 100: ~50 pairs an expert, so
            // chunks of 32 and a partial one on the tensor-core path)
            for (int64_t T : {int64_t(1), int64_t(3), int64_t(16), int64_t(17), int64_t(45), int64_t(100)})
                expect_reference(L.w, D.w, T, seed++, tolerance(t), name(s, t, T));
        }
    }
}

// The K-quant and 4/5-bit block types (rows of whole 256- or 32-value blocks), each expert
// matrix of one type and mixed as llama-quantize's Q4_K_M writes them (down of another type).
TEST_F(CudaMoe, BlockTypesAgainstReference) {
    const std::vector<Shape> shapes = {{256, 256, 256, 7, 3, false}, {512, 256, 0, 5, 2, true}};
    uint32_t seed = 400;
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::Q4_K, GgmlType::Q5_K,
                       GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::MXFP4})
        for (const Shape& s : shapes) {
            const Layer L(s, t, GgmlType::F32, seed++);
            const DeviceLayer D(L.w);
            for (int64_t T : {int64_t(1), int64_t(4), int64_t(17), int64_t(60)})
                expect_reference(L.w, D.w, T, seed++, tolerance(t), name(s, t, T));
        }
    // Q4_K gate / up with a Q6_K down, Q6_K with Q8_0 (each matrix its own tensor-core kernel
    // when grouped), Q4_K with BF16 (grouped calls on the GEMV kernels: not every matrix blocks).
    for (auto [tg, td] : {std::pair{GgmlType::Q4_K, GgmlType::Q6_K}, std::pair{GgmlType::Q6_K, GgmlType::Q8_0},
                          std::pair{GgmlType::Q4_K, GgmlType::BF16}}) {
        const Shape s{256, 256, 256, 6, 2, false};
        const Layer A(s, tg, GgmlType::F32, seed++), B(s, td, GgmlType::F32, seed++);
        ref::MoeWeights hw = A.w;
        hw.down = B.w.down;
        const DeviceLayer D(hw);
        for (int64_t T : {int64_t(1), int64_t(33)})
            expect_reference(hw, D.w, T, seed++, tolerance(tg),
                             std::string(type_traits(tg).name) + " gate/up, " + type_traits(td).name + " down, T=" + std::to_string(T));
    }
}

// Speculative verification: a call of up to kMoeDirectMaxT tokens gives every row the bits of
// its 1-token call (router, experts, shared expert and sum), whatever the experts it shares.
TEST_F(CudaMoe, ShortCallsReproduceOneTokenCallsBitForBit) {
    uint32_t seed = 200;
    for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS})
        for (const Shape& s : t == GgmlType::F32 || t == GgmlType::BF16 || t == GgmlType::Q8_0
                                  ? std::vector<Shape>{Shape{64, 32, 32, 6, 2, false}, Shape{64, 64, 0, 9, 3, true}}
                                  : std::vector<Shape>{Shape{256, 256, 256, 6, 2, false}, Shape{256, 256, 0, 9, 3, true}}) {
            const Layer L(s, t, t, seed++);
            const DeviceLayer D(L.w);
            for (int64_t T : {int64_t(2), int64_t(5), cuda::kMoeDirectMaxT}) {
                std::mt19937 rng(seed++);
                std::uniform_real_distribution<float> u(-1.0f, 1.0f);
                std::vector<float> x(size_t(T * s.D));
                for (auto& v : x) v = u(rng);
                const std::vector<float> all = run(D.w, x, T);
                for (int64_t r = 0; r < T; ++r) {
                    const std::vector<float> one = run(D.w, std::vector<float>(x.begin() + r * s.D, x.begin() + (r + 1) * s.D), 1);
                    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * s.D, size_t(s.D) * 4)) << name(s, t, T) << " row " << r;
                }
            }
        }
}

TEST_F(CudaMoe, RefusesWeightsItCannotRun) {
    const Shape s{64, 32, 0, 4, 2, false};
    const Layer L(s, GgmlType::Q8_0, GgmlType::F32, 5);
    DeviceLayer D(L.w);
    ref::MoeWeights w = D.w;
    w.down.all.layout = WeightLayout::Gguf;  // not split
    try {
        cuda::moe_ffn(w, nullptr, nullptr, 0, nullptr, nullptr);
        ADD_FAILURE() << "GGUF-layout Q8_0 experts accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("split"), std::string::npos) << e.what();
    }
    const Layer B(s, GgmlType::BF16, GgmlType::F32, 6);
    DeviceLayer DB(B.w);
    w = D.w;
    w.up = DB.w.up;  // gate Q8_0, up BF16
    EXPECT_THROW(cuda::moe_ffn(w, nullptr, nullptr, 0, nullptr, nullptr), Error);
    // F16 experts (no device kernel): refused by type name.
    const Layer M(s, GgmlType::F16, GgmlType::F32, 7);
    DeviceLayer DM(M.w);
    try {
        cuda::moe_ffn(DM.w, nullptr, nullptr, 0, nullptr, nullptr);
        ADD_FAILURE() << "F16 experts accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expert weight type " + std::string(type_traits(GgmlType::F16).name)), std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace alloy
