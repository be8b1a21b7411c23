// GPU time of the non-GDN CUDA ops (kernels/cuda/ops.h) at the 0.8B model's shapes (model/
// synth.cpp's "0.8b" preset: hidden 1024, FFN 3584, vocabulary 248320, 8 query / 2 KV heads
// of 256, n_rot 64), each figure against the H200's peak: HBM 4.8 TB/s for the memory-bound
// ops (bytes = each operand read or written once), 990 TFLOP/s dense bf16 for the bf16 GEMMs
// and the tensor-core attention prefill, 67 TFLOP/s fp32 for the fp32 paths.
// Timing: `inner` calls captured in one CUDA graph (no launch gaps), replayed 7 times between
// CUDA events, the median divided by `inner`. The weights of a GEMV rotate over as many
// copies as make >= 256 MB, so L2 (50 MB) does not serve the repeats; the activations are
// the model's, so at small T they may be L2-resident, as in the model.
// `--only gemv`: the decode GEMVs (Q8_0 and BF16) at the 0.8B decode shapes (D = 1024: qkv
// 6144, 2048, ffn 3584 / 7168, 1024, down 1024 x 3584, LM head 151936), T 1, 4, 8, 16, "cold"
// (weights rotated over >= 256 MB) and "hot" (one copy, re-read: L2-resident below ~50 MB).
// `--only gemv-27b`: the Q8_0 GEMVs at the 27b preset's decode shapes (grouped), T 1 and 2.
// `--only gemv-kquant`: the K-quant / Q4_0 GEMVs (and Q8_0 beside them) at the 0.8B shapes.
//   ops_cuda_bench [--quick] [--only matmul|gemv|gemv-27b|gemv-kquant|small|embed|attention|attn-decode] [--ctx N]
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/quant.h"
#include "kernels/cuda/ops.h"

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                     \
        }                                                                                     \
    } while (0)

namespace {

using namespace alloy;

constexpr double kHbm = 4.8e12, kBf16 = 990e12, kFp32 = 67e12;
constexpr int D = 1024, FFN = 3584, VOCAB = 248320, NH = 8, NKV = 2, HD = 256, NROT = 64;

cudaStream_t g_stream;

struct Buf {
    void* p = nullptr;
    size_t n = 0;
    explicit Buf(size_t bytes) : n(bytes) { CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256))); }
    Buf(const Buf&) = delete;
    ~Buf() { cudaFree(p); }
    template <class T> T* as() const { return static_cast<T*>(p); }
};

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
uint64_t next() {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }

// Random fp32 values in [-a, a] uploaded to a new buffer of n floats.
void fill_f32(Buf& b, size_t n, float a) {
    std::vector<float> h(n);
    for (auto& x : h) x = a * uniform();
    CHECK(cudaMemcpy(b.p, h.data(), n * 4, cudaMemcpyHostToDevice));
}

// A weight of `type` with random contents (bf16 of N(0, 0.02)-sized values; Q8_0 blocks of
// random int8 and scale ~0.02 / 127).
// A device weight's view: block types in the split layout that fill_weight leaves (unless `layout`).
WeightView weight_view(GgmlType t, int64_t n_in, int64_t n_out, const uint8_t* data, size_t rb,
                       WeightLayout layout = WeightLayout::Split) {
    return {t, n_in, n_out, data, rb, cuda::split_blocks_supported(t) ? layout : WeightLayout::Gguf};
}

