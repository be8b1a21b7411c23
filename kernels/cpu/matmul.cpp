// The matmul driver: picks the kernel path for (weight type, ISA, T), prepares the
// activations once, and splits the work over the thread pool.
//
// Work split:
//  - streaming GEMVs (Q8_0, BF16, the K-quants, Q4_0/IQ4_NL/MXFP4 with T <= 16 on AVX-512 and
//    AVX2): contiguous row ranges per item, several rows streamed side by side
//    (matmul_q8_gemv_avx512.cpp, matmul_bf16_gemv_avx512.cpp, matmul_avx2.cpp, kquant rows);
//    4 tokens per kernel call, runs of 32 rows per 4-token group past 4 tokens.
//  - row-dot (F32/F16 T <= 4, every T on the scalar path): items of 64 rows x 32 tokens; the
//    AVX-512 kernels read 16 rows side by side.
//  - GEMM tiles (T > 16, or T > 4 for types without a GEMV, on AVX-512 and AVX2): items of up
//    to 256 rows over every token tile (item_rows), so an item's weight rows stay in L2 while the
//    activation panel passes over them (repacked K-quant rows unpacked once an item). Inside a
//    tile call the inner dimension is cut into kc chunks, so the activation slice of the tile
//    stays in L1 while every row group of the chunk passes over it.
//  - converted weights (F16 in GEMM, Q4_0/Q4_K/Q6_K always): items of 16 rows, dequantized
//    once to fp32 into the thread's buffer, then the F32 kernels over all tokens.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/quant.h"
#include "kernels/cpu/matmul_act.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_kquant.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/workspace.h"

