// alloy test-ops [-o OPNAME] [--quick] [--full] [--backend cpu|cuda]: every op variant against
// its kernels/ref reference on random inputs, in the manner of llama.cpp's test-backend-ops
// (--backend cuda: the kernels/cuda versions of the ops that have one, on the same cases). One line per
// (op, variant, case); a case fails on NaN/Inf or when the normalised MSE
// sum((x - ref)^2) / sum(ref^2) of any output tensor exceeds the op's threshold.
//
// To add a variant (an optimized kernel in kernels/cpu, say), append {name, function} to the
// op's variant list below; the reference, the input generator and the case grid stay as they are.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "alloy/error.h"
#include "cli/commands.h"
#include "format/quant.h"
#include "kernels/ref/gdn.h"
#include "kernels/cpu/add.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gate.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/kv_store.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/ref/add.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/gate.h"
#include "kernels/ref/kv_store.h"
#include "kernels/ref/matmul.h"
#include "kernels/ref/moe.h"
#include "kernels/ref/rms_norm.h"
#include "kernels/ref/rope.h"
#include "kernels/ref/swiglu.h"
#if ALLOY_CUDA
#include "cli/cuda/test_ops_cuda.h"
#endif

namespace alloy::cli {
namespace {

using Tensors = std::vector<std::pair<const char*, std::vector<float>>>;  // named outputs

// Which implementation of an op a case runs: the reference, kernels/cpu on an ISA path, or
// kernels/cuda (cli/cuda/test_ops_cuda.h, in builds with nvcc).
enum class Impl { Ref, Cpu, Cuda };
#if ALLOY_CUDA
#define ALLOY_CUDA_OP(call) cuda_ops::call
#else
#define ALLOY_CUDA_OP(call) throw Error("test-ops: this build has no CUDA backend (nvcc was not found at configure time)")
#endif

// One variant of an op: a name and a function from the op's inputs to its named outputs.
template <class In>
struct Variant {
    const char* name;
    std::function<Tensors(const In&)> run;
    int max_T = 1 << 30;  // GDN ops: cases with more tokens skip this variant
    double limit = 1e-7;  // the NMSE it must stay within (kMaxNmseF32 unless its arithmetic is coarser)
};

// ---------------------------------------------------------------------------------------
// Case grid shared by the GDN ops (Qwen3.5 head sizes).

struct GdnCase {
    int H_v, r, T, n_seqs;
    bool init;  // random initial states (else zero, as at a sequence start)
};

constexpr int kHeadDim = 128;  // d_k = d_v

// Ragged batches: 3 sequences have lengths {T, 0, T/2 + 1}; the empty one must keep its state.
std::vector<int32_t> gdn_offsets(const GdnCase& c) {
    std::vector<int> lens{c.T};
    if (c.n_seqs == 3) lens = {c.T, 0, c.T / 2 + 1};
    std::vector<int32_t> offs{0};
    for (int n : lens) offs.push_back(offs.back() + n);
    return offs;
}

alloy::ref::GdnShape gdn_shape(const GdnCase& c) {
    return {c.H_v / c.r, c.H_v, kHeadDim, kHeadDim, /*tiled=*/true};  // GGUF head map
}

std::string gdn_label(const GdnCase& c) {
    return "H_v=" + std::to_string(c.H_v) + ",r=" + std::to_string(c.r) + ",T=" + std::to_string(c.T) +
           ",seqs=" + std::to_string(c.n_seqs) + ",init=" + std::to_string(c.init ? 1 : 0);
}

struct Rng {
    std::mt19937 gen;
    explicit Rng(uint32_t seed) : gen(seed) {}
    std::vector<float> vec(std::size_t n, float lo, float hi) {
        std::uniform_real_distribution<float> u(lo, hi);
        std::vector<float> x(n);
        for (auto& e : x) e = u(gen);
        return x;
    }
};

// ---------------------------------------------------------------------------------------
// GDN_DELTA: the delta rule core (kernels/ref/gdn.h). Data as in test-backend-ops:
// beta ~ U[0, 1], v ~ U[-0.3, 5], q, k ~ U[-1, 1] L2-normalised (q also / sqrt(d_k)),
// initial state ~ U[-1, 1]; g ~ U[-20, -1e-4] (test-backend-ops) on even value heads, but
// g ~ U[-1, -0.01] (trained models) on odd ones: with g down to -20 the state forgets
// everything but the last few tokens, which would hide errors in early tokens of a chunk.

struct DeltaIn {
    alloy::ref::GdnShape shape;
    std::vector<int32_t> offs;
    std::vector<float> q, k, v, g, beta, state;  // [T,H_k,d_k] x2, [T,H_v,d_v], [T,H_v] x2, [n,H_v,d_v,d_k]
    int n_seqs() const { return (int)offs.size() - 1; }
};

DeltaIn make_delta_in(const GdnCase& c, uint32_t seed) {
    Rng rng(seed);
    DeltaIn in;
    in.shape = gdn_shape(c);
    in.offs = gdn_offsets(c);
    const std::size_t T = in.offs.back(), H_k = in.shape.H_k, H_v = in.shape.H_v, d = kHeadDim;
    in.q = rng.vec(T * H_k * d, -1, 1);
    in.k = rng.vec(T * H_k * d, -1, 1);
    for (auto* x : {&in.q, &in.k})
        for (std::size_t row = 0; row < T * H_k; ++row) {
            float* e = x->data() + row * d;
            double ss = 0;
            for (std::size_t i = 0; i < d; ++i) ss += (double)e[i] * e[i];
            const double scale = (x == &in.q ? 1.0 / std::sqrt((double)d) : 1.0) / std::sqrt(ss + 1e-6);
            for (std::size_t i = 0; i < d; ++i) e[i] = (float)(e[i] * scale);
        }
    in.v = rng.vec(T * H_v * d, -0.3f, 5.0f);
    in.g = rng.vec(T * H_v, -20.0f, -1e-4f);  // [T, H_v]
    std::uniform_real_distribution<float> realistic(-1.0f, -0.01f);
    for (std::size_t t = 0; t < T; ++t)
        for (std::size_t h = 1; h < H_v; h += 2) in.g[t * H_v + h] = realistic(rng.gen);
    in.beta = rng.vec(T * H_v, 0.0f, 1.0f);
    const std::size_t ns = (std::size_t)in.n_seqs() * H_v * d * d;
    in.state = c.init ? rng.vec(ns, -1, 1) : std::vector<float>(ns, 0.0f);
    return in;
}

Tensors delta_serial(const DeltaIn& in) {
    std::vector<float> out(in.v.size()), state = in.state;
    alloy::ref::gdn_delta_serial(in.shape, in.n_seqs(), in.offs.data(), in.q.data(), in.k.data(),
                                 in.v.data(), in.g.data(), in.beta.data(), state.data(), out.data());
    return {{"out", std::move(out)}, {"state", std::move(state)}};
}

Tensors delta_chunked(const DeltaIn& in, int chunk, alloy::ref::TriInverse inverse) {
    std::vector<float> out(in.v.size()), state = in.state;
    alloy::ref::gdn_delta_chunked(in.shape, in.n_seqs(), in.offs.data(), in.q.data(), in.k.data(),
                                  in.v.data(), in.g.data(), in.beta.data(), state.data(), out.data(),
                                  chunk, inverse);
    return {{"out", std::move(out)}, {"state", std::move(state)}};
}

// The reference's own chunked variants stop at T = 511 (tests/kernels/test_gdn.cpp covers them
// too): at T = 4096 they cost most of the grid's time, so that corner runs the fast variants.
constexpr int kRefMaxT = 511;

// kernels/cpu/gdn.h: serial (chunk 0) or chunked.
Tensors delta_cpu(const DeltaIn& in, int chunk) {
    std::vector<float> out(in.v.size()), state = in.state;
    if (chunk == 0)
        alloy::cpu::gdn_delta_serial(in.shape, in.n_seqs(), in.offs.data(), in.q.data(), in.k.data(), in.v.data(),
                                     in.g.data(), in.beta.data(), state.data(), out.data());
    else
        alloy::cpu::gdn_delta_chunked(in.shape, in.n_seqs(), in.offs.data(), in.q.data(), in.k.data(), in.v.data(),
                                      in.g.data(), in.beta.data(), state.data(), out.data(), chunk);
    return {{"out", std::move(out)}, {"state", std::move(state)}};
}

const std::vector<Variant<DeltaIn>>& delta_variants() {
    using alloy::ref::TriInverse;
    static const std::vector<Variant<DeltaIn>> v = {
        {"chunked64", [](const DeltaIn& in) { return delta_chunked(in, 64, TriInverse::Substitution); }, kRefMaxT},
        {"chunked16", [](const DeltaIn& in) { return delta_chunked(in, 16, TriInverse::Substitution); }, kRefMaxT},
        {"chunked64sq", [](const DeltaIn& in) { return delta_chunked(in, 64, TriInverse::Squaring); }, kRefMaxT},
        {"cpu-serial", [](const DeltaIn& in) { return delta_cpu(in, 0); }},
        {"cpu-chunked64", [](const DeltaIn& in) { return delta_cpu(in, 64); }},
        {"cpu-chunked16", [](const DeltaIn& in) { return delta_cpu(in, 16); }},
    };
    return v;
}

// ---------------------------------------------------------------------------------------
// GDN_FUSED: the whole layer op between the projections and out_proj (conv1d with state,
// norms, gates, delta rule, gated RMSNorm). Random projections and weights in the ranges of
// trained checkpoints; conv kernel 4.

struct FusedIn {
    alloy::ref::GdnParams p;
    std::vector<int32_t> offs;
    std::vector<float> qkv, z, a, b;                // [T, conv_dim], [T, H_v*d_v], [T, H_v] x2
    std::vector<float> conv1d, ssm_a, dt_bias, norm;  // [conv_dim, K], [H_v] x2, [d_v]
    std::vector<float> conv_state, state;           // [n, conv_dim, K-1], [n, H_v, d_v, d_k]
    int n_seqs() const { return (int)offs.size() - 1; }
};

FusedIn make_fused_in(const GdnCase& c, uint32_t seed) {
    Rng rng(seed);
    FusedIn in;
    in.p.shape = gdn_shape(c);
    in.p.conv_kernel = 4;
    in.offs = gdn_offsets(c);
    const std::size_t T = in.offs.back(), H_v = c.H_v, d = kHeadDim, K = in.p.conv_kernel;
    const std::size_t conv_dim = 2 * in.p.shape.H_k * d + H_v * d, n = in.n_seqs();
    in.qkv = rng.vec(T * conv_dim, -1, 1);
    in.z = rng.vec(T * H_v * d, -2, 2);
    in.a = rng.vec(T * H_v, -3, 3);
    in.b = rng.vec(T * H_v, -3, 3);
    in.conv1d = rng.vec(conv_dim * K, -0.6f, 0.6f);
    in.ssm_a = rng.vec(H_v, -2, 1);
    for (auto& e : in.ssm_a) e = -std::exp(e);  // -exp(A_log)
    in.dt_bias = rng.vec(H_v, -1, 1);
    in.norm = rng.vec(d, 0.5f, 1.5f);
    in.conv_state = c.init ? rng.vec(n * conv_dim * (K - 1), -1, 1) : std::vector<float>(n * conv_dim * (K - 1), 0.0f);
    in.state = c.init ? rng.vec(n * H_v * d * d, -1, 1) : std::vector<float>(n * H_v * d * d, 0.0f);
    return in;
}

Tensors fused_run(const FusedIn& in, alloy::ref::GdnMode mode, int chunk, bool cpu = false) {
    alloy::ref::GdnParams p = in.p;
    p.mode = mode;
    p.chunk_size = chunk;
    const alloy::ref::GdnWeights w{in.conv1d.data(), in.ssm_a.data(), in.dt_bias.data(), in.norm.data()};
    std::vector<float> y(in.z.size()), conv_state = in.conv_state, state = in.state;
    if (cpu)
        alloy::cpu::gdn_fused(p, w, in.n_seqs(), in.offs.data(), in.qkv.data(), in.z.data(), in.a.data(),
                              in.b.data(), conv_state.data(), state.data(), y.data());
    else
        alloy::ref::gdn_fused(p, w, in.n_seqs(), in.offs.data(), in.qkv.data(), in.z.data(), in.a.data(),
                              in.b.data(), conv_state.data(), state.data(), y.data());
    return {{"y", std::move(y)}, {"conv_state", std::move(conv_state)}, {"state", std::move(state)}};
}

const std::vector<Variant<FusedIn>>& fused_variants() {
    using alloy::ref::GdnMode;
    static const std::vector<Variant<FusedIn>> v = {
        {"chunked64", [](const FusedIn& in) { return fused_run(in, GdnMode::Chunked, 64); }, kRefMaxT},
        {"cpu-serial", [](const FusedIn& in) { return fused_run(in, GdnMode::Serial, 1, true); }},
        {"cpu-chunked64", [](const FusedIn& in) { return fused_run(in, GdnMode::Chunked, 64, true); }},
    };
    return v;
}

#if ALLOY_CUDA
// kernels/cuda's GDN ops: serial in fp32 (ref's contract, the rounding of another summation
// order) and chunked with bf16 tensor-core products (~4e-3 relative: NMSE ~2e-5; 1e-4 allowed).
constexpr double kCudaChunkedNmse = 1e-4;
Tensors delta_cuda(const DeltaIn& in, int chunk) {
    std::vector<float> out(in.v.size()), state = in.state;
    cuda_ops::gdn_delta(in.shape, in.offs, in.q, in.k, in.v, in.g, in.beta, state, out, chunk);
    return {{"out", std::move(out)}, {"state", std::move(state)}};
}
Tensors fused_cuda(const FusedIn& in, alloy::ref::GdnMode mode) {
    alloy::ref::GdnParams p = in.p;
    p.mode = mode;
    p.chunk_size = mode == alloy::ref::GdnMode::Chunked ? 64 : 1;
    std::vector<float> y(in.z.size()), conv_state = in.conv_state, state = in.state;
    cuda_ops::gdn_fused(p, in.conv1d, in.ssm_a, in.dt_bias, in.norm, in.offs, in.qkv, in.z, in.a, in.b, conv_state,
                        state, y);
    return {{"y", std::move(y)}, {"conv_state", std::move(conv_state)}, {"state", std::move(state)}};
}
const std::vector<Variant<DeltaIn>>& cuda_delta_variants() {
    static const std::vector<Variant<DeltaIn>> v = {
        {"cuda-serial", [](const DeltaIn& in) { return delta_cuda(in, 0); }},
        {"cuda-chunked64", [](const DeltaIn& in) { return delta_cuda(in, 64); }, 1 << 30, kCudaChunkedNmse},
    };
    return v;
}
const std::vector<Variant<FusedIn>>& cuda_fused_variants() {
    using alloy::ref::GdnMode;
    static const std::vector<Variant<FusedIn>> v = {
        {"cuda-serial", [](const FusedIn& in) { return fused_cuda(in, GdnMode::Serial); }},
        {"cuda-chunked64", [](const FusedIn& in) { return fused_cuda(in, GdnMode::Chunked); }, 1 << 30,
         kCudaChunkedNmse},
    };
    return v;
}
#endif

// ---------------------------------------------------------------------------------------
// Comparison and driver.

constexpr double kMaxNmseF32 = 1e-7;  // test-backend-ops' default for fp32 ops

// Worst NMSE over the named outputs; NaN when any value is not finite or shapes differ.
double max_nmse(const Tensors& got, const Tensors& ref, std::string& worst) {
    double max_err = 0.0;
    if (got.size() != ref.size()) return NAN;
    for (std::size_t t = 0; t < got.size(); ++t) {
        const auto& a = got[t].second;
        const auto& b = ref[t].second;
        if (a.size() != b.size()) return NAN;
        double num = 0.0, den = 0.0;
        for (std::size_t i = 0; i < a.size(); ++i) {
            if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
                worst = got[t].first;
                return NAN;
            }
            const double d = (double)a[i] - (double)b[i];
            num += d * d;
            den += (double)b[i] * b[i];
        }
        const double e = den > 0.0 ? num / den : num;
        if (e >= max_err) {
            max_err = e;
            worst = got[t].first;
        }
    }
    return max_err;
}

struct Tally {
    int run = 0, passed = 0;
};

// Scores one variant (NaN or an NMSE above `limit` fails), tallies it and prints
// "<name>: OK|FAIL nmse=... [ms]".
void report_case(const std::string& name, const Tensors& got, const Tensors& want, double limit, double ms,
                 Tally& tally) {
    std::string worst;
    const double nmse = max_nmse(got, want, worst);
    const bool ok = std::isfinite(nmse) && nmse <= limit;
    ++tally.run;
    tally.passed += ok ? 1 : 0;
    std::printf("%s: %s nmse=%.1e", name.c_str(), ok ? "OK" : "FAIL", nmse);
    if (!ok) std::printf(" (%s, max %.0e)", worst.c_str(), limit);
    std::printf("  [%.2f ms]\n", ms);
    std::fflush(stdout);
}

// Runs the reference once per case and every variant against it.
template <class In>
void run_op(const char* op, const std::vector<GdnCase>& cases, In (*make)(const GdnCase&, uint32_t),
            const std::function<Tensors(const In&)>& reference, const std::vector<Variant<In>>& variants,
            Tally& tally) {
    uint32_t seed = 1;
    for (const GdnCase& c : cases) {
        const In in = make(c, seed++);
        const Tensors want = reference(in);
        for (const auto& var : variants) {
            if (c.T > var.max_T) continue;
            const auto t0 = std::chrono::steady_clock::now();
            const Tensors got = var.run(in);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            report_case(std::string(op) + "(variant=" + var.name + "," + gdn_label(c) + ")", got, want, var.limit, ms,
                        tally);
        }
    }
}

struct Options {
    std::string op;  // empty: all ops
    bool quick = false;
    bool full = false;
    std::string backend = "cpu";  // cpu: kernels/cpu on every ISA path; cuda: kernels/cuda
};

// The grid: H_v in {16, 32, 48} x r in {1, 2} x T x seqs in {1, 3} x init in {0, 1}.
// T = 4096 is sampled unless --full: only seqs = 1 and H_v in {16, 48} (see the header line).
// --quick keeps T <= 65 and H_v = 16.
std::vector<GdnCase> gdn_cases(const Options& o) {
    std::vector<GdnCase> cases;
    const std::vector<int> Hs = o.quick ? std::vector<int>{16} : std::vector<int>{16, 32, 48};
    const std::vector<int> Ts = o.quick ? std::vector<int>{1, 7, 8, 63, 64, 65}
                                        : std::vector<int>{1, 7, 8, 63, 64, 65, 511, 4096};
    for (int T : Ts)
        for (int H_v : Hs)
            for (int r : {1, 2})
                for (int n_seqs : {1, 3})
                    for (bool init : {false, true}) {
                        if (T == 4096 && !o.full && (n_seqs != 1 || H_v == 32)) continue;
                        cases.push_back({H_v, r, T, n_seqs, init});
                    }
    return cases;
}

// ---------------------------------------------------------------------------------------
// ATTENTION and the small fused ops (kernels/cpu vs kernels/ref), one variant per ISA path
// this CPU has (cpu-avx2 runs the portable code of every op but ATTENTION). Inputs: q, k, v ~ N(0, 1) (scores ~ N(0, 1) as after q/k RMSNorm); the
// elementwise ops take ranges like a trained model's activations. ATTENTION runs on f32, f16
// and bf16 KV caches (type_k/type_v); both sides read the same cache bytes, so a 16-bit case
// checks the kernel, not the rounding.

std::vector<std::pair<const char*, cpu::Isa>> cpu_isas() {
    std::vector<std::pair<const char*, cpu::Isa>> v{{"cpu-scalar", cpu::Isa::Scalar}};
    if (cpu::active_isa() >= cpu::Isa::Avx2) v.push_back({"cpu-avx2", cpu::Isa::Avx2});
    if (cpu::active_isa() >= cpu::Isa::Avx512) v.push_back({"cpu-avx512", cpu::Isa::Avx512});
    return v;
}

// What a kernel op's cases run against the reference: kernels/cpu on each ISA path this CPU
// has, or (--backend cuda) kernels/cuda.
struct Target {
    const char* name;
    cpu::Isa isa;
    Impl impl;
};
std::vector<Target> targets(const Options& o) {
    if (o.backend == "cuda") return {{"cuda", cpu::Isa::Scalar, Impl::Cuda}};
    std::vector<Target> v;
    for (auto [name, isa] : cpu_isas()) v.push_back({name, isa, Impl::Cpu});
    return v;
}

struct AttnCase {
    int n_head, n_head_kv, hd;
    int64_t T, n_past;
    GgmlType type_k = GgmlType::F32, type_v = GgmlType::F32;
};

struct AttnIn {
    AttnCase c;
    std::vector<float> q;        // [T, n_head, hd]
    std::vector<uint8_t> k, v;   // [n_past + T, n_kv, hd] of type_k / type_v
};

AttnIn make_attn_in(const AttnCase& c, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    AttnIn in{c, {}, {}, {}};
    in.q.resize(size_t(c.T * c.n_head * c.hd));
    for (auto& e : in.q) e = nd(gen);
    const int64_t n = (c.n_past + c.T) * c.n_head_kv * c.hd;
    std::vector<float> x(static_cast<size_t>(n));
    for (auto [cache, type] : {std::pair{&in.k, c.type_k}, std::pair{&in.v, c.type_v}}) {
        for (auto& e : x) e = nd(gen);
        cache->resize(size_t(n) * alloy::ref::kv_elem_bytes(type));
        alloy::ref::kv_store(x.data(), cache->data(), type, n);
    }
    return in;
}

alloy::ref::AttentionShape attn_shape(const AttnCase& c) {
    return {c.n_head, c.n_head_kv, c.hd, 1.0f / std::sqrt(float(c.hd)), c.type_k, c.type_v};
}

// The bf16-products prefill path of bf16 caches rounds q and the probabilities to bf16
// (kernels/cpu/attention.h): nmse up to 1e-4 there (row errors ~1e-3 to 6e-3). CUDA's prefill
// on 16-bit caches rounds them to the cache's type for its tensor cores likewise.
double attn_threshold(const AttnCase& c, const Target& t) {
#if ALLOY_CUDA
    if (t.impl == Impl::Cuda) return cuda_ops::attention_nmse_limit(attn_shape(c), c.T);
#endif
    return cpu::attention_uses_bf16_products(attn_shape(c), c.T, t.isa) ? 1e-4 : kMaxNmseF32;
}

Tensors attn_run(const AttnIn& in, cpu::Isa isa, Impl impl) {
    const alloy::ref::AttentionShape s = attn_shape(in.c);
    std::vector<float> out(in.q.size(), NAN);
    if (impl == Impl::Ref) alloy::ref::attention(s, in.q.data(), in.k.data(), in.v.data(), out.data(), in.c.T, in.c.n_past);
    else if (impl == Impl::Cuda) ALLOY_CUDA_OP(attention(s, in.q.data(), in.k, in.v, out.data(), in.c.T, in.c.n_past));
    else cpu::attention(s, in.q.data(), in.k.data(), in.v.data(), out.data(), in.c.T, in.c.n_past, isa);
    return {{"out", std::move(out)}};
}

std::string attn_label(const AttnCase& c) {
    return "heads=" + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + ",hd=" + std::to_string(c.hd) +
           ",T=" + std::to_string(c.T) + ",n_past=" + std::to_string(c.n_past) + ",type_k=" +
           type_traits(c.type_k).name + ",type_v=" + type_traits(c.type_v).name;
}

// Prefill (T > 1) and decode (T = 1) shapes of Qwen3.5 (8/2, 16/4, 24/4, hd 256) and odd ones,
// each on an f32 and an f16 cache (the default), plus mixed K/V types.
std::vector<AttnCase> attn_cases(const Options& o) {
    std::vector<AttnCase> shapes{{8, 2, 256, 1, 37}, {8, 2, 256, 1, 1000}, {16, 4, 256, 1, 300}, {24, 4, 256, 1, 129},
                                 {8, 2, 256, 7, 300}, {8, 2, 256, 64, 0},  {8, 2, 256, 65, 37},  {6, 3, 64, 63, 1},
                                 {4, 4, 64, 200, 300}, {6, 3, 80, 9, 50}};
    if (!o.quick) {
        shapes.push_back({8, 2, 256, 1, 4096});
        shapes.push_back({8, 2, 256, 512, 0});
        shapes.push_back({16, 4, 256, 129, 1000});
    }
    if (o.backend == "cuda")  // cuda::attention takes head_dim 64, 128 or 256
        shapes.erase(std::remove_if(shapes.begin(), shapes.end(),
                                    [](const AttnCase& c) { return c.hd != 64 && c.hd != 128 && c.hd != 256; }),
                     shapes.end());
    std::vector<AttnCase> v;
    for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
        for (AttnCase c : shapes) {
            c.type_k = c.type_v = t;
            v.push_back(c);
        }
    v.push_back({8, 2, 256, 1, 1000, GgmlType::F16, GgmlType::F32});
    v.push_back({8, 2, 256, 65, 37, GgmlType::F32, GgmlType::F16});
    v.push_back({8, 2, 256, 65, 37, GgmlType::BF16, GgmlType::F16});
    return v;
}


// Elementwise and row ops share one case type: rows x n (n = row length; rows = 1 for flat ops).
struct SmallCase { int64_t rows, n; };

struct SmallIn {
    SmallCase c;
    std::vector<float> a, b, w;  // [rows, n] x2, [n]
    std::vector<int32_t> pos;    // ROPE: [rows] positions (rows = tokens, n = heads * 256)
};

SmallIn make_small_in(const SmallCase& c, uint32_t seed) {
    Rng rng(seed);
    SmallIn in{c, rng.vec(size_t(c.rows * c.n), -6, 6), rng.vec(size_t(c.rows * c.n), -3, 3),
               rng.vec(size_t(c.n), 0.5f, 1.5f), {}};
    for (int64_t t = 0; t < c.rows; ++t) in.pos.push_back(int32_t(rng.gen() % 100000));
    return in;
}

std::string small_label(const SmallCase& c) { return "rows=" + std::to_string(c.rows) + ",n=" + std::to_string(c.n); }

// KV_STORE: fp32 rows -> f16 cache rows (round to nearest even), compared as the fp32 values
// of the stored halves (the kernel is bit-exact: nmse 0; tests/kernels checks the bits).
Tensors kv_store_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> x = in.a;  // scaled to cover f16's normal and subnormal range
    for (size_t i = 0; i < x.size(); ++i) x[i] *= i % 3 == 0 ? 1e-5f : i % 3 == 1 ? 1.0f : 5000.0f;
    std::vector<uint16_t> h(x.size());
    if (impl == Impl::Ref) alloy::ref::kv_store(x.data(), h.data(), GgmlType::F16, int64_t(x.size()));
    else if (impl == Impl::Cuda) ALLOY_CUDA_OP(kv_store(x.data(), h.data(), GgmlType::F16, int64_t(x.size())));
    else cpu::kv_store(x.data(), h.data(), GgmlType::F16, int64_t(x.size()), isa);
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = fp16_to_fp32(h[i]);
    return {{"cache", std::move(out)}};
}

