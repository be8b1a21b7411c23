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

// ref::gdn_fused on device arrays: qkv [n_tokens, conv_dim], z [n_tokens, H_v d_v], a, b
// [n_tokens, H_v], conv_state, state and y as in ref::gdn_fused, seq_offsets [n_seqs + 1]
// (device) with seq_offsets[n_seqs] <= n_tokens; weights (GdnWeights) on the device too.
// workspace: gdn_fused_workspace_bytes(p, n_seqs, n_tokens) bytes of device memory, 16-byte
// aligned (the caller owns it, as a recorded plan owns its buffers; the three-launch path and
// the chunked mode use it; its size depends on p.mode and on n_seqs: size it for the call's
// largest n_seqs and n_tokens). conv_kernel <= 8. Asynchronous on `stream` (a cudaStream_t),
// no host synchronization, graph-capturable (every call of a shape after the first).
// seq_slots: as in ref::gdn_fused (conv_state [slots, conv_dim, K-1], state [slots, H_v, d_v,
// d_k]; sequence s updates slot seq_slots[s], the slots distinct), but a device pointer to
// [n_seqs] int32, read by the kernels (a captured graph replays with whatever slots the array
// holds then); nullptr: sequence s uses slot s. A sequence's bits depend neither on its slot
// nor on the other sequences of the call (both modes).
//
// p.mode == Serial (decode, verification): three paths, the same contract (each token's bits
// are those of its sequence's decode calls on either path; the paths round differently in the
// last bits from ref, ~1e-6 relative):
//  * OneLaunch (kernels/cuda/gdn.cu, fused_split_kernel / fused_serial_kernel): a thread-block
//    cluster per (sequence, key head) does conv + SiLU, the q/k L2 norms, the gates, the delta
//    rule and the gated RMSNorm in one kernel; H_v / H_k <= 8 (else alloy::Error);
//  * ThreeLaunches: conv + SiLU, the delta rule with norms and gates, the gated RMSNorm;
//  * Auto: one launch while its clusters fit on the device at once (small batches: decode at
//    B = 1), else three (their short blocks overlap better in waves).
// p.mode == Chunked (prefill) with d_k = d_v = 128 and chunk_size = 64: one path (`path` is
// ignored), six launches: conv + SiLU with the q/k L2 norms (q scaled by 1/sqrt(d_k)) and the
// gates, q/k/v rounded to bf16 into the workspace (chunked_prep_kernel, tokens in parallel;
// qkv must be 16-byte aligned, else alloy::Error); the new conv state; gdn_delta_chunked
// (three launches: bf16 tensor cores, fp32 state, o in bf16 into the workspace); the gated
// RMSNorm into y (fp32). n_tokens <= 65535 * 64. Error against ref::gdn_fused in the chunked
// mode (fp32): ~3-4e-3 relative (Frobenius) for y and the state (measured on the H200:
// 2.9-3.6e-3 per sequence for y, 3.2e-3 for the state; <= 7e-3 for any one token's row), from
// the bf16 rounding of q, k, v and o; tests/cuda bound it by 1e-2 per sequence and slot and
// 5e-2 per token. The conv state is exact (copies of inputs). Any other d_k, d_v or
// chunk_size in the chunked mode runs the serial mode instead (same function, fp32
// throughout, its bits; `path` then picks as above), so a model of any shape runs: no error
// is thrown for them.
// y_bf16 (optional, [n_tokens, H_v d_v]): y also rounded to bf16 (nearest even) for the call's
// rows, every path (the gated RMSNorm writes it; the one-launch paths convert after): the input
// of a prefill GEMM (cuda::MatmulInput::b), which then skips its own conversion.
// state_settled: nothing launched on `stream` since its last full serialization point (a host
// synchronization, a copy, the start of a graph launched after one) writes this call's slots of
// state and conv_state, nor seq_offsets or seq_slots (a model's decode step: each layer's op
// runs once, its state written by an earlier step). The one-launch split kernel then loads
// them and the weights before waiting for the previous kernel (PDL), only the token's rows
// after; the bits are the same either way.
enum class GdnFusedPath { Auto, OneLaunch, ThreeLaunches };
size_t gdn_fused_workspace_bytes(const ref::GdnParams& p, int n_seqs, int n_tokens);
void gdn_fused(const ref::GdnParams& p, const ref::GdnWeights& w, int n_seqs, const int32_t* seq_offsets, int n_tokens,
               const float* qkv, const float* z, const float* a, const float* b, float* conv_state, float* state,
               float* y, void* workspace, void* stream = nullptr, GdnFusedPath path = GdnFusedPath::Auto,
               const int32_t* seq_slots = nullptr, uint16_t* y_bf16 = nullptr, bool state_settled = false);

