// The small fused ops (rms_norm, add_rms_norm, rope_partial, rms_norm_rope, swiglu, sigmoid_gate_mul, add,
// kv_store): every ISA path
// this CPU has, called explicitly, against kernels/ref on random inputs with odd sizes
// (vector tails) and sizes big enough for the thread pool. Outputs start NaN-poisoned where
// the op does not work in place. Tolerances per element, stated per op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/kernels/isa_paths.h"
#include "kernels/cpu/add.h"
#include "kernels/cpu/gate.h"
#include "kernels/cpu/kv_store.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/ref/add.h"
#include "kernels/ref/gate.h"
#include "kernels/ref/kv_store.h"
#include "kernels/ref/rms_norm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/swiglu.h"

namespace alloy {
namespace {

using cpu::Isa;

std::vector<Isa> isas() { return test::isa_paths(/*has_avx2_code=*/true); }

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> x(n);
    for (auto& e : x) e = u(rng);
    return x;
}

// |got - want| <= rel * |want| + abs_floor for every element, and all finite.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs_floor,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << what << " at " << i;
        ASSERT_LE(std::fabs(double(got[i]) - want[i]), rel * std::fabs(double(want[i])) + abs_floor)
            << what << " at " << i << ": " << got[i] << " vs " << want[i];
    }
}

TEST(SmallOps, RmsNorm) {
    struct C { int64_t rows, n; bool weight; };
    uint32_t seed = 1;
    for (const C c : {C{1, 256, true}, C{7, 1000, true}, C{3, 37, false}, C{64, 1024, true}, C{300, 1024, true},
                      C{5, 15, true}}) {
        const auto x = uniform(size_t(c.rows * c.n), -3, 3, seed++);
        const auto w = uniform(size_t(c.n), 0.5f, 1.5f, seed++);
        std::vector<float> want(x.size());
        ref::rms_norm(x.data(), c.weight ? w.data() : nullptr, want.data(), c.rows, c.n, 1e-6f);
        for (Isa isa : isas()) {
            const std::string what = std::string("rms_norm ") + cpu::isa_name(isa) + " rows=" +
                                     std::to_string(c.rows) + " n=" + std::to_string(c.n);
            std::vector<float> got(x.size(), NAN);
            cpu::rms_norm(x.data(), c.weight ? w.data() : nullptr, got.data(), c.rows, c.n, 1e-6f, isa);
            expect_close(got, want, 1e-6, 0, what);
            std::vector<float> inplace = x;  // out aliasing x, as the model calls it for q/k norms
            cpu::rms_norm(inplace.data(), c.weight ? w.data() : nullptr, inplace.data(), c.rows, c.n, 1e-6f, isa);
            expect_close(inplace, want, 1e-6, 0, what + " in place");
        }
    }
}

TEST(SmallOps, RopePartial) {
    struct C { int64_t T; int n_heads, head_dim, n_rot; };
    uint32_t seed = 100;
    for (const C c : {C{1, 8, 256, 64}, C{7, 2, 256, 64}, C{65, 3, 256, 64}, C{9, 5, 64, 64}, C{4, 3, 72, 40},
                      C{300, 16, 256, 64}}) {
        std::mt19937 rng(seed++);
        std::vector<int32_t> pos(size_t(c.T));
        for (auto& p : pos) p = int32_t(rng() % 200000);  // large angles: theta up to 2e5 rad
        pos[0] = 0;
        const auto x = uniform(size_t(c.T * c.n_heads * c.head_dim), -2, 2, seed++);
        std::vector<float> want = x;
        ref::rope_partial(want.data(), pos.data(), c.T, c.n_heads, c.head_dim, c.n_rot, 1e7f);
        const cpu::RopeTable tab = cpu::rope_table(pos.data(), c.T, c.n_rot, 1e7f);
        for (Isa isa : isas()) {
            const std::string what = std::string("rope ") + cpu::isa_name(isa) + " T=" + std::to_string(c.T) +
                                     " heads=" + std::to_string(c.n_heads) + " n_rot=" + std::to_string(c.n_rot);
            std::vector<float> got = x;
            cpu::rope_partial(tab, got.data(), c.n_heads, c.head_dim, isa);
            // |x| <= 2: 1e-6 relative, and 1e-6 absolute where the rotation cancels to ~0.
            expect_close(got, want, 1e-6, 2e-6 * 1e-6, what);
        }
        std::vector<float> got = x;  // the drop-in overload (table per call, active ISA)
        cpu::rope_partial(got.data(), pos.data(), c.T, c.n_heads, c.head_dim, c.n_rot, 1e7f);
        expect_close(got, want, 1e-6, 2e-12, "rope drop-in");
    }
}

