// GPU time of cuda::gdn_delta_serial and of the fused op cuda::gdn_fused at decode (T = 1 per
// sequence) on the shapes of
// shared/anchors/gpu-h200.md: H_k = 16, H_v in {16, 32, 48}, d = 128, B in {1, 2, 4, 8, 32}; the
// fused op for the launch gate's path and for each of its two paths. Each
// figure is the mean over 200 launches replayed from one CUDA graph (as the anchor timed fla
// and ggml), with the floor = the fp32 state read and written once at the device's
// theoretical memory bandwidth (as the anchor states it: 4.2 TB/s unless --bw is given).
// Prefill (--prefill, or both tables with no mode flag): cuda::gdn_delta_chunked, bf16 q/k/v/out,
// B = 1, H_k = 16, d = 128, H_v in {16, 32, 48}, T in {512, 4096, 16384, 65536}, median over
// replays of a CUDA graph of several launches rotating over input sets (as many as fit in
// ~256 MB, up to 8, so that L2 does not serve the repeats), for the launch gate's choice and
// for each value split and scan kernel (one warp group, two, wgmma); floor = max(181,589 FLOP per token and head / 679 TFLOP/s, minimal
// bf16 bytes / 4234 GB/s) as shared/anchors/gpu-h200.md derives it.
// Fused prefill (--fused-prefill, or with no mode flag): cuda::gdn_fused in the chunked mode
// (conv + SiLU, norms, gates, bf16 rounding, gdn_delta_chunked, gated RMSNorm) at B = 1,
// H_k = 16, d = 128, H_v in {16, 32, 48}, T in {512, 4096, 16384}, against the serial mode
// (the launch gate's path) at T 512 and 4096; fp32 qkv/z/a/b/y, K = 4; median over replays of
// a CUDA graph rotating over input sets as above; floor = max(the delta rule's FLOP floor
// above, the fp32 qkv, z, a, b read + y written + state read and written / 4234 GB/s).
//   gdn_cuda_bench [--bw TB/s] [--decode | --prefill | --fused-prefill] [--tmax T] [--hv H_v] [--t T]
//                  [--b B] [--reps N] [--slow-gates] [--gate-only (prefill: the gate's kernel alone)]
//                  [--bv B [--segments P] (prefill: the gate's column at that split)]
//                  [--hash (prefill: FNV-1a of one call's output and final state, for A/B builds' bits)]
//   gdn_cuda_bench --check DIR   (outputs of transformers' recurrent rule written by
//                                 scripts/gdn_gpu_peer.py: run the kernel on the same inputs
//                                 and compare; exits 1 above 1e-4)
//   gdn_cuda_bench --check-chunked DIR (fla's and transformers' chunked outputs written by
//                                 scripts/gdn_fla_peer.py: run cuda::gdn_delta_chunked on the
//                                 same bf16 inputs, the gate's kernel and the wgmma one;
//                                 errors against both; exits 1 above 1e-2)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <algorithm>
#include <random>
#include <vector>

#include "format/quant.h"
#include "kernels/cuda/gdn.h"

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                     \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

#ifdef ALLOY_GDN_EXP_CLOCK
namespace alloy::cuda {
void gdn_chunked_debug_clocks(unsigned long long* out);
void gdn_stage1_debug_clocks(unsigned long long* out);
void gdn_fused_debug_clocks(unsigned long long* out);
}  // namespace alloy::cuda
#endif

namespace {

std::vector<float> read_f32(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary | std::ios::ate);
    if (!in) {
        std::fprintf(stderr, "cannot read %s\n", p.c_str());
        std::exit(1);
    }
    std::vector<float> v(size_t(in.tellg()) / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
    return v;
}

float* upload(const std::vector<float>& h) {
    float* d = nullptr;
    CHECK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * 4));
    CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0, scale = 0;
    for (float x : b) scale = std::max(scale, double(std::fabs(x)));
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    return a.size() == b.size() && scale > 0 ? worst / scale : INFINITY;
}

// The case directories (each with a meta.txt) under `dir`, sorted; says so when there are none.
std::vector<std::filesystem::path> case_dirs(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> cases;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (std::filesystem::exists(e.path() / "meta.txt")) cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    if (cases.empty()) std::fprintf(stderr, "no cases (meta.txt) under %s\n", dir.c_str());
    return cases;
}

