// cuda::matmul against ref::matmul on random weights and inputs, for every weight type and
// path (F32, BF16 and Q8_0 GEMVs at T <= 16, F32 cuBLAS, BF16 cuBLAS and Q8_0 dequantized panels +
// cuBLAS above), odd sizes (k = 96 and 160: Q8_0 rows of 3 and 5 blocks, so rows start 2 bytes
// off a word; rows 37; T 1, 2, 3, 4, 5, 9, 16, 17), and a matrix taller than one Q8_0 panel.
// Batch invariance of the GEMVs: every row of a T = 1..16 call, the token at any position,
// has the bits of a T = 1 call (GemvRowsDoNotDependOnTheBatch). Each path is checked
// twice: tightly against ref run on the same rounded operands the path computes with (x in
// bf16, x quantized to int8 as the GEMV does it, the Q8_0 weight in bf16), so an indexing or
// scaling bug cannot hide in the rounding; and loosely against ref on the original fp32 x, the
// error a user sees. Skips when no CUDA device is present (CI).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "format/quant.h"
#include "alloy/error.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/ops.h"
#include "kernels/ref/matmul.h"
#include "tests/cuda/device_array.h"

namespace alloy {
namespace {

using test::DeviceArray;
using test::DeviceWeight;

using test::max_rel;

struct HostWeight {
    GgmlType type;
    int64_t n_in, n_out;
    size_t row_bytes;
    std::vector<uint8_t> bytes;
    WeightView view(const uint8_t* data) const { return {type, n_in, n_out, data, row_bytes}; }
};

// The block types with a K-quant GEMV (kernels/cuda/matmul_kquant.cu), and shapes for them:
// rows of 1, 3, 4 and 14 super-blocks (Q4_0 / IQ4_NL: 3 and 5 blocks too), odd row counts.
const GgmlType kKquantTypes[] = {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::IQ4_NL,
                                 GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::MXFP4};
bool super_blocks(GgmlType t) { return type_traits(t).block_elems == 256; }

HostWeight make_weight(GgmlType t, int64_t n_out, int64_t n_in, std::vector<float>& f, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    f.resize(size_t(n_out * n_in));
    for (auto& x : f) x = nd(rng);
    HostWeight w{t, n_in, n_out, row_bytes(t, n_in), {}};
    w.bytes.resize(w.row_bytes * size_t(n_out));
    for (int64_t r = 0; r < n_out; ++r) quantize_row(t, f.data() + r * n_in, w.bytes.data() + r * w.row_bytes, n_in);
    return w;
}

// x as the Q8_0 GEMV sees it: per 32 values d = amax / 127, q = round-half-even(x / d).
std::vector<float> quantize_like_gemv(const std::vector<float>& x) {
    std::vector<float> y(x.size());
    for (size_t b = 0; b < x.size(); b += 32) {
        float amax = 0;
        for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
        const float d = amax / 127.0f;
        for (size_t i = 0; i < 32; ++i) y[b + i] = d > 0 ? float(std::nearbyint(x[b + i] / d)) * d : 0.0f;
    }
    return y;
}

std::vector<float> round_bf16(const std::vector<float>& x) {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
    return y;
}

std::vector<float> run_cuda(const HostWeight& w, const std::vector<float>& x, int64_t T) {
    const DeviceWeight dw(w.view(w.bytes.data()));
    DeviceArray<float> dx(x), dy(std::vector<float>(size_t(T * w.n_out), NAN));
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::matmul_workspace_bytes(dw.view, T)));
    cuda::matmul(dw.view, dx.p, dy.p, T, ws.p);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return dy.host();
}

std::vector<float> run_ref(const WeightView& W, const std::vector<float>& x, int64_t T) {
    std::vector<float> y(size_t(T * W.n_out));
    ref::matmul(W, x.data(), y.data(), T);
    return y;
}

struct Case {
    int64_t n_out, n_in;
};
const std::vector<Case> kCases = {{37, 96}, {64, 160}, {300, 1024}, {129, 3584}};
const std::vector<Case> kSuperBlockCases = {{37, 256}, {64, 768}, {300, 1024}, {129, 3584}};
const std::vector<int64_t> kTs = {1, 2, 3, 4, 5, 9, 16, 17};

