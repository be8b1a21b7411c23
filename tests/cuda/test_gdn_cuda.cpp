// cuda::gdn_delta_serial against ref::gdn_delta_serial on random inputs (odd head counts and
// dims, ragged and empty sequences), and the decode/verification contract (a call of T tokens
// gives the bits of T one-token calls). Skips when no CUDA device is present (CI).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/quant.h"
#include "kernels/cuda/gdn.h"
#include "tests/cuda/device_array.h"
#include "kernels/ref/gdn.h"

namespace alloy {
namespace {

using test::DeviceArray;

struct Inputs {
    ref::GdnShape sh;
    std::vector<int32_t> offs;
    std::vector<float> q, k, v, g, beta, state;
};

Inputs make_inputs(const ref::GdnShape& sh, std::vector<int32_t> offs, uint32_t seed) {
    Inputs in{sh, std::move(offs), {}, {}, {}, {}, {}, {}};
    const int T = in.offs.back(), n_seqs = int(in.offs.size()) - 1;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    auto normed = [&](std::vector<float>& x, int rows, int d, float scale) {
        x.resize(size_t(rows) * d);
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int i = 0; i < d; ++i) ss += double(x[size_t(r) * d + i] = nd(rng)) * x[size_t(r) * d + i];
            for (int i = 0; i < d; ++i) x[size_t(r) * d + i] *= float(scale / std::sqrt(ss));
        }
    };
    normed(in.q, T * sh.H_k, sh.d_k, 1.0f / std::sqrt(float(sh.d_k)));
    normed(in.k, T * sh.H_k, sh.d_k, 1.0f);
    in.v.resize(size_t(T) * sh.H_v * sh.d_v);
    for (auto& x : in.v) x = nd(rng);
    in.g.resize(size_t(T) * sh.H_v);
    in.beta.resize(in.g.size());
    for (size_t i = 0; i < in.g.size(); ++i) {
        in.g[i] = -(0.01f + u(rng));
        in.beta[i] = u(rng);
    }
    in.state.resize(size_t(n_seqs) * sh.H_v * sh.d_v * sh.d_k);
    for (auto& x : in.state) x = 0.3f * nd(rng);
    return in;
}

