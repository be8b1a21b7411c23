// cuda::gdn_fused in the chunked mode (prefill: conv + SiLU, q/k L2 norms, gates, bf16 q/k/v
// into the workspace, gdn_delta_chunked, the gated RMSNorm) against ref::gdn_fused in the
// chunked mode (fp32) on random inputs (no zeros): ragged sequences of odd lengths (1, 2, 63,
// 65, 129, 200, 777 tokens; warps of 16 tokens and chunks of 64 cut inside them), an empty
// sequence, rows outside the call, both key-head layouts, conv taps 3, 4 and 6, sequences on
// permuted slots of a larger slot cache with an unused slot. Bound (kernels/cuda/gdn.h): relative Frobenius
// error 1e-2 per sequence for y and per slot for the state, 5e-2 per token row of y; the conv
// state is exact. Also: a batch gives each sequence the bits of its call alone on its slot,
// the chunked kernel's value splits give the same bits, a captured graph replays the call's
// bits, and shapes the chunked kernel cannot take run the serial mode. Skips without a device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/quant.h"
#include "kernels/cuda/gdn.h"
#include "kernels/ref/gdn.h"
#include "tests/cuda/device_array.h"

namespace alloy {
namespace {

using test::DeviceArray;

struct Case {
    ref::GdnShape sh;
    int K = 4;
    std::vector<int32_t> offs;   // [n_seqs + 1], offs[0] may be > 0 (rows before the call)
    int n_tokens = 0;            // rows of the arrays (>= offs.back())
    std::vector<int32_t> slots;  // empty: slot s = sequence s
    int n_slots = 0;
};

struct Inputs {
    ref::GdnParams p;
    std::vector<float> qkv, z, a, b, conv_w, ssm_a, dt_bias, norm, conv_state, state;
};

int conv_dim_of(const ref::GdnShape& sh) { return 2 * sh.H_k * sh.d_k + sh.H_v * sh.d_v; }

Inputs make_inputs(const Case& c, uint32_t seed, ref::GdnMode mode = ref::GdnMode::Chunked, int chunk = 64) {
    const ref::GdnShape& sh = c.sh;
    Inputs in;
    in.p.shape = sh;
    in.p.conv_kernel = c.K;
    in.p.mode = mode;
    in.p.chunk_size = chunk;
    const int conv_dim = conv_dim_of(sh), T = c.n_tokens;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    auto fill = [&](std::vector<float>& x, size_t n, float mean, float sd) {
        x.resize(n);
        for (auto& e : x) e = mean + sd * nd(rng);
    };
    fill(in.qkv, size_t(T) * conv_dim, 0, 1);
    fill(in.z, size_t(T) * sh.H_v * sh.d_v, 0, 1);
    fill(in.a, size_t(T) * sh.H_v, 0, 1);
    fill(in.b, size_t(T) * sh.H_v, 0, 1);
    fill(in.conv_w, size_t(conv_dim) * c.K, 0, 0.5f);
    in.ssm_a.resize(size_t(sh.H_v));
    for (auto& e : in.ssm_a) e = -(0.5f + 8.0f * u(rng));
    fill(in.dt_bias, size_t(sh.H_v), -2.0f, 1.0f);
    fill(in.norm, size_t(sh.d_v), 1.0f, 0.1f);
    fill(in.conv_state, size_t(c.n_slots) * conv_dim * (c.K - 1), 0, 1);
    fill(in.state, size_t(c.n_slots) * sh.H_v * sh.d_v * sh.d_k, 0, 0.3f);
    return in;
}

struct Outputs {
    std::vector<float> y, conv_state, state;
};

Outputs run_ref(const Case& c, const Inputs& in) {
    Outputs o{std::vector<float>(in.z.size(), NAN), in.conv_state, in.state};
    const ref::GdnWeights w{in.conv_w.data(), in.ssm_a.data(), in.dt_bias.data(), in.norm.data()};
    ref::gdn_fused(in.p, w, int(c.offs.size()) - 1, c.offs.data(), in.qkv.data(), in.z.data(), in.a.data(), in.b.data(),
                   o.conv_state.data(), o.state.data(), o.y.data(), c.slots.empty() ? nullptr : c.slots.data());
    return o;
}

// The device arrays of one case's inputs (weights included) and its outputs, y poisoned.
struct DeviceCase {
    DeviceArray<float> qkv, z, a, b, cw, sa, dt, norm, cs, st, y;
    DeviceCase(const Inputs& in)
        : qkv(in.qkv), z(in.z), a(in.a), b(in.b), cw(in.conv_w), sa(in.ssm_a), dt(in.dt_bias), norm(in.norm),
          cs(in.conv_state), st(in.state), y(std::vector<float>(in.z.size(), NAN)) {}
    ref::GdnWeights w() const { return {cw.p, sa.p, dt.p, norm.p}; }
    Outputs host() const { return {y.host(), cs.host(), st.host()}; }
};

// The whole call on the device (sequences on their slots).
Outputs run_cuda(const Case& c, const Inputs& in, void* stream = nullptr) {
    DeviceCase d(in);
    const int n_seqs = int(c.offs.size()) - 1;
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_fused_workspace_bytes(in.p, n_seqs, c.n_tokens), 0xA5));
    DeviceArray<int32_t> offs(c.offs), slots(c.slots.empty() ? std::vector<int32_t>{0} : c.slots);
    cuda::gdn_fused(in.p, d.w(), n_seqs, offs.p, c.n_tokens, d.qkv.p, d.z.p, d.a.p, d.b.p, d.cs.p, d.st.p, d.y.p, ws.p,
                    stream, cuda::GdnFusedPath::Auto, c.slots.empty() ? nullptr : slots.p);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return d.host();
}

