// The CUDA side of `alloy test-ops --backend cuda` (cli/test_ops.cpp): each function runs one
// op of kernels/cuda on host arrays (copied to the device, run on the default stream, copied
// back) with the arguments of the matching kernels/ref call, so test-ops compares it with the
// reference on the same random cases as the CPU variants. Built only where nvcc is
// (ALLOY_CUDA); throws alloy::Error naming the op on a CUDA failure.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ref/attention.h"
#include "kernels/ref/gdn.h"
#include "kernels/ref/weight.h"

namespace alloy::cli::cuda_ops {

// Whether a CUDA device is usable (else --backend cuda stops with an error).
bool available();
// The device's name, for the report's header.
std::string device_name();

void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps);
void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps);
void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot, float base);
// x [T, n_heads heads at x_head_stride], out [T, n_heads, head_dim] (out may be x when the
// stride is head_dim).
void rms_norm_rope(const float* x, int64_t x_head_stride, const float* w, float* out, const int32_t* pos, int64_t T,
                   int n_heads, int head_dim, int n_rot, float base, float eps);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// g_stride == 0: the flat form (x [n] *= sigmoid(g [n])); else rows of n, gate row r at g + r g_stride.
void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride);
void add(float* x, const float* y, int64_t n);
// dst: n elements of `type` (ref::kv_elem_bytes each).
void kv_store(const float* src, void* dst, GgmlType type, int64_t n);
// q [T, n_head, hd]; caches [n_past + T, n_kv, hd] of s.type_k / s.type_v (bytes); out [T, n_head, hd].
void attention(const ref::AttentionShape& s, const float* q, const std::vector<uint8_t>& k,
               const std::vector<uint8_t>& v, float* out, int64_t T, int64_t n_past);
// W's bytes on the host (uploaded here); x [T, n_in], y [T, n_out].
void matmul(const WeightView& W, const float* x, float* y, int64_t T);
bool matmul_supported(GgmlType type);  // F32, BF16, Q8_0
// What cuda::matmul does for this weight type and shape (the report's variant name), whether
// it quantizes x as Q8_0 blocks (the Q8_0 GEMV), and the NMSE it stays within against ref on
// that input (x itself otherwise): fp32 arithmetic 1e-7 (the Q8_0 GEMV 1e-6: its int8 codes
// of x may differ by one from ggml's); x (and Q8_0 weights) rounded to bf16 for cuBLAS 1e-4.
std::string matmul_path(GgmlType type, int64_t n_in, int64_t T);
bool matmul_quantizes_x(GgmlType type, int64_t T);
double matmul_nmse_limit(GgmlType type, int64_t n_in, int64_t T);
// The NMSE cuda::attention stays within against ref: 1e-4 where prefill rounds q and the
// probabilities to the caches' 16-bit type for its tensor cores, else 1e-7 (fp32).
double attention_nmse_limit(const ref::AttentionShape& s, int64_t T);
// ref::gdn_fused's contract (p.mode picks serial or chunked), host arrays.
void gdn_fused(const ref::GdnParams& p, const std::vector<float>& conv1d, const std::vector<float>& ssm_a,
               const std::vector<float>& dt_bias, const std::vector<float>& norm, const std::vector<int32_t>& offs,
               const std::vector<float>& qkv, const std::vector<float>& z, const std::vector<float>& a,
               const std::vector<float>& b, std::vector<float>& conv_state, std::vector<float>& state,
               std::vector<float>& y);
// ref::gdn_delta_serial (chunk == 0) or ref::gdn_delta_chunked (chunk 64) on host arrays.
void gdn_delta(const ref::GdnShape& shape, const std::vector<int32_t>& offs, const std::vector<float>& q,
               const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& g,
               const std::vector<float>& beta, std::vector<float>& state, std::vector<float>& out, int chunk);

}  // namespace alloy::cli::cuda_ops