constexpr int kRopeHeadDim = 256, kRopeRot = 64;  // Qwen3.5: partial RoPE on 64 of 256 dims

Tensors rms_norm_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> out(in.a.size(), NAN);
    if (impl == Impl::Ref) alloy::ref::rms_norm(in.a.data(), in.w.data(), out.data(), in.c.rows, in.c.n, 1e-6f);
    else if (impl == Impl::Cuda) ALLOY_CUDA_OP(rms_norm(in.a.data(), in.w.data(), out.data(), in.c.rows, in.c.n, 1e-6f));
    else cpu::rms_norm(in.a.data(), in.w.data(), out.data(), in.c.rows, in.c.n, 1e-6f, isa);
    return {{"out", std::move(out)}};
}

Tensors rope_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> x = in.a;  // [T, n / 256, 256]
    const int heads = int(in.c.n / kRopeHeadDim);
    if (impl == Impl::Ref) alloy::ref::rope_partial(x.data(), in.pos.data(), in.c.rows, heads, kRopeHeadDim, kRopeRot, 1e7f);
    else if (impl == Impl::Cuda)
        ALLOY_CUDA_OP(rope_partial(x.data(), in.pos.data(), in.c.rows, heads, kRopeHeadDim, kRopeRot, 1e7f));
    else cpu::rope_partial(cpu::rope_table(in.pos.data(), in.c.rows, kRopeRot, 1e7f), x.data(), heads, kRopeHeadDim, isa);
    return {{"x", std::move(x)}};
}

