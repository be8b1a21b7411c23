// cuda::attention against ref::attention on random q and caches of every cache type, at the
// 0.8B head layout (8 query / 2 KV heads of 256) and odd ones (group 3 and 1, head_dim 64 and
// 128), decode (T 1..16, split into chunks sized by each token's key count; depths 0 to 4100,
// across the 16-key chunk edges and the 2048-key edge where chunks grow) and prefill (T 17, 70, 300); and the decode contract: one call of K tokens gives the
// bits of K one-token calls. Skips when no CUDA device is present (CI).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/ops.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/kv_store.h"
#include "tests/cuda/device_array.h"

namespace alloy {
namespace {

using test::DeviceArray;

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    }
    return worst;
}

struct AttnCase {
    ref::AttentionShape s;
    int64_t T, n_past;
    std::vector<float> q;
    std::vector<uint8_t> k, v;  // caches of n_past + T rows
};

AttnCase make(int n_head, int n_head_kv, int hd, GgmlType tk, GgmlType tv, int64_t T, int64_t n_past, uint32_t seed) {
    AttnCase x{{n_head, n_head_kv, hd, 1.0f / std::sqrt(float(hd)), tk, tv}, T, n_past, {}, {}, {}};
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n_ctx = n_past + T;
    x.q.resize(size_t(T * n_head * hd));
    for (auto& f : x.q) f = 1.5f * nd(rng);  // scores of std ~1.5: a peaked but not one-hot softmax
    std::vector<float> kf(size_t(n_ctx * n_head_kv * hd)), vf(kf.size());
    for (auto& f : kf) f = nd(rng);
    for (auto& f : vf) f = nd(rng);
    x.k.resize(kf.size() * ref::kv_elem_bytes(tk));
    x.v.resize(vf.size() * ref::kv_elem_bytes(tv));
    ref::kv_store(kf.data(), x.k.data(), tk, int64_t(kf.size()));
    ref::kv_store(vf.data(), x.v.data(), tv, int64_t(vf.size()));
    return x;
}

// Runs cuda::attention over tokens [t0, t0 + n) of the setup (as a call at depth n_past + t0).
std::vector<float> run_cuda(const AttnCase& x, const DeviceArray<float>& q, const DeviceArray<uint8_t>& k,
                            const DeviceArray<uint8_t>& v, int64_t t0, int64_t n) {
    const size_t row = size_t(x.s.n_head) * x.s.head_dim;
    DeviceArray<float> out(std::vector<float>(size_t(n) * row, NAN));
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::attention_workspace_bytes(x.s, n, x.n_past + t0)));
    cuda::attention(x.s, q.p + t0 * row, k.p, v.p, out.p, n, x.n_past + t0, ws.p);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return out.host();
}