// ||a - b|| / ||b|| over [begin, end); infinite if a is not finite there.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b, size_t begin, size_t end) {
    double num = 0, den = 0;
    for (size_t i = begin; i < end; ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::string describe(const Case& c) {
    std::string s = "H_k " + std::to_string(c.sh.H_k) + " H_v " + std::to_string(c.sh.H_v) +
                    (c.sh.tiled ? " tiled" : " grouped") + " K " + std::to_string(c.K) + " lengths";
    for (size_t i = 0; i + 1 < c.offs.size(); ++i) s += " " + std::to_string(c.offs[i + 1] - c.offs[i]);
    return s;
}

std::vector<Case> chunked_cases() {
    std::vector<Case> cases;
    // 9B heads: 777, 1 and 200 tokens on slots 2, 0, 3 of 4 (slot 1 unused); 2 rows before
    // and 3 after the call.
    cases.push_back({{16, 32, 128, 128, true}, 4, {2, 779, 780, 980}, 983, {2, 0, 3}, 4});
    // Grouped heads, 3 value heads per key head: 63, (empty), 65 and 2 (< K - 1: the old conv
    // state shifts) tokens on slots 1, 3, 4, 0 of 5 (slot 2 unused).
    cases.push_back({{4, 12, 128, 128, false}, 4, {0, 63, 63, 128, 130}, 130, {1, 3, 4, 0}, 5});
    // 27B heads, K = 3: 129 and 64 tokens (a chunk exactly, a chunk + 1 + 64), identity slots.
    cases.push_back({{16, 48, 128, 128, false}, 3, {0, 129, 193}, 193, {}, 2});
    // 0.8B heads, one token.
    cases.push_back({{16, 16, 128, 128, true}, 4, {0, 1}, 1, {}, 1});
    // K = 6 (the 8-tap kernel variant): 40 tokens, then 3 (< K - 1) starting inside a warp's 16.
    cases.push_back({{2, 4, 128, 128, true}, 6, {0, 40, 43}, 43, {1, 0}, 2});
    return cases;
}

TEST(CudaGdnFusedChunked, MatchesReference) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    uint32_t seed = 900;
    for (const Case& c : chunked_cases()) {
        const Inputs in = make_inputs(c, seed++);
        const Outputs want = run_ref(c, in), got = run_cuda(c, in);
        const std::string what = describe(c);
        const ref::GdnShape& sh = c.sh;
        const size_t row = size_t(sh.H_v) * sh.d_v;
        // Rows outside the call are not written.
        for (int t = 0; t < c.n_tokens; ++t) {
            if (t >= c.offs.front() && t < c.offs.back()) continue;
            for (size_t j = 0; j < row; ++j) {
                ASSERT_TRUE(std::isnan(got.y[size_t(t) * row + j])) << what << " row " << t;
            }
        }
        double worst_seq = 0, worst_tok = 0, worst_state = 0;
        for (size_t s = 0; s + 1 < c.offs.size(); ++s) {
            if (c.offs[s + 1] == c.offs[s]) continue;
            const double e = rel_l2(got.y, want.y, size_t(c.offs[s]) * row, size_t(c.offs[s + 1]) * row);
            EXPECT_LE(e, 1e-2) << what << " (y of sequence " << s << ")";
            worst_seq = std::max(worst_seq, e);
            for (int t = c.offs[s]; t < c.offs[s + 1]; ++t) {
                const double et = rel_l2(got.y, want.y, size_t(t) * row, size_t(t + 1) * row);
                EXPECT_LE(et, 5e-2) << what << " (y of token " << t << ")";
                worst_tok = std::max(worst_tok, et);
            }
        }
        EXPECT_EQ(0, std::memcmp(got.conv_state.data(), want.conv_state.data(), want.conv_state.size() * 4))
            << what << " (conv state: copies of inputs)";
        const size_t st_n = size_t(sh.H_v) * sh.d_v * sh.d_k;
        for (int slot = 0; slot < c.n_slots; ++slot) {
            const bool used = c.slots.empty() || std::find(c.slots.begin(), c.slots.end(), slot) != c.slots.end();
            if (!used) {
                EXPECT_EQ(0, std::memcmp(got.state.data() + slot * st_n, in.state.data() + slot * st_n, st_n * 4))
                    << what << " (unused slot " << slot << ")";
                continue;
            }
            const double e = rel_l2(got.state, want.state, slot * st_n, (slot + 1) * st_n);
            EXPECT_LE(e, 1e-2) << what << " (state of slot " << slot << ")";
            worst_state = std::max(worst_state, e);
        }
        std::printf("[ chunked ] %s: y rel %.2e (worst sequence), %.2e (worst token), state rel %.2e\n", what.c_str(),
                    worst_seq, worst_tok, worst_state);
    }
}