Tensors swiglu_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> out(in.a.size(), NAN);
    if (impl == Impl::Ref) alloy::ref::swiglu(in.a.data(), in.b.data(), out.data(), int64_t(in.a.size()));
    else if (impl == Impl::Cuda) ALLOY_CUDA_OP(swiglu(in.a.data(), in.b.data(), out.data(), int64_t(in.a.size())));
    else cpu::swiglu(in.a.data(), in.b.data(), out.data(), int64_t(in.a.size()), isa);
    return {{"out", std::move(out)}};
}

Tensors gate_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> x = in.b;
    if (impl == Impl::Ref) alloy::ref::sigmoid_gate_mul(x.data(), in.a.data(), int64_t(x.size()));
    else if (impl == Impl::Cuda) ALLOY_CUDA_OP(sigmoid_gate_mul(x.data(), in.a.data(), 1, int64_t(x.size()), 0));
    else cpu::sigmoid_gate_mul(x.data(), in.a.data(), int64_t(x.size()), isa);
    return {{"x", std::move(x)}};
}

// rows = (token, head) pairs, n = head_dim; the gate rows read 2 * head_dim apart, as the
// model reads them in place in the interleaved q/gate projection.
Tensors gate_strided_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> x = in.b, g(in.a.size() * 2);
    for (int64_t r = 0; r < in.c.rows; ++r)
        std::copy(in.a.begin() + r * in.c.n, in.a.begin() + (r + 1) * in.c.n, g.begin() + (2 * r + 1) * in.c.n);
    if (impl == Impl::Ref) alloy::ref::sigmoid_gate_mul(x.data(), g.data() + in.c.n, in.c.rows, in.c.n, 2 * in.c.n);
    else if (impl == Impl::Cuda)
        ALLOY_CUDA_OP(sigmoid_gate_mul(x.data(), g.data() + in.c.n, in.c.rows, in.c.n, 2 * in.c.n));
    else cpu::sigmoid_gate_mul(x.data(), g.data() + in.c.n, in.c.rows, in.c.n, 2 * in.c.n, isa);
    return {{"x", std::move(x)}};
}

