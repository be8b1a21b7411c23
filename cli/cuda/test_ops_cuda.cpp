#include "cli/cuda/test_ops_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "alloy/error.h"
#include "format/quant.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/ops.h"
#include "kernels/ref/kv_store.h"

namespace alloy::cli::cuda_ops {
namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(std::string("test-ops --backend cuda: ") + what + ": " + cudaGetErrorString(e));
}

// Device memory holding a copy of host bytes (or zeroed), freed with the object.
class Dev {
public:
    explicit Dev(size_t bytes, const void* host = nullptr) : bytes_(bytes) {
        check(cudaMalloc(&p_, std::max<size_t>(bytes, 16)), "cudaMalloc");
        if (host && bytes) check(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice), "copy to the device");
        else check(cudaMemset(p_, 0, std::max<size_t>(bytes, 16)), "cudaMemset");
    }
    template <class T>
    explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T), v.data()) {}
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    ~Dev() { cudaFree(p_); }
    template <class T = float>
    T* p() const { return static_cast<T*>(p_); }
    // Waits for the device, then copies the bytes back.
    void to_host(void* host) const {
        check(cudaDeviceSynchronize(), "the op");
        if (bytes_) check(cudaMemcpy(host, p_, bytes_, cudaMemcpyDeviceToHost), "copy to the host");
    }
    template <class T>
    void to_host(std::vector<T>& v) const { to_host(v.data()); }

private:
    void* p_ = nullptr;
    size_t bytes_;
};

size_t f32(int64_t n) { return size_t(n) * sizeof(float); }

}  // namespace

bool available() { return cuda::device_available(); }

std::string device_name() {
    cudaDeviceProp prop{};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "?";
    return prop.name;
}

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps) {
    Dev dx(f32(rows * n), x), dw(f32(n), w), dout(f32(rows * n));
    cuda::rms_norm(dx.p(), dw.p(), dout.p(), rows, n, eps);
    dout.to_host(out);
}

void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps) {
    Dev dx(f32(rows * n), x), dy(f32(rows * n), y), dw(f32(n), w), dout(f32(rows * n));
    cuda::add_rms_norm(dx.p(), dy.p(), dw.p(), dout.p(), rows, n, eps);
    dout.to_host(out);
    dx.to_host(x);
}

void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot, float base) {
    Dev dx(f32(T * n_heads * head_dim), x), dpos(size_t(T) * 4, pos);
    cuda::rope_partial(dx.p(), dpos.p<int32_t>(), T, n_heads, head_dim, n_rot, base);
    dx.to_host(x);
}

void rms_norm_rope(const float* x, int64_t x_head_stride, const float* w, float* out, const int32_t* pos, int64_t T,
                   int n_heads, int head_dim, int n_rot, float base, float eps) {
    const int64_t in_elems = (T * n_heads - 1) * x_head_stride + head_dim;
    Dev dx(f32(in_elems), x), dw(f32(head_dim), w), dpos(size_t(T) * 4, pos), dout(f32(T * n_heads * head_dim));
    const bool in_place = x == out;
    cuda::rms_norm_rope(dx.p(), x_head_stride, dw.p(), in_place ? dx.p() : dout.p(), dpos.p<int32_t>(), T, n_heads,
                        head_dim, n_rot, base, eps);
    (in_place ? dx : dout).to_host(out);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
    Dev dg(f32(n), gate), du(f32(n), up), dout(f32(n));
    cuda::swiglu(dg.p(), du.p(), dout.p(), n);
    dout.to_host(out);
}

void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride) {
    const int64_t g_elems = g_stride == 0 ? n : (rows - 1) * g_stride + n;
    Dev dx(f32(g_stride == 0 ? n : rows * n), x), dg(f32(g_elems), g);
    if (g_stride == 0) cuda::sigmoid_gate_mul(dx.p(), dg.p(), n);
    else cuda::sigmoid_gate_mul(dx.p(), dg.p(), rows, n, g_stride);
    dx.to_host(x);
}

void add(float* x, const float* y, int64_t n) {
    Dev dx(f32(n), x), dy(f32(n), y);
    cuda::add(dx.p(), dy.p(), n);
    dx.to_host(x);
}

void kv_store(const float* src, void* dst, GgmlType type, int64_t n) {
    Dev ds(f32(n), src), dd(size_t(n) * ref::kv_elem_bytes(type));
    cuda::kv_store(ds.p(), dd.p<void>(), type, n);
    dd.to_host(dst);
}

void attention(const ref::AttentionShape& s, const float* q, const std::vector<uint8_t>& k,
               const std::vector<uint8_t>& v, float* out, int64_t T, int64_t n_past) {
    const int64_t n = T * s.n_head * s.head_dim;
    Dev dq(f32(n), q), dk(k), dv(v), dout(f32(n));
    Dev ws(cuda::attention_workspace_bytes(s, T, n_past));  // zeroed, as the op asks
    cuda::attention(s, dq.p(), dk.p<void>(), dv.p<void>(), dout.p(), T, n_past, ws.p<void>());
    dout.to_host(out);
}