// Runs every case and T for weight type t; `exact_x` maps x to the operand the path uses,
// `exact_w` the weight (null: the weight's own bytes). Tolerances: tight vs the rounded
// operands, loose vs the fp32 ones.
void check_type(GgmlType t, double tight, double loose, const char* name) {
    uint32_t seed = 7;
    double worst_tight = 0, worst_loose = 0;
    for (const Case& c : super_blocks(t) ? kSuperBlockCases : kCases) {
        std::vector<float> wf;
        const HostWeight w = make_weight(t, c.n_out, c.n_in, wf, seed++);
        for (int64_t T : kTs) {
            std::mt19937 rng(seed++);
            std::normal_distribution<float> nd(0.0f, 1.0f);
            std::vector<float> x(size_t(T * c.n_in));
            for (auto& v : x) v = nd(rng);
            const std::vector<float> got = run_cuda(w, x, T);
            const std::vector<float> loose_want = run_ref(w.view(w.bytes.data()), x, T);
            // The operands this path multiplies.
            std::vector<float> want;
            if (t == GgmlType::F32) {
                want = loose_want;
            } else if (t == GgmlType::BF16 && T <= cuda::kQ8GemvMaxT) {
                want = loose_want;  // the BF16 GEMV multiplies fp32 x
            } else if (t == GgmlType::BF16) {
                want = run_ref(w.view(w.bytes.data()), round_bf16(x), T);
            } else if (T <= cuda::kQ8GemvMaxT) {
                want = run_ref(w.view(w.bytes.data()), quantize_like_gemv(x), T);
            } else {
                // The weight dequantized and rounded to bf16, as a BF16 matrix.
                std::vector<float> deq(size_t(c.n_in));
                HostWeight wb{GgmlType::BF16, c.n_in, c.n_out, size_t(c.n_in) * 2, {}};
                wb.bytes.resize(wb.row_bytes * size_t(c.n_out));
                for (int64_t r = 0; r < c.n_out; ++r) {
                    dequantize_row(t, w.bytes.data() + r * w.row_bytes, deq.data(), c.n_in);
                    quantize_row(GgmlType::BF16, deq.data(), wb.bytes.data() + r * wb.row_bytes, c.n_in);
                }
                want = run_ref(wb.view(wb.bytes.data()), round_bf16(x), T);
            }
            const std::string what = std::string(name) + " " + std::to_string(c.n_out) + "x" +
                                     std::to_string(c.n_in) + " T " + std::to_string(T);
            const double et = max_rel(got, want), el = max_rel(got, loose_want);
            EXPECT_LE(et, tight) << what << " (same operands)";
            EXPECT_LE(el, loose) << what << " (fp32 operands)";
            worst_tight = std::max(worst_tight, et);
            worst_loose = std::max(worst_loose, el);
        }
    }
    std::printf("[max-err] matmul %s: %.3g vs ref on the same operands, %.3g vs ref on fp32 x\n", name, worst_tight,
                worst_loose);
}

TEST(CudaMatmul, F32MatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    check_type(GgmlType::F32, 1e-5, 1e-5, "F32");
}

TEST(CudaMatmul, Bf16MatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    check_type(GgmlType::BF16, 1e-5, 1e-2, "BF16");
}

TEST(CudaMatmul, Q8_0MatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    check_type(GgmlType::Q8_0, 1e-5, 2e-2, "Q8_0");
}

// More rows than one dequantization panel (the last panel partial), at prefill and decode.
// Q4_0, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS: the K-quant GEMV (T <= 16; each unit's decoding
// against format/quant.cpp's dequantize_row through ref::matmul) and the bf16 panels above.
TEST(CudaMatmul, KquantsMatchReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    for (GgmlType t : kKquantTypes) check_type(t, 1e-5, 2e-2, type_traits(t).name);
}

TEST(CudaMatmul, Q8_0TallMatrix) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    std::vector<float> wf;
    const int64_t n_out = cuda::kQ8PanelRows + 37, n_in = 64;
    const HostWeight w = make_weight(GgmlType::Q8_0, n_out, n_in, wf, 3);
    for (int64_t T : {int64_t(1), int64_t(9), int64_t(17)}) {
        std::mt19937 rng(static_cast<unsigned>(T));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(size_t(T * n_in));
        for (auto& v : x) v = nd(rng);
        EXPECT_LE(max_rel(run_cuda(w, x, T), run_ref(w.view(w.bytes.data()), x, T)), 2e-2) << "T " << T;
    }
}