// x += y, then the norm of x: both outputs compared.
Tensors add_rms_norm_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> x = in.a, out(in.a.size(), NAN);
    if (impl == Impl::Ref) alloy::ref::add_rms_norm(x.data(), in.b.data(), in.w.data(), out.data(), in.c.rows, in.c.n, 1e-6f);
    else if (impl == Impl::Cuda)
        ALLOY_CUDA_OP(add_rms_norm(x.data(), in.b.data(), in.w.data(), out.data(), in.c.rows, in.c.n, 1e-6f));
    else cpu::add_rms_norm(x.data(), in.b.data(), in.w.data(), out.data(), in.c.rows, in.c.n, 1e-6f, isa);
    return {{"x", std::move(x)}, {"out", std::move(out)}};
}

// rows = tokens, n = heads * 256: the q path (heads read from [query | gate] pairs) and the
// k path (in place).
Tensors rms_norm_rope_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    const int heads = int(in.c.n / kRopeHeadDim);
    std::vector<float> qg(in.a.size() * 2), q(in.a.size(), NAN), k = in.b;
    for (int64_t r = 0; r < in.c.rows * heads; ++r)
        std::copy(in.a.begin() + r * kRopeHeadDim, in.a.begin() + (r + 1) * kRopeHeadDim, qg.begin() + 2 * r * kRopeHeadDim);
    const float* w = in.w.data();  // the first 256 of the row weights
    if (impl == Impl::Ref) {
        alloy::ref::rms_norm_rope(qg.data(), 2 * kRopeHeadDim, w, q.data(), in.pos.data(), in.c.rows, heads,
                                  kRopeHeadDim, kRopeRot, 1e7f, 1e-6f);
        alloy::ref::rms_norm_rope(k.data(), kRopeHeadDim, w, k.data(), in.pos.data(), in.c.rows, heads, kRopeHeadDim,
                                  kRopeRot, 1e7f, 1e-6f);
    } else if (impl == Impl::Cuda) {
        ALLOY_CUDA_OP(rms_norm_rope(qg.data(), 2 * kRopeHeadDim, w, q.data(), in.pos.data(), in.c.rows, heads,
                                    kRopeHeadDim, kRopeRot, 1e7f, 1e-6f));
        ALLOY_CUDA_OP(rms_norm_rope(k.data(), kRopeHeadDim, w, k.data(), in.pos.data(), in.c.rows, heads, kRopeHeadDim,
                                    kRopeRot, 1e7f, 1e-6f));
    } else {
        const cpu::RopeTable tab = cpu::rope_table(in.pos.data(), in.c.rows, kRopeRot, 1e7f);
        cpu::rms_norm_rope(tab, qg.data(), 2 * kRopeHeadDim, w, q.data(), heads, kRopeHeadDim, 1e-6f, isa);
        cpu::rms_norm_rope(tab, k.data(), kRopeHeadDim, w, k.data(), heads, kRopeHeadDim, 1e-6f, isa);
    }
    return {{"q", std::move(q)}, {"k", std::move(k)}};
}

