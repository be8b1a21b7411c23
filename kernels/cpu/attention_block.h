// Internal to cpu::attention: one work item ("block") of the flash-attention schedule, and the
// per-ISA functions that run it. The driver (attention.cpp) cuts the problem into blocks; a
// block owns the query rows of ng consecutive KV groups for tq consecutive tokens and walks a
// range of keys in tiles of kKeyTile with an online softmax, so no [T, T] score matrix ever
// exists. Prefill blocks take one group (ng = 1: many blocks); decode and short batches take
// every group (ng = n_head_kv), so a thread streams whole cache rows, one contiguous stream
// per cache, and the keys are split across threads instead.
//
// Rows of group gi of a block: r = (t - t0) * group + (h - h0 - gi * group), i.e. token-major,
// so every row of the group shares each K/V tile load and the causal limit of row r is
// n_past + t0 + r / group. Scores are kept in the base-2 domain (q pre-scaled by
// scale * log2(e)), so m is log2-based.
//
// The caches hold fp32, f16 or bf16 elements (Block::k_elem, v_elem). A 16-bit tile is either
// converted inline as it is loaded (one conversion shared by the rows of one register tile:
// decode) or, when many row tiles reuse it (prefill), converted once into a per-thread fp32
// tile. f16 -> fp32 and bf16 -> fp32 are exact, so both give the same bits.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/workspace.h"

namespace alloy::cpu::attn {

constexpr int kKeyTile = 32;  // keys per tile: K and V tiles of hd=256 are 16 KiB each in f16, 32 in fp32
constexpr int kRowTile = 4;   // query rows per microkernel (4 rows x 4 keys = 16 zmm accumulators)
// Query rows per prefill block (group x tokens). The AVX-512 prefill path converts every f16
// K and V tile once per block, so more rows per block convert less per FLOP; 64 rows keep a
// block's Q, Qt and O (64 KiB each in fp32) well inside L2.
constexpr int kMaxPrefillRows = 64;
static_assert(kKeyTile == 32, "the AVX-512 softmax holds one tile row in two zmm");

// Element type of a cache.
enum class Elem : uint8_t { F32, F16, Bf16 };
inline int elem_bytes(Elem e) { return e == Elem::F32 ? 4 : 2; }

struct Block {
    const float* q = nullptr;  // [T, n_head, hd] (whole batch)
    // K and V caches at the block's first KV head g0: key j of group gi starts at element
    // j * kv_stride + gi * hd, of type k_elem / v_elem.
    const void* k = nullptr;
    const void* v = nullptr;
    Elem k_elem = Elem::F32, v_elem = Elem::F32;
    int64_t kv_stride = 0;     // n_head_kv * hd (elements)
    int n_head = 0, hd = 0, group = 0, h0 = 0;  // h0 = g0 * group, first query head of the block
    int ng = 1;                // KV groups in the block
    float scale = 0;           // softmax scale (1/sqrt(hd) usually)
    int64_t n_past = 0, t0 = 0;
    int tq = 0;                       // tokens [t0, t0 + tq)
    int64_t key_begin = 0, key_end = 0;  // keys [key_begin, key_end), further clipped by causality
    // When the thread's next block continues with keys [key_end, prefetch_end) of the same
    // rows and groups, the last tile prefetches that block's first tile (0: nothing).
    int64_t prefetch_end = 0;
    // Decode and verification (keys on the fixed grid): every row's arithmetic must be the
    // one a 1-token call gives it, so the AVX-512 block keeps its row-tile QK order. Off the
    // grid (prefill) it may take the transposed path instead.
    bool grid = false;

