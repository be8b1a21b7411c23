// matmul: every weight type x every ISA path this CPU has x odd shapes, against ref::matmul,
// with the tolerances of the contract in kernels/cpu/matmul.h:
//  - tight (1e-5, relative L2) against the reference fed the effective input (the activations
//    as the kernel consumes them: Q8_0-quantized or bf16-rounded), which isolates the kernel's
//    fp32 summation;
//  - per type against the reference fed the plain fp32 input (the activation rounding itself).
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/quant.h"
#include "tests/kernels/isa_paths.h"
#include "tests/kernels/random_weights.h"
#include "tests/kernels/workspace_check.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_kquant.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/swiglu.h"

namespace alloy {
namespace {

std::vector<cpu::Isa> isas() { return test::isa_paths(/*has_avx2_code=*/true); }

// Tolerance against the plain fp32 reference: the effect of the activation rounding.
double plain_tolerance(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
        case GgmlType::IQ4_NL:
        case GgmlType::MXFP4: return 2e-2;  // int8 (Q8_0) activations: ~0.5% rms
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K:
        case GgmlType::IQ4_XS: return 2e-2;  // Q8_K (int8) activations
        case GgmlType::BF16: return 5e-3;  // 8 significant bits: ~0.1% rms
        default: return 1e-5;
    }
}

struct Shape { int64_t n_in, n_out; };

std::vector<Shape> shapes_for(GgmlType type) {
    const int64_t block = type_traits(type).block_elems;
    if (block == 256) return {{256, 37}, {4096 + 256, 19}};
    // {64, 1501}: the decode GEMVs cut its rows into several guided items (matmul.cpp), the last
    // one short and odd.
    std::vector<Shape> s{{32, 37}, {96, 19}, {4096 + 32, 21}, {512, 67}, {64, 1501}};
    if (block == 1) s.push_back({37, 23});  // odd n_in: masked tails, no bf16 pairs
    return s;
}

TEST(Matmul, EveryTypeIsaShapeAndTokenCount) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,  GgmlType::Q8_0,   GgmlType::Q4_0,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                              GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::MXFP4};
    const int64_t Ts[] = {1, 2, 3, 5, 17, 64, 129};
    for (GgmlType type : types) {
        for (const Shape& sh : shapes_for(type)) {
            const std::vector<uint8_t> bytes = random_weights(type, sh.n_in, sh.n_out, rng);
            const WeightView W{type, sh.n_in, sh.n_out, bytes.data(), row_bytes(type, sh.n_in)};
            for (int64_t T : Ts) {
                if (sh.n_in > 1024 && T == 64) continue;  // keep the reference's cost down
                std::vector<float> x(size_t(T * sh.n_in)), xe(x.size());
                for (auto& v : x) v = nd(rng);
                cpu::matmul_effective_input(type, x.data(), xe.data(), T, sh.n_in);
                std::vector<float> want(size_t(T * sh.n_out)), want_plain(want.size());
                ref::matmul(W, xe.data(), want.data(), T);
                ref::matmul(W, x.data(), want_plain.data(), T);
                for (cpu::Isa isa : isas()) {
                    const std::string what = std::string(type_traits(type).name) + " " + cpu::isa_name(isa) + " (" +
                                             cpu::matmul_path(type, isa, sh.n_in, T) + ") n_in=" +
                                             std::to_string(sh.n_in) + " n_out=" + std::to_string(sh.n_out) +
                                             " T=" + std::to_string(T);
                    std::vector<float> got(want.size(), NAN);
                    cpu::matmul(W, x.data(), got.data(), T, isa, scratch);
                    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what;
                    EXPECT_LT(rel_err(got, want), 1e-5) << what;
                    EXPECT_LT(rel_err(got, want_plain), plain_tolerance(type)) << what;
                }
            }
        }
    }
}

