// AVX2 K-quant decode GEMVs: matmul_kquant_rows.inc with vpmaddwd + vpaddd. Also the path of
// AVX-512 CPUs without VNNI; at decode the packed weights are memory-bound.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/gemv_prefetch.h"
#include "kernels/cpu/matmul_gemv_rows.h"
#include "kernels/cpu/matmul_kquant.h"

#define KQ_TARGET __attribute__((target("avx2,fma,f16c")))
#define KQ_DPWSSD(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))

namespace alloy::cpu::mm {
namespace {
#include "kernels/cpu/matmul_kquant_rows.inc"
}  // namespace

GemvFn kquant_gemv_avx2(GgmlType type) { return kq_gemv_for(type); }
GemvFn kq_r16_gemv_avx2(GgmlType type) { return kq_r16_for(type); }

}  // namespace alloy::cpu::mm
