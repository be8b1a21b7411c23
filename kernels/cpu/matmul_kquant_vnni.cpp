// K-quant decode GEMVs with AVX512-VNNI on 256-bit vectors: matmul_kquant_rows.inc with one
// vpdpwssd for each vpmaddwd + vpaddd of the AVX2 file (the same integers, so the same bits).
// Zen 4 runs 512-bit integer ops as two 256-bit halves, so wider vectors would not move more
// bytes per cycle; the fused multiply-add cuts the instruction count of the per-token part.
#include <immintrin.h>

#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_kquant.h"

#define KQ_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define KQ_DPWSSD(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))

namespace alloy::cpu::mm {
namespace {
#include "kernels/cpu/matmul_kquant_rows.inc"
}  // namespace

GemvFn kquant_gemv_vnni(GgmlType type) { return kq_gemv_for(type); }

}  // namespace alloy::cpu::mm