// Q8_K as ggml's quantize_row_q8_K_ref: the first value of largest magnitude maps to -127
// (iscale = -127 / max, so its sign flips), d = 1 / iscale, ties round to even, bsums are the
// sums of 16 consecutive q, an all-zero block gives d = 0.
TEST(Matmul, Q8KActivationQuantizerMatchesGgml) {
    std::vector<float> x(512);
    std::mt19937 rng(4);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : x) v = nd(rng);
    x[3] = 6.35f, x[9] = -6.35f;  // equal magnitudes: the first one sets the sign
    for (int i = 256; i < 512; ++i) x[size_t(i)] = 0.0f;
    std::vector<int8_t> q(512);
    float d[2];
    int16_t bs[32];
    cpu::mm::quantize_q8k(x.data(), 512, q.data(), d, bs);
    const float iscale = -127.f / 6.35f;
    EXPECT_EQ(q[3], -127);
    EXPECT_EQ(q[9], 127);
    EXPECT_EQ(d[0], 1 / iscale);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(int(q[size_t(j)]), int(std::nearbyint(iscale * x[size_t(j)]))) << j;
    for (int s16 = 0; s16 < 16; ++s16) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += q[size_t(s16 * 16 + i)];
        EXPECT_EQ(bs[s16], sum);
    }
    EXPECT_EQ(d[1], 0.0f);
    for (int j = 256; j < 512; ++j) EXPECT_EQ(q[size_t(j)], 0);
    // A tie: with max 127 the scale is -1, so 2.5 -> -2 and -3.5 -> 4 (nearest even).
    std::vector<float> t(256, 0.0f);
    t[0] = 127.0f, t[1] = 2.5f, t[2] = -3.5f, t[3] = 0.5f;
    cpu::mm::quantize_q8k(t.data(), 256, q.data(), d, bs);
    EXPECT_EQ(q[0], -127);
    EXPECT_EQ(q[1], -2);
    EXPECT_EQ(q[2], 4);
    EXPECT_EQ(q[3], 0);
    EXPECT_EQ(d[0], -1.0f);
}

// The Q8_K quantizer on every ISA path gives the scalar reference's bytes, scales and sums for
// ordinary rows, ties of magnitude (the first sets the sign), exact .5 products, an all-zero
// block, and inputs a model should never produce but must not change the bits: NaN, inf, a
// denormal maximum (iscale = -inf).
TEST(Matmul, Q8KActivationQuantizerIsTheSameOnEveryPath) {
    const int64_t K = 256 * 7;
    std::mt19937 rng(41);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<float> x(static_cast<size_t>(K));
    for (auto& v : x) v = nd(rng);
    for (int j = 0; j < 256; ++j) x[size_t(j)] = std::clamp(x[size_t(j)], -9.0f, 9.0f);
    x[17] = 9.5f, x[20] = -9.5f, x[200] = -9.5f;                       // block 0: tied magnitudes
    // block 1: halves (-4 .. 4.5) under a maximum of -127, so iscale = 1 exactly and every odd
    // element's product is a tie for the round to nearest even.
    for (int j = 0; j < 256; ++j) x[size_t(256 + j)] = float(j % 9) - 4.0f + 0.5f * float(j % 2);
    x[256 + 5] = -127.0f;
    for (int j = 0; j < 256; ++j) x[size_t(512 + j)] = j % 3 ? 0.0f : -0.0f;  // block 2: zeros
    x[768 + 3] = std::nanf(""), x[768 + 100] = -std::nanf("");          // block 3: NaN (skipped by the max)
    x[1024 + 7] = INFINITY;                                            // block 4: inf
    for (int j = 0; j < 256; ++j) x[size_t(1280 + j)] = j == 9 ? -1e-40f : 0.0f;  // block 5: denormal max
    // block 6: random.
    const size_t n = static_cast<size_t>(K);
    std::vector<int8_t> q0(n), q1(n);
    std::vector<float> d0(n / 256), d1(n / 256);
    std::vector<int16_t> b0(n / 16), b1(n / 16);
    cpu::mm::quantize_q8k(x.data(), K, q0.data(), d0.data(), b0.data());
    for (cpu::Isa isa : isas()) {
        std::fill(q1.begin(), q1.end(), int8_t(77));
        cpu::mm::quantize_q8k(isa, x.data(), K, q1.data(), d1.data(), b1.data());
        EXPECT_EQ(0, std::memcmp(q0.data(), q1.data(), q0.size())) << cpu::isa_name(isa);
        EXPECT_EQ(0, std::memcmp(d0.data(), d1.data(), d0.size() * 4)) << cpu::isa_name(isa);
        EXPECT_EQ(0, std::memcmp(b0.data(), b1.data(), b0.size() * 2)) << cpu::isa_name(isa);
    }
    EXPECT_EQ(d0[1], 1.0f);  // block 1's scale: 1 / iscale with iscale = -127 / -127
    EXPECT_EQ(d0[2], 0.0f);
    EXPECT_EQ(q0[size_t(17)], -127);  // x[17] = 9.5 came first: max = 9.5, iscale < 0
    EXPECT_EQ(q0[size_t(200)], 127);
}