void matmul(const WeightView& W, const float* x, float* y, int64_t T) {
    const size_t bytes = size_t(W.n_out) * W.row_bytes;
    Dev dw(bytes, W.data), dx(f32(T * W.n_in), x), dy(f32(T * W.n_out));
    const bool split_type = cuda::split_blocks_supported(W.type);
    Dev split(split_type ? bytes : 0);
    WeightView on_device = W;
    on_device.data = dw.p<uint8_t>();
    if (split_type) on_device = cuda::split_blocks(on_device, split.p<void>());  // the device's layout
    Dev ws(cuda::matmul_workspace_bytes(on_device, T));
    cuda::matmul(on_device, dx.p(), dy.p(), T, ws.p<void>());
    dy.to_host(y);
}

bool matmul_supported(GgmlType type) {
    return type == GgmlType::F32 || type == GgmlType::BF16 || cuda::split_blocks_supported(type);
}

namespace {
// The GEMV paths of ops.h: T <= kQ8GemvMaxT (F32 / BF16 also need n_in % 8 == 0).
bool gemv(GgmlType type, int64_t n_in, int64_t T) {
    return T <= cuda::kQ8GemvMaxT && (cuda::split_blocks_supported(type) || n_in % 8 == 0);
}
}  // namespace

std::string matmul_path(GgmlType type, int64_t n_in, int64_t T) {
    const std::string t = type_traits(type).name;
    if (gemv(type, n_in, T)) return t + "-gemv";
    return cuda::split_blocks_supported(type) ? t + "-bf16-panels-cublas" : t + "-cublas";
}

bool matmul_quantizes_x(GgmlType type, int64_t T) { return type == GgmlType::Q8_0 && T <= cuda::kQ8GemvMaxT; }

double matmul_nmse_limit(GgmlType type, int64_t n_in, int64_t T) {
    // The Q8_0 GEMV divides by the block scale where the CPU's effective input (ggml's
    // quantizer) multiplies by its reciprocal: a few int8 codes differ by one (H200: 8e-8).
    if (type == GgmlType::Q8_0 && gemv(type, n_in, T)) return 1e-6;
    // The K-quant GEMV quantizes x per 32 (the CPU per 256, Q8_K): compared on the fp32 x, the
    // rounding of x (~3e-5) as the cuBLAS paths' rounding to bf16.
    if (cuda::split_blocks_supported(type) && type != GgmlType::Q8_0) return 1e-4;
    if (gemv(type, n_in, T) || type == GgmlType::F32) return 1e-7;  // F32's cuBLAS runs without TF32
    return 1e-4;
}

double attention_nmse_limit(const ref::AttentionShape& s, int64_t T) {
    auto b16 = [](GgmlType t) { return t == GgmlType::F16 || t == GgmlType::BF16; };
    return T > cuda::kAttnDecodeMaxT && b16(s.type_k) && s.type_k == s.type_v ? 1e-4 : 1e-7;
}

void gdn_fused(const ref::GdnParams& p, const std::vector<float>& conv1d, const std::vector<float>& ssm_a,
               const std::vector<float>& dt_bias, const std::vector<float>& norm, const std::vector<int32_t>& offs,
               const std::vector<float>& qkv, const std::vector<float>& z, const std::vector<float>& a,
               const std::vector<float>& b, std::vector<float>& conv_state, std::vector<float>& state,
               std::vector<float>& y) {
    const int n_seqs = int(offs.size()) - 1, n_tokens = offs.back();
    Dev dc(conv1d), dsa(ssm_a), ddt(dt_bias), dn(norm), doffs(offs), dqkv(qkv), dz(z), da(a), db(b);
    Dev dcs(conv_state), dst(state), dy(y);
    Dev ws(cuda::gdn_fused_workspace_bytes(p, n_seqs, n_tokens));
    const ref::GdnWeights w{dc.p(), dsa.p(), ddt.p(), dn.p()};
    cuda::gdn_fused(p, w, n_seqs, doffs.p<int32_t>(), n_tokens, dqkv.p(), dz.p(), da.p(), db.p(), dcs.p(), dst.p(),
                    dy.p(), ws.p<void>());
    dy.to_host(y);
    dcs.to_host(conv_state);
    dst.to_host(state);
}

void gdn_delta(const ref::GdnShape& shape, const std::vector<int32_t>& offs, const std::vector<float>& q,
               const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& g,
               const std::vector<float>& beta, std::vector<float>& state, std::vector<float>& out, int chunk) {
    const int n_seqs = int(offs.size()) - 1;
    Dev doffs(offs), dq(q), dk(k), dv(v), dg(g), dbeta(beta), dst(state), dout(out);
    if (chunk == 0)
        cuda::gdn_delta_serial(shape, n_seqs, doffs.p<int32_t>(), dq.p(), dk.p(), dv.p(), dg.p(), dbeta.p(), dst.p(),
                               dout.p());
    else
        cuda::gdn_delta_chunked(shape, n_seqs, doffs.p<int32_t>(), dq.p(), dk.p(), dv.p(), dg.p(), dbeta.p(), dst.p(),
                                dout.p(), chunk);
    dout.to_host(out);
    dst.to_host(state);
}

}  // namespace alloy::cli::cuda_ops
