// Causal GQA attention on the CPU, same contract as ref::attention (kernels/ref/attention.h):
// query head h reads KV head h / (n_head / n_head_kv); token t (absolute position n_past + t)
// sees cache rows [0, n_past + t]. The caches are fp32, f16 or bf16 (s.type_k, s.type_v);
// 16-bit elements are converted exactly to fp32 as they are read. fp32 accumulation; within
// 1e-5 relative of the reference on the same cache bytes. One exception, by choice of cache:
// prefill (T > 4) with bf16 K and V on AVX512-BF16 rounds Q and the probabilities to bf16 and
// multiplies in bf16 pairs (fp32 sums), as GPU flash attention does with a bf16 cache: ~2x
// the products per instruction, ~1e-3 relative error (attention_uses_bf16_products).
//
// Flash-attention schedule (attention_block.h): the queries of one KV group and a few tokens
// form a block that streams K/V tiles once for all its rows, with an online softmax, so no
// [T, T] matrix is materialised; fully masked tiles are never visited. When there are too few
// blocks to feed the threads (decode, short batches over a long cache) the keys are also split
// and the partial softmax states merged, so a T = 1 step streams the cache on every thread.
// Cache rows at or past n_past + T are never read (they may be unbacked or garbage).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/ref/attention.h"

namespace alloy::cpu {

using ref::AttentionShape;

// q: [T, n_head, head_dim] fp32; k_cache, v_cache: [n_ctx, n_head_kv, head_dim] of s.type_k /
// s.type_v (F32, F16 or BF16, else alloy::Error) with rows [0, n_past + T) filled; out:
// [T, n_head, head_dim] fp32. Threads: the pool (thread_pool.h).
// workspace (kernels/cpu/workspace.h): attention_workspace_bytes(s, T, n_past) bytes, for
// n_threads() as it is when asked: one block scratch per pool thread, and for a call that
// splits its keys the partial softmax states, which grow with n_past + T in decode and
// verification (a cell per 256 keys) and are bounded by the pool size otherwise. The count
// also holds for a call of the same s and T with fewer past keys.
size_t attention_workspace_bytes(const AttentionShape& s, int64_t T, int64_t n_past);
void attention(const AttentionShape& s, const float* q, const void* k_cache, const void* v_cache, float* out,
               int64_t T, int64_t n_past, Isa isa, void* workspace);

// Without a workspace: one of the call's own (tests, test-ops).
void attention(const AttentionShape& s, const float* q, const void* k_cache,
               const void* v_cache, float* out, int64_t T, int64_t n_past);

// Same, on an explicit ISA path (tests, comparisons). Avx512 needs head_dim % 16 == 0 and
// Avx2 head_dim % 8 == 0; each falls back to the next path below otherwise.
void attention(const AttentionShape& s, const float* q, const void* k_cache,
               const void* v_cache, float* out, int64_t T, int64_t n_past, Isa isa);

// Whether a call of T tokens on this ISA path takes the bf16-products prefill path above
// (tests pick their tolerance from it). Decode and verification (T <= 4) never do.
bool attention_uses_bf16_products(const AttentionShape& s, int64_t T, Isa isa);

}  // namespace alloy::cpu