// Runs the CUDA kernel over tokens [0, T) of every sequence in calls of `width` tokens per
// sequence (0: the whole sequence in one call); returns (out, state).
std::pair<std::vector<float>, std::vector<float>> run_cuda(const Inputs& in, int width) {
    const int n_seqs = int(in.offs.size()) - 1, T = in.offs.back();
    DeviceArray<float> q(in.q), k(in.k), v(in.v), g(in.g), beta(in.beta), state(in.state),
        out(std::vector<float>(size_t(T) * in.sh.H_v * in.sh.d_v, NAN));
    if (width == 0) {
        DeviceArray<int32_t> offs(in.offs);
        cuda::gdn_delta_serial(in.sh, n_seqs, offs.p, q.p, k.p, v.p, g.p, beta.p, state.p, out.p);
    } else {
        // Call c covers tokens [c*width, (c+1)*width) of each sequence, as offsets into the
        // concatenated arrays: sequences stay separate calls' ranges of the same buffers.
        for (int s = 0; s < n_seqs; ++s)
            for (int t = in.offs[s]; t < in.offs[s + 1]; t += width) {
                const int n = std::min(width, in.offs[s + 1] - t);
                DeviceArray<int32_t> offs(std::vector<int32_t>{t, t + n});
                // One sequence per call: its state is the s-th block.
                float* st = state.p + size_t(s) * in.sh.H_v * in.sh.d_v * in.sh.d_k;
                cuda::gdn_delta_serial(in.sh, 1, offs.p, q.p, k.p, v.p, g.p, beta.p, st, out.p);
            }
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {out.host(), state.host()};
}

using test::max_rel;

TEST(CudaGdn, SerialMatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Case { ref::GdnShape sh; std::vector<int32_t> offs; };
    const std::vector<Case> cases = {
        {{16, 16, 128, 128, true}, {0, 1}},            // Qwen3.5-0.8B decode
        {{16, 32, 128, 128, true}, {0, 1, 2, 3, 4}},   // 4 sequences of one token
        {{16, 48, 128, 128, true}, {0, 37}},           // a 37-token prompt, 27B head counts
        {{2, 6, 64, 48, false}, {0, 5, 5, 12}},        // grouped heads, odd d_v, an empty sequence
        {{1, 1, 32, 33, true}, {0, 3}},                // d_v past a block of 8 columns
        {{3, 3, 100, 20, true}, {0, 9, 10}},           // d_k not a multiple of 32 (float4 path)
        {{2, 2, 30, 17, true}, {0, 4}},                // d_k not a multiple of 4 (strided path)
        {{4, 8, 256, 64, true}, {0, 6}},               // the largest d_k
        // Batches of >= 256 (sequence, head) pairs take the pipelined kernel (cp.async ring):
        {{16, 16, 128, 128, true}, {}},                // 20 ragged sequences (filled below), one empty
        {{4, 8, 128, 33, false}, {}},                  // 40 sequences, odd d_v (a pair's second column missing)
        {{8, 32, 100, 64, true}, {}},                  // 10 sequences, d_k 100 (lanes past d_k zero-filled)
    };
    uint32_t seed = 1;
    for (Case c : cases) {
        if (c.offs.empty()) {  // the batch cases: n sequences of 0-3 tokens
            const int n = c.sh.H_v == 16 ? 20 : c.sh.H_v == 8 ? 40 : 10;
            c.offs.push_back(0);
            for (int s = 0; s < n; ++s) c.offs.push_back(c.offs.back() + (s == 3 ? 0 : 1 + (s * 7) % 3));
        }
        const Inputs in = make_inputs(c.sh, c.offs, seed++);
        std::vector<float> want_out(size_t(in.offs.back()) * c.sh.H_v * c.sh.d_v), want_state = in.state;
        ref::gdn_delta_serial(c.sh, int(c.offs.size()) - 1, in.offs.data(), in.q.data(), in.k.data(), in.v.data(),
                              in.g.data(), in.beta.data(), want_state.data(), want_out.data());
        const auto [out, state] = run_cuda(in, 0);
        const std::string what = "H_k " + std::to_string(c.sh.H_k) + " H_v " + std::to_string(c.sh.H_v) + " d_k " +
                                 std::to_string(c.sh.d_k) + " d_v " + std::to_string(c.sh.d_v) + " T " +
                                 std::to_string(c.offs.back());
        EXPECT_LE(max_rel(out, want_out), 1e-5) << what << " (out)";
        EXPECT_LE(max_rel(state, want_state), 1e-5) << what << " (state)";
    }
}

TEST(CudaGdn, VerificationReproducesDecodeBitForBit) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const Inputs in = make_inputs({16, 32, 128, 128, true}, {0, 8, 12}, 99);
    const auto one = run_cuda(in, 1);
    for (int width : {2, 3, 4, 0}) {
        const auto many = run_cuda(in, width);
        EXPECT_EQ(0, std::memcmp(one.first.data(), many.first.data(), one.first.size() * 4)) << "width " << width;
        EXPECT_EQ(0, std::memcmp(one.second.data(), many.second.data(), one.second.size() * 4)) << "width " << width;
    }
}

// A batch of many sequences gives each token the bits of its sequence run alone.
TEST(CudaGdn, BatchGivesTheOneSequenceBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    std::vector<int32_t> offs(41);
    for (int s = 0; s <= 40; ++s) offs[size_t(s)] = 2 * s;  // 40 sequences of 2 tokens
    const Inputs in = make_inputs({16, 32, 128, 128, true}, offs, 7);
    const auto batch = run_cuda(in, 0);
    const auto alone = run_cuda(in, 2);  // each sequence in its own call
    EXPECT_EQ(0, std::memcmp(batch.first.data(), alone.first.data(), batch.first.size() * 4));
    EXPECT_EQ(0, std::memcmp(batch.second.data(), alone.second.data(), batch.second.size() * 4));
}

// ---- the fused layer op (serial) against ref::gdn_fused ----

struct FusedInputs {
    ref::GdnParams p;
    std::vector<int32_t> offs;
    int n_tokens = 0;
    std::vector<float> qkv, z, a, b, conv_w, ssm_a, dt_bias, norm, conv_state, state;
};