namespace alloy::cpu {
namespace {

using mm::ActKind;

constexpr int64_t kRowChunk = 64;       // rows per row-dot item (4 streams x 16 rows)
constexpr int64_t kRowDotTile = 32;     // tokens per row-dot item
// GEMM outputs of at least this size are written with non-temporal stores: far larger than
// the two cores' L2, they would otherwise be read from memory before being overwritten.
// A/B in one process (0.8B model, 2026-11-30, Zen 4): BF16 pp512 +4.9%, pp4096 +2.5%, Q8_0
// pp512 +2.9%; 64 tokens (1.5 MB outputs) neutral, 128 tokens +1.8%.
constexpr int64_t kStreamOutBytes = int64_t(2) << 20;
bool stream_output(int64_t T, int64_t N) { return T * N * int64_t(sizeof(float)) >= kStreamOutBytes; }
constexpr int64_t kTileRowGroups = 8;   // row groups (of TileKernel::rows) per GEMM item
constexpr int64_t kConvertRows = 16;    // rows per converted-weights item

enum class InputRounding { None, Q8_0, Q8_K };

struct Plan {
    ActKind act = ActKind::F32;
    bool vector = false;      // AVX-512 activation converters
    bool convert = false;     // weights go through an fp32 copy (rowdot is then the F32 one)
    bool convert_gemm = false;  // ... only on the GEMM path (F16: the row-dot reads f16 directly)
    bool convert_q8 = false;  // converted rows are Q8_0 (exact for Q4_0) for the Q8_0 kernels
    mm::RowKernel rowdot;
    mm::TileKernel tile;      // fn == nullptr: no GEMM path
    // T <= 4 runs the streaming GEMV over guided row items (long contiguous runs first, see
    // guided_items): Q8_0 with VNNI and BF16 with AVX512-BF16, and both on AVX2. nullptr:
    // the row-dot kernel over short row items.
    mm::GemvFn gemv = nullptr;
    // The most tokens the GEMV takes (when there is one); above, the GEMM tiles. Q8_0's GEMVs
    // and tiles compute one chain per output (matmul_q8_avx512.cpp), so whichever is faster
    // takes a call (VNNI: the tile from 5 tokens, one pass over the weights; 2048 x 1024 in
    // cache, Zen 4: T = 8 123 vs ~190 us); elsewhere the GEMVs keep up to kGemvMaxTokens = 16,
    // where their bits are the batch-invariant ones.
    int64_t gemv_max = mm::kGemvMaxTokens;
    bool avx2_tiles = false;   // the GEMM tiles are the AVX2 ones (their transposed store too)
    // The GEMV takes all of a call's tokens (up to gemv_max) at once, not 4 a call (Q8Rows16).
    bool gemv_all_tokens = false;
    // K-quant and Q4_0 prefill (converted weights): the activations are first rounded through
    // Q8_K (K-quants) or Q8_0 (Q4_0), as the decode GEMVs and llama.cpp (vec_dot_type) see them,
    // so a prompt's rows and its decode steps compute the same function and perplexity tracks
    // llama.cpp's.
    InputRounding round_input = InputRounding::None;
    std::string name;
};

Plan make_plan(GgmlType type, Isa isa, int64_t n_in, int64_t T) {
    isa = std::min(isa, active_isa());
    const bool avx512 = isa == Isa::Avx512, avx2 = isa >= Isa::Avx2;
    const auto rowdot_for = [&](GgmlType t) {
        return avx512 ? mm::rowdot_avx512(t) : avx2 ? mm::rowdot_avx2(t) : mm::rowdot_scalar(t);
    };
    const char* isa_label = avx512 ? "avx512" : avx2 ? "avx2" : "scalar";
    Plan p;
    switch (type) {
        case GgmlType::Q8_0:
            p.act = ActKind::Q8;
            p.vector = avx512;
            if (avx512 && mm::cpu_has_avx512_vnni()) {
                p.rowdot = mm::rowdot_avx512(type);
                p.tile = mm::tile_avx512(type);
                p.gemv = mm::q8_gemv_avx512;
                p.gemv_max = mm::kRowDotTokens;
                p.name = "avx512-vnni";
            } else {
                p.rowdot = avx2 ? mm::rowdot_avx2(type) : mm::rowdot_scalar(type);
                if (avx2) p.tile = mm::tile_avx2(type);
                p.avx2_tiles = avx2;
                if (avx2) p.gemv = mm::gemv_avx2(type);
                // The AVX2 tile (3 rows x 16 tokens) overtakes the GEMV's passes of 4 tokens
                // only past ~12 tokens (weights in cache, Zen 4: T = 8 332 vs 232 us, T = 16
                // 340 vs 463 us for 2048 x 1024); its narrow form (<= 8 tokens, half the
                // multiplies) from ALLOY_Q8_AVX2_GEMV_MAX + 1 tokens (A/B; the same bits).
                static const int64_t gemv_max_avx2 = [] {
                    const char* e = std::getenv("ALLOY_Q8_AVX2_GEMV_MAX");
                    return e ? std::clamp<int64_t>(std::atoi(e), 1, mm::kGemvMaxTokens) : int64_t(8);
                }();
                p.gemv_max = gemv_max_avx2;
                p.name = avx2 ? "avx2" : "scalar";
            }
            return p;
        case GgmlType::BF16:
            if (avx512 && mm::cpu_has_avx512_bf16()) {
                p.act = ActKind::Bf16Bits;
                p.vector = true;
                p.rowdot = mm::rowdot_avx512(type);
                if (n_in % 2 == 0) p.tile = mm::tile_avx512(type);
                p.gemv = mm::bf16_gemv_avx512;
                p.name = "avx512-bf16";
            } else {
                p.act = ActKind::Bf16F32;
                p.rowdot = avx2 ? mm::rowdot_avx2(type) : mm::rowdot_scalar(type);
                if (avx2 && n_in % 2 == 0) p.tile = mm::tile_avx2(type);
                p.avx2_tiles = avx2;
                if (avx2) p.gemv = mm::gemv_avx2(type);
                p.name = avx2 ? "avx2" : "scalar";
            }
            return p;
        case GgmlType::F32:
        case GgmlType::F16:
            p.rowdot = rowdot_for(type);
            if (avx2) p.tile = avx512 ? mm::tile_avx512(GgmlType::F32) : mm::tile_avx2(GgmlType::F32);
            p.avx2_tiles = avx2 && !avx512;
            p.convert_gemm = type == GgmlType::F16 && avx2;
            p.name = isa_label;
            return p;
        default:
            if (!mm::uses_q8k(type)) break;
            if (T <= mm::kGemvMaxTokens) {  // decode / verification: packed blocks x Q8_K (matmul_kquant.cpp)
                p.act = ActKind::Q8K;
                p.gemv = mm::kquant_gemv(type, isa);
                p.name = std::string(isa_label) + " q8k";
                return p;
            }
            if (avx512 && (p.tile = mm::kquant_tile_avx512(type)).fn) {  // prefill: VNNI tiles on the Q8_K panel
                p.act = ActKind::Q8K;
                p.vector = true;
                p.name = "avx512-vnni q8k";
                return p;
            }
            if (avx2 && (p.tile = mm::kquant_tile_avx2(type)).fn) {  // the same tiles' arithmetic on AVX2
                p.act = ActKind::Q8K;
                p.avx2_tiles = true;
                p.name = "avx2 q8k";
                return p;
            }
            p.round_input = InputRounding::Q8_K;
            break;
        case GgmlType::Q4_0:
        case GgmlType::IQ4_NL:
        case GgmlType::MXFP4:
            // Decode: the packed blocks x Q8_0 activations (ggml's vec_dot_q4_0_q8_0 /
            // vec_dot_iq4_nl_q8_0), streamed as the Q8_0 GEMVs; prefill: below; scalar: dequantized
            // rows on Q8_0-rounded activations.
            if (T <= mm::kGemvMaxTokens && avx2) {
                p.act = ActKind::Q8;
                p.vector = avx512;
                p.gemv = !(avx512 && mm::cpu_has_avx512_vnni()) ? mm::gemv_avx2(type)
                         : type == GgmlType::Q4_0            ? mm::q4_0_gemv_avx512
                         : type == GgmlType::IQ4_NL          ? mm::iq4_nl_gemv_avx512
                                                              : mm::mxfp4_gemv_avx512;
                p.rowdot = mm::rowdot_avx2(GgmlType::Q8_0);  // never called: the GEMV takes every row
                p.name = std::string(isa_label) + " q8";
                return p;
            }
            // (MXFP4's scales 2^(e - 128) need not fit a Q8_0 row's f16 d: its prefill stays fp32.)
            if (avx2 && type != GgmlType::MXFP4) {
                // Prefill: each item's rows become Q8_0 rows (the same d; q - 8, or the IQ4_NL
                // codebook value, as int8: exact), then the Q8_0 GEMM tiles: integer block sums as
                // decode, int8 instead of fp32 products.
                p = make_plan(GgmlType::Q8_0, isa, n_in, T);
                p.convert = true;
                p.convert_q8 = true;
                p.gemv = nullptr;
                p.name += type == GgmlType::Q4_0 ? " q4_0->q8_0" : " iq4_nl->q8_0";
                return p;
            }
            p.round_input = InputRounding::Q8_0;
            break;
    }
    // Everything else (and K-quant prefill without VNNI tiles): rows dequantized to fp32, then
    // the F32 kernels.
    p.rowdot = rowdot_for(GgmlType::F32);
    if (avx2) p.tile = avx512 ? mm::tile_avx512(GgmlType::F32) : mm::tile_avx2(GgmlType::F32);
    p.avx2_tiles = avx2 && !avx512;
    p.convert = true;
    p.name = std::string(isa_label) + " dequant";
    return p;
}

// MXFP4 scales 2^(e - 128) are exact f16 values for e in [104, 143] (2^-24 .. 2^15), so a
// matrix whose blocks all lie there converts exactly to Q8_0 rows. One byte per 17 is read:
// noise beside a prefill GEMM of the matrix.
bool mxfp4_fits_q8_0(const WeightView& W) {
    const int64_t nb = W.n_in / 32;
    for (int64_t r = 0; r < W.n_out; ++r) {
        const uint8_t* row = W.row(r);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t e = row[b * 17];
            if (e < 104 || e > 143) return false;
        }
    }
    return true;
}

// A plan adjusted to a repacked weight's layout (reads only W's shape and layout).
//  - KqRows16: the layout's GEMVs; GEMM items unpack rows (gguf_rows).
//  - Q8Rows16 with AVX512-VNNI: the zmm GEMV (16 rows a vector) for every call of up to
//    kGemvMaxTokens tokens (all at once), the tiles read the layout in place past that.
//    Other paths (AVX2, scalar: only tests, the loader repacks for VNNI only) convert each item
//    of 16 rows back to GGUF rows (run_converted) and run the GGUF plan's kernels on them.
Plan layout_plan(Plan p, const WeightView& W, Isa isa) {
    if (W.layout == WeightLayout::KqRows16 && p.gemv) p.gemv = mm::kq_r16_gemv(W.type, isa), p.name += " r16";
    if (W.layout == WeightLayout::Q8Rows16) {
        if (p.gemv == mm::q8_gemv_avx512) {  // (the VNNI plan)
            p.gemv = mm::q8_r16_gemv_avx512;
            p.gemv_max = mm::kGemvMaxTokens;
            p.gemv_all_tokens = true;
        } else {
            p.convert = true;
            p.convert_q8 = true;
        }
        p.name += " r16";
    }
    return p;
}

// make_plan for this weight's data: MXFP4 prefill takes the int8 Q8_0 tiles when its scales
// allow an exact conversion (else fp32 rows, which compute the same function).
Plan plan_for(const WeightView& W, Isa isa, int64_t T) {
    if (W.type == GgmlType::MXFP4 && T > mm::kGemvMaxTokens && std::min(isa, active_isa()) >= Isa::Avx2 &&
        mxfp4_fits_q8_0(W)) {
        Plan p = make_plan(GgmlType::Q8_0, isa, W.n_in, T);
        p.convert = true;
        p.convert_q8 = true;
        p.gemv = nullptr;
        p.name += " mxfp4->q8_0";
        return p;
    }
    return layout_plan(make_plan(W.type, isa, W.n_in, T), W, isa);
}

// The activation converters' path (all give the same bits; only their speed differs).
Isa act_isa(const Plan& p) { return p.vector ? Isa::Avx512 : p.avx2_tiles ? Isa::Avx2 : Isa::Scalar; }

bool use_gemm(const Plan& p, int64_t T) {
    return p.tile.fn != nullptr && T > (p.gemv ? p.gemv_max : mm::kRowDotTokens);
}

// Row-dot over rows [r0, r0 + rc) and tokens [t0, t0 + tn).
void rowdot_range(const Plan& p, const WeightView& W, const mm::ActRows& a, int64_t r0, int64_t rc, int64_t t0,
                  int64_t tn, float* y, int64_t ldy) {
    const mm::RowKernel& k = p.rowdot;
    for (int64_t r = r0; r < r0 + rc; r += k.rows)
        for (int64_t t = t0; t < t0 + tn; t += mm::kRowDotTokens)
            k.fn(W, r, int(std::min<int64_t>(k.rows, r0 + rc - r)), a, t,
                 int(std::min<int64_t>(mm::kRowDotTokens, t0 + tn - t)), y, ldy);
}

// GEMM over rows [r0, r0 + rc) and token groups [g0, g0 + nv) into tile [rc][ldt].
// T: the call's tokens (a last group of at most mm::kNarrowTokens takes the narrow kernel).
// Rows [r0, r0 + rc) of W as a GGUF view of rc rows: W's own bytes, or (a repacked W,
// WeightLayout::KqRows16, whose rows the GEMM tiles cannot read) unpacked into buf
// (rc * row_bytes). A GEMM item of a repacked weight unpacks its rows once for every token tile.
WeightView gguf_rows(const WeightView& W, int64_t r0, int64_t rc, uint8_t* buf) {
    if (W.layout != WeightLayout::KqRows16 && W.layout != WeightLayout::Q8Rows16)
        return WeightView{W.type, W.n_in, rc, W.row(r0), W.row_bytes};
    // Whole KqRows16 groups 16 rows at once (mm::kq_unpack_group: the same bytes, ~4x faster).
    const int64_t G = mm::kQ4KGroupRows, full = W.n_out / G * G;
    const Isa isa = active_isa();
    for (int64_t i = 0; i < rc;) {
        uint8_t* dst = buf + size_t(i) * W.row_bytes;
        const int64_t r = r0 + i;
        if (W.layout == WeightLayout::KqRows16 && r % G == 0 && i + G <= rc && r + G <= full) {
            mm::kq_unpack_group(W.type, W.row(r), W.n_in / mm::kQK, dst, isa);
            i += G;
            continue;
        }
        const uint8_t* src = weight_row(W, r, dst);
        if (src != dst) std::memcpy(dst, src, W.row_bytes);
        ++i;
    }
    return WeightView{W.type, W.n_in, rc, buf, W.row_bytes};
}

void gemm_tile(const Plan& p, const WeightView& W, const mm::ActPanel& panel, int64_t r0, int64_t rc, int64_t g0,
               int nv, int64_t T, float* tile, int ldt) {
    const mm::TileKernel& kt = p.tile;
    const int64_t K = W.n_in;
    // ALLOY_Q8_NARROW=0: the full tile for narrow groups too (A/B; the same bits).
    static const bool narrow_on = [] { const char* e = std::getenv("ALLOY_Q8_NARROW"); return !e || std::atoi(e) != 0; }();
    const mm::TileFn fn =
        narrow_on && kt.narrow && (panel.q_pairs || !kt.narrow_reads_pairs) && nv == 1 &&
                T - g0 * mm::kGroup <= mm::kNarrowTokens
            ? kt.narrow
            : kt.fn;
    // ALLOY_Q8_R16_KC: a Q8Rows16 matrix's k-chunk (A/B; chunking changes no bit: one chain
    // per output, continued from the tile). 128 / 256 / 512 measured no better than the tile's
    // 1024 at T = 64 (3584 x 1024, Zen 4, session 28).
    static const int64_t r16_kc = [] { const char* e = std::getenv("ALLOY_Q8_R16_KC"); return e ? int64_t(std::atoi(e)) / 32 * 32 : int64_t(0); }();
    const int64_t kc = W.layout == WeightLayout::Q8Rows16 && r16_kc > 0 ? r16_kc : kt.kc;
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
        const int64_t k1 = std::min<int64_t>(K, k0 + kc);
        for (int64_t r = 0; r < rc; r += kt.rows)
            fn(W, r0 + r, int(std::min<int64_t>(kt.rows, rc - r)), panel, g0, nv, k0, k1, tile + r * ldt, ldt);
    }
}

