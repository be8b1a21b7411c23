// moe_ffn (kernels/cpu/moe.h): every ISA path this CPU has x expert weight types x odd shapes
// (with and without the shared expert, separate and fused gate/up tensors) against
// ref::moe_ffn on random inputs, plus the decode/verification contract (a call of up to 4
// tokens gives each row the bits of a 1-token call) and the argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/moe.h"
#include "tests/kernels/isa_paths.h"
#include "tests/kernels/moe_test_util.h"
#include "tests/kernels/random_weights.h"
#include "tests/kernels/workspace_check.h"

namespace alloy {
namespace {

using cpu::Isa;
using test::Layer;
using test::routed_input;
using test::Shape;

std::string name(const Shape& s, GgmlType t, Isa isa, int64_t T) {
    return std::string(type_traits(t).name) + " " + cpu::isa_name(isa) + " D=" + std::to_string(s.D) +
           " I=" + std::to_string(s.I) + " Is=" + std::to_string(s.Is) + " E=" + std::to_string(s.E) +
           " k=" + std::to_string(s.k) + (s.fused ? " fused" : "") + " T=" + std::to_string(T);
}

// Relative L2 error against the reference on plain fp32 inputs: F32 weights only round the
// sums; BF16 and Q8_0 round the activations of every product (kernels/cpu/matmul.h), three
// products deep.
double tolerance(GgmlType t) { return t == GgmlType::F32 ? 2e-5 : t == GgmlType::BF16 ? 1e-2 : 5e-2; }

TEST(Moe, EveryIsaTypeAndShapeAgainstReference) {
    const std::vector<Shape> odd = {{37, 23, 19, 5, 2, false}, {37, 23, 0, 5, 5, true}, {36, 22, 18, 6, 1, false}};
    const std::vector<Shape> blocks = {{96, 64, 32, 7, 3, false}, {64, 32, 0, 4, 2, true}};
    uint32_t seed = 1;
    for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0}) {
        std::vector<Shape> shapes = blocks;
        if (t != GgmlType::Q8_0) shapes.insert(shapes.end(), odd.begin(), odd.end());  // Q8_0 rows are 32-blocks
        for (const Shape& s : shapes) {
            const Layer L(s, t, GgmlType::F32, seed++);
            for (int64_t T : {1, 3, 5, 19, 70}) {
                const auto x = routed_input(L.w, T, 0.05f, seed++);
                std::vector<float> want(x.size());
                ref::moe_ffn(L.w, x.data(), want.data(), T);
                for (Isa isa : test::isa_paths(/*has_avx2_code=*/true)) {
                    std::vector<float> got(x.size(), NAN);
                    cpu::moe_ffn(L.w, x.data(), got.data(), T, isa);
                    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << name(s, t, isa, T);
                    EXPECT_LE(rel_err(got, want), tolerance(t)) << name(s, t, isa, T);
                }
            }
        }
    }
}

// A BF16 router (as a BF16 GGUF stores it) rounds its input to bf16 on the CPU paths: the
// routing still agrees where the logits are apart by more than that rounding.
// K-quant experts as stored (GGUF rows) and repacked as the loader repacks them
// (cpu::repack_weight on each expert tensor: WeightLayout::KqRows16) against the reference,
// the two layouts with the same bits, on calls whose experts get few tokens (the GEMVs), 17..32
// (GEMV calls of at most 16, moe.cpp's expert_step) and more (the GEMM tiles).
TEST(Moe, KQuantExpertsRepackedGiveTheGgufRowsBits) {
    const std::vector<Shape> shapes = {{256, 256, 0, 4, 2, false}, {256, 256, 256, 3, 2, true}};
    uint32_t seed = 101;
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS}) {
        for (const Shape& s : shapes) {
            const uint32_t layer_seed = seed++;
            const Layer plain(s, t, GgmlType::F32, layer_seed);
            Layer packed(s, t, GgmlType::F32, layer_seed);
            auto repack = [](WeightView& v) { return cpu::repack_weight(v, const_cast<uint8_t*>(v.data)); };
            ASSERT_TRUE(repack(packed.w.gate.all)) << type_traits(t).name;
            if (s.fused) packed.w.up.all.layout = packed.w.gate.all.layout;  // one tensor
            else ASSERT_TRUE(repack(packed.w.up.all));
            ASSERT_TRUE(repack(packed.w.down.all));
            for (int64_t T : {3, 40, 70}) {  // ~T k / E tokens an expert: 1-2, 20-27, 35-47
                const auto x = routed_input(plain.w, T, 0.05f, seed++);
                std::vector<float> want(x.size());
                ref::moe_ffn(plain.w, x.data(), want.data(), T);
                for (Isa isa : test::isa_paths(/*has_avx2_code=*/true)) {
                    std::vector<float> a(x.size(), NAN), b(x.size(), NAN);
                    cpu::moe_ffn(plain.w, x.data(), a.data(), T, isa);
                    cpu::moe_ffn(packed.w, x.data(), b.data(), T, isa);
                    for (float v : a) ASSERT_TRUE(std::isfinite(v)) << name(s, t, isa, T);
                    EXPECT_LE(rel_err(a, want), tolerance(t)) << name(s, t, isa, T);
                    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << name(s, t, isa, T);
                }
            }
        }
    }
}

