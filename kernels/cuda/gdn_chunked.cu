// Chunked gated delta rule (prefill) on CUDA (kernels/cuda/gdn.h), d_k = d_v = 128, chunk C = 64,
// bf16 tensor-core products (mma.sync m16n8k16) with fp32 accumulation and an fp32 state.
//
// Math: spec/GDN.md section 2, rearranged so that stage 1 produces only what does not depend on
// the value columns, and stage 2 never needs W = T (beta e^G K) or U = T (beta V):
//   Delta = T (beta V - beta e^G (K S0))      [C, d_v]   ((I + A) Delta = beta V - beta e^G K S0)
//   O     = e^G (Q S0) + (Q K^T .* M) Delta    [C, d_v]
//   S_C   = e^{G_C} S0 + (K .* e^{G_C - G})^T Delta
// Stage 1 (one block per (chunk, value head), all in parallel): G = cumsum g, K K^T and Q K^T
// (tensor cores), A = beta K K^T .* decay, T = (I + A)^-1 in fp32 (16 x 16 diagonal blocks by
// substitution, merged blockwise), written as a 16.5 KB record per (chunk, head): G, beta, T and
// QKM = Q K^T .* M in bf16. That record is the only intermediate that goes through HBM (fla
// writes A, w, u, v_new and a state per chunk, ~7x the minimal bytes).
// Stage 2 (one block per (sequence, value head, slice of BV value columns)): the scan over the
// sequence's chunks with the fp32 state slice S^T [BV, 128] in registers (mma accumulators);
// per chunk five products, every one with the small state-sized operand as the mma's M side so
// that the chunk tiles (K, Q, T, QKM, 56 KB) are read from shared memory once per block:
//   Y^T = S^T K^T, X^T = S^T Q^T          [BV, 64], K = 128
//   Delta'^T = (V^T - Y^T e^G) beta        (elementwise)
//   Delta^T  = Delta'^T T^T                [BV, 64], K = 64 (causal half)
//   O^T      = X^T e^G + Delta^T QKM^T     [BV, 64], K = 64 (causal half)
//   S^T      = e^{G_C} S^T + (Delta^T e^{G_C - G}) K    [BV, 128], K = 64
// The next chunk's tiles stream in with cp.async while the current one computes. Splitting the
// value columns (BV = 32 or 16) gives H_v x 128 / BV blocks, so 16 heads of one sequence still
// spread over the H200's 132 SMs (the launch gate below picks BV).
//
// Never exponentiates a positive number: exp(G_r - G_s) only for s <= r, e^{G_r}, e^{G_C - G_r}.
// Tail chunks are padded in shared memory with zero q, k, v and beta = 0, g = 0 (neither the
// state nor the real rows' outputs change); padded rows are not written.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "alloy/error.h"
#include "kernels/cuda/gdn.h"
#include "kernels/ref/gdn_common.h"

namespace alloy::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kC = 64;        // chunk size
constexpr int kD = 128;       // d_k = d_v
constexpr int kThreads = 128; // 4 warps in both stages
// Shared-memory row pitches (elements), padded by 16 bytes so that the 8 row addresses of an
// ldmatrix land in distinct banks (272- and 144-byte rows: 4-word bank steps).
constexpr int kPD = kD + 8;
constexpr int kPC = kC + 8;

// Stage 1's output per (chunk, value head), read by stage 2 with 16-byte copies.
struct alignas(16) ChunkRecord {
    float G[kC];          // cumulative log decay in the chunk (padded rows: G[n-1])
    float beta[kC];       // padded rows: 0
    bf16 T[kC * kC];      // (I + A)^-1, [r][s], unit lower triangular
    bf16 QKM[kC * kC];    // (Q K^T) .* M, [r][s], zero above the diagonal
};

