// Shared-memory addresses, mbarriers and asynchronous stores to other blocks of a cluster (sm_90).
// Used by the chunked GDN scans (TMA / bulk-copy rings) and by the fused GDN decode kernel (its
// o rows reach the blocks of a value head by st.async, counted on the receiver's mbarrier).
#pragma once

#include <cstdint>

namespace alloy::cuda::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The shared::cluster address of `p`'s place in the shared memory of the cluster's block `rank`.
// Volatile although mapa is pure: the decode kernel with a non-volatile mapa of the row base plus
// element offsets measured +2% a step (H100, session 43), so the issue order is kept as it is.
__device__ __forceinline__ uint32_t cluster_smem_u32(const void* p, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
    return r;
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes this thread's mbarrier initialisations visible to the cluster (before a cluster barrier
// after which other blocks signal them).
__device__ __forceinline__ void mbar_init_fence_cluster() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Release at CTA scope: this thread's shared-memory writes (or reads) before it are ordered
// before the waiter's accesses after its wait.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the phase of parity `parity` has completed (acquire at CTA scope).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT_%=;\n}\n" ::"r"(
            smem_u32(bar)),
        "r"(parity)
        : "memory");
}
// The same with acquire at cluster scope: for phases completed by other blocks' st.async.
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n@!p bra "
        "WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}
// Non-blocking test of an mbarrier phase (true once the phase of parity `parity` completed).
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
    uint32_t ok;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
    return ok != 0;
}
// One arrival that also expects `bytes` more bytes of bulk copies (or st.async) in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}
// 4 bytes into the shared memory of a block of the cluster (shared::cluster addresses from
// cluster_smem_u32), counted as 4 transaction bytes on that block's mbarrier `bar` (no cluster
// barrier: the receiver waits on its own mbarrier).
__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
                 "r"(__float_as_uint(v)), "r"(bar)
                 : "memory");
}

}  // namespace alloy::cuda::detail