TEST(Moe, Bf16RouterAgreesWithReference) {
    const Shape s{64, 32, 16, 6, 2, false};
    const Layer L(s, GgmlType::BF16, GgmlType::BF16, 77);
    const int64_t T = 9;
    const auto x = routed_input(L.w, T, 0.5f, 78);
    std::vector<float> want(x.size()), got(x.size());
    ref::moe_ffn(L.w, x.data(), want.data(), T);
    for (Isa isa : test::isa_paths(true)) {
        cpu::moe_ffn(L.w, x.data(), got.data(), T, isa);
        EXPECT_LE(rel_err(got, want), tolerance(GgmlType::BF16)) << cpu::isa_name(isa);
    }
}

// Speculative verification: a call of up to 4 tokens reproduces each token's 1-token call
// bit for bit on every path and weight type.
TEST(Moe, ShortCallsReproduceOneTokenCallsBitForBit) {
    const Shape s{64, 32, 32, 6, 2, false};
    uint32_t seed = 200;
    for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0}) {
        const Layer L(s, t, t, seed++);
        for (int64_t T : {2, 3, 4}) {
            std::mt19937 rng(seed++);
            std::uniform_real_distribution<float> u(-1.0f, 1.0f);
            std::vector<float> x(size_t(T * s.D));
            for (auto& v : x) v = u(rng);
            for (Isa isa : test::isa_paths(true)) {
                std::vector<float> all(x.size()), one(size_t(s.D));
                cpu::moe_ffn(L.w, x.data(), all.data(), T, isa);
                for (int64_t r = 0; r < T; ++r) {
                    cpu::moe_ffn(L.w, x.data() + r * s.D, one.data(), 1, isa);
                    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * s.D, size_t(s.D) * 4))
                        << name(s, t, isa, T) << " row " << r;
                }
            }
        }
    }
}

// The workspace entry point (kernels/cpu/workspace.h): one NaN-filled caller buffer of exactly
// the count for T_max serves calls of up to T_max tokens (experts of few and many tokens, the
// shared expert) with the bits of a call on its own scratch, written only within its count.
TEST(Moe, WorkspaceFromTheCallerServesEveryCallUpToItsTokens) {
    const int64_t T_max = 37;
    uint32_t seed = 300;
    for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0})
        for (const Shape& s : {Shape{64, 32, 32, 6, 2, false}, Shape{64, 32, 0, 4, 4, true}}) {
            const Layer L(s, t, GgmlType::F32, seed++);
            const auto x = routed_input(L.w, T_max, 0.0f, seed++);
            for (Isa isa : test::isa_paths(true)) {
                test::GuardedWorkspace w(cpu::moe_ffn_workspace_bytes(L.w, T_max, isa));
                for (int64_t T : {int64_t(1), int64_t(4), int64_t(20), T_max}) {
                    std::vector<float> a(size_t(T * s.D), NAN), b(a.size(), NAN);
                    cpu::moe_ffn(L.w, x.data(), a.data(), T, isa, w.get());
                    cpu::moe_ffn(L.w, x.data(), b.data(), T, isa);
                    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << name(s, t, isa, T);
                }
                EXPECT_TRUE(w.canary_intact()) << name(s, t, isa, T_max);
            }
        }
}

TEST(Moe, RoutingPicksTheLargestAndRenormalises) {
    const float logits[2 * 4] = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f, -1.0f, 3.0f, 0.5f};
    int32_t ids[2 * 2];
    float w[2 * 2];
    ref::moe_route(logits, 2, 4, 2, ids, w);
    EXPECT_EQ(ids[0], 1);  // a tie goes to the lower id first
    EXPECT_EQ(ids[1], 3);
    EXPECT_FLOAT_EQ(w[0], 0.5f);
    EXPECT_FLOAT_EQ(w[1], 0.5f);
    EXPECT_EQ(ids[2], 2);
    EXPECT_EQ(ids[3], 3);
    EXPECT_NEAR(w[2], 1.0f / (1.0f + std::exp(-2.5f)), 1e-6f);
    EXPECT_NEAR(w[2] + w[3], 1.0f, 1e-6f);
}

TEST(Moe, RejectsInconsistentWeights) {
    const Shape s{32, 32, 32, 4, 2, false};
    std::vector<float> x(32), y(32);
    auto expect_error = [&](const ref::MoeWeights& w, const std::string& what) {
        try {
            cpu::moe_ffn(w, x.data(), y.data(), 1);
            ADD_FAILURE() << "no error for " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("cpu::moe_ffn"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    {
        Layer L(s, GgmlType::F32, GgmlType::F32, 5);
        L.w.n_used = 5;
        expect_error(L.w, "experts per token");
    }
    {
        Layer L(s, GgmlType::F32, GgmlType::F32, 6);
        L.w.down.all.n_out -= 1;  // one row short of the last expert
        expect_error(L.w, "expert down tensor");
    }
    {
        Layer L(s, GgmlType::F32, GgmlType::F32, 7);
        L.w.n_expert = 5;
        expect_error(L.w, "router");
    }
    {
        Layer L(s, GgmlType::F32, GgmlType::F32, 8);
        L.w.shexp_router.n_out = 2;
        expect_error(L.w, "ffn_gate_inp_shexp");
    }
}

}  // namespace
}  // namespace alloy