FusedInputs make_fused(const ref::GdnShape& sh, int K, std::vector<int32_t> offs, int n_tokens, uint32_t seed) {
    FusedInputs in;
    in.p.shape = sh;
    in.p.conv_kernel = K;
    in.p.mode = ref::GdnMode::Serial;
    in.offs = std::move(offs);
    in.n_tokens = n_tokens;
    const int n_seqs = int(in.offs.size()) - 1, conv_dim = 2 * sh.H_k * sh.d_k + sh.H_v * sh.d_v;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, size_t n, float mean, float sd) {
        x.resize(n);
        for (auto& e : x) e = mean + sd * nd(rng);
    };
    fill(in.qkv, size_t(n_tokens) * conv_dim, 0, 1);
    fill(in.z, size_t(n_tokens) * sh.H_v * sh.d_v, 0, 1);
    fill(in.a, size_t(n_tokens) * sh.H_v, 0, 1);
    fill(in.b, size_t(n_tokens) * sh.H_v, 0, 1);
    fill(in.conv_w, size_t(conv_dim) * K, 0, 0.5f);
    in.ssm_a.resize(size_t(sh.H_v));
    for (auto& e : in.ssm_a) e = -(1.0f + 15.0f * u(rng));
    fill(in.dt_bias, size_t(sh.H_v), -2.0f, 1.0f);
    fill(in.norm, size_t(sh.d_v), 1.0f, 0.1f);
    fill(in.conv_state, size_t(n_seqs) * conv_dim * (K - 1), 0, 1);
    fill(in.state, size_t(n_seqs) * sh.H_v * sh.d_v * sh.d_k, 0, 0.3f);
    return in;
}

// (y, conv_state, state) of cuda::gdn_fused over the whole call, or of the sequences' tokens
// in calls of `width` tokens (one sequence per call).
std::vector<std::vector<float>> run_fused_cuda(const FusedInputs& in, int width,
                                               cuda::GdnFusedPath path = cuda::GdnFusedPath::Auto, bool settled = false) {
    const ref::GdnShape& sh = in.p.shape;
    const int n_seqs = int(in.offs.size()) - 1, conv_dim = 2 * sh.H_k * sh.d_k + sh.H_v * sh.d_v, K = in.p.conv_kernel;
    DeviceArray<float> qkv(in.qkv), z(in.z), a(in.a), b(in.b), cw(in.conv_w), sa(in.ssm_a), dt(in.dt_bias),
        norm(in.norm), cs(in.conv_state), st(in.state), y(std::vector<float>(in.z.size(), NAN));
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_fused_workspace_bytes(in.p, n_seqs, in.n_tokens)));
    const ref::GdnWeights w{cw.p, sa.p, dt.p, norm.p};
    if (width == 0) {
        DeviceArray<int32_t> offs(in.offs);
        // Settled: the inputs were copied in (a full serialization point) and nothing since writes them.
        cuda::gdn_fused(in.p, w, n_seqs, offs.p, in.n_tokens, qkv.p, z.p, a.p, b.p, cs.p, st.p, y.p, ws.p, nullptr, path,
                        nullptr, nullptr, settled);
    } else {
        for (int s = 0; s < n_seqs; ++s)
            for (int t = in.offs[s]; t < in.offs[s + 1]; t += width) {
                const int n = std::min(width, in.offs[s + 1] - t);
                DeviceArray<int32_t> offs(std::vector<int32_t>{t, t + n});
                cuda::gdn_fused(in.p, w, 1, offs.p, in.n_tokens, qkv.p, z.p, a.p, b.p,
                                cs.p + size_t(s) * conv_dim * (K - 1), st.p + size_t(s) * sh.H_v * sh.d_v * sh.d_k, y.p,
                                ws.p, nullptr, path);
            }
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {y.host(), cs.host(), st.host()};
}