TEST(CudaAttention, MatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Case { int n_head, n_head_kv, hd; int64_t T, n_past; };
    const std::vector<Case> cases = {
        {8, 2, 256, 1, 0},   {8, 2, 256, 1, 63},  {8, 2, 256, 1, 64},    {8, 2, 256, 3, 65},
        {8, 2, 256, 5, 37},  {8, 2, 256, 1, 4100}, {8, 2, 256, 16, 200}, {8, 2, 256, 4, 2046}, {8, 2, 256, 17, 3},
        {8, 2, 256, 70, 0},  {8, 2, 256, 300, 129}, {8, 2, 256, 64, 0}, {8, 2, 256, 129, 64}, {6, 2, 64, 5, 37},   {6, 2, 64, 33, 10},
        {4, 4, 128, 17, 5},  {4, 4, 128, 2, 1000},  {16, 4, 128, 9, 70},
        {8, 2, 256, 2, 9000}, {16, 4, 128, 1, 8200}, {4, 2, 64, 3, 8500},  // past 8k keys: 4 (2) heads per warp
        // Prefill pieces after a long context: the tensor-core path splits the keys (5 / 3 / 3
        // / 4 splits; at 1000 after 600 the first tokens see none of the last split's keys).
        {8, 2, 256, 512, 3584}, {8, 2, 256, 17, 1500}, {8, 2, 256, 1000, 600}, {16, 4, 128, 33, 1500},
    };
    // (K, V) cache types: mixed pairs, and bf16 or f16 for both (prefill then takes the tensor cores).
    const GgmlType pairs[5][2] = {{GgmlType::F32, GgmlType::F16}, {GgmlType::F16, GgmlType::BF16},
                                  {GgmlType::BF16, GgmlType::F32}, {GgmlType::BF16, GgmlType::BF16},
                                  {GgmlType::F16, GgmlType::F16}};
    double worst = 0, worst_tc = 0;
    uint32_t seed = 1;
    for (const Case& c : cases) {
        for (int ti = 0; ti < 5; ++ti) {
            const GgmlType tk = pairs[ti][0], tv = pairs[ti][1];
            // The tensor-core prefill rounds q (scaled) and P to bf16: ~1e-3 relative.
            const bool tc = c.T > cuda::kAttnDecodeMaxT && tk == tv && (tk == GgmlType::BF16 || tk == GgmlType::F16) &&
                            64 % (c.n_head / c.n_head_kv) == 0;
            const AttnCase x = make(c.n_head, c.n_head_kv, c.hd, tk, tv, c.T, c.n_past, seed++);
            std::vector<float> want(x.q.size());
            ref::attention(x.s, x.q.data(), x.k.data(), x.v.data(), want.data(), c.T, c.n_past);
            DeviceArray<float> q(x.q);
            DeviceArray<uint8_t> k(x.k), v(x.v);
            const double e = max_abs(run_cuda(x, q, k, v, 0, c.T), want);
            EXPECT_LE(e, tc ? 2e-2 : 2e-5) << (tc ? "tensor cores: " : "") << "heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.hd << " T " << c.T
                               << " n_past " << c.n_past << " types " << int(tk) << "/" << int(tv);
            (tc ? worst_tc : worst) = std::max(tc ? worst_tc : worst, e);
        }
    }
    std::printf("[max-err] attention: %.3g absolute on CUDA cores (tolerance 2e-5), %.3g on 16-bit tensor cores "
                "(prefill, bf16 or f16 caches; tolerance 2e-2); outputs of std ~0.3-1\n", worst, worst_tc);
}

TEST(CudaAttention, VerificationReproducesDecodeBitForBit) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    for (int64_t n_past : {int64_t(10), int64_t(190), int64_t(3000)}) {
        const int64_t K = 7;
        const AttnCase x = make(8, 2, 256, GgmlType::BF16, GgmlType::BF16, K, n_past, uint32_t(n_past));
        DeviceArray<float> q(x.q);
        DeviceArray<uint8_t> k(x.k), v(x.v);
        const std::vector<float> all = run_cuda(x, q, k, v, 0, K);
        const size_t row = size_t(x.s.n_head) * x.s.head_dim;
        for (int64_t t = 0; t < K; ++t) {
            const std::vector<float> one = run_cuda(x, q, k, v, t, 1);
            EXPECT_EQ(0, std::memcmp(one.data(), all.data() + t * row, row * 4)) << "n_past " << n_past << " t " << t;
        }
    }
}

// Decode and verification of up to 4 tokens on 16-bit caches: every split of the same 4 tokens
// into calls (4, 2 + 2, 1 + 3, 3 + 1, 1 x 4) gives the same bits, at depths where a token's
// key split changes size (64 -> 128 keys past 4096 keys, 128 -> 256 past 8192) and at one split.
TEST(CudaAttention, VerificationSplitsGiveTheSameBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    for (GgmlType ty : {GgmlType::BF16, GgmlType::F16})
        for (int64_t n_past : {int64_t(0), int64_t(61), int64_t(511), int64_t(4093), int64_t(8190), int64_t(16380)}) {
            const int64_t K = 4;
            const AttnCase x = make(8, 2, 256, ty, ty, K, n_past, uint32_t(n_past + 17 * int(ty)));
            DeviceArray<float> q(x.q);
            DeviceArray<uint8_t> k(x.k), v(x.v);
            const size_t row = size_t(x.s.n_head) * x.s.head_dim;
            const std::vector<float> all = run_cuda(x, q, k, v, 0, K);
            std::vector<float> want(x.q.size());
            ref::attention(x.s, x.q.data(), x.k.data(), x.v.data(), want.data(), K, n_past);
            EXPECT_LE(max_abs(all, want), 2e-5) << "n_past " << n_past;
            for (const std::vector<int64_t>& parts :
                 {std::vector<int64_t>{2, 2}, {1, 3}, {3, 1}, {1, 1, 1, 1}}) {
                int64_t t0 = 0;
                for (int64_t n : parts) {
                    const std::vector<float> got = run_cuda(x, q, k, v, t0, n);
                    EXPECT_EQ(0, std::memcmp(got.data(), all.data() + t0 * row, size_t(n) * row * 4))
                        << "type " << int(ty) << " n_past " << n_past << " tokens " << t0 << ".." << t0 + n - 1;
                    t0 += n;
                }
            }
        }
}

