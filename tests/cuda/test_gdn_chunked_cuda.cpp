// cuda::gdn_delta_chunked (bf16 tensor-core products, fp32 state) against ref::gdn_delta_serial
// and ref::gdn_delta_chunked on bf16-representable random inputs: tails shorter than a chunk,
// ragged and empty sequences, rows outside the call, both key-head layouts, H_v not a multiple
// of 16, every value-column split (16, 32, 64), the fp32 and the bf16 entry points, and a state carried
// across calls. Outputs are poisoned with NaN first. Bound: relative Frobenius error 1e-2 for
// out and state (bf16 operands; fla's bf16 kernels sit at ~4e-3 / 3e-3 against fp32). Skips
// without a CUDA device, except the argument checks, which run before any device call.
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

// bf16 <-> fp32 on the host: the project's round-to-nearest-even conversions (format/quant.h).
uint16_t to_bf16(float x) { return fp32_to_bf16(x); }
float from_bf16(uint16_t b) { return bf16_to_fp32(b); }
float round_bf16(float x) { return from_bf16(to_bf16(x)); }

struct Inputs {
    ref::GdnShape sh;
    std::vector<int32_t> offs;
    int n_tokens = 0;  // rows of the arrays (>= offs.back())
    std::vector<float> q, k, v, g, beta, state;
};

// q, k L2-normalised (q also / sqrt(d_k)) then rounded to bf16, v and beta bf16-representable,
// g in [-g_max, -0.01), state ~ N(0, 0.3^2): no zeros anywhere.
Inputs make_inputs(const ref::GdnShape& sh, std::vector<int32_t> offs, int n_tokens, float g_max, uint32_t seed) {
    Inputs in{sh, std::move(offs), n_tokens, {}, {}, {}, {}, {}, {}};
    const int T = n_tokens, n_seqs = int(in.offs.size()) - 1;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    auto normed = [&](std::vector<float>& x, int rows, int d, float scale) {
        x.resize(size_t(rows) * d);
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int i = 0; i < d; ++i) ss += double(x[size_t(r) * d + i] = nd(rng)) * x[size_t(r) * d + i];
            for (int i = 0; i < d; ++i) x[size_t(r) * d + i] = round_bf16(x[size_t(r) * d + i] * float(scale / std::sqrt(ss)));
        }
    };
    normed(in.q, T * sh.H_k, sh.d_k, 1.0f / std::sqrt(float(sh.d_k)));
    normed(in.k, T * sh.H_k, sh.d_k, 1.0f);
    in.v.resize(size_t(T) * sh.H_v * sh.d_v);
    for (auto& x : in.v) x = round_bf16(nd(rng));
    in.g.resize(size_t(T) * sh.H_v);
    in.beta.resize(in.g.size());
    for (size_t i = 0; i < in.g.size(); ++i) {
        in.g[i] = -(0.01f + (g_max - 0.01f) * u(rng));
        in.beta[i] = round_bf16(0.02f + 0.96f * u(rng));
    }
    in.state.resize(size_t(n_seqs) * sh.H_v * sh.d_v * sh.d_k);
    for (auto& x : in.state) x = 0.3f * nd(rng);
    return in;
}

// ||a - b|| / ||b|| over the elements where `b` is not NaN; infinite if `a` is not finite
// there, or if `a` is not NaN where `b` is (rows the call must not write stay poisoned).
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(b[i])) {
            if (!std::isnan(a[i])) return INFINITY;
            continue;
        }
        if (!std::isfinite(a[i])) return INFINITY;
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Result {
    std::vector<float> out, state;
};

// The reference: ref::gdn_delta_serial (or chunked, C = 64) on the same (bf16-representable)
// inputs, out rows outside the call left NaN.
Result run_ref(const Inputs& in, bool chunked) {
    Result r{std::vector<float>(size_t(in.n_tokens) * in.sh.H_v * in.sh.d_v, NAN), in.state};
    const int n_seqs = int(in.offs.size()) - 1;
    if (chunked)
        ref::gdn_delta_chunked(in.sh, n_seqs, in.offs.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                               in.beta.data(), r.state.data(), r.out.data(), 64);
    else
        ref::gdn_delta_serial(in.sh, n_seqs, in.offs.data(), in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                              in.beta.data(), r.state.data(), r.out.data());
    return r;
}