TEST(CudaGdn, FusedSerialMatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Case { ref::GdnShape sh; int K; std::vector<int32_t> offs; int n_tokens; };
    const std::vector<Case> cases = {
        {{16, 16, 128, 128, true}, 4, {0, 1}, 1},             // Qwen3.5-0.8B decode
        {{16, 32, 128, 128, true}, 4, {0, 1, 2, 3}, 3},       // 3 sequences of one token (9B heads)
        {{2, 6, 64, 48, false}, 4, {2, 7, 7, 13}, 15},        // grouped heads, empty sequence, rows outside the call
        {{2, 2, 30, 17, true}, 3, {0, 5}, 5},                 // strided rows, K = 3
        {{1, 1, 32, 32, true}, 1, {0, 2}, 2},                 // K = 1: no conv state
        {{16, 48, 128, 128, true}, 4, {0, 1, 2, 3, 4}, 4},    // 27B heads: 3 value heads share a key head's conv
        {{4, 12, 128, 128, false}, 4, {0, 2, 2, 3}, 3},       // grouped, T < K - 1 (old conv state shifts)
        {{2, 4, 64, 64, true}, 4, {0, 37}, 37},               // tokens past one 16-token tile
        {{2, 4, 256, 64, false}, 2, {1, 6}, 7},               // the largest d_k (8 elements per lane)
        {{2, 16, 32, 16, true}, 4, {0, 1}, 1},                // H_v / H_k = 8: a cluster of 8 heads
    };
    uint32_t seed = 50;
    for (const Case& c : cases) {
        const FusedInputs in = make_fused(c.sh, c.K, c.offs, c.n_tokens, seed++);
        std::vector<float> y_ref(in.z.size(), NAN), cs_ref = in.conv_state, st_ref = in.state;
        const ref::GdnWeights w{in.conv_w.data(), in.ssm_a.data(), in.dt_bias.data(), in.norm.data()};
        ref::gdn_fused(in.p, w, int(c.offs.size()) - 1, in.offs.data(), in.qkv.data(), in.z.data(), in.a.data(),
                       in.b.data(), cs_ref.data(), st_ref.data(), y_ref.data());
        for (const auto path : {cuda::GdnFusedPath::OneLaunch, cuda::GdnFusedPath::ThreeLaunches}) {
        const auto got = run_fused_cuda(in, 0, path);
        const std::string what = "H_k " + std::to_string(c.sh.H_k) + " H_v " + std::to_string(c.sh.H_v) + " d_k " +
                                 std::to_string(c.sh.d_k) + " d_v " + std::to_string(c.sh.d_v) + " K " + std::to_string(c.K) +
                                 (path == cuda::GdnFusedPath::OneLaunch ? " one launch" : " three launches");
        // Rows outside the call stay untouched (NaN in both).
        for (size_t i = 0; i < y_ref.size(); ++i)
            ASSERT_EQ(std::isnan(y_ref[i]), std::isnan(got[0][i])) << what << " y[" << i << "]";
        std::vector<float> yr, yg;
        for (size_t i = 0; i < y_ref.size(); ++i)
            if (!std::isnan(y_ref[i])) yr.push_back(y_ref[i]), yg.push_back(got[0][i]);
        EXPECT_LE(max_rel(yg, yr), 1e-4) << what << " (y)";
        EXPECT_LE(max_rel(got[1], cs_ref), 0.0) << what << " (conv state: copies of inputs)";
        EXPECT_LE(max_rel(got[2], st_ref), 1e-4) << what << " (state)";
        }
    }
}

// The one-launch head kernel (d_k, d_v <= 128) computes every value in the three-launch path's
// order: both paths give the same bits, so the launch gate never changes a token's result.
TEST(CudaGdn, FusedPathsGiveTheSameBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Case { ref::GdnShape sh; int K; std::vector<int32_t> offs; int n_tokens; };
    const std::vector<Case> cases = {
        {{16, 16, 128, 128, true}, 4, {0, 1}, 1},             // 0.8B decode
        {{16, 32, 128, 128, true}, 4, {0, 1, 2, 3}, 3},       // 9B heads, 3 sequences
        {{16, 48, 128, 128, false}, 4, {0, 20, 23}, 23},      // 27B heads, grouped, 20 tokens
        {{2, 6, 64, 48, false}, 4, {2, 7, 7, 13}, 15},        // empty sequence, rows outside the call
        {{2, 2, 30, 17, true}, 3, {0, 5}, 5},                 // strided rows, K = 3
        {{1, 1, 32, 32, true}, 1, {0, 2}, 2},                 // K = 1
        {{2, 16, 32, 16, true}, 4, {0, 1}, 1},                // a cluster of 8 value heads
    };
    uint32_t seed = 300;
    for (const Case& c : cases) {
        const FusedInputs in = make_fused(c.sh, c.K, c.offs, c.n_tokens, seed++);
        const auto one = run_fused_cuda(in, 0, cuda::GdnFusedPath::OneLaunch);
        const auto three = run_fused_cuda(in, 0, cuda::GdnFusedPath::ThreeLaunches);
        // The one launch with its state loaded before the PDL wait (state_settled): the same bits.
        const auto settled = run_fused_cuda(in, 0, cuda::GdnFusedPath::OneLaunch, true);
        for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(0, std::memcmp(one[size_t(i)].data(), three[size_t(i)].data(), one[size_t(i)].size() * 4))
                << "H_k " << c.sh.H_k << " H_v " << c.sh.H_v << " d_k " << c.sh.d_k << " d_v " << c.sh.d_v << " output " << i;
            EXPECT_EQ(0, std::memcmp(one[size_t(i)].data(), settled[size_t(i)].data(), one[size_t(i)].size() * 4))
                << "settled, H_k " << c.sh.H_k << " H_v " << c.sh.H_v << " output " << i;
        }
    }
}