    // Exactly one destination: normalised rows into out ([T, n_head, hd], rows of this block
    // only), or the unnormalised partial state of a key split into part_o [ng * part_rows, hd]
    // and part_ml [ng * part_rows, 2] = (running max m in log2 units, sum l), row r of group
    // gi at gi * part_rows + r; empty rows get (-inf, 0).
    float* out = nullptr;
    float* part_o = nullptr;
    float* part_ml = nullptr;
    int part_rows = 0;         // >= rows()
    // The running thread's scratch, block_scratch_bytes(ng, rows, hd) bytes (from the caller's
    // workspace: attention.cpp slices it per pool thread). The run_block functions carve it in
    // the order block_scratch_bytes counts.
    void* scratch = nullptr;

    int rows() const { return tq * group; }  // per group
    int64_t limit(int r) const { return n_past + t0 + r / group; }  // last key row r may see
    int64_t head_row(int r, int gi) const { return (t0 + r / group) * n_head + h0 + gi * group + r % group; }
    const float* q_row(int r, int gi) const { return q + head_row(r, gi) * hd; }
    float* out_row(int r, int gi) const { return out + head_row(r, gi) * hd; }
};

// The per-row operations of the row-by-row block (attention_scalar.cpp), so the portable and
// AVX2 blocks share one schedule: a row's math depends on its own position only.
struct RowOps {
    // Rows [j0, j0 + nk) of a cache as fp32 rows: the cache itself when fp32 (stride kept),
    // else converted into buf (stride becomes hd).
    const float* (*tile)(const void* cache, Elem e, int64_t j0, int nk, int64_t& stride, int hd, float* buf);
    void (*scale)(const float* src, float* dst, int hd, float f);                 // dst = src * f
    void (*scores)(const float* q, const float* K, int64_t ks, int nv, int hd, float* S);  // S[j] = q . K[j]
    // o = o * alpha + sum_j P[j] V[j], keys in order
    void (*update_o)(float* o, float alpha, const float* P, const float* V, int64_t vs, int nv, int hd);
};
void run_block_rows(const Block& b, const RowOps& ops);

void run_block_scalar(const Block& b);
void run_block_avx2(const Block& b);    // needs hd % 8 == 0
void run_block_avx512(const Block& b);  // needs hd % 16 == 0

// Bytes of per-thread scratch a block of ng groups of at most `rows` rows each needs on any
// path, sections 64-byte aligned, in the order the AVX-512 block takes them (the row-by-row
// block takes a prefix of smaller ones): Q and O [ng Rp, hd], S [ng Rp, kKeyTile], the softmax
// state (m, l, alpha) [3 ng Rp], the transposed path's Qt [ng Rp, hd] and row limits [Rp], fp32
// copies of a 16-bit K and V tile [kKeyTile, hd] each, the bf16 path's paired queries
// [ng Rp hd / 2] and probabilities [kKeyTile / 2, kLanes = kKeyTile], with Rp = rows rounded up
// to 32 (the transposed path's lane sets; the row-tile paths round to 4). Bounded by the block
// (at most 64 rows per group): a stack buffer would do for prefill blocks, but decode blocks
// take every KV group (ng = n_head_kv), so the size follows the model and comes from the caller.
inline size_t block_scratch_bytes(int ng, int rows, int hd) {
    const size_t Rp = size_t(rows + 31) / 32 * 32, gr = size_t(ng) * Rp, h = size_t(hd);
    ws::Carver c;
    c.take<float>(gr * h);                        // Q
    c.take<float>(gr * h);                        // O
    c.take<float>(gr * kKeyTile);                 // S
    c.take<float>(3 * gr);                        // m, l, alpha
    c.take<float>(gr * h);                        // Qt
    c.take<int32_t>(Rp);                          // row limits
    c.take<float>(size_t(kKeyTile) * h);          // K tile
    c.take<float>(size_t(kKeyTile) * h);          // V tile
    c.take<uint32_t>(gr * h / 2);                 // bf16 query pairs
    c.take<uint32_t>(size_t(kKeyTile / 2) * kKeyTile);  // bf16 probability pairs
    return c.bytes();
}

}  // namespace alloy::cpu::attn