// The vectorised quantizer equals the scalar one bit for bit, and both round halves to even
// (ggml's x86 quantize_row_q8_0 uses _mm256_round_ps, not roundf).
TEST(Matmul, Q8ActivationQuantizerMatchesGgmlX86) {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    const int64_t K = 4096 + 32;
    std::vector<float> x(static_cast<size_t>(K));
    for (auto& v : x) v = nd(rng);
    // Block 1: amax 127 -> scale exactly 1, so 2.5 and -3.5 are ties.
    for (int i = 0; i < 32; ++i) x[size_t(32 + i)] = float(i % 7) - 3.0f;
    x[32] = 127.0f, x[33] = 2.5f, x[34] = -3.5f, x[35] = 0.5f;
    // Block 2: all zero -> d = 0, q = 0.
    for (int i = 0; i < 32; ++i) x[size_t(64 + i)] = 0.0f;
    const int64_t nb = K / 32;
    std::vector<int8_t> q0(static_cast<size_t>(K)), q1(static_cast<size_t>(K));
    std::vector<float> d0(static_cast<size_t>(nb)), d1(static_cast<size_t>(nb));
    std::vector<int32_t> c0(static_cast<size_t>(nb)), c1(static_cast<size_t>(nb));
    cpu::mm::quantize_q8_scalar(x.data(), K, q0.data(), d0.data(), c0.data());
    EXPECT_EQ(q0[33], 2);
    EXPECT_EQ(q0[34], -4);
    EXPECT_EQ(q0[35], 0);
    EXPECT_EQ(d0[1], 1.0f);
    EXPECT_EQ(d0[1], 1.0f);  // block 1's scale: 1 / iscale with iscale = -127 / -127
    EXPECT_EQ(d0[2], 0.0f);
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += q0[size_t(i)];
    EXPECT_EQ(c0[0], -128 * s);
    for (int64_t b = 0; b < nb; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[size_t(b * 32 + i)]));
        EXPECT_EQ(d0[size_t(b)], fp16_to_fp32(fp32_to_fp16(amax / 127.f)));
    }
    if (cpu::active_isa() >= cpu::Isa::Avx2) {
        std::vector<int8_t> q2(static_cast<size_t>(K));
        std::vector<float> d2(static_cast<size_t>(nb));
        std::vector<int32_t> c2(static_cast<size_t>(nb));
        cpu::mm::quantize_q8_avx2(x.data(), K, q2.data(), d2.data(), c2.data());
        EXPECT_EQ(q0, q2);
        EXPECT_EQ(d0, d2);
        EXPECT_EQ(c0, c2);
    }
    if (cpu::active_isa() == cpu::Isa::Avx512) {
        cpu::mm::quantize_q8_avx512(x.data(), K, q1.data(), d1.data(), c1.data());
        EXPECT_EQ(q0, q1);
        EXPECT_EQ(d0, d1);
        EXPECT_EQ(c0, c1);
        std::vector<uint16_t> b0(static_cast<size_t>(K)), b1(static_cast<size_t>(K));
        x[7] = NAN;
        cpu::mm::to_bf16_scalar(x.data(), K - 3, b0.data());
        cpu::mm::to_bf16_avx512(x.data(), K - 3, b1.data());
        EXPECT_EQ(b0, b1);
    }
}

// Each output is computed by one pool item, so the thread count cannot change any bit.
TEST(Matmul, ResultDoesNotDependOnThreadCount) {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n_in = 1024, n_out = 301;
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32}) {
        const std::vector<uint8_t> bytes = random_weights(type, n_in, n_out, rng);
        const WeightView W{type, n_in, n_out, bytes.data(), row_bytes(type, n_in)};
        for (int64_t T : {1, 3, 70}) {
            std::vector<float> x(size_t(T * n_in));
            for (auto& v : x) v = nd(rng);
            std::vector<float> y1(size_t(T * n_out), NAN), y2(y1.size(), NAN);
            const int saved = cpu::n_threads();
            cpu::set_n_threads(1);
            cpu::matmul(W, x.data(), y1.data(), T);
            cpu::set_n_threads(3);
            cpu::matmul(W, x.data(), y2.data(), T);
            cpu::set_n_threads(saved);
            EXPECT_EQ(0, std::memcmp(y1.data(), y2.data(), y1.size() * 4)) << type_traits(type).name << " T=" << T;
        }
    }
}

