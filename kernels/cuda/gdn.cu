// Gated DeltaNet on CUDA (kernels/cuda/gdn.h): the serial delta rule (decode, verification),
// alone or as the middle of the fused layer op (conv + SiLU, then the delta rule with the q/k
// L2 norms and the gates computed in the same kernel, then the gated RMSNorm).
//
// Serial delta rule. Math: spec/GDN.md section 1, in
// the state layout of kernels/ref/gdn.h ([seq, H_v, d_v, d_k]: value column j of a head is
// d_k contiguous floats). Per token and column j:
//   sk = S_j . k, sq = S_j . q
//   delta_j = beta (v_j - alpha sk)
//   o_j = alpha sq + delta_j (k . q)
//   S_j' = alpha S_j + delta_j k
// A warp owns kColsPerWarp columns of one (sequence, head): each lane holds d_k / 32 elements
// of each (in float4 runs when d_k % 4 == 0, else strided), for every token of the sequence, so the state
// moves between HBM and registers once per call. Dot products reduce down the warp in a fixed
// tree and lane 0's sum is broadcast, so every lane updates with the same delta and the bits
// never depend on the call's token count.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "alloy/error.h"
#include "kernels/cuda/gdn.h"
#include "kernels/ref/gdn_common.h"

namespace alloy::cuda {

namespace {

constexpr int kMaxDk = 256;               // 8 elements per lane
constexpr int kElems = kMaxDk / 32;
constexpr int kWarps = 4;                 // per block
// Columns per warp. 4 (more bytes in flight per warp) measured slower at B = 32 on the H200
// (H_v 16/32/48: 18.2/48.9/71.8 us against 16.9/47.0/67.9) and gives B = 1 half the blocks.
constexpr int kColsPerWarp = 2;

// Sum over the warp, in a fixed tree, returned to every lane (lane 0's value).
__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    return __shfl_sync(0xffffffffu, x, 0);
}

// Rows live in registers as kElems values per lane: strided (lane + 32 e: any d_k), or in
// float4 runs (128 (e / 4) + 4 lane + e % 4 when d_k % 4 == 0: each lane moves 16 bytes per
// access, so a warp reads a 512-byte state column in one instruction).

// kElems values of a d_k-long row into registers (zero past d_k).
template <bool kVec>
__device__ __forceinline__ void load_row(const float* __restrict__ p, int d_k, int lane, float (&x)[kElems]) {
    if constexpr (kVec) {
#pragma unroll
        for (int e4 = 0; e4 < kElems / 4; ++e4) {
            const int i = 128 * e4 + 4 * lane;
            const float4 f = i < d_k ? *reinterpret_cast<const float4*>(p + i) : make_float4(0, 0, 0, 0);
            x[4 * e4] = f.x, x[4 * e4 + 1] = f.y, x[4 * e4 + 2] = f.z, x[4 * e4 + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
            const int i = lane + 32 * e;
            x[e] = i < d_k ? p[i] : 0.0f;
        }
    }
}

template <bool kVec>
__device__ __forceinline__ void store_row(float* __restrict__ p, int d_k, int lane, const float (&x)[kElems]) {
    if constexpr (kVec) {
#pragma unroll
        for (int e4 = 0; e4 < kElems / 4; ++e4) {
            const int i = 128 * e4 + 4 * lane;
            if (i < d_k) *reinterpret_cast<float4*>(p + i) = make_float4(x[4 * e4], x[4 * e4 + 1], x[4 * e4 + 2], x[4 * e4 + 3]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < kElems; ++e) {
            const int i = lane + 32 * e;
            if (i < d_k) p[i] = x[e];
        }
    }
}

// Inputs of the delta-rule kernel. q, k: token rows qk_stride floats apart, key head kh at
// kh * d_k; v: rows v_stride apart, value head h at h * d_v. Plain (kPrep false): q and k are
// normalised already and g (log decay) and beta are given per (token, value head). Fused
// (kPrep true): q and k come straight from the conv output and are L2-normalised (HF's
// x / sqrt(sum x^2 + eps)) and q scaled by q_scale here, and g = ssm_a softplus(a + dt_bias),
// beta = sigmoid(b) are computed here from the raw a, b.
struct DeltaArgs {
    ref::GdnShape sh;
    const int32_t* offs;
    const float *q, *k, *v;
    int64_t qk_stride, v_stride;
    const float *g, *beta;                      // plain
    const float *a, *b, *ssm_a, *dt_bias;       // fused
    float eps, q_scale;
    float* state;
    float* out;                                 // [T, H_v, d_v]
};

__device__ __forceinline__ float sigmoidf_(float x) {  // never exponentiates a large positive number
    return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

template <bool kVec, bool kPrep>
__global__ void __launch_bounds__(kWarps * 32) delta_serial_kernel(
    ref::GdnShape sh, const int32_t* __restrict__ offs, const float* __restrict__ Aq, const float* __restrict__ Ak,
    const float* __restrict__ Av, int qk_stride, int v_stride, const float* __restrict__ Ag,
    const float* __restrict__ Abeta, const float* __restrict__ Aa, const float* __restrict__ Ab,
    const float* __restrict__ ssm_a, const float* __restrict__ dt_bias, float eps, float q_scale,
    float* __restrict__ state, float* __restrict__ out) {
    const int seq = blockIdx.z, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int j0 = (blockIdx.x * kWarps + warp) * kColsPerWarp;
    const int t0 = offs[seq], t1 = offs[seq + 1];
    if (t0 == t1 || j0 >= sh.d_v) return;
    const int d_k = sh.d_k, d_v = sh.d_v, H_v = sh.H_v;
    const int kh = sh.tiled ? h % sh.H_k : h / (H_v / sh.H_k);  // ref::GdnShape::key_head (host-only)
    float* S = state + ((size_t)seq * H_v + h) * d_v * d_k;

    float s[kColsPerWarp][kElems];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
        if (j0 + c < d_v) load_row<kVec>(S + (size_t)(j0 + c) * d_k, d_k, lane, s[c]);
        else
#pragma unroll
            for (int e = 0; e < kElems; ++e) s[c][e] = 0.0f;
    }

    for (int t = t0; t < t1; ++t) {
        const float* qt = Aq + (size_t)t * qk_stride + (size_t)kh * d_k;
        const float* kt = Ak + (size_t)t * qk_stride + (size_t)kh * d_k;
        const float* vt = Av + (size_t)t * v_stride + (size_t)h * d_v;
        float kv[kElems], qv[kElems], kq = 0.0f;
        load_row<kVec>(kt, d_k, lane, kv);
        load_row<kVec>(qt, d_k, lane, qv);
        if constexpr (kPrep) {
            float sk2 = 0.0f, sq2 = 0.0f;
#pragma unroll
            for (int e = 0; e < kElems; ++e) {
                sk2 += kv[e] * kv[e];
                sq2 += qv[e] * qv[e];
            }
            const float ik = 1.0f / sqrtf(warp_sum(sk2) + eps), iq = 1.0f / sqrtf(warp_sum(sq2) + eps);
#pragma unroll
            for (int e = 0; e < kElems; ++e) {
                kv[e] *= ik;
                qv[e] = qv[e] * iq * q_scale;
            }
        }
#pragma unroll
        for (int e = 0; e < kElems; ++e) kq += kv[e] * qv[e];
        kq = warp_sum(kq);
        // The gates after the reduction (loading them earlier kept two more registers live
        // across it: 72 instead of 64, and B = 32 decode 10% slower).
        const float alpha = kPrep ? expf(ssm_a[h] * softplusf_(Aa[(size_t)t * H_v + h] + dt_bias[h]))
                                  : expf(Ag[(size_t)t * H_v + h]);
        const float b = kPrep ? sigmoidf_(Ab[(size_t)t * H_v + h]) : Abeta[(size_t)t * H_v + h];
#pragma unroll
        for (int c = 0; c < kColsPerWarp; ++c) {
            const int j = j0 + c;
            if (j >= d_v) break;
            float sk = 0.0f, sq = 0.0f;
#pragma unroll
            for (int e = 0; e < kElems; ++e) {
                sk += s[c][e] * kv[e];
                sq += s[c][e] * qv[e];
            }
            sk = warp_sum(sk);
            sq = warp_sum(sq);
            const float delta = b * (vt[j] - alpha * sk);
            if (lane == 0) out[((size_t)t * H_v + h) * d_v + j] = alpha * sq + delta * kq;
#pragma unroll
            for (int e = 0; e < kElems; ++e) s[c][e] = alpha * s[c][e] + delta * kv[e];
        }
    }

#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c)
        if (j0 + c < d_v) store_row<kVec>(S + (size_t)(j0 + c) * d_k, d_k, lane, s[c]);
}


// ---- fused layer op (serial): conv + SiLU, the delta rule with norms and gates, gated norm ----

constexpr int kMaxConvK = 8;

// Causal depthwise conv1d + SiLU of every channel of one sequence (a thread per channel, its
// tokens in order): u = silu(sum over taps of w * input), taps oldest first as the reference
// sums them; the last K-1 inputs become the new conv state.
__global__ void conv_silu_kernel(const int32_t* __restrict__ offs, const float* __restrict__ qkv, int conv_dim, int K,
                                 const float* __restrict__ w, float* __restrict__ conv_state, float* __restrict__ u) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, seq = blockIdx.y;
    if (c >= conv_dim) return;
    const int t0 = offs[seq], t1 = offs[seq + 1];
    if (t0 == t1) return;
    float* hist = conv_state + ((size_t)seq * conv_dim + c) * (K - 1);
    float win[kMaxConvK];
    for (int i = 0; i < K - 1; ++i) win[i] = hist[i];
    float wt[kMaxConvK];
    for (int i = 0; i < K; ++i) wt[i] = w[(size_t)c * K + i];
    for (int t = t0; t < t1; ++t) {
        const float x = qkv[(size_t)t * conv_dim + c];
        float acc = 0.0f;
        for (int i = 0; i < K - 1; ++i) acc += wt[i] * win[i];
        acc += wt[K - 1] * x;
        u[(size_t)t * conv_dim + c] = acc * sigmoidf_(acc);
        for (int i = 0; i + 1 < K - 1; ++i) win[i] = win[i + 1];
        if (K > 1) win[K - 2] = x;
    }
    for (int i = 0; i < K - 1; ++i) hist[i] = win[i];
}

// y = o * rsqrt(mean(o^2) + eps) * norm * silu(z) per (token, value head): a warp per pair,
// only for tokens of the call ([offs[0], offs[n_seqs])).
__global__ void gated_norm_kernel(const int32_t* __restrict__ offs, int n_seqs, int n_tokens, int H_v, int d_v,
                                  const float* __restrict__ o, const float* __restrict__ z,
                                  const float* __restrict__ norm, float eps, float* __restrict__ y) {
    const int lane = threadIdx.x & 31;
    const int64_t pair = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (pair >= int64_t(n_tokens) * H_v) return;
    const int t = int(pair / H_v);
    if (t < offs[0] || t >= offs[n_seqs]) return;
    const size_t row = size_t(pair) * d_v;
    float ss = 0.0f;
    for (int j = lane; j < d_v; j += 32) ss += o[row + j] * o[row + j];
    const float inv = 1.0f / sqrtf(warp_sum(ss) / float(d_v) + eps);
    for (int j = lane; j < d_v; j += 32) {
        const float zz = z[row + j];
        y[row + j] = o[row + j] * inv * norm[j] * (zz * sigmoidf_(zz));
    }
}

void check_launch(const char* op) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw Error(std::string(op) + ": launch failed: " + cudaGetErrorString(err));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The delta kernel over n_seqs sequences; float4 rows when every row starts 16-byte aligned.
void launch_delta(const DeltaArgs& A, bool prep, int n_seqs, void* stream, const char* op) {
    const bool vec = A.sh.d_k % 4 == 0 && A.qk_stride % 4 == 0 && aligned16(A.q) && aligned16(A.k) && aligned16(A.state);
    const int cols_per_block = kColsPerWarp * kWarps;
    const dim3 grid((A.sh.d_v + cols_per_block - 1) / cols_per_block, A.sh.H_v, n_seqs);
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    auto run = [&](auto kernel) {
        kernel<<<grid, kWarps * 32, 0, st>>>(A.sh, A.offs, A.q, A.k, A.v, int(A.qk_stride), int(A.v_stride), A.g, A.beta,
                                             A.a, A.b, A.ssm_a, A.dt_bias, A.eps, A.q_scale, A.state, A.out);
    };
    if (prep) vec ? run(delta_serial_kernel<true, true>) : run(delta_serial_kernel<false, true>);
    else vec ? run(delta_serial_kernel<true, false>) : run(delta_serial_kernel<false, false>);
    check_launch(op);
}

// The reference's shape checks (same messages), then what this backend adds.
void check_shape(const ref::GdnShape& shape, int n_seqs, const char* op) {
    ref::detail::check_shape(shape, op);
    if (shape.d_k > kMaxDk) throw Error(std::string(op) + ": d_k " + std::to_string(shape.d_k) + " > " + std::to_string(kMaxDk));
    if (n_seqs > 65535) throw Error(std::string(op) + ": more than 65535 sequences in one call");
}

}  // namespace

bool device_available() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void gdn_delta_serial(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                      const float* k, const float* v, const float* g, const float* beta, float* state, float* out,
                      void* stream) {
    const char* op = "cuda::gdn_delta_serial";
    check_shape(shape, n_seqs, op);
    if (n_seqs <= 0) return;
    DeltaArgs A{shape, seq_offsets, q, k, v, int64_t(shape.H_k) * shape.d_k, int64_t(shape.H_v) * shape.d_v,
                g, beta, nullptr, nullptr, nullptr, nullptr, 0.0f, 1.0f, state, out};
    launch_delta(A, false, n_seqs, stream, op);
}

size_t gdn_fused_workspace_bytes(const ref::GdnParams& p, int n_tokens) {
    const ref::GdnShape& sh = p.shape;
    const size_t conv_dim = size_t(2) * sh.H_k * sh.d_k + size_t(sh.H_v) * sh.d_v;
    return size_t(n_tokens) * (conv_dim + size_t(sh.H_v) * sh.d_v) * sizeof(float) + 256;
}

void gdn_fused(const ref::GdnParams& p, const ref::GdnWeights& w, int n_seqs, const int32_t* seq_offsets, int n_tokens,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state, float* state,
               float* y, void* workspace, void* stream) {
    const char* op = "cuda::gdn_fused";
    const ref::GdnShape& sh = p.shape;
    check_shape(sh, n_seqs, op);
    if (p.mode != ref::GdnMode::Serial)
        throw Error(std::string(op) + ": only the serial mode runs on CUDA so far (the chunked prefill kernel is not built)");
    if (p.conv_kernel < 1 || p.conv_kernel > kMaxConvK)
        throw Error(std::string(op) + ": conv_kernel " + std::to_string(p.conv_kernel) + " not in [1, " +
                    std::to_string(kMaxConvK) + "]");
    if (n_tokens < 0) throw Error(std::string(op) + ": n_tokens must be >= 0");
    if (n_seqs <= 0 || n_tokens == 0) return;
    const int key_dim = sh.H_k * sh.d_k, value_dim = sh.H_v * sh.d_v, conv_dim = 2 * key_dim + value_dim;
    // Workspace: u [n_tokens, conv_dim] (conv output: q | k | v), then o [n_tokens, value_dim].
    float* u = static_cast<float*>(workspace);
    float* o = u + size_t(n_tokens) * conv_dim;
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    conv_silu_kernel<<<dim3((conv_dim + 127) / 128, n_seqs), 128, 0, st>>>(seq_offsets, qkv, conv_dim, p.conv_kernel,
                                                                           w.conv1d, conv_state, u);
    check_launch(op);
    DeltaArgs A{sh, seq_offsets, u, u + key_dim, u + 2 * key_dim, conv_dim, conv_dim, nullptr, nullptr, a, b,
                w.ssm_a, w.dt_bias, p.eps, 1.0f / sqrtf(float(sh.d_k)), state, o};
    launch_delta(A, true, n_seqs, stream, op);
    const int64_t pairs = int64_t(n_tokens) * sh.H_v;
    gated_norm_kernel<<<unsigned((pairs + kWarps - 1) / kWarps), kWarps * 32, 0, st>>>(seq_offsets, n_seqs, n_tokens,
                                                                                       sh.H_v, sh.d_v, o, z, w.norm,
                                                                                       p.eps, y);
    check_launch(op);
}

}  // namespace alloy::cuda
