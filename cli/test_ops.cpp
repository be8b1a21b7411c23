// alloy test-ops [-o OPNAME] [--quick] [--full]: every op variant against its kernels/ref
// reference on random inputs, in the manner of llama.cpp's test-backend-ops. One line per
// (op, variant, case); a case fails on NaN/Inf or when the normalised MSE
// sum((x - ref)^2) / sum(ref^2) of any output tensor exceeds the op's threshold.
//
// To add a variant (an optimized kernel in kernels/cpu, say), append {name, function} to the
// op's variant list below; the reference, the input generator and the case grid stay as they are.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "alloy/error.h"
#include "cli/commands.h"
#include "kernels/ref/gdn.h"

namespace alloy::cli {
namespace {

using Tensors = std::vector<std::pair<const char*, std::vector<float>>>;  // named outputs

// One variant of an op: a name and a function from the op's inputs to its named outputs.
template <class In>
struct Variant {
    const char* name;
    std::function<Tensors(const In&)> run;
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

const std::vector<Variant<DeltaIn>>& delta_variants() {
    using alloy::ref::TriInverse;
    static const std::vector<Variant<DeltaIn>> v = {
        {"chunked64", [](const DeltaIn& in) { return delta_chunked(in, 64, TriInverse::Substitution); }},
        {"chunked16", [](const DeltaIn& in) { return delta_chunked(in, 16, TriInverse::Substitution); }},
        {"chunked64sq", [](const DeltaIn& in) { return delta_chunked(in, 64, TriInverse::Squaring); }},
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

Tensors fused_run(const FusedIn& in, alloy::ref::GdnMode mode, int chunk) {
    alloy::ref::GdnParams p = in.p;
    p.mode = mode;
    p.chunk_size = chunk;
    const alloy::ref::GdnWeights w{in.conv1d.data(), in.ssm_a.data(), in.dt_bias.data(), in.norm.data()};
    std::vector<float> y(in.z.size()), conv_state = in.conv_state, state = in.state;
    alloy::ref::gdn_fused(p, w, in.n_seqs(), in.offs.data(), in.qkv.data(), in.z.data(), in.a.data(),
                          in.b.data(), conv_state.data(), state.data(), y.data());
    return {{"y", std::move(y)}, {"conv_state", std::move(conv_state)}, {"state", std::move(state)}};
}

const std::vector<Variant<FusedIn>>& fused_variants() {
    using alloy::ref::GdnMode;
    static const std::vector<Variant<FusedIn>> v = {
        {"chunked64", [](const FusedIn& in) { return fused_run(in, GdnMode::Chunked, 64); }},
    };
    return v;
}

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
            const auto t0 = std::chrono::steady_clock::now();
            const Tensors got = var.run(in);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            std::string worst;
            const double nmse = max_nmse(got, want, worst);
            const bool ok = std::isfinite(nmse) && nmse <= kMaxNmseF32;
            ++tally.run;
            tally.passed += ok ? 1 : 0;
            std::printf("%s(variant=%s,%s): %s nmse=%.1e", op, var.name, gdn_label(c).c_str(),
                        ok ? "OK" : "FAIL", nmse);
            if (!ok) std::printf(" (%s, max %.0e)", worst.c_str(), kMaxNmseF32);
            std::printf("  [%.0f ms]\n", ms);
            std::fflush(stdout);
        }
    }
}

struct Options {
    std::string op;  // empty: all ops
    bool quick = false;
    bool full = false;
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

void run_test_ops(const Options& o) {
    const std::vector<std::string> ops{"GDN_DELTA", "GDN_FUSED"};
    bool known = o.op.empty();
    for (const auto& name : ops) known = known || name == o.op;
    if (!known) throw Error("test-ops: unknown op '" + o.op + "' for -o (known: GDN_DELTA, GDN_FUSED)");

    const auto cases = gdn_cases(o);
    std::printf("test-ops: variants vs kernels/ref (GDN_DELTA: gdn_delta_serial, GDN_FUSED: gdn_fused serial);"
                " d_k=d_v=%d, tiled head map, seqs=3 means lengths {T, 0, T/2+1}, g ~ U[-20,-1e-4] on even heads"
                " and U[-1,-0.01] on odd heads; fail on NaN or nmse > %.0e\n",
                kHeadDim, kMaxNmseF32);
    if (o.quick)
        std::printf("test-ops: --quick: H_v=16 and T<=65 only\n");
    else if (!o.full)
        std::printf("test-ops: heavy corner sampled: T=4096 runs only with seqs=1 and H_v in {16,48} (--full for all)\n");
    const auto t0 = std::chrono::steady_clock::now();
    Tally tally;
    if (o.op.empty() || o.op == "GDN_DELTA")
        run_op<DeltaIn>("GDN_DELTA", cases, make_delta_in, delta_serial, delta_variants(), tally);
    if (o.op.empty() || o.op == "GDN_FUSED")
        run_op<FusedIn>("GDN_FUSED", cases, make_fused_in,
                        [](const FusedIn& in) { return fused_run(in, alloy::ref::GdnMode::Serial, 1); },
                        fused_variants(), tally);
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
    cmd->add_option("-o,--op", opts->op, "run only this op (GDN_DELTA, GDN_FUSED)");
    cmd->add_flag("--quick", opts->quick, "small grid (H_v=16, T<=65)");
    cmd->add_flag("--full", opts->full, "do not sample the T=4096 corner of the grid");
    cmd->callback([opts] { run_test_ops(*opts); });
}

}  // namespace alloy::cli