// Each sequence of a batch gets the bits of a call of that sequence alone on its slot (the
// slot pointers offset, no seq_slots), and the unused slot is untouched.
TEST(CudaGdnFusedChunked, BatchOnSlotsGivesEachSequenceItsBitsAlone) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const Case c{{16, 32, 128, 128, true}, 4, {0, 100, 101, 101, 238}, 238, {3, 0, 4, 1}, 5};
    const Inputs in = make_inputs(c, 950);
    const Outputs batch = run_cuda(c, in);
    DeviceCase d(in);
    const ref::GdnShape& sh = c.sh;
    const size_t cs_n = size_t(conv_dim_of(sh)) * (c.K - 1), st_n = size_t(sh.H_v) * sh.d_v * sh.d_k;
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_fused_workspace_bytes(in.p, 1, c.n_tokens)));
    for (size_t s = 0; s + 1 < c.offs.size(); ++s) {
        DeviceArray<int32_t> o1(std::vector<int32_t>{c.offs[s], c.offs[s + 1]});
        cuda::gdn_fused(in.p, d.w(), 1, o1.p, c.n_tokens, d.qkv.p, d.z.p, d.a.p, d.b.p, d.cs.p + c.slots[s] * cs_n,
                        d.st.p + c.slots[s] * st_n, d.y.p, ws.p);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Outputs alone = d.host();
    EXPECT_EQ(0, std::memcmp(batch.y.data(), alone.y.data(), batch.y.size() * 4)) << "y";
    EXPECT_EQ(0, std::memcmp(batch.conv_state.data(), alone.conv_state.data(), batch.conv_state.size() * 4)) << "conv state";
    EXPECT_EQ(0, std::memcmp(batch.state.data(), alone.state.data(), batch.state.size() * 4)) << "state";
    EXPECT_EQ(0, std::memcmp(batch.state.data() + 2 * st_n, in.state.data() + 2 * st_n, st_n * 4)) << "unused slot";
    for (int slot : c.slots)  // the slots of the non-empty sequences changed; the empty one's (4) did not
        if (slot != 4) {
            EXPECT_NE(0, std::memcmp(batch.state.data() + slot * st_n, in.state.data() + slot * st_n, st_n * 4)) << slot;
        }
    EXPECT_EQ(0, std::memcmp(batch.state.data() + 4 * st_n, in.state.data() + 4 * st_n, st_n * 4))
        << "the empty sequence's slot";
}