// Every case directory of `dir`: the kernel on transformers' inputs against its outputs.
int check(const std::filesystem::path& dir) {
    const std::vector<std::filesystem::path> cases = case_dirs(dir);
    if (cases.empty()) return 1;
    std::printf("| case (B, T, H, d) | out max rel | state max rel |\n| --- | ---: | ---: |\n");
    bool ok = true;
    for (const auto& c : cases) {
        int B = 0, T = 0, H = 0, d = 0;
        std::ifstream(c / "meta.txt") >> B >> T >> H >> d;
        const alloy::ref::GdnShape sh{H, H, d, d, true};
        std::vector<int32_t> offs(size_t(B) + 1);
        for (int s = 0; s <= B; ++s) offs[size_t(s)] = s * T;
        int32_t* doffs = nullptr;
        CHECK(cudaMalloc(&doffs, offs.size() * 4));
        CHECK(cudaMemcpy(doffs, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
        const std::vector<float> want_out = read_f32(c / "out.bin"), want_state = read_f32(c / "state1.bin");
        float *q = upload(read_f32(c / "q.bin")), *k = upload(read_f32(c / "k.bin")), *v = upload(read_f32(c / "v.bin")),
              *g = upload(read_f32(c / "g.bin")), *beta = upload(read_f32(c / "beta.bin")),
              *st = upload(read_f32(c / "state0.bin")), *out = upload(std::vector<float>(want_out.size(), NAN));
        alloy::cuda::gdn_delta_serial(sh, B, doffs, q, k, v, g, beta, st, out);
        CHECK(cudaDeviceSynchronize());
        std::vector<float> got_out(want_out.size()), got_state(want_state.size());
        CHECK(cudaMemcpy(got_out.data(), out, got_out.size() * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(got_state.data(), st, got_state.size() * 4, cudaMemcpyDeviceToHost));
        const double eo = max_rel(got_out, want_out), es = max_rel(got_state, want_state);
        ok = ok && eo <= 1e-4 && es <= 1e-4;
        std::printf("| %d, %d, %d, %d | %.1e | %.1e |\n", B, T, H, d, eo, es);
        for (void* p : {(void*)q, (void*)k, (void*)v, (void*)g, (void*)beta, (void*)st, (void*)out, (void*)doffs}) cudaFree(p);
    }
    std::printf("%s\n", ok ? "all within 1e-4 of transformers" : "FAILED: above 1e-4");
    return ok ? 0 : 1;
}


// ---- prefill: cuda::gdn_delta_chunked ----

// bf16 on the host: the project's round-to-nearest-even conversions (format/quant.h).
uint16_t bf16_bits(float x) { return alloy::fp32_to_bf16(x); }
float bf16_float(uint16_t b) { return alloy::bf16_to_fp32(b); }

template <class T>
T* to_device(const std::vector<T>& h) {
    T* d = nullptr;
    CHECK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// Median us per launch of `launch(i)` (i = launch index in the graph): a graph of `reps`
// launches, one warm replay, then 7 timed replays.
template <class F>
double graph_median_us(cudaStream_t st, int reps, F launch) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    for (int i = 0; i < reps; ++i) launch(i);  // warm, outside the graph (cudaFuncSetAttribute etc.)
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < reps; ++i) launch(i);
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, st));
    CHECK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> ms(7);
    for (auto& m : ms) {
        CHECK(cudaEventRecord(e0, st));
        CHECK(cudaGraphLaunch(exec, st));
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaEventElapsedTime(&m, e0, e1));
    }
    std::sort(ms.begin(), ms.end());
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return double(ms[3]) * 1e3 / reps;
}

