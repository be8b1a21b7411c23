// Internals shared by the CPU GDN kernels (gdn_delta.cpp, gdn_chunked.cpp, gdn_fused.cpp):
// the delta-rule inputs with explicit row strides, so that the fused op can pass views into
// its conv output ([T, conv_dim] rows holding q | k | v) without copying them out.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "alloy/error.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/ref/gdn.h"

namespace alloy::cpu::gdn {

struct DeltaIo {
    ref::GdnShape shape;
    int n_seqs = 0;
    const int32_t* offs = nullptr;  // [n_seqs + 1] token offsets
    const float* q = nullptr;       // row t at q + t * qk_stride: [H_k, d_k]
    const float* k = nullptr;       // row t at k + t * qk_stride: [H_k, d_k]
    const float* v = nullptr;       // row t at v + t * v_stride:  [H_v, d_v]
    const float* g = nullptr;       // [T, H_v]
    const float* beta = nullptr;    // [T, H_v]
    float* state = nullptr;         // [slots, H_v, d_v, d_k]
    const int32_t* slots = nullptr; // [n_seqs] slot of each sequence in state (nullptr: slot = seq)
    float* out = nullptr;           // [T, H_v, d_v]
    int64_t qk_stride = 0, v_stride = 0;

    const float* q_at(int64_t t, int kh) const { return q + t * qk_stride + (int64_t)kh * shape.d_k; }
    const float* k_at(int64_t t, int kh) const { return k + t * qk_stride + (int64_t)kh * shape.d_k; }
    const float* v_at(int64_t t, int h) const { return v + t * v_stride + (int64_t)h * shape.d_v; }
    float* out_at(int64_t t, int h) const { return out + (t * shape.H_v + h) * shape.d_v; }
    // The [d_v, d_k] state of value head h of sequence seq.
    float* state_at(int seq, int h) const {
        const std::size_t slot = slots ? (std::size_t)slots[seq] : (std::size_t)seq;
        return state + (slot * shape.H_v + h) * shape.d_v * shape.d_k;
    }
};

// Arguments are checked by the public entry points (check_delta_args: the ref's checks, same
// messages); these trust io. delta_chunked's workspace (kernels/cpu/workspace.h):
// delta_chunked_workspace_bytes(shape, n_seqs, n_tokens, chunk_size) bytes for n_seqs
// sequences of n_tokens in all.
void delta_serial(Isa isa, const DeltaIo& io);
size_t delta_chunked_workspace_bytes(const ref::GdnShape& shape, int n_seqs, int n_tokens, int chunk_size);
void delta_chunked(Isa isa, const DeltaIo& io, int chunk_size, void* workspace);

void check_delta_args(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                      const float* k, const float* v, const float* g, const float* beta, float* state,
                      float* out, const char* op);
// The DeltaIo of the public layouts (q, k: [T, H_k, d_k]; v: [T, H_v, d_v]).
DeltaIo dense_io(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                 const float* k, const float* v, const float* g, const float* beta, float* state,
                 float* out);

// A path above what this CPU runs is a caller error, reported rather than crashing on SIGILL.
inline void check_isa(Isa isa, const char* op) {
    if ((int)isa > (int)active_isa())
        throw Error(std::string(op) + ": ISA path " + isa_name(isa) + " requested, but this CPU (or ALLOY_ISA) allows only " +
                    isa_name(active_isa()));
}

}  // namespace alloy::cpu::gdn