// A captured graph of the call replays its bits (no allocation, no host synchronization inside).
TEST(CudaGdnFusedChunked, GraphReplayGivesTheCallsBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const Case c{{16, 16, 128, 128, true}, 4, {0, 70, 75}, 75, {1, 0}, 2};
    const Inputs in = make_inputs(c, 960);
    const Outputs direct = run_cuda(c, in);
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    DeviceCase warm(in), d(in);
    const int n_seqs = 2;
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_fused_workspace_bytes(in.p, n_seqs, c.n_tokens)));
    DeviceArray<int32_t> offs(c.offs), slots(c.slots);
    auto call = [&](DeviceCase& x) {
        cuda::gdn_fused(in.p, x.w(), n_seqs, offs.p, c.n_tokens, x.qkv.p, x.z.p, x.a.p, x.b.p, x.cs.p, x.st.p, x.y.p, ws.p,
                        st, cuda::GdnFusedPath::Auto, slots.p);
    };
    call(warm);  // first call of the shape outside the capture
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    call(d);
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const Outputs first = warm.host(), replay = d.host();
    for (const Outputs* o : {&first, &replay}) {
        EXPECT_EQ(0, std::memcmp(o->y.data(), direct.y.data(), direct.y.size() * 4));
        EXPECT_EQ(0, std::memcmp(o->conv_state.data(), direct.conv_state.data(), direct.conv_state.size() * 4));
        EXPECT_EQ(0, std::memcmp(o->state.data(), direct.state.data(), direct.state.size() * 4));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
}

// d_k or d_v other than 128, or a chunk size other than 64, in the chunked mode: the serial
// mode's bits (gdn.h).
TEST(CudaGdnFusedChunked, OtherShapesRunTheSerialMode) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    struct Fallback { Case c; int chunk; };
    const std::vector<Fallback> cases = {
        {{{2, 4, 64, 64, true}, 4, {0, 37, 40}, 40, {}, 2}, 64},     // d_k, d_v 64
        {{{2, 2, 128, 96, false}, 4, {0, 20}, 20, {}, 1}, 64},       // d_v 96
        {{{4, 8, 128, 128, true}, 4, {0, 70}, 70, {}, 1}, 32},       // chunk 32
    };
    uint32_t seed = 970;
    for (const Fallback& f : cases) {
        const Outputs chunked = run_cuda(f.c, make_inputs(f.c, seed, ref::GdnMode::Chunked, f.chunk));
        const Outputs serial = run_cuda(f.c, make_inputs(f.c, seed, ref::GdnMode::Serial, f.chunk));
        ++seed;
        const std::string what = describe(f.c) + " chunk " + std::to_string(f.chunk);
        EXPECT_EQ(0, std::memcmp(chunked.y.data(), serial.y.data(), serial.y.size() * 4)) << what;
        EXPECT_EQ(0, std::memcmp(chunked.state.data(), serial.state.data(), serial.state.size() * 4)) << what;
    }
}

// `rows` random rows of 128 with L2 norm `scale`, in bf16.
std::vector<uint16_t> random_bf16_rows(std::mt19937& rng, int rows, float scale) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> x(size_t(rows) * 128);
    for (int r = 0; r < rows; ++r) {
        std::vector<float> f(128);
        double ss = 0;
        for (auto& e : f) {
            e = nd(rng);
            ss += double(e) * e;
        }
        for (int i = 0; i < 128; ++i) x[size_t(r) * 128 + i] = fp32_to_bf16(f[size_t(i)] * float(scale / std::sqrt(ss)));
    }
    return x;
}

