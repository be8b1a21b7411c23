// The model's non-GDN ops on NVIDIA GPUs, with kernels/ref's names and contracts and every
// array in device memory: matmul (cuBLAS for BF16/F32 weights, own kernels for Q8_0),
// RMSNorm (+ residual), partial RoPE, SwiGLU, the attention output gate, the residual add,
// the embedding gather, greedy sampling, causal GQA attention and the KV cache store.
//
// Common rules: pointers are device pointers (16-byte aligned, as cudaMalloc gives) unless
// said otherwise; `stream` is a cudaStream_t (nullptr: the default stream); every call is
// asynchronous on it and graph-capturable (no allocation, no host synchronization); scratch
// memory is the caller's (`workspace`, sized by the matching *_workspace_bytes), as a
// recorded plan owns its buffers. Shapes the kernels cannot run throw alloy::Error naming the
// op. No CUDA types here: host code that does not include cuda_runtime.h can call these.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/ref/attention.h"
#include "kernels/ref/moe.h"
#include "kernels/ref/weight.h"

namespace alloy::cuda {

// ---- matmul (kernels/cuda/matmul.cu) --------------------------------------------------------
// y[t][o] = sum_i W[o][i] x[t][i], as ref::matmul. W: WeightView whose data is on the device
// (F32 / BF16: n_out rows of row_bytes each, the GGUF layout; block-quantized types: the split
// layout of split_blocks below, else alloy::Error); x: [T, W.n_in] fp32; y: [T, W.n_out] fp32.
//  * F32 weights, T <= kQ8GemvMaxT (n_in % 8 == 0): the BF16 GEMV's kernel on fp32 weights
//    (fp32 FMAs, ~1e-6 relative to ref), for its batch invariance (below).
//  * F32 weights, larger T: cuBLAS SGEMM in fp32 with TF32 off (CUBLAS_COMPUTE_32F_PEDANTIC):
//    the correctness oracle path; ~1e-6 relative to ref.
//  * BF16 weights, T <= kQ8GemvMaxT (n_in % 8 == 0): an own weight-streaming GEMV, x in fp32
//    as given, fp32 FMAs: ~1e-6 relative to ref.
//  * BF16 weights, larger T: x rounded to bf16 on the device (workspace), cublasGemmEx bf16 x
//    bf16 with fp32 accumulation and output; the error is x's rounding (~3e-3 relative).
//  The GEMVs are launched with programmatic dependent launch: they start streaming weights
//  while the kernel before them drains, and wait for it before reading x.
//  * Q8_0 weights, T <= kQ8GemvMaxT: x quantized to Q8_0-style blocks (32 int8 + an fp32
//    scale, as llama.cpp's q8_1 without the sum) and a weight-streaming GEMV with dp4a:
//    ~5e-3 relative to ref (x's rounding to int8).
//  * Q4_0, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS weights, T <= kQ8GemvMaxT: x quantized as for
//    Q8_0, and a weight-streaming GEMV (kernels/cuda/matmul_kquant.cu) that decodes each 16
//    code bytes to int8 and multiplies with dp4a, a scale (and a min) per 16 values.
//  * Block-quantized weights, T > kQ8GemvMaxT: panels of up to kQ8PanelRows rows dequantized to
//    a bf16 scratch (the values rounded to bf16: ~4e-3 relative), then the BF16 path's GEMM.
//  Batch invariance (the CPU's contract, kGemvMaxTokens = 16): for T <= kQ8GemvMaxT each row
//  of y has the bits of a T = 1 call on that row of x, whatever T and the row's position (the
//  GEMVs' order of summation per (row, token) depends on the weight's shape only).
// Other weight types (F16, ...) throw alloy::Error. cuBLAS runs on a per-thread handle bound to `stream`.
constexpr int64_t kQ8GemvMaxT = 16;  // both GEMVs (the name is historical)
constexpr int64_t kQ8PanelRows = 8192;
// A matmul input its producer (rms_norm, add_rms_norm, swiglu, sigmoid_gate_mul) writes in
// the form the matmul reads, so that the matmul skips its own conversion launch:
//  - q, d (T <= kQ8GemvMaxT, Q8_0 weights): x quantized as the Q8_0 GEMV quantizes it (per 32
//    values d = amax / 127 and q = round(x / d), to nearest even): q [T, n] int8, d [T, n / 32]
//    fp32 (sizes: q8_input_bytes). Decode is launch-bound: one launch less per matmul; the
//    GEMV's bits are those of quantizing x itself.
//  - b (T > kQ8GemvMaxT, BF16 or Q8_0 weights): x rounded to bf16 (nearest even) [T, n], as the
//    prefill GEMM's to_bf16 rounds it: one launch and one fp32 read of x less per matmul.
//    b_only: the producer writes b alone, not its fp32 output (the backend sets it when every
//    reader of the tensor is a matmul that takes b).
// A producer writes the forms whose pointers are set; a matmul ignores those its path does not
// read.
struct MatmulInput {
    int8_t* q = nullptr;
    float* d = nullptr;
    uint16_t* b = nullptr;
    bool b_only = false;
};
inline size_t q8_input_scales_offset(int64_t T, int64_t n) { return (size_t(T * n) + 255) / 256 * 256; }
inline size_t q8_input_bytes(int64_t T, int64_t n) { return q8_input_scales_offset(T, n) + size_t(T * (n / 32)) * 4; }
// x [T, n] fp32 -> out, as the Q8_0 GEMV quantizes its input (n % 32 == 0), for a caller
// that feeds several GEMVs or gathers rows of it (cuda::moe_ffn).
void quantize_q8_input(const float* x, int64_t T, int64_t n, MatmulInput out, void* stream = nullptr);
// Block-quantized weights on the device are split (WeightLayout::Split, kernels/ref/weight.h:
// every block's code bytes, then every block's scales; the same bytes as GGUF's blocks, which
// are only 2-byte aligned), so a GEMV lane reads 16 code bytes with one 16-byte load instead of
// five 4-byte ones and a shift. Types: kSplitBlockTypes (split_blocks_supported). gguf: a device copy of GGUF's rows; out: n_out * row_bytes bytes on
// the device, 16-byte aligned, not overlapping gguf. Returns out's view. Enqueued on `stream`.
inline constexpr const char* kSplitBlockTypes = "Q8_0, Q4_0, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4";
bool split_blocks_supported(GgmlType t);
WeightView split_blocks(const WeightView& gguf, void* out, void* stream = nullptr);
size_t matmul_workspace_bytes(const WeightView& W, int64_t T);
void matmul(const WeightView& W, const float* x, float* y, int64_t T, void* workspace, void* stream = nullptr,
            const MatmulInput* xq = nullptr);
// y[m] = matmul(*W[m], x) for m < n (n <= 4; e.g. a GDN layer's four input projections, or
// the FFN's gate and up): at T <= kQ8GemvMaxT, weights of one type and n_in run as ONE GEMV
// launch (after one quantization of x for Q8_0), warps per row chosen from the group's total
// rows: the GEMV's batch invariance holds per group (a group's rows may differ in the last
// bits from a lone matmul of the same weight). Weights of several types (Q4_K_M's mixes): one
// such launch per run of consecutive weights of one type and n_in. Above kQ8GemvMaxT: x's bf16
// copy made once for BF16 / block-quantized weights, then one GEMM per weight.
size_t matmul_multi_workspace_bytes(const WeightView* const* W, int n, int64_t T);
void matmul_multi(const WeightView* const* W, float* const* y, int n, const float* x, int64_t T, void* workspace,
                  void* stream = nullptr, const MatmulInput* xq = nullptr);

// ---- normalization (kernels/cuda/norm.cu) ---------------------------------------------------
// ref::rms_norm: x, out: [rows, n] (out may alias x); w: [n] or nullptr. fp32 sums (ref: double).
// packed (optional; n % 32 == 0): out also written in packed's forms (MatmulInput), [rows, n].
void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t n, float eps, void* stream = nullptr,
              MatmulInput packed = {});
