// Gated DeltaNet on NVIDIA GPUs, same contracts as kernels/ref/gdn.h with every array in
// device memory. The serial delta rule is the decode and verification kernel: each warp
// keeps columns of a head's state in registers for all the tokens of its sequence, so the
// state is read and written once per call, and a token's arithmetic is the same whatever the
// call's length (a verification call of T tokens reproduces T decode calls bit for bit).
// No CUDA types here: host code that does not include cuda_runtime.h can call these.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/ref/gdn.h"

namespace alloy::cuda {

// Whether a CUDA device is present and usable (tests skip without one).
bool device_available();

// ref::gdn_delta_serial on device arrays (seq_offsets too); d_k <= 256. `stream` is a
// cudaStream_t (nullptr: the default stream). Asynchronous; throws alloy::Error naming the op
// for shapes it cannot run or a failed launch.
void gdn_delta_serial(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                      const float* k, const float* v, const float* g, const float* beta, float* state, float* out,
                      void* stream = nullptr);

// ref::gdn_fused in the serial mode (decode, verification; the chunked prefill kernel is not
// built yet) on device arrays: qkv [n_tokens, conv_dim], z [n_tokens, H_v d_v], a, b
// [n_tokens, H_v], conv_state, state and y as in ref::gdn_fused, seq_offsets [n_seqs + 1]
// (device) with seq_offsets[n_seqs] <= n_tokens; weights (GdnWeights) on the device too.
// workspace: gdn_fused_workspace_bytes(p, n_tokens) bytes of device memory, 16-byte aligned
// (the caller owns it, as a recorded plan owns its buffers). conv_kernel <= 8.
size_t gdn_fused_workspace_bytes(const ref::GdnParams& p, int n_tokens);
void gdn_fused(const ref::GdnParams& p, const ref::GdnWeights& w, int n_seqs, const int32_t* seq_offsets, int n_tokens,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state, float* state,
               float* y, void* workspace, void* stream = nullptr);

}  // namespace alloy::cuda