// The chunked tests' q (rows of norm 1 / sqrt(128)), k (norm 1) and v (norm 10) for T tokens, drawn in that order.
struct QkvRows {
    std::vector<uint16_t> q, k, v;
};
QkvRows random_qkv(std::mt19937& rng, const ref::GdnShape& sh, int T) {
    QkvRows r;
    r.q = random_bf16_rows(rng, T * sh.H_k, 1.0f / std::sqrt(128.0f));
    r.k = random_bf16_rows(rng, T * sh.H_k, 1.0f);
    r.v = random_bf16_rows(rng, T * sh.H_v, 10.0f);
    return r;
}

// gdn_delta_chunked's value splits (16, 32, 64 columns per scan block) and scan kernels (one or
// two warp groups; warp rows with 1, 2, 4 or 8 warps a block; chains at 16, 32 and 64 columns, 64 run as 32) give the same bits, so the launch
// gate, which picks by H_v n_seqs, never changes a sequence's result (gdn.h). A sequence of 13 chunks turns the two-group kernel's
// hand-over barriers through several phases; an empty one is skipped.
TEST(CudaGdnFusedChunked, ValueSplitsGiveTheSameBits) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const ref::GdnShape sh{4, 8, 128, 128, false};
    const std::vector<int32_t> offs = {0, 150, 151, 300, 300, 1100};
    const int T = 1100, n_seqs = 5;
    std::mt19937 rng(980);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    const auto [q, k, v] = random_qkv(rng, sh, T);
    std::vector<float> g(size_t(T) * sh.H_v), beta(g.size()), state(size_t(n_seqs) * sh.H_v * 128 * 128);
    for (size_t i = 0; i < g.size(); ++i) g[i] = -(0.01f + u(rng)), beta[i] = 0.02f + 0.96f * u(rng);
    for (auto& e : state) e = 0.3f * nd(rng);
    DeviceArray<uint16_t> dq(q), dk(k), dv(v);
    DeviceArray<float> dg(g), db(beta);
    DeviceArray<int32_t> doffs(offs);
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_delta_chunked_workspace_bytes(sh, n_seqs, T)));
    std::vector<std::vector<uint16_t>> outs;
    std::vector<std::vector<float>> states;
    const std::pair<int, cuda::GdnScan> runs[] = {{16, cuda::GdnScan::OneGroup}, {32, cuda::GdnScan::OneGroup},
                                                  {64, cuda::GdnScan::OneGroup}, {16, cuda::GdnScan::TwoGroups},
                                                  {32, cuda::GdnScan::TwoGroups}, {16, cuda::GdnScan::WarpRows},
                                                  {32, cuda::GdnScan::WarpRows},  {64, cuda::GdnScan::WarpRows},
                                                  {128, cuda::GdnScan::WarpRows}, {16, cuda::GdnScan::TwoGroupsTma},
                                                  {32, cuda::GdnScan::TwoGroupsTma},
                                                  {16, cuda::GdnScan::TwoGroupsProducer},
                                                  {32, cuda::GdnScan::TwoGroupsProducer},
                                                  {64, cuda::GdnScan::TwoGroupsProducer},
                                                  {16, cuda::GdnScan::Chains},
                                                  {32, cuda::GdnScan::Chains},
                                                  {64, cuda::GdnScan::Chains}};
    for (const auto& [bv, scan] : runs) {
        DeviceArray<float> st(state);
        DeviceArray<uint16_t> out(std::vector<uint16_t>(v.size(), 0x7fc0));
        cuda::gdn_delta_chunked(sh, n_seqs, doffs.p, T, dq.p, dk.p, dv.p, dg.p, db.p, st.p, out.p, ws.p, nullptr, bv,
                                nullptr, scan);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        outs.push_back(out.host());
        states.push_back(st.host());
    }
    // Every row belongs to a sequence here: each was written (the NaN fill is gone).
    for (size_t i = 0; i < outs[0].size(); ++i)
        ASSERT_TRUE(std::isfinite(bf16_to_fp32(outs[0][i]))) << "out element " << i << " not written";
    for (size_t i = 1; i < outs.size(); ++i) {
        EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * 2)) << "out, split " << i;
        EXPECT_EQ(0, std::memcmp(states[0].data(), states[i].data(), states[0].size() * 4)) << "state, split " << i;
    }
}