// The CPU's contract (NOTES "Core"), on the device: calls of up to 16 rows take the GEMV, whose
// arithmetic per (row, token) is fixed, so each output row's bits do not depend on how many
// rows the call has nor on the token's position in it. 16 random tokens; every window
// [o, o + T) of them (T = 1..16, o = 0..16 - T) is one call, each of its rows compared bit for
// bit with that token's T = 1 call. Shapes: odd n_in (Q8_0 rows of 3 and 5 blocks), n_in 3584
// (whose x is quantized in the GEMV blocks up to T = 9 and by a kernel before above: the same
// bits), and row counts that give 1..8 warps per row.
TEST(CudaMatmul, GemvRowsDoNotDependOnTheBatch) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    constexpr int64_t kMaxT = 16;
    static_assert(kMaxT == cuda::kQ8GemvMaxT, "the GEMV's limit");
    const std::vector<Case> cases = {{37, 96}, {129, 160}, {300, 1024}, {1031, 3584}, {5000, 1024}};
    // K-quants: 1..8 warps a row (8 needs 256 units: n_in 8192)
    const std::vector<Case> sb_cases = {{37, 256}, {300, 1024}, {1031, 3584}, {5000, 1024}, {64, 8192}};
    uint32_t seed = 101;
    std::vector<GgmlType> types = {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32};
    types.insert(types.end(), std::begin(kKquantTypes), std::end(kKquantTypes));
    for (GgmlType t : types) {
        for (const Case& c : super_blocks(t) ? sb_cases : cases) {
            std::vector<float> wf;
            const HostWeight w = make_weight(t, c.n_out, c.n_in, wf, seed++);
            std::mt19937 rng(seed++);
            std::normal_distribution<float> nd(0.0f, 1.0f);
            std::vector<float> x(size_t(kMaxT * c.n_in));
            for (auto& v : x) v = nd(rng);
            const DeviceWeight dw(w.view(w.bytes.data()));
            DeviceArray<float> dx(x), dy(std::vector<float>(size_t(kMaxT * c.n_out)));
            const WeightView W = dw.view;
            DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::matmul_workspace_bytes(W, kMaxT)));
            auto run = [&](int64_t o, int64_t T) {
                EXPECT_EQ(cudaMemset(dy.p, 0xff, dy.n * sizeof(float)), cudaSuccess);  // NaN poison
                cuda::matmul(W, dx.p + o * c.n_in, dy.p, T, ws.p);
                EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                std::vector<float> y = dy.host();
                y.resize(size_t(T * c.n_out));
                return y;
            };
            std::vector<std::vector<float>> alone(kMaxT);
            for (int64_t j = 0; j < kMaxT; ++j) {
                alone[size_t(j)] = run(j, 1);
                for (float v : alone[size_t(j)]) ASSERT_TRUE(std::isfinite(v)) << "unwritten row";
            }
            // The rows must differ between tokens, or the comparison proves nothing.
            EXPECT_NE(std::memcmp(alone[0].data(), alone[1].data(), alone[0].size() * 4), 0);
            int bad = 0;
            for (int64_t T = 1; T <= kMaxT; ++T)
                for (int64_t o = 0; o + T <= kMaxT; ++o) {
                    const std::vector<float> y = run(o, T);
                    for (int64_t r = 0; r < T; ++r) {
                        const float* got = y.data() + r * c.n_out;
                        const std::vector<float>& want = alone[size_t(o + r)];
                        if (std::memcmp(got, want.data(), size_t(c.n_out) * 4) != 0 && bad++ < 5) {
                            int64_t i = 0;
                            while (i < c.n_out && std::memcmp(got + i, &want[size_t(i)], 4) == 0) ++i;
                            ADD_FAILURE() << type_traits(t).name << " " << c.n_out << "x" << c.n_in
                                          << " T " << T << " token " << o + r << " at position " << r
                                          << ": output " << i << " is " << got[i] << ", alone " << want[size_t(i)];
                        }
                    }
                }
            EXPECT_EQ(bad, 0) << "rows whose bits depend on the batch";
        }
    }
}

