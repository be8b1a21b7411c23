// The small CUDA ops against kernels/ref on random inputs at odd sizes: rms_norm and
// add_rms_norm (rows 37, n 96 / 1024 / 5000: the last past the register-held part), rope_partial
// and rms_norm_rope (positions up to 60000, where a fast-math sine would be far off; head_dim 512 for the
// block-per-head path), swiglu,
// sigmoid_gate_mul (both forms, an unaligned pointer for the scalar path), add, get_rows
// (F32, F16, BF16, Q8_0: exact) and argmax (ties, the vocabulary's size, NaN-free random rows:
// exact). Skips when no CUDA device is present (CI).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/quant.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/ops.h"
#include "kernels/ref/add.h"
#include "kernels/ref/gate.h"
#include "kernels/ref/rms_norm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/swiglu.h"
#include "kernels/ref/top_k.h"
#include "runtime/sampler.h"
#include "tests/cuda/device_array.h"

namespace alloy {
namespace {

using test::DeviceArray;

using test::max_rel;

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(mean, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

void sync() { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

TEST(CudaSmallOps, RmsNormMatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    double worst = 0;
    uint32_t seed = 1;
    for (int64_t n : {96, 1024, 5000}) {
        const int64_t rows = 37;
        const auto x = randn(size_t(rows * n), seed++, 2.0f, 0.5f), y = randn(size_t(rows * n), seed++);
        const auto w = randn(size_t(n), seed++, 0.3f, 1.0f);
        for (bool with_w : {true, false}) {
            const float* wp = with_w ? w.data() : nullptr;
            DeviceArray<float> dx(x), dw(w), dout(std::vector<float>(x.size(), NAN));
            std::vector<float> want(x.size());
            ref::rms_norm(x.data(), wp, want.data(), rows, n, 1e-6f);
            cuda::rms_norm(dx.p, with_w ? dw.p : nullptr, dout.p, rows, n, 1e-6f);
            sync();
            double e = max_rel(dout.host(), want);
            EXPECT_LE(e, 1e-5) << "rms_norm n " << n;
            worst = std::max(worst, e);
            // In place (out aliases x).
            cuda::rms_norm(dx.p, with_w ? dw.p : nullptr, dx.p, rows, n, 1e-6f);
            sync();
            EXPECT_LE(max_rel(dx.host(), want), 1e-5) << "rms_norm in place n " << n;

            DeviceArray<float> ax(x), ay(y), aout(std::vector<float>(x.size(), NAN));
            std::vector<float> rx = x, rout(x.size());
            ref::add_rms_norm(rx.data(), y.data(), wp, rout.data(), rows, n, 1e-6f);
            cuda::add_rms_norm(ax.p, ay.p, with_w ? dw.p : nullptr, aout.p, rows, n, 1e-6f);
            sync();
            EXPECT_EQ(0, std::memcmp(ax.host().data(), rx.data(), rx.size() * 4)) << "add_rms_norm sum n " << n;
            e = max_rel(aout.host(), rout);
            EXPECT_LE(e, 1e-5) << "add_rms_norm n " << n;
            worst = std::max(worst, e);
        }
    }
    std::printf("[max-err] rms_norm / add_rms_norm: %.3g (tolerance 1e-5)\n", worst);
}

TEST(CudaSmallOps, RopeMatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Case { int64_t T; int heads, head_dim, n_rot; };
    double worst = 0;
    uint32_t seed = 10;
    for (const Case& c : {Case{1, 8, 256, 64}, Case{5, 3, 64, 16}, Case{17, 2, 96, 96}, Case{3, 2, 160, 30}, Case{2, 2, 512, 128}}) {
        std::mt19937 rng(seed++);
        std::uniform_int_distribution<int32_t> up(0, 60000);
        std::vector<int32_t> pos(size_t(c.T));
        for (auto& p : pos) p = up(rng);
        const size_t n = size_t(c.T) * c.heads * c.head_dim;
        const auto x = randn(n, seed++);
        std::vector<float> want = x;
        ref::rope_partial(want.data(), pos.data(), c.T, c.heads, c.head_dim, c.n_rot, 1e7f);
        DeviceArray<float> dx(x);
        DeviceArray<int32_t> dp(pos);
        cuda::rope_partial(dx.p, dp.p, c.T, c.heads, c.head_dim, c.n_rot, 1e7f);
        sync();
        const double e = max_rel(dx.host(), want);
        EXPECT_LE(e, 1e-5) << "rope T " << c.T << " head_dim " << c.head_dim << " n_rot " << c.n_rot;
        worst = std::max(worst, e);

        // rms_norm_rope from the interleaved q/gate layout (stride 2 head_dim).
        const auto qg = randn(n * 2, seed++, 1.5f);
        const auto w = randn(size_t(c.head_dim), seed++, 0.2f, 1.0f);
        std::vector<float> want2(n);
        ref::rms_norm_rope(qg.data(), 2 * c.head_dim, w.data(), want2.data(), pos.data(), c.T, c.heads, c.head_dim,
                           c.n_rot, 1e7f, 1e-6f);
        DeviceArray<float> dqg(qg), dw(w), dout(std::vector<float>(n, NAN));
        cuda::rms_norm_rope(dqg.p, 2 * c.head_dim, dw.p, dout.p, dp.p, c.T, c.heads, c.head_dim, c.n_rot, 1e7f, 1e-6f);
        sync();
        const double e2 = max_rel(dout.host(), want2);
        EXPECT_LE(e2, 1e-5) << "rms_norm_rope T " << c.T << " head_dim " << c.head_dim;
        worst = std::max(worst, e2);
    }
    std::printf("[max-err] rope_partial / rms_norm_rope: %.3g (tolerance 1e-5)\n", worst);
}

TEST(CudaSmallOps, ElementwiseMatchReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    double worst = 0;
    for (int64_t n : {1, 1001, 3584 * 5}) {
        const auto a = randn(size_t(n) + 1, uint32_t(n), 3.0f), b = randn(size_t(n) + 1, uint32_t(n) + 1, 3.0f);
        for (int off : {0, 1}) {  // off 1: pointers 4 bytes past 16-byte alignment, the scalar path
            const std::vector<float> x(a.begin() + off, a.begin() + off + n), y(b.begin() + off, b.begin() + off + n);
            DeviceArray<float> da(a), db(b), dout(std::vector<float>(size_t(n) + 1, NAN));
            std::vector<float> want(static_cast<size_t>(n));
            ref::swiglu(x.data(), y.data(), want.data(), n);
            cuda::swiglu(da.p + off, db.p + off, dout.p + off, n);
            sync();
            std::vector<float> got = dout.host();
            double e = max_rel(std::vector<float>(got.begin() + off, got.begin() + off + n), want);
            EXPECT_LE(e, 1e-6) << "swiglu n " << n << " off " << off;
            worst = std::max(worst, e);

            std::vector<float> g = x;
            ref::sigmoid_gate_mul(g.data(), y.data(), n);
            cuda::sigmoid_gate_mul(da.p + off, db.p + off, n);
            sync();
            got = da.host();
            e = max_rel(std::vector<float>(got.begin() + off, got.begin() + off + n), g);
            EXPECT_LE(e, 1e-6) << "sigmoid_gate_mul n " << n << " off " << off;
            worst = std::max(worst, e);

            // add on the device's gated values (the gate's last bits are the GPU's expf).
            std::vector<float> s(got.begin() + off, got.begin() + off + n);
            ref::add(s.data(), y.data(), n);
            cuda::add(da.p + off, db.p + off, n);
            sync();
            got = da.host();
            EXPECT_EQ(0, std::memcmp(got.data() + off, s.data(), size_t(n) * 4)) << "add n " << n << " off " << off;
        }
    }
    // The row form: 5 tokens x 3 heads of 37, the gate 37 past each query (stride 74).
    const int64_t rows = 15, n = 37;
    const auto qg = randn(size_t(rows * 2 * n), 5, 2.0f);
    std::vector<float> x(size_t(rows * n)), want;
    for (int64_t r = 0; r < rows; ++r) std::copy(qg.begin() + r * 2 * n, qg.begin() + r * 2 * n + n, x.begin() + r * n);
    want = x;
    ref::sigmoid_gate_mul(want.data(), qg.data() + n, rows, n, 2 * n);
    DeviceArray<float> dx(x), dg(qg);
    cuda::sigmoid_gate_mul(dx.p, dg.p + n, rows, n, 2 * n);
    sync();
    const double e = max_rel(dx.host(), want);
    EXPECT_LE(e, 1e-6) << "sigmoid_gate_mul rows";
    worst = std::max(worst, e);
    std::printf("[max-err] swiglu / sigmoid_gate_mul: %.3g (tolerance 1e-6); add exact\n", worst);
}

TEST(CudaSmallOps, GetRowsIsExact) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    // Rows of 768 values: 24 Q8_0 / Q4_0 blocks, 3 super-blocks (GGUF block offsets 2 bytes
    // off a word for Q8_0, Q4_0, IQ4_NL and Q6_K).
    const int64_t n_vocab = 301, n = 768;
    const auto table = randn(size_t(n_vocab * n), 3);
    std::vector<int32_t> ids = {0, 300, 7, 7, 151, 2, 299};
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0,
                       GgmlType::Q5_1, GgmlType::IQ4_NL, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::MXFP4}) {
        const size_t rb = row_bytes(t, n);
        std::vector<uint8_t> bytes(rb * n_vocab);
        for (int64_t r = 0; r < n_vocab; ++r) quantize_row(t, table.data() + r * n, bytes.data() + r * rb, n);
        std::vector<float> want(ids.size() * n);
        for (size_t i = 0; i < ids.size(); ++i) dequantize_row(t, bytes.data() + ids[i] * rb, want.data() + i * n, n);
        const test::DeviceWeight d(WeightView{t, n, n_vocab, bytes.data(), rb});
        DeviceArray<int32_t> di(ids);
        DeviceArray<float> out(std::vector<float>(want.size(), NAN));
        cuda::get_rows(d.view, di.p, out.p, int64_t(ids.size()));
        sync();
        EXPECT_EQ(0, std::memcmp(out.host().data(), want.data(), want.size() * 4)) << type_traits(t).name;
    }
}

TEST(CudaSmallOps, ArgmaxMatchesTheHostsGreedyToken) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    for (int64_t n : {1, 1000, 248320}) {
        const int64_t rows = n > 1 ? 6 : 3;
        auto logits = randn(size_t(rows * n), uint32_t(n), 4.0f);
        if (n > 1) {
            float* r = logits.data();
            const int64_t far = n > 1000 ? 200000 : 900;
            // Row 1: a tie between two far-apart positions (the smaller index must win);
            // row 2: every value negative, the maximum the last element.
            const float top = 100.0f;
            r[n + far] = top;
            r[n + 3] = top;
            for (int64_t i = 0; i < n; ++i) r[2 * n + i] = -std::fabs(r[2 * n + i]) - 1.0f;
            r[3 * n - 1] = -0.5f;
            // Row 3: -0 before +0 as the maximum (equal: the first wins); row 4: NaNs of both
            // signs and another payload after +inf (the first NaN wins); row 5: +inf twice.
            for (int64_t i = 0; i < n; ++i) r[3 * n + i] = -std::fabs(r[3 * n + i]) - 1.0f;
            r[3 * n + 7] = -0.0f;
            r[3 * n + far] = 0.0f;
            r[4 * n + 2] = INFINITY;
            r[4 * n + 9] = -NAN;
            r[4 * n + far] = NAN;
            r[5 * n + far] = INFINITY;
            r[5 * n + 5] = INFINITY;
        }
        DeviceArray<float> d(logits);
        DeviceArray<int32_t> out(std::vector<int32_t>(size_t(rows), -1));
        DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::argmax_workspace_bytes(rows)));
        for (int rep = 0; rep < 2; ++rep) {  // the workspace is cleared by each call
            cuda::argmax(d.p, rows, n, out.p, ws.p);
            sync();
            const auto got = out.host();
            for (int64_t r = 0; r < rows; ++r)
                EXPECT_EQ(got[size_t(r)], greedy_token(logits.data() + r * n, int(n))) << "n " << n << " row " << r;
        }
    }
}