void fill_weight(Buf& b, GgmlType t, size_t n_out, size_t n_in) {
    std::vector<uint8_t> h(b.n);
    if (t == GgmlType::Q8_0) {
        for (size_t blk = 0; blk < n_out * n_in / 32; ++blk) {
            uint8_t* p = h.data() + blk * 34;
            const uint16_t d = fp32_to_fp16(0.02f / 127.0f * (1.0f + 0.5f * uniform()));
            std::memcpy(p, &d, 2);
            for (int i = 0; i < 32; i += 8) {
                const uint64_t r = next();
                std::memcpy(p + 2 + i, &r, 8);
            }
        }
    } else if (t == GgmlType::BF16) {
        auto* q = reinterpret_cast<uint16_t*>(h.data());
        for (size_t i = 0; i < n_out * n_in; ++i) q[i] = fp32_to_bf16(0.02f * uniform());
    } else if (t == GgmlType::F32) {
        auto* q = reinterpret_cast<float*>(h.data());
        for (size_t i = 0; i < n_out * n_in; ++i) q[i] = 0.02f * uniform();
    } else {
        // Other block types: 64 rows quantized from N(0, 0.02)-sized values, repeated (the
        // reference quantizers are too slow for a 248k-row LM head; the GEMV's time does not
        // depend on the values).
        const size_t rb = row_bytes(t, int64_t(n_in));
        std::vector<float> f(n_in);
        for (size_t r = 0; r < std::min<size_t>(64, n_out); ++r) {
            for (auto& x : f) x = 0.02f * uniform();
            quantize_row(t, f.data(), h.data() + r * rb, int64_t(n_in));
        }
        for (size_t r = 64; r < n_out; ++r) std::memcpy(h.data() + r * rb, h.data() + (r % 64) * rb, rb);
    }
    if (!cuda::split_blocks_supported(t)) {
        CHECK(cudaMemcpy(b.p, h.data(), b.n, cudaMemcpyHostToDevice));
        return;
    }
    Buf stored(b.n);  // block types: GGUF's blocks, then the device's split layout (cuda::split_blocks)
    CHECK(cudaMemcpy(stored.p, h.data(), b.n, cudaMemcpyHostToDevice));
    cuda::split_blocks(weight_view(t, int64_t(n_in), int64_t(n_out), stored.as<uint8_t>(), b.n / n_out, WeightLayout::Gguf), b.p);
    CHECK(cudaDeviceSynchronize());
}