// ref::add_rms_norm: x [rows, n] += y [rows, n], then out [rows, n] = rms_norm(x) (out aliases
// neither x nor y). One pass: each row is read once and x written once.
void add_rms_norm(float* x, const float* y, const float* w, float* out, int64_t rows, int64_t n, float eps,
                  void* stream = nullptr, MatmulInput packed = {});

// ---- RoPE (kernels/cuda/rope.cu) ------------------------------------------------------------
// ref::rope_partial: x [T, n_heads, head_dim] rotated in place, pos [T] (device) absolute
// positions; n_rot even, <= head_dim and <= 256. The inverse frequencies are computed on the
// host exactly as ref computes them, so only sin/cos (CUDA's full-range sincosf) differ.
void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot, float base,
                  void* stream = nullptr);
// ref::rms_norm_rope: head (t, h) of x at x + (t n_heads + h) x_head_stride; w [head_dim];
// out [T, n_heads, head_dim] (may alias x when x_head_stride == head_dim); head_dim <= 1024.
void rms_norm_rope(const float* x, int64_t x_head_stride, const float* w, float* out, const int32_t* pos, int64_t T,
                   int n_heads, int head_dim, int n_rot, float base, float eps, void* stream = nullptr);

// ---- elementwise (kernels/cuda/elementwise.cu) ----------------------------------------------
// ref::add: x [n] += y [n].
void add(float* x, const float* y, int64_t n, void* stream = nullptr);
// ref::swiglu: out [n] = silu(gate [n]) * up [n]; out may alias gate or up.
// packed (optional; n % 32 == 0, out rows whole blocks): out also written in packed's forms, n values.
void swiglu(const float* gate, const float* up, float* out, int64_t n, void* stream = nullptr, MatmulInput packed = {});
// ref::sigmoid_gate_mul: x [n] *= sigmoid(g [n]).
void sigmoid_gate_mul(float* x, const float* g, int64_t n, void* stream = nullptr);
// The same over rows: x [rows, n] contiguous, gate row r at g + r g_stride.
// packed (optional; n % 32 == 0): x also written in packed's forms, rows x n values.
void sigmoid_gate_mul(float* x, const float* g, int64_t rows, int64_t n, int64_t g_stride, void* stream = nullptr,
                      MatmulInput packed = {});