// One workspace (zeroed once, sized for the largest call) serves call after call of other T
// and depths, on fp32 and 16-bit caches: the split counters are left zeroed where the next call
// looks for them. Calls of 3 then 2 tokens on one workspace once gave garbage (the counters'
// place moved with T onto the partials of the call before).
TEST(CudaAttention, WorkspaceIsReusable) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    // (F32, F32) and (F16, BF16): the CUDA-core kernels at decode and prefill (16-bit pairs of
    // one type would take the tensor cores for the 20-token call, with their own tolerance).
    for (GgmlType ty : {GgmlType::F32, GgmlType::F16}) {
        const int64_t K = 40, n_past = 3000;
        const GgmlType tv = ty == GgmlType::F16 ? GgmlType::BF16 : ty;
        const AttnCase x = make(8, 2, 256, ty, tv, K, n_past, 5 + uint32_t(ty));
        DeviceArray<float> q(x.q);
        DeviceArray<uint8_t> k(x.k), v(x.v);
        std::vector<float> want(x.q.size());
        ref::attention(x.s, x.q.data(), x.k.data(), x.v.data(), want.data(), K, n_past);
        size_t bytes = 0;
        for (int64_t n = 1; n <= K; ++n) bytes = std::max(bytes, cuda::attention_workspace_bytes(x.s, n, n_past + K - n));
        DeviceArray<uint8_t> ws{std::vector<uint8_t>(bytes)};
        const size_t row = size_t(x.s.n_head) * x.s.head_dim;
        DeviceArray<float> out(std::vector<float>(x.q.size(), NAN));
        // Calls of 3, 2, 1, 5, 20 (prefill), 3, 2, 4 tokens over the 40, each at its depth.
        int64_t t0 = 0;
        for (int64_t n : {3, 2, 1, 5, 20, 3, 2, 4}) {
            cuda::attention(x.s, q.p + t0 * row, k.p, v.p, out.p + t0 * row, n, n_past + t0, ws.p);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            t0 += n;
        }
        ASSERT_EQ(t0, K);
        EXPECT_LE(max_abs(out.host(), want), 2e-5) << "type " << int(ty);
    }
}

