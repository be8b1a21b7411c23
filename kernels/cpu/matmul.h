// Matrix product with a GGUF weight on the CPU: y[t][o] = sum_i W[o][i] * x[t][i],
// x: [T, n_in] fp32, y: [T, n_out] fp32 (must not alias x). Threads: the kernels/cpu pool.
//
// Numerical contract per weight type, against ref::matmul (double accumulation). "Effective
// input" is matmul_effective_input(): the activations as the kernel consumes them.
//   F32, F16, Q5_0, Q5_1: fp32 activations, fp32 sums (in chunks of <= 512):
//       ||y - ref(x)|| <= 1e-5 ||ref(x)||.
//   BF16: activations rounded to bf16 (nearest even), as llama.cpp (vec_dot_type BF16);
//       products exact, fp32 sums: <= 1e-5 against ref on the effective input,
//       ~1e-3 against ref(x) (bf16 has 8 significant bits).
//   Q8_0 (and Q4_0, IQ4_NL, MXFP4): activations quantized per 32 exactly as ggml's x86 quantize_row_q8_0
//       (d = amax/127 rounded to fp16, q = nearest-even(x * 127/amax)); exact integer block
//       sums scaled by d_w * d_x in fp32 and summed in fp32, as ggml_vec_dot_q8_0_q8_0, so
//       results track llama.cpp's: <= 1e-5 against ref on the effective input, ~1e-2 against
//       ref(x) (int8 activations).
// Within one ISA path, results never depend on the thread count, and row t of a call of up to
// 4 tokens has the same bits as a 1-token call on row t (speculative verification reproduces
// decode exactly). Long calls (T > 4, GEMM tiles) give the same bits too, except Q8_0 and
// BF16 on AVX-512, whose decode kernels are streaming GEMVs (matmul_q8_gemv_avx512.cpp,
// matmul_bf16_gemv_avx512.cpp) that sum in their own order for bandwidth, and Q8_0 and BF16
// on AVX2 (their row-dot sums 8 lanes over k, their GEMM tile each output in k or block
// order). F32, F16 and the dequantized types give every T the same bits on every path (the
// AVX2 F32/F16 row-dot puts 8 rows in the lanes and sums in the AVX2 tile's order).
// Different ISA paths differ in the last bits.
//
// Paths (Isa is clamped to what this CPU and ALLOY_ISA allow):
//   AVX-512: Q8_0 vpdpbusd (VNNI), BF16 vdpbf16ps, F32/F16 FMA. T > 4: register-tiled GEMM,
//   weights broadcast from their GGUF rows against 16-token activation panels (no repacking).
//   T <= 4 (decode): Q8_0 and BF16 run streaming GEMVs (4 rows side by side per thread);
//   F32/F16 read 16 weight rows per kernel call in the 16 lanes, transposed in registers so
//   the arithmetic per output is the GEMM tile's, in its order.
//   Without VNNI / AVX512-BF16 those types fall to AVX2. AVX2+FMA: T > 4 runs GEMM tiles on
//   the same panels (Q8_0: vpmaddubsw, 3 rows x 16 tokens; BF16, F32, F16 and the dequantized
//   types: fp32 FMA, 3 rows x 32 tokens), T <= 4 streaming GEMVs (Q8_0, BF16) or the row-dot
//   (F32/F16: 8 rows in the lanes, as AVX-512's 16). Scalar: row-dot kernels.
//   Q4_0, IQ4_NL: decode (T <= 4) streams the packed blocks against Q8_0 activations (ggml's
//   vec_dot_q4_0_q8_0 / _iq4_nl_q8_0); prefill turns each item's rows into Q8_0 rows (exact)
//   for the Q8_0 GEMM tiles; scalar dequantizes to fp32 on Q8_0-rounded activations. All
//   compute one function (the effective input is Q8_0-rounded). MXFP4: the same GEMVs; its
//   prefill takes the Q8_0 tiles when every block scale is an exact f16 (e in 104..143, so
//   practically always), else fp32 rows on the Q8_0-rounded activations.
//   K-quants: matmul_kquant.h (Q8_K activations). Other types: rows dequantized to fp32.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/workspace.h"
#include "kernels/ref/weight.h"