Tensors add_run(const SmallIn& in, cpu::Isa isa, Impl impl) {
    std::vector<float> x = in.a;
    if (impl == Impl::Ref) alloy::ref::add(x.data(), in.b.data(), int64_t(x.size()));
    else if (impl == Impl::Cuda) ALLOY_CUDA_OP(add(x.data(), in.b.data(), int64_t(x.size())));
    else cpu::add(x.data(), in.b.data(), int64_t(x.size()), isa);
    return {{"x", std::move(x)}};
}

// Runs the reference once per case and every variant against it (run_op for any case type).
// max_nmse: the op's threshold for a case on an ISA path (nullptr: kMaxNmseF32 everywhere).
template <class In, class Case>
void run_kernel_op(const Options& o, const char* op, const std::vector<Case>& cases, In (*make)(const Case&, uint32_t),
                   std::string (*label)(const Case&), Tensors (*run)(const In&, cpu::Isa, Impl), Tally& tally,
                   double (*threshold)(const Case&, const Target&) = nullptr) {
    uint32_t seed = 1000;
    for (const Case& c : cases) {
        const In in = make(c, seed++);
        const Tensors want = run(in, cpu::Isa::Scalar, Impl::Ref);
        for (const Target& t : targets(o)) {
            const auto t0 = std::chrono::steady_clock::now();
            const Tensors got = run(in, t.isa, t.impl);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            report_case(std::string(op) + "(variant=" + t.name + "," + label(c) + ")", got, want,
                        threshold ? threshold(c, t) : kMaxNmseF32, ms, tally);
        }
    }
}

