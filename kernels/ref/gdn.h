// Gated DeltaNet, reference kernels. Math: spec/GDN.md; layer: spec/MODEL.md section 3.
//
// Two levels:
//  * the delta rule core (gdn_delta_serial / gdn_delta_chunked): q, k, v, g, beta -> o, with
//    the recurrent state carried in place;
//  * the fused layer op (gdn_fused): causal conv1d + SiLU over the projected qkv, L2 norm of
//    q/k, the gates, the delta rule (serial or chunked), and the gated RMSNorm; the conv state
//    and the recurrent state are mutable inputs. The projections (qkv, z, a, b, out) are
//    matmuls outside this op.
//
// Layout conventions (all fp32, row-major, token-major):
//  * Tokens of several sequences are concatenated; seq_offsets[0..n_seqs] are the token
//    offsets (seq s owns tokens [seq_offsets[s], seq_offsets[s+1])). Sequences may be empty.
//  * Recurrent state: [n_seqs, H_v, d_v, d_k], i.e. each head stores S transposed
//    (state[j*d_k + i] = S[i][j]) so that S^T k, S^T q and the rank-1 update are contiguous
//    per value column j (the llama.cpp layout, spec/GDN.md section 1).
//  * Conv state: [n_seqs, conv_dim, K-1], the last K-1 pre-conv inputs per channel, oldest first.
//  * Key head of value head h: `tiled` (GGUF from llama.cpp's converter): h % H_k;
//    otherwise grouped (HF order): h / (H_v / H_k).
#pragma once
#include <cstdint>

namespace alloy::ref {

struct GdnShape {
    int H_k = 0;        // key heads
    int H_v = 0;        // value heads, a multiple of H_k
    int d_k = 0;        // key head dim
    int d_v = 0;        // value head dim
    bool tiled = true;  // value head h reads key head h % H_k (else h / (H_v/H_k))
    int key_head(int h) const { return tiled ? h % H_k : h / (H_v / H_k); }
};

enum class GdnMode { Serial, Chunked };

// Delta rule core. q, k: [T, H_k, d_k] (already L2-normalised; q already scaled by
// 1/sqrt(d_k)); v: [T, H_v, d_v]; g (log decay, <= 0) and beta: [T, H_v];
// state: [n_seqs, H_v, d_v, d_k] in/out; out: [T, H_v, d_v].
// Serial: token by token, exactly the recurrence of spec/GDN.md section 1.
void gdn_delta_serial(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                      const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* out);
// Chunked: spec/GDN.md section 2, chunk size C (any C >= 1; tested with 8, 16, 32, 64),
// stage 1 per (seq, chunk, head) in parallel, stage 2 the scan over chunks.
void gdn_delta_chunked(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size);

// How stage 1 of the chunked form computes T = (I + A)^-1 (A strictly lower triangular,
// spec/GDN.md section 4). Substitution: row by row, ~n^3/6 FMAs (the default). Squaring:
// the nilpotent product prod_m (I + N^(2^m)), N = -A, with ceil(log2 n) factors (exact for
// any n, not only powers of two), ~2 log2(n) dense n x n matmuls: the GPU-style variant,
// kept here so its fp32 behaviour is tested against substitution.
enum class TriInverse { Substitution, Squaring };
void gdn_delta_chunked(const GdnShape& shape, int n_seqs, const int32_t* seq_offsets,
                       const float* q, const float* k, const float* v, const float* g,
                       const float* beta, float* state, float* out, int chunk_size,
                       TriInverse inverse);

// T = (I + A)^-1 for an n x n row-major A whose strictly lower triangle is read (the rest is
// ignored); T: [n, n] row-major, unit lower triangular. Exposed for tests.
void gdn_tri_inverse(int n, const float* A, float* T, TriInverse inverse);

// Weights of one GDN layer, as stored in GGUF (spec/GGUF.md section 5), all fp32.
struct GdnWeights {
    const float* conv1d = nullptr;  // [conv_dim, K]   taps of a channel contiguous, oldest first
    const float* ssm_a = nullptr;   // [H_v]           -exp(A_log)
    const float* dt_bias = nullptr; // [H_v]
    const float* norm = nullptr;    // [d_v]           gated RMSNorm weight (plain, not +1)
};

struct GdnParams {
    GdnShape shape;
    int conv_kernel = 4;     // K
    float eps = 1e-6f;       // RMSNorm and L2-norm epsilon
    GdnMode mode = GdnMode::Chunked;
    int chunk_size = 64;
};

// Fused layer op. qkv: [T, conv_dim] pre-conv projections (rows [Q | K | V]);
// z: [T, H_v*d_v]; a, b: [T, H_v]; conv_state: [slots, conv_dim, K-1] in/out;
// state: [slots, H_v, d_v, d_k] in/out; y: [T, H_v*d_v] (gated-normed, before out_proj).
// conv_dim = 2*H_k*d_k + H_v*d_v.
// seq_slots: [n_seqs] the state slot of each sequence (distinct; the caller's state arrays hold
// every slot named), so a batch of sequences updates their slots of a slot state cache in place;
// nullptr means sequence s uses slot s (slots = n_seqs).
void gdn_fused(const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
               const float* qkv, const float* z, const float* a, const float* b,
               float* conv_state, float* state, float* y, const int32_t* seq_slots = nullptr);

}  // namespace alloy::ref