// Median microseconds per call of f(i), i = 0..inner-1, replayed from one CUDA graph.
double time_us(const std::function<void(int)>& f, int inner) {
    f(0);  // first use: cuBLAS handle creation and heuristics happen outside the capture
    CHECK(cudaStreamSynchronize(g_stream));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < inner; ++i) f(i);
    CHECK(cudaStreamEndCapture(g_stream, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    CHECK(cudaGraphLaunch(ge, g_stream));
    CHECK(cudaStreamSynchronize(g_stream));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
        CHECK(cudaEventRecord(a, g_stream));
        CHECK(cudaGraphLaunch(ge, g_stream));
        CHECK(cudaEventRecord(b, g_stream));
        CHECK(cudaEventSynchronize(b));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ms[3] * 1e3 / inner;
}

void row_bw(const std::string& what, double us, double bytes) {
    const double gbs = bytes / (us * 1e-6) / 1e9;
    std::printf("| %-44s | %9.2f | %8.0f GB/s | %5.1f%% HBM |\n", what.c_str(), us, gbs, 100.0 * gbs * 1e9 / kHbm);
}
void row_flops(const std::string& what, double us, double flops, double peak, const char* peak_name) {
    const double tf = flops / (us * 1e-6) / 1e12;
    std::printf("| %-44s | %9.2f | %8.1f TFLOP/s | %5.1f%% %s |\n", what.c_str(), us, tf, 100.0 * tf * 1e12 / peak,
                peak_name);
}

const char* type_name(GgmlType t) { return type_traits(t).name; }

void bench_matmul(GgmlType t, int64_t n_out, int64_t n_in, const std::vector<int64_t>& Ts) {
    const size_t rb = row_bytes(t, n_in);
    const size_t wbytes = rb * size_t(n_out);
    const int copies = int(std::min<size_t>(64, std::max<size_t>(1, (size_t(256) << 20) / wbytes + 1)));
    std::vector<std::unique_ptr<Buf>> w;
    for (int c = 0; c < copies; ++c) {
        w.push_back(std::make_unique<Buf>(wbytes));
        if (c == 0) fill_weight(*w[0], t, size_t(n_out), size_t(n_in));
        else CHECK(cudaMemcpy(w[size_t(c)]->p, w[0]->p, wbytes, cudaMemcpyDeviceToDevice));
    }
    for (int64_t T : Ts) {
        Buf x(size_t(T * n_in) * 4), y(size_t(T * n_out) * 4);
        fill_f32(x, size_t(T * n_in), 1.0f);
        const WeightView W0 = weight_view(t, n_in, n_out, w[0]->as<uint8_t>(), rb);
        Buf ws(cuda::matmul_workspace_bytes(W0, T));
        const int inner = std::max(copies, T >= 512 ? 10 : 40);
        const double us = time_us(
            [&](int i) {
                const WeightView W = weight_view(t, n_in, n_out, w[size_t(i % copies)]->as<uint8_t>(), rb);
                cuda::matmul(W, x.as<float>(), y.as<float>(), T, ws.p, g_stream);
            },
            inner);
        char what[96];
        std::snprintf(what, sizeof what, "matmul %s %lldx%lld T=%lld", type_name(t), (long long)n_out,
                      (long long)n_in, (long long)T);
        if (T <= 16)
            row_bw(what, us, double(wbytes) + double(T) * (n_in + n_out) * 4);
        else
            row_flops(what, us, 2.0 * T * n_in * n_out, t == GgmlType::F32 ? kFp32 : kBf16,
                      t == GgmlType::F32 ? "fp32" : "bf16");
    }
}

// The decode GEMVs, cold and hot: one line per (type, shape, T, cold|hot).
// shapes: {n_out, n_in}; Ts: token counts; types: the weight types.
void bench_gemv(const std::vector<std::array<int64_t, 2>>& shapes, const std::vector<int64_t>& Ts,
                const std::vector<GgmlType>& types) {
    for (GgmlType t : types)
        for (const auto& sh : shapes) {
            const int64_t n_out = sh[0], n_in = sh[1];
            const size_t rb = row_bytes(t, n_in);
            const size_t wbytes = rb * size_t(n_out);
            const int copies = int(std::min<size_t>(64, std::max<size_t>(1, (size_t(256) << 20) / wbytes + 1)));
            std::vector<std::unique_ptr<Buf>> w;
            for (int c = 0; c < copies; ++c) {
                w.push_back(std::make_unique<Buf>(wbytes));
                if (c == 0) fill_weight(*w[0], t, size_t(n_out), size_t(n_in));
                else CHECK(cudaMemcpy(w[size_t(c)]->p, w[0]->p, wbytes, cudaMemcpyDeviceToDevice));
            }
            for (int64_t T : Ts)
                for (bool cold : {true, false}) {
                    const int nc = cold ? copies : 1;
                    Buf x(size_t(T * n_in) * 4), y(size_t(T * n_out) * 4);
                    fill_f32(x, size_t(T * n_in), 1.0f);
                    const WeightView W0 = weight_view(t, n_in, n_out, w[0]->as<uint8_t>(), rb);
                    Buf ws(cuda::matmul_workspace_bytes(W0, T));
                    const double us = time_us(
                        [&](int i) {
                            const WeightView W = weight_view(t, n_in, n_out, w[size_t(i % nc)]->as<uint8_t>(), rb);
                            cuda::matmul(W, x.as<float>(), y.as<float>(), T, ws.p, g_stream);
                        },
                        std::max(copies, 40));
                    char what[96];
                    std::snprintf(what, sizeof what, "gemv %s %lldx%lld T=%lld %s", type_name(t), (long long)n_out,
                                  (long long)n_in, (long long)T, cold ? "cold" : "hot");
                    row_bw(what, us, double(wbytes) + double(T) * (n_in + n_out) * 4);
                }
        }
}

void bench_small(int64_t T) {
    const int64_t n = T * D;
    Buf x(n * 4), y(n * 4), out(n * 4), w(D * 4);
    fill_f32(x, n, 1.0f);
    fill_f32(y, n, 1.0f);
    fill_f32(w, D, 1.0f);
    const int inner = 50;
    char what[96];
    std::snprintf(what, sizeof what, "rms_norm [%lld, %d]", (long long)T, D);
    row_bw(what, time_us([&](int) { cuda::rms_norm(x.as<float>(), w.as<float>(), out.as<float>(), T, D, 1e-6f, g_stream); }, inner),
           2.0 * n * 4);
    std::snprintf(what, sizeof what, "add_rms_norm [%lld, %d]", (long long)T, D);
    row_bw(what, time_us([&](int) { cuda::add_rms_norm(x.as<float>(), y.as<float>(), w.as<float>(), out.as<float>(), T, D, 1e-6f, g_stream); }, inner),
           4.0 * n * 4);
    if (T == 1) {
        // The 27b's width (5120), with the Q8_0 input its GEMV reads written beside (a decode
        // step's residual + norm).
        const int64_t n27 = 5120;
        Buf x27(n27 * 4), y27(n27 * 4), o27(n27 * 4), w27(n27 * 4), q27(cuda::q8_input_bytes(1, n27));
        fill_f32(x27, n27, 1.0f);
        fill_f32(y27, n27, 1.0f);
        fill_f32(w27, n27, 1.0f);
        const cuda::MatmulInput pk{q27.as<int8_t>(), reinterpret_cast<float*>(q27.as<uint8_t>() + cuda::q8_input_scales_offset(1, n27))};
        std::snprintf(what, sizeof what, "add_rms_norm [1, %lld] + q8", (long long)n27);
        row_bw(what, time_us([&](int) { cuda::add_rms_norm(x27.as<float>(), y27.as<float>(), w27.as<float>(), o27.as<float>(), 1, n27, 1e-6f, g_stream, pk); }, inner),
               4.0 * n27 * 4);
    }

    // q of the gated attention block: [T, 8, 2 * 256] (query then gate per head).
    const int64_t nq = T * NH * HD;
    Buf qg(2 * nq * 4), q(nq * 4), pos(T * 4), hw(HD * 4);
    fill_f32(qg, 2 * nq, 1.0f);
    fill_f32(q, nq, 1.0f);
    fill_f32(hw, HD, 1.0f);
    std::vector<int32_t> hp(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) hp[size_t(t)] = int32_t(t);
    CHECK(cudaMemcpy(pos.p, hp.data(), T * 4, cudaMemcpyHostToDevice));
    std::snprintf(what, sizeof what, "rope_partial q [%lld, %d, %d] n_rot %d", (long long)T, NH, HD, NROT);
    row_bw(what, time_us([&](int) { cuda::rope_partial(q.as<float>(), pos.as<int32_t>(), T, NH, HD, NROT, 1e7f, g_stream); }, inner),
           2.0 * T * NH * NROT * 4);
    std::snprintf(what, sizeof what, "rms_norm_rope q [%lld, %d, %d] stride 512", (long long)T, NH, HD);
    row_bw(what, time_us([&](int) { cuda::rms_norm_rope(qg.as<float>(), 2 * HD, hw.as<float>(), q.as<float>(), pos.as<int32_t>(), T, NH, HD, NROT, 1e7f, 1e-6f, g_stream); }, inner),
           2.0 * nq * 4);
    std::snprintf(what, sizeof what, "sigmoid_gate_mul rows [%lld x %d, %d]", (long long)T, NH, HD);
    row_bw(what, time_us([&](int) { cuda::sigmoid_gate_mul(q.as<float>(), qg.as<float>() + HD, T * NH, HD, 2 * HD, g_stream); }, inner),
           3.0 * nq * 4);

    const int64_t nf = T * FFN;
    Buf g(nf * 4), u(nf * 4), o(nf * 4);
    fill_f32(g, nf, 2.0f);
    fill_f32(u, nf, 2.0f);
    std::snprintf(what, sizeof what, "swiglu [%lld, %d]", (long long)T, FFN);
    row_bw(what, time_us([&](int) { cuda::swiglu(g.as<float>(), u.as<float>(), o.as<float>(), nf, g_stream); }, inner),
           3.0 * nf * 4);
    std::snprintf(what, sizeof what, "add [%lld, %d]", (long long)T, D);
    row_bw(what, time_us([&](int) { cuda::add(x.as<float>(), y.as<float>(), n, g_stream); }, inner), 3.0 * n * 4);
}

void bench_embed_argmax() {
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::BF16}) {
        const size_t rb = t == GgmlType::Q8_0 ? D / 32 * 34 : D * 2;
        Buf table(rb * VOCAB);
        fill_weight(table, t, VOCAB, D);
        for (int64_t T : {int64_t(1), int64_t(4096)}) {
            std::vector<int32_t> ids(static_cast<size_t>(T));
            for (auto& i : ids) i = int32_t(next() % VOCAB);
            Buf dids(T * 4), out(T * D * 4);
            CHECK(cudaMemcpy(dids.p, ids.data(), T * 4, cudaMemcpyHostToDevice));
            char what[96];
            std::snprintf(what, sizeof what, "get_rows %s [%lld of %d, %d]", type_name(t), (long long)T, VOCAB, D);
            const WeightView W = weight_view(t, D, VOCAB, table.as<uint8_t>(), rb);
            row_bw(what, time_us([&](int) { cuda::get_rows(W, dids.as<int32_t>(), out.as<float>(), T, g_stream); }, 50),
                   double(T) * (rb + D * 4));
        }
    }
    for (int64_t rows : {int64_t(1), int64_t(32)}) {
        Buf logits(rows * VOCAB * 4), out(rows * 4), ws(cuda::argmax_workspace_bytes(rows));
        CHECK(cudaMemset(ws.p, 0, ws.n));  // zeroed once; each call leaves it zeroed
        fill_f32(logits, size_t(rows) * VOCAB, 10.0f);
        char what[96];
        std::snprintf(what, sizeof what, "argmax [%lld, %d]", (long long)rows, VOCAB);
        row_bw(what, time_us([&](int) { cuda::argmax(logits.as<float>(), rows, VOCAB, out.as<int32_t>(), ws.p, g_stream); }, 50),
               double(rows) * VOCAB * 4);
    }
}