// ref::gdn_delta_chunked on device arrays (chunk size 64, d_k = d_v = 128 only; other dims and
// chunk sizes throw alloy::Error naming the field). Two stages with bf16 tensor-core products,
// fp32 accumulation and an fp32 state (kernels/cuda/gdn_chunked.cu); expect ~4e-3 relative
// error against an fp32 recurrence, as for fla's bf16 kernels.
//
// The engine's entry: q, k [n_tokens, H_k, 128] and v [n_tokens, H_v, 128] in bf16 (raw bit
// patterns, 16-byte aligned), g, beta [n_tokens, H_v] and state [n_seqs, H_v, 128, 128] in
// fp32, out [n_tokens, H_v, 128] in bf16; seq_offsets [n_seqs + 1] on the device with
// seq_offsets[n_seqs] <= n_tokens (rows outside the sequences are neither read as data nor
// written). workspace: gdn_delta_chunked_workspace_bytes(shape, n_seqs, n_tokens) bytes of
// device memory, 16-byte aligned, owned by the caller. Asynchronous on `stream` (a
// cudaStream_t), graph-capturable. block_v: value columns per scan block (16, 32 or 64; 0 picks
// by the launch gate, gdn_delta_chunked_block_v; the bits do not depend on it). seq_slots: as
// in gdn_fused (device [n_seqs] int32, state [slots, H_v, 128, 128]; nullptr: slot = sequence).
// The scan kernel: one warp group issuing every product of a chunk step, or two groups, one
// running the chain from each chunk's state to the next and one the chunk's output behind it
// (the same bits as one group; at 64 columns only TwoGroupsProducer, below); or Wgmma: fla's
// rearrangement (W, U precomputed) on Hopper's warpgroup MMA, two products a step (other bits, ~fla's
// rounding; any split; only when asked for, with the Wgmma workspace); or WarpRows: every warp
// runs the whole chunk step for its own 16 value columns from registers (block_v 16, 32, 64 or
// 128 = 1, 2, 4 or 8 warps a block; the same bits as one group). Auto =
// gdn_delta_chunked_scan(block_v).
// Transition: the chunk step as one affine map of the state (S <- e^{G_C} S + Pn S + Kd^T U, Pn
// from a stage 1t), block_v 16 only, its own workspace (other bits; only when asked for).
// TwoGroups: the two-group scan with every tile by 16-byte cp.async (ALLOY_GDN_SCAN=2).
// TwoGroupsTma: the same with its whole chunks' K, T, Q and QKM tiles brought by TMA tensor
// copies into 128-byte swizzled tiles (same bits; ALLOY_GDN_SCAN=5). TwoGroupsProducer: those
// copies issued by a ninth warp (same bits; what Auto picks at 16 and 32 columns since session
// 38 until 42 at 16 and 32, at 64 since session 41; ALLOY_GDN_SCAN=6). Chains: per 16 value
// columns two state warps holding S^T in registers (split by state columns) run the chain, two
// output warps beside them, the producer warp's TMA rings (block_v 16 or 32, 64 runs as 32;
// segments as two groups; same bits; ALLOY_GDN_SCAN=7; needs the driver's tensor-map encoder):
// Auto's pick at 16 and 32 columns since session 42.
enum class GdnScan { Auto, OneGroup, TwoGroups, Wgmma, WarpRows, Transition, TwoGroupsTma, TwoGroupsProducer, Chains };
// scan = GdnScan::Wgmma and Transition need larger workspaces (their stages 1b / 1t write W, U
// and Kd^T, or Pn, Qt and T diag(beta) per chunk and head); the other kernels need the default's.
size_t gdn_delta_chunked_workspace_bytes(const ref::GdnShape& shape, int n_seqs, int n_tokens,
                                         GdnScan scan = GdnScan::Auto);
// The launch gate's value split (16, 32 or 64 columns per scan block) for H_v n_seqs heads on
// `sms` multiprocessors: the fewest waves of blocks, weighted by the cost of a chunk step.
int gdn_delta_chunked_block_v(int heads, int sms);
GdnScan gdn_delta_chunked_scan(int block_v);
// The launch gate's whole plan for a call: the value split and the segments of the segmented
// scan (1: none). Segments (two-group kernels): each sequence's chunks cut into `segments`
// runs scanned at once, each from a zero state a warmup before it where the gates have decayed
// the state by e^-20 (ChunkRecord::bound, kernels/cuda/gdn_chunked.cu), else from the
// sequence's start; where a 32-column split's blocks fill the SMs unevenly and a sequence has
// >= 64 chunks: P segments where waves x (chunks / P + 1) steps beat the unsegmented split (132
// SMs, one sequence: 16 value heads 2 segments, 1 wave; 48 heads 2 segments, 3 waves of half
// chains instead of 2 of whole ones; 64-column segments are left out: a head whose warmup
// reaches the start runs its whole chain at their dearer step). ALLOY_GDN_SEGMENTS=P forces P
// (1 = off); so does gdn_delta_chunked's
// `segments` (0: the plan's, or the variable's where block_v is given), for two-group and chain scans
// only, with n_seqs <= the sequences whose final states the workspace holds (else alloy::Error).
// Segmented outputs differ from unsegmented ones where a segment starts from zero (by ~e^-20 of
// the state plus different roundings); where the warmup reaches the sequence's start, the bits
// are the unsegmented kernel's.
struct GdnChunkedPlan {
    int block_v, segments;
};
GdnChunkedPlan gdn_delta_chunked_plan(int H_v, int n_seqs, int n_tokens, int sms);
void gdn_delta_chunked(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, int n_tokens,
                       const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* g, const float* beta,
                       float* state, uint16_t* out, void* workspace, void* stream = nullptr, int block_v = 0,
                       const int32_t* seq_slots = nullptr, GdnScan scan = GdnScan::Auto, int segments = 0);
// ref's signature on device arrays, all fp32: q, k, v are rounded to bf16 on the device (into a
// workspace this call allocates), out is fp32. It reads seq_offsets[0] and [n_seqs] back, so it
// synchronizes `stream`: for tests and one-off calls, not for graphs.
void gdn_delta_chunked(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                       const float* k, const float* v, const float* g, const float* beta, float* state, float* out,
                       int chunk_size, void* stream = nullptr);

}  // namespace alloy::cuda
