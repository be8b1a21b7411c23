// Activation preparation for the matmul kernels: once per call, x [T, K] fp32 becomes what the
// kernels read (Q8_0 blocks, bf16, or fp32), token-major (ActRows) or token-vectorised in
// groups of 16 tokens (ActPanel). Internal to kernels/cpu.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul_kernels.h"

namespace alloy::cpu::mm {

enum class ActKind {
    Q8,        // Q8_0 blocks (q, d, corr)
    Q8K,       // Q8_K blocks (q, d, bsums), for the K-quant decode GEMVs (rows only)
    Bf16Bits,  // bf16 bits, for vdpbf16ps
    Bf16F32,   // fp32 rounded to bf16, for the BF16 paths without AVX512-BF16
    F32,       // fp32 unchanged
};

// Bytes of the buffer each layout needs (64-byte aligned sections inside). A panel's buffer
// also holds prep_panel's row buffers, one per pool thread (n_threads() at the time of asking).
size_t act_rows_bytes(ActKind kind, int64_t T, int64_t K);
size_t act_panel_bytes(ActKind kind, int64_t T, int64_t K);

// Fill `buf` (act_*_bytes, 64-byte aligned) and point `out` into it (F32 rows point at x
// itself). `isa` picks the converters (AVX-512, AVX2 or scalar; all give the same bits).
// prep_panel runs on the thread pool; prep_rows on the calling thread.
void prep_rows(ActKind kind, Isa isa, const float* x, int64_t T, int64_t K, uint8_t* buf, ActRows& out);
void prep_panel(ActKind kind, Isa isa, const float* x, int64_t T, int64_t K, uint8_t* buf, ActPanel& out);

}  // namespace alloy::cpu::mm