// cuda::top_k gives ref::top_k's pairs bit for bit: sizes around the 4096-key sort and the
// vocabulary's, k from 1 to kTopKMax, ties far apart, -0 / +0, NaNs and infinities, many equal
// values (more ties than k), and a row whose blocks each hold several rounds of keys.
TEST(CudaSmallOps, TopKIsTheReferencesPairs) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    for (int64_t n : {5, 1000, 4097, 100003, 248320, 600000}) {
        const int64_t rows = 4;
        auto logits = randn(size_t(rows * n), uint32_t(n) + 7, 4.0f);
        float* r = logits.data();
        for (int64_t i = 0; i < n; i += 3) r[i] = std::round(r[i]);  // row 0: many ties
        r[n + n - 1] = 50.0f;                                            // row 1: ties at the ends
        r[n + 0] = 50.0f;
        r[n + n / 2] = -0.0f;
        r[n + n / 3 + 1] = 0.0f;
        r[2 * n + n / 2] = NAN;  // row 2: NaNs, infinities
        r[2 * n + 1] = -NAN;
        r[2 * n + n - 2] = INFINITY;
        r[2 * n + 3] = -INFINITY;
        for (int64_t i = 0; i < n; ++i) r[3 * n + i] = i % 17 == 0 ? 1.0f : -1.0f;  // row 3: k-way ties
        DeviceArray<float> d(logits);
        for (int k : {1, 2, 7, 20, 40, 64}) {
            if (k > n) continue;
            DeviceArray<float> values(std::vector<float>(size_t(rows * k), -7.0f));
            DeviceArray<int32_t> ids(std::vector<int32_t>(size_t(rows * k), -1));
            DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::top_k_workspace_bytes(rows, n, k)));
            std::vector<float> want_v(size_t(rows * k));
            std::vector<int32_t> want_i(size_t(rows * k));
            ref::top_k(logits.data(), rows, n, k, want_v.data(), want_i.data());
            for (int rep = 0; rep < 2; ++rep) {  // the counters are cleared by each call
                cuda::top_k(d.p, rows, n, k, values.p, ids.p, ws.p);
                sync();
                const auto gv = values.host();
                const auto gi = ids.host();
                EXPECT_EQ(gi, want_i) << "n " << n << " k " << k;
                EXPECT_EQ(std::memcmp(gv.data(), want_v.data(), gv.size() * 4), 0) << "n " << n << " k " << k;
            }
        }
    }
    EXPECT_THROW(cuda::top_k(nullptr, 1, 10, 65, nullptr, nullptr, nullptr), Error);
    EXPECT_THROW(cuda::top_k(nullptr, 1, 10, 11, nullptr, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace alloy