// slow_gates: g in [-2e-4, -1e-4) (a state remembered over the whole call: the segmented
// scan's warmup reaches back to the start) instead of logsigmoid(U(0, 1)).
void prefill_table(int sms, int tmax, int only_hv, int only_t, bool slow_gates, bool gate_only, int force_bv, int force_seg,
                   bool hash) {
    std::printf("\nprefill, cuda::gdn_delta_chunked (bf16 q/k/v/out, fp32 g/beta/state), B = 1, H_k = 16, d = 128, g %s\n\n"
                "| H_v | T | floor us | gate's block_v x segments | us (gate) | us gate unsegmented | us block_v 16 | us block_v 32 | us block_v 64 | "
                "us two groups 16 | us two groups 32 | us wgmma 16 | us wgmma 32 | us wgmma 64 | us warp rows 16 | "
                "us warp rows 32 | us warp rows 64 | us warp rows 128 | us transition 16 | us transition 32 | us two groups tma 16 | us two groups tma 32 | %% of floor | Mtok/s | input sets |\n"
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
                slow_gates ? "in [-2e-4, -1e-4)" : "= logsigmoid(U(0, 1))");
    const int d = 128, H_k = 16;
    // A pool of random values, copied at varying offsets into the inputs (generating 10^9
    // normals on the host would take longer than the whole benchmark).
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> pool(size_t(1) << 22);
    for (auto& x : pool) x = bf16_bits(nd(rng));
    std::vector<uint16_t> pool_qk(pool.size());
    for (size_t i = 0; i < pool.size(); ++i) pool_qk[i] = bf16_bits(bf16_float(pool[i]) / std::sqrt(float(d)));
    auto fill = [&](std::vector<uint16_t>& x, const std::vector<uint16_t>& src, size_t seed) {
        for (size_t i = 0; i < x.size();) {
            const size_t off = (seed * 7919 + i * 31) % (src.size() / 2), n = std::min(x.size() - i, src.size() / 2);
            std::memcpy(x.data() + i, src.data() + off, n * 2);
            i += n;
        }
    };
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    for (int H_v : {16, 32, 48})
        for (int T : {512, 4096, 16384, 65536, -1}) {
            // --t T: that length alone (any multiple of 64; a listed one runs in its place).
            if (T == -1) T = only_t == 512 || only_t == 4096 || only_t == 16384 || only_t == 65536 ? 0 : only_t;
            if (T <= 0) continue;
            if (T > tmax || (only_hv && H_v != only_hv) || (only_t && T != only_t)) continue;
            const alloy::ref::GdnShape sh{H_k, H_v, d, d, false};
            const size_t nqk = size_t(T) * H_k * d, nv = size_t(T) * H_v * d, ng = size_t(T) * H_v;
            const size_t set_bytes = (2 * nqk + nv) * 2 + ng * 8;
            const int sets = int(std::clamp<size_t>((size_t(256) << 20) / set_bytes, 1, 8));
            struct Set { uint16_t *q, *k, *v; float *g, *beta; };
            std::vector<Set> in(sets);
            for (int s = 0; s < sets; ++s) {
                std::vector<uint16_t> q(nqk), k(nqk), v(nv);
                fill(q, pool_qk, 3 * s + 1);
                fill(k, pool_qk, 3 * s + 2);
                fill(v, pool, 3 * s + 3);
                std::vector<float> g(ng), beta(ng);
                std::uniform_real_distribution<float> u(0.0f, 1.0f);
                for (size_t i = 0; i < ng; ++i) {
                    const float x = u(rng);
                    g[i] = slow_gates ? -(1e-4f + 1e-4f * x) : -std::log1p(std::exp(-x));  // logsigmoid(U(0, 1)), as the anchor's inputs
                    beta[i] = bf16_float(bf16_bits(1.0f / (1.0f + std::exp(-u(rng)))));
                }
                in[size_t(s)] = {to_device(q), to_device(k), to_device(v), to_device(g), to_device(beta)};
            }
            std::vector<float> h_state(size_t(H_v) * d * d);
            for (auto& x : h_state) x = 0.1f * nd(rng);
            float* state = to_device(h_state);
            uint16_t* out = nullptr;
            CHECK(cudaMalloc(&out, nv * 2));
            const std::vector<int32_t> h_offs = {0, T};
            int32_t* offs = to_device(h_offs);
            void* ws = nullptr;
            CHECK(cudaMalloc(&ws, std::max(alloy::cuda::gdn_delta_chunked_workspace_bytes(sh, 1, T, alloy::cuda::GdnScan::Wgmma),
                                           alloy::cuda::gdn_delta_chunked_workspace_bytes(sh, 1, T, alloy::cuda::GdnScan::Transition))));
            const int reps = std::max(sets, T <= 4096 ? 16 : 4);
            using alloy::cuda::GdnScan;
            if (hash) {  // one call from the initial state: FNV-1a of the output and the final state (A/B builds' bits)
                float* st0 = to_device(h_state);
                alloy::cuda::gdn_delta_chunked(sh, 1, offs, T, in[0].q, in[0].k, in[0].v, in[0].g, in[0].beta, st0, out, ws, st,
                                               force_bv, nullptr, GdnScan::Auto, force_seg);
                CHECK(cudaStreamSynchronize(st));
                std::vector<uint8_t> ho(nv * 2), hs(h_state.size() * 4);
                CHECK(cudaMemcpy(ho.data(), out, ho.size(), cudaMemcpyDeviceToHost));
                CHECK(cudaMemcpy(hs.data(), st0, hs.size(), cudaMemcpyDeviceToHost));
                auto fnv = [](const std::vector<uint8_t>& b) {
                    uint64_t x = 1469598103934665603ull;
                    for (uint8_t c : b) x = (x ^ c) * 1099511628211ull;
                    return x;
                };
                std::printf("hash H_v %d T %d: out %016llx state %016llx\n", H_v, T, (unsigned long long)fnv(ho),
                            (unsigned long long)fnv(hs));
                cudaFree(st0);
            }
            auto time_bv = [&](int bv, GdnScan scan, int segments = 0) {
                return graph_median_us(st, reps, [&](int i) {
                    const Set& s = in[size_t(i % sets)];
                    alloy::cuda::gdn_delta_chunked(sh, 1, offs, T, s.q, s.k, s.v, s.g, s.beta, state, out, ws, st, bv,
                                                   nullptr, scan, segments);
                });
            };
#ifdef ALLOY_GDN_EXP_CLOCK
            for (int bv : {16, 32, 64}) {  // one plain call per split: cycles per step and phase
                unsigned long long clk[32];
                alloy::cuda::gdn_chunked_debug_clocks(clk);
                alloy::cuda::gdn_delta_chunked(sh, 1, offs, T, in[0].q, in[0].k, in[0].v, in[0].g, in[0].beta, state, out, ws, st, bv);
                CHECK(cudaStreamSynchronize(st));
                alloy::cuda::gdn_chunked_debug_clocks(clk);
                // Phases 1-9 (the scan kernel's CLK / PCLK points): the one-group kernel warps 0 | 7
                // (phases 1-7), the two-group kernel (16 / 32 columns) warp 0 | 4.
                std::printf("clk H_v %d T %d bv %d, cycles/step by phase (first warp | second):", H_v, T, bv);
                for (int wv = 0; wv < 2; ++wv) {
                    for (int i = 1; i < 10; ++i) std::printf(" %.0f", double(clk[16 * wv + i]) / (T / 64));
                    std::printf(" |");
                }
                std::printf("\n");
            }
            {  // stage 1: cycles a block by phase, averaged over the blocks (warp 0 | warp 3)
                unsigned long long clk[32];
                alloy::cuda::gdn_stage1_debug_clocks(clk);
                alloy::cuda::gdn_delta_chunked(sh, 1, offs, T, in[0].q, in[0].k, in[0].v, in[0].g, in[0].beta, state, out, ws, st);
                CHECK(cudaStreamSynchronize(st));
                alloy::cuda::gdn_stage1_debug_clocks(clk);
                std::printf("s1clk H_v %d T %d, %llu blocks, cycles a block by phase 1-11 (warp 0 | warp 3):", H_v, T, clk[0]);
                for (int wv = 0; wv < 2; ++wv) {
                    for (int i = 1; i < 12; ++i) std::printf(" %.0f", double(clk[16 * wv + i]) / double(std::max(clk[16 * wv], 1ull)));
                    std::printf(" |");
                }
                std::printf("\n");
            }
#endif
            // --gate-only: the gate's pick alone (A/B runs of one kernel change); the other columns 0.
            auto time_if = [&](int bv, GdnScan scan, int segments = 0) { return gate_only ? 0.0 : time_bv(bv, scan, segments); };
            // --bv B [--segments P]: the gate's column runs that split (and segments) instead.
            const double us_auto = force_bv ? time_bv(force_bv, GdnScan::Auto, force_seg) : time_bv(0, GdnScan::Auto),
                         us_noseg = time_if(0, GdnScan::Auto, 1),
                         us16 = time_if(16, GdnScan::OneGroup),
                         us32 = time_if(32, GdnScan::OneGroup), us64 = time_if(64, GdnScan::OneGroup),
                         us16p = time_if(16, GdnScan::TwoGroups), us32p = time_if(32, GdnScan::TwoGroups),
                         us16w = time_if(16, GdnScan::Wgmma), us32w = time_if(32, GdnScan::Wgmma),
                         us64w = time_if(64, GdnScan::Wgmma), us16r = time_if(16, GdnScan::WarpRows),
                         us32r = time_if(32, GdnScan::WarpRows), us64r = time_if(64, GdnScan::WarpRows),
                         us128r = time_if(128, GdnScan::WarpRows), us16t = time_if(16, GdnScan::Transition),
                         us32t = time_if(32, GdnScan::Transition), us16b = time_if(16, GdnScan::TwoGroupsTma),
                         us32b = time_if(32, GdnScan::TwoGroupsTma);
            alloy::cuda::GdnChunkedPlan plan = alloy::cuda::gdn_delta_chunked_plan(H_v, 1, T, sms);
            if (force_bv) plan = {force_bv, std::max(force_seg, 1)};
            const double flop = 181589.0 * T * H_v;
            const double bytes = double(T) * (2.0 * H_k * d * 2 + H_v * (2.0 * d * 2 + 4 + 2)) + 2.0 * H_v * d * d * 4;
            const double floor_us = std::max(flop / 679e12, bytes / 4234e9) * 1e6;
            std::printf("| %d | %d | %.1f | %d x %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f "
                        "| %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f | %d |\n",
                        H_v, T, floor_us, plan.block_v, plan.segments, us_auto, us_noseg, us16, us32, us64, us16p, us32p,
                        us16w, us32w, us64w, us16r,
                        us32r, us64r, us128r, us16t, us32t, us16b, us32b,
                        100.0 * floor_us / us_auto, T / us_auto, sets);
            std::fflush(stdout);
            for (const Set& s : in)
                for (void* p : {(void*)s.q, (void*)s.k, (void*)s.v, (void*)s.g, (void*)s.beta}) cudaFree(p);
            for (void* p : {(void*)state, (void*)out, (void*)offs, ws}) cudaFree(p);
        }
    cudaStreamDestroy(st);
}