// GEMM outputs of 2 MiB and more are written with non-temporal stores where every store is a
// whole aligned line (matmul.cpp, kStreamOutBytes). The same rows computed as slices too small
// to stream, and the large call into an unaligned output (the plain-store fallback), must give
// the same bits. Row count 8240: a last row chunk of 32; 70 tokens: a part-filled token group.
TEST(Matmul, StreamedLargeOutputsMatchPlainStoresBitForBit) {
    std::mt19937 rng(23);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    const int64_t n_in = 64, n_out = 8240, T = 70, slice = 1040;
    ASSERT_GE(T * n_out * 4, int64_t(2) << 20);
    ASSERT_LT(T * slice * 4, int64_t(2) << 20);
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32, GgmlType::Q4_0}) {
        const std::vector<uint8_t> bytes = random_weights(type, n_in, n_out, rng);
        const size_t rb = row_bytes(type, n_in);
        const WeightView W{type, n_in, n_out, bytes.data(), rb};
        std::vector<float> x(size_t(T * n_in));
        for (auto& v : x) v = nd(rng);
        for (cpu::Isa isa : isas()) {
            const std::string what = std::string(type_traits(type).name) + " " + cpu::isa_name(isa);
            std::vector<float> whole(size_t(T * n_out) + 16 + 1, NAN), sliced(size_t(T * n_out), NAN);
            // 64-byte aligned start inside `whole`, and one float past it (unaligned).
            float* aligned_y = whole.data();
            while (reinterpret_cast<uintptr_t>(aligned_y) % 64) ++aligned_y;
            cpu::matmul(W, x.data(), aligned_y, T, isa, scratch);
            for (int64_t r0 = 0; r0 < n_out; r0 += slice) {
                const int64_t nr = std::min(slice, n_out - r0);
                const WeightView part{type, n_in, nr, bytes.data() + size_t(r0) * rb, rb};
                std::vector<float> y(size_t(T * nr), NAN);
                cpu::matmul(part, x.data(), y.data(), T, isa, scratch);
                for (int64_t t = 0; t < T; ++t)
                    std::copy_n(y.data() + t * nr, nr, sliced.data() + t * n_out + r0);
            }
            EXPECT_EQ(0, std::memcmp(aligned_y, sliced.data(), sliced.size() * 4)) << what << " aligned output";
            std::vector<float> unaligned(size_t(T * n_out) + 1, NAN);
            cpu::matmul(W, x.data(), unaligned.data() + 1, T, isa, scratch);
            EXPECT_EQ(0, std::memcmp(unaligned.data() + 1, sliced.data(), sliced.size() * 4)) << what << " unaligned output";
        }
    }
}

// Decode (T = 1) must be reproduced bit for bit by calls of up to 4 tokens (speculative
// verification widths) on every ISA path, and by long prefill calls (T > 4) where the GEMM
// sums as decode does: the scalar path, and F32, F16 and Q4_0 on AVX-512 and AVX2. Q8_0 and
// BF16 decode with streaming GEMVs (AVX-512) or 8-lane row-dots (AVX2) that sum in their own
// order, and Q4_0 / K-quant decode with integer block sums while their prefill runs the
// dequantized fp32 weights (matmul.h).
TEST(Matmul, EveryTokenCountGivesTheSameBits) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32, GgmlType::F16, GgmlType::Q4_0,
                          GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                              GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::MXFP4}) {
        for (const Shape& sh : shapes_for(type)) {
            const std::vector<uint8_t> bytes = random_weights(type, sh.n_in, sh.n_out, rng);
            const WeightView W{type, sh.n_in, sh.n_out, bytes.data(), row_bytes(type, sh.n_in)};
            const int64_t T = 37;
            std::vector<float> x(size_t(T * sh.n_in));
            for (auto& v : x) v = nd(rng);
            for (cpu::Isa isa : isas()) {
                std::vector<float> all(size_t(T * sh.n_out), NAN), one(size_t(sh.n_out)), three(size_t(3 * sh.n_out));
                const cpu::Isa eff = std::min(isa, cpu::active_isa());
                // Decode kernels on packed blocks (their prefill runs dequantized fp32 rows).
                const bool k_quant_native =
                    type == GgmlType::Q4_K || type == GgmlType::Q5_K || type == GgmlType::Q6_K || type == GgmlType::IQ4_XS ||
                    ((type == GgmlType::Q4_0 || type == GgmlType::IQ4_NL || type == GgmlType::MXFP4) && eff != cpu::Isa::Scalar);
                // Q8_0's GEMVs and GEMM tiles (and the Q8_0 tiles Q4_0 / IQ4_NL prefill converts
                // to) compute one chain per output.
                const bool q8_chain = eff != cpu::Isa::Scalar && (type == GgmlType::Q8_0 || type == GgmlType::Q4_0 ||
                                                                  type == GgmlType::IQ4_NL);
                const bool gemm_matches_decode =
                    q8_chain || (!k_quant_native && ((eff == cpu::Isa::Scalar) || (type != GgmlType::Q8_0 && type != GgmlType::BF16)));
                if (gemm_matches_decode) {
                    cpu::matmul(W, x.data(), all.data(), T, isa, scratch);
                } else {
                    for (int64_t t = 0; t < T; t += 4)
                        cpu::matmul(W, x.data() + t * sh.n_in, all.data() + t * sh.n_out, std::min<int64_t>(4, T - t),
                                    isa, scratch);
                }
                for (int64_t t = 0; t < T; ++t) {
                    std::fill(one.begin(), one.end(), NAN);
                    cpu::matmul(W, x.data() + t * sh.n_in, one.data(), 1, isa, scratch);
                    ASSERT_EQ(0, std::memcmp(one.data(), all.data() + t * sh.n_out, one.size() * 4))
                        << type_traits(type).name << " " << cpu::isa_name(isa) << " n_in=" << sh.n_in << " t=" << t;
                }
                // (4 and 1 are the calls above; up to kGemvMaxTokens = 16 rows every type keeps
                // the per-row bits: the batch invariance of decode steps of up to 16 sequences)
                for (int64_t n : {2, 3, 6, 8, 9, 16}) {
                    three.assign(size_t(n * sh.n_out), NAN);
                    cpu::matmul(W, x.data() + 5 * sh.n_in, three.data(), n, isa, scratch);
                    EXPECT_EQ(0, std::memcmp(three.data(), all.data() + 5 * sh.n_out, size_t(n * sh.n_out) * 4))
                        << type_traits(type).name << " " << cpu::isa_name(isa) << " T=" << n;
                }
            }
        }
    }
}