const std::vector<std::string> kKernelOps{"ATTENTION",        "KV_STORE", "RMS_NORM",     "ADD_RMS_NORM",
                                          "ROPE",             "RMS_NORM_ROPE", "SWIGLU", "SIGMOID_GATE_MUL",
                                          "ADD"};

void run_kernel_ops(const Options& o, Tally& tally) {
    auto want = [&](const char* op) { return o.op.empty() || o.op == op; };
    if (want("ATTENTION"))
        run_kernel_op<AttnIn, AttnCase>(o, "ATTENTION", attn_cases(o), make_attn_in, attn_label, attn_run, tally,
                                        attn_threshold);
    const int64_t Tbig = o.quick ? 65 : 512;  // prefill-sized rows
    if (want("KV_STORE"))  // one decode row, an odd tail, a prefill piece (n = n_kv * hd = 512)
        run_kernel_op<SmallIn, SmallCase>(o, "KV_STORE", {{1, 512}, {1, 1031}, {Tbig, 512}}, make_small_in, small_label,
                                          kv_store_run, tally);
    if (want("RMS_NORM"))  // hidden rows (D = 1024) and per-head q/k norms (256)
        run_kernel_op<SmallIn, SmallCase>(o, "RMS_NORM", {{1, 1024}, {7, 1000}, {Tbig * 8, 256}, {Tbig, 1024}},
                                          make_small_in, small_label, rms_norm_run, tally);
    if (want("ADD_RMS_NORM"))  // the residual stream: D = 1024
        run_kernel_op<SmallIn, SmallCase>(o, "ADD_RMS_NORM", {{1, 1024}, {7, 1000}, {Tbig, 1024}}, make_small_in,
                                          small_label, add_rms_norm_run, tally);
    if (want("ROPE"))  // rows = tokens, n = heads * 256
        run_kernel_op<SmallIn, SmallCase>(o, "ROPE", {{1, 8 * 256}, {7, 2 * 256}, {Tbig, 8 * 256}}, make_small_in,
                                          small_label, rope_run, tally);
    if (want("RMS_NORM_ROPE"))  // rows = tokens, n = heads * 256
        run_kernel_op<SmallIn, SmallCase>(o, "RMS_NORM_ROPE", {{1, 8 * 256}, {7, 2 * 256}, {Tbig, 8 * 256}},
                                          make_small_in, small_label, rms_norm_rope_run, tally);
    if (want("SWIGLU"))
        run_kernel_op<SmallIn, SmallCase>(o, "SWIGLU", {{1, 3584}, {7, 3584}, {Tbig, 3584}}, make_small_in, small_label,
                                          swiglu_run, tally);
    if (want("SIGMOID_GATE_MUL"))
        run_kernel_op<SmallIn, SmallCase>(o, "SIGMOID_GATE_MUL", {{1, 2048}, {7, 2051}, {Tbig, 2048}}, make_small_in,
                                          small_label, gate_run, tally);
    if (want("SIGMOID_GATE_MUL"))  // strided gate rows: rows = tokens * heads, n = head_dim
        run_kernel_op<SmallIn, SmallCase>(o, "SIGMOID_GATE_MUL", {{8, 256}, {7, 83}, {Tbig * 8, 256}}, make_small_in,
                                          small_label, gate_strided_run, tally);
    if (want("ADD"))
        run_kernel_op<SmallIn, SmallCase>(o, "ADD", {{1, 1024}, {7, 1027}, {Tbig, 1024}}, make_small_in, small_label,
                                          add_run, tally);
}

// ---------------------------------------------------------------------------------------
// MATMUL: cpu::matmul on every ISA path this CPU has (the kernel path taken, row-dot or GEMM
// tile, shows in the variant name) against ref::matmul fed the effective input, i.e. the
// activations as the kernel consumes them (Q8_0-quantized or bf16-rounded, see
// kernels/cpu/matmul.h); what remains is the kernel's fp32 summation. Weights N(0, 1)
// quantized to the type, or random quant bytes with sane scales for the types we only read.

struct MatmulCase { GgmlType type; int64_t n_in, n_out, T; };

struct MatmulIn {
    MatmulCase c;
    std::vector<uint8_t> w;  // [n_out] rows of the type
    std::vector<float> x;    // [T, n_in]
    WeightView view() const { return {c.type, c.n_in, c.n_out, w.data(), row_bytes(c.type, c.n_in)}; }
};