// ---- PTX wrappers ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is not read then).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p))
                 : "memory");
}
// c += a b, m16n8k16, bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Fragment addresses (lane-dependent) for ldmatrix.x4 on a row-major shared tile of pitch P:
// A operand (16 x 16 at rows m0, cols k0 of an [m][k] tile).
__device__ __forceinline__ const bf16* a_addr(const bf16* t, int P, int m0, int k0, int lane) {
    return t + (m0 + (lane & 15)) * P + k0 + ((lane >> 4) << 3);
}
// B operand of two n-tiles (n0, n0 + 8) x k16 from an [n][k] tile: regs {b0, b1} of n0, {b0, b1} of n0 + 8.
__device__ __forceinline__ const bf16* b_addr(const bf16* t, int P, int n0, int k0, int lane) {
    return t + (n0 + (lane & 7) + ((lane >> 4) << 3)) * P + k0 + (((lane >> 3) & 1) << 3);
}
// The same from a [k][n] tile, with ldmatrix.trans.
__device__ __forceinline__ const bf16* bt_addr(const bf16* t, int P, int k0, int n0, int lane) {
    return t + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * P + n0 + ((lane >> 4) << 3);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ int key_head(const ref::GdnShape& sh, int h) {
    return sh.tiled ? h % sh.H_k : h / (sh.H_v / sh.H_k);
}

// ---- chunk table: cstart[s] = index of sequence s's first chunk, cstart[n_seqs] = total ----

__global__ void chunk_table_kernel(const int32_t* __restrict__ offs, int n_seqs, int32_t* __restrict__ cstart) {
    const int lane = threadIdx.x;
    int carry = 0;
    if (lane == 0) cstart[0] = 0;
    for (int base = 0; base < n_seqs; base += 32) {
        const int s = base + lane;
        int n = s < n_seqs ? (offs[s + 1] - offs[s] + kC - 1) / kC : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, n, o);
            if (lane >= o) n += x;
        }
        if (s < n_seqs) cstart[s + 1] = carry + n;
        carry += __shfl_sync(0xffffffffu, n, 31);
    }
}

// ---- stage 1 ----

// Shared memory of stage 1: the K and Q tiles, then (aliased once the products are done) A and T
// in fp32.
struct alignas(16) Stage1Smem {
    union alignas(16) {
        struct alignas(16) {
            bf16 K[kC * kPD];
            bf16 Q[kC * kPD];
        } in;
        struct {
            float A[kC * (kC + 1)];
            float T[kC * (kC + 1)];
        } tri;
    } u;
    float X[3][16][17];  // off-diagonal merge scratch
    float G[kC], beta[kC];
};

