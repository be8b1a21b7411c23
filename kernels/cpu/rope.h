// Partial NeoX RoPE on the CPU, same contract as ref::rope_partial (kernels/ref/rope.h):
// within each head the first n_rot dims rotate, pairing (i, i + n_rot/2), theta_i =
// pos * base^(-2i/n_rot). cos/sin come from a table built once per batch of positions with
// the reference's own fp32 formulas (HF: inv_freq in fp32, theta = pos * inv_freq in fp32),
// so the table is bit-identical to the reference; the rotation rounds as the reference does
// (no FMA), so outputs agree within 1e-6 (in practice exactly).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// cos/sin of every (position, frequency) of one batch; q and k of every attention layer of a
// forward pass share it.
struct RopeTable {
    int64_t T = 0;
    int n_rot = 0;
    std::vector<float> cos, sin;  // [T, n_rot / 2]
};

// pos: [T] absolute positions. n_rot even.
RopeTable rope_table(const int32_t* pos, int64_t T, int n_rot, float base);

// x: [tab.T, n_heads, head_dim] rotated in place (head_dim >= tab.n_rot).
void rope_partial(const RopeTable& tab, float* x, int n_heads, int head_dim);
// Same on an explicit ISA path (tests).
void rope_partial(const RopeTable& tab, float* x, int n_heads, int head_dim, Isa isa);

// The per-head RMSNorm of q or k, then the rotation, as ref::rms_norm_rope: head (t, h) of x
// at x + (t * n_heads + h) * x_head_stride (2 * head_dim: the query half of the interleaved
// q/gate projection, read in place; head_dim: k, in place), out [tab.T, n_heads, head_dim].
// One pass per token with each head in L1; same bits as cpu::rms_norm then cpu::rope_partial.
void rms_norm_rope(const RopeTable& tab, const float* x, int64_t x_head_stride, const float* w, float* out, int n_heads,
                   int head_dim, float eps);
void rms_norm_rope(const RopeTable& tab, const float* x, int64_t x_head_stride, const float* w, float* out, int n_heads,
                   int head_dim, float eps, Isa isa);

// Drop-in for ref::rope_partial: builds the table for this call only.
void rope_partial(float* x, const int32_t* pos, int64_t T, int n_heads, int head_dim, int n_rot, float base);

}  // namespace alloy::cpu