MatmulIn make_matmul_in(const MatmulCase& c, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    MatmulIn in{c, std::vector<uint8_t>(row_bytes(c.type, c.n_in) * size_t(c.n_out)), {}};
    if (c.type != GgmlType::F32 && c.type != GgmlType::F16 && c.type != GgmlType::BF16 && c.type != GgmlType::Q8_0) {
        for (auto& b : in.w) b = uint8_t(gen());
        const size_t blk = type_traits(c.type).block_bytes;
        for (size_t off = 0; off < in.w.size(); off += blk) {
            const uint16_t d = fp32_to_fp16(0.01f * float(1 + gen() % 7));
            std::memcpy(&in.w[c.type == GgmlType::Q6_K ? off + blk - 2 : off], &d, 2);
            if (c.type == GgmlType::Q4_K || c.type == GgmlType::Q5_K || c.type == GgmlType::Q5_1) {
                std::memcpy(&in.w[off + 2], &d, 2);  // dmin / Q5_1's min
            }
            if (c.type == GgmlType::MXFP4) in.w[off] = uint8_t(120 + gen() % 8);  // e8m0: scales 2^-8 .. 2^-1
        }
    } else {
        std::vector<float> row(static_cast<size_t>(c.n_in));
        const size_t rb = row_bytes(c.type, c.n_in);
        for (int64_t r = 0; r < c.n_out; ++r) {
            for (auto& e : row) e = nd(gen);
            quantize_row(c.type, row.data(), in.w.data() + size_t(r) * rb, c.n_in);
        }
    }
    in.x.resize(size_t(c.T * c.n_in));
    for (auto& e : in.x) e = nd(gen);
    return in;
}

std::vector<MatmulCase> matmul_cases(const Options& o) {
    std::vector<MatmulCase> v;
    const GgmlType types[] = {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32,  GgmlType::F16,
                              GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                              GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::MXFP4};
    const std::vector<int64_t> Ts = o.quick ? std::vector<int64_t>{1, 5, 64} : std::vector<int64_t>{1, 3, 17, 129};
    for (GgmlType t : types) {
        const bool k_quant = type_traits(t).block_elems == 256;
        for (int64_t T : Ts) {
            v.push_back({t, 1024, 67, T});  // Qwen3.5 hidden size, odd row count
            v.push_back({t, k_quant ? 4096 + 256 : 4096 + 32, 19, T});
        }
    }
    return v;
}

// MATMUL_SWIGLU (swiglu = true): cpu::matmul_swiglu with a second weight of the case's type as
// `up`, against ref::matmul of both on the effective input and ref::swiglu.
void run_matmul_op(const Options& o, Tally& tally, bool swiglu) {
    const char* op = swiglu ? "MATMUL_SWIGLU" : "MATMUL";
    cpu::MatmulScratch scratch;
    uint32_t seed = 2000;
    for (const MatmulCase& c : matmul_cases(o)) {
        const MatmulIn in = make_matmul_in(c, seed++);
        const MatmulIn up = swiglu ? make_matmul_in(c, seed + 7777) : MatmulIn{};  // MATMUL_SWIGLU only
        const WeightView W = in.view(), U = up.view();
        std::vector<float> xe(in.x.size()), want(size_t(c.T * c.n_out));
        cpu::matmul_effective_input(c.type, in.x.data(), xe.data(), c.T, c.n_in);
        alloy::ref::matmul(W, xe.data(), want.data(), c.T);
        if (swiglu) {
            std::vector<float> want_up(want.size());
            alloy::ref::matmul(U, xe.data(), want_up.data(), c.T);
            alloy::ref::swiglu(want.data(), want_up.data(), want.data(), c.T * c.n_out);
        }
        const Tensors ref{{"y", want}};
        const std::string label = std::string("type=") + type_traits(c.type).name + ",n_in=" + std::to_string(c.n_in) +
                                  ",n_out=" + std::to_string(c.n_out) + ",T=" + std::to_string(c.T);
#if ALLOY_CUDA
        if (o.backend == "cuda") {  // the types cuda::matmul runs (it throws for the others)
            if (swiglu || !cuda_ops::matmul_supported(c.type)) continue;
            std::vector<float> y(want.size(), NAN), want_cuda(want.size());
            // The GEMVs take x in fp32 (Q8_0: quantized as the CPU's effective input, ties
            // aside); cuBLAS paths round x to bf16: compared with ref on the fp32 x, coarser.
            const bool quantized = cuda_ops::matmul_quantizes_x(c.type, c.T);
            alloy::ref::matmul(W, quantized ? xe.data() : in.x.data(), want_cuda.data(), c.T);
            const auto t0 = std::chrono::steady_clock::now();
            cuda_ops::matmul(W, in.x.data(), y.data(), c.T);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            report_case(std::string(op) + "(variant=cuda:" + cuda_ops::matmul_path(c.type, c.n_in, c.T) + "," + label +
                            ")",
                        {{"y", std::move(y)}}, {{"y", want_cuda}}, cuda_ops::matmul_nmse_limit(c.type, c.n_in, c.T),
                        ms, tally);
            continue;
        }
#endif
        for (auto [name, isa] : cpu_isas()) {
            std::vector<float> y(want.size(), NAN), u(want.size(), NAN);
            const auto t0 = std::chrono::steady_clock::now();
            if (swiglu) cpu::matmul_swiglu(W, U, in.x.data(), y.data(), u.data(), c.T, isa, scratch);
            else cpu::matmul(W, in.x.data(), y.data(), c.T, isa, scratch);
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            report_case(std::string(op) + "(variant=" + name + ":" + cpu::matmul_path(c.type, isa, c.n_in, c.T) + "," +
                            label + ")",
                        {{"y", std::move(y)}}, ref, kMaxNmseF32, ms, tally);
        }
    }
}