// ---- MoE FFN (kernels/cuda/moe.cu) ---------------------------------------------------------
// ref::moe_ffn on the device: x [T, D] -> y [T, D] (must not alias). w: every matrix a device
// view (F32, BF16 or split Q8_0; the expert gate and up of one type; rows of 16-bit / F32
// experts a multiple of 8 weights, of Q8_0 ones whole blocks); at most 1024 experts and 32
// per token. Routing on the device as ref::moe_route; the experts' products are GEMVs over
// gathered rows (x quantized per 32 for Q8_0, fp32 otherwise); each token's experts summed in
// increasing id, then the shared expert. T <= kMoeDirectMaxT: one (token, expert) pair per
// launch chunk and every row of y has the bits of a 1-token call (batch invariance); longer
// calls group the pairs by expert on the device (same per-row arithmetic). No host
// synchronization: graph-capturable. workspace: moe_ffn_workspace_bytes(w, T).
constexpr int64_t kMoeDirectMaxT = kQ8GemvMaxT;
size_t moe_ffn_workspace_bytes(const ref::MoeWeights& w, int64_t T);
void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T, void* workspace, void* stream = nullptr);

// ---- embedding gather (kernels/cuda/get_rows.cu) --------------------------------------------
// out[t] = dequantized row ids[t] of `table` (F32, F16, BF16 rows or a split block type, on the device):
// ids [T] (device, each in [0, table.n_out): the caller validates token ids on the host, the
// kernel does not), out [T, table.n_in] fp32. Exact (every type converts exactly to fp32).
void get_rows(const WeightView& table, const int32_t* ids, float* out, int64_t T, void* stream = nullptr);

// ---- greedy sampling (kernels/cuda/argmax.cu) -----------------------------------------------
// out[r] = the index of the largest of logits[r][0..n) (logits [rows, n] fp32), the smallest
// such index on ties (std::max_element's rule); a NaN counts above +inf. Per row: blocks
// atomicMax a 64-bit key (order-preserving float bits, inverted index), so the result does
// not depend on block order. out: [rows] int32 on the device: the one 4-byte copy per token.
// workspace: argmax_workspace_bytes(rows) bytes, zeroed once when allocated (cudaMemset);
// every call leaves it zeroed again, so a graph needs no memset node. One launch.
size_t argmax_workspace_bytes(int64_t rows);
void argmax(const float* logits, int64_t rows, int64_t n, int32_t* out, void* workspace, void* stream = nullptr);

// ---- top-k for sampling (kernels/cuda/top_k.cu) ---------------------------------------------
// ref::top_k on the device: values, ids [rows, k] = each row of logits [rows, n] fp32's k most
// likely (value, id) pairs, larger value first, the lower id on ties, -0 = +0, NaN above +inf
// (the same pairs in the same order, bit for bit). k in [1, min(n, kTopKMax)], rows <= 65535.
// workspace: top_k_workspace_bytes(rows, n, k) bytes, zeroed once when allocated; every call
// leaves its counters zeroed again (a graph needs no memset node). One launch.
constexpr int kTopKMax = 64;
size_t top_k_workspace_bytes(int64_t rows, int64_t n, int k);
void top_k(const float* logits, int64_t rows, int64_t n, int k, float* values, int32_t* ids, void* workspace,
           void* stream = nullptr);

