// cpu::attention: every ISA path this CPU has, called explicitly, against ref::attention on
// random inputs over head_dim {256, 64} x heads {8/2, 6/3, 4/4} x T {1, 2, 7, 63, 64, 65, 200}
// x n_past {0, 1, 37, 300} x KV cache {f32, f16, bf16}; plus mixed K/V cache types, long decode,
// peaky scores, odd head_dim and other thread counts. Both sides read the same cache bytes
// (a 16-bit cache holds the rounded values, so the reference defines the math on them). Outputs
// start NaN-poisoned, cache rows past n_past + T are NaN (never to be read).
// Tolerance per output row: relative L2 error <= 1e-5 (1e-2, more for peaky scores, on the
// bf16-products prefill path of bf16 caches, see attention.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "tests/kernels/isa_paths.h"
#include "tests/kernels/workspace_check.h"
#include "tests/logits_error.h"
#include "kernels/cpu/attention.h"
#include "format/quant.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/attention.h"

namespace alloy {
namespace {

using cpu::Isa;

std::vector<Isa> isas() { return test::isa_paths(/*has_avx2_code=*/true); }

struct Case {
    int n_head, n_head_kv, hd;
    int64_t T, n_past;
    float q_gain = 1.0f;  // > 1: peaky softmax (scores spread over tens of units)
    GgmlType type_k = GgmlType::F32, type_v = GgmlType::F32;
};

Case with_types(Case c, GgmlType k, GgmlType v) {
    c.type_k = k;
    c.type_v = v;
    return c;
}

// A cache of `type` holding `vals` (fp32 values; NaN stays NaN), as bytes.
std::vector<uint8_t> cache_bytes(const std::vector<float>& vals, GgmlType type) {
    std::vector<uint8_t> out(vals.size() * (type == GgmlType::F32 ? 4 : 2));
    for (size_t i = 0; i < vals.size(); ++i) {
        if (type != GgmlType::F32) {
            const uint16_t h = type == GgmlType::F16 ? fp32_to_fp16(vals[i]) : fp32_to_bf16(vals[i]);
            std::memcpy(out.data() + 2 * i, &h, 2);
        } else {
            std::memcpy(out.data() + 4 * i, &vals[i], 4);
        }
    }
    return out;
}

std::string label(const Case& c, Isa isa) {
    return std::string(cpu::isa_name(isa)) + " heads=" + std::to_string(c.n_head) + "/" +
           std::to_string(c.n_head_kv) + " hd=" + std::to_string(c.hd) + " T=" + std::to_string(c.T) +
           " n_past=" + std::to_string(c.n_past) + " gain=" + std::to_string(c.q_gain) + " cache=" +
           type_traits(c.type_k).name + "/" + type_traits(c.type_v).name;
}

// Row tolerance of the bf16-products prefill path: bf16 keeps 8 significant bits (2^-9
// relative rounding of q and of each probability; rows that see few keys average less). The
// score errors grow with the scores, so the tolerance with the query gain: measured up to
// 5.8e-3 at gain 1 (head_dim 64), 1.2e-2 at gain 6.
double bf16_products_tol(float q_gain) { return 1e-2 * std::max(1.0f, q_gain / 2); }

// Runs one case on every ISA; returns the worst row error seen.
double check(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n_ctx = c.n_past + c.T + 5;
    const int64_t kvw = int64_t(c.n_head_kv) * c.hd;
    std::vector<float> q(size_t(c.T * c.n_head * c.hd));      // [T, n_head, hd]
    std::vector<float> k(size_t(n_ctx * kvw), NAN), v = k;    // [n_ctx, n_kv, hd]
    for (auto& e : q) e = nd(rng) * c.q_gain;
    for (int64_t i = 0; i < (c.n_past + c.T) * kvw; ++i) {
        k[size_t(i)] = nd(rng);
        v[size_t(i)] = nd(rng);
    }
    const ref::AttentionShape s{c.n_head, c.n_head_kv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.type_k, c.type_v};
    const std::vector<uint8_t> kc = cache_bytes(k, c.type_k), vc = cache_bytes(v, c.type_v);
    std::vector<float> want(q.size());
    ref::attention(s, q.data(), kc.data(), vc.data(), want.data(), c.T, c.n_past);
    double worst = 0;
    for (Isa isa : isas()) {
        std::vector<float> got(q.size(), NAN);
        cpu::attention(s, q.data(), kc.data(), vc.data(), got.data(), c.T, c.n_past, isa);
        // The bf16-products prefill path rounds q and the probabilities to bf16 (attention.h).
        const double tol = cpu::attention_uses_bf16_products(s, c.T, isa) ? bf16_products_tol(c.q_gain) : 1e-5;
        for (int64_t row = 0; row < c.T * c.n_head; ++row) {
            double num = 0, den = 0;
            for (int d = 0; d < c.hd; ++d) {
                const size_t i = size_t(row * c.hd + d);
                if (!std::isfinite(got[i])) {
                    ADD_FAILURE() << label(c, isa) << ": non-finite at row " << row << " dim " << d;
                    return INFINITY;
                }
                num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
                den += double(want[i]) * want[i];
            }
            const double err = std::sqrt(num / den);
            worst = std::max(worst, err);
            if (err > tol) {
                ADD_FAILURE() << label(c, isa) << ": row " << row << " (t=" << row / c.n_head
                              << ", h=" << row % c.n_head << ") rel err " << err;
                return err;
            }
        }
    }
    return worst;
}

constexpr GgmlType F32 = GgmlType::F32, F16 = GgmlType::F16, BF16 = GgmlType::BF16;

TEST(Attention, CpuMatchesReferenceOnTheGrid) {
    uint32_t seed = 1;
    double worst = 0;
    for (GgmlType t : {F32, F16, BF16})
        for (int hd : {256, 64})
            for (auto [nh, nkv] : {std::pair{8, 2}, std::pair{6, 3}, std::pair{4, 4}})
                for (int64_t T : {1, 2, 7, 63, 64, 65, 200})
                    for (int64_t n_past : {0, 1, 37, 300})
                        worst = std::max(worst, check(with_types({nh, nkv, hd, T, n_past}, t, t), seed++));
    RecordProperty("worst_rel_err", std::to_string(worst));
}

// K and V caches of different types (each tile path converts its own operand).
TEST(Attention, MixedCacheTypes) {
    for (auto [tk, tv] : {std::pair{F16, F32}, std::pair{F32, F16}, std::pair{BF16, F16}, std::pair{F32, BF16},
                          std::pair{BF16, F32}}) {
        check(with_types({8, 2, 256, 1, 777}, tk, tv), 401);
        check(with_types({8, 2, 256, 65, 37}, tk, tv), 402);
        check(with_types({6, 3, 80, 9, 50}, tk, tv), 403);
        check(with_types({6, 3, 40, 7, 21}, tk, tv), 404);
    }
}

// Long decode: many key splits merged; peaky scores exercise the running-max rescale.
TEST(Attention, LongDecodeAndPeakyScores) {
    for (GgmlType t : {F32, F16, BF16}) {
        check(with_types({8, 2, 256, 1, 4096}, t, t), 101);
        check(with_types({16, 4, 256, 1, 2000}, t, t), 102);
        check(with_types({24, 4, 256, 3, 1500}, t, t), 103);
        check(with_types({8, 2, 256, 65, 300, 6.0f}, t, t), 104);
        check(with_types({8, 2, 64, 1, 1000, 8.0f}, t, t), 105);
        check(with_types({8, 2, 256, 1, 8191, 4.0f}, t, t), 106);
        check(with_types({8, 2, 256, 65, 2000}, t, t), 107);  // prefill piece after a long cache
    }
}

// Short batches over a long cache: few query blocks, so the keys are split and every block
// takes all KV groups; the last query block is partial (T not a multiple of its tokens).
TEST(Attention, SplitKeysWithPartialQueryBlocks) {
    for (GgmlType t : {F32, F16, BF16}) {
        check(with_types({8, 2, 256, 9, 700}, t, t), 501);
        check(with_types({8, 2, 256, 13, 300}, t, t), 502);
        check(with_types({6, 3, 40, 20, 400}, t, t), 503);   // portable path
        check(with_types({12, 2, 64, 7, 900}, t, t), 504);   // group 6: 5 tokens per block
        check(with_types({4, 2, 80, 40, 2000}, t, t), 505);
    }
}

// head_dim 80 (AVX-512 column tail), 40 (not a multiple of 16: AVX2 on the AVX-512 path) and
// 36 (not a multiple of 8: the portable fallback on both vector paths).
TEST(Attention, OddHeadDims) {
    for (GgmlType t : {F32, F16, BF16}) {
        check(with_types({8, 2, 80, 33, 17}, t, t), 201);
        check(with_types({4, 2, 36, 5, 40}, t, t), 205);
        check(with_types({6, 3, 40, 9, 50}, t, t), 202);
        check(with_types({4, 1, 48, 1, 700}, t, t), 203);
        check(with_types({5, 5, 16, 3, 61}, t, t), 204);
    }
}

// The schedule depends on the thread count (blocks vs key splits): 1 and 3 threads too.
TEST(Attention, OtherThreadCounts) {
    const int before = cpu::n_threads();
    for (int n : {1, 3}) {
        cpu::set_n_threads(n);
        for (GgmlType t : {F32, F16, BF16}) {
            check(with_types({8, 2, 256, 1, 1234}, t, t), 300 + n);
            check(with_types({8, 2, 256, 7, 300}, t, t), 310 + n);
            check(with_types({6, 3, 64, 65, 37}, t, t), 320 + n);
        }
    }
    cpu::set_n_threads(before);
}

// q [T, n_head, hd] and fp32 K, V rows [n_past + T, n_kv, hd] ~ N(0, 1).
struct Qkv {
    std::vector<float> q, k, v;
};
Qkv random_qkv(const Case& c, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t kvw = int64_t(c.n_head_kv) * c.hd, n = c.n_past + c.T;
    Qkv x{std::vector<float>(size_t(c.T * c.n_head * c.hd)), std::vector<float>(size_t(n * kvw)), {}};
    x.v.resize(x.k.size());
    for (auto* t : {&x.q, &x.k, &x.v})
        for (auto& e : *t) e = nd(rng);
    return x;
}

// An f16 cache really holds rounded values: the result differs from the fp32-cache one by
// about the f16 rounding (2^-11 relative per element), neither 0 nor much more.
TEST(Attention, F16CacheIsRoundedNotFp32) {
    const Case c{8, 2, 256, 1, 500};
    const auto [q, k, v] = random_qkv(c, 77);
    ref::AttentionShape s{c.n_head, c.n_head_kv, c.hd, 1.0f / std::sqrt(float(c.hd))};
    std::vector<float> a(q.size()), b(q.size());
    cpu::attention(s, q.data(), k.data(), v.data(), a.data(), c.T, c.n_past);
    s.type_k = s.type_v = F16;
    const auto kc = cache_bytes(k, F16), vc = cache_bytes(v, F16);
    cpu::attention(s, q.data(), kc.data(), vc.data(), b.data(), c.T, c.n_past);
    const double rel = test::max_row_rel_error(b, a, a.size());  // one row: the whole output
    EXPECT_GT(rel, 1e-5);
    EXPECT_LT(rel, 2e-3);
}

// Prefill with bf16 caches takes the bf16-products path where the CPU has AVX512-BF16: its
// result differs from the exact fp32 products (the portable path on the same bytes) by about
// the bf16 rounding of q and the probabilities, neither 0 nor much more. Decode does not.
TEST(Attention, Bf16CachePrefillUsesBf16Products) {
    const Case c{8, 2, 256, 65, 100};
    ref::AttentionShape s{c.n_head, c.n_head_kv, c.hd, 1.0f / std::sqrt(float(c.hd)), BF16, BF16};
    if (!cpu::attention_uses_bf16_products(s, c.T, cpu::active_isa())) GTEST_SKIP() << "no AVX512-BF16 here";
    EXPECT_FALSE(cpu::attention_uses_bf16_products(s, 4, cpu::active_isa()));
    const auto [q, k, v] = random_qkv(c, 78);
    const auto kc = cache_bytes(k, BF16), vc = cache_bytes(v, BF16);
    std::vector<float> fast(q.size()), exact(q.size());
    cpu::attention(s, q.data(), kc.data(), vc.data(), fast.data(), c.T, c.n_past, cpu::active_isa());
    cpu::attention(s, q.data(), kc.data(), vc.data(), exact.data(), c.T, c.n_past, Isa::Scalar);
    const double rel = test::max_row_rel_error(fast, exact, exact.size());
    EXPECT_GT(rel, 1e-4);
    EXPECT_LT(rel, 5e-3);
}

// Speculative verification runs 2-4 tokens per call and must reproduce decode bit for bit:
// token t of a call at n_past = P must get the bits a 1-token call at n_past = P + t gets.
// Positions around the key-split thresholds and split boundaries, where the split layout of
// the two calls could differ, on every ISA path and with both threads counts in use.
// Standard normal K and V caches of n_ctx rows [n_kv, hd] and n_q query rows [n_head, hd].
struct RandomQkv {
    std::vector<float> k, v, q;
    RandomQkv(uint32_t seed, int n_head, int n_kv, int hd, int64_t n_ctx, int64_t n_q)
        : k(size_t(n_ctx * n_kv * hd)), v(k.size()), q(size_t(n_q * n_head * hd)) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& e : k) e = nd(rng);
        for (auto& e : v) e = nd(rng);
        for (auto& e : q) e = nd(rng);
    }
};

