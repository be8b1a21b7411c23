// Internals shared by the GDN reference kernels (gdn_delta.cpp, gdn_fused.cpp): argument
// checks at the op boundary and the two vector primitives the math is written with.
#pragma once
#include <cstdint>
#include <string>

#include "alloy/error.h"
#include "kernels/ref/gdn.h"

namespace alloy::ref::detail {

// Below this many multiply-adds an OpenMP region costs more than it saves (and on a loaded
// machine its barrier can wait for a descheduled thread): run it on the calling thread.
constexpr double kMinParallelWork = 1 << 18;

// sum_i a[i] b[i]. Eight partial sums so that the compiler can keep them in one vector
// register without -ffast-math (a plain serial sum cannot be reassociated); the order of
// summation is part of no contract (spec/GDN.md section 3 tests use tolerances).
inline float dot(const float* a, const float* b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// y += alpha * x
inline void axpy(float* y, float alpha, const float* x, int n) {
    for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Shapes and sequence offsets come from the caller (model code, a test, the CLI): bad ones
// are reported, never trusted.
inline void check_shape(const GdnShape& s, const char* op) {
    const std::string o = op;
    if (s.H_k < 1 || s.H_v < 1) throw Error(o + ": head counts H_k=" + std::to_string(s.H_k) +
                                            ", H_v=" + std::to_string(s.H_v) + " must be >= 1");
    if (s.H_v % s.H_k != 0)
        throw Error(o + ": H_v=" + std::to_string(s.H_v) + " is not a multiple of H_k=" +
                    std::to_string(s.H_k));
    if (s.d_k < 1 || s.d_v < 1) throw Error(o + ": head dims d_k=" + std::to_string(s.d_k) +
                                            ", d_v=" + std::to_string(s.d_v) + " must be >= 1");
}

inline void check_seq_offsets(int n_seqs, const int32_t* seq_offsets, const char* op) {
    const std::string o = op;
    if (n_seqs < 0) throw Error(o + ": n_seqs=" + std::to_string(n_seqs) + " is negative");
    if (seq_offsets == nullptr) throw Error(o + ": seq_offsets is null");
    if (seq_offsets[0] < 0)
        throw Error(o + ": seq_offsets[0]=" + std::to_string(seq_offsets[0]) + " is negative");
    for (int s = 0; s < n_seqs; ++s)
        if (seq_offsets[s + 1] < seq_offsets[s])
            throw Error(o + ": seq_offsets[" + std::to_string(s + 1) + "]=" +
                        std::to_string(seq_offsets[s + 1]) + " < seq_offsets[" +
                        std::to_string(s) + "]=" + std::to_string(seq_offsets[s]));
}

inline void check_ptr(const void* p, const char* op, const char* name) {
    if (p == nullptr) throw Error(std::string(op) + ": " + name + " is null");
}

// The arguments of the fused layer op (ref::gdn_fused and every backend's): parameters,
// offsets, and the pointers the call will touch (none when there are no tokens).
inline void check_fused_args(const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
                             const float* qkv, const float* z, const float* a, const float* b,
                             const float* conv_state, const float* state, const float* y, const char* op) {
    check_shape(p.shape, op);
    check_seq_offsets(n_seqs, seq_offsets, op);
    if (p.conv_kernel < 1)
        throw Error(std::string(op) + ": conv_kernel=" + std::to_string(p.conv_kernel) + " must be >= 1");
    if (p.mode == GdnMode::Chunked && p.chunk_size < 1)
        throw Error(std::string(op) + ": chunk_size=" + std::to_string(p.chunk_size) + " must be >= 1");
    if (!(p.eps >= 0.0f)) throw Error(std::string(op) + ": eps must be >= 0");
    if (n_seqs == 0) return;
    check_ptr(state, op, "state");
    if (p.conv_kernel > 1) check_ptr(conv_state, op, "conv_state");
    if (seq_offsets[n_seqs] > seq_offsets[0]) {
        check_ptr(qkv, op, "qkv");
        check_ptr(z, op, "z");
        check_ptr(a, op, "a");
        check_ptr(b, op, "b");
        check_ptr(y, op, "y");
        check_ptr(w.conv1d, op, "weights.conv1d");
        check_ptr(w.ssm_a, op, "weights.ssm_a");
        check_ptr(w.dt_bias, op, "weights.dt_bias");
        check_ptr(w.norm, op, "weights.norm");
    }
}

}  // namespace alloy::ref::detail