// Q8_0 (and Q4_0, IQ4_NL on their Q8_0 path) give the same bits on the AVX-512 VNNI and the
// AVX2 paths at every token count: the GEMVs and both GEMM tiles compute one fp32 chain per
// output, y = fma(float(isum_b), d_w * d_x, y) over the blocks in order. K of several k-chunks
// (1024) and a ragged last one, odd row counts.
TEST(Matmul, Q8ChainIsTheSameOnEveryVectorPath) {
    if (cpu::active_isa() < cpu::Isa::Avx512 || !cpu::mm::cpu_has_avx512_vnni()) GTEST_SKIP() << "needs AVX-512 VNNI";
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::IQ4_NL}) {
        for (int64_t n_in : {32, 96, 1024, 2080, 3072}) {
            const int64_t n_out = 37;
            const std::vector<uint8_t> bytes = random_weights(type, n_in, n_out, rng);
            const WeightView W{type, n_in, n_out, bytes.data(), row_bytes(type, n_in)};
            for (int64_t T : {1, 2, 3, 4, 5, 7, 16, 17, 40}) {
                std::vector<float> x(size_t(T * n_in));
                for (auto& v : x) v = nd(rng);
                std::vector<float> a(size_t(T * n_out), NAN), b(size_t(T * n_out), NAN);
                cpu::matmul(W, x.data(), a.data(), T, cpu::Isa::Avx512, scratch);
                cpu::matmul(W, x.data(), b.data(), T, cpu::Isa::Avx2, scratch);
                EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
                    << type_traits(type).name << " n_in=" << n_in << " T=" << T;
            }
        }
    }
}

// The AVX2 K-quant prefill tiles do the VNNI tiles' arithmetic (vpmaddubsw + vpmaddwd for
// vpdpbusd, the same fp32 steps; IQ4_XS's codes as two nibbles): the same bits, on odd shapes
// and token counts past the GEMV's.
TEST(Matmul, KQuantAvx2TilesGiveTheVnniTilesBits) {
    if (cpu::active_isa() != cpu::Isa::Avx512 || !cpu::mm::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX512-VNNI here";
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS})
        for (const Shape& sh : shapes_for(type))
            for (int64_t T : {17, 37, 64}) {
                const std::vector<uint8_t> bytes = random_weights(type, sh.n_in, sh.n_out, rng);
                const WeightView W{type, sh.n_in, sh.n_out, bytes.data(), row_bytes(type, sh.n_in)};
                std::vector<float> x(size_t(T * sh.n_in)), a(size_t(T * sh.n_out)), b(a.size());
                for (auto& v : x) v = nd(rng);
                ASSERT_NE(cpu::matmul_path(type, cpu::Isa::Avx2, sh.n_in, T).find("q8k"), std::string::npos);
                cpu::matmul(W, x.data(), a.data(), T, cpu::Isa::Avx512, scratch);
                cpu::matmul(W, x.data(), b.data(), T, cpu::Isa::Avx2, scratch);
                EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
                    << type_traits(type).name << " n_in=" << sh.n_in << " n_out=" << sh.n_out << " T=" << T;
            }
}

