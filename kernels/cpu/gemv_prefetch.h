// Software prefetch for the streaming decode GEMVs over repacked rows (matmul_q8_gemv_avx512.cpp,
// matmul_kquant_vnni.cpp). A decode GEMV reads each weight byte once, in address order, one
// stream a thread. On the Intel Xeon (KVM, family 6 model 167) one core's stream runs at ~16 GB/s
// without help and the kernels' arithmetic does not overlap the misses well: asking for the
// lines a short distance ahead into L2 (prefetcht1) lifted the 0.8B tg64 by 5-14% (2026-12-05,
// RESULTS; distances swept 256-4096 bytes: Q8_0 best at 2-3 KiB, the K-quants, whose
// arithmetic per byte is larger, at 256-512 bytes, both lose past that). On Zen 4 a prefetch 4
// Q8_0 blocks ahead lost at one token (session 28), so other CPUs keep the hardware prefetcher
// alone. ALLOY_GEMV_PREFETCH=N sets both distances in bytes (0: none) for A/B runs.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace alloy::cpu::mm {

// The distances in bytes (0: no software prefetch), decided once: the Q8_0 GEMV's and the
// K-quant GEMVs'.
int gemv_prefetch_q8_bytes();
int gemv_prefetch_kquant_bytes();

// Prefetches into L2 the lines of [p, p + bytes) `dist` bytes ahead (one of the distances
// above, read once by the caller (past a group's end it reaches the next group's bytes, which
// the same work item reads next).
inline void gemv_prefetch(const uint8_t* p, int bytes, int dist) {
    if (dist <= 0) return;
    const char* q = reinterpret_cast<const char*>(p) + dist;
    for (int i = 0; i < bytes; i += 64) _mm_prefetch(q + i, _MM_HINT_T1);
}

}  // namespace alloy::cpu::mm