// The segmented scan (cuda::gdn_delta_chunked_plan): heads whose gates decay slowly (the
// warmup reaches back to the sequence's start) give the unsegmented kernel's bits; heads whose
// gates decay ~0.5 a token (a segment starts from zero one chunk before it) agree with it to
// fp32 rounding. Ragged, empty and 1-token sequences, slots permuted, 2 / 3 / 7 segments, both
// two-group splits.
TEST(CudaGdnFusedChunked, SegmentsGiveTheUnsegmentedScan) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const ref::GdnShape sh{2, 4, 128, 128, false};
    const std::vector<int32_t> offs = {0, 150, 151, 300, 300, 1100};
    const std::vector<int32_t> slots = {3, 0, 4, 1, 2};
    const int T = 1100, n_seqs = 5;
    int dev = 0, sms = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
    // The workspace holds final states of sms / (4 H_v) sequences for a segmented call.
    if (sms / (4 * sh.H_v) < n_seqs) GTEST_SKIP() << sms << " SMs: too few for 5 segmented sequences of 4 heads";
    std::mt19937 rng(981);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    const auto [q, k, v] = random_qkv(rng, sh, T);
    // Value heads 0 and 2: g in [-2e-4, -1e-4) (the whole call decays by < e^-0.25); 1 and 3:
    // logsigmoid(U(0, 1)), as the benchmarks' inputs (about -0.5 a token).
    std::vector<float> g(size_t(T) * sh.H_v), beta(g.size()), state(size_t(n_seqs) * sh.H_v * 128 * 128);
    for (size_t i = 0; i < g.size(); ++i) {
        const bool slow = (i % sh.H_v) % 2 == 0;
        g[i] = slow ? -(1e-4f + 1e-4f * u(rng)) : -std::log1p(std::exp(-u(rng)));
        beta[i] = 0.02f + 0.96f * u(rng);
    }
    for (auto& e : state) e = 0.3f * nd(rng);
    DeviceArray<uint16_t> dq(q), dk(k), dv(v);
    DeviceArray<float> dg(g), db(beta);
    DeviceArray<int32_t> doffs(offs), dslots(slots);
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_delta_chunked_workspace_bytes(sh, n_seqs, T)));
    auto run = [&](int bv, int segments, std::vector<uint16_t>& o, std::vector<float>& st_out, bool chains) {
        DeviceArray<float> st(state);
        DeviceArray<uint16_t> out(std::vector<uint16_t>(v.size(), 0x7fc0));
        const cuda::GdnScan scan = chains ? cuda::GdnScan::Chains
                                   : bv == 64 ? cuda::GdnScan::TwoGroupsProducer
                                              : cuda::GdnScan::TwoGroups;
        cuda::gdn_delta_chunked(sh, n_seqs, doffs.p, T, dq.p, dk.p, dv.p, dg.p, db.p, st.p, out.p, ws.p, nullptr, bv,
                                dslots.p, scan, segments);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        o = out.host();
        st_out = st.host();
    };
    // The two-group scans, then the chain scan (GdnScan::Chains), each against its own unsegmented call.
    for (bool chains : {false, true})
    for (int bv : {16, 32, 64}) {
        std::vector<uint16_t> base_out;
        std::vector<float> base_state;
        run(bv, 1, base_out, base_state, chains);
        for (int segments : {2, 3, 7}) {
            std::vector<uint16_t> o;
            std::vector<float> st;
            run(bv, segments, o, st, chains);
            double num = 0, den = 0, snum = 0, sden = 0;
            for (size_t i = 0; i < o.size(); ++i) {
                const int h = int((i / 128) % sh.H_v);
                ASSERT_TRUE(std::isfinite(bf16_to_fp32(o[i]))) << "out element " << i << " not written";
                if (h % 2 == 0) {
                    ASSERT_EQ(o[i], base_out[i]) << "slow head " << h << ", element " << i << ", block_v " << bv
                                                 << ", segments " << segments;
                } else {
                    const double a = bf16_to_fp32(o[i]), b = bf16_to_fp32(base_out[i]);
                    num += (a - b) * (a - b), den += b * b;
                }
            }
            for (size_t i = 0; i < st.size(); ++i) {
                const int h = int((i / (128 * 128)) % sh.H_v);
                if (h % 2 == 0) {
                    ASSERT_EQ(std::memcmp(&st[i], &base_state[i], 4), 0)
                        << "slow head " << h << ", state element " << i << ", segments " << segments;
                } else {
                    snum += (double(st[i]) - base_state[i]) * (double(st[i]) - base_state[i]);
                    sden += double(base_state[i]) * base_state[i];
                }
            }
            EXPECT_LE(std::sqrt(num / den), 1e-4) << "fast heads' out, block_v " << bv << ", segments " << segments;
            EXPECT_LE(std::sqrt(snum / sden), 1e-4) << "fast heads' state, block_v " << bv << ", segments " << segments;
            std::printf("[%s, segments %d, block_v %d] fast heads vs unsegmented: out %.2e state %.2e\n",
                        chains ? "chains" : "two groups", segments, bv, std::sqrt(num / den), std::sqrt(snum / sden));
        }
    }
}