// The K-quant decode GEMVs' two SIMD builds (vpdpwssd vs vpmaddwd + vpaddd: the same integers)
// give the same bits, called directly: kquant_gemv picks the AVX2 one on Intel CPUs, so the
// matmul tests there would not reach the VNNI one.
TEST(Matmul, KQuantVnniGemvGivesTheAvx2GemvsBits) {
    if (cpu::active_isa() != cpu::Isa::Avx512 || !cpu::mm::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX512-VNNI here";
    std::mt19937 rng(23);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS}) {
        const cpu::mm::GemvFn vnni = cpu::mm::kquant_gemv_vnni(type), avx2 = cpu::mm::kquant_gemv_avx2(type);
        ASSERT_TRUE(vnni && avx2) << type_traits(type).name;
        for (const Shape& sh : shapes_for(type))
            for (int nt : {1, 2, 3, 4}) {
                const int64_t K = sh.n_in;
                const std::vector<uint8_t> bytes = random_weights(type, K, sh.n_out, rng);
                const WeightView W{type, K, sh.n_out, bytes.data(), row_bytes(type, K)};
                std::vector<float> x(size_t(nt * K)), d(size_t(nt * K / 256));
                std::vector<int8_t> q(x.size());
                std::vector<int16_t> bsums(size_t(nt * K / 16));
                for (auto& v : x) v = nd(rng);
                for (int t = 0; t < nt; ++t)
                    cpu::mm::quantize_q8k(x.data() + t * K, K, q.data() + t * K, d.data() + t * (K / 256),
                                          bsums.data() + t * (K / 16));
                cpu::mm::ActRows a;
                a.K = K, a.q = q.data(), a.d = d.data(), a.bsums = bsums.data();
                std::vector<float> ya(size_t(nt * sh.n_out), NAN), yb(ya.size(), NAN);
                vnni(W, 0, sh.n_out, a, 0, nt, ya.data(), sh.n_out);
                avx2(W, 0, sh.n_out, a, 0, nt, yb.data(), sh.n_out);
                EXPECT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * 4))
                    << type_traits(type).name << " n_in=" << K << " n_out=" << sh.n_out << " T=" << nt;
            }
    }
}

// matmul_multi gives each weight the bits matmul() gives it alone: shared activations and one
// pool region change no arithmetic. Covers every path (GEMV, GEMM, row-dot, converted rows),
// odd row counts, an empty weight, and mixed types (which fall back to one call each).
TEST(Matmul, MultiMatchesSeparateCallsBitForBit) {
    std::mt19937 rng(17);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    const int64_t n_in = 512;
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32, GgmlType::F16, GgmlType::Q4_K}) {
        const int64_t rows[] = {301, 7, 0, 1030};
        std::vector<std::vector<uint8_t>> bytes;
        std::vector<WeightView> Ws;
        for (int64_t n : rows) bytes.push_back(random_weights(type, n_in, n, rng));
        for (size_t i = 0; i < bytes.size(); ++i)
            Ws.push_back({type, n_in, rows[i], bytes[i].data(), row_bytes(type, n_in)});
        // A weight of another type in the same call: the fallback path.
        const GgmlType other = type == GgmlType::F32 ? GgmlType::BF16 : GgmlType::F32;
        const std::vector<uint8_t> other_bytes = random_weights(other, n_in, 45, rng);
        const WeightView Wo{other, n_in, 45, other_bytes.data(), row_bytes(other, n_in)};
        for (int64_t T : {1, 3, 21}) {
            std::vector<float> x(size_t(T * n_in));
            for (auto& v : x) v = nd(rng);
            for (cpu::Isa isa : isas()) {
                for (bool mixed : {false, true}) {
                    std::vector<const WeightView*> list;
                    for (const WeightView& W : Ws) list.push_back(&W);
                    if (mixed) list.insert(list.begin() + 1, &Wo);
                    std::vector<std::vector<float>> alone, multi;
                    std::vector<cpu::MatmulOut> outs;
                    for (const WeightView* W : list) {
                        alone.emplace_back(size_t(T * W->n_out), NAN);
                        multi.emplace_back(size_t(T * W->n_out), NAN);
                        cpu::matmul(*W, x.data(), alone.back().data(), T, isa, scratch);
                    }
                    for (size_t i = 0; i < list.size(); ++i) outs.push_back({list[i], multi[i].data()});
                    cpu::matmul_multi(outs.data(), int(outs.size()), x.data(), T, isa, scratch);
                    for (size_t i = 0; i < list.size(); ++i)
                        EXPECT_EQ(0, std::memcmp(alone[i].data(), multi[i].data(), alone[i].size() * 4))
                            << type_traits(list[i]->type).name << " " << cpu::isa_name(isa) << " T=" << T
                            << " weight " << i << (mixed ? " (mixed types)" : "");
                }
            }
        }
    }
}