// MOE_FFN: cpu::moe_ffn against ref::moe_ffn with F32 weights (router, experts, shared
// expert: N(0, 1)), so the fp32 NMSE bound applies; the quantized-activation paths of its
// products are MATMUL's cases, and tests/kernels/test_moe.cpp runs the BF16/Q8_0 experts.
// Router logits of N(0, 1) weights and inputs are ~sqrt(D) apart, far beyond any fp32
// rounding, so both sides pick the same experts.
void run_moe_op(const Options& o, Tally& tally) {
    struct MoeCase { int64_t D, I, Is; int E, k; };
    const std::vector<MoeCase> cases = {{256, 128, 128, 8, 2}, {1024, 96, 0, 16, 4}, {200, 72, 40, 5, 5}};
    const std::vector<int64_t> Ts = o.quick ? std::vector<int64_t>{1, 5} : std::vector<int64_t>{1, 3, 5, 70};
    uint32_t seed = 3000;
    for (const MoeCase& c : cases) {
        std::vector<MatmulIn> w;  // router, gate, up, down, shexp gate, up, down, gate
        auto add = [&](int64_t n_in, int64_t n_out) {
            w.push_back(make_matmul_in({GgmlType::F32, n_in, n_out, 0}, seed++));
        };
        add(c.D, c.E);
        add(c.D, c.I * c.E);
        add(c.D, c.I * c.E);
        add(c.I, c.D * c.E);
        if (c.Is) {
            add(c.D, c.Is);
            add(c.D, c.Is);
            add(c.Is, c.D);
            add(c.D, 1);
        }
        alloy::ref::MoeWeights m;
        m.n_expert = c.E;
        m.n_used = c.k;
        m.router = w[0].view();
        m.gate = {w[1].view(), c.I, 0, c.I};
        m.up = {w[2].view(), c.I, 0, c.I};
        m.down = {w[3].view(), c.D, 0, c.D};
        if (c.Is) {
            m.shexp_gate = w[4].view();
            m.shexp_up = w[5].view();
            m.shexp_down = w[6].view();
            m.shexp_router = w[7].view();
        }
        for (int64_t T : Ts) {
            const std::vector<float> x = make_matmul_in({GgmlType::F32, c.D, 1, T}, seed++).x;
            std::vector<float> want(x.size());
            alloy::ref::moe_ffn(m, x.data(), want.data(), T);
            const Tensors ref{{"y", want}};
            const std::string label = "D=" + std::to_string(c.D) + ",I=" + std::to_string(c.I) + ",I_shared=" +
                                      std::to_string(c.Is) + ",E=" + std::to_string(c.E) + ",k=" + std::to_string(c.k) +
                                      ",T=" + std::to_string(T);
            for (auto [name, isa] : cpu_isas()) {
                std::vector<float> y(want.size(), NAN);
                const auto t0 = std::chrono::steady_clock::now();
                cpu::moe_ffn(m, x.data(), y.data(), T, isa);
                const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
                report_case(std::string("MOE_FFN(variant=") + name + ",type=f32," + label + ")", {{"y", std::move(y)}},
                            ref, kMaxNmseF32, ms, tally);
            }
        }
    }
}

void run_test_ops(const Options& o) {
    std::vector<std::string> ops{"GDN_DELTA", "GDN_FUSED"};
    ops.insert(ops.end(), kKernelOps.begin(), kKernelOps.end());
    ops.push_back("MATMUL");
    ops.push_back("MATMUL_SWIGLU");
    ops.push_back("MOE_FFN");
    bool known = o.op.empty();
    for (const auto& name : ops) known = known || name == o.op;
    std::string names;
    for (const auto& name : ops) names += (names.empty() ? "" : ", ") + name;
    if (!known) throw Error("test-ops: unknown op '" + o.op + "' for -o (known: " + names + ")");

    const auto cases = gdn_cases(o);
    std::printf("test-ops: variants vs kernels/ref (GDN_DELTA: gdn_delta_serial, GDN_FUSED: gdn_fused serial);"
                " d_k=d_v=%d, tiled head map, seqs=3 means lengths {T, 0, T/2+1}, g ~ U[-20,-1e-4] on even heads"
                " and U[-1,-0.01] on odd heads; fail on NaN or nmse > %.0e\n",
                kHeadDim, kMaxNmseF32);
    if (o.quick)
        std::printf("test-ops: --quick: H_v=16 and T<=65 only\n");
    else if (!o.full)
        std::printf("test-ops: heavy corner sampled: T=4096 runs only with seqs=1 and H_v in {16,48} (--full for all)\n");
    std::printf("test-ops: the reference's own chunked variants run up to T=%d only\n", kRefMaxT);
    const bool cuda = o.backend == "cuda";
    if (cuda) {
#if ALLOY_CUDA
        if (!cuda_ops::available()) throw Error("test-ops --backend cuda: no usable CUDA device");
        std::printf("test-ops: --backend cuda on %s: kernels/cuda against kernels/ref (MATMUL: F32, BF16, Q8_0; "
                    "no CUDA MATMUL_SWIGLU or MOE_FFN yet)\n",
                    cuda_ops::device_name().c_str());
#else
        ALLOY_CUDA_OP(available());
#endif
    }
    const auto t0 = std::chrono::steady_clock::now();
    Tally tally;
    const std::vector<Variant<DeltaIn>>* delta = &delta_variants();
    const std::vector<Variant<FusedIn>>* fused = &fused_variants();
#if ALLOY_CUDA
    if (cuda) delta = &cuda_delta_variants(), fused = &cuda_fused_variants();
#endif
    if (o.op.empty() || o.op == "GDN_DELTA") run_op<DeltaIn>("GDN_DELTA", cases, make_delta_in, delta_serial, *delta, tally);
    if (o.op.empty() || o.op == "GDN_FUSED")
        run_op<FusedIn>("GDN_FUSED", cases, make_fused_in,
                        [](const FusedIn& in) { return fused_run(in, alloy::ref::GdnMode::Serial, 1); }, *fused,
                        tally);
    run_kernel_ops(o, tally);
    if (o.op.empty() || o.op == "MATMUL") run_matmul_op(o, tally, false);
    if (!cuda && (o.op.empty() || o.op == "MATMUL_SWIGLU")) run_matmul_op(o, tally, true);
    if (!cuda && (o.op.empty() || o.op == "MOE_FFN")) run_moe_op(o, tally);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%d/%d passed (%.1f s)\n", tally.passed, tally.run, s);
    std::fflush(stdout);
    if (tally.passed != tally.run)
        throw Error("test-ops: " + std::to_string(tally.run - tally.passed) + " of " +
                    std::to_string(tally.run) + " cases failed");
}

}  // namespace

void add_test_ops_command(CLI::App& app) {
    auto opts = std::make_shared<Options>();
    auto* cmd = app.add_subcommand("test-ops", "check every op variant against its reference kernel");
    cmd->add_option("-o,--op", opts->op, "run only this op (GDN_DELTA, GDN_FUSED, ATTENTION, KV_STORE, RMS_NORM, ADD_RMS_NORM, ROPE, "
                   "RMS_NORM_ROPE, SWIGLU, SIGMOID_GATE_MUL, ADD, MATMUL, MATMUL_SWIGLU, MOE_FFN)");
    cmd->add_flag("--quick", opts->quick, "small grid (H_v=16, T<=65)");
    cmd->add_flag("--full", opts->full, "do not sample the T=4096 corner of the grid");
    cmd->add_option("--backend", opts->backend, "cpu: kernels/cpu on every ISA path; cuda: kernels/cuda")
        ->check(CLI::IsMember({"cpu", "cuda"}))
        ->capture_default_str();
    cmd->callback([opts] { run_test_ops(*opts); });
}

}  // namespace alloy::cli