// y_bf16 (the input of the prefill GEMM after the op): every path writes y rounded to bf16 (the
// host's nearest even) for the call's rows and nothing else, and y keeps its bits: the one- and
// three-launch serial paths (rows outside the call, an empty sequence) and the chunked mode.
TEST(CudaGdn, FusedBf16CopyOfYIsTheRoundedY) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Case { ref::GdnShape sh; int K; std::vector<int32_t> offs; int n_tokens; bool chunked; cuda::GdnFusedPath path; };
    const std::vector<Case> cases = {
        {{16, 16, 128, 128, true}, 4, {0, 1}, 1, false, cuda::GdnFusedPath::OneLaunch},
        {{2, 6, 64, 48, false}, 4, {2, 7, 7, 13}, 15, false, cuda::GdnFusedPath::OneLaunch},
        {{2, 6, 64, 48, false}, 4, {2, 7, 7, 13}, 15, false, cuda::GdnFusedPath::ThreeLaunches},
        {{16, 32, 128, 128, true}, 4, {3, 100, 170}, 173, true, cuda::GdnFusedPath::Auto},
    };
    uint32_t seed = 700;
    for (const Case& c : cases) {
        FusedInputs in = make_fused(c.sh, c.K, c.offs, c.n_tokens, seed++);
        if (c.chunked) {
            in.p.mode = ref::GdnMode::Chunked;
            in.p.chunk_size = 64;
        }
        const int n_seqs = int(c.offs.size()) - 1;
        const size_t width = size_t(c.sh.H_v) * c.sh.d_v;
        auto run = [&](bool with_b, std::vector<uint16_t>* yb_host) {
            DeviceArray<float> qkv(in.qkv), z(in.z), a(in.a), b(in.b), cw(in.conv_w), sa(in.ssm_a), dt(in.dt_bias),
                norm(in.norm), cs(in.conv_state), st(in.state), y(std::vector<float>(in.z.size(), NAN));
            DeviceArray<uint16_t> yb(std::vector<uint16_t>(in.z.size(), 0xffff));
            DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_fused_workspace_bytes(in.p, n_seqs, in.n_tokens)));
            DeviceArray<int32_t> offs(in.offs);
            cuda::gdn_fused(in.p, {cw.p, sa.p, dt.p, norm.p}, n_seqs, offs.p, in.n_tokens, qkv.p, z.p, a.p, b.p, cs.p, st.p,
                            y.p, ws.p, nullptr, c.path, nullptr, with_b ? yb.p : nullptr);
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            if (yb_host) *yb_host = yb.host();
            return y.host();
        };
        const std::string what = "H_v " + std::to_string(c.sh.H_v) + " d_v " + std::to_string(c.sh.d_v) +
                                 (c.chunked ? " chunked" : " path " + std::to_string(int(c.path)));
        const std::vector<float> y = run(false, nullptr);
        std::vector<uint16_t> yb;
        const std::vector<float> y2 = run(true, &yb);
        ASSERT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * 4)) << what << ": y changed";
        for (size_t i = 0; i < y.size(); ++i) {
            const bool in_call = i >= size_t(c.offs.front()) * width && i < size_t(c.offs.back()) * width;
            ASSERT_EQ(yb[i], in_call ? fp32_to_bf16(y[i]) : uint16_t(0xffff)) << what << " value " << i;
        }
    }
}