// scripts/gdn_fla_peer.py's cases: meta.txt "T H_k H_v d" (grouped heads, fla's layout),
// q.bin (L2-normed, * d^-1/2, bf16 values) and k.bin [T, H_k, d], v.bin [T, H_v, d], g.bin and
// beta.bin [T, H_v], state0.bin [H_v, d_v, d_k] (alloy's layout), ref_out.bin / ref_state.bin
// (an fp64 recurrence on the same values), fla_out.bin / fla_state.bin (fla, bf16).
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return a.size() == b.size() && den > 0 ? std::sqrt(num / den) : INFINITY;
}

int check_chunked(const std::filesystem::path& dir) {
    const std::vector<std::filesystem::path> cases = case_dirs(dir);
    if (cases.empty()) return 1;
    std::printf("| case (T, H_k, H_v, d) | alloy out vs fp64 | alloy state vs fp64 | fla out vs fp64 | fla state vs fp64 "
                "| alloy out vs fla |\n| --- | ---: | ---: | ---: | ---: | ---: |\n");
    bool ok = true;
    for (const auto& c : cases) {
        int T = 0, H_k = 0, H_v = 0, d = 0;
        std::ifstream(c / "meta.txt") >> T >> H_k >> H_v >> d;
        const alloy::ref::GdnShape sh{H_k, H_v, d, d, false};
        auto bf = [](const std::vector<float>& x) {
            std::vector<uint16_t> y(x.size());
            for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_bits(x[i]);
            return y;
        };
        uint16_t *q = to_device(bf(read_f32(c / "q.bin"))), *k = to_device(bf(read_f32(c / "k.bin"))),
                 *v = to_device(bf(read_f32(c / "v.bin")));
        float *g = to_device(read_f32(c / "g.bin")), *beta = to_device(read_f32(c / "beta.bin")),
              *st = to_device(read_f32(c / "state0.bin"));
        const std::vector<float> ref_out = read_f32(c / "ref_out.bin"), ref_state = read_f32(c / "ref_state.bin"),
                                 fla_out = read_f32(c / "fla_out.bin"), fla_state = read_f32(c / "fla_state.bin");
        uint16_t* out = to_device(std::vector<uint16_t>(ref_out.size(), 0x7fc0));
        int32_t* offs = to_device(std::vector<int32_t>{0, T});
        void* ws = nullptr;
        CHECK(cudaMalloc(&ws, std::max(alloy::cuda::gdn_delta_chunked_workspace_bytes(sh, 1, T, alloy::cuda::GdnScan::Wgmma),
                                       alloy::cuda::gdn_delta_chunked_workspace_bytes(sh, 1, T, alloy::cuda::GdnScan::Transition))));
        for (alloy::cuda::GdnScan scan :
             {alloy::cuda::GdnScan::Wgmma, alloy::cuda::GdnScan::Transition, alloy::cuda::GdnScan::Auto}) {
            CHECK(cudaMemcpy(st, read_f32(c / "state0.bin").data(), ref_state.size() * 4, cudaMemcpyHostToDevice));
            alloy::cuda::gdn_delta_chunked(sh, 1, offs, T, q, k, v, g, beta, st, out, ws, nullptr,
                                           scan == alloy::cuda::GdnScan::Wgmma ? 64 : 0, nullptr, scan);
            CHECK(cudaDeviceSynchronize());
            std::vector<uint16_t> ob(ref_out.size());
            std::vector<float> got_out(ob.size()), got_state(ref_state.size());
            CHECK(cudaMemcpy(ob.data(), out, ob.size() * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(got_state.data(), st, got_state.size() * 4, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < ob.size(); ++i) got_out[i] = bf16_float(ob[i]);
            const double eo = rel_l2(got_out, ref_out), es = rel_l2(got_state, ref_state);
            ok = ok && eo <= 1e-2 && es <= 1e-2;
            std::printf("| %d, %d, %d, %d%s | %.1e | %.1e | %.1e | %.1e | %.1e |\n", T, H_k, H_v, d,
                        scan == alloy::cuda::GdnScan::Wgmma        ? " (wgmma, 64)"
                        : scan == alloy::cuda::GdnScan::Transition ? " (transition)"
                                                                   : "",
                        eo, es, rel_l2(fla_out, ref_out),
                        rel_l2(fla_state, ref_state), rel_l2(got_out, fla_out));
        }
        for (void* p : {(void*)q, (void*)k, (void*)v, (void*)g, (void*)beta, (void*)st, (void*)out, (void*)offs, ws})
            cudaFree(p);
    }
    std::printf("%s\n", ok ? "alloy within 1e-2 of the fp64 recurrence" : "FAILED: above 1e-2");
    return ok ? 0 : 1;
}

void decode_table(double tbs, int only_hv, int only_b, int reps);
void prefill_table(int sms, int tmax, int only_hv, int only_t, bool slow_gates, bool gate_only, int force_bv, int force_seg,
                   bool hash);

// cuda::gdn_fused at prefill: the chunked mode at T 512 / 4096 / 16384, the serial mode at
// 512 / 4096 (B = 1, H_k 16, d 128, grouped heads, K = 4).
void fused_prefill_table(int tmax, int only_hv, int only_t) {
    std::printf("\nfused prefill, cuda::gdn_fused (fp32 qkv/z/a/b/y, K = 4), B = 1, H_k = 16, d = 128\n\n"
                "| H_v | T | floor us | chunked us | %% of floor | Mtok/s | serial us (gate's path) | serial / chunked | "
                "input sets |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const int d = 128, H_k = 16, K = 4;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> pool(size_t(1) << 22);
    for (auto& x : pool) x = nd(rng);
    auto fill = [&](std::vector<float>& x, size_t seed, float scale, float shift) {
        for (size_t i = 0; i < x.size();) {
            const size_t off = (seed * 7919 + i * 31) % (pool.size() / 2), n = std::min(x.size() - i, pool.size() / 2);
            for (size_t j = 0; j < n; ++j) x[i + j] = shift + scale * pool[off + j];
            i += n;
        }
    };
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    for (int H_v : {16, 32, 48})
        for (int T : {512, 4096, 16384}) {
            if (T > tmax || (only_hv && H_v != only_hv) || (only_t && T != only_t)) continue;
            const alloy::ref::GdnShape sh{H_k, H_v, d, d, false};
            const int conv_dim = 2 * H_k * d + H_v * d;
            const size_t nqkv = size_t(T) * conv_dim, nz = size_t(T) * H_v * d, nab = size_t(T) * H_v;
            const size_t set_bytes = (nqkv + nz + 2 * nab) * 4;
            const int sets = int(std::clamp<size_t>((size_t(256) << 20) / set_bytes, 1, 8));
            struct Set { float *qkv, *z, *a, *b; };
            std::vector<Set> in(sets);
            for (int s = 0; s < sets; ++s) {
                std::vector<float> qkv(nqkv), z(nz), a(nab), b(nab);
                fill(qkv, 4 * s + 1, 1.0f, 0.0f);
                fill(z, 4 * s + 2, 1.0f, 0.0f);
                fill(a, 4 * s + 3, 1.0f, 0.0f);
                fill(b, 4 * s + 4, 1.0f, 0.0f);
                in[size_t(s)] = {to_device(qkv), to_device(z), to_device(a), to_device(b)};
            }
            std::vector<float> cw(size_t(conv_dim) * K), sa(static_cast<size_t>(H_v)), dt(static_cast<size_t>(H_v)),
                norm(static_cast<size_t>(d)), cs(size_t(conv_dim) * (K - 1)), state(size_t(H_v) * d * d);
            fill(cw, 91, 0.5f, 0.0f);
            fill(dt, 92, 1.0f, -2.0f);
            fill(norm, 93, 0.1f, 1.0f);
            fill(cs, 94, 1.0f, 0.0f);
            fill(state, 95, 0.1f, 0.0f);
            for (int h = 0; h < H_v; ++h) sa[size_t(h)] = -(1.0f + 0.3f * float(h % 16));
            float *dcw = to_device(cw), *dsa = to_device(sa), *ddt = to_device(dt), *dnorm = to_device(norm),
                  *dcs = to_device(cs), *dstate = to_device(state), *y = nullptr;
            CHECK(cudaMalloc(&y, nz * 4));
            int32_t* offs = to_device(std::vector<int32_t>{0, T});
            const alloy::ref::GdnWeights w{dcw, dsa, ddt, dnorm};
            alloy::ref::GdnParams gp;
            gp.shape = sh;
            gp.conv_kernel = K;
            gp.mode = alloy::ref::GdnMode::Chunked;
            gp.chunk_size = 64;
            alloy::ref::GdnParams sp = gp;
            sp.mode = alloy::ref::GdnMode::Serial;
            void* ws = nullptr;
            CHECK(cudaMalloc(&ws, std::max(alloy::cuda::gdn_fused_workspace_bytes(gp, 1, T),
                                           alloy::cuda::gdn_fused_workspace_bytes(sp, 1, T))));
            auto time_mode = [&](const alloy::ref::GdnParams& p, int reps) {
                return graph_median_us(st, reps, [&](int i) {
                    const Set& s = in[size_t(i % sets)];
                    alloy::cuda::gdn_fused(p, w, 1, offs, T, s.qkv, s.z, s.a, s.b, dcs, dstate, y, ws, st);
                });
            };
            const double us_chunked = time_mode(gp, std::max(sets, T <= 4096 ? 16 : 4));
            const double us_serial = T <= 4096 ? time_mode(sp, std::max(sets, T <= 512 ? 8 : 2)) : NAN;
            const double flop = 181589.0 * T * H_v;
            const double bytes = double(set_bytes) + double(nz) * 4 + 2.0 * H_v * d * d * 4;
            const double floor_us = std::max(flop / 679e12, bytes / 4234e9) * 1e6;
            std::printf("| %d | %d | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.2fx | %d |\n", H_v, T, floor_us, us_chunked,
                        100.0 * floor_us / us_chunked, T / us_chunked, us_serial, us_serial / us_chunked, sets);
            std::fflush(stdout);
            for (const Set& s : in)
                for (void* p : {(void*)s.qkv, (void*)s.z, (void*)s.a, (void*)s.b}) cudaFree(p);
            for (void* p : {(void*)dcw, (void*)dsa, (void*)ddt, (void*)dnorm, (void*)dcs, (void*)dstate, (void*)y,
                            (void*)offs, ws})
                cudaFree(p);
        }
    cudaStreamDestroy(st);
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], "--check")) return check(argv[i + 1]);
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], "--check-chunked")) return check_chunked(argv[i + 1]);
    double tbs = 4.2;
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], "--bw")) tbs = std::atof(argv[i + 1]);
    bool decode = true, prefill = true, fused_prefill = true, slow_gates = false, gate_only = false, hash = false;
    int tmax = 65536, only_hv = 0, only_t = 0, only_b = 0, reps = 200, force_bv = 0, force_seg = 0;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--decode")) prefill = fused_prefill = false;
        if (!std::strcmp(argv[i], "--prefill")) decode = fused_prefill = false;
        if (!std::strcmp(argv[i], "--fused-prefill")) decode = prefill = false;
        if (!std::strcmp(argv[i], "--tmax") && i + 1 < argc) tmax = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--hv") && i + 1 < argc) only_hv = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--t") && i + 1 < argc) only_t = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--slow-gates")) slow_gates = true;
        if (!std::strcmp(argv[i], "--gate-only")) gate_only = true;
        if (!std::strcmp(argv[i], "--hash")) hash = true;
        if (!std::strcmp(argv[i], "--bv") && i + 1 < argc) force_bv = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--segments") && i + 1 < argc) force_seg = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--b") && i + 1 < argc) only_b = std::atoi(argv[i + 1]);
        if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[i + 1]));
    }
    // The gate's column at a given split: one the gate can pick, segments >= 0 (0: the
    // plan's); anything else is refused here rather than thrown from inside a timed graph.
    if (force_bv != 0 && force_bv != 16 && force_bv != 32 && force_bv != 64) {
        std::fprintf(stderr, "gdn_cuda_bench: --bv %d: not 16, 32 or 64 (the gate's splits)\n", force_bv);
        return 2;
    }
    if (force_seg < 0 || (force_seg > 0 && force_bv == 0)) {
        std::fprintf(stderr, "gdn_cuda_bench: --segments %d: needs --bv and a count >= 1\n", force_seg);
        return 2;
    }
    if (!alloy::cuda::device_available()) {
        std::fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs; floor at %.1f TB/s\n\n", prop.name, prop.multiProcessorCount, tbs);
    if (decode) decode_table(tbs, only_hv, only_b, reps);
    if (prefill)
        prefill_table(prop.multiProcessorCount, tmax, only_hv, only_t, slow_gates, gate_only, force_bv, force_seg, hash);
    if (fused_prefill) fused_prefill_table(tmax, only_hv, only_t);
    return 0;
}

