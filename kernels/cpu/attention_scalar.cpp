// Portable block of cpu::attention (any head_dim): the same tiled online softmax as the
// AVX-512 block, row by row, as plain loops the compiler may vectorise for the baseline ISA.
// The schedule (run_block_rows) is shared with the AVX2 block, which brings its own per-row
// operations. f16 and bf16 tiles are converted to fp32 once per tile (exactly).
#include <algorithm>
#include <cmath>

#include "format/quant.h"
#include "kernels/cpu/attention_block.h"

namespace alloy::cpu::attn {
namespace {

// Rows [j0, j0 + nk) of a cache at element stride `stride`, as fp32 rows of hd: the cache
// itself when fp32 (stride kept), else converted into buf (stride becomes hd).
const float* tile(const void* cache, Elem e, int64_t j0, int nk, int64_t& stride, int hd, float* buf) {
    if (e == Elem::F32) return static_cast<const float*>(cache) + j0 * stride;
    const uint16_t* src = static_cast<const uint16_t*>(cache) + j0 * stride;
    if (e == Elem::F16)
        for (int j = 0; j < nk; ++j)
            for (int d = 0; d < hd; ++d) buf[int64_t(j) * hd + d] = fp16_to_fp32(src[j * stride + d]);
    else
        for (int j = 0; j < nk; ++j)
            for (int d = 0; d < hd; ++d) buf[int64_t(j) * hd + d] = bf16_to_fp32(src[j * stride + d]);
    stride = hd;
    return buf;
}

void scale(const float* src, float* dst, int hd, float f) {
    for (int d = 0; d < hd; ++d) dst[d] = src[d] * f;
}

void scores(const float* q, const float* K, int64_t ks, int nv, int hd, float* S) {
    for (int j = 0; j < nv; ++j) {
        const float* kj = K + j * ks;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot += q[d] * kj[d];
        S[j] = dot;
    }
}

void update_o(float* o, float alpha, const float* P, const float* V, int64_t vs, int nv, int hd) {
    for (int d = 0; d < hd; ++d) o[d] *= alpha;
    for (int j = 0; j < nv; ++j) {
        const float* vj = V + j * vs;
        for (int d = 0; d < hd; ++d) o[d] += P[j] * vj[d];
    }
}

}  // namespace

void run_block_rows(const Block& b, const RowOps& ops) {
    const int R = b.rows(), hd = b.hd, ng = b.ng, NR = ng * R;  // row gi * R + r: row r of group gi
    // Sections of b.scratch, each within block_scratch_bytes' counterpart (Q, O, S, softmax
    // state, then the K and V tiles past the Qt and limits this path does not use).
    ws::Carver sc(b.scratch);
    float* Q = sc.take<float>(size_t(NR) * hd);  // [NR, hd] q * scale * log2(e)
    float* O = sc.take<float>(size_t(NR) * hd);  // [NR, hd] unnormalised output
    float* S = sc.take<float>(kKeyTile);         // [kKeyTile] one row's scores, then probabilities
    float* ml = sc.take<float>(2 * size_t(NR));  // [NR, 2] running max (log2 units), running sum
    float* kbuf = b.k_elem != Elem::F32 ? sc.take<float>(size_t(kKeyTile) * hd) : nullptr;
    float* vbuf = b.v_elem != Elem::F32 ? sc.take<float>(size_t(kKeyTile) * hd) : nullptr;
    const float qs = b.scale * 1.44269504088896341f;
    for (int gi = 0; gi < ng; ++gi)
        for (int r = 0; r < R; ++r) {
            const int64_t gr = int64_t(gi) * R + r;
            ops.scale(b.q_row(r, gi), Q + gr * hd, hd, qs);
            ml[2 * gr] = -INFINITY;
            ml[2 * gr + 1] = 0.0f;
        }
    std::fill(O, O + int64_t(NR) * hd, 0.0f);

    const size_t kb = elem_bytes(b.k_elem), vb = elem_bytes(b.v_elem);
    const int64_t key_end = std::min(b.key_end, b.limit(R - 1) + 1);
    for (int64_t j0 = b.key_begin; j0 < key_end; j0 += kKeyTile) {
        const int nk = int(std::min<int64_t>(kKeyTile, key_end - j0));
        for (int gi = 0; gi < ng; ++gi) {
            int64_t ks = b.kv_stride, vs = b.kv_stride;
            const float* K = ops.tile(static_cast<const char*>(b.k) + size_t(gi) * size_t(hd) * kb, b.k_elem, j0, nk,
                                      ks, hd, kbuf);
            const float* V = ops.tile(static_cast<const char*>(b.v) + size_t(gi) * size_t(hd) * vb, b.v_elem, j0, nk,
                                      vs, hd, vbuf);
            for (int r = 0; r < R; ++r) {
                const int nv = int(std::clamp<int64_t>(b.limit(r) + 1 - j0, 0, nk));  // causal
                if (nv == 0) continue;
                const int64_t gr = int64_t(gi) * R + r;
                ops.scores(Q + gr * hd, K, ks, nv, hd, S);
                float mx = ml[2 * gr];
                for (int j = 0; j < nv; ++j) mx = std::max(mx, S[j]);
                const float alpha = std::exp2(ml[2 * gr] - mx);  // exp2(-inf) = 0 on the first tile
                float sum = 0.0f;
                for (int j = 0; j < nv; ++j) sum += (S[j] = std::exp2(S[j] - mx));
                ml[2 * gr] = mx;
                ml[2 * gr + 1] = ml[2 * gr + 1] * alpha + sum;
                ops.update_o(O + gr * hd, alpha, S, V, vs, nv, hd);
            }
        }
    }

    for (int gi = 0; gi < ng; ++gi)
        for (int r = 0; r < R; ++r) {
            const int64_t gr = int64_t(gi) * R + r;
            const float* orow = O + gr * hd;
            if (b.out) {
                // every row of an unsplit block sees key 0, so its sum is positive
                ops.scale(orow, b.out_row(r, gi), hd, 1.0f / ml[2 * gr + 1]);
            } else {
                const int64_t pr = int64_t(gi) * b.part_rows + r;
                std::copy(orow, orow + hd, b.part_o + pr * hd);
                b.part_ml[2 * pr] = ml[2 * gr];
                b.part_ml[2 * pr + 1] = ml[2 * gr + 1];
            }
        }
}

void run_block_scalar(const Block& b) { run_block_rows(b, {tile, scale, scores, update_o}); }

}  // namespace alloy::cpu::attn