// The fp32 entry point over the whole call.
Result run_f32(const Inputs& in) {
    const int n_seqs = int(in.offs.size()) - 1;
    DeviceArray<float> q(in.q), k(in.k), v(in.v), g(in.g), beta(in.beta), state(in.state),
        out(std::vector<float>(size_t(in.n_tokens) * in.sh.H_v * in.sh.d_v, NAN));
    DeviceArray<int32_t> offs(in.offs);
    cuda::gdn_delta_chunked(in.sh, n_seqs, offs.p, q.p, k.p, v.p, g.p, beta.p, state.p, out.p, 64);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return {out.host(), state.host()};
}

// The bf16 entry point (bf16 q/k/v/out, caller's workspace), with a chosen value split.
Result run_bf16(const Inputs& in, int block_v, cuda::GdnScan scan = cuda::GdnScan::Auto) {
    const int n_seqs = int(in.offs.size()) - 1;
    auto bf = [](const std::vector<float>& x) {
        std::vector<uint16_t> y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = to_bf16(x[i]);
        return y;
    };
    DeviceArray<uint16_t> q(bf(in.q)), k(bf(in.k)), v(bf(in.v)),
        out(std::vector<uint16_t>(size_t(in.n_tokens) * in.sh.H_v * in.sh.d_v, 0x7fc0));  // bf16 NaN
    DeviceArray<float> g(in.g), beta(in.beta), state(in.state);
    DeviceArray<int32_t> offs(in.offs);
    DeviceArray<uint8_t> ws(
        std::vector<uint8_t>(cuda::gdn_delta_chunked_workspace_bytes(in.sh, n_seqs, in.n_tokens, scan)));
    cuda::gdn_delta_chunked(in.sh, n_seqs, offs.p, in.n_tokens, q.p, k.p, v.p, g.p, beta.p, state.p, out.p, ws.p,
                            nullptr, block_v, nullptr, scan);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> ob = out.host();
    Result r{std::vector<float>(ob.size()), state.host()};
    for (size_t i = 0; i < ob.size(); ++i) r.out[i] = from_bf16(ob[i]);
    return r;
}

std::string describe(const Inputs& in) {
    std::string s = "H_k " + std::to_string(in.sh.H_k) + " H_v " + std::to_string(in.sh.H_v) +
                    (in.sh.tiled ? " tiled" : " grouped") + " offs {";
    for (size_t i = 0; i < in.offs.size(); ++i) s += (i ? "," : "") + std::to_string(in.offs[i]);
    return s + "}";
}

struct Case {
    ref::GdnShape sh;
    std::vector<int32_t> offs;
    int n_tokens;
    float g_max;
};

const std::vector<Case>& cases() {
    static const std::vector<Case> c = {
        {{16, 16, 128, 128, true}, {0, 200}, 200, 1.0f},                   // 3 chunks + a 8-token tail
        {{16, 32, 128, 128, false}, {0, 64, 64, 130, 131}, 131, 1.0f},     // ragged, empty, 1-token sequences
        {{4, 12, 128, 128, true}, {0, 300}, 300, 0.5f},                    // H_v not a multiple of 16
        {{2, 6, 128, 128, false}, {5, 70, 70, 200}, 210, 2.0f},            // rows outside the call
        {{16, 48, 128, 128, true}, {0, 37}, 37, 1.0f},                     // one partial chunk, 27B heads
        {{1, 2, 128, 128, true}, {0, 1100}, 1100, 0.1f},                   // 18 chunks, slow decay
        {{2, 4, 128, 128, true}, {0, 129, 300}, 300, 20.0f},               // g down to -20 (llama.cpp's range)
    };
    return c;
}

TEST(CudaGdnChunked, Fp32EntryMatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    uint32_t seed = 1000;
    for (const Case& c : cases()) {
        const Inputs in = make_inputs(c.sh, c.offs, c.n_tokens, c.g_max, seed++);
        const Result want = run_ref(in, false), got = run_f32(in);
        const double eo = rel_err(got.out, want.out), es = rel_err(got.state, want.state);
        EXPECT_LE(eo, 1e-2) << describe(in) << " (out)";
        EXPECT_LE(es, 1e-2) << describe(in) << " (state)";
        std::printf("[fp32 entry] %s: out %.2e state %.2e\n", describe(in).c_str(), eo, es);
    }
}