__global__ void __launch_bounds__(kThreads) stage1_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                          const int32_t* __restrict__ cstart, int n_seqs,
                                                          const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                          const float* __restrict__ g,
                                                          const float* __restrict__ beta,
                                                          ChunkRecord* __restrict__ rec) {
    __shared__ Stage1Smem sm;
    const int c = blockIdx.x, h = blockIdx.y;
    if (c >= cstart[n_seqs]) return;
    // The sequence of chunk c: the largest s with cstart[s] <= c (skips empty sequences).
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cstart[mid] <= c) lo = mid;
        else hi = mid - 1;
    }
    const int seq = lo;
    const int t0 = offs[seq] + (c - cstart[seq]) * kC, n = min(kC, offs[seq + 1] - t0);
    const int kh = key_head(sh, h), H_k = sh.H_k, H_v = sh.H_v;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    ChunkRecord* R = rec + (size_t)c * H_v + h;

    // Q and K rows of the chunk (zeros past n).
    for (int idx = tid; idx < kC * 16; idx += kThreads) {
        const int r = idx >> 4, cc = (idx & 15) * 8;
        const size_t row = ((size_t)(t0 + min(r, n - 1)) * H_k + kh) * kD + cc;
        cp_async16(sm.u.in.K + r * kPD + cc, k + row, r < n);
        cp_async16(sm.u.in.Q + r * kPD + cc, q + row, r < n);
    }
    cp_async_commit();
    // G = inclusive cumsum of g in the chunk (warp 0, two values per lane), beta.
    if (w == 0) {
        const int r0 = 2 * lane, r1 = 2 * lane + 1;
        const float g0 = r0 < n ? g[(size_t)(t0 + r0) * H_v + h] : 0.0f;
        const float g1 = r1 < n ? g[(size_t)(t0 + r1) * H_v + h] : 0.0f;
        float s = g0 + g1;
        for (int o = 1; o < 32; o <<= 1) {
            const float x = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += x;
        }
        const float excl = s - (g0 + g1);
        sm.G[r0] = excl + g0;
        sm.G[r1] = s;
        sm.beta[r0] = r0 < n ? beta[(size_t)(t0 + r0) * H_v + h] : 0.0f;
        sm.beta[r1] = r1 < n ? beta[(size_t)(t0 + r1) * H_v + h] : 0.0f;
    }
    cp_async_wait_all();
    __syncthreads();

    // K K^T and Q K^T for rows [16w, 16w + 16), columns s < 16w + 16 (the rest is masked).
    float kk[8][4], qk[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) kk[i][e] = qk[i][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t ak[4], aq[4];
        ldsm_x4(ak, a_addr(sm.u.in.K, kPD, 16 * w, 16 * ks, lane));
        ldsm_x4(aq, a_addr(sm.u.in.Q, kPD, 16 * w, 16 * ks, lane));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            if (np > w) break;
            uint32_t b[4];
            ldsm_x4(b, b_addr(sm.u.in.K, kPD, 16 * np, 16 * ks, lane));
            mma(kk[2 * np], ak, b[0], b[1]);
            mma(kk[2 * np + 1], ak, b[2], b[3]);
            mma(qk[2 * np], aq, b[0], b[1]);
            mma(qk[2 * np + 1], aq, b[2], b[3]);
        }
    }
    __syncthreads();  // K, Q dead: A and T reuse their space

    // A = beta_r (k_r . k_s) e^{G_r - G_s} (s < r) into shared fp32; QKM (s <= r) straight to the record.
    const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = 16 * w + gq + 8 * hh, s = 8 * nt + 2 * tq;
            float a2[2], m2[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int ss = s + e;
                const bool in = nt <= 2 * w + 1;  // computed tile
                const float dec = ss <= r ? __expf(sm.G[r] - sm.G[ss]) : 0.0f;
                a2[e] = in && ss < r ? sm.beta[r] * kk[nt][2 * hh + e] * dec : 0.0f;
                m2[e] = in && ss <= r ? qk[nt][2 * hh + e] * dec : 0.0f;
                sm.u.tri.A[r * (kC + 1) + ss] = a2[e];
            }
            *reinterpret_cast<uint32_t*>(R->QKM + r * kC + s) = pack_bf16(m2[0], m2[1]);
        }
    }
    __syncthreads();

    // Diagonal 16 x 16 blocks of T by forward substitution: warp w, lane c (mod 16) owns column c.
    {
        const int cc = lane & 15, base = 16 * w;
        float col[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float v = r == cc ? 1.0f : 0.0f;
#pragma unroll
            for (int s = 0; s < r; ++s) v -= sm.u.tri.A[(base + r) * (kC + 1) + base + s] * col[s];
            col[r] = v;
            if (lane < 16) sm.u.tri.T[(base + r) * (kC + 1) + base + cc] = v;
        }
    }
    __syncthreads();
    // Off-diagonal blocks, by distance d from the diagonal: T_ij = -T_ii sum_{j<=m<i} A_im T_mj.
    for (int d = 1; d < 4; ++d) {
        const int nb = 4 - d;
        for (int idx = tid; idx < nb * 256; idx += kThreads) {
            const int b = idx >> 8, a = (idx >> 4) & 15, bb = idx & 15, j = b, i = b + d;
            float x = 0.0f;
            for (int m = 16 * j; m < 16 * i; ++m)
                x += sm.u.tri.A[(16 * i + a) * (kC + 1) + m] * sm.u.tri.T[m * (kC + 1) + 16 * j + bb];
            sm.X[b][a][bb] = x;
        }
        __syncthreads();
        for (int idx = tid; idx < nb * 256; idx += kThreads) {
            const int b = idx >> 8, a = (idx >> 4) & 15, bb = idx & 15, j = b, i = b + d;
            float t = 0.0f;
            for (int m = 0; m <= a; ++m) t += sm.u.tri.T[(16 * i + a) * (kC + 1) + 16 * i + m] * sm.X[b][m][bb];
            sm.u.tri.T[(16 * i + a) * (kC + 1) + 16 * j + bb] = -t;
        }
        __syncthreads();
    }
    // The record: T in bf16 (zero above the diagonal blocks), G, beta.
    for (int idx = tid; idx < kC * kC / 2; idx += kThreads) {
        const int r = idx >> 5, s = (idx & 31) * 2;
        const bool in = (s >> 4) <= (r >> 4);
        const float t0v = in ? sm.u.tri.T[r * (kC + 1) + s] : 0.0f, t1v = in ? sm.u.tri.T[r * (kC + 1) + s + 1] : 0.0f;
        *reinterpret_cast<uint32_t*>(R->T + r * kC + s) = pack_bf16(t0v, t1v);
    }
    if (tid < kC) {
        R->G[tid] = sm.G[tid];
        R->beta[tid] = sm.beta[tid];
    }
}