// K-quants of several types in one matmul_multi (a Q4_K_M file's GDN input projections): at
// decode they share one Q8_K preparation and pool region, each weight through its own GEMV;
// every weight keeps the bits of its lone call, at decode and prefill sizes, on every path.
TEST(Matmul, MultiOfMixedKquantsMatchesSeparateCallsBitForBit) {
    std::mt19937 rng(23);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    const int64_t n_in = 512;
    const std::pair<GgmlType, int64_t> parts[] = {
        {GgmlType::Q4_K, 301}, {GgmlType::Q6_K, 7}, {GgmlType::Q5_K, 1030}, {GgmlType::IQ4_XS, 45}, {GgmlType::Q4_K, 0}};
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<WeightView> Ws;
    for (auto [type, n] : parts) bytes.push_back(random_weights(type, n_in, n, rng));
    for (size_t i = 0; i < bytes.size(); ++i)
        Ws.push_back({parts[i].first, n_in, parts[i].second, bytes[i].data(), row_bytes(parts[i].first, n_in)});
    for (int64_t T : {1, 3, 16, 21}) {
        std::vector<float> x(size_t(T * n_in));
        for (auto& v : x) v = nd(rng);
        for (cpu::Isa isa : isas()) {
            std::vector<std::vector<float>> alone, multi;
            std::vector<cpu::MatmulOut> outs;
            for (const WeightView& W : Ws) {
                alone.emplace_back(size_t(T * W.n_out), NAN);
                multi.emplace_back(size_t(T * W.n_out), NAN);
                cpu::matmul(W, x.data(), alone.back().data(), T, isa, scratch);
            }
            for (size_t i = 0; i < Ws.size(); ++i) outs.push_back({&Ws[i], multi[i].data()});
            cpu::matmul_multi(outs.data(), int(outs.size()), x.data(), T, isa, scratch);
            for (size_t i = 0; i < Ws.size(); ++i)
                EXPECT_EQ(0, std::memcmp(alone[i].data(), multi[i].data(), alone[i].size() * 4))
                    << type_traits(Ws[i].type).name << " " << cpu::isa_name(isa) << " T=" << T << " weight " << i;
        }
    }
}

// matmul_swiglu: the same bits as matmul_multi into (y, u) then cpu::swiglu, on every path,
// token count (decode GEMV, GEMM tiles, a partial last token tile) and row count (a partial
// last row chunk); close to the reference composition (ref::matmul on the effective input,
// ref::swiglu). A gate and up of different types take the unfused path.
TEST(Matmul, SwigluMatchesSeparateProductsBitForBit) {
    std::mt19937 rng(23);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    cpu::MatmulScratch scratch;
    for (GgmlType type : {GgmlType::BF16, GgmlType::Q8_0, GgmlType::F32, GgmlType::F16, GgmlType::Q4_0}) {
        for (int64_t n_out : {int64_t(37), int64_t(200)}) {
            const int64_t n_in = type == GgmlType::F32 ? 70 : 96;
            const std::vector<uint8_t> gb = random_weights(type, n_in, n_out, rng), ub = random_weights(type, n_in, n_out, rng);
            const WeightView G{type, n_in, n_out, gb.data(), row_bytes(type, n_in)};
            const WeightView U{type, n_in, n_out, ub.data(), row_bytes(type, n_in)};
            for (int64_t T : {1, 4, 5, 70, 129}) {
                std::vector<float> x(size_t(T * n_in)), xe(x.size());
                for (auto& v : x) v = nd(rng);
                cpu::matmul_effective_input(type, x.data(), xe.data(), T, n_in);
                std::vector<float> rg(size_t(T * n_out)), ru(rg.size()), want(rg.size());
                ref::matmul(G, xe.data(), rg.data(), T);
                ref::matmul(U, xe.data(), ru.data(), T);
                ref::swiglu(rg.data(), ru.data(), want.data(), T * n_out);
                for (cpu::Isa isa : isas()) {
                    const std::string what = std::string(type_traits(type).name) + " " + cpu::isa_name(isa) +
                                             " n_out=" + std::to_string(n_out) + " T=" + std::to_string(T);
                    std::vector<float> y(rg.size(), NAN), u(rg.size(), NAN), sy(rg.size(), NAN), su(rg.size(), NAN);
                    cpu::matmul_swiglu(G, U, x.data(), y.data(), u.data(), T, isa, scratch);
                    const cpu::MatmulOut outs[2] = {{&G, sy.data()}, {&U, su.data()}};
                    cpu::matmul_multi(outs, 2, x.data(), T, isa, scratch);
                    cpu::swiglu(sy.data(), su.data(), sy.data(), T * n_out, isa);
                    EXPECT_EQ(0, std::memcmp(y.data(), sy.data(), y.size() * 4)) << what;
                    EXPECT_LT(rel_err(y, want), 1e-4) << what;  // two 1e-5 products through silu
                }
            }
        }
    }
    // Mixed types: the unfused path, still the same bits.
    const int64_t n_in = 64, n_out = 50, T = 33;
    const std::vector<uint8_t> gb = random_weights(GgmlType::BF16, n_in, n_out, rng);
    const std::vector<uint8_t> ub = random_weights(GgmlType::Q8_0, n_in, n_out, rng);
    const WeightView G{GgmlType::BF16, n_in, n_out, gb.data(), row_bytes(GgmlType::BF16, n_in)};
    const WeightView U{GgmlType::Q8_0, n_in, n_out, ub.data(), row_bytes(GgmlType::Q8_0, n_in)};
    std::vector<float> x(size_t(T * n_in));
    for (auto& v : x) v = nd(rng);
    std::vector<float> y(size_t(T * n_out)), u(y.size()), sy(y.size()), su(y.size());
    cpu::matmul_swiglu(G, U, x.data(), y.data(), u.data(), T, cpu::active_isa(), scratch);
    cpu::matmul(G, x.data(), sy.data(), T, cpu::active_isa(), scratch);
    cpu::matmul(U, x.data(), su.data(), T, cpu::active_isa(), scratch);
    cpu::swiglu(sy.data(), su.data(), sy.data(), T * n_out, cpu::active_isa());
    EXPECT_EQ(0, std::memcmp(y.data(), sy.data(), y.size() * 4));
}