TEST(CudaGdnChunked, Bf16EntryMatchesReferenceWithEverySplit) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    uint32_t seed = 2000;
    for (const Case& c : cases()) {
        const Inputs in = make_inputs(c.sh, c.offs, c.n_tokens, c.g_max, seed++);
        const Result want = run_ref(in, false);
        for (cuda::GdnScan scan : {cuda::GdnScan::Auto, cuda::GdnScan::Wgmma, cuda::GdnScan::WarpRows,
                                   cuda::GdnScan::Transition})
            for (int bv : {16, 32, 64, 128}) {
                if (bv == 128 && scan != cuda::GdnScan::WarpRows) continue;  // only warp rows has 8-warp blocks
                if (bv > 32 && scan == cuda::GdnScan::Transition) continue;  // 16- and 32-column slices only
                const Result got = run_bf16(in, bv, scan);
                const double eo = rel_err(got.out, want.out), es = rel_err(got.state, want.state);
                const char* kind = scan == cuda::GdnScan::Wgmma        ? "wgmma"
                                   : scan == cuda::GdnScan::WarpRows   ? "warp rows"
                                   : scan == cuda::GdnScan::Transition ? "transition"
                                                                       : "gate's kernel";
                EXPECT_LE(eo, 1e-2) << describe(in) << " block_v " << bv << ", " << kind << " (out)";
                EXPECT_LE(es, 1e-2) << describe(in) << " block_v " << bv << ", " << kind << " (state)";
                std::printf("[bf16 entry, block_v %d, %s] %s: out %.2e state %.2e\n", bv, kind, describe(in).c_str(), eo,
                            es);
            }
    }
}

// The two references agree to fp32 rounding; the kernel is as close to the chunked one.
TEST(CudaGdnChunked, MatchesTheChunkedReferenceToo) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const Inputs in = make_inputs({16, 32, 128, 128, true}, {0, 500, 777}, 777, 1.0f, 77);
    const Result serial = run_ref(in, false), chunked = run_ref(in, true), got = run_f32(in);
    EXPECT_LE(rel_err(chunked.out, serial.out), 1e-5);
    EXPECT_LE(rel_err(got.out, chunked.out), 1e-2);
    EXPECT_LE(rel_err(got.state, chunked.state), 1e-2);
    std::printf("[vs ref chunked] out %.2e state %.2e\n", rel_err(got.out, chunked.out),
                rel_err(got.state, chunked.state));
}

// A prompt in two calls (the state carried between them, the second starting mid-chunk of the
// token grid) gives what one call gives, within the same bound of the reference.
TEST(CudaGdnChunked, StateCarriesAcrossCalls) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const Inputs in = make_inputs({16, 16, 128, 128, true}, {0, 300}, 300, 1.0f, 5);
    const Result want = run_ref(in, false);
    Inputs first = in, second = in;
    first.offs = {0, 100};
    second.offs = {100, 300};
    const Result a = run_f32(first);
    second.state = a.state;
    const Result b = run_f32(second);
    std::vector<float> out(a.out.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = i < size_t(100) * 16 * 128 ? a.out[i] : b.out[i];
    EXPECT_LE(rel_err(out, want.out), 1e-2);
    EXPECT_LE(rel_err(b.state, want.state), 1e-2);
}

TEST(CudaGdnChunked, RejectsWhatItCannotRun) {
    // Argument checks come before any device call: this runs without a GPU too.
    const int32_t* none = nullptr;
    auto expect_error = [](auto&& call, const char* field) {
        try {
            call();
            ADD_FAILURE() << "no error for " << field;
        } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("cuda::gdn_delta_chunked"), std::string::npos) << m;
            EXPECT_NE(m.find(field), std::string::npos) << m;
        }
    };
    expect_error([&] { cuda::gdn_delta_chunked({16, 16, 64, 128, true}, 1, none, nullptr, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, nullptr, 64); }, "d_k");
    expect_error([&] { cuda::gdn_delta_chunked({16, 16, 128, 256, true}, 1, none, nullptr, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, nullptr, 64); }, "d_v");
    expect_error([&] { cuda::gdn_delta_chunked({16, 16, 128, 128, true}, 1, none, nullptr, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, nullptr, 32); }, "chunk_size");
    expect_error([&] { cuda::gdn_delta_chunked({3, 16, 128, 128, true}, 1, none, nullptr, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, nullptr, 64); }, "H_v");
    expect_error([&] { cuda::gdn_delta_chunked({16, 16, 128, 128, true}, 1, none, 64, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, nullptr, nullptr, nullptr); }, "seq_offsets");
}

}  // namespace
}  // namespace alloy