TEST(Attention, VerificationWidthsReproduceDecodeBitForBit) {
    const int n_head = 8, n_kv = 2, hd = 64;
    const RandomQkv in(23, n_head, n_kv, hd, 2100, 4);
    const std::vector<float>&kf = in.k, &vf = in.v, &q = in.q;
    const int saved = cpu::n_threads();
    for (GgmlType type : {F16, BF16}) {  // bf16: decode keeps exact products (no bf16-products path)
        for (int threads : {1, 2, 3}) {
            const std::vector<uint8_t> kc = cache_bytes(kf, type), vc = cache_bytes(vf, type);
            const ref::AttentionShape s{n_head, n_kv, hd, 1.0f / std::sqrt(float(hd)), type, type};
            cpu::set_n_threads(threads);
            for (Isa isa : isas())
                for (int64_t P : {250, 253, 254, 255, 256, 511, 765, 766, 767, 1020, 1021, 2040, 2047})
                    for (int64_t T = 2; T <= 4; ++T) {
                        std::vector<float> wide(size_t(T * n_head * hd), NAN);
                        cpu::attention(s, q.data(), kc.data(), vc.data(), wide.data(), T, P, isa);
                        for (int64_t t = 0; t < T; ++t) {
                            std::vector<float> one(size_t(n_head * hd), NAN);
                            cpu::attention(s, q.data() + t * n_head * hd, kc.data(), vc.data(), one.data(), 1, P + t, isa);
                            ASSERT_EQ(0, std::memcmp(one.data(), wide.data() + t * n_head * hd, one.size() * 4))
                                << type_traits(type).name << " " << cpu::isa_name(isa) << " threads=" << threads
                                << " n_past=" << P << " T=" << T << " t=" << t;
                        }
                    }
        }
    }
    cpu::set_n_threads(saved);
}