// ---- stage 2 ----

template <int BV>
struct alignas(16) Stage2Buf {
    bf16 K[kC * kPD];
    bf16 Q[kC * kPD];
    bf16 T[kC * kPC];
    bf16 M[kC * kPC];
    bf16 V[kC * (BV + 8)];
    float G[kC], beta[kC];
};
template <int BV>
struct alignas(16) Stage2Smem {
    Stage2Buf<BV> buf[2];
    bf16 Sb[BV * kPD];   // S^T in bf16, [j][i]
    bf16 Dp[BV * kPC];   // Delta'^T, [j][s]
    bf16 Dm[BV * kPC];   // Delta^T
    bf16 Dt[BV * kPC];   // Delta^T .* e^{G_C - G}
    float O[kC * (BV + 4)];  // O of the previous chunk, [r][j], for coalesced stores
};

template <int BV, typename OutT>
__global__ void __launch_bounds__(kThreads, 1) stage2_kernel(ref::GdnShape sh, const int32_t* __restrict__ offs,
                                                             const int32_t* __restrict__ cstart,
                                                             const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                             const bf16* __restrict__ v,
                                                             const ChunkRecord* __restrict__ rec,
                                                             float* __restrict__ state, OutT* __restrict__ out) {
    constexpr int MT = BV / 16;  // m-tiles of value columns
    extern __shared__ __align__(16) unsigned char smem_raw[];
    Stage2Smem<BV>& sm = *reinterpret_cast<Stage2Smem<BV>*>(smem_raw);
    const int vs = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
    const int t_begin = offs[seq], t_end = offs[seq + 1];
    if (t_begin == t_end) return;
    const int c_first = cstart[seq], c_last = cstart[seq + 1];
    const int H_k = sh.H_k, H_v = sh.H_v, kh = key_head(sh, h), v0 = vs * BV;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gq = lane >> 2, tq = lane & 3;
    float* Sg = state + ((size_t)seq * H_v + h) * kD * kD;  // [d_v][d_k]: row j = S^T[j]

    // S^T[j][i], j = 16 mt + gq (+8), i = 32 w + 8 nt + 2 tq (+1): the accumulator layout.
    float S[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const float2 x = *reinterpret_cast<const float2*>(Sg + (size_t)(v0 + 16 * mt + gq + 8 * hh) * kD +
                                                                  32 * w + 8 * nt + 2 * tq);
                S[mt][nt][2 * hh] = x.x;
                S[mt][nt][2 * hh + 1] = x.y;
            }

    auto load_chunk = [&](int c, int b) {
        Stage2Buf<BV>& B = sm.buf[b];
        const int t0 = t_begin + (c - c_first) * kC, n = min(kC, t_end - t0);
        for (int idx = tid; idx < kC * 16; idx += kThreads) {
            const int r = idx >> 4, cc = (idx & 15) * 8;
            const size_t row = ((size_t)(t0 + min(r, n - 1)) * H_k + kh) * kD + cc;
            cp_async16(B.K + r * kPD + cc, k + row, r < n);
            cp_async16(B.Q + r * kPD + cc, q + row, r < n);
        }
        for (int idx = tid; idx < kC * (BV / 8); idx += kThreads) {
            const int r = idx / (BV / 8), cc = (idx % (BV / 8)) * 8;
            cp_async16(B.V + r * (BV + 8) + cc, v + ((size_t)(t0 + min(r, n - 1)) * H_v + h) * kD + v0 + cc, r < n);
        }
        const ChunkRecord* R = rec + (size_t)c * H_v + h;
        for (int idx = tid; idx < kC * 8; idx += kThreads) {
            const int r = idx >> 3, cc = (idx & 7) * 8;
            cp_async16(B.T + r * kPC + cc, R->T + r * kC + cc, true);
            cp_async16(B.M + r * kPC + cc, R->QKM + r * kC + cc, true);
        }
        if (tid < 16) cp_async16(B.G + 4 * tid, R->G + 4 * tid, true);
        else if (tid < 32) cp_async16(B.beta + 4 * (tid - 16), R->beta + 4 * (tid - 16), true);
        cp_async_commit();
    };
    // O of the chunk before, from shared memory to `out` (rows < n, 16-byte stores).
    auto flush_out = [&](int t0, int n) {
        constexpr int kVec = 16 / sizeof(OutT), kPerRow = BV / kVec;
        for (int idx = tid; idx < n * kPerRow; idx += kThreads) {
            const int r = idx / kPerRow, cc = (idx % kPerRow) * kVec;
            OutT* dst = out + ((size_t)(t0 + r) * H_v + h) * kD + v0 + cc;
            const float* src = sm.O + r * (BV + 4) + cc;
            if constexpr (sizeof(OutT) == 4) {
                *reinterpret_cast<float4*>(dst) = make_float4(src[0], src[1], src[2], src[3]);
            } else {
                uint4 p;
                p.x = pack_bf16(src[0], src[1]);
                p.y = pack_bf16(src[2], src[3]);
                p.z = pack_bf16(src[4], src[5]);
                p.w = pack_bf16(src[6], src[7]);
                *reinterpret_cast<uint4*>(dst) = p;
            }
        }
    };

    load_chunk(c_first, 0);
    int prev_t0 = 0, prev_n = 0;
    for (int c = c_first; c < c_last; ++c) {
        const int b = (c - c_first) & 1;
        const Stage2Buf<BV>& B = sm.buf[b];
        const int t0 = t_begin + (c - c_first) * kC, n = min(kC, t_end - t0);
        // (1) this warp's columns of S^T to shared memory in bf16 (the A operand of Y and X).
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh)
                    *reinterpret_cast<uint32_t*>(sm.Sb + (16 * mt + gq + 8 * hh) * kPD + 32 * w + 8 * nt + 2 * tq) =
                        pack_bf16(S[mt][nt][2 * hh], S[mt][nt][2 * hh + 1]);
        cp_async_wait_all();
        __syncthreads();  // #1: chunk c's tiles and Sb visible; everyone is done with chunk c - 1
        if (c + 1 < c_last) load_chunk(c + 1, b ^ 1);
        if (prev_n > 0) flush_out(prev_t0, prev_n);

        // (2) Y^T, X^T for this warp's rows r in [16 w, 16 w + 16).
        float y[MT][2][4], x[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) y[mt][nt][e] = x[mt][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks) {
            uint32_t a[MT][4], bk[4], bq[4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_addr(sm.Sb, kPD, 16 * mt, 16 * ks, lane));
            ldsm_x4(bk, b_addr(B.K, kPD, 16 * w, 16 * ks, lane));
            ldsm_x4(bq, b_addr(B.Q, kPD, 16 * w, 16 * ks, lane));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma(y[mt][0], a[mt], bk[0], bk[1]);
                mma(y[mt][1], a[mt], bk[2], bk[3]);
                mma(x[mt][0], a[mt], bq[0], bq[1]);
                mma(x[mt][1], a[mt], bq[2], bq[3]);
            }
        }
        // (3) Delta'^T = (V^T - Y^T e^G) beta to shared; X^T e^G stays as the start of O^T.
        const float GC = B.G[kC - 1];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int r = 16 * w + 8 * nt + 2 * tq;
            const float e0 = __expf(B.G[r]), e1 = __expf(B.G[r + 1]);
            const float b0 = B.beta[r], b1 = B.beta[r + 1];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int j = 16 * mt + gq + 8 * hh;
                    const float v0f = __bfloat162float(B.V[r * (BV + 8) + j]);
                    const float v1f = __bfloat162float(B.V[(r + 1) * (BV + 8) + j]);
                    *reinterpret_cast<uint32_t*>(sm.Dp + j * kPC + r) =
                        pack_bf16(b0 * (v0f - e0 * y[mt][nt][2 * hh]), b1 * (v1f - e1 * y[mt][nt][2 * hh + 1]));
                    x[mt][nt][2 * hh] *= e0;
                    x[mt][nt][2 * hh + 1] *= e1;
                }
        }
        __syncthreads();  // #2
        // (4) Delta^T = Delta'^T T^T (s <= r: k-steps up to this warp's rows).
        float dl[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) dl[mt][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            if (ks > w) break;
            uint32_t a[MT][4], bt[4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_addr(sm.Dp, kPC, 16 * mt, 16 * ks, lane));
            ldsm_x4(bt, b_addr(B.T, kPC, 16 * w, 16 * ks, lane));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma(dl[mt][0], a[mt], bt[0], bt[1]);
                mma(dl[mt][1], a[mt], bt[2], bt[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const int r = 16 * w + 8 * nt + 2 * tq;
            const float f0 = __expf(GC - B.G[r]), f1 = __expf(GC - B.G[r + 1]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int j = 16 * mt + gq + 8 * hh;
                    const float d0 = dl[mt][nt][2 * hh], d1 = dl[mt][nt][2 * hh + 1];
                    *reinterpret_cast<uint32_t*>(sm.Dm + j * kPC + r) = pack_bf16(d0, d1);
                    *reinterpret_cast<uint32_t*>(sm.Dt + j * kPC + r) = pack_bf16(d0 * f0, d1 * f1);
                }
        }
        __syncthreads();  // #3
        // (5) O^T += Delta^T QKM^T, then into the shared O tile (written out after the next #1).
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            if (ks > w) break;
            uint32_t a[MT][4], bm[4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_addr(sm.Dm, kPC, 16 * mt, 16 * ks, lane));
            ldsm_x4(bm, b_addr(B.M, kPC, 16 * w, 16 * ks, lane));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma(x[mt][0], a[mt], bm[0], bm[1]);
                mma(x[mt][1], a[mt], bm[2], bm[3]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = 16 * mt + gq + 8 * (e >> 1), r = 16 * w + 8 * nt + 2 * tq + (e & 1);
                    sm.O[r * (BV + 4) + j] = x[mt][nt][e];
                }
        // (6) S^T = e^{G_C} S^T + Dt K for this warp's columns i in [32 w, 32 w + 32).
        const float eGC = __expf(GC);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) S[mt][nt][e] *= eGC;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], a_addr(sm.Dt, kPC, 16 * mt, 16 * ks, lane));
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                uint32_t bk[4];
                ldsm_x4_t(bk, bt_addr(B.K, kPD, 16 * ks, 32 * w + 16 * p, lane));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma(S[mt][2 * p], a[mt], bk[0], bk[1]);
                    mma(S[mt][2 * p + 1], a[mt], bk[2], bk[3]);
                }
            }
        }
        prev_t0 = t0;
        prev_n = n;
    }
    __syncthreads();
    flush_out(prev_t0, prev_n);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                *reinterpret_cast<float2*>(Sg + (size_t)(v0 + 16 * mt + gq + 8 * hh) * kD + 32 * w + 8 * nt + 2 * tq) =
                    make_float2(S[mt][nt][2 * hh], S[mt][nt][2 * hh + 1]);
}

