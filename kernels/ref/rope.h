// Partial NeoX RoPE, reference (spec/MODEL.md section 5): within each head only the first
// n_rot dims rotate, pairing (i, i + n_rot/2); theta_i = pos * base^(-2i/n_rot).
// For text-only input Qwen3.5's interleaved M-RoPE reduces exactly to this.
#pragma once
#include <cstdint>

namespace alloy::ref {

// x: [T, n_heads, head_dim] rotated in place; pos: [T] absolute positions.
void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot,
                  float base);
// The per-head RMSNorm of q or k and then the RoPE (spec/MODEL.md section 4 steps 2-3): head
// (t, h) of x starts at x + (t * n_heads + h) * x_head_stride (2 * head_dim for the query
// half of the interleaved q/gate projection, head_dim for k); out: [T, n_heads, head_dim]
// (may alias x when x_head_stride == head_dim).
void rms_norm_rope(const float* x, int64_t x_head_stride, const float* w, float* out, const int32_t* pos, int64_t T,
                   int n_heads, int head_dim, int n_rot, float base, float eps);

}  // namespace alloy::ref