// Tile [rc][ldt] of rows [r0, r0 + rc) and token groups from g0 out to y (transposed).
void store_tile(const Plan& p, const float* tile, int ldt, int64_t r0, int64_t rc, int64_t g0, int nv, int64_t T,
                float* y, int64_t ldy, bool stream_out) {
    const int64_t t0 = g0 * mm::kGroup, tn = std::min<int64_t>(nv * mm::kGroup, T - t0);
    if (p.avx2_tiles) mm::store_transposed_avx2(tile, ldt, rc, tn, y + t0 * ldy + r0, ldy);
    else mm::store_transposed_avx512(tile, ldt, rc, tn, y + t0 * ldy + r0, ldy, stream_out);
}

// GEMM work item `it` of a weight with n_out rows in the former token-tile-major order
// (ALLOY_GEMM_ORDER=tiles, A/B only): item = token tile * n_chunks + row chunk, so both threads
// share one activation tile while each streams its own weight rows.
struct GemmItem {
    int64_t g0, r0, rc;  // first token group, first row, rows
    int nv;              // token groups
};
GemmItem gemm_item(const mm::TileKernel& kt, int64_t it, int64_t n_chunks, int64_t chunk, int64_t G, int64_t n_out) {
    const int64_t g0 = (it / n_chunks) * kt.groups, r0 = (it % n_chunks) * chunk;
    return {g0, r0, std::min(chunk, n_out - r0), int(std::min<int64_t>(kt.groups, G - g0))};
}

void gemm_range(const Plan& p, const WeightView& W, const mm::ActPanel& panel, int64_t r0, int64_t rc, int64_t g0,
                int nv, int64_t T, float* tile, int ldt, float* y, int64_t ldy, bool stream_out) {
    gemm_tile(p, W, panel, r0, rc, g0, nv, T, tile, ldt);
    store_tile(p, tile, ldt, r0, rc, g0, nv, T, y, ldy, stream_out);
}

// Q4_0 / IQ4_NL / MXFP4 rows [r0, r0 + rc) as Q8_0 rows (34-byte blocks) into out: the same
// d, the codes as int8 (q - 8, kIq4nlValues[q] or kMxfp4Values[q]).
void nibble_rows_to_q8_0(const WeightView& W, int64_t r0, int64_t rc, uint8_t* out) {
    const bool mx = W.type == GgmlType::MXFP4;
    int8_t value[16];
    for (int c = 0; c < 16; ++c) {
        value[c] = W.type == GgmlType::Q4_0 ? static_cast<int8_t>(c - 8) : mx ? kMxfp4Values[c] : kIq4nlValues[c];
    }
    const int64_t nb = W.n_in / 32, in_bytes = mx ? 17 : 18, codes = mx ? 1 : 2;
    for (int64_t i = 0; i < rc; ++i) {
        const uint8_t* src = W.row(r0 + i);
        for (int64_t b = 0; b < nb; ++b, src += in_bytes, out += 34) {
            if (mx) {  // 2^(e - 128) is an exact f16 here (plan_for checked the range)
                const uint16_t d = fp32_to_fp16(mxfp4_half_scale(src[0]));
                out[0] = static_cast<uint8_t>(d);
                out[1] = static_cast<uint8_t>(d >> 8);
            } else {
                out[0] = src[0];
                out[1] = src[1];
            }
            for (int j = 0; j < 16; ++j) {
                out[2 + j] = static_cast<uint8_t>(value[src[codes + j] & 0x0F]);
                out[18 + j] = static_cast<uint8_t>(value[src[codes + j] >> 4]);
            }
        }
    }
}