// matmul_multi: three weights of odd row counts (1031, 16, 37: block boundaries between parts
// mid-grid) on one x, T 1..17 (17: one matmul per weight). Each part against ref::matmul (the
// tolerance of its type's path), and at T <= 16 each output row's bits equal to the T = 1
// group call's (the batch invariance verification needs, per group).
TEST(CudaMatmul, MultiMatchesReferenceAndIsBatchInvariant) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const int64_t n_in = 1024;
    const int64_t rows[3] = {1031, 16, 37};
    uint32_t seed = 900;
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS}) {
        std::vector<HostWeight> hw;
        std::deque<DeviceWeight> dw;  // not movable: a deque never moves them
        std::vector<WeightView> views;
        for (int64_t r : rows) {
            std::vector<float> wf;
            hw.push_back(make_weight(t, r, n_in, wf, seed++));
        }
        for (const HostWeight& w : hw) dw.emplace_back(w.view(w.bytes.data()));
        for (size_t m = 0; m < hw.size(); ++m) views.push_back(dw[m].view);
        const WeightView* W[3] = {&views[0], &views[1], &views[2]};
        const int64_t kMaxT = 17;
        std::mt19937 rng(seed++);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(size_t(kMaxT * n_in));
        for (auto& v : x) v = nd(rng);
        DeviceArray<float> dx(x);
        DeviceArray<uint8_t> ws{std::vector<uint8_t>(cuda::matmul_multi_workspace_bytes(W, 3, kMaxT))};
        std::deque<DeviceArray<float>> dy;
        for (int64_t r : rows) dy.emplace_back(std::vector<float>(size_t(kMaxT * r), NAN));
        auto run = [&](int64_t o, int64_t T) {
            float* y[3] = {dy[0].p, dy[1].p, dy[2].p};
            cuda::matmul_multi(W, y, 3, dx.p + o * n_in, T, ws.p);
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            std::vector<std::vector<float>> out;
            for (size_t m = 0; m < 3; ++m) {
                out.push_back(dy[m].host());
                out.back().resize(size_t(T * rows[m]));
            }
            return out;
        };
        const double tol = t == GgmlType::BF16 ? 1e-2 : t == GgmlType::F32 ? 1e-5 : 2e-2;
        std::vector<std::vector<std::vector<float>>> alone;
        for (int64_t j = 0; j < kMaxT; ++j) alone.push_back(run(j, 1));
        for (int64_t T : {int64_t(1), int64_t(2), int64_t(5), int64_t(16), int64_t(17)}) {
            const auto got = run(0, T);
            const std::vector<float> xs(x.begin(), x.begin() + T * n_in);
            for (size_t m = 0; m < 3; ++m) {
                EXPECT_LE(max_rel(got[m], run_ref(hw[m].view(hw[m].bytes.data()), xs, T)), tol)
                    << type_traits(t).name << " part " << m << " T " << T;
                if (T > cuda::kQ8GemvMaxT) continue;
                for (int64_t r = 0; r < T; ++r)
                    EXPECT_EQ(0, std::memcmp(got[m].data() + r * rows[m], alone[size_t(r)][m].data(), size_t(rows[m]) * 4))
                        << type_traits(t).name << " part " << m << " T " << T << " row " << r << ": bits differ from T = 1";
            }
        }
    }
}

// N(0, scale^2) values from a seeded generator, drawn in call order (the producers' tests).
struct RandomValues {
    std::mt19937 rng;
    std::normal_distribution<float> nd{0.0f, 1.0f};
    explicit RandomValues(uint32_t seed) : rng(seed) {}
    std::vector<float> operator()(size_t n, float scale) {
        std::vector<float> v(n);
        for (float& f : v) f = scale * nd(rng);
        return v;
    }
};