// The workspace entry points (kernels/cpu/workspace.h): one NaN-filled caller buffer of exactly
// the count for T_max serves every call of up to T_max tokens (each path's token range, the
// converted and rounded-input paths, the fallback of mixed types, the fused SwiGLU items), with
// the bits of a call on its own scratch, and nothing is written past the count.
TEST(Matmul, WorkspaceFromTheCallerServesEveryCallUpToItsTokens) {
    std::mt19937 rng(29);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    constexpr int64_t T_max = 40;
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_K,
                          GgmlType::Q5_0, GgmlType::MXFP4}) {
        const int64_t n_in = type_traits(type).block_elems == 256 ? 512 : 96, n_out = 70;
        const std::vector<uint8_t> gb = random_weights(type, n_in, n_out, rng), ub = random_weights(type, n_in, n_out, rng);
        const std::vector<uint8_t> ob = random_weights(GgmlType::F32, n_in, 9, rng);
        const WeightView G{type, n_in, n_out, gb.data(), row_bytes(type, n_in)};
        const WeightView U{type, n_in, n_out, ub.data(), row_bytes(type, n_in)};
        const WeightView O{GgmlType::F32, n_in, 9, ob.data(), row_bytes(GgmlType::F32, n_in)};
        std::vector<float> x(size_t(T_max * n_in));
        for (auto& v : x) v = nd(rng);
        for (cpu::Isa isa : isas()) {
            std::vector<float> a(size_t(T_max * n_out)), b(a.size()), c(a.size()), d(a.size()), e(9 * T_max), f(e.size());
            const cpu::MatmulOut multi[3] = {{&G, a.data()}, {&O, e.data()}, {&U, c.data()}};
            test::GuardedWorkspace w1(cpu::matmul_workspace_bytes(G, T_max, isa));
            test::GuardedWorkspace w2(cpu::matmul_multi_workspace_bytes(multi, 3, T_max, isa));
            test::GuardedWorkspace w3(cpu::matmul_swiglu_workspace_bytes(G, U, T_max, isa));
            for (int64_t T : {int64_t(1), int64_t(4), int64_t(5), int64_t(16), int64_t(17), T_max}) {
                const std::string what = std::string(type_traits(type).name) + " " + cpu::isa_name(isa) + " T=" + std::to_string(T);
                cpu::MatmulScratch own;
                cpu::matmul(G, x.data(), a.data(), T, isa, w1.get());
                cpu::matmul(G, x.data(), b.data(), T, isa, own);
                EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(T * n_out) * 4)) << what;
                cpu::matmul_multi(multi, 3, x.data(), T, isa, w2.get());
                cpu::matmul(U, x.data(), d.data(), T, isa, own);
                cpu::matmul(O, x.data(), f.data(), T, isa, own);
                EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(T * n_out) * 4)) << what << " multi";
                EXPECT_EQ(0, std::memcmp(c.data(), d.data(), size_t(T * n_out) * 4)) << what << " multi";
                EXPECT_EQ(0, std::memcmp(e.data(), f.data(), size_t(T * 9) * 4)) << what << " multi";
                cpu::matmul_swiglu(G, U, x.data(), a.data(), c.data(), T, isa, w3.get());
                cpu::matmul_swiglu(G, U, x.data(), b.data(), d.data(), T, isa, own);
                EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(T * n_out) * 4)) << what << " swiglu";
            }
            EXPECT_TRUE(w1.canary_intact() && w2.canary_intact() && w3.canary_intact())
                << type_traits(type).name << " " << cpu::isa_name(isa);
        }
    }
}

TEST(Matmul, RejectsRowsThatAreNotWholeBlocks) {
    std::vector<uint8_t> bytes(64 * 34);
    const WeightView W{GgmlType::Q8_0, 48, 2, bytes.data(), 34};
    std::vector<float> x(48, 1.0f), y(2);
    EXPECT_THROW(cpu::matmul(W, x.data(), y.data(), 1), Error);
}

}  // namespace
}  // namespace alloy