void convert_rows(const Plan& p, const WeightView& W, int64_t r0, int64_t rc, float* out) {
    for (int64_t i = 0; i < rc; ++i) {
        if (W.type == GgmlType::F16 && !p.avx2_tiles) mm::f16_to_f32_avx512(W.row(r0 + i), W.n_in, out + i * W.n_in);
        else if (W.layout == WeightLayout::KqRows16) {
            thread_local std::vector<uint8_t> buf;
            buf.resize(W.row_bytes);
            dequantize_row(W.type, mm::kq_gguf_row(W, r0 + i, buf.data()), out + i * W.n_in, W.n_in);
        } else {
            dequantize_row(W.type, W.row(r0 + i), out + i * W.n_in, W.n_in);
        }
    }
}

}  // namespace

namespace {

void check_shape(const WeightView& W) {
    const int64_t K = W.n_in, block = type_traits(W.type).block_elems;
    if (K <= 0 || K % block != 0)
        throw Error(std::string("matmul: n_in ") + std::to_string(K) + " is not a positive multiple of the " +
                    type_traits(W.type).name + " block size " + std::to_string(block));
}

// The scratch of a call, in the caller's workspace (kernels/cpu/workspace.h), in this order:
// the rounded input (Plan::round_input), the prepared activations (panel or rows; reused by
// the weights of a matmul_multi that run one after another), then one slice per pool thread
// (GEMM tiles, converted rows), which were per-thread buffers that only grew, now sized from
// the shapes (a converted item is 16 fp32 rows of n_in: 1 MiB at n_in = 16384, no stack buffer).
// Byte counts per section; a call's counts are the maximum over its weights.
struct Need {
    size_t rounded = 0, act = 0, per_thread = 0;
    void include(const Need& o) {
        rounded = std::max(rounded, o.rounded);
        act = std::max(act, o.act);
        per_thread = std::max(per_thread, o.per_thread);
    }
    size_t bytes() const {
        ws::Carver c;
        carve(c);
        return c.bytes();
    }
    void carve(ws::Carver& c, float** r = nullptr, uint8_t** a = nullptr, uint8_t** t = nullptr) const {
        float* rp = c.take<float>(rounded / sizeof(float));
        uint8_t* ap = c.take<uint8_t>(act);
        uint8_t* tp = c.take<uint8_t>(ws::up(per_thread) * size_t(n_threads()));
        if (r) *r = rp;
        if (a) *a = ap;
        if (t) *t = tp;
    }
};

// Where a call's sections are in its workspace.
struct Scratch {
    float* rounded = nullptr;
    uint8_t* act = nullptr;
    uint8_t* per_thread = nullptr;
    size_t slice = 0;  // bytes per thread
    uint8_t* thread(int t) const { return per_thread + slice * size_t(t); }
};
Scratch carve(const Need& n, void* workspace) {
    ws::Carver c(workspace);
    Scratch s;
    n.carve(c, &s.rounded, &s.act, &s.per_thread);
    s.slice = ws::up(n.per_thread);
    return s;
}

// GEMM items are row-major: an item is `item_rows` rows of one weight over every token tile,
// 16-row chunks (kTileRowGroups x the tile's rows) at a time, so the item's weight rows stay in
// L2 while the activation panel passes over them, swept from L2 / L3 once per item; larger
// items sweep it fewer times. A repacked weight (WeightLayout::KqRows16) unpacks the item's rows
// once first (mm::kq_unpack_group). 0.8B shapes at T 512 on the Intel Xeon (KVM, 2 threads,
// 2026-12-07): Q4_K 3584 x 1024 repacked, 16 / 32 / 64 / 128 / 256 rows an item 8.5 / 8.1 / 7.8 /
// 7.45 / 7.3 ms, Q6_K 1024 x 3584 10.0 / 9.3 / 9.3 / 9.05 / 9.0; Q8_0 (Q8Rows16) 256 rows 5.57 /
// 5.53 ms against 6.5-6.75 / 5.88 token-tile-major (the former order: an item one token tile x
// one row chunk, tile-major, both threads sharing the activation tile while the weights streamed
// once per token tile; kept per weight where it moves fewer bytes: tile_major_items).
// Bounded by 256 rows, by 512 KiB of weight rows (kept in L2; BF16 at 256 rows of 7 KiB lost 1-2%)
// and by four items a thread.
constexpr size_t kItemBytes = size_t(512) << 10;
constexpr int64_t kMaxItemRows = 256;
// The most rows an item of `row_bytes` rows takes, a multiple of g.
int64_t item_rows_cap(size_t row_bytes, int64_t g) {
    return std::max<int64_t>(g, std::min<int64_t>(kMaxItemRows, int64_t(kItemBytes / std::max<size_t>(row_bytes, 1))) / g * g);
}
// Rows per item of a weight with n_out rows of row_bytes; unpacked: a repacked weight's (its
// items unpack whole 16-row groups).
int64_t item_rows(size_t row_bytes, bool unpacked, int64_t n_out, int64_t chunk) {
    const int64_t g = unpacked ? mm::kQ4KGroupRows : chunk;
    return std::max<int64_t>(g, std::min<int64_t>(item_rows_cap(row_bytes, g), n_out / (4 * n_threads())) / g * g);
}
// Whether a weight's items take the token-tile-major order instead: an item a token tile x a
// row chunk, every thread on one token tile at a time, the weight streamed once per token tile.
// Chosen where it moves fewer bytes through L2: row-major items sweep the activation panel once
// per item, tile-major ones the weight once per token tile. 9B shapes at T 512 (Q8_0, Xeon):
// 12288 x 4096 rows 69.5 / tiles 73.6 ms (panel 2 MB x 96 items < weight 53 MB x 8 tiles), 4096 x
// 12288 rows 73.8-74.4 / tiles 72.5-72.8 (panel 6.3 MB x 128 items > 53 MB x 8). Repacked
// weights are always row-major (an item unpacks its rows once). ALLOY_GEMM_ORDER=tiles|rows
// forces one order (A/B).
bool tile_major_items(const WeightView& W, int64_t rows, size_t panel_bytes, int64_t n_tiles) {
    static const int forced = [] {
        const char* e = std::getenv("ALLOY_GEMM_ORDER");
        return !e ? 0 : std::string(e) == "tiles" ? 1 : std::string(e) == "rows" ? 2 : 0;
    }();
    if (W.layout == WeightLayout::KqRows16 || forced == 2) return false;
    if (forced == 1) return true;
    const double panel_sweeps = double((W.n_out + rows - 1) / rows) * double(panel_bytes);
    return panel_sweeps > double(n_tiles) * double(W.n_out) * double(W.row_bytes);
}

// The sections a call of T tokens on plan p takes (run_jobs, or run_converted for converted
// weights); fused: matmul_swiglu's GEMM items (gate and up tiles per thread).
// unpack_row_bytes: a repacked weight's row bytes (its GEMM items unpack their rows after the
// tiles: gate's and up's in a fused item).
Need need_of(const Plan& p, int64_t K, int64_t T, bool fused = false, size_t unpack_row_bytes = 0) {
    Need n;
    const bool gemm = use_gemm(p, T);
    n.act = gemm ? mm::act_panel_bytes(p.act, T, K) : mm::act_rows_bytes(p.act, T, K);
    const int64_t ldt = int64_t(p.tile.groups) * mm::kGroup, chunk = kTileRowGroups * p.tile.rows;
    if (p.convert || (p.convert_gemm && gemm)) {
        if (p.round_input != InputRounding::None) n.rounded = size_t(T * K) * sizeof(float);
        n.per_thread = size_t(kConvertRows * K + kConvertRows * ldt) * sizeof(float);
    } else if (gemm) {
        const int64_t unpack_rows = unpack_row_bytes ? item_rows_cap(unpack_row_bytes, mm::kQ4KGroupRows) : 0;
        n.per_thread = size_t((fused ? 2 : 1) * chunk * ldt) * sizeof(float) + size_t((fused ? 2 : 1) * unpack_rows) * unpack_row_bytes;
    }
    return n;
}

size_t unpack_row_bytes(const WeightView& W) { return W.layout == WeightLayout::KqRows16 ? W.row_bytes : 0; }
// Where a thread's GEMM items unpack repacked rows: after its tile(s) in its slice.
uint8_t* unpack_slice(const Plan& p, const Scratch& s, int thread, bool fused = false) {
    const int64_t ldt = int64_t(p.tile.groups) * mm::kGroup, chunk = kTileRowGroups * p.tile.rows;
    return s.thread(thread) + size_t((fused ? 2 : 1) * chunk * ldt) * sizeof(float);
}

// need_of for weight W, without reading its data: MXFP4 prefill takes the Q8_0 tiles or the
// fp32 rows after a scan of its scales (plan_for), so both are counted.
Need need_for(const WeightView& W, Isa isa, int64_t T) {
    Need n = need_of(layout_plan(make_plan(W.type, isa, W.n_in, T), W, isa), W.n_in, T, false, unpack_row_bytes(W));
    if (W.type == GgmlType::MXFP4 && T > mm::kGemvMaxTokens && std::min(isa, active_isa()) >= Isa::Avx2) {
        Plan q = make_plan(GgmlType::Q8_0, isa, W.n_in, T);
        q.convert = true;
        q.convert_q8 = true;
        q.gemv = nullptr;
        n.include(need_of(q, W.n_in, T));
    }
    return n;
}

Need multi_need(const MatmulOut* outs, int n, int64_t T, Isa isa) {
    Need need;
    for (int j = 0; j < n; ++j) need.include(need_for(*outs[j].W, isa, T));
    return need;
}

// matmul_swiglu's sections: its fused GEMM items, or matmul_multi of gate and up.
bool swiglu_fused(const Plan& p, const WeightView& G, const WeightView& U, int64_t T) {
    return U.type == G.type && U.n_in == G.n_in && U.n_out == G.n_out && !p.convert && !p.convert_gemm && use_gemm(p, T);
}
Need swiglu_need(const WeightView& G, const WeightView& U, int64_t T, Isa isa) {
    const Plan p = layout_plan(make_plan(G.type, isa, G.n_in, T), G, isa);  // (an MXFP4 weight converts: never fused)
    if (swiglu_fused(p, G, U, T)) return need_of(p, G.n_in, T, true, std::max(unpack_row_bytes(G), unpack_row_bytes(U)));
    const MatmulOut outs[2] = {{&G, nullptr}, {&U, nullptr}};
    return multi_need(outs, 2, T, isa);
}

// Calls of up to T tokens: within each of the paths' token ranges (row-dot, GEMV, GEMM) every
// section grows with T, so the largest call of each range bounds the others.
template <class F>
size_t up_to(int64_t T, const F& need) {
    Need n;
    for (int64_t t : {T, std::min<int64_t>(T, mm::kGemvMaxTokens), std::min<int64_t>(T, mm::kRowDotTokens)})
        if (t > 0) n.include(need(t));
    return n.bytes();
}

// The activations of a call, prepared once in the layout its path reads (GEMM panel or rows)
// into the call's act section.
struct Prepared {
    bool gemm = false;
    mm::ActRows rows;
    mm::ActPanel panel;
};
Prepared prepare(const Plan& p, const float* x, int64_t T, int64_t K, const Scratch& s) {
    Prepared a;
    a.gemm = use_gemm(p, T);
    if (a.gemm) mm::prep_panel(p.act, act_isa(p), x, T, K, s.act, a.panel);
    else mm::prep_rows(p.act, act_isa(p), x, T, K, s.act, a.rows);
    return a;
}

constexpr int kMaxGemvItems = 64;
constexpr int64_t kMinGemvRows = 256;
// One weight's share of a call: its work items are [first, first + count) of the region.
struct Job {
    const WeightView* W;
    float* y;
    int64_t first, count;
    int64_t n_chunks;        // GEMM: row chunks per token tile
    int64_t bounds[kMaxGemvItems + 1];  // GEMV: item i covers rows [bounds[i], bounds[i + 1])
    mm::GemvFn gemv = nullptr;  // this weight's GEMV where it is not the plan's (mixed K-quants)
    int64_t rows = 0;           // GEMM: rows per item (item_rows)
    bool tile_major = false;    // GEMM: token-tile-major items (tile_major_items)
};

// Decode GEMV items, guided: each item takes 1/(1.5 threads) of the rows still unassigned
// (at least kMinGemvRows), so a thread starts with one long run of rows (long memory streams)
// and the items shrink towards the end, where a thread that finishes first would otherwise
// wait up to a whole item at the barrier. Against the former 8 equal items per thread
// (tg48 on the 0.8B models, 5 alternated rounds each, 2026-11-30): BF16 29.0-29.7 -> 30.0-30.8
// t/s and Q8_0 49-50 -> 51-53.5 t/s in the host's fast memory phase, even in the slow one;
// 128 to 512 rows minimum and first items of 1/2 to 1/4 of the rows measured alike, while
// 1024 rows minimum lost 8% (too few items on the small matrices). Returns the item count.
// align: item bounds are multiples of it (but N): a repacked weight's groups of 16 rows.
int64_t guided_items(int64_t N, int threads, int64_t* bounds, int64_t align = 1) {
    int64_t r = 0, c = 0;
    bounds[0] = 0;
    while (r < N) {
        int64_t rows = std::max<int64_t>(kMinGemvRows, (N - r) * 2 / (3 * int64_t(threads)) + 1);
        if (c + 1 == kMaxGemvItems) rows = N - r;
        r = std::min(N, (r + rows + align - 1) / align * align);
        bounds[++c] = r;
    }
    return c;
}

// The weights of one call, which share the input (same type and n_in), in one pool region.
void run_jobs(const Plan& p, Job* jobs, int n_jobs, const float* x, int64_t T, const Scratch& s) {
    const int64_t K = jobs[0].W->n_in;
    const Prepared act = prepare(p, x, T, K, s);
    const bool gemm = act.gemm;
    const int threads = n_threads();
    const mm::ActRows& rows_act = act.rows;
    const mm::ActPanel& panel = act.panel;
    const size_t panel_bytes = gemm ? mm::act_panel_bytes(p.act, T, K) : 0;
    const int64_t G = (T + mm::kGroup - 1) / mm::kGroup;
    const bool gemv = !gemm && p.gemv != nullptr;
    const mm::TileKernel& kt = p.tile;
    const int64_t chunk = kTileRowGroups * kt.rows, n_tiles = gemm ? (G + kt.groups - 1) / kt.groups : 0;
    const int64_t n_row_tiles = (T + kRowDotTile - 1) / kRowDotTile;

    int64_t total = 0;
    for (int j = 0; j < n_jobs; ++j) {
        Job& jb = jobs[j];
        const int64_t N = jb.W->n_out;
        jb.first = total;
        if (gemm) {
            jb.n_chunks = (N + chunk - 1) / chunk;
            jb.rows = item_rows(jb.W->row_bytes, jb.W->layout == WeightLayout::KqRows16, N, chunk);
            jb.tile_major = tile_major_items(*jb.W, jb.rows, panel_bytes, n_tiles);
            jb.count = jb.tile_major ? n_tiles * jb.n_chunks : (N + jb.rows - 1) / jb.rows;
        } else if (gemv) {
            // Decode: contiguous row ranges per item (guided sizes), each streamed several rows at a time.
            jb.count = guided_items(N, threads, jb.bounds,
                                    jb.W->layout == WeightLayout::KqRows16   ? mm::kQ4KGroupRows
                                    : jb.W->layout == WeightLayout::Q8Rows16 ? mm::kQ8R16Rows
                                                                             : 1);
        } else {
            jb.n_chunks = (N + kRowChunk - 1) / kRowChunk;
            jb.count = n_row_tiles * jb.n_chunks;
        }
        total += jb.count;
    }
    const int ldt = kt.groups * mm::kGroup;
    parallel_for(total, [&](int64_t item, int thread) {
        int j = 0;
        while (item >= jobs[j].first + jobs[j].count) ++j;
        const Job& jb = jobs[j];
        const WeightView& W = *jb.W;
        const int64_t N = W.n_out, it = item - jb.first;
        if (gemm && !jb.tile_major) {
            float* tile = reinterpret_cast<float*>(s.thread(thread));  // [chunk][ldt]
            const int64_t r0 = it * jb.rows, rc = std::min(jb.rows, N - r0);
            // A repacked weight's rows unpacked (V holds rows r0 .. as 0 ..), others read in place.
            const bool unpack = W.layout == WeightLayout::KqRows16;
            const WeightView V = unpack ? gguf_rows(W, r0, rc, unpack_slice(p, s, thread)) : W;
            const int64_t v0 = unpack ? 0 : r0;
            float* y = unpack ? jb.y + r0 : jb.y;
            for (int64_t g0 = 0; g0 < G; g0 += kt.groups)
                for (int64_t c0 = 0; c0 < rc; c0 += chunk)
                    gemm_range(p, V, panel, v0 + c0, std::min(chunk, rc - c0), g0, int(std::min<int64_t>(kt.groups, G - g0)),
                               T, tile, ldt, y, N, stream_output(T, N));
        } else if (gemm) {
            const GemmItem gi = gemm_item(kt, it, jb.n_chunks, chunk, G, N);
            float* tile = reinterpret_cast<float*>(s.thread(thread));  // [chunk][ldt]
            gemm_range(p, W, panel, gi.r0, gi.rc, gi.g0, gi.nv, T, tile, ldt, jb.y, N, stream_output(T, N));
        } else if (gemv) {
            const int64_t r0 = jb.bounds[it], nr = jb.bounds[it + 1] - r0;
            if (p.gemv_all_tokens) {  // (Q8Rows16: every token per group of rows, in the kernel)
                p.gemv(W, r0, nr, rows_act, 0, int(T), jb.y, N);
                return;
            }
            const int64_t run = T <= mm::kRowDotTokens ? nr : mm::kGemvRunRows;
            for (int64_t r = r0; r < r0 + nr; r += run)
                for (int64_t t = 0; t < T; t += mm::kRowDotTokens) {
                    const int nt = int(std::min<int64_t>(mm::kRowDotTokens, T - t));
                    (jb.gemv ? jb.gemv : p.gemv)(W, r, std::min(run, r0 + nr - r), rows_act, t, nt, jb.y, N);
                }
        } else {
            const int64_t t0 = (it / jb.n_chunks) * kRowDotTile, r0 = (it % jb.n_chunks) * kRowChunk;
            rowdot_range(p, W, rows_act, r0, std::min(kRowChunk, N - r0), t0, std::min(kRowDotTile, T - t0), jb.y,
                         N);
        }
    });
}

// x [T, K] rounded through Q8_K or Q8_0 into the scratch (Plan::round_input), once per
// matmul_multi call however many of its weights need it.
const float* rounded_input(const float* x, int64_t T, int64_t K, InputRounding r, const Scratch& s) {
    float* out = s.rounded;
    if (r == InputRounding::Q8_K) {
        parallel_for(T, [&](int64_t t, int) { mm::q8k_round_row(x + t * K, K, out + t * K); });
    } else {
        parallel_for(T, [&](int64_t t, int) { mm::q8_round_row(x + t * K, K, out + t * K); });
    }
    return out;
}

// Converted weights (dequantized per item to fp32, then the F32 kernels over all tokens). x is
// already rounded where the plan's round_input says so.
void run_converted(const Plan& p, const WeightView& W, const float* x, float* y, int64_t T, const Scratch& s) {
    const int64_t K = W.n_in, N = W.n_out;
    const Prepared act = prepare(p, x, T, K, s);
    const bool gemm = act.gemm;
    const mm::ActRows& rows_act = act.rows;
    const mm::ActPanel& panel = act.panel;
    const int64_t G = (T + mm::kGroup - 1) / mm::kGroup;
    const int64_t items = (N + kConvertRows - 1) / kConvertRows;
    const int ldt = p.tile.groups * mm::kGroup;
    parallel_for(items, [&](int64_t it, int thread) {
        const int64_t r0 = it * kConvertRows, rc = std::min(kConvertRows, N - r0);
        uint8_t* buf = s.thread(thread);  // [kConvertRows * K] converted rows, then the tile
        float* wf = reinterpret_cast<float*>(buf);
        float* tile = wf + kConvertRows * K;
        WeightView V{GgmlType::F32, K, rc, reinterpret_cast<const uint8_t*>(wf), size_t(K) * 4};
        if (p.convert_q8 && W.layout == WeightLayout::Q8Rows16) {
            V = gguf_rows(W, r0, rc, buf);  // (this item's group, or its GGUF tail rows)
        } else if (p.convert_q8) {
            nibble_rows_to_q8_0(W, r0, rc, buf);
            V = WeightView{GgmlType::Q8_0, K, rc, buf, row_bytes(GgmlType::Q8_0, K)};
        } else {
            convert_rows(p, W, r0, rc, wf);
        }
        if (gemm) {
            for (int64_t g0 = 0; g0 < G; g0 += p.tile.groups)
                gemm_range(p, V, panel, 0, rc, g0, int(std::min<int64_t>(p.tile.groups, G - g0)), T, tile, ldt,
                           y + r0, N, stream_output(T, N));
        } else if (p.gemv) {  // (Q8Rows16 off VNNI: the GGUF plan's GEMV on the group's rows)
            for (int64_t t = 0; t < T; t += mm::kRowDotTokens)
                p.gemv(V, 0, rc, rows_act, t, int(std::min<int64_t>(mm::kRowDotTokens, T - t)), y + r0, N);
        } else {
            rowdot_range(p, V, rows_act, 0, rc, 0, T, y + r0, N);
        }
    });
}

}  // namespace

