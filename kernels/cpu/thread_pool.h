// The CPU kernels' thread pool: one process-wide pool of spinning workers, built for many
// small parallel regions (a decode step launches ~10 per layer), where OpenMP's barrier and
// wake-up cost showed up as whole milliseconds per token.
//
// parallel_for(n, fn) calls fn(i, thread) for every i in [0, n) across the pool (the calling
// thread works too) and returns when all are done. Items are handed out by an atomic counter,
// so uneven items balance themselves. Workers spin for a short while after each region (the
// next one usually follows within microseconds), then sleep on a futex so an idle process
// does not burn CPU. Not reentrant: kernels must not call parallel_for from inside fn.
#pragma once
#include <cstdint>
#include <functional>

namespace alloy::cpu {

// Threads the pool uses (the caller included). Default: ALLOY_THREADS or hardware threads.
int n_threads();
// Resizes the pool (>= 1). Call before work starts, from one thread.
void set_n_threads(int n);

// The pool's per-op synchronization cost: mean wall time of one parallel region whose
// n_threads() items do nothing, over `regions` back-to-back regions (microseconds).
double region_overhead_us(int64_t regions = 20000);

// True on a thread while it runs a parallel_for item: a parallel_for called from inside one (a
// kernel run as an item of an outer loop, e.g. an MoE expert's products, one expert a thread)
// runs its items inline on that thread, in order, as with one thread.
bool in_parallel_region();

// Type-erased core; prefer the templates below.
void parallel_for_impl(int64_t n, const std::function<void(int64_t, int)>& fn, bool fixed);

namespace detail {
// Inline for n <= 1, one thread or inside an item (no region), else the pool: by its counter,
// or fixed.
template <class Fn>
inline void run_items(int64_t n, Fn&& fn, bool fixed) {
    if (n <= 0) return;
    if (n == 1 || n_threads() == 1 || in_parallel_region()) {
        for (int64_t i = 0; i < n; ++i) fn(i, 0);
        return;
    }
    parallel_for_impl(n, std::function<void(int64_t, int)>(std::forward<Fn>(fn)), fixed);
}
}  // namespace detail

template <class Fn>
inline void parallel_for(int64_t n, Fn&& fn) {
    detail::run_items(n, std::forward<Fn>(fn), false);
}

// parallel_for with a fixed split: pool thread t runs items [t n / threads, (t + 1) n / threads),
// the same ones every call, with no shared counter. For equal items whose data a thread should
// keep across calls: with the two threads on different CCDs of a Zen 4 host (a cache-line round
// trip ~310 ns), a GDN state written by one thread and read by the other at the next token
// crosses the dies (see gdn_delta.cpp).
template <class Fn>
inline void parallel_for_fixed(int64_t n, Fn&& fn) {
    detail::run_items(n, std::forward<Fn>(fn), true);
}

}  // namespace alloy::cpu