// fp32 -> bf16 (round to nearest even), 8 values per thread.
__global__ void to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, size_t n) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 4 <= n) {
        const float4 f = *reinterpret_cast<const float4*>(x + i);
        uint2 p;
        p.x = pack_bf16(f.x, f.y);
        p.y = pack_bf16(f.z, f.w);
        *reinterpret_cast<uint2*>(y + i) = p;
    } else {
        for (size_t j = i; j < n; ++j) y[j] = __float2bfloat16_rn(x[j]);
    }
}

void check_launch(const char* op) {
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw Error(std::string(op) + ": launch failed: " + cudaGetErrorString(err));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

size_t chunk_slots(int n_seqs, int n_tokens) { return (size_t(n_tokens) + size_t(kC - 1) * n_seqs) / kC; }
size_t table_bytes(int n_seqs) { return (size_t(n_seqs + 1) * sizeof(int32_t) + 255) / 256 * 256; }

void check_chunked_shape(const ref::GdnShape& shape, int n_seqs, const char* op) {
    ref::detail::check_shape(shape, op);
    if (shape.d_k != kD) throw Error(std::string(op) + ": d_k " + std::to_string(shape.d_k) + " not supported (only 128)");
    if (shape.d_v != kD) throw Error(std::string(op) + ": d_v " + std::to_string(shape.d_v) + " not supported (only 128)");
    if (n_seqs < 0 || n_seqs > 65535)
        throw Error(std::string(op) + ": n_seqs " + std::to_string(n_seqs) + " not in [0, 65535]");
    if (shape.H_v > 65535) throw Error(std::string(op) + ": H_v " + std::to_string(shape.H_v) + " > 65535");
}

template <int BV, typename OutT>
void launch_stage2(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, const int32_t* cstart, const bf16* q,
                   const bf16* k, const bf16* v, const ChunkRecord* rec, float* state, OutT* out, cudaStream_t st) {
    const size_t smem = sizeof(Stage2Smem<BV>);
    static bool configured = false;  // the attribute is per function, set once per process
    if (!configured) {
        cudaFuncSetAttribute(stage2_kernel<BV, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        configured = true;
    }
    stage2_kernel<BV, OutT><<<dim3(kD / BV, sh.H_v, n_seqs), kThreads, smem, st>>>(sh, offs, cstart, q, k, v, rec,
                                                                                    state, out);
}

int num_sms() {
    static int n = [] {
        int dev = 0, sms = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        return sms > 0 ? sms : 132;
    }();
    return n;
}

template <typename OutT>
void run_chunked(const ref::GdnShape& sh, int n_seqs, const int32_t* offs, int n_tokens, const bf16* q, const bf16* k,
                 const bf16* v, const float* g, const float* beta, float* state, OutT* out, void* workspace,
                 cudaStream_t st, int block_v, const char* op) {
    if (n_seqs == 0 || n_tokens == 0) return;
    int32_t* cstart = static_cast<int32_t*>(workspace);
    ChunkRecord* rec = reinterpret_cast<ChunkRecord*>(static_cast<char*>(workspace) + table_bytes(n_seqs));
    chunk_table_kernel<<<1, 32, 0, st>>>(offs, n_seqs, cstart);
    check_launch(op);
    const size_t slots = chunk_slots(n_seqs, n_tokens);
    if (slots > 0x7fffffff) throw Error(std::string(op) + ": n_tokens " + std::to_string(n_tokens) + " too large");
    stage1_kernel<<<dim3(unsigned(slots), sh.H_v), kThreads, 0, st>>>(sh, offs, cstart, n_seqs, q, k, g, beta, rec);
    check_launch(op);
    // Launch gate: 32-column slices unless they leave SMs idle (H_v n_seqs 4 blocks < SMs),
    // then 16-column slices (twice the blocks, each chunk step half the products).
    if (block_v == 0) block_v = sh.H_v * n_seqs * (kD / 32) >= num_sms() ? 32 : 16;
    if (block_v == 32) launch_stage2<32>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, st);
    else if (block_v == 16) launch_stage2<16>(sh, n_seqs, offs, cstart, q, k, v, rec, state, out, st);
    else throw Error(std::string(op) + ": block_v " + std::to_string(block_v) + " not in {0, 16, 32}");
    check_launch(op);
}

}  // namespace