TEST(SmallOps, SwiGlu) {
    uint32_t seed = 200;
    for (int64_t n : {1, 15, 16, 17, 1000, 3584 * 3 + 5, 200003}) {
        const auto gate = uniform(size_t(n), -20, 20, seed++);
        const auto up = uniform(size_t(n), -3, 3, seed++);
        std::vector<float> want(static_cast<size_t>(n));
        ref::swiglu(gate.data(), up.data(), want.data(), n);
        for (Isa isa : test::isa_paths(/*has_avx2_code=*/true)) {
            const std::string what = std::string("swiglu ") + cpu::isa_name(isa) + " n=" + std::to_string(n);
            std::vector<float> got(size_t(n), NAN);
            cpu::swiglu(gate.data(), up.data(), got.data(), n, isa);
            expect_close(got, want, 1e-6, 0, what);
            std::vector<float> inplace = gate;  // out aliasing gate, as the model calls it
            cpu::swiglu(inplace.data(), up.data(), inplace.data(), n, isa);
            expect_close(inplace, want, 1e-6, 0, what + " in place");
        }
    }
}

TEST(SmallOps, SigmoidGateMul) {
    uint32_t seed = 300;
    for (int64_t n : {1, 15, 17, 256 * 8 + 3, 2048 * 37, 150001}) {
        const auto x = uniform(size_t(n), -4, 4, seed++);
        const auto g = uniform(size_t(n), -30, 30, seed++);
        std::vector<float> want = x;
        ref::sigmoid_gate_mul(want.data(), g.data(), n);
        for (Isa isa : test::isa_paths(/*has_avx2_code=*/true)) {
            std::vector<float> got = x;
            cpu::sigmoid_gate_mul(got.data(), g.data(), n, isa);
            expect_close(got, want, 1e-6, 0, std::string("gate ") + cpu::isa_name(isa) + " n=" + std::to_string(n));
        }
    }
}

// The gate rows read in place from [query | gate] pairs (g_stride = 2 n): odd head dims, one
// row, and enough rows to take the pool.
TEST(SmallOps, SigmoidGateMulStridedGate) {
    uint32_t seed = 350;
    for (auto [rows, hd] : {std::pair<int64_t, int64_t>{1, 256}, {7, 5}, {3, 64}, {512 * 8, 256}, {1001, 83}}) {
        const auto x = uniform(size_t(rows * hd), -4, 4, seed++);
        const auto qg = uniform(size_t(rows * 2 * hd), -30, 30, seed++);
        std::vector<float> want = x;
        for (int64_t r = 0; r < rows; ++r)  // the flat reference, row by row on the gate halves
            ref::sigmoid_gate_mul(want.data() + r * hd, qg.data() + r * 2 * hd + hd, hd);
        std::vector<float> ref_strided = x;
        ref::sigmoid_gate_mul(ref_strided.data(), qg.data() + hd, rows, hd, 2 * hd);
        EXPECT_EQ(ref_strided, want);
        for (Isa isa : test::isa_paths(/*has_avx2_code=*/true)) {
            std::vector<float> got = x;
            cpu::sigmoid_gate_mul(got.data(), qg.data() + hd, rows, hd, 2 * hd, isa);
            expect_close(got, want, 1e-6, 0,
                         std::string("strided gate ") + cpu::isa_name(isa) + " rows=" + std::to_string(rows) +
                             " hd=" + std::to_string(hd));
        }
    }
}