size_t matmul_workspace_bytes(const WeightView& W, int64_t T, Isa isa) {
    return up_to(T, [&](int64_t t) { return need_for(W, isa, t); });
}

size_t matmul_multi_workspace_bytes(const MatmulOut* outs, int n, int64_t T, Isa isa) {
    return up_to(T, [&](int64_t t) { return multi_need(outs, n, t, isa); });
}

size_t matmul_swiglu_workspace_bytes(const WeightView& gate, const WeightView& up, int64_t T, Isa isa) {
    return up_to(T, [&](int64_t t) { return swiglu_need(gate, up, t, isa); });
}

void matmul_multi(const MatmulOut* outs, int n, const float* x, int64_t T, Isa isa, void* workspace) {
    if (T <= 0 || n <= 0) return;
    constexpr int kMaxJobs = 8;
    bool shared = n <= kMaxJobs;
    for (int j = 0; j < n; ++j) {
        check_shape(*outs[j].W);
        shared = shared && outs[j].W->type == outs[0].W->type && outs[j].W->n_in == outs[0].W->n_in &&
                 outs[j].W->layout == outs[0].W->layout;
    }
    const Plan p = plan_for(*outs[0].W, isa, T);
    // K-quants of several types (a Q4_K_M file's q/k/v beside Q4_K gate, beta, alpha) at decode:
    // every GEMV reads the same Q8_K rows, so they share one preparation and one pool region,
    // each weight through its own GEMV (the bits of its lone call).
    bool mixed_q8k = !shared && n <= kMaxJobs && p.act == ActKind::Q8K && p.gemv && !use_gemm(p, T);
    std::array<mm::GemvFn, kMaxJobs> gemv_of{};
    for (int j = 0; j < n && mixed_q8k; ++j) {
        const Plan pj = j == 0 ? p : plan_for(*outs[j].W, isa, T);
        mixed_q8k = outs[j].W->n_in == outs[0].W->n_in && pj.act == ActKind::Q8K && pj.gemv && !use_gemm(pj, T) &&
                    !pj.convert && pj.round_input == p.round_input;
        gemv_of[size_t(j)] = pj.gemv;
    }
    if (mixed_q8k) {
        const Scratch s = carve(multi_need(outs, n, T, isa), workspace);
        Job jobs[kMaxJobs];
        int n_jobs = 0;
        for (int j = 0; j < n; ++j)
            if (outs[j].W->n_out > 0) {
                jobs[n_jobs] = Job{outs[j].W, outs[j].y, 0, 0, 0, {}};
                jobs[n_jobs++].gemv = gemv_of[size_t(j)];
            }
        if (n_jobs > 0) run_jobs(p, jobs, n_jobs, x, T, s);
        return;
    }
    if (!shared || p.convert || (p.convert_gemm && use_gemm(p, T))) {
        const Scratch s = carve(multi_need(outs, n, T, isa), workspace);
        // x rounded for the first weight needing it, reused by the next ones needing the same.
        const float* xq = nullptr;
        InputRounding xq_kind = InputRounding::None;
        for (int j = 0; j < n; ++j) {
            const Plan pj = j == 0 ? p : plan_for(*outs[j].W, isa, T);  // (MXFP4's scan once per weight)
            if (pj.convert || (pj.convert_gemm && use_gemm(pj, T))) {
                const InputRounding r = pj.round_input;
                if (r != InputRounding::None && r != xq_kind && outs[j].W->n_out > 0) {
                    xq = rounded_input(x, T, outs[j].W->n_in, r, s);
                    xq_kind = r;
                }
                if (outs[j].W->n_out > 0) run_converted(pj, *outs[j].W, r != InputRounding::None ? xq : x, outs[j].y, T, s);
            } else {
                Job jb{outs[j].W, outs[j].y, 0, 0, 0, {}};
                if (outs[j].W->n_out > 0) run_jobs(pj, &jb, 1, x, T, s);
            }
        }
        return;
    }
    // One plan for all (same type and n_in): its sections, within multi_need's.
    const Scratch s = carve(need_of(p, outs[0].W->n_in, T, false, unpack_row_bytes(*outs[0].W)), workspace);
    Job jobs[kMaxJobs];
    int n_jobs = 0;
    for (int j = 0; j < n; ++j)
        if (outs[j].W->n_out > 0) jobs[n_jobs++] = Job{outs[j].W, outs[j].y, 0, 0, 0, {}};
    if (n_jobs > 0) run_jobs(p, jobs, n_jobs, x, T, s);
}