void bench_attention(bool quick) {
    const ref::AttentionShape s{NH, NKV, HD, 1.0f / 16.0f, GgmlType::BF16, GgmlType::BF16};
    const int64_t n_ctx = 32768 + 1;
    const size_t cache = size_t(n_ctx) * NKV * HD * 2;
    Buf k(cache), v(cache);
    {
        std::vector<uint16_t> h(size_t(n_ctx) * NKV * HD);
        for (auto& x : h) x = fp32_to_bf16(uniform());
        CHECK(cudaMemcpy(k.p, h.data(), cache, cudaMemcpyHostToDevice));
        for (auto& x : h) x = fp32_to_bf16(uniform());
        CHECK(cudaMemcpy(v.p, h.data(), cache, cudaMemcpyHostToDevice));
    }
    // Decode: B = 1 at depth n_past; bytes = the K and V rows read once.
    for (int64_t n_past : {int64_t(512), int64_t(4096), int64_t(32768)}) {
        Buf q(NH * HD * 4), out(NH * HD * 4), ws(cuda::attention_workspace_bytes(s, 1, n_past));
        CHECK(cudaMemset(ws.p, 0, ws.n));
        fill_f32(q, NH * HD, 1.0f);
        char what[96];
        std::snprintf(what, sizeof what, "attention decode bf16 KV, depth %lld", (long long)n_past);
        row_bw(what, time_us([&](int) { cuda::attention(s, q.as<float>(), k.p, v.p, out.as<float>(), 1, n_past, ws.p, g_stream); }, 50),
               2.0 * (n_past + 1) * NKV * HD * 2);
    }
    // Prefill at depth 0: 4 n_head hd FLOPs per (query, key) pair (QK^T and PV), causal.
    for (int64_t T : {int64_t(512), int64_t(4096)}) {
        if (quick && T > 512) continue;
        Buf q(T * NH * HD * 4), out(T * NH * HD * 4), ws(cuda::attention_workspace_bytes(s, T, 0));
        CHECK(cudaMemset(ws.p, 0, ws.n));
        fill_f32(q, size_t(T) * NH * HD, 1.0f);
        char what[96];
        std::snprintf(what, sizeof what, "attention prefill bf16 KV, T=%lld", (long long)T);
        const double pairs = double(T) * (T + 1) / 2;
        row_flops(what, time_us([&](int) { cuda::attention(s, q.as<float>(), k.p, v.p, out.as<float>(), T, 0, ws.p, g_stream); }, 3),
                  4.0 * NH * HD * pairs, kBf16, "bf16");  // bf16 caches: the tensor-core path
    }
}