size_t gdn_delta_chunked_workspace_bytes(const ref::GdnShape& shape, int n_seqs, int n_tokens) {
    return table_bytes(std::max(n_seqs, 0)) + chunk_slots(std::max(n_seqs, 0), std::max(n_tokens, 0)) *
                                                  size_t(std::max(shape.H_v, 0)) * sizeof(ChunkRecord);
}

void gdn_delta_chunked(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, int n_tokens,
                       const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* g, const float* beta,
                       float* state, uint16_t* out, void* workspace, void* stream, int block_v) {
    const char* op = "cuda::gdn_delta_chunked";
    check_chunked_shape(shape, n_seqs, op);
    if (n_tokens < 0) throw Error(std::string(op) + ": n_tokens " + std::to_string(n_tokens) + " is negative");
    if (n_seqs == 0 || n_tokens == 0) return;
    const void* need[] = {seq_offsets, q, k, v, g, beta, state, out, workspace};
    const char* names[] = {"seq_offsets", "q", "k", "v", "g", "beta", "state", "out", "workspace"};
    for (int i = 0; i < 9; ++i) {
        if (need[i] == nullptr) throw Error(std::string(op) + ": " + names[i] + " is null");
        if (i != 4 && i != 5 && !aligned16(need[i]))
            throw Error(std::string(op) + ": " + names[i] + " is not 16-byte aligned");
    }
    run_chunked(shape, n_seqs, seq_offsets, n_tokens, reinterpret_cast<const bf16*>(q),
                reinterpret_cast<const bf16*>(k), reinterpret_cast<const bf16*>(v), g, beta, state,
                reinterpret_cast<bf16*>(out), workspace, static_cast<cudaStream_t>(stream), block_v, op);
}

