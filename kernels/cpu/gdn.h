// Gated DeltaNet on the CPU: the same ops, names, layouts and argument checks as the
// references in kernels/ref/gdn.h (read that header for the contract), vectorized with
// AVX-512 and parallel over the thread pool (kernels/cpu/thread_pool.h). Math: spec/GDN.md.
//
// Numerical contracts (fp32 throughout; tests/kernels/test_gdn_cpu.cpp checks them):
//  * gdn_delta_serial: within 1e-5 relative of ref::gdn_delta_serial. Its own results ARE the
//    decode path's (and speculative verification's): deterministic, independent of the thread
//    count, and T tokens in one call are bit-identical to the same tokens in T calls of one.
//    It reads S^T q before the write, o = alpha (S^T q) + delta (k . q), the same value as the
//    ref's read after the write, in another summation order.
//  * gdn_delta_chunked: within 1e-5 relative of ref::gdn_delta_serial (spec/GDN.md section 2,
//    T = (I + A)^-1 by blocked substitution: 16x16 diagonal blocks, GEMM block merges).
//    Also independent of the thread count.
//  * gdn_fused: within 1e-5 relative of ref::gdn_fused in the same mode; the conv state it
//    writes back is bit-identical (it is a copy of inputs).
//
// The overloads taking an Isa run that path explicitly (tests run every path the CPU has);
// the others use active_isa(). Isa::Avx2 has its own serial delta rule (d_k % 8 == 0), conv,
// norms and chunked-form matrix products (gdn_gemm.cpp); the rest of its path is the portable
// code. Asking for an
// ISA above active_isa() throws alloy::Error.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/ref/gdn.h"

namespace alloy::cpu {

using ref::GdnMode;
using ref::GdnParams;
using ref::GdnShape;
using ref::GdnWeights;

// q, k: [T, H_k, d_k]; v: [T, H_v, d_v]; g, beta: [T, H_v]; state: [n_seqs, H_v, d_v, d_k]
// (transposed per head) in/out; out: [T, H_v, d_v].
void gdn_delta_serial(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                      const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out);
void gdn_delta_serial(Isa isa, const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                      const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out);

// Chunk size C >= 1 (any; 64 and 16 are the tuned sizes).
void gdn_delta_chunked(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size);
void gdn_delta_chunked(Isa isa, const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size);

// qkv: [T, conv_dim]; z: [T, H_v*d_v]; a, b: [T, H_v]; conv_state: [slots, conv_dim, K-1]
// in/out; state: [slots, H_v, d_v, d_k] in/out; y: [T, H_v*d_v]; seq_slots: [n_seqs] each
// sequence's slot (nullptr: slot s), as ref::gdn_fused. A sequence's bits do not depend on the
// other sequences of the call nor on its slot.
// workspace (kernels/cpu/workspace.h): gdn_fused_workspace_bytes(p, n_seqs, T) bytes (the
// conv output, the delta rule's output, the chunked mode's states and stage-1 products; the
// signature of cuda::gdn_fused_workspace_bytes). The overloads without one allocate their own.
size_t gdn_fused_workspace_bytes(const GdnParams& p, int n_seqs, int n_tokens);
void gdn_fused(Isa isa, const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state, float* state,
               float* y, const int32_t* seq_slots, void* workspace);
void gdn_fused(const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
               const float* qkv, const float* z, const float* a, const float* b,
               float* conv_state, float* state, float* y, const int32_t* seq_slots = nullptr);
void gdn_fused(Isa isa, const GdnParams& p, const GdnWeights& w, int n_seqs,
               const int32_t* seq_offsets, const float* qkv, const float* z, const float* a,
               const float* b, float* conv_state, float* state, float* y,
               const int32_t* seq_slots = nullptr);

}  // namespace alloy::cpu