TEST(CudaGdn, FusedVerificationReproducesDecodeBitForBit) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    // 9B heads, and 27B heads grouped with a sequence longer than a 16-token tile.
    for (const FusedInputs& in : {make_fused({16, 32, 128, 128, true}, 4, {0, 8, 12}, 12, 123),
                                  make_fused({16, 48, 128, 128, false}, 4, {0, 20, 23}, 23, 124)}) {
        for (const auto path : {cuda::GdnFusedPath::Auto, cuda::GdnFusedPath::OneLaunch, cuda::GdnFusedPath::ThreeLaunches}) {
            const auto one = run_fused_cuda(in, 1, path);
            for (int width : {2, 3, 4, 17, 0}) {
                // Width 0 is one call of both sequences: Auto's gate may pick the other path
                // for two sequences than for one (FusedBatchGivesTheOneSequenceBits, per path).
                if (width == 0 && path == cuda::GdnFusedPath::Auto) continue;
                const auto many = run_fused_cuda(in, width, path);
                for (int i = 0; i < 3; ++i)
                    EXPECT_EQ(0, std::memcmp(one[size_t(i)].data(), many[size_t(i)].data(), one[size_t(i)].size() * 4))
                        << "H_v " << in.p.shape.H_v << " path " << int(path) << " width " << width << " output " << i;
            }
        }
    }
}

// On one path, a batch of sequences gives each its bits run alone (clusters of one sequence
// never mix). Auto may pick the other path for the batch than for one sequence.
TEST(CudaGdn, FusedBatchGivesTheOneSequenceBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    std::vector<int32_t> offs(33);
    for (int s = 0; s <= 32; ++s) offs[size_t(s)] = s;  // 32 decode sequences
    const FusedInputs in = make_fused({16, 48, 128, 128, true}, 4, offs, 32, 125);
    for (const auto path : {cuda::GdnFusedPath::OneLaunch, cuda::GdnFusedPath::ThreeLaunches}) {
        const auto batch = run_fused_cuda(in, 0, path), alone = run_fused_cuda(in, 1, path);
        for (int i = 0; i < 3; ++i)
            EXPECT_EQ(0, std::memcmp(batch[size_t(i)].data(), alone[size_t(i)].data(), batch[size_t(i)].size() * 4))
                << "path " << int(path) << " output " << i;
    }
}