// The workspace entry point (kernels/cpu/workspace.h): a NaN-filled caller buffer of exactly
// the count for (T, n_past) serves that call and every call of T tokens with fewer past keys
// (split and unsplit, grid and prefill schedules, every ISA path and cache type), with the
// bits of a call on its own scratch, and nothing is written past the count. The count never
// shrinks as n_past grows (what lets a plan size for its longest context).
TEST(Attention, WorkspaceFromTheCallerServesFewerPastKeys) {
    const int n_head = 8, n_kv = 2, hd = 64;
    const int64_t n_ctx = 1400;
    const RandomQkv in(31, n_head, n_kv, hd, n_ctx, 70);
    const std::vector<float>& q = in.q;
    for (GgmlType type : {F32, F16, BF16}) {
        const std::vector<uint8_t> kc = cache_bytes(in.k, type), vc = cache_bytes(in.v, type);
        const ref::AttentionShape s{n_head, n_kv, hd, 1.0f / std::sqrt(float(hd)), type, type};
        for (int64_t T : {1, 3, 7, 70}) {
            const int64_t P_max = n_ctx - T;
            for (int64_t P = 0; P <= P_max; P += 97)
                ASSERT_LE(cpu::attention_workspace_bytes(s, T, P), cpu::attention_workspace_bytes(s, T, P_max))
                    << type_traits(type).name << " T=" << T << " n_past=" << P;
            for (Isa isa : isas()) {
                test::GuardedWorkspace w(cpu::attention_workspace_bytes(s, T, P_max));
                for (int64_t P : {int64_t(0), int64_t(5), int64_t(300), int64_t(1000), P_max}) {
                    std::vector<float> a(size_t(T * n_head * hd), NAN), b(a.size(), NAN);
                    cpu::attention(s, q.data(), kc.data(), vc.data(), a.data(), T, P, isa, w.get());
                    cpu::attention(s, q.data(), kc.data(), vc.data(), b.data(), T, P, isa);
                    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
                        << type_traits(type).name << " " << cpu::isa_name(isa) << " T=" << T << " n_past=" << P;
                }
                EXPECT_TRUE(w.canary_intact()) << type_traits(type).name << " " << cpu::isa_name(isa) << " T=" << T;
            }
        }
    }
}

TEST(Attention, RejectsOtherCacheTypes) {
    std::vector<float> q(256), k(512), v(512), out(256);
    ref::AttentionShape s{1, 1, 256, 0.0625f, GgmlType::Q8_0, F16};
    EXPECT_THROW(cpu::attention(s, q.data(), k.data(), v.data(), out.data(), 1, 0), Error);
    EXPECT_THROW(ref::attention(s, q.data(), k.data(), v.data(), out.data(), 1, 0), Error);
}

}  // namespace
}  // namespace alloy