// Decode and verification (T <= 4) at contexts 512..16384 on f16 and bf16 caches (K and V of
// one type): the T tokens sit at depths ctx - T .. ctx - 1 (the last attends to ctx keys).
// "cold": each call of the graph reads another copy of the caches, as many copies as make
// >= 256 MB (up to 256), so L2 (60 MB) does not serve them, as in the model, where every
// layer has its own cache and the weights stream through L2 between a layer's calls; "hot":
// one copy, re-read (L2-resident up to ~8k keys). Bytes: the K and V rows read once.
void bench_attention_decode(int64_t only_ctx) {
    const int64_t max_ctx = 16384;
    const size_t max_rows = size_t(max_ctx) * NKV * HD;  // elements of one cache copy at the largest context
    const size_t region = size_t(256) << 20;            // bytes per cache (K or V) over all copies
    Buf kbuf(region + max_rows * 2), vbuf(region + max_rows * 2);
    for (GgmlType ty : {GgmlType::BF16, GgmlType::F16}) {
        {  // one random copy at the largest size, replicated over the region (content is irrelevant to timing)
            std::vector<uint16_t> h(max_rows);
            for (Buf* b : {&kbuf, &vbuf}) {
                for (auto& x : h) x = ty == GgmlType::BF16 ? fp32_to_bf16(uniform()) : fp32_to_fp16(uniform());
                CHECK(cudaMemcpy(b->p, h.data(), max_rows * 2, cudaMemcpyHostToDevice));
                for (size_t off = max_rows * 2; off + max_rows * 2 <= b->n; off += max_rows * 2)
                    CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(b->p) + off, b->p, max_rows * 2, cudaMemcpyDeviceToDevice, g_stream));
            }
            CHECK(cudaStreamSynchronize(g_stream));
        }
        const ref::AttentionShape s{NH, NKV, HD, 1.0f / 16.0f, ty, ty};
        for (int64_t ctx : {int64_t(512), int64_t(1024), int64_t(2048), int64_t(4096), int64_t(8192), int64_t(16384)})
            for (int64_t T : {int64_t(1), int64_t(4)})
                for (bool cold : {true, false}) {
                    if (only_ctx && ctx != only_ctx) continue;
                    const int64_t n_past = ctx - T;
                    const size_t copy_bytes = size_t(ctx) * NKV * HD * 2;
                    const int copies = cold ? int(std::min<size_t>(256, std::max<size_t>(1, region / copy_bytes))) : 1;
                    Buf q(T * NH * HD * 4), out(T * NH * HD * 4), ws(cuda::attention_workspace_bytes(s, T, n_past));
                    CHECK(cudaMemset(ws.p, 0, ws.n));
                    fill_f32(q, size_t(T) * NH * HD, 1.0f);
                    char what[96];
                    std::snprintf(what, sizeof what, "attn decode %s ctx %lld T %lld %s", ty == GgmlType::BF16 ? "bf16" : "f16",
                                  (long long)ctx, (long long)T, cold ? "cold" : "hot");
                    const int inner = std::max(copies, 50);
                    row_bw(what,
                           time_us(
                               [&](int i) {
                                   const size_t off = size_t(i % copies) * copy_bytes;
                                   cuda::attention(s, q.as<float>(), static_cast<uint8_t*>(kbuf.p) + off,
                                                   static_cast<uint8_t*>(vbuf.p) + off, out.as<float>(), T, n_past, ws.p,
                                                   g_stream);
                               },
                               inner),
                           2.0 * double(ctx) * NKV * HD * 2);
                }
    }
}

}  // namespace

