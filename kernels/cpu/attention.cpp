// cpu::attention driver: cuts the problem into blocks (attention_block.h), orders them so
// the pool balances causal rows of unequal cost, splits keys when blocks are too few, and
// merges the split partial softmax states.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>

#include "alloy/error.h"
#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/workspace.h"
#include "kernels/ref/kv_store.h"

namespace alloy::cpu {

namespace {

constexpr int kRowsPerBlock = 32;     // query rows per block (group x tokens): K/V reuse vs L1
constexpr int64_t kMinSplitKeys = 256;  // a key split below this is not worth its merge
constexpr int kItemsPerThread = 4;    // blocks per thread to aim for, for balance
constexpr int64_t kVerifyTokens = 4;  // calls of up to this many tokens: decode and verification
constexpr int64_t kGridKeys = 256;    // ... cut their keys on this fixed grid of absolute positions
static_assert(kGridKeys % attn::kKeyTile == 0, "grid cells start on key-tile boundaries");

// How a call is cut into work items (the driver below), from the shape and the pool size.
struct Schedule {
    bool grid = false;
    int group = 0, tq = 0;     // query heads per KV head; tokens per block
    int64_t n_qb = 0;          // query blocks
    int ng = 1;                // KV groups per block
    int64_t ns = 1;            // key splits
    int n_gb = 0;              // blocks per (query block, key split)
    int64_t n_items = 0;
    int part_rows = 0;         // partial-state rows per group of an item
    int64_t item_rows = 0;
};

Schedule schedule(const AttentionShape& s, int64_t T, int64_t n_past) {
    Schedule c;
    c.group = s.n_head / s.n_head_kv;
    const int n_kv = s.n_head_kv;
    c.grid = T <= kVerifyTokens;
    // Prefill with a 16-bit K cache: the AVX-512 block converts each K and V tile once for all
    // its rows, so larger blocks convert less per FLOP (+5-10% on the op at 64 rows).
    const int rows_per_block = !c.grid && s.type_k != GgmlType::F32 ? attn::kMaxPrefillRows : kRowsPerBlock;
    c.tq = int(std::min<int64_t>(T, std::max(1, rows_per_block / c.group)));  // tokens per block
    c.n_qb = (T + c.tq - 1) / c.tq;

    // Blocks of one KV group each (ng = 1) when there are enough of them to keep every thread
    // busy (prefill). Otherwise (decode, short batches over a long cache) the keys are split
    // across threads, and a block takes every KV group (ng = n_kv): each thread then streams
    // whole cache rows of its key range, one contiguous stream per cache, which the hardware
    // prefetchers follow, instead of every other 256-element slice of them.
    //
    // Decode and speculative verification (T <= kVerifyTokens) always cut the keys on a fixed
    // grid of absolute positions, [c * kGridKeys, (c + 1) * kGridKeys), whatever T, n_past and
    // the thread count: a row's arithmetic (its cells, their tiles, the merge order) then
    // depends on its own position only, so a verification call of up to 4 tokens reproduces
    // the decode steps bit for bit. (A split sized from n_past + T would move the boundaries
    // with T.) Cells past a row's causal limit are empty for it and skipped by the merge; one
    // non-empty cell merges to the same bits as the unsplit path (weight exp2(0) = 1).
    const int64_t target = int64_t(kItemsPerThread) * n_threads();
    if (c.grid) {
        c.ns = (n_past + T + kGridKeys - 1) / kGridKeys;
        if (c.ns > 1) c.ng = n_kv;
    } else if (c.n_qb * n_kv < target) {
        const int64_t splits =
            std::min((target + c.n_qb - 1) / c.n_qb, (n_past + T + kMinSplitKeys - 1) / kMinSplitKeys);
        if (splits > 1) {
            c.ng = n_kv;
            c.ns = splits;
        }
    }
    c.n_gb = n_kv / c.ng;
    c.n_items = c.n_qb * c.ns * c.n_gb;
    c.part_rows = c.tq * c.group;
    c.item_rows = int64_t(c.ng) * c.part_rows;
    return c;
}

// The call's workspace: one block scratch per pool thread (attn::block_scratch_bytes: each
// thread's own buffers before), then for split keys the partial states
// [n_items, item_rows, hd] O and [n_items, item_rows, 2] (m, l). The partial states grow with
// the keys of decode (one cell of 256 keys each), so a caller sizes for its longest context.
struct Layout {
    size_t block_bytes = 0;
    void* blocks = nullptr;
    float* part_o = nullptr;
    float* part_ml = nullptr;
    size_t bytes = 0;
};
Layout layout(const AttentionShape& s, const Schedule& c, void* workspace) {
    Layout L;
    ws::Carver w(workspace);
    L.block_bytes = ws::up(attn::block_scratch_bytes(c.ng, c.tq * c.group, s.head_dim));
    L.blocks = w.take<uint8_t>(L.block_bytes * size_t(n_threads()));
    if (c.ns > 1) {
        L.part_o = w.take<float>(size_t(c.n_items * c.item_rows) * size_t(s.head_dim));
        L.part_ml = w.take<float>(size_t(c.n_items * c.item_rows) * 2);
    }
    L.bytes = w.bytes();
    return L;
}

}  // namespace

size_t attention_workspace_bytes(const AttentionShape& s, int64_t T, int64_t n_past) {
    if (T <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0) return 0;
    return layout(s, schedule(s, T, n_past), nullptr).bytes;
}

void attention(const AttentionShape& s, const float* q, const void* k_cache, const void* v_cache, float* out,
               int64_t T, int64_t n_past, Isa isa, void* workspace) {
    if (!ref::kv_type_supported(s.type_k) || !ref::kv_type_supported(s.type_v))
        throw Error("attention: KV cache types must be f32, f16 or bf16");
    if (T <= 0) return;
    assert(s.n_head_kv > 0 && s.n_head % s.n_head_kv == 0 && s.head_dim > 0 && n_past >= 0);
    const auto run_block = isa >= Isa::Avx512 && s.head_dim % 16 == 0 ? attn::run_block_avx512
                           : isa >= Isa::Avx2 && s.head_dim % 8 == 0  ? attn::run_block_avx2
                                                                      : attn::run_block_scalar;
    const int group = s.n_head / s.n_head_kv, hd = s.head_dim, n_kv = s.n_head_kv;
    const Schedule sc = schedule(s, T, n_past);
    const bool grid = sc.grid;
    const int tq = sc.tq, ng = sc.ng, n_gb = sc.n_gb, part_rows = sc.part_rows;
    const int64_t n_qb = sc.n_qb, ns = sc.ns, n_items = sc.n_items, item_rows = sc.item_rows;
    const Layout L = layout(s, sc, workspace);
    auto thread_scratch = [&](int thread) { return static_cast<uint8_t*>(L.blocks) + L.block_bytes * size_t(thread); };

    // Item i -> block: the latest query blocks (most keys) first, so the atomic hand-out of
    // the pool ends with the cheap ones and the threads finish together; then the key split,
    // then the group block: item(qb_rev, split, gb) = (qb_rev * ns + split) * n_gb + gb.
    auto elem = [](GgmlType t) {
        return t == GgmlType::F16 ? attn::Elem::F16 : t == GgmlType::BF16 ? attn::Elem::Bf16 : attn::Elem::F32;
    };
    const attn::Elem ke = elem(s.type_k), ve = elem(s.type_v);
    const size_t kb = attn::elem_bytes(ke), vb = attn::elem_bytes(ve);  // bytes per element
    auto make_block = [&](int64_t i) {
        const int64_t qb = n_qb - 1 - i / (ns * n_gb);
        const int g0 = int(i % n_gb) * ng;
        const int64_t split = (i / n_gb) % ns;
        attn::Block b;
        b.q = q;
        b.k = static_cast<const char*>(k_cache) + size_t(g0) * size_t(hd) * kb;
        b.v = static_cast<const char*>(v_cache) + size_t(g0) * size_t(hd) * vb;
        b.k_elem = ke;
        b.v_elem = ve;
        b.kv_stride = int64_t(n_kv) * hd;
        b.n_head = s.n_head;
        b.hd = hd;
        b.group = group;
        b.h0 = g0 * group;
        b.ng = ng;
        b.scale = s.scale;
        b.n_past = n_past;
        b.t0 = qb * tq;
        b.tq = int(std::min<int64_t>(tq, T - b.t0));
        b.part_rows = part_rows;
        b.grid = grid;
        const int64_t n_keys = n_past + b.t0 + b.tq;  // keys the block's last row sees
        const int64_t per = (n_keys + ns - 1) / ns;
        const int64_t chunk = grid ? kGridKeys : (per + attn::kKeyTile - 1) / attn::kKeyTile * attn::kKeyTile;
        b.key_begin = std::min(n_keys, split * chunk);
        b.key_end = std::min(n_keys, (split + 1) * chunk);
        return b;
    };

    if (ns == 1) {
        parallel_for(n_items, [&](int64_t i, int thread) {
            attn::Block b = make_block(i);
            b.out = out;
            b.scratch = thread_scratch(thread);
            run_block(b);
        });
        return;
    }

    // Split keys: every item leaves (m, l, O) per row; rows are then merged in parallel.
    float* part_o = L.part_o;    // [n_items, item_rows, hd]
    float* part_ml = L.part_ml;  // [n_items, item_rows, 2] (m, l)
    auto run_item = [&](int64_t i, attn::Block b, int thread) {
        b.part_o = part_o + i * item_rows * hd;
        b.part_ml = part_ml + i * item_rows * 2;
        b.scratch = thread_scratch(thread);
        run_block(b);
    };
    if (grid && n_gb == 1 && n_qb == 1) {
        // Decode and verification: each thread takes a contiguous run of cells, so its next
        // cell starts where the current one ends and the last tile of one prefetches the
        // first of the next (depth 4096: -10 to -12% per call against the same schedule
        // without that prefetch; the cell grid and merge order, hence the bits, are unchanged).
        const int nt = n_threads();
        parallel_for(nt, [&](int64_t th, int thread) {
            const int64_t i0 = n_items * th / nt, i1 = n_items * (th + 1) / nt;
            if (i0 == i1) return;
            attn::Block b = make_block(i0);
            for (int64_t i = i0; i < i1; ++i) {
                const attn::Block next = i + 1 < i1 ? make_block(i + 1) : attn::Block{};
                b.prefetch_end = next.key_end;  // 0 after the thread's last cell: nothing
                run_item(i, b, thread);
                b = next;
            }
        });
    } else {
        parallel_for(n_items, [&](int64_t i, int thread) { run_item(i, make_block(i), thread); });
    }
    parallel_for(T * s.n_head, [&](int64_t th, int) {
        const int64_t t = th / s.n_head;
        const int h = int(th % s.n_head);
        const int64_t qb = t / tq;
        const int g = h / group;
        const int64_t r = int64_t(g % ng) * part_rows + (t - qb * tq) * group + h % group;  // row in its item
        auto item = [&](int64_t sp) { return ((n_qb - 1 - qb) * ns + sp) * n_gb + g / ng; };
        float mx = -INFINITY;
        for (int64_t sp = 0; sp < ns; ++sp) mx = std::max(mx, part_ml[(item(sp) * item_rows + r) * 2]);
        float* dst = out + th * hd;
        std::fill(dst, dst + hd, 0.0f);
        float l = 0.0f;
        for (int64_t sp = 0; sp < ns; ++sp) {
            const float* ml = part_ml + (item(sp) * item_rows + r) * 2;
            if (ml[1] == 0.0f) continue;  // split beyond this row's causal limit
            const float w = std::exp2(ml[0] - mx);
            l += w * ml[1];
            const float* o = part_o + (item(sp) * item_rows + r) * hd;
            for (int d = 0; d < hd; ++d) dst[d] += w * o[d];
        }
        const float inv = 1.0f / l;
        for (int d = 0; d < hd; ++d) dst[d] *= inv;
    });
}

bool attention_uses_bf16_products(const AttentionShape& s, int64_t T, Isa isa) {
    return std::min(isa, active_isa()) >= Isa::Avx512 && s.head_dim % 16 == 0 && T > kVerifyTokens &&
           s.type_k == GgmlType::BF16 && s.type_v == GgmlType::BF16 && mm::cpu_has_avx512_bf16();
}

// Without a workspace (tests, test-ops): one of the call's own.
void attention(const AttentionShape& s, const float* q, const void* k_cache, const void* v_cache, float* out,
               int64_t T, int64_t n_past, Isa isa) {
    ScratchBuffer w;
    attention(s, q, k_cache, v_cache, out, T, n_past, isa, w.get(attention_workspace_bytes(s, T, n_past)));
}

void attention(const AttentionShape& s, const float* q, const void* k_cache, const void* v_cache,
               float* out, int64_t T, int64_t n_past) {
    attention(s, q, k_cache, v_cache, out, T, n_past, active_isa());
}

}  // namespace alloy::cpu