void matmul(const WeightView& W, const float* x, float* y, int64_t T, Isa isa, void* workspace) {
    const MatmulOut out{&W, y};
    matmul_multi(&out, 1, x, T, isa, workspace);
}

void matmul_swiglu(const WeightView& G, const WeightView& U, const float* x, float* y, float* u, int64_t T, Isa isa,
                   void* workspace) {
    if (T <= 0) return;
    check_shape(G);
    check_shape(U);
    const Plan p = plan_for(G, isa, T);
    const int64_t N = G.n_out;
    if (!swiglu_fused(p, G, U, T)) {
        const MatmulOut outs[2] = {{&G, y}, {&U, u}};
        matmul_multi(outs, 2, x, T, isa, workspace);
        swiglu(y, u, y, T * N, std::min(isa, active_isa()));
        return;
    }
    // Each item makes the gate and up tiles of its rows and tokens (the items of run_jobs for
    // one weight), combines them in the tile and stores the result once.
    const Scratch s = carve(need_of(p, G.n_in, T, true, std::max(unpack_row_bytes(G), unpack_row_bytes(U))), workspace);
    const Prepared act = prepare(p, x, T, G.n_in, s);
    const mm::TileKernel& kt = p.tile;
    const int64_t G_tok = (T + mm::kGroup - 1) / mm::kGroup, chunk = kTileRowGroups * kt.rows;
    const int64_t n_chunks = (N + chunk - 1) / chunk, n_tiles = (G_tok + kt.groups - 1) / kt.groups;
    const int ldt = kt.groups * mm::kGroup;
    const Isa swiglu_isa = std::min(isa, active_isa());
    // Items as run_jobs's (item_rows; repacked gate / up rows unpacked once an item).
    const bool repacked = G.layout == WeightLayout::KqRows16 || U.layout == WeightLayout::KqRows16;
    const auto item = [&](const WeightView& VG, const WeightView& VU, int64_t r0, int64_t rc, int64_t g0, int nv,
                          float* tg, float* tu, float* yo) {
        const int64_t tn = std::min<int64_t>(nv * mm::kGroup, T - g0 * mm::kGroup);
        gemm_tile(p, VG, act.panel, r0, rc, g0, nv, T, tg, ldt);
        gemm_tile(p, VU, act.panel, r0, rc, g0, nv, T, tu, ldt);
        for (int64_t r = 0; r < rc; ++r) swiglu(tg + r * ldt, tu + r * ldt, tg + r * ldt, tn, swiglu_isa);
        store_tile(p, tg, ldt, r0, rc, g0, nv, T, yo, N, stream_output(T, N));
    };
    const size_t urb = std::max(unpack_row_bytes(G), unpack_row_bytes(U));
    const int64_t ur = item_rows(std::max(G.row_bytes, U.row_bytes), repacked, N, chunk);
    const size_t panel_bytes = mm::act_panel_bytes(p.act, T, G.n_in);
    const bool tile_major = tile_major_items(G, ur, panel_bytes, n_tiles) && tile_major_items(U, ur, panel_bytes, n_tiles);
    parallel_for(tile_major ? n_tiles * n_chunks : (N + ur - 1) / ur, [&](int64_t it, int thread) {
        float* tg = reinterpret_cast<float*>(s.thread(thread));  // [chunk][ldt] gate, then up
        float* tu = tg + chunk * ldt;
        if (tile_major) {
            const GemmItem gi = gemm_item(kt, it, n_chunks, chunk, G_tok, N);
            item(G, U, gi.r0, gi.rc, gi.g0, gi.nv, tg, tu, y);
            return;
        }
        const int64_t r0 = it * ur, rc = std::min(ur, N - r0);
        // Repacked rows unpacked (the views hold rows r0 .. as 0 ..), others read in place.
        uint8_t* buf = unpack_slice(p, s, thread, true);
        const WeightView VG = repacked ? gguf_rows(G, r0, rc, buf) : G;
        const WeightView VU = repacked ? gguf_rows(U, r0, rc, buf + size_t(item_rows_cap(urb, mm::kQ4KGroupRows)) * urb) : U;
        const int64_t v0 = repacked ? 0 : r0;
        for (int64_t g0 = 0; g0 < G_tok; g0 += kt.groups)
            for (int64_t c0 = 0; c0 < rc; c0 += chunk)
                item(VG, VU, v0 + c0, std::min(chunk, rc - c0), g0, int(std::min<int64_t>(kt.groups, G_tok - g0)), tg, tu,
                     repacked ? y + r0 : y);
    });
}