// A batch of sequences on a 5-slot state (seq_slots on the device, slot 2 unused): y and every
// slot's conv and recurrent state are bit-identical to running each sequence alone on its slot
// (nullptr slots, pointers offset to the slot), the unused slot stays untouched, and the
// result is within the usual tolerance of ref::gdn_fused with the same slots. Every path: the
// split one-launch kernel (d <= 128), the cluster kernel (d_k 256), the three launches.
TEST(CudaGdn, FusedSlotsGiveEachSequenceItsOwnState) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const std::vector<int32_t> slots = {3, 0, 4, 1};
    const int n_slots = 5;
    struct Case { ref::GdnShape sh; std::vector<int32_t> offs; };
    const std::vector<Case> cases = {
        {{16, 16, 128, 128, true}, {0, 1, 2, 3, 4}},   // 0.8B decode batch (token s = sequence s)
        {{16, 32, 128, 128, true}, {0, 5, 6, 6, 39}},  // ragged, an empty sequence, past a 16-token tile
        {{2, 4, 256, 64, false}, {0, 5, 6, 6, 39}},    // d_k 256: the cluster kernel
    };
    uint32_t seed = 700;
    for (const Case& c : cases) {
        const ref::GdnShape& sh = c.sh;
        const int n_tokens = c.offs.back(), n_seqs = int(c.offs.size()) - 1, K = 4;
        const int conv_dim = 2 * sh.H_k * sh.d_k + sh.H_v * sh.d_v;
        const size_t cs_n = size_t(conv_dim) * (K - 1), st_n = size_t(sh.H_v) * sh.d_v * sh.d_k;
        // make_fused sizes the states for n_seqs slots; give it n_slots empty sequences' worth.
        std::vector<int32_t> slot_offs(size_t(n_slots) + 1, 0);
        FusedInputs in = make_fused(sh, K, slot_offs, n_tokens, seed++);
        in.offs = c.offs;
        std::vector<float> y_ref(in.z.size(), NAN), cs_ref = in.conv_state, st_ref = in.state;
        const ref::GdnWeights rw{in.conv_w.data(), in.ssm_a.data(), in.dt_bias.data(), in.norm.data()};
        ref::gdn_fused(in.p, rw, n_seqs, in.offs.data(), in.qkv.data(), in.z.data(), in.a.data(), in.b.data(),
                       cs_ref.data(), st_ref.data(), y_ref.data(), slots.data());
        for (const auto path : {cuda::GdnFusedPath::OneLaunch, cuda::GdnFusedPath::ThreeLaunches}) {
            const std::string what = "H_v " + std::to_string(sh.H_v) + " d_k " + std::to_string(sh.d_k) + " T " +
                                     std::to_string(n_tokens) + " path " + std::to_string(int(path));
            DeviceArray<float> qkv(in.qkv), z(in.z), a(in.a), b(in.b), cw(in.conv_w), sa(in.ssm_a), dt(in.dt_bias),
                norm(in.norm);
            DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_fused_workspace_bytes(in.p, n_seqs, n_tokens)));
            const ref::GdnWeights w{cw.p, sa.p, dt.p, norm.p};
            // The batch on the slots.
            DeviceArray<float> cs(in.conv_state), st(in.state), y(std::vector<float>(in.z.size(), NAN));
            DeviceArray<int32_t> offs(in.offs), dslots(slots);
            cuda::gdn_fused(in.p, w, n_seqs, offs.p, n_tokens, qkv.p, z.p, a.p, b.p, cs.p, st.p, y.p, ws.p, nullptr, path,
                            dslots.p);
            // Each sequence alone, on its slot.
            DeviceArray<float> cs1(in.conv_state), st1(in.state), y1(std::vector<float>(in.z.size(), NAN));
            for (int s = 0; s < n_seqs; ++s) {
                DeviceArray<int32_t> o1(std::vector<int32_t>{in.offs[s], in.offs[s + 1]});
                cuda::gdn_fused(in.p, w, 1, o1.p, n_tokens, qkv.p, z.p, a.p, b.p, cs1.p + size_t(slots[s]) * cs_n,
                                st1.p + size_t(slots[s]) * st_n, y1.p, ws.p, nullptr, path);
            }
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
            const std::vector<float> yb = y.host(), ya = y1.host(), csb = cs.host(), csa = cs1.host(), stb = st.host(),
                                     sta = st1.host();
            EXPECT_EQ(0, std::memcmp(yb.data(), ya.data(), yb.size() * 4)) << what << " (y)";
            EXPECT_EQ(0, std::memcmp(csb.data(), csa.data(), csb.size() * 4)) << what << " (conv state)";
            EXPECT_EQ(0, std::memcmp(stb.data(), sta.data(), stb.size() * 4)) << what << " (state)";
            EXPECT_EQ(0, std::memcmp(stb.data() + 2 * st_n, in.state.data() + 2 * st_n, st_n * 4)) << what << " (unused slot)";
            EXPECT_EQ(0, std::memcmp(csb.data() + 2 * cs_n, in.conv_state.data() + 2 * cs_n, cs_n * 4))
                << what << " (unused slot's conv state)";
            for (int s = 0; s < n_seqs; ++s)  // the slot of every non-empty sequence changed
                if (in.offs[s + 1] > in.offs[s]) {
                    EXPECT_NE(0, std::memcmp(stb.data() + slots[s] * st_n, in.state.data() + slots[s] * st_n, st_n * 4))
                        << what << " slot " << slots[s];
                }
            EXPECT_LE(max_rel(yb, y_ref), 1e-4) << what << " (y against ref)";
            EXPECT_LE(max_rel(csb, cs_ref), 0.0) << what << " (conv state against ref)";
            EXPECT_LE(max_rel(stb, st_ref), 1e-4) << what << " (state against ref)";
        }
    }
}

TEST(CudaGdn, RejectsShapesItCannotRun) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const int32_t* none = nullptr;
    EXPECT_THROW(cuda::gdn_delta_serial({16, 16, 512, 128, true}, 1, none, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        nullptr, nullptr),
                 Error);
    EXPECT_THROW(cuda::gdn_delta_serial({3, 16, 128, 128, true}, 1, none, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        nullptr, nullptr),
                 Error);
    // The one-launch kernel's cluster holds the value heads of a key head: 16 of them are too many.
    ref::GdnParams p;
    p.shape = {1, 16, 128, 128, true};
    p.mode = ref::GdnMode::Serial;
    try {
        cuda::gdn_fused(p, ref::GdnWeights{}, 1, none, 1, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                        nullptr, nullptr, cuda::GdnFusedPath::OneLaunch);
        ADD_FAILURE() << "no error for H_v / H_k = 16";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("H_v / shape.H_k"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace alloy
