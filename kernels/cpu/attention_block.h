// Internal to cpu::attention: one work item ("block") of the flash-attention schedule, and the
// per-ISA functions that run it. The driver (attention.cpp) cuts the problem into blocks; a
// block owns the query rows of one KV group for tq consecutive tokens and walks a range of
// keys in tiles of kKeyTile with an online softmax, so no [T, T] score matrix ever exists.
//
// Rows of a block: r = (t - t0) * group + (h - h0), i.e. token-major, so every row of the
// group shares each K/V tile load and the causal limit of row r is n_past + t0 + r / group.
// Scores are kept in the base-2 domain (q pre-scaled by scale * log2(e)), so m is log2-based.
#pragma once
#include <cstdint>

namespace alloy::cpu::attn {

constexpr int kKeyTile = 32;  // keys per tile: a K and a V tile of hd=256 are 32 KiB each (L1/L2)
constexpr int kRowTile = 4;   // query rows per microkernel (4 rows x 4 keys = 16 zmm accumulators)
static_assert(kKeyTile == 32, "the AVX-512 softmax holds one tile row in two zmm");

struct Block {
    const float* q = nullptr;  // [T, n_head, hd] (whole batch)
    const float* k = nullptr;  // K cache at KV head g: key j at k + j * kv_stride, [hd]
    const float* v = nullptr;  // V cache, same layout
    int64_t kv_stride = 0;     // n_head_kv * hd
    int n_head = 0, hd = 0, group = 0, h0 = 0;  // h0 = g * group, first query head of the block
    float scale = 0;           // softmax scale (1/sqrt(hd) usually)
    int64_t n_past = 0, t0 = 0;
    int tq = 0;                       // tokens [t0, t0 + tq)
    int64_t key_begin = 0, key_end = 0;  // keys [key_begin, key_end), further clipped by causality

    // Exactly one destination: normalised rows into out ([T, n_head, hd], rows of this block
    // only), or the unnormalised partial state of a key split into part_o [rows, hd] and
    // part_ml [rows, 2] = (running max m in log2 units, sum l); empty rows get (-inf, 0).
    float* out = nullptr;
    float* part_o = nullptr;
    float* part_ml = nullptr;

    int rows() const { return tq * group; }
    int64_t limit(int r) const { return n_past + t0 + r / group; }  // last key row r may see
    const float* q_row(int r) const { return q + ((t0 + r / group) * n_head + h0 + r % group) * int64_t(hd); }
    float* out_row(int r) const { return out + ((t0 + r / group) * n_head + h0 + r % group) * int64_t(hd); }
};

void run_block_scalar(const Block& b);
void run_block_avx512(const Block& b);  // needs hd % 16 == 0

// Aligned per-thread scratch (grows, never shrinks; pool threads live for the process).
float* scratch(int slot, int64_t n_floats);

}  // namespace alloy::cpu::attn