// attention_decode (depths and caches read on the device, for CUDA graphs): a step of tokens of
// three sequences on their own caches, at depths of one split up to several thousand keys
// (one call, graph-recorded once and replayed), gives each token the bits of a one-token
// attention() call on its own cache at its depth; heads 8/2 x 256 (the 0.8B), 6/2 x 64 and
// 16/4 x 128; f16 and bf16 caches.
TEST(CudaAttention, DecodeOnTheDeviceGivesEachTokenItsOwnCallsBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Shape { int n_head, n_head_kv, hd; };
    uint32_t seed = 100;
    for (const Shape sh : {Shape{8, 2, 256}, Shape{6, 2, 64}, Shape{16, 4, 128}})
        for (GgmlType ty : {GgmlType::F16, GgmlType::BF16}) {
            // Three caches (slots) of 5000 rows each; 11 tokens: slot 2 at depth 4093.., slot 0
            // decoding one token at 7, slot 1 a verification run of 4 at 2046.. (edges of the
            // splits' sizes), in the order a batch lays them out.
            const int64_t n_ctx = 5000;
            std::vector<AttnCase> cache;
            for (int sl = 0; sl < 3; ++sl) cache.push_back(make(sh.n_head, sh.n_head_kv, sh.hd, ty, ty, 1, n_ctx - 1, seed++));
            const std::vector<int32_t> slot = {2, 2, 2, 2, 2, 2, 0, 1, 1, 1, 1};
            const std::vector<int32_t> pos = {4093, 4094, 4095, 4096, 4097, 4098, 7, 2046, 2047, 2048, 2049};
            const int64_t T = int64_t(slot.size());
            const ref::AttentionShape s = cache[0].s;
            const size_t row = size_t(s.n_head) * s.head_dim;
            std::vector<float> qh(size_t(T) * row);
            std::mt19937 rng(seed++);
            std::normal_distribution<float> nd(0.0f, 1.5f);
            for (float& f : qh) f = nd(rng);
            DeviceArray<float> q(qh);
            std::vector<std::unique_ptr<DeviceArray<uint8_t>>> kd, vd;
            std::vector<const void*> kp, vp;
            for (const AttnCase& c : cache) {
                kd.push_back(std::make_unique<DeviceArray<uint8_t>>(c.k));
                vd.push_back(std::make_unique<DeviceArray<uint8_t>>(c.v));
                kp.push_back(kd.back()->p), vp.push_back(vd.back()->p);
            }
            DeviceArray<const void*> ktab(kp), vtab(vp);
            DeviceArray<int32_t> dslot(slot), dpos(pos);
            DeviceArray<uint8_t> ws{std::vector<uint8_t>(cuda::attention_decode_workspace_bytes(s, T))};
            DeviceArray<float> out(std::vector<float>(qh.size(), NAN));
            cudaStream_t st;
            ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
            cuda::attention_decode(s, q.p, ktab.p, vtab.p, dslot.p, dpos.p, out.p, T, ws.p, st);
            ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
            ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
            for (int rep = 0; rep < 2; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
            ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
            const std::vector<float> got = out.host();
            for (int64_t t = 0; t < T; ++t) {
                DeviceArray<float> one(std::vector<float>(row, NAN));
                DeviceArray<uint8_t> ws1{std::vector<uint8_t>(cuda::attention_workspace_bytes(s, 1, pos[size_t(t)]))};
                cuda::attention(s, q.p + t * row, kp[size_t(slot[size_t(t)])], vp[size_t(slot[size_t(t)])], one.p, 1,
                                pos[size_t(t)], ws1.p);
                ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                EXPECT_EQ(0, std::memcmp(one.host().data(), got.data() + t * row, row * 4))
                    << "heads " << sh.n_head << "/" << sh.n_head_kv << " x " << sh.hd << " type " << int(ty) << " token " << t
                    << " (slot " << slot[size_t(t)] << ", position " << pos[size_t(t)] << ")";
            }
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            cudaStreamDestroy(st);
        }
    ref::AttentionShape f32{8, 2, 256, 0.0625f, GgmlType::F32, GgmlType::F32};
    EXPECT_FALSE(cuda::attention_decode_supported(f32, 1)) << "fp32 caches take attention()";
    f32.type_k = f32.type_v = GgmlType::F16;
    EXPECT_FALSE(cuda::attention_decode_supported(f32, cuda::kAttnDecodeMaxT + 1));
    EXPECT_THROW(cuda::attention_decode(f32, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 17, nullptr), Error);
}

TEST(CudaAttention, RefusesUnsupportedShapes) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    ref::AttentionShape s{8, 2, 96, 0.1f, GgmlType::F32, GgmlType::F32};
    EXPECT_THROW(cuda::attention(s, nullptr, nullptr, nullptr, nullptr, 1, 0, nullptr), Error);
    s.head_dim = 128;
    s.type_k = GgmlType::Q8_0;
    EXPECT_THROW(cuda::attention(s, nullptr, nullptr, nullptr, nullptr, 1, 0, nullptr), Error);
}

}  // namespace
}  // namespace alloy
