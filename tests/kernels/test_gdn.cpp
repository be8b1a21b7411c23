// Gated DeltaNet reference kernels (kernels/ref/gdn.h): the recurrence against a float64
// oracle written here, the chunked form against the recurrence, the fused layer op against
// a float64 re-implementation, and state carrying across calls. Tolerances: relative L2
// error ||a - b|| / ||b|| < 1e-5 for every fp32 comparison (spec/GDN.md section 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "kernels/ref/gdn.h"
#include "tests/kernels/gdn_test_util.h"

namespace {

using alloy::ref::GdnMode;
using alloy::ref::GdnParams;
using alloy::ref::GdnShape;
using alloy::ref::GdnWeights;
using alloy::ref::TriInverse;

constexpr double kTol = 1e-5;

using namespace alloy::test;


DeltaResult run_serial(const DeltaCase& c) {
    DeltaResult r{std::vector<float>((std::size_t)c.T() * c.shape.H_v * c.shape.d_v), c.state0};
    alloy::ref::gdn_delta_serial(c.shape, c.n_seqs(), c.offs.data(), c.q.data(), c.k.data(),
                                 c.v.data(), c.g.data(), c.beta.data(), r.state.data(), r.out.data());
    return r;
}

DeltaResult run_chunked(const DeltaCase& c, int chunk, TriInverse inv) {
    DeltaResult r{std::vector<float>((std::size_t)c.T() * c.shape.H_v * c.shape.d_v), c.state0};
    alloy::ref::gdn_delta_chunked(c.shape, c.n_seqs(), c.offs.data(), c.q.data(), c.k.data(),
                                  c.v.data(), c.g.data(), c.beta.data(), r.state.data(),
                                  r.out.data(), chunk, inv);
    return r;
}

// Float64 oracle of the recurrence (spec/GDN.md section 1) in the natural S[i][j] layout
// (key index i, value index j), converted to the kernels' transposed layout at the end.
DeltaResult oracle_delta(const DeltaCase& c) {
    const GdnShape& s = c.shape;
    const int r = s.H_v / s.H_k;
    DeltaResult res{std::vector<float>((std::size_t)c.T() * s.H_v * s.d_v), c.state0};
    for (int seq = 0; seq < c.n_seqs(); ++seq) {
        for (int h = 0; h < s.H_v; ++h) {
            const int kh = s.tiled ? h % s.H_k : h / r;
            float* st = res.state.data() + ((std::size_t)seq * s.H_v + h) * s.d_v * s.d_k;
            std::vector<double> S((std::size_t)s.d_k * s.d_v);  // S[i][j]
            for (int i = 0; i < s.d_k; ++i)
                for (int j = 0; j < s.d_v; ++j) S[i * s.d_v + j] = st[j * s.d_k + i];
            for (int t = c.offs[seq]; t < c.offs[seq + 1]; ++t) {
                const float* q = &c.q[((std::size_t)t * s.H_k + kh) * s.d_k];
                const float* k = &c.k[((std::size_t)t * s.H_k + kh) * s.d_k];
                const float* v = &c.v[((std::size_t)t * s.H_v + h) * s.d_v];
                const double alpha = std::exp((double)c.g[t * s.H_v + h]), beta = c.beta[t * s.H_v + h];
                for (auto& e : S) e *= alpha;
                for (int j = 0; j < s.d_v; ++j) {
                    double stk = 0;
                    for (int i = 0; i < s.d_k; ++i) stk += S[i * s.d_v + j] * k[i];
                    const double delta = beta * (v[j] - stk);
                    for (int i = 0; i < s.d_k; ++i) S[i * s.d_v + j] += k[i] * delta;
                }
                for (int j = 0; j < s.d_v; ++j) {
                    double o = 0;
                    for (int i = 0; i < s.d_k; ++i) o += S[i * s.d_v + j] * q[i];
                    res.out[((std::size_t)t * s.H_v + h) * s.d_v + j] = (float)o;
                }
            }
            for (int i = 0; i < s.d_k; ++i)
                for (int j = 0; j < s.d_v; ++j) st[j * s.d_k + i] = (float)S[i * s.d_v + j];
        }
    }
    return res;
}

GdnShape shape_of(int H_k, int r, int d_k, int d_v, bool tiled) {
    return GdnShape{H_k, H_k * r, d_k, d_v, tiled};
}

TEST(GdnDelta, SerialMatchesFloat64Oracle) {
    int seed = 1;
    for (int r : {1, 2, 3})
        for (bool tiled : {true, false})
            for (bool wide : {true, false}) {
                const auto c = make_delta_case(shape_of(2, r, 16, 12, tiled), {9, 0, 17, 1},
                                               wide ? -20.0f : -1.0f, wide ? -1e-4f : -0.01f,
                                               /*init_state=*/true, seed++);
                const auto got = run_serial(c), want = oracle_delta(c);
                SCOPED_TRACE("r=" + std::to_string(r) + " tiled=" + std::to_string(tiled) +
                             " wide=" + std::to_string(wide));
                EXPECT_LT(rel_err(got.out, want.out), kTol);
                EXPECT_LT(rel_err(got.state, want.state), kTol);
            }
}

// The key-head maps differ for r > 1, so tiled and grouped runs of the same data must differ
// (guards against the `tiled` flag being ignored).
TEST(GdnDelta, HeadMapMatters) {
    auto c = make_delta_case(shape_of(3, 2, 8, 8, true), {12}, -1.0f, -0.01f, true, 7);
    const auto tiled = run_serial(c);
    c.shape.tiled = false;
    const auto grouped = run_serial(c);
    EXPECT_GT(rel_err(tiled.out, grouped.out), 1e-2);
}

TEST(GdnDelta, TriInverseBothMethods) {
    Rng rng(11);
    for (int n : {1, 2, 3, 5, 16, 24, 64}) {
        // A as stage 1 builds it: beta_r (k_r . k_s) exp(G_r - G_s), unit keys in d = 16,
        // realistic decay; the upper part holds noise that must be ignored.
        const int d = 16;
        std::vector<float> keys = rng.vec((std::size_t)n * d, -1, 1), G(n);
        l2_normalise_rows(keys, d);
        float acc = 0;
        for (auto& e : G) e = acc += rng.uniform(-1.0f, -0.01f);
        std::vector<float> A = rng.vec((std::size_t)n * n, -1, 1);
        for (int r = 0; r < n; ++r) {
            const float beta = rng.uniform(0, 1);
            for (int s = 0; s < r; ++s) {
                double kk = 0;
                for (int i = 0; i < d; ++i) kk += keys[r * d + i] * keys[s * d + i];
                A[r * n + s] = (float)(beta * kk * std::exp(G[r] - G[s]));
            }
        }
        for (auto inv : {TriInverse::Substitution, TriInverse::Squaring}) {
            std::vector<float> T((std::size_t)n * n);
            alloy::ref::gdn_tri_inverse(n, A.data(), T.data(), inv);
            // Check T (I + tril(A, -1)) = I in double.
            double err = 0;
            for (int r = 0; r < n; ++r)
                for (int c = 0; c < n; ++c) {
                    double acc = T[r * n + c];
                    for (int s = c + 1; s < n; ++s) acc += (double)T[r * n + s] * A[s * n + c];
                    err = std::max(err, std::abs(acc - (r == c ? 1.0 : 0.0)));
                    if (c > r) {
                        EXPECT_EQ(T[r * n + c], 0.0f);
                    }
                }
            EXPECT_LT(err, 1e-5) << "n=" << n << " squaring=" << (inv == TriInverse::Squaring);
        }
    }
}

// Chunked vs serial over chunk sizes x lengths x g regimes x inverse methods; head ratio, head
// map and initial state rotate with the case index so that every combination appears.
TEST(GdnDelta, ChunkedMatchesSerial) {
    int idx = 0;
    for (int chunk : {1, 8, 16, 32, 64, 24, 1 << 30})  // the last: one chunk per sequence
        for (int T : {1, 7, 8, 63, 64, 65, 130})
            for (bool wide : {true, false})
                for (auto inv : {TriInverse::Substitution, TriInverse::Squaring}) {
                    const int r = 1 + idx % 3;
                    const bool tiled = idx % 2 == 0, init = (idx / 2) % 2 == 0;
                    const auto c = make_delta_case(shape_of(2, r, 32, 24, tiled), {T},
                                                   wide ? -20.0f : -1.0f, wide ? -1e-4f : -0.01f,
                                                   init, 100 + idx);
                    ++idx;
                    const auto want = run_serial(c), got = run_chunked(c, chunk, inv);
                    SCOPED_TRACE("chunk=" + std::to_string(chunk) + " T=" + std::to_string(T) +
                                 " wide=" + std::to_string(wide) + " squaring=" +
                                 std::to_string(inv == TriInverse::Squaring) + " r=" +
                                 std::to_string(r) + " tiled=" + std::to_string(tiled) +
                                 " init=" + std::to_string(init));
                    EXPECT_LT(rel_err(got.out, want.out), kTol);
                    EXPECT_LT(rel_err(got.state, want.state), kTol);
                }
}

// Several sequences of different lengths (one empty) in one call; the empty sequence's state
// must come back bit-identical.
TEST(GdnDelta, ChunkedRaggedSequences) {
    const std::vector<int> lens{65, 0, 7, 130, 1};
    int idx = 0;
    for (int chunk : {1, 16, 24, 64})
        for (int r : {1, 2, 3})
            for (bool tiled : {true, false})
                for (bool init : {true, false}) {
                    const auto inv = idx % 2 ? TriInverse::Squaring : TriInverse::Substitution;
                    const auto c = make_delta_case(shape_of(2, r, 16, 20, tiled), lens, -1.0f,
                                                   -0.01f, init, 500 + idx++);
                    const auto want = run_serial(c), got = run_chunked(c, chunk, inv);
                    SCOPED_TRACE("chunk=" + std::to_string(chunk) + " r=" + std::to_string(r) +
                                 " tiled=" + std::to_string(tiled) + " init=" + std::to_string(init));
                    EXPECT_LT(rel_err(got.out, want.out), kTol);
                    EXPECT_LT(rel_err(got.state, want.state), kTol);
                    const std::size_t blk = (std::size_t)c.shape.H_v * c.shape.d_v * c.shape.d_k;
                    for (const auto* st : {&got.state, &want.state})
                        for (std::size_t i = 0; i < blk; ++i)
                            ASSERT_EQ((*st)[blk + i], c.state0[blk + i]) << "empty sequence state changed";
                }
}

// Qwen3.5 head sizes (d = 128, H_k = 16, H_v = 32), both g regimes, the production chunk 64.
TEST(GdnDelta, ChunkedMatchesSerialQwenShape) {
    for (bool wide : {true, false}) {
        const auto c = make_delta_case(shape_of(16, 2, 128, 128, true), {130, 3}, wide ? -20.0f : -1.0f,
                                       wide ? -1e-4f : -0.01f, true, wide ? 901 : 902);
        const auto want = run_serial(c), got = run_chunked(c, 64, TriInverse::Substitution);
        EXPECT_LT(rel_err(got.out, want.out), kTol) << "wide=" << wide;
        EXPECT_LT(rel_err(got.state, want.state), kTol) << "wide=" << wide;
    }
}

// The final state carries across calls: T tokens in one call == the same tokens in two calls.
TEST(GdnDelta, StateCarriesAcrossCalls) {
    const auto c = make_delta_case(shape_of(2, 2, 16, 12, false), {77}, -1.0f, -0.01f, true, 31);
    const auto whole = run_chunked(c, 16, TriInverse::Substitution);
    for (int split : {1, 16, 40}) {
        DeltaCase a = c, b = c;
        const std::size_t qk = (std::size_t)c.shape.H_k * c.shape.d_k, vr = (std::size_t)c.shape.H_v * c.shape.d_v;
        const std::size_t hv = c.shape.H_v;
        a.offs = {0, split};
        b.offs = {0, 77 - split};
        b.q.erase(b.q.begin(), b.q.begin() + split * qk);
        b.k.erase(b.k.begin(), b.k.begin() + split * qk);
        b.v.erase(b.v.begin(), b.v.begin() + split * vr);
        b.g.erase(b.g.begin(), b.g.begin() + split * hv);
        b.beta.erase(b.beta.begin(), b.beta.begin() + split * hv);
        const auto first = run_chunked(a, 16, TriInverse::Substitution);
        b.state0 = first.state;
        const auto second = run_serial(b);
        std::vector<float> out = first.out;
        out.insert(out.end(), second.out.begin(), second.out.end());
        EXPECT_LT(rel_err(out, whole.out), kTol) << "split=" << split;
        EXPECT_LT(rel_err(second.state, whole.state), kTol) << "split=" << split;
    }
}

TEST(GdnDelta, RejectsBadArguments) {
    const auto c = make_delta_case(shape_of(2, 2, 8, 8, true), {5, 3}, -1.0f, -0.01f, true, 3);
    std::vector<float> out((std::size_t)8 * 4 * 8), st = c.state0;
    auto call = [&](GdnShape s, std::vector<int32_t> offs, int chunk) {
        alloy::ref::gdn_delta_chunked(s, 2, offs.data(), c.q.data(), c.k.data(), c.v.data(),
                                      c.g.data(), c.beta.data(), st.data(), out.data(), chunk);
    };
    EXPECT_THROW(call(GdnShape{3, 4, 8, 8, true}, c.offs, 16), alloy::Error);  // H_v % H_k
    EXPECT_THROW(call(GdnShape{2, 4, 0, 8, true}, c.offs, 16), alloy::Error);  // d_k = 0
    EXPECT_THROW(call(c.shape, c.offs, 0), alloy::Error);                      // chunk 0
    EXPECT_THROW(call(c.shape, {0, 5, 4}, 16), alloy::Error);                  // decreasing
    EXPECT_THROW(alloy::ref::gdn_delta_serial(c.shape, 2, c.offs.data(), nullptr, c.k.data(),
                                              c.v.data(), c.g.data(), c.beta.data(), st.data(),
                                              out.data()),
                 alloy::Error);
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

FusedCase make_fused_case(GdnShape shape, const std::vector<int>& lens, bool init, uint32_t seed) {
    Rng rng(seed);
    FusedCase c;
    c.p.shape = shape;
    c.p.conv_kernel = 4;
    c.offs = offsets_of(lens);
    const int T = c.T(), H_v = shape.H_v, cd = c.conv_dim(), K = c.p.conv_kernel;
    c.qkv = rng.vec((std::size_t)T * cd, -1, 1);
    c.z = rng.vec((std::size_t)T * H_v * shape.d_v, -2, 2);
    c.a = rng.vec((std::size_t)T * H_v, -3, 3);
    c.b = rng.vec((std::size_t)T * H_v, -3, 3);
    c.conv1d = rng.vec((std::size_t)cd * K, -0.6f, 0.6f);
    c.ssm_a = rng.vec(H_v, -2, 1);
    for (auto& e : c.ssm_a) e = -std::exp(e);
    c.dt_bias = rng.vec(H_v, -1, 1);
    c.norm = rng.vec(shape.d_v, 0.5f, 1.5f);
    const std::size_t ncs = (std::size_t)c.n_seqs() * cd * (K - 1);
    const std::size_t ns = (std::size_t)c.n_seqs() * H_v * shape.d_v * shape.d_k;
    c.conv_state0 = init ? rng.vec(ncs, -1, 1) : std::vector<float>(ncs, 0.0f);
    c.state0 = init ? rng.vec(ns, -1, 1) : std::vector<float>(ns, 0.0f);
    return c;
}

struct FusedResult {
    std::vector<float> y, conv_state, state;
};

FusedResult run_fused(const FusedCase& c, GdnMode mode, int chunk) {
    FusedResult r{std::vector<float>((std::size_t)c.T() * c.p.shape.H_v * c.p.shape.d_v),
                  c.conv_state0, c.state0};
    GdnParams p = c.p;
    p.mode = mode;
    p.chunk_size = chunk;
    alloy::ref::gdn_fused(p, c.weights(), c.n_seqs(), c.offs.data(), c.qkv.data(), c.z.data(),
                          c.a.data(), c.b.data(), r.conv_state.data(), r.state.data(), r.y.data());
    return r;
}

TEST(GdnFused, ChunkedMatchesSerial) {
    int idx = 0;
    for (int chunk : {16, 24, 64})
        for (int r : {1, 2, 3})
            for (bool init : {true, false}) {
                const bool tiled = idx % 2 == 0;
                const auto c = make_fused_case(shape_of(2, r, 32, 24, tiled), {70, 0, 37, 2}, init,
                                               700 + idx++);
                const auto want = run_fused(c, GdnMode::Serial, 1);
                const auto got = run_fused(c, GdnMode::Chunked, chunk);
                SCOPED_TRACE("chunk=" + std::to_string(chunk) + " r=" + std::to_string(r) +
                             " init=" + std::to_string(init));
                EXPECT_LT(rel_err(got.y, want.y), kTol);
                EXPECT_LT(rel_err(got.state, want.state), kTol);
                EXPECT_EQ(got.conv_state, want.conv_state);  // same conv code in both modes
            }
}

// Cut one call's tokens [0, T) into pieces at `cuts` and run them as consecutive calls.
FusedResult run_fused_pieces(const FusedCase& c, const std::vector<int>& cuts, GdnMode mode) {
    const int T = c.T(), cd = c.conv_dim(), vd = c.p.shape.H_v * c.p.shape.d_v, H_v = c.p.shape.H_v;
    FusedResult r{std::vector<float>((std::size_t)T * vd), c.conv_state0, c.state0};
    GdnParams p = c.p;
    p.mode = mode;
    p.chunk_size = 8;
    std::vector<int> bounds{0};
    bounds.insert(bounds.end(), cuts.begin(), cuts.end());
    bounds.push_back(T);
    for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
        const int t0 = bounds[i], n = bounds[i + 1] - t0;
        const int32_t offs[2] = {0, n};
        alloy::ref::gdn_fused(p, c.weights(), 1, offs, c.qkv.data() + (std::size_t)t0 * cd,
                              c.z.data() + (std::size_t)t0 * vd, c.a.data() + (std::size_t)t0 * H_v,
                              c.b.data() + (std::size_t)t0 * H_v, r.conv_state.data(),
                              r.state.data(), r.y.data() + (std::size_t)t0 * vd);
    }
    return r;
}

// Running T tokens in one call == running them in several calls, with pieces shorter than
// K-1 = 3 (the conv state then still holds inputs of earlier calls) and an empty piece.
TEST(GdnFused, ConvStateContinuity) {
    const auto c = make_fused_case(shape_of(2, 2, 16, 12, true), {19}, true, 41);
    for (auto mode : {GdnMode::Serial, GdnMode::Chunked}) {
        const auto whole = run_fused_pieces(c, {}, mode);
        for (const std::vector<int>& cuts : std::vector<std::vector<int>>{
                 {1}, {2}, {3}, {4}, {10}, {18}, {1, 2}, {1, 2, 3}, {5, 5, 6}, {2, 4, 6, 17}}) {
            const auto pieces = run_fused_pieces(c, cuts, mode);
            std::string where = "mode=" + std::to_string((int)mode) + " cuts=";
            for (int x : cuts) where += std::to_string(x) + ",";
            EXPECT_EQ(pieces.conv_state, whole.conv_state) << where;
            EXPECT_LT(rel_err(pieces.y, whole.y), kTol) << where;
            EXPECT_LT(rel_err(pieces.state, whole.state), kTol) << where;
        }
    }
}

// A sequence shorter than K-1 shifts the conv state: state' = last 3 of (old 3, new n).
TEST(GdnFused, ShortSequenceShiftsConvState) {
    const auto c = make_fused_case(shape_of(1, 1, 4, 4, true), {2, 0, 1}, true, 43);
    const auto r = run_fused(c, GdnMode::Serial, 1);
    const int cd = c.conv_dim();
    for (int ch = 0; ch < cd; ++ch) {
        const float* old0 = &c.conv_state0[(std::size_t)ch * 3];
        const float* new0 = &r.conv_state[(std::size_t)ch * 3];
        EXPECT_EQ(new0[0], old0[2]);
        EXPECT_EQ(new0[1], c.qkv[(std::size_t)0 * cd + ch]);
        EXPECT_EQ(new0[2], c.qkv[(std::size_t)1 * cd + ch]);
        const float* old1 = &c.conv_state0[((std::size_t)cd + ch) * 3];  // empty: untouched
        const float* new1 = &r.conv_state[((std::size_t)cd + ch) * 3];
        for (int i = 0; i < 3; ++i) EXPECT_EQ(new1[i], old1[i]);
        const float* old2 = &c.conv_state0[((std::size_t)2 * cd + ch) * 3];
        const float* new2 = &r.conv_state[((std::size_t)2 * cd + ch) * 3];
        EXPECT_EQ(new2[0], old2[1]);
        EXPECT_EQ(new2[1], old2[2]);
        EXPECT_EQ(new2[2], c.qkv[(std::size_t)2 * cd + ch]);
    }
}

// The whole fused op re-implemented in float64 from spec/MODEL.md section 3, for one small case.
FusedResult oracle_fused(const FusedCase& c) {
    const GdnShape& s = c.p.shape;
    const int K = c.p.conv_kernel, cd = c.conv_dim(), kd = s.H_k * s.d_k, vd = s.H_v * s.d_v;
    const double eps = c.p.eps;
    auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
    FusedResult res{std::vector<float>((std::size_t)c.T() * vd), c.conv_state0, c.state0};
    for (int seq = 0; seq < c.n_seqs(); ++seq) {
        const int t0 = c.offs[seq], n = c.offs[seq + 1] - t0;
        // x: [K-1 + n, cd] = concat(conv state, inputs) in time order
        std::vector<double> x((std::size_t)(K - 1 + n) * cd);
        for (int ch = 0; ch < cd; ++ch) {
            for (int i = 0; i < K - 1; ++i)
                x[(std::size_t)i * cd + ch] = c.conv_state0[((std::size_t)seq * cd + ch) * (K - 1) + i];
            for (int t = 0; t < n; ++t)
                x[(std::size_t)(K - 1 + t) * cd + ch] = c.qkv[(std::size_t)(t0 + t) * cd + ch];
            for (int i = 0; i < K - 1; ++i)
                res.conv_state[((std::size_t)seq * cd + ch) * (K - 1) + i] = (float)x[(std::size_t)(n + i) * cd + ch];
        }
        std::vector<std::vector<double>> S(s.H_v, std::vector<double>((std::size_t)s.d_k * s.d_v));
        for (int h = 0; h < s.H_v; ++h)
            for (int i = 0; i < s.d_k; ++i)
                for (int j = 0; j < s.d_v; ++j)
                    S[h][i * s.d_v + j] = c.state0[(((std::size_t)seq * s.H_v + h) * s.d_v + j) * s.d_k + i];
        for (int t = 0; t < n; ++t) {
            std::vector<double> u(cd);  // conv + SiLU of token t
            for (int ch = 0; ch < cd; ++ch) {
                double acc = 0;
                for (int tap = 0; tap < K; ++tap)
                    acc += (double)c.conv1d[(std::size_t)ch * K + tap] * x[(std::size_t)(t + tap) * cd + ch];
                u[ch] = acc * sig(acc);
            }
            auto l2 = [&](int off) {
                std::vector<double> e(u.begin() + off, u.begin() + off + s.d_k);
                double ss = 0;
                for (double vv : e) ss += vv * vv;
                for (double& vv : e) vv /= std::sqrt(ss + eps);
                return e;
            };
            const std::size_t tt = (std::size_t)(t0 + t);
            for (int h = 0; h < s.H_v; ++h) {
                const int kh = s.tiled ? h % s.H_k : h / (s.H_v / s.H_k);
                std::vector<double> q = l2(kh * s.d_k), k = l2(kd + kh * s.d_k);
                for (double& e : q) e /= std::sqrt((double)s.d_k);
                const double* v = &u[2 * kd + h * s.d_v];
                const double beta = sig(c.b[tt * s.H_v + h]);
                const double xa = (double)c.a[tt * s.H_v + h] + c.dt_bias[h];
                const double g = c.ssm_a[h] * (xa > 20 ? xa : std::log1p(std::exp(xa)));
                // S = e^g (I - beta k k^T) S + beta k v^T; o = S^T q
                std::vector<double>& Sh = S[h];
                std::vector<double> ktS(s.d_v, 0.0);
                for (int i = 0; i < s.d_k; ++i)
                    for (int j = 0; j < s.d_v; ++j) ktS[j] += k[i] * Sh[i * s.d_v + j];
                for (int i = 0; i < s.d_k; ++i)
                    for (int j = 0; j < s.d_v; ++j)
                        Sh[i * s.d_v + j] = std::exp(g) * (Sh[i * s.d_v + j] - beta * k[i] * ktS[j]) + beta * k[i] * v[j];
                std::vector<double> o(s.d_v, 0.0);
                for (int i = 0; i < s.d_k; ++i)
                    for (int j = 0; j < s.d_v; ++j) o[j] += Sh[i * s.d_v + j] * q[i];
                double ms = 0;
                for (double e : o) ms += e * e;
                ms /= s.d_v;
                for (int j = 0; j < s.d_v; ++j) {
                    const double zz = c.z[tt * vd + h * s.d_v + j];
                    res.y[tt * vd + h * s.d_v + j] = (float)(o[j] / std::sqrt(ms + eps) * c.norm[j] * zz * sig(zz));
                }
            }
        }
        for (int h = 0; h < s.H_v; ++h)
            for (int i = 0; i < s.d_k; ++i)
                for (int j = 0; j < s.d_v; ++j)
                    res.state[(((std::size_t)seq * s.H_v + h) * s.d_v + j) * s.d_k + i] = (float)S[h][i * s.d_v + j];
    }
    return res;
}

TEST(GdnFused, MatchesFloat64Oracle) {
    for (bool tiled : {true, false}) {
        const auto c = make_fused_case(shape_of(2, 3, 8, 6, tiled), {5, 0, 13}, true, tiled ? 51 : 52);
        const auto want = oracle_fused(c);
        for (auto mode : {GdnMode::Serial, GdnMode::Chunked}) {
            const auto got = run_fused(c, mode, 4);
            SCOPED_TRACE("tiled=" + std::to_string(tiled) + " mode=" + std::to_string((int)mode));
            EXPECT_LT(rel_err(got.y, want.y), kTol);
            EXPECT_LT(rel_err(got.state, want.state), kTol);
            EXPECT_EQ(got.conv_state, want.conv_state);
        }
    }
}

TEST(GdnFused, RejectsBadArguments) {
    auto c = make_fused_case(shape_of(2, 1, 4, 4, true), {3}, true, 61);
    c.p.conv_kernel = 0;
    EXPECT_THROW(run_fused(c, GdnMode::Serial, 1), alloy::Error);
    c.p.conv_kernel = 4;
    EXPECT_THROW(run_fused(c, GdnMode::Chunked, 0), alloy::Error);
    c.offs = {0, 4, 3};
    EXPECT_THROW(run_fused(c, GdnMode::Serial, 1), alloy::Error);
}

}  // namespace
