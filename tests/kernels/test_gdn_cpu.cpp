// CPU Gated DeltaNet kernels (kernels/cpu/gdn.h) against the references (kernels/ref/gdn.h),
// every ISA path this CPU runs called explicitly. Tolerances per tensor: relative L2 error
// ||a - b|| / ||b|| below kOutTol for outputs and kStateTol for final states (the contract in
// kernels/cpu/gdn.h); conv states bit-identical. Plus the decode-path properties of the
// serial kernel: bit-identical across thread counts and across token splits over calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "tests/kernels/isa_paths.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/gdn_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/gdn.h"
#include "tests/kernels/gdn_test_util.h"
#include "tests/kernels/workspace_check.h"

namespace {

using alloy::cpu::Isa;
using alloy::ref::GdnMode;
using alloy::ref::GdnParams;
using alloy::ref::GdnShape;
using alloy::ref::GdnWeights;

constexpr double kOutTol = 1e-5;
constexpr double kStateTol = 1e-5;

// The paths to test: every ISA up to the active one (AVX2 has its own delta rule, conv, norms
// and chunked products; the rest of its path is portable).
std::vector<Isa> isas() { return alloy::test::isa_paths(/*has_avx2_code=*/true); }

using namespace alloy::test;


GdnShape shape_of(int H_k, int r, int d_k, int d_v, bool tiled) { return GdnShape{H_k, H_k * r, d_k, d_v, tiled}; }

// Delta-rule inputs as tests/kernels/test_gdn.cpp makes them; wide_g: g in [-20, -1e-4]
// (decay masking), else [-1, -0.01] (the trained regime).
DeltaCase make_delta_case(GdnShape shape, const std::vector<int>& lens, bool wide_g, bool init, uint32_t seed) {
    return alloy::test::make_delta_case(shape, lens, wide_g ? -20.0f : -1.0f, wide_g ? -1e-4f : -0.01f, init, seed);
}

DeltaResult fresh(const DeltaCase& c) {
    return {std::vector<float>((std::size_t)c.T() * c.shape.H_v * c.shape.d_v, NAN), c.state0};
}

DeltaResult ref_serial(const DeltaCase& c) {
    DeltaResult r = fresh(c);
    alloy::ref::gdn_delta_serial(c.shape, c.n_seqs(), c.offs.data(), c.q.data(), c.k.data(), c.v.data(),
                                 c.g.data(), c.beta.data(), r.state.data(), r.out.data());
    return r;
}

DeltaResult cpu_serial(Isa isa, const DeltaCase& c) {
    DeltaResult r = fresh(c);
    alloy::cpu::gdn_delta_serial(isa, c.shape, c.n_seqs(), c.offs.data(), c.q.data(), c.k.data(), c.v.data(),
                                 c.g.data(), c.beta.data(), r.state.data(), r.out.data());
    return r;
}

DeltaResult cpu_chunked(Isa isa, const DeltaCase& c, int chunk) {
    DeltaResult r = fresh(c);
    alloy::cpu::gdn_delta_chunked(isa, c.shape, c.n_seqs(), c.offs.data(), c.q.data(), c.k.data(), c.v.data(),
                                  c.g.data(), c.beta.data(), r.state.data(), r.out.data(), chunk);
    return r;
}

std::string isa_str(Isa isa) { return std::string("isa=") + alloy::cpu::isa_name(isa); }

// Head sizes d_k = d_v in {32, 64, 128}, odd 48, unequal (40, 24) and tiny odd (5, 3).
const std::vector<std::pair<int, int>> kDims{{32, 32}, {64, 64}, {128, 128}, {48, 48}, {40, 24}, {5, 3}};

TEST(GdnCpuDelta, SerialMatchesRef) {
    int idx = 0;
    for (Isa isa : isas())
        for (auto [d_k, d_v] : kDims)
            for (int T : {1, 7, 63, 64, 65, 130}) {
                const int r = 1 + idx % 3;
                const bool tiled = idx % 2 == 0, init = idx % 4 != 1, wide = idx % 3 == 0;
                const auto c = make_delta_case(shape_of(2, r, d_k, d_v, tiled), {T}, wide, init, 10 + idx++);
                const auto want = ref_serial(c), got = cpu_serial(isa, c);
                SCOPED_TRACE(isa_str(isa) + " d_k=" + std::to_string(d_k) + " d_v=" + std::to_string(d_v) +
                             " T=" + std::to_string(T) + " r=" + std::to_string(r));
                EXPECT_LT(rel_err(got.out, want.out), kOutTol);
                EXPECT_LT(rel_err(got.state, want.state), kStateTol);
            }
}

// Against the ref serial within 1e-5, or within 1.5x the ref chunked's own error where the
// chunked form itself is further off on this data (it is, for the state, when g down to -20
// has decayed everything but the chunk's last tokens: ~2e-5 at d = 128, T = C = 64).
TEST(GdnCpuDelta, ChunkedMatchesRefSerial) {
    int idx = 0;
    for (Isa isa : isas())
        for (auto [d_k, d_v] : kDims)
            for (int chunk : {64, 16, 24, 1, 1 << 30})
                for (int T : {1, 7, 63, 64, 65, 130}) {
                    const int r = 1 + idx % 3;
                    const bool tiled = idx % 2 == 0, init = idx % 4 != 1, wide = idx % 3 == 0;
                    const auto c = make_delta_case(shape_of(1, r, d_k, d_v, tiled), {T}, wide, init, 2000 + idx++);
                    const auto want = ref_serial(c), got = cpu_chunked(isa, c, chunk);
                    DeltaResult rc = fresh(c);
                    alloy::ref::gdn_delta_chunked(c.shape, c.n_seqs(), c.offs.data(), c.q.data(), c.k.data(),
                                                  c.v.data(), c.g.data(), c.beta.data(), rc.state.data(),
                                                  rc.out.data(), chunk);
                    SCOPED_TRACE(isa_str(isa) + " d_k=" + std::to_string(d_k) + " d_v=" + std::to_string(d_v) +
                                 " chunk=" + std::to_string(chunk) + " T=" + std::to_string(T));
                    EXPECT_LT(rel_err(got.out, want.out), std::max(kOutTol, 1.5 * rel_err(rc.out, want.out)));
                    EXPECT_LT(rel_err(got.state, want.state), std::max(kStateTol, 1.5 * rel_err(rc.state, want.state)));
                }
}

// Several sequences in one call, one of them empty (its state must come back bit-identical),
// and a batch start offset != 0 in the token numbering.
TEST(GdnCpuDelta, RaggedSequences) {
    const std::vector<int> lens{65, 0, 7, 130, 1};
    int idx = 0;
    for (Isa isa : isas())
        for (int r : {1, 2, 3})
            for (bool tiled : {true, false}) {
                const auto c = make_delta_case(shape_of(2, r, 48, 32, tiled), lens, idx % 2 == 0, true, 300 + idx);
                ++idx;
                const auto want = ref_serial(c);
                std::vector<std::pair<std::string, DeltaResult>> runs{{"serial", cpu_serial(isa, c)}};
                for (int chunk : {64, 16, 24}) runs.push_back({"chunked" + std::to_string(chunk), cpu_chunked(isa, c, chunk)});
                const std::size_t blk = (std::size_t)c.shape.H_v * c.shape.d_v * c.shape.d_k;
                for (const auto& [name, got] : runs) {
                    SCOPED_TRACE(isa_str(isa) + " " + name + " r=" + std::to_string(r) + " tiled=" + std::to_string(tiled));
                    EXPECT_LT(rel_err(got.out, want.out), kOutTol);
                    EXPECT_LT(rel_err(got.state, want.state), kStateTol);
                    for (std::size_t i = 0; i < blk; ++i)
                        ASSERT_EQ(got.state[blk + i], c.state0[blk + i]) << "empty sequence state changed";
                }
            }
}

// Tokens [0, offs[0]) belong to no sequence: the kernels must index by absolute token.
TEST(GdnCpuDelta, NonZeroFirstOffset) {
    for (Isa isa : isas()) {
        auto c = make_delta_case(shape_of(2, 2, 32, 32, true), {5, 40}, false, true, 77);
        c.offs = {5, 45};
        c.state0.resize((std::size_t)c.shape.H_v * c.shape.d_v * c.shape.d_k);
        const auto want = ref_serial(c);
        for (const auto& got : {cpu_serial(isa, c), cpu_chunked(isa, c, 16)}) {
            const std::size_t skip = (std::size_t)5 * c.shape.H_v * c.shape.d_v;
            const std::vector<float> a(got.out.begin() + skip, got.out.end()), b(want.out.begin() + skip, want.out.end());
            EXPECT_LT(rel_err(a, b), kOutTol) << isa_str(isa);
            EXPECT_LT(rel_err(got.state, want.state), kStateTol) << isa_str(isa);
            EXPECT_TRUE(std::isnan(got.out[0])) << "wrote an output row of a token outside every sequence";
        }
    }
}

// Qwen3.5 sizes: d = 128, H_k = 16, H_v = 48 (27B), the production chunk 64.
TEST(GdnCpuDelta, QwenShape) {
    const auto c = make_delta_case(shape_of(16, 3, 128, 128, true), {130, 3}, false, true, 901);
    const auto want = ref_serial(c);
    for (Isa isa : isas()) {
        const auto s = cpu_serial(isa, c), ch = cpu_chunked(isa, c, 64);
        EXPECT_LT(rel_err(s.out, want.out), kOutTol) << isa_str(isa);
        EXPECT_LT(rel_err(s.state, want.state), kStateTol) << isa_str(isa);
        EXPECT_LT(rel_err(ch.out, want.out), kOutTol) << isa_str(isa);
        EXPECT_LT(rel_err(ch.state, want.state), kStateTol) << isa_str(isa);
    }
}

// The serial kernel is the decode and verification path: its results must not depend on the
// thread count (nor do the chunked kernel's, by construction; checked too). The chunked
// kernel picks its variant from (sequence, head) pairs vs threads: 1 and 2 threads run the
// pipelined one (18 pairs), 16 threads the batched one; all must give the same bits.
TEST(GdnCpuDelta, ThreadCountDoesNotChangeResults) {
    const int before = alloy::cpu::n_threads();
    const auto c = make_delta_case(shape_of(3, 2, 64, 48, false), {70, 0, 33, 1}, false, true, 55);
    for (Isa isa : isas()) {
        alloy::cpu::set_n_threads(1);
        const auto s1 = cpu_serial(isa, c), c1 = cpu_chunked(isa, c, 16);
        alloy::cpu::set_n_threads(2);
        const auto s2 = cpu_serial(isa, c), c2 = cpu_chunked(isa, c, 16);
        alloy::cpu::set_n_threads(3);
        const auto s3 = cpu_serial(isa, c);
        alloy::cpu::set_n_threads(16);
        const auto c16 = cpu_chunked(isa, c, 16);
        EXPECT_EQ(s1.out, s2.out) << isa_str(isa);
        EXPECT_EQ(s1.state, s2.state) << isa_str(isa);
        EXPECT_EQ(s1.out, s3.out) << isa_str(isa);
        EXPECT_EQ(s1.state, s3.state) << isa_str(isa);
        EXPECT_EQ(c1.out, c2.out) << isa_str(isa);
        EXPECT_EQ(c1.state, c2.state) << isa_str(isa);
        EXPECT_EQ(c1.out, c16.out) << isa_str(isa);
        EXPECT_EQ(c1.state, c16.state) << isa_str(isa);
    }
    alloy::cpu::set_n_threads(before);
}

// Decode: T tokens as T calls of one token (and other splits) == one call over T tokens,
// bit for bit, for the serial kernel (splits cross its internal 64-token blocks).
TEST(GdnCpuDelta, SerialSplitsAreBitIdentical) {
    for (auto [d_k, d_v] : std::vector<std::pair<int, int>>{{128, 128}, {48, 20}})
        for (Isa isa : isas()) {
            const auto c = make_delta_case(shape_of(2, 2, d_k, d_v, true), {150}, false, true, 66);
            const auto whole = cpu_serial(isa, c);
            for (int piece : {1, 3, 64, 100}) {
                DeltaResult got = fresh(c);
                for (int t0 = 0; t0 < c.T(); t0 += piece) {
                    const int32_t offs[2] = {t0, std::min(c.T(), t0 + piece)};
                    alloy::cpu::gdn_delta_serial(isa, c.shape, 1, offs, c.q.data(), c.k.data(), c.v.data(), c.g.data(),
                                                 c.beta.data(), got.state.data(), got.out.data());
                }
                EXPECT_EQ(got.out, whole.out) << isa_str(isa) << " piece=" << piece << " d_k=" << d_k;
                EXPECT_EQ(got.state, whole.state) << isa_str(isa) << " piece=" << piece << " d_k=" << d_k;
            }
        }
}

// Chunked prefill then serial decode continue the same state (the model's call pattern).
TEST(GdnCpuDelta, ChunkedThenSerialCarriesState) {
    const auto c = make_delta_case(shape_of(2, 1, 64, 64, true), {100}, false, true, 88);
    const auto want = ref_serial(c);
    for (Isa isa : isas()) {
        DeltaResult got = fresh(c);
        const int32_t pre[2] = {0, 90};
        alloy::cpu::gdn_delta_chunked(isa, c.shape, 1, pre, c.q.data(), c.k.data(), c.v.data(), c.g.data(),
                                      c.beta.data(), got.state.data(), got.out.data(), 64);
        for (int t = 90; t < 100; ++t) {
            const int32_t offs[2] = {t, t + 1};
            alloy::cpu::gdn_delta_serial(isa, c.shape, 1, offs, c.q.data(), c.k.data(), c.v.data(), c.g.data(),
                                         c.beta.data(), got.state.data(), got.out.data());
        }
        EXPECT_LT(rel_err(got.out, want.out), kOutTol) << isa_str(isa);
        EXPECT_LT(rel_err(got.state, want.state), kStateTol) << isa_str(isa);
    }
}

TEST(GdnCpuDelta, RejectsBadArguments) {
    const auto c = make_delta_case(shape_of(2, 2, 8, 8, true), {5, 3}, false, true, 3);
    std::vector<float> out((std::size_t)8 * 4 * 8), st = c.state0;
    auto chunked = [&](GdnShape s, std::vector<int32_t> offs, int chunk) {
        alloy::cpu::gdn_delta_chunked(s, 2, offs.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(),
                                      c.beta.data(), st.data(), out.data(), chunk);
    };
    EXPECT_THROW(chunked(GdnShape{3, 4, 8, 8, true}, c.offs, 16), alloy::Error);  // H_v % H_k
    EXPECT_THROW(chunked(GdnShape{2, 4, 0, 8, true}, c.offs, 16), alloy::Error);  // d_k = 0
    EXPECT_THROW(chunked(c.shape, c.offs, 0), alloy::Error);                      // chunk 0
    EXPECT_THROW(chunked(c.shape, {0, 5, 4}, 16), alloy::Error);                  // decreasing
    EXPECT_THROW(alloy::cpu::gdn_delta_serial(c.shape, 2, c.offs.data(), c.q.data(), nullptr, c.v.data(),
                                              c.g.data(), c.beta.data(), st.data(), out.data()),
                 alloy::Error);
    EXPECT_THROW(alloy::cpu::gdn_delta_serial(c.shape, -1, c.offs.data(), c.q.data(), c.k.data(), c.v.data(),
                                              c.g.data(), c.beta.data(), st.data(), out.data()),
                 alloy::Error);
}

// ---------------------------------------------------------------------------------------
// The GEMM and triangular inverse under the chunked kernel, against float64 loops.

TEST(GdnCpuGemm, MatchesFloat64) {
    using alloy::cpu::gdn::Tri;
    Rng rng(5);
    for (Isa isa : isas())
        for (auto [M, N, K] : std::vector<std::array<int, 3>>{{1, 1, 1}, {6, 64, 128}, {7, 65, 13}, {64, 128, 64},
                                                               {13, 17, 13}, {130, 3, 130}, {33, 33, 33}})
            for (Tri tri : {Tri::None, Tri::LowerA, Tri::LowerC})
                for (float cs : {0.0f, 1.0f, 0.37f}) {
                    if (tri == Tri::LowerA && M != K) continue;
                    const int lda = K + 3, ldb = N + 5, ldc = N + 2;
                    std::vector<float> A = rng.vec((std::size_t)M * lda, -1, 1), B = rng.vec((std::size_t)K * ldb, -1, 1);
                    std::vector<float> C0 = rng.vec((std::size_t)M * ldc, -1, 1);
                    if (tri == Tri::LowerA)
                        for (int r = 0; r < M; ++r)
                            for (int s = r + 1; s < K; ++s) A[(std::size_t)r * lda + s] = 0.0f;
                    std::vector<float> C = C0;
                    if (cs == 0.0f) std::fill(C.begin(), C.end(), NAN);  // must not be read
                    alloy::cpu::gdn::gemm(isa, {M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc, cs, tri});
                    double worst = 0;
                    for (int r = 0; r < M; ++r)
                        for (int j = 0; j < N; ++j) {
                            if (tri == Tri::LowerC && j > r) continue;
                            double want = cs == 0.0f ? 0.0 : (double)cs * C0[(std::size_t)r * ldc + j];
                            for (int k = 0; k < K; ++k) want += (double)A[(std::size_t)r * lda + k] * B[(std::size_t)k * ldb + j];
                            worst = std::max(worst, std::abs(want - C[(std::size_t)r * ldc + j]));
                        }
                    EXPECT_LT(worst, 1e-4) << isa_str(isa) << " M=" << M << " N=" << N << " K=" << K
                                           << " tri=" << (int)tri << " cs=" << cs;
                    // Padding columns of each row (beyond N) are never written.
                    for (int r = 0; r < M; ++r)
                        for (int j = N; j < ldc; ++j)
                            if (cs != 0.0f) {
                                ASSERT_EQ(C[(std::size_t)r * ldc + j], C0[(std::size_t)r * ldc + j]);
                            }
                }
}

TEST(GdnCpuGemm, TriInverse) {
    Rng rng(9);
    for (Isa isa : isas())
        for (int n : {1, 2, 5, 16, 17, 31, 33, 64, 70}) {
            // A as stage 1 builds it: beta_r (k_r . k_s) exp(G_r - G_s) with unit keys; noise above.
            const int d = 16, ld = n + 3;
            std::vector<float> keys = rng.vec((std::size_t)n * d, -1, 1), G(n);
            l2_normalise_rows(keys, d);
            float acc = 0;
            for (auto& e : G) e = acc += rng.uniform(-1.0f, -0.01f);
            std::vector<float> A = rng.vec((std::size_t)n * ld, -1, 1), T((std::size_t)n * ld, NAN);
            for (int r = 0; r < n; ++r) {
                const float beta = rng.uniform(0, 1);
                for (int s = 0; s < r; ++s) {
                    double kk = 0;
                    for (int i = 0; i < d; ++i) kk += keys[r * d + i] * keys[s * d + i];
                    A[(std::size_t)r * ld + s] = (float)(beta * kk * std::exp(G[r] - G[s]));
                }
            }
            std::vector<float> scratch((std::size_t)16 * n + 256);
            alloy::cpu::gdn::tri_inverse(isa, n, A.data(), ld, T.data(), ld, scratch.data());
            double err = 0;
            for (int r = 0; r < n; ++r)
                for (int c = 0; c < n; ++c) {
                    double s = T[(std::size_t)r * ld + c];  // (T (I + tril(A, -1)))[r][c]
                    for (int m = c + 1; m < n; ++m) s += (double)T[(std::size_t)r * ld + m] * A[(std::size_t)m * ld + c];
                    err = std::max(err, std::abs(s - (r == c ? 1.0 : 0.0)));
                    if (c > r) {
                        ASSERT_EQ(T[(std::size_t)r * ld + c], 0.0f) << "n=" << n;
                    }
                }
            EXPECT_LT(err, 1e-5) << isa_str(isa) << " n=" << n;
        }
}

// ---------------------------------------------------------------------------------------
// Fused layer op.

struct FusedCase {
    GdnParams p;
    std::vector<int32_t> offs;
    std::vector<float> qkv, z, a, b, conv1d, ssm_a, dt_bias, norm, conv_state0, state0;
    int n_seqs() const { return (int)offs.size() - 1; }
    int T() const { return offs.back(); }
    int conv_dim() const { return 2 * p.shape.H_k * p.shape.d_k + p.shape.H_v * p.shape.d_v; }
    GdnWeights weights() const { return {conv1d.data(), ssm_a.data(), dt_bias.data(), norm.data()}; }
};

FusedCase make_fused_case(GdnShape shape, const std::vector<int>& lens, int K, bool init, uint32_t seed) {
    Rng rng(seed);
    FusedCase c;
    c.p.shape = shape;
    c.p.conv_kernel = K;
    c.offs = offsets_of(lens);
    const std::size_t T = c.T(), H_v = shape.H_v, cd = c.conv_dim();
    c.qkv = rng.vec(T * cd, -1, 1);
    c.z = rng.vec(T * H_v * shape.d_v, -2, 2);
    c.a = rng.vec(T * H_v, -3, 3);
    c.b = rng.vec(T * H_v, -3, 3);
    c.conv1d = rng.vec(cd * K, -0.6f, 0.6f);
    c.ssm_a = rng.vec(H_v, -2, 1);
    for (auto& e : c.ssm_a) e = -std::exp(e);
    c.dt_bias = rng.vec(H_v, -1, 1);
    c.norm = rng.vec(shape.d_v, 0.5f, 1.5f);
    const std::size_t ncs = (std::size_t)c.n_seqs() * cd * (K - 1), ns = (std::size_t)c.n_seqs() * H_v * shape.d_v * shape.d_k;
    c.conv_state0 = init ? rng.vec(ncs, -1, 1) : std::vector<float>(ncs, 0.0f);
    c.state0 = init ? rng.vec(ns, -1, 1) : std::vector<float>(ns, 0.0f);
    return c;
}

struct FusedResult {
    std::vector<float> y, conv_state, state;
};

template <class Fn>
FusedResult run_fused(const FusedCase& c, GdnMode mode, int chunk, Fn&& fn) {
    FusedResult r{std::vector<float>((std::size_t)c.T() * c.p.shape.H_v * c.p.shape.d_v), c.conv_state0, c.state0};
    GdnParams p = c.p;
    p.mode = mode;
    p.chunk_size = chunk;
    fn(p, c.weights(), c.n_seqs(), c.offs.data(), c.qkv.data(), c.z.data(), c.a.data(), c.b.data(),
       r.conv_state.data(), r.state.data(), r.y.data());
    return r;
}

// Sequence lengths {70, 0, 2, 37} take the conv path for long inputs; {1, 0, 2, 16} (every
// sequence at most 16 tokens, two shorter than the conv window) the channel-major decode one.
TEST(GdnCpuFused, MatchesRef) {
    int idx = 0;
    for (Isa isa : isas())
        // {36, 20}: conv widths 144 + 40 r, not multiples of 16 (the vector conv's channel tail).
        for (auto [d_k, d_v] : std::vector<std::pair<int, int>>{{32, 32}, {128, 128}, {48, 40}, {36, 20}})
            for (int r : {1, 2, 3})
                for (GdnMode mode : {GdnMode::Serial, GdnMode::Chunked}) {
                    const bool init = idx % 2 == 0;
                    const int K = idx % 3 == 0 ? 2 : idx % 3 == 1 ? 4 : 3;
                    const std::vector<int> lens = idx % 4 == 3 ? std::vector<int>{1, 0, 2, 16} : std::vector<int>{70, 0, 2, 37};
                    const auto c = make_fused_case(shape_of(2, r, d_k, d_v, idx % 4 < 2), lens, K, init, 700 + idx);
                    ++idx;
                    const int chunk = idx % 2 ? 64 : 16;
                    const auto want = run_fused(c, mode, chunk, [](auto&&... a) { alloy::ref::gdn_fused(a...); });
                    const auto got = run_fused(c, mode, chunk, [isa](auto&&... a) { alloy::cpu::gdn_fused(isa, a...); });
                    SCOPED_TRACE(isa_str(isa) + " d_k=" + std::to_string(d_k) + " r=" + std::to_string(r) +
                                 " mode=" + std::to_string((int)mode) + " K=" + std::to_string(K) +
                                 " short_seqs=" + std::to_string(lens[0] == 1));
                    EXPECT_LT(rel_err(got.y, want.y), kOutTol);
                    EXPECT_LT(rel_err(got.state, want.state), kStateTol);
                    EXPECT_EQ(got.conv_state, want.conv_state);
                }
}

// Decode through the fused op: one token per call, conv state shorter than K-1 at first. The
// one-token calls take the channel-major conv (AVX-512), the 19-token call the transposed one:
// the same bits, for tiled and grouped value heads, 1 to 3 value heads a key head, conv widths
// 2 to 4.
TEST(GdnCpuFused, TokenByTokenMatchesOneCall) {
    int idx = 0;
    for (auto [r, tiled, d, K] : std::vector<std::tuple<int, bool, int, int>>{
             {2, true, 64, 4}, {1, true, 128, 4}, {3, false, 48, 3}, {2, false, 32, 2}, {3, true, 40, 4}})
    for (Isa isa : isas()) {
        const auto c = make_fused_case(shape_of(2, r, d, d, tiled), {19}, K, true, 41 + idx++);
        SCOPED_TRACE("r=" + std::to_string(r) + " tiled=" + std::to_string(tiled) + " d=" + std::to_string(d) +
                     " K=" + std::to_string(K));
        const auto whole = run_fused(c, GdnMode::Serial, 1, [isa](auto&&... a) { alloy::cpu::gdn_fused(isa, a...); });
        FusedResult r{std::vector<float>(whole.y.size()), c.conv_state0, c.state0};
        GdnParams p = c.p;
        p.mode = GdnMode::Serial;
        const int cd = c.conv_dim(), vd = c.p.shape.H_v * c.p.shape.d_v, H_v = c.p.shape.H_v;
        for (int t = 0; t < c.T(); ++t) {
            const int32_t offs[2] = {0, 1};
            alloy::cpu::gdn_fused(isa, p, c.weights(), 1, offs, c.qkv.data() + (std::size_t)t * cd,
                                  c.z.data() + (std::size_t)t * vd, c.a.data() + (std::size_t)t * H_v,
                                  c.b.data() + (std::size_t)t * H_v, r.conv_state.data(), r.state.data(),
                                  r.y.data() + (std::size_t)t * vd);
        }
        EXPECT_EQ(r.y, whole.y) << isa_str(isa);
        EXPECT_EQ(r.state, whole.state) << isa_str(isa);
        EXPECT_EQ(r.conv_state, whole.conv_state) << isa_str(isa);
    }
}

// A batch of sequences on slots of a larger state (the slot state cache's layout): each
// sequence's y and slot states are bit for bit those of running it alone on its slot, for ref
// and every ISA path and both modes; a slot no sequence names is untouched.
TEST(GdnCpuFused, SlotsGiveEachSequenceItsOwnState) {
    const std::vector<int> lens = {5, 1, 0, 33};
    const std::vector<int32_t> slots = {3, 0, 4, 1};  // slot 2 unused
    const int n_slots = 5;
    const auto c = make_fused_case(shape_of(2, 2, 32, 32, true), lens, 4, true, 91);
    const int cd = c.conv_dim(), vd = c.p.shape.H_v * c.p.shape.d_v;
    const std::size_t cs = (std::size_t)cd * 3, ss = (std::size_t)c.p.shape.H_v * c.p.shape.d_v * c.p.shape.d_k;
    Rng rng(92);
    const std::vector<float> conv0 = rng.vec(cs * n_slots, -1, 1), state0 = rng.vec(ss * n_slots, -1, 1);
    for (int which = 0; which < 1 + (int)isas().size(); ++which)
        for (GdnMode mode : {GdnMode::Serial, GdnMode::Chunked}) {
            const bool ref = which == 0;
            const Isa isa = ref ? Isa::Scalar : isas()[which - 1];
            auto fused = [&](int n, const int32_t* offs, float* conv, float* st, float* y, const int32_t* sl) {
                GdnParams p = c.p;
                p.mode = mode;
                p.chunk_size = 16;
                if (ref) alloy::ref::gdn_fused(p, c.weights(), n, offs, c.qkv.data(), c.z.data(), c.a.data(), c.b.data(), conv, st, y, sl);
                else alloy::cpu::gdn_fused(isa, p, c.weights(), n, offs, c.qkv.data(), c.z.data(), c.a.data(), c.b.data(), conv, st, y, sl);
            };
            std::vector<float> conv = conv0, st = state0, y((std::size_t)c.T() * vd);
            fused(c.n_seqs(), c.offs.data(), conv.data(), st.data(), y.data(), slots.data());
            std::vector<float> conv1 = conv0, st1 = state0, y1(y.size());
            for (int s = 0; s < c.n_seqs(); ++s)
                fused(1, c.offs.data() + s, conv1.data() + slots[s] * cs, st1.data() + slots[s] * ss, y1.data(), nullptr);
            SCOPED_TRACE(std::string(ref ? "ref" : isa_str(isa)) + " mode=" + std::to_string((int)mode));
            EXPECT_EQ(y, y1);
            EXPECT_EQ(conv, conv1);
            EXPECT_EQ(st, st1);
            EXPECT_TRUE(std::equal(st.begin() + 2 * ss, st.begin() + 3 * ss, state0.begin() + 2 * ss));
            EXPECT_TRUE(std::equal(conv.begin() + 2 * cs, conv.begin() + 3 * cs, conv0.begin() + 2 * cs));
        }
}

// The workspace entry point (kernels/cpu/workspace.h): a NaN-filled caller buffer of exactly
// gdn_fused_workspace_bytes gives the bits of a call on its own scratch and is written only
// within its count, in both modes, for the decode conv path, ragged batches and one sequence
// of few heads (the chunked kernel's batched schedule, whose stage-1 products live there).
TEST(GdnCpuFused, WorkspaceFromTheCaller) {
    int idx = 0;
    for (const std::vector<int>& lens : std::vector<std::vector<int>>{{70, 0, 2, 37}, {1, 0, 2, 16}, {150}})
        for (GdnMode mode : {GdnMode::Serial, GdnMode::Chunked})
            for (int chunk : {16, 64}) {
                const auto c = make_fused_case(shape_of(1, 2, 32, 32, true), lens, 4, true, 800 + idx++);
                GdnParams p = c.p;
                p.mode = mode;
                p.chunk_size = chunk;
                for (Isa isa : isas()) {
                    GuardedWorkspace w(alloy::cpu::gdn_fused_workspace_bytes(p, c.n_seqs(), c.T()));
                    const auto own = run_fused(c, mode, chunk, [isa](auto&&... a) { alloy::cpu::gdn_fused(isa, a...); });
                    const auto got = run_fused(c, mode, chunk, [&](auto&&... a) { alloy::cpu::gdn_fused(isa, a..., nullptr, w.get()); });
                    SCOPED_TRACE(isa_str(isa) + " lens[0]=" + std::to_string(lens[0]) + " mode=" + std::to_string((int)mode) +
                                 " chunk=" + std::to_string(chunk));
                    EXPECT_EQ(got.y, own.y);
                    EXPECT_EQ(got.state, own.state);
                    EXPECT_EQ(got.conv_state, own.conv_state);
                    EXPECT_TRUE(w.canary_intact());
                }
            }
}

TEST(GdnCpuFused, RejectsBadArguments) {
    auto c = make_fused_case(shape_of(2, 1, 4, 4, true), {3}, 4, true, 61);
    auto cpu = [](auto&&... a) { alloy::cpu::gdn_fused(a...); };
    c.p.conv_kernel = 0;
    EXPECT_THROW(run_fused(c, GdnMode::Serial, 1, cpu), alloy::Error);
    c.p.conv_kernel = 4;
    EXPECT_THROW(run_fused(c, GdnMode::Chunked, 0, cpu), alloy::Error);
    c.offs = {0, 4, 3};
    EXPECT_THROW(run_fused(c, GdnMode::Serial, 1, cpu), alloy::Error);
}

}  // namespace
