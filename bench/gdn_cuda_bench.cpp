// GPU time of cuda::gdn_delta_serial and of the fused op cuda::gdn_fused at decode (T = 1 per
// sequence) on the shapes of
// shared/anchors/gpu-h200.md: H_k = 16, H_v in {16, 32, 48}, d = 128, B in {1, 32}. Each
// figure is the mean over 200 launches replayed from one CUDA graph (as the anchor timed fla
// and ggml), with the floor = the fp32 state read and written once at the device's
// theoretical memory bandwidth (as the anchor states it: 4.2 TB/s unless --bw is given).
//   gdn_cuda_bench [--bw TB/s]
//   gdn_cuda_bench --check DIR   (outputs of transformers' recurrent rule written by
//                                 scripts/gdn_gpu_peer.py: run the kernel on the same inputs
//                                 and compare; exits 1 above 1e-4)
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

#include "kernels/cuda/gdn.h"

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                     \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

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

// Every case directory of `dir`: the kernel on transformers' inputs against its outputs.
int check(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> cases;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (std::filesystem::exists(e.path() / "meta.txt")) cases.push_back(e.path());
    std::sort(cases.begin(), cases.end());
    if (cases.empty()) {
        std::fprintf(stderr, "no cases (meta.txt) under %s\n", dir.c_str());
        return 1;
    }
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

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], "--check")) return check(argv[i + 1]);
    double tbs = 4.2;
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], "--bw")) tbs = std::atof(argv[i + 1]);
    if (!alloy::cuda::device_available()) {
        std::fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs; floor at %.1f TB/s\n\n", prop.name, prop.multiProcessorCount, tbs);
    std::printf("| H_v | B | floor us | delta rule us | %% of floor | fused op us (conv + norms + gates + delta + gated norm) |\n"
                "| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const int d = 128, H_k = 16, reps = 200;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (int H_v : {16, 32, 48})
        for (int B : {1, 32}) {
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
            // us per launch: the best of 5 replays of a graph of `reps` launches.
            auto time_us = [&](auto launch) {
                cudaGraph_t graph;
                cudaGraphExec_t exec;
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
            CHECK(cudaMalloc(&ws, alloy::cuda::gdn_fused_workspace_bytes(gp, B)));
            const alloy::ref::GdnWeights w{fcw, fsa, fdt, fn};
            const double fused_us = time_us([&] { alloy::cuda::gdn_fused(gp, w, B, doffs, B, fq, fz, fa, fb, fcs, ds, fy, ws, st); });
            const double floor_us = 2.0 * double(state.size()) * 4 / (tbs * 1e12) * 1e6;
            std::printf("| %d | %d | %.2f | %.2f | %.0f%% | %.2f |\n", H_v, B, floor_us, us, 100 * floor_us / us, fused_us);
            for (void* p : {(void*)fq, (void*)fz, (void*)fa, (void*)fb, (void*)fcw, (void*)fcs, (void*)fsa, (void*)fdt,
                            (void*)fn, (void*)fy, ws})
                cudaFree(p);
            for (void* p : {(void*)dq, (void*)dk, (void*)dv, (void*)dg, (void*)db, (void*)ds, (void*)dout, (void*)doffs}) cudaFree(p);
            cudaStreamDestroy(st);
        }
    return 0;
}