// ---- attention (kernels/cuda/attention.cu) --------------------------------------------------
// ref::attention on device arrays: q [T, n_head, head_dim] fp32; k_cache, v_cache
// [n_ctx, n_head_kv, head_dim] of s.type_k / s.type_v (F32, F16, BF16) with rows
// [0, n_past + T) filled; out [T, n_head, head_dim] fp32. Token t attends to cache rows
// [0, n_past + t]. head_dim in {64, 128, 256}; n_head a multiple of n_head_kv.
// Prefill (T > kAttnDecodeMaxT) with bf16 K and V, or f16 K and V: tensor cores (mma.sync) of
// that type, fp32 accumulation and softmax, q and P rounded to it: ~1e-2 absolute from ref at
// worst (bf16; f16 ~8x finer). Else
// fp32 CUDA-core arithmetic (~1e-6): a block takes one token, one KV head and up to 4 of its
// query heads, so every K/V row it loads serves the whole group.
// Keys are split across blocks (split-K, merged by a second kernel): for T <= 16 each token
// in ~kAttnDecodeSplits chunks sized by its own key count, so a token's bits depend only on
// that count (a verification call of K tokens gives the bits of K decode calls); above that,
// enough splits to fill the device. workspace: attention_workspace_bytes(s, T, n_past) bytes,
// zeroed once when allocated (a decode call's split counters lie at a fixed place in front and
// every call leaves them zeroed; a prefill call zeroes its own with a memset), so one workspace
// sized for the largest call serves calls of any T and depth. One launch (+ that memset).
constexpr int64_t kAttnDecodeMaxT = 16;
constexpr int64_t kAttnDecodeSplits = 128;
size_t attention_workspace_bytes(const ref::AttentionShape& s, int64_t T, int64_t n_past);
void attention(const ref::AttentionShape& s, const float* q, const void* k_cache, const void* v_cache, float* out,
               int64_t T, int64_t n_past, void* workspace, void* stream = nullptr);
// Decode and verification (T <= kAttnDecodeMaxT, f16 / bf16 K and V) with every per-token fact
// on the device, so one recorded CUDA graph serves any depth, slot and mix of sequences: token
// t (row t of q and out, as above) attends to rows [0, pos[t]] of k_caches[slot[t]] and
// v_caches[slot[t]] (device arrays of cache pointers; pos, slot: [T] int32 on the device).
// The grid has the most splits any depth needs (blocks past a token's keys return at once),
// and a token's splits are those of attention() at its key count: the same bits as an
// attention() call per token. workspace: attention_decode_workspace_bytes(s, T) bytes (no
// zeroing needed). Two launches. Throws for other types or T.
bool attention_decode_supported(const ref::AttentionShape& s, int64_t T);
size_t attention_decode_workspace_bytes(const ref::AttentionShape& s, int64_t T);
void attention_decode(const ref::AttentionShape& s, const float* q, const void* const* k_caches,
                      const void* const* v_caches, const int32_t* slot, const int32_t* pos, float* out, int64_t T,
                      void* workspace, void* stream = nullptr);

// ---- KV cache store (kernels/cuda/kv_store.cu) ----------------------------------------------
// ref::kv_store on device arrays, bit for bit: dst[0..n) = src[0..n) (fp32) stored as `type`:
// F32 copied (cudaMemcpyAsync), F16 / BF16 rounded to nearest even by alloy::fp32_to_fp16 /
// fp32_to_bf16's integer algorithms (subnormal halves, overflow to inf, NaN kept NaN with its
// sign and top payload bits, quieted); other types throw alloy::Error. src 4-byte and dst
// 2-byte aligned (16 / 8 for the vector path). One launch, graph-capturable.
void kv_store(const float* src, void* dst, GgmlType type, int64_t n, void* stream = nullptr);
// The same for T token rows of several sequences, every per-token fact on the device (so one
// recorded CUDA graph serves any depth and slot): row t of src [T, cols] (fp32, 16-byte
// aligned) goes to row pos[t] of the cache caches[slot[t]] ([n_ctx, cols] of `type`, 16-byte
// aligned rows); cols % 4 == 0. Bits as kv_store. The caller keeps pos[t] < n_ctx. One launch.
void kv_store_rows(const float* src, int64_t T, int64_t cols, void* const* caches, const int32_t* slot,
                   const int32_t* pos, GgmlType type, void* stream = nullptr);

}  // namespace alloy::cuda