// The gate's own plan at 48 value heads, one sequence (2 segments of a 32-column split on 132
// SMs, the producer-warp scan): slow heads give the unsegmented call's bits (the unsegmented
// gate's split: 64 columns, or 32 with ALLOY_GDN_SPLIT64_PAIR=0), fast heads agree with it to
// fp32 rounding, as for the forced segments above.
TEST(CudaGdnFusedChunked, GateSegmentsAtFortyEightHeadsGiveTheUnsegmentedScan) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const ref::GdnShape sh{16, 48, 128, 128, true};
    const int T = 16384;  // at 4096 the gate runs one unsegmented wave of 64-column blocks
    int dev = 0, sms = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
    const cuda::GdnChunkedPlan plan = cuda::gdn_delta_chunked_plan(sh.H_v, 1, T, sms);
    if (plan.segments < 2) GTEST_SKIP() << sms << " SMs: the gate does not segment 48 heads here";
    std::mt19937 rng(4848);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    const std::vector<uint16_t> q = random_bf16_rows(rng, T * sh.H_k, 1.0f / std::sqrt(128.0f)),
                                k = random_bf16_rows(rng, T * sh.H_k, 1.0f), v = random_bf16_rows(rng, T * sh.H_v, 10.0f);
    std::vector<float> g(size_t(T) * sh.H_v), beta(g.size()), state(size_t(sh.H_v) * 128 * 128);
    for (size_t i = 0; i < g.size(); ++i) {
        const bool slow = (i % sh.H_v) % 2 == 0;
        g[i] = slow ? -(1e-4f + 1e-4f * u(rng)) : -std::log1p(std::exp(-u(rng)));
        beta[i] = 0.02f + 0.96f * u(rng);
    }
    for (auto& e : state) e = 0.3f * nd(rng);
    const std::vector<int32_t> offs = {0, T};
    DeviceArray<uint16_t> dq(q), dk(k), dv(v);
    DeviceArray<float> dg(g), db(beta);
    DeviceArray<int32_t> doffs(offs);
    DeviceArray<uint8_t> ws(std::vector<uint8_t>(cuda::gdn_delta_chunked_workspace_bytes(sh, 1, T)));
    auto run = [&](int segments, std::vector<uint16_t>& o, std::vector<float>& st_out) {
        DeviceArray<float> st(state);
        DeviceArray<uint16_t> out(std::vector<uint16_t>(v.size(), 0x7fc0));
        cuda::gdn_delta_chunked(sh, 1, doffs.p, T, dq.p, dk.p, dv.p, dg.p, db.p, st.p, out.p, ws.p, nullptr, 0, nullptr,
                                cuda::GdnScan::Auto, segments);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        o = out.host();
        st_out = st.host();
    };
    std::vector<uint16_t> base_out, o;
    std::vector<float> base_state, st;
    run(1, base_out, base_state);  // the gate's unsegmented split
    run(0, o, st);                 // the gate's plan
    double num = 0, den = 0, snum = 0, sden = 0;
    for (size_t i = 0; i < o.size(); ++i) {
        const int h = int((i / 128) % sh.H_v);
        ASSERT_TRUE(std::isfinite(bf16_to_fp32(o[i]))) << "out element " << i << " not written";
        if (h % 2 == 0) {
            ASSERT_EQ(o[i], base_out[i]) << "slow head " << h << ", element " << i;
        } else {
            const double a = bf16_to_fp32(o[i]), b = bf16_to_fp32(base_out[i]);
            num += (a - b) * (a - b), den += b * b;
        }
    }
    for (size_t i = 0; i < st.size(); ++i) {
        const int h = int(i / (128 * 128));
        if (h % 2 == 0) {
            ASSERT_EQ(std::memcmp(&st[i], &base_state[i], 4), 0) << "slow head " << h << ", state element " << i;
        } else {
            snum += (double(st[i]) - base_state[i]) * (double(st[i]) - base_state[i]);
            sden += double(base_state[i]) * base_state[i];
        }
    }
    EXPECT_LE(std::sqrt(num / den), 1e-4) << "fast heads' out";
    EXPECT_LE(std::sqrt(snum / sden), 1e-4) << "fast heads' state";
    std::printf("[gate: block_v %d x %d segments] fast heads vs unsegmented: out %.2e state %.2e\n", plan.block_v,
                plan.segments, std::sqrt(num / den), std::sqrt(snum / sden));
}