namespace alloy::cpu {

// Scratch (kernels/cpu/workspace.h): the prepared activations, the rounded input of K-quant /
// Q4_0 prefill, and per pool thread the GEMM tiles or converted rows. Three ways to give it:
//  - `void* workspace` of *_workspace_bytes(same weights, T, isa) bytes (the model's plans);
//    the count holds for every call of up to T tokens on those weights;
//  - a MatmulScratch the caller keeps, which grows to the largest call it has served;
//  - none (the overloads without Isa): a workspace of the call's own, allocated per call.
using MatmulScratch = ScratchBuffer;

size_t matmul_workspace_bytes(const WeightView& W, int64_t T, Isa isa = active_isa());
void matmul(const WeightView& W, const float* x, float* y, int64_t T, Isa isa, void* workspace);
void matmul(const WeightView& W, const float* x, float* y, int64_t T);
void matmul(const WeightView& W, const float* x, float* y, int64_t T, Isa isa, MatmulScratch& scratch);

// Several weights applied to the same input x: outs[i].y = x W_i^T, each exactly as matmul()
// would compute it (same bits). When the weights share type and n_in (and n <= 8), the
// activations are prepared once and the work items of all of them run in one pool region,
// so a thread that finishes one weight's rows moves on to the next weight's instead of
// waiting at a barrier (decode streams the weights back to back). Otherwise: one call each.
struct MatmulOut {
    const WeightView* W;
    float* y;  // [T, W->n_out]
};
// (outs[i].y is not read by the byte count.)
size_t matmul_multi_workspace_bytes(const MatmulOut* outs, int n, int64_t T, Isa isa = active_isa());
void matmul_multi(const MatmulOut* outs, int n, const float* x, int64_t T, Isa isa, void* workspace);
void matmul_multi(const MatmulOut* outs, int n, const float* x, int64_t T);
void matmul_multi(const MatmulOut* outs, int n, const float* x, int64_t T, Isa isa, MatmulScratch& scratch);

// The first half of a SwiGLU MLP: y = silu(x gate^T) * (x up^T), [T, n_out], the same bits as
// matmul_multi into y and u and then cpu::swiglu(y, u, y). On the GEMM path (T > 4, gate and
// up of one type and shape) each work item combines its gate and up tiles before their one
// store, so neither product is written out and read back; otherwise it is exactly that
// sequence, with u ([T, n_out]) as the second output.
size_t matmul_swiglu_workspace_bytes(const WeightView& gate, const WeightView& up, int64_t T, Isa isa = active_isa());
void matmul_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* y, float* u, int64_t T, Isa isa,
                   void* workspace);
void matmul_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* y, float* u, int64_t T);
void matmul_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* y, float* u, int64_t T, Isa isa,
                   MatmulScratch& scratch);

// The activations as the kernels for weight type `wtype` consume them (Q8_0: quantized then
// dequantized; BF16: rounded to bf16; other types: unchanged). x, out: [T, n_in].
void matmul_effective_input(GgmlType wtype, const float* x, float* out, int64_t T, int64_t n_in);

// Which kernel path matmul takes, e.g. "avx512-vnni gemm" (for logs, profiles and test names).
std::string matmul_path(GgmlType wtype, Isa isa, int64_t n_in, int64_t T);

// A Q8_0 matrix repacked in place as WeightLayout::Q8Rows16 (kernels/cpu/matmul_kernels.h: the
// zmm GEMV for up to 16 tokens, the VNNI tiles read it in place, other paths unpack rows; the
// same bits), or a Q4_K, Q5_K, Q6_K or IQ4_XS matrix repacked in place for the CPU kernels (WeightLayout::KqRows16,
// kernels/cpu/matmul_kquant.h: 16 rows interleaved, rows in SIMD lanes for the decode GEMVs; the
// prefill tiles, the scalar paths and row gathers unpack rows from it; the same results bit for
// bit). `data` is W.data, writable; W.layout is set. False (nothing changed) for other types,
// other layouts, fewer than 16 rows, or a view of part of each row (row_bytes past n_in). Runs
// on the thread pool.
bool repack_weight(WeightView& W, uint8_t* data);
// Rows a repacked group holds (both layouts): a view of rows [r0, r0 + n) of a repacked matrix
// keeps its layout only where r0 and n are multiples of it (the MoE experts' slices).
constexpr int64_t kRepackGroupRows = 16;
// Whether the model loaders repack matrices of type t: Q8_0 where AVX512-VNNI runs unless
// ALLOY_Q8_REPACK=0; K-quants: ALLOY_KQ_REPACK unset or 1: every type
// that has the layout; 0: none (A/B); else a comma list of type names (q4_k,q5_k,q6_k,iq4_xs).
bool repack_enabled(GgmlType t);
// Row r of W as GGUF bytes whatever its layout: W.row(r), or unpacked into buf (W.row_bytes).
const uint8_t* weight_row(const WeightView& W, int64_t r, uint8_t* buf);

}  // namespace alloy::cpu