namespace {

void decode_table(double tbs, int only_hv, int only_b, int reps) {
    std::printf("| H_v | B | floor us | delta rule us | %% of floor | fused op us (conv + norms + gates + delta + gated "
                "norm; the gate's path) | one launch us | three launches us | one launch, seq_slots us | one launch, 8 layers' "
                "states in turn us | the same, state settled us |\n"
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const int d = 128, H_k = 16;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (int H_v : {16, 32, 48})
        for (int B : {1, 2, 4, 8, 32}) {
            if ((only_hv && H_v != only_hv) || (only_b && B != only_b)) continue;
            const alloy::ref::GdnShape sh{H_k, H_v, d, d, true};
            std::vector<float> q(size_t(B) * H_k * d), k(q.size()), v(size_t(B) * H_v * d), g(size_t(B) * H_v, -0.05f),
                beta(g.size(), 0.5f), state(size_t(B) * H_v * d * d);
            for (auto* x : {&q, &k, &v, &state})
                for (auto& e : *x) e = u(rng);
            std::vector<int32_t> offs(size_t(B) + 1);
            for (int s = 0; s <= B; ++s) offs[size_t(s)] = s;
            float *dq, *dk, *dv, *dg, *db, *ds, *dout;
            int32_t* doffs;
            CHECK(cudaMalloc(&dq, q.size() * 4));
            CHECK(cudaMalloc(&dk, k.size() * 4));
            CHECK(cudaMalloc(&dv, v.size() * 4));
            CHECK(cudaMalloc(&dg, g.size() * 4));
            CHECK(cudaMalloc(&db, beta.size() * 4));
            CHECK(cudaMalloc(&ds, state.size() * 4));
            CHECK(cudaMalloc(&dout, v.size() * 4));
            CHECK(cudaMalloc(&doffs, offs.size() * 4));
            CHECK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(dk, k.data(), k.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(dv, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(dg, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(db, beta.data(), beta.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(ds, state.data(), state.size() * 4, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(doffs, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
            cudaStream_t st;
            CHECK(cudaStreamCreate(&st));
            // us per launch: the best of 5 replays of a graph of `reps` launches (one call
            // first, outside the capture: a kernel's one-off attribute calls and queries).
            auto time_us = [&](auto launch) {
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                launch();
                CHECK(cudaStreamSynchronize(st));
                CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int r = 0; r < reps; ++r) launch();
                CHECK(cudaStreamEndCapture(st, &graph));
                CHECK(cudaGraphInstantiate(&exec, graph, 0));
                CHECK(cudaGraphLaunch(exec, st));  // warm
                CHECK(cudaStreamSynchronize(st));
                cudaEvent_t e0, e1;
                CHECK(cudaEventCreate(&e0));
                CHECK(cudaEventCreate(&e1));
                float best = 1e30f;
                for (int trial = 0; trial < 5; ++trial) {
                    CHECK(cudaEventRecord(e0, st));
                    CHECK(cudaGraphLaunch(exec, st));
                    CHECK(cudaEventRecord(e1, st));
                    CHECK(cudaEventSynchronize(e1));
                    float ms = 0;
                    CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    best = std::min(best, ms);
                }
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                return double(best) * 1e3 / reps;
            };
            const double us = time_us([&] { alloy::cuda::gdn_delta_serial(sh, B, doffs, dq, dk, dv, dg, db, ds, dout, st); });
            // The fused op on the same state: qkv, z, a, b of B tokens, K = 4 conv.
            alloy::ref::GdnParams gp;
            gp.shape = sh;
            gp.mode = alloy::ref::GdnMode::Serial;
            const int conv_dim = 2 * H_k * d + H_v * d;
            std::vector<float> h_qkv(size_t(B) * conv_dim), h_cw(size_t(conv_dim) * 4), h_cs(size_t(B) * conv_dim * 3),
                h_sa(size_t(H_v), -2.0f), h_dt(size_t(H_v), -1.0f), h_norm(size_t(d), 1.0f);
            for (auto* x : {&h_qkv, &h_cw, &h_cs})
                for (auto& e : *x) e = u(rng);
            float *fq, *fz, *fa, *fb, *fcw, *fcs, *fsa, *fdt, *fn, *fy;
            void* ws;
            auto up = [&](float** p, const std::vector<float>& h) {
                CHECK(cudaMalloc(p, h.size() * 4));
                CHECK(cudaMemcpy(*p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            };
            up(&fq, h_qkv);
            up(&fz, v);
            up(&fa, g);
            up(&fb, beta);
            up(&fcw, h_cw);
            up(&fcs, h_cs);
            up(&fsa, h_sa);
            up(&fdt, h_dt);
            up(&fn, h_norm);
            CHECK(cudaMalloc(&fy, v.size() * 4));
            CHECK(cudaMalloc(&ws, alloy::cuda::gdn_fused_workspace_bytes(gp, B, B)));
            const alloy::ref::GdnWeights w{fcw, fsa, fdt, fn};
            using alloy::cuda::GdnFusedPath;
            auto fused = [&](GdnFusedPath path) {
                return time_us([&] { alloy::cuda::gdn_fused(gp, w, B, doffs, B, fq, fz, fa, fb, fcs, ds, fy, ws, st, path); });
            };
            const double fused_us = fused(GdnFusedPath::Auto), one_us = fused(GdnFusedPath::OneLaunch),
                         three_us = fused(GdnFusedPath::ThreeLaunches);
            // The one launch with a seq_slots array on the device (sequence s on slot B-1-s): the
            // slot is one more dependent load before the conv window and the state.
            std::vector<int32_t> h_slots(static_cast<size_t>(B));
            for (int s = 0; s < B; ++s) h_slots[size_t(s)] = B - 1 - s;
            int32_t* dslots;
            CHECK(cudaMalloc(&dslots, size_t(B) * 4));
            CHECK(cudaMemcpy(dslots, h_slots.data(), size_t(B) * 4, cudaMemcpyHostToDevice));
            const double slots_us = time_us([&] {
                alloy::cuda::gdn_fused(gp, w, B, doffs, B, fq, fz, fa, fb, fcs, ds, fy, ws, st, GdnFusedPath::OneLaunch, dslots);
            });
            cudaFree(dslots);
            // The one launch over 8 states and conv states in turn (a model's consecutive layers:
            // no launch reads what the one before it writes), loading them before the PDL wait
            // (state_settled, as the CUDA backend's decode graphs) or after it.
            constexpr int kLayers = 8;
            std::vector<float*> lstate(kLayers), lconv(kLayers);
            for (int l = 0; l < kLayers; ++l) {
                CHECK(cudaMalloc(&lstate[size_t(l)], state.size() * 4));
                CHECK(cudaMemcpy(lstate[size_t(l)], ds, state.size() * 4, cudaMemcpyDeviceToDevice));
                CHECK(cudaMalloc(&lconv[size_t(l)], h_cs.size() * 4));
                CHECK(cudaMemcpy(lconv[size_t(l)], fcs, h_cs.size() * 4, cudaMemcpyDeviceToDevice));
            }
            auto layers_us = [&](bool settled) {
                int next = 0;
                return time_us([&] {
                    const int l = next++ % kLayers;
                    alloy::cuda::gdn_fused(gp, w, B, doffs, B, fq, fz, fa, fb, lconv[size_t(l)], lstate[size_t(l)], fy, ws, st,
                                           GdnFusedPath::OneLaunch, nullptr, nullptr, settled);
                });
            };
            const double layers_plain_us = layers_us(false), layers_settled_us = layers_us(true);
            for (int l = 0; l < kLayers; ++l) cudaFree(lstate[size_t(l)]), cudaFree(lconv[size_t(l)]);
            const double floor_us = 2.0 * double(state.size()) * 4 / (tbs * 1e12) * 1e6;
#ifdef ALLOY_GDN_EXP_CLOCK
            {  // one-launch kernel, phase cycles of thread 0 (mean over blocks, max), and span
                unsigned long long clk[3][16];
                std::vector<double> mean(16, 0.0), mx(16, 0.0), span;
                const int calls = 20;
                alloy::cuda::gdn_fused_debug_clocks(&clk[0][0]);
                for (int r = 0; r < calls; ++r) {
                    alloy::cuda::gdn_fused(gp, w, B, doffs, B, fq, fz, fa, fb, fcs, ds, fy, ws, st, GdnFusedPath::OneLaunch);
                    CHECK(cudaStreamSynchronize(st));
                    alloy::cuda::gdn_fused_debug_clocks(&clk[0][0]);
                    for (int i = 1; i < 16; ++i) mean[size_t(i)] += double(clk[0][i]) / double(std::max(1ull, clk[2][2])), mx[size_t(i)] = std::max(mx[size_t(i)], double(clk[1][i]));
                    span.push_back(double(clk[2][1] - clk[2][0]));
                }
                std::sort(span.begin(), span.end());
                std::printf("clk H_v %d B %d: span ns median %.0f min %.0f; phase cycles (mean per block; max):", H_v, B,
                            span[span.size() / 2], span[0]);
                for (int i = 1; i < 16; ++i)
                    if (mx[size_t(i)] > 0) std::printf(" %d:%.0f/%.0f", i, mean[size_t(i)] / calls, mx[size_t(i)]);
                std::printf("\n");
            }
#endif
            std::printf("| %d | %d | %.2f | %.2f | %.0f%% | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", H_v, B, floor_us, us,
                        100 * floor_us / us, fused_us, one_us, three_us, slots_us, layers_plain_us, layers_settled_us);
            for (void* p : {(void*)fq, (void*)fz, (void*)fa, (void*)fb, (void*)fcw, (void*)fcs, (void*)fsa, (void*)fdt,
                            (void*)fn, (void*)fy, ws})
                cudaFree(p);
            for (void* p : {(void*)dq, (void*)dk, (void*)dv, (void*)dg, (void*)db, (void*)ds, (void*)dout, (void*)doffs}) cudaFree(p);
            cudaStreamDestroy(st);
        }
}

}  // namespace
