// Partial NeoX RoPE, reference (spec/MODEL.md section 5): within each head only the first
// n_rot dims rotate, pairing (i, i + n_rot/2); theta_i = pos * base^(-2i/n_rot).
// For text-only input Qwen3.5's interleaved M-RoPE reduces exactly to this.
#pragma once
#include <cstdint>

namespace alloy::ref {

// x: [T, n_heads, head_dim] rotated in place; pos: [T] absolute positions.
void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot,
                  float base);

}  // namespace alloy::ref