void gdn_delta_chunked(const ref::GdnShape& shape, int n_seqs, const int32_t* seq_offsets, const float* q,
                       const float* k, const float* v, const float* g, const float* beta, float* state, float* out,
                       int chunk_size, void* stream) {
    const char* op = "cuda::gdn_delta_chunked";
    check_chunked_shape(shape, n_seqs, op);
    if (chunk_size != kC)
        throw Error(std::string(op) + ": chunk_size " + std::to_string(chunk_size) + " not supported (only 64)");
    if (n_seqs == 0) return;
    if (seq_offsets == nullptr) throw Error(std::string(op) + ": seq_offsets is null");
    const cudaStream_t st = static_cast<cudaStream_t>(stream);
    int32_t ends[2] = {0, 0};
    if (cudaMemcpyAsync(&ends[0], seq_offsets, 4, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaMemcpyAsync(&ends[1], seq_offsets + n_seqs, 4, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess)
        throw Error(std::string(op) + ": cannot read seq_offsets");
    const int n_tokens = ends[1];
    if (n_tokens <= ends[0]) return;
    const void* need[] = {q, k, v, g, beta, state, out};
    const char* names[] = {"q", "k", "v", "g", "beta", "state", "out"};
    for (int i = 0; i < 7; ++i) {
        if (need[i] == nullptr) throw Error(std::string(op) + ": " + names[i] + " is null");
        if (i != 3 && i != 4 && !aligned16(need[i]))
            throw Error(std::string(op) + ": " + names[i] + " is not 16-byte aligned");
    }
    // bf16 copies of q, k, v (rows [0, n_tokens)), then the bf16 path with an fp32 output.
    const size_t nqk = size_t(n_tokens) * shape.H_k * kD, nv = size_t(n_tokens) * shape.H_v * kD;
    const size_t ws_bytes = gdn_delta_chunked_workspace_bytes(shape, n_seqs, n_tokens);
    const size_t copies = ((2 * nqk + nv) * sizeof(bf16) + 255) / 256 * 256;
    void* ws = nullptr;
    if (cudaMallocAsync(&ws, ws_bytes + copies, st) != cudaSuccess)
        throw Error(std::string(op) + ": cannot allocate " + std::to_string(ws_bytes + copies) + " bytes of workspace");
    bf16* qb = reinterpret_cast<bf16*>(static_cast<char*>(ws) + ws_bytes);
    bf16* kb = qb + nqk;
    bf16* vb = kb + nqk;
    auto convert = [&](const float* x, bf16* y, size_t n) {
        to_bf16_kernel<<<unsigned((n / 4 + 255) / 256 + 1), 256, 0, st>>>(x, y, n);
    };
    convert(q, qb, nqk);
    convert(k, kb, nqk);
    convert(v, vb, nv);
    check_launch(op);
    run_chunked(shape, n_seqs, seq_offsets, n_tokens, qb, kb, vb, g, beta, state, out, ws, st, 0, op);
    cudaFreeAsync(ws, st);
}

}  // namespace alloy::cuda