// y of a 333-row weight of type t alone (matmul) and with a 64-row one (matmul_multi), one
// after the other, for x [T, n] on the device and `given` (the producer's form of x; nullptr:
// the matmuls convert x themselves). The weights follow from the seed.
std::vector<float> matmuls_on(GgmlType t, int64_t n, int64_t T, uint32_t seed, const float* x,
                              const cuda::MatmulInput* given) {
    std::vector<float> wf, wf2;
    const HostWeight hw = make_weight(t, 333, n, wf, seed);
    const HostWeight hw2 = make_weight(t, 64, n, wf2, seed + 1);
    const DeviceWeight W(hw.view(hw.bytes.data())), W2(hw2.view(hw2.bytes.data()));
    const WeightView v1 = W.view, v2 = W2.view;
    const WeightView* both[2] = {&v1, &v2};
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::matmul_multi_workspace_bytes(both, 2, T)));
    DeviceArray<float> y1(std::vector<float>(size_t(T * 333), NAN)), y2(std::vector<float>(size_t(T * 64), NAN)),
        y3(std::vector<float>(size_t(T * 333), NAN));
    float* ys[2] = {y1.p, y2.p};
    cuda::matmul_multi(both, ys, 2, x, T, ws.p, nullptr, given);
    cuda::matmul(v1, x, y3.p, T, ws.p, nullptr, given);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> r = y1.host(), r2 = y2.host(), r3 = y3.host();
    r.insert(r.end(), r2.begin(), r2.end());
    r.insert(r.end(), r3.begin(), r3.end());
    return r;
}

// The producers' quantized outputs (ops.h MatmulInput): rms_norm, add_rms_norm (rows of 1024 and
// 5120, past the norm's register-held part), swiglu and the strided attention gate write x's
// Q8_0 form beside it, and a Q8_0 GEMV (matmul and matmul_multi) on that MatmulInput gives the
// bits of the GEMV quantizing x itself, at T 1, 3 and 16; the fp32 outputs are those of the
// plain calls; the bytes of q and d are the host quantization's (d = amax / 127, q rounded to
// nearest even).
TEST(CudaMatmul, ProducersQuantizedOutputsGiveTheGemvItsOwnBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    RandomValues rnd(91);
    for (int64_t n : {int64_t(1024), int64_t(5120)})
        for (int64_t T : {int64_t(1), int64_t(3), int64_t(16)})
            for (int producer = 0; producer < 4; ++producer) {
                const size_t N = size_t(T * n);
                const std::vector<float> a = rnd(N, 1.0f), b = rnd(N, 0.7f), w = rnd(size_t(n), 0.3f);
                const int heads = int(n / 256);  // the gate: heads of 256 read at a stride of 2 n per token
                const std::vector<float> g = rnd(size_t(T * 2 * n), 2.0f);
                DeviceArray<float> da(a), db(b), dw(w), dg(g);
                DeviceArray<float> plain(std::vector<float>(N, NAN)), fused(std::vector<float>(N, NAN));
                DeviceArray<int8_t> q(std::vector<int8_t>(N, 0));
                DeviceArray<float> d(std::vector<float>(N / 32, NAN));
                const cuda::MatmulInput q8{q.p, d.p};
                const float eps = 1e-6f;
                auto run = [&](float* out, cuda::MatmulInput qq) {
                    DeviceArray<float> x(a);  // add_rms_norm and the gate write into their input
                    switch (producer) {
                        case 0: cuda::rms_norm(x.p, dw.p, out, T, n, eps, nullptr, qq); break;
                        case 1: cuda::add_rms_norm(x.p, db.p, dw.p, out, T, n, eps, nullptr, qq); break;
                        case 2: cuda::swiglu(x.p, db.p, out, N, nullptr, qq); break;
                        default:
                            cuda::sigmoid_gate_mul(x.p, dg.p + 256, T * heads, 256, 2 * n / heads, nullptr, qq);
                            ASSERT_EQ(cudaMemcpy(out, x.p, N * 4, cudaMemcpyDeviceToDevice), cudaSuccess);
                    }
                    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                };
                run(plain.p, {});
                run(fused.p, q8);
                const std::vector<float> out = plain.host();
                const std::string what = "producer " + std::to_string(producer) + " n " + std::to_string(n) + " T " + std::to_string(T);
                ASSERT_EQ(fused.host(), out) << what << ": fp32 output";
                const std::vector<int8_t> qh = q.host();
                const std::vector<float> dh = d.host();
                for (size_t blk = 0; blk < N / 32; ++blk) {
                    float amax = 0;
                    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(out[blk * 32 + i]));
                    const float dd = amax / 127.0f;
                    ASSERT_EQ(dh[blk], dd) << what << " block " << blk;
                    for (size_t i = 0; i < 32; ++i)
                        ASSERT_EQ(qh[blk * 32 + i], int8_t(dd > 0 ? std::nearbyint(out[blk * 32 + i] / dd) : 0)) << what;
                }
                // The GEMVs on it: one weight, and two on one launch.
                const uint32_t seed = uint32_t(producer + 7 * T);
                EXPECT_EQ(matmuls_on(GgmlType::Q8_0, n, T, seed, plain.p, &q8), matmuls_on(GgmlType::Q8_0, n, T, seed, plain.p, nullptr))
                    << what << ": GEMV on the producer's MatmulInput";
            }
}

