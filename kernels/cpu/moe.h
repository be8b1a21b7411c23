// Mixture-of-experts FFN of a Qwen3.5 MoE layer on the CPU, same contract as ref::moe_ffn
// (kernels/ref/moe.h). The router product and routing run once for all T tokens; the
// token-expert pairs are then sorted by expert so each chosen expert runs one gate/up/down
// product over all its tokens (its weights read once per call, GEMM tiles when it has more
// than 4 tokens), the experts spread over the pool's threads (one expert's products on one
// thread); the shared expert runs over all T. Each token then sums its experts' outputs in
// increasing expert id (as transformers does), then the gated shared expert. Scratch is
// O(T k D + threads T (D + I)).
//
// Numerics: every product is cpu::matmul's (kernels/cpu/matmul.h, per weight type). A call of
// up to 4 tokens gives every expert at most 4 tokens, so row t has the bits of a 1-token call
// on row t (speculative verification reproduces decode); longer calls may differ in the last
// bits where the matmul's GEMM path does.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/ref/moe.h"

namespace alloy::cpu {

// x: [T, D]; y: [T, D] (must not alias x). Throws alloy::Error on inconsistent weights.
// workspace (kernels/cpu/workspace.h): moe_ffn_workspace_bytes(w, T, isa) bytes (routing, the
// gathered rows, the products' matmul workspace); the overloads without one allocate their own.
size_t moe_ffn_workspace_bytes(const ref::MoeWeights& w, int64_t T, Isa isa = active_isa());
void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T, Isa isa, void* workspace);
void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T);
// Same on an explicit ISA path (tests, comparisons).
void moe_ffn(const ref::MoeWeights& w, const float* x, float* y, int64_t T, Isa isa);

}  // namespace alloy::cpu