int main(int argc, char** argv) {
    bool quick = false;
    std::string only;  // matmul, small, embed, attention (empty: all)
    int64_t only_ctx = 0;  // attn-decode: one context only
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) quick = true;
        else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
        else if (std::strcmp(argv[i], "--ctx") == 0 && i + 1 < argc) only_ctx = std::atoll(argv[++i]);
        else {
            std::fprintf(stderr, "usage: ops_cuda_bench [--quick] [--only matmul|gemv|gemv-27b|gemv-kquant|small|embed|attention|attn-decode] [--ctx N]\n");
            return 2;
        }
    }
    auto want = [&](const char* part) { return only.empty() || only == part; };
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    std::printf("| op | us | rate | of peak |\n|---|---|---|---|\n");
    const std::vector<int64_t> decode = {1, 2, 4}, prefill = {512, 4096};
    if (want("matmul")) {
        for (GgmlType t : {GgmlType::Q8_0, GgmlType::BF16}) {
            std::vector<int64_t> Ts = decode;
            if (!quick) Ts.insert(Ts.end(), prefill.begin(), prefill.end());
            bench_matmul(t, FFN, D, Ts);
            bench_matmul(t, D, FFN, Ts);
            bench_matmul(t, VOCAB, D, quick ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 4, 512});
        }
        bench_matmul(GgmlType::F32, FFN, D, {1, 512});
    }
    if (only == "gemv")
        bench_gemv({{6144, D}, {2048, D}, {3584, D}, {7168, D}, {1024, D}, {1024, FFN}, {151936, D}}, {1, 4, 8, 16},
                   {GgmlType::Q8_0, GgmlType::BF16});
    // The block types of published Q4_K_M / Q5_K_M / IQ4_XS files at the same shapes (LM head:
    // the real vocabulary), T 1, 2, 4, 8.
    if (only == "gemv-kquant")
        bench_gemv({{6144, D}, {3584, D}, {7168, D}, {1024, D}, {1024, FFN}, {248320, D}}, {1, 2, 4, 8},
                   {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS, GgmlType::Q4_0, GgmlType::Q8_0});
    // The 27b preset's decode matrices as the model groups them: a GDN layer's qkv + z + a + b
    // (16480 rows), attention's q-with-gate + k + v (14336), FFN gate + up (34816), the output
    // projections (5120 x 6144), FFN down (5120 x 17408), the LM head.
    if (only == "gemv-27b")
        bench_gemv({{16480, 5120}, {14336, 5120}, {34816, 5120}, {5120, 6144}, {5120, 17408}, {248320, 5120}}, {1, 2},
                   {GgmlType::Q8_0});
    if (want("small")) {
        bench_small(1);
        bench_small(4096);
    }
    if (want("embed")) bench_embed_argmax();
    if (want("attention")) bench_attention(quick);
    if (want("attention") || only == "attn-decode") bench_attention_decode(only_ctx);
    CHECK(cudaStreamDestroy(g_stream));
    return 0;
}