// The producers' bf16 outputs (ops.h MatmulInput::b), for prefill steps (T > kQ8GemvMaxT): the
// same four producers write x rounded to bf16 (the host's round to nearest even), beside the
// fp32 output (which keeps the plain call's bits) or instead of it (b_only: the fp32 output is
// not touched); BF16 and Q8_0 GEMMs (matmul, and matmul_multi of two weights) given that copy
// give the bits of converting x themselves.
TEST(CudaMatmul, ProducersBf16OutputsGiveTheGemmItsOwnBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    RandomValues rnd(92);
    for (int64_t n : {int64_t(1024), int64_t(5120)})
        for (int64_t T : {int64_t(17), int64_t(100)})
            for (int producer = 0; producer < 4; ++producer) {
                const size_t N = size_t(T * n);
                const std::vector<float> a = rnd(N, 1.0f), b = rnd(N, 0.7f), w = rnd(size_t(n), 0.3f);
                const int heads = int(n / 256);
                const std::vector<float> g = rnd(size_t(T * 2 * n), 2.0f);
                DeviceArray<float> da(a), db(b), dw(w), dg(g);
                DeviceArray<uint16_t> xb(std::vector<uint16_t>(N, 0xffff));
                const float eps = 1e-6f;
                // out: the fp32 output after the call (the gate works in place: its x).
                auto run = [&](cuda::MatmulInput pk) {
                    DeviceArray<float> x(a), out(std::vector<float>(N, NAN));
                    switch (producer) {
                        case 0: cuda::rms_norm(x.p, dw.p, out.p, T, n, eps, nullptr, pk); break;
                        case 1: cuda::add_rms_norm(x.p, db.p, dw.p, out.p, T, n, eps, nullptr, pk); break;
                        case 2: cuda::swiglu(x.p, db.p, out.p, N, nullptr, pk); break;
                        default:
                            cuda::sigmoid_gate_mul(x.p, dg.p + 256, T * heads, 256, 2 * n / heads, nullptr, pk);
                            EXPECT_EQ(cudaMemcpy(out.p, x.p, N * 4, cudaMemcpyDeviceToDevice), cudaSuccess);
                    }
                    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
                    return out.host();
                };
                const std::string what = "producer " + std::to_string(producer) + " n " + std::to_string(n) + " T " + std::to_string(T);
                const std::vector<float> plain = run({});
                cuda::MatmulInput pk;
                pk.b = xb.p;
                ASSERT_EQ(run(pk), plain) << what << ": fp32 output beside the bf16 one";
                std::vector<uint16_t> bh = xb.host();
                for (size_t i = 0; i < N; ++i) ASSERT_EQ(bh[i], fp32_to_bf16(plain[i])) << what << " value " << i;
                ASSERT_EQ(cudaMemset(xb.p, 0xff, N * 2), cudaSuccess);
                pk.b_only = true;
                const std::vector<float> untouched = run(pk);
                for (size_t i = 0; i < N; ++i) {
                    // The gate's fp32 output is its input x, left as it was; the others' stays NaN.
                    if (producer == 3) ASSERT_EQ(untouched[i], a[i]) << what << ": b_only wrote fp32";
                    else ASSERT_TRUE(std::isnan(untouched[i])) << what << ": b_only wrote fp32";
                }
                ASSERT_EQ(xb.host(), bh) << what << ": b_only's bf16 output";
                // The GEMMs on it, against converting the fp32 output themselves.
                DeviceArray<float> x32(plain);
                for (GgmlType t : {GgmlType::BF16, GgmlType::Q8_0}) {
                    const uint32_t seed = uint32_t(producer + 7 * T);
                    EXPECT_EQ(matmuls_on(t, n, T, seed, x32.p, &pk), matmuls_on(t, n, T, seed, x32.p, nullptr))
                        << what << " " << type_traits(t).name << ": GEMM on the producer's bf16 copy";
                }
            }
}