// The caller-owned scratch overloads: the workspace entry on a buffer that grows to the
// largest call it has served.
void matmul(const WeightView& W, const float* x, float* y, int64_t T, Isa isa, MatmulScratch& s) {
    matmul(W, x, y, T, isa, s.get(matmul_workspace_bytes(W, T, isa)));
}

void matmul_multi(const MatmulOut* outs, int n, const float* x, int64_t T, Isa isa, MatmulScratch& s) {
    matmul_multi(outs, n, x, T, isa, s.get(matmul_multi_workspace_bytes(outs, n, T, isa)));
}

void matmul_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* y, float* u, int64_t T, Isa isa,
                   MatmulScratch& s) {
    matmul_swiglu(gate, up, x, y, u, T, isa, s.get(matmul_swiglu_workspace_bytes(gate, up, T, isa)));
}

// The convenience overloads (tests, test-ops): a workspace of their own per call. The model's
// plans give theirs (runtime/cpu_backend.cpp).
void matmul_swiglu(const WeightView& gate, const WeightView& up, const float* x, float* y, float* u, int64_t T) {
    MatmulScratch s;
    matmul_swiglu(gate, up, x, y, u, T, active_isa(), s);
}

void matmul_multi(const MatmulOut* outs, int n, const float* x, int64_t T) {
    MatmulScratch s;
    matmul_multi(outs, n, x, T, active_isa(), s);
}