// add_rms_norm: the same bits as cpu::add then cpu::rms_norm on each path, and the reference's
// composition within rms_norm's tolerance.
TEST(SmallOps, AddRmsNorm) {
    uint32_t seed = 370;
    for (auto [rows, n] : {std::pair<int64_t, int64_t>{1, 1024}, {7, 1000}, {3, 37}, {300, 1024}, {5, 15}}) {
        const auto x = uniform(size_t(rows * n), -3, 3, seed++);
        const auto y = uniform(size_t(rows * n), -3, 3, seed++);
        const auto w = uniform(size_t(n), 0.5f, 1.5f, seed++);
        std::vector<float> want_x = x, want(x.size(), NAN);
        ref::add_rms_norm(want_x.data(), y.data(), w.data(), want.data(), rows, n, 1e-6f);
        for (Isa isa : isas()) {
            const std::string what =
                std::string("add_rms_norm ") + cpu::isa_name(isa) + " rows=" + std::to_string(rows) + " n=" + std::to_string(n);
            std::vector<float> gx = x, got(x.size(), NAN);
            cpu::add_rms_norm(gx.data(), y.data(), w.data(), got.data(), rows, n, 1e-6f, isa);
            std::vector<float> sx = x, sep(x.size(), NAN);
            cpu::add(sx.data(), y.data(), rows * n, isa);
            cpu::rms_norm(sx.data(), w.data(), sep.data(), rows, n, 1e-6f, isa);
            EXPECT_EQ(gx, sx) << what;
            EXPECT_EQ(got, sep) << what;
            expect_close(gx, want_x, 0, 0, what + " x");
            expect_close(got, want, 1e-6, 0, what);
        }
    }
}

// rms_norm_rope: the q path (heads read from [query | gate] pairs into a separate output) and
// the k path (in place) give the same bits as cpu::rms_norm then cpu::rope_partial, and agree
// with the reference's composition.
TEST(SmallOps, RmsNormRope) {
    struct C { int64_t T; int n_heads, head_dim, n_rot; };
    uint32_t seed = 380;
    for (const C c : {C{1, 8, 256, 64}, C{7, 2, 256, 64}, C{9, 5, 64, 64}, C{4, 3, 72, 40}, C{300, 16, 256, 64}}) {
        std::mt19937 rng(seed++);
        std::vector<int32_t> pos(size_t(c.T));
        for (auto& p : pos) p = int32_t(rng() % 200000);
        const int64_t rows = c.T * c.n_heads, hd = c.head_dim;
        const auto qg = uniform(size_t(rows * 2 * hd), -3, 3, seed++);
        const auto k = uniform(size_t(rows * hd), -3, 3, seed++);
        const auto w = uniform(size_t(hd), 0.5f, 1.5f, seed++);
        std::vector<float> want_q(size_t(rows * hd), NAN), want_k = k;
        ref::rms_norm_rope(qg.data(), 2 * hd, w.data(), want_q.data(), pos.data(), c.T, c.n_heads, c.head_dim, c.n_rot,
                           1e7f, 1e-6f);
        ref::rms_norm_rope(want_k.data(), hd, w.data(), want_k.data(), pos.data(), c.T, c.n_heads, c.head_dim, c.n_rot,
                           1e7f, 1e-6f);
        const cpu::RopeTable tab = cpu::rope_table(pos.data(), c.T, c.n_rot, 1e7f);
        for (Isa isa : isas()) {
            const std::string what = std::string("rms_norm_rope ") + cpu::isa_name(isa) + " T=" + std::to_string(c.T) +
                                     " heads=" + std::to_string(c.n_heads) + " hd=" + std::to_string(hd);
            std::vector<float> q(size_t(rows * hd), NAN), kk = k;
            cpu::rms_norm_rope(tab, qg.data(), 2 * hd, w.data(), q.data(), c.n_heads, c.head_dim, 1e-6f, isa);
            cpu::rms_norm_rope(tab, kk.data(), hd, w.data(), kk.data(), c.n_heads, c.head_dim, 1e-6f, isa);
            std::vector<float> sq(size_t(rows * hd)), sk = k;  // the unfused ops
            for (int64_t r = 0; r < rows; ++r) std::copy(qg.begin() + 2 * r * hd, qg.begin() + (2 * r + 1) * hd, sq.begin() + r * hd);
            cpu::rms_norm(sq.data(), w.data(), sq.data(), rows, hd, 1e-6f, isa);
            cpu::rope_partial(tab, sq.data(), c.n_heads, c.head_dim, isa);
            cpu::rms_norm(sk.data(), w.data(), sk.data(), rows, hd, 1e-6f, isa);
            cpu::rope_partial(tab, sk.data(), c.n_heads, c.head_dim, isa);
            EXPECT_EQ(q, sq) << what;
            EXPECT_EQ(kk, sk) << what;
            // normed values are O(1): 1e-6 relative and a small floor where the rotation cancels
            expect_close(q, want_q, 2e-6, 1e-6, what + " q");
            expect_close(kk, want_k, 2e-6, 1e-6, what + " k");
        }
    }
}