// matmul_multi over weights of several types (as a Q4_K_M file's GDN input projections: Q4_K,
// Q6_K, F32 side by side) at decode and prefill sizes: each part against ref, and nothing
// written past a workspace of exactly matmul_multi_workspace_bytes (the bf16 panels once ran at
// T <= 16 here and overran it: garbage tokens under the engine).
TEST(CudaMatmul, MultiOfMixedTypesStaysInItsWorkspace) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const int64_t n_in = 1024;
    const GgmlType types[4] = {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F32};
    const int64_t rows[4] = {300, 37, 129, 16};
    std::vector<HostWeight> hw;
    std::deque<DeviceWeight> dw;
    std::vector<WeightView> views;
    uint32_t seed = 1200;
    for (int m = 0; m < 4; ++m) {
        std::vector<float> wf;
        hw.push_back(make_weight(types[m], rows[m], n_in, wf, seed++));
    }
    for (const HostWeight& w : hw) dw.emplace_back(w.view(w.bytes.data()));
    for (size_t m = 0; m < hw.size(); ++m) views.push_back(dw[m].view);
    const WeightView* W[4] = {&views[0], &views[1], &views[2], &views[3]};
    constexpr int64_t kMaxT = 40;  // 17 and 40: the prefill paths (bf16 panels, F32 cuBLAS) too
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(size_t(kMaxT * n_in));
    for (auto& v : x) v = nd(rng);
    DeviceArray<float> dx(x);
    std::deque<DeviceArray<float>> dy;
    for (int64_t r : rows) dy.emplace_back(std::vector<float>(size_t(kMaxT * r), NAN));
    for (int64_t T : {int64_t(1), int64_t(3), int64_t(16), int64_t(17), int64_t(40)}) {
        const size_t bytes = cuda::matmul_multi_workspace_bytes(W, 4, T);
        constexpr size_t kCanary = 1 << 20;
        DeviceArray<uint8_t> ws{std::vector<uint8_t>(bytes + kCanary, 0xa5)};
        float* y[4] = {dy[0].p, dy[1].p, dy[2].p, dy[3].p};
        cuda::matmul_multi(W, y, 4, dx.p, T, ws.p);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<uint8_t> after = ws.host();
        EXPECT_TRUE(std::all_of(after.begin() + bytes, after.end(), [](uint8_t b) { return b == 0xa5; }))
            << "T " << T << ": written past the workspace's " << bytes << " bytes";
        const std::vector<float> xs(x.begin(), x.begin() + T * n_in);
        for (int m = 0; m < 4; ++m) {
            std::vector<float> got = dy[size_t(m)].host();
            got.resize(size_t(T * rows[m]));
            EXPECT_LE(max_rel(got, run_ref(hw[size_t(m)].view(hw[size_t(m)].bytes.data()), xs, T)),
                      types[m] == GgmlType::F32 ? 1e-5 : 2e-2)
                << type_traits(types[m]).name << " part " << m << " T " << T;
        }
    }
}

TEST(CudaMatmul, RefusesOtherTypes) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    std::vector<uint8_t> dummy(64);
    DeviceArray<uint8_t> d(dummy);
    const WeightView W{GgmlType::F16, 32, 1, d.p, 64};
    EXPECT_THROW(cuda::matmul(W, nullptr, nullptr, 1, nullptr), Error);
    // A K-quant in GGUF's layout, as Q8_0.
    const WeightView q4k{GgmlType::Q4_K, 256, 1, d.p, 144};
    EXPECT_THROW(cuda::matmul(q4k, nullptr, nullptr, 1, nullptr), Error);
    // Q8_0 in GGUF's layout: the kernels read only the split one (cuda::split_blocks).
    const WeightView q8{GgmlType::Q8_0, 32, 1, d.p, 34};
    EXPECT_THROW(cuda::matmul(q8, nullptr, nullptr, 1, nullptr), Error);
    EXPECT_THROW(cuda::get_rows(q8, nullptr, nullptr, 1), Error);
}

}  // namespace
}  // namespace alloy