void matmul(const WeightView& W, const float* x, float* y, int64_t T) {
    MatmulScratch s;
    matmul(W, x, y, T, active_isa(), s);
}

void matmul_effective_input(GgmlType wtype, const float* x, float* out, int64_t T, int64_t n_in) {
    const size_t n = size_t(T * n_in);
    if (wtype == GgmlType::Q8_0 || wtype == GgmlType::Q4_0 || wtype == GgmlType::IQ4_NL || wtype == GgmlType::MXFP4) {
        for (int64_t t = 0; t < T; ++t) mm::q8_round_row(x + t * n_in, n_in, out + t * n_in);
    } else if (mm::uses_q8k(wtype)) {
        for (int64_t t = 0; t < T; ++t) mm::q8k_round_row(x + t * n_in, n_in, out + t * n_in);
    } else if (wtype == GgmlType::BF16) {
        for (size_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
    } else {
        std::memcpy(out, x, n * sizeof(float));
    }
}

namespace {
// Repacks a matrix in place, group by group of `group_bytes` (a copy of the group, then
// repack(copy, group)), in parallel items of 64 groups.
template <class F>
void repack_groups(uint8_t* data, int64_t groups, size_t group_bytes, F&& repack) {
    const int64_t per_item = 64, items = (groups + per_item - 1) / per_item;
    parallel_for(items, [&](int64_t it, int) {
        std::vector<uint8_t> tmp(group_bytes);
        for (int64_t g = it * per_item; g < std::min(groups, (it + 1) * per_item); ++g) {
            uint8_t* grp = data + size_t(g) * group_bytes;
            std::memcpy(tmp.data(), grp, group_bytes);
            repack(tmp.data(), grp);
        }
    });
}
}  // namespace

static_assert(kRepackGroupRows == mm::kQ4KGroupRows && kRepackGroupRows == mm::kQ8R16Rows,
              "kRepackGroupRows names both layouts' group");

bool repack_weight(WeightView& W, uint8_t* data) {
    // (Only a whole matrix: a view of part of each row, row_bytes past its n_in, keeps its layout.)
    if (W.type == GgmlType::Q8_0) {
        if (W.layout != WeightLayout::Gguf || W.n_out < mm::kQ8R16Rows || W.n_in % mm::kQ8 != 0 ||
            W.row_bytes != row_bytes(W.type, W.n_in) || data != W.data)
            return false;
        const int64_t nb = W.n_in / mm::kQ8;
        const size_t rb = W.row_bytes;
        repack_groups(data, W.n_out / mm::kQ8R16Rows, size_t(mm::kQ8R16Rows) * rb,
                      [&](const uint8_t* src, uint8_t* dst) { mm::q8_r16_repack_group(src, rb, nb, dst); });
        W.layout = WeightLayout::Q8Rows16;
        return true;
    }
    if (!mm::kq_repacks(W.type) || W.layout != WeightLayout::Gguf || W.n_out < mm::kQ4KGroupRows ||
        W.n_in % mm::kQK != 0 || W.row_bytes != row_bytes(W.type, W.n_in) || data != W.data)
        return false;
    const int64_t nb = W.n_in / mm::kQK;
    const GgmlType t = W.type;
    repack_groups(data, W.n_out / mm::kQ4KGroupRows, size_t(mm::kQ4KGroupRows) * W.row_bytes,
                  [&](const uint8_t* src, uint8_t* dst) { mm::kq_repack_group(t, src, nb, dst); });
    W.layout = WeightLayout::KqRows16;
    return true;
}

bool repack_enabled(GgmlType t) {
    // Q8_0: ALLOY_Q8_REPACK unset or 1: repacked (WeightLayout::Q8Rows16) where its kernels run,
    // AVX512-VNNI (ALLOY_ISA not lowered); 0: as stored (A/B).
    if (t == GgmlType::Q8_0) {
        static const bool q8 = [] {
            const char* v = std::getenv("ALLOY_Q8_REPACK");
            return (!v || std::atoi(v) != 0) && active_isa() == Isa::Avx512 && mm::cpu_has_avx512_vnni();
        }();
        return q8;
    }
    // Unset or 1: every type that has the layout; 0: none; else the types named
    // (q4_k,q5_k,q6_k,iq4_xs).
    static const std::string e = [] { const char* v = std::getenv("ALLOY_KQ_REPACK"); return std::string(v ? v : "1"); }();
    if (e == "1") return mm::kq_repacks(t);
    if (e == "0") return false;
    std::string name = type_traits(t).name, list = e;
    for (char& c : list) c = char(std::tolower(static_cast<unsigned char>(c)));
    for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    return mm::kq_repacks(t) && ("," + list + ",").find("," + name + ",") != std::string::npos;
}

const uint8_t* weight_row(const WeightView& W, int64_t r, uint8_t* buf) {
    if (W.layout == WeightLayout::Q8Rows16) {
        if (r >= mm::q8_r16_rows(W)) return W.row(r);
        mm::q8_r16_unpack_row(W.row(r - r % mm::kQ8R16Rows), W.n_in / mm::kQ8, int(r % mm::kQ8R16Rows), buf);
        return buf;
    }
    return mm::kq_gguf_row(W, r, buf);
}

std::string matmul_path(GgmlType wtype, Isa isa, int64_t n_in, int64_t T) {
    const Plan p = make_plan(wtype, isa, n_in, T);
    return p.name + (use_gemm(p, T) ? " gemm" : p.gemv ? " gemv" : " rowdot");
}

}  // namespace alloy::cpu