TEST(SmallOps, Add) {
    uint32_t seed = 400;
    for (int64_t n : {1, 15, 16, 33, 1024 * 7, 1024 * 300 + 9}) {
        const auto x = uniform(size_t(n), -4, 4, seed++);
        const auto y = uniform(size_t(n), -4, 4, seed++);
        std::vector<float> want = x;
        ref::add(want.data(), y.data(), n);
        for (Isa isa : isas()) {
            std::vector<float> got = x;
            cpu::add(got.data(), y.data(), n, isa);
            expect_close(got, want, 0, 0, std::string("add ") + cpu::isa_name(isa) + " n=" + std::to_string(n));
        }
    }
}

// kv_store: bit-exact with the reference (alloy::fp32_to_fp16, round to nearest even) on
// random values over the whole f16 range and on the edge cases: ties at both parities, the
// subnormal halves and the underflow to zero, the overflow threshold 65520, +-0, inf, NaN.
TEST(SmallOps, KvStore) {
    std::vector<float> special;
    for (uint32_t h = 0; h < 0x7C00; h += 7) {  // every 7th finite half and the midpoints above it
        uint32_t bits = ((h & 0x3FF) << 13) | (h >= 0x400 ? ((h >> 10) + 112) << 23 : 0);
        float f;
        if (h < 0x400) {
            f = std::ldexp(float(h), -24);
            special.push_back(f + std::ldexp(0.5f, -24));  // a tie between two subnormal halves
        } else {
            std::memcpy(&f, &bits, 4);
            bits += 1u << 12;  // the midpoint to the next half: ties to even
            float mid;
            std::memcpy(&mid, &bits, 4);
            special.push_back(mid);
        }
        special.push_back(f);
        special.push_back(-f);
    }
    for (float f : {65504.0f, 65519.99f, 65520.0f, 1e6f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 1e-30f, -0.0f,
                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()})
        special.push_back(f);
    // bf16 ties (low half 0x8000) on both sides of even, and a bf16 NaN whose payload is in
    // the low half only (truncation would make it infinity).
    for (uint32_t bits : {0x3F808000u, 0x3F818000u, 0xC0FF8000u, 0x7F808001u, 0x007F8000u}) {
        float f;
        std::memcpy(&f, &bits, 4);
        special.push_back(f);
    }
    auto random = uniform(1024 * 70 + 13, -70000, 70000, 900);
    for (size_t i = 0; i < random.size(); i += 3) random[i] *= 1e-4f;
    for (GgmlType type : {GgmlType::F16, GgmlType::BF16})
        for (const auto* src : {&special, &random}) {
            for (int64_t n : {int64_t(1), int64_t(15), int64_t(17), int64_t(src->size())}) {
                n = std::min<int64_t>(n, int64_t(src->size()));
                std::vector<uint16_t> want(static_cast<size_t>(n));
                ref::kv_store(src->data(), want.data(), type, n);
                for (Isa isa : isas()) {
                    std::vector<uint16_t> got(static_cast<size_t>(n) + 1, uint16_t(0xABCD));
                    cpu::kv_store(src->data(), got.data(), type, n, isa);
                    EXPECT_EQ(got.back(), 0xABCD) << "wrote past the end";
                    got.pop_back();
                    for (int64_t i = 0; i < n; ++i)
                        ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << type_traits(type).name << " " << cpu::isa_name(isa)
                                                                   << " n=" << n << " at " << i << " x=" << (*src)[size_t(i)];
                }
            }
        }
    uint16_t tie;  // 1 + 2^-8 is halfway between two bf16: to even (1.0)
    ref::kv_store(std::vector<float>{1.00390625f}.data(), &tie, GgmlType::BF16, 1);
    EXPECT_EQ(tie, 0x3F80);
    std::vector<float> f32(random.size(), NAN);
    cpu::kv_store(random.data(), f32.data(), GgmlType::F32, int64_t(random.size()));
    EXPECT_EQ(f32, random);
    EXPECT_THROW(cpu::kv_store(random.data(), f32.data(), GgmlType::Q8_0, 4), std::exception);
}

}  // namespace
}  // namespace alloy
