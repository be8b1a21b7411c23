// Causal GQA attention on the CPU, same contract as ref::attention (kernels/ref/attention.h):
// query head h reads KV head h / (n_head / n_head_kv); token t (absolute position n_past + t)
// sees cache rows [0, n_past + t]. fp32 accumulation; within 1e-5 relative of the reference.
//
// Flash-attention schedule (attention_block.h): the queries of one KV group and a few tokens
// form a block that streams K/V tiles once for all its rows, with an online softmax, so no
// [T, T] matrix is materialised; fully masked tiles are never visited. When there are too few
// blocks to feed the threads (decode, short batches over a long cache) the keys are also split
// and the partial softmax states merged, so a T = 1 step streams the cache on every thread.
#pragma once
#include "kernels/cpu/cpu_features.h"
#include "kernels/ref/attention.h"

namespace alloy::cpu {

using ref::AttentionShape;

// q: [T, n_head, head_dim]; k_cache, v_cache: [n_ctx, n_head_kv, head_dim] with rows
// [0, n_past + T) filled; out: [T, n_head, head_dim]. Threads: the pool (thread_pool.h).
void attention(const AttentionShape& s, const float* q, const float* k_cache,
               const float* v_cache, float* out, int64_t T, int64_t n_past);

// Same, on an explicit ISA path (tests, comparisons). Avx512 needs head_dim % 16 == 0 and
// falls back to the portable path otherwise; Avx2 runs the portable path.
void attention(const AttentionShape& s, const float* q, const float* k_cache,
               const float* v_cache, float* out, int64_t T, int64_t n_past, Isa isa);

}  // namespace alloy::cpu