// The plan segments where a 32-column split fills the SMs unevenly (no device needed); the
// 64-column split (the two-group scan by default, warp rows with ALLOY_GDN_SPLIT64_PAIR=0) is
// the unsegmented pick at 48 heads only where it runs the two-group scan.
TEST(CudaGdnFusedChunked, PlanSegmentsOnlyWhereBlocksAreFew) {
    if (std::getenv("ALLOY_GDN_SEGMENTS")) GTEST_SKIP() << "ALLOY_GDN_SEGMENTS forces the plan";
    const char* e = std::getenv("ALLOY_GDN_SPLIT64_PAIR");
    const bool pair64 = !e || std::atoi(e) != 0;
    const auto p16 = cuda::gdn_delta_chunked_plan(16, 1, 4096, 132);
    EXPECT_EQ(p16.block_v, 32);
    EXPECT_EQ(p16.segments, 2);
    const auto p8 = cuda::gdn_delta_chunked_plan(8, 1, 4096, 132);
    EXPECT_EQ(p8.block_v, 32);
    EXPECT_EQ(p8.segments, 4);
    const auto p32 = cuda::gdn_delta_chunked_plan(32, 1, 65536, 132);  // 128 blocks: one wave already
    EXPECT_EQ(p32.segments, 1);
    EXPECT_EQ(p32.block_v, cuda::gdn_delta_chunked_block_v(32, 132));
    // 192 blocks of 32 columns take two waves of whole chains; 2 segments, three waves of halves.
    const auto p48 = cuda::gdn_delta_chunked_plan(48, 1, 65536, 132);
    EXPECT_EQ(p48.block_v, 32);
    EXPECT_EQ(p48.segments, 2);
    // Too short to segment: one wave of 96 two-group blocks of 64 columns, or two of 32.
    const auto p48s = cuda::gdn_delta_chunked_plan(48, 1, 2048, 132);
    EXPECT_EQ(p48s.block_v, pair64 ? 64 : 32);
    EXPECT_EQ(p48s.segments, 1);
    EXPECT_EQ(cuda::gdn_delta_chunked_plan(16, 2, 8192, 132).segments, 1);  // 2 sequences fill the SMs
    EXPECT_EQ(cuda::gdn_delta_chunked_plan(16, 1, 2048, 132).segments, 1);  // 32 chunks: not worth it
}

}  // namespace
}  // namespace alloy
