// The thread pool hands out every item exactly once, across many back-to-back regions (the
// decode pattern) and pool sizes, and the caller sees all writes when parallel_for returns; a
// parallel_for inside an item runs inline.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace alloy::cpu {
namespace {

TEST(ThreadPool, EveryItemExactlyOnce) {
    for (int threads : {1, 2, 3}) {
        set_n_threads(threads);
        for (int64_t n : {0, 1, 2, 7, 64, 1001}) {
            for (int rep = 0; rep < 50; ++rep) {
                std::vector<int> hits(size_t(n), 0);
                std::atomic<int> bad_thread{0};
                parallel_for(n, [&](int64_t i, int t) {
                    hits[size_t(i)] += 1;  // distinct i: no race
                    if (t < 0 || t >= threads) bad_thread = 1;
                });
                for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "n=" << n << " i=" << i;
                ASSERT_EQ(bad_thread.load(), 0);
            }
        }
    }
    set_n_threads(2);
}

// The fixed split: every item once, and item i always on thread floor(i threads / n)'s range,
// the same thread every call, interleaved with counter regions.
TEST(ThreadPool, FixedSplitRunsTheSameItemsOnTheSameThread) {
    for (int threads : {1, 2, 3}) {
        set_n_threads(threads);
        for (int64_t n : {0, 1, 2, 7, 16, 1001}) {
            for (int rep = 0; rep < 20; ++rep) {
                std::vector<int> hits(size_t(n), 0), owner(size_t(n), -1);
                parallel_for_fixed(n, [&](int64_t i, int t) {
                    hits[size_t(i)] += 1;
                    owner[size_t(i)] = t;
                });
                for (int64_t i = 0; i < n; ++i) {
                    ASSERT_EQ(hits[size_t(i)], 1) << "n=" << n << " i=" << i;
                    const int want = n == 1 ? 0 : [&] { int t = 0; while (n * (t + 1) / threads <= i) ++t; return t; }();
                    ASSERT_EQ(owner[size_t(i)], want) << "threads=" << threads << " n=" << n << " i=" << i;
                }
                parallel_for(n, [&](int64_t i, int) { hits[size_t(i)] += 1; });  // a counter region between
            }
        }
    }
    set_n_threads(2);
}

// A parallel_for inside an item (an MoE expert's products run as one item of the experts' loop)
// runs inline on that thread: every nested item once, in order, as thread 0, and outside items
// the flag is off again (was: a deadlock on the pool's region lock).
TEST(ThreadPool, NestedParallelForRunsInlineOnTheItemsThread) {
    for (int threads : {1, 2, 3}) {
        set_n_threads(threads);
        EXPECT_FALSE(in_parallel_region());
        const int64_t n = 37, m = 11;
        std::vector<std::vector<int64_t>> order{size_t(n)};
        std::vector<int> nested_thread(size_t(n), -1), inside(size_t(n), 0);
        parallel_for(n, [&](int64_t i, int) {
            inside[size_t(i)] = in_parallel_region();
            parallel_for(m, [&](int64_t j, int t) {
                order[size_t(i)].push_back(j);  // one thread: no race within item i
                nested_thread[size_t(i)] = std::max(nested_thread[size_t(i)], t);
            });
            parallel_for_fixed(2, [&](int64_t j, int) { order[size_t(i)].push_back(100 + j); });
        });
        EXPECT_FALSE(in_parallel_region());
        for (int64_t i = 0; i < n; ++i) {
            std::vector<int64_t> want;
            for (int64_t j = 0; j < m; ++j) want.push_back(j);
            want.insert(want.end(), {100, 101});
            EXPECT_EQ(order[size_t(i)], want) << "threads=" << threads << " i=" << i;
            EXPECT_EQ(nested_thread[size_t(i)], 0) << "threads=" << threads << " i=" << i;
            // (one thread: the outer loop itself runs inline, outside any region)
            EXPECT_EQ(inside[size_t(i)], threads > 1 ? 1 : 0) << "threads=" << threads << " i=" << i;
        }
    }
    set_n_threads(2);
}

TEST(ThreadPool, ManyTinyRegions) {
    set_n_threads(2);
    int64_t total = 0;
    std::vector<int64_t> part(2);
    for (int r = 0; r < 20000; ++r) {
        part[0] = part[1] = 0;
        parallel_for(4, [&](int64_t i, int t) { part[size_t(t)] += i; });
        total += part[0] + part[1];
    }
    EXPECT_EQ(total, 20000 * 6);
}

}  // namespace
}  // namespace alloy::cpu
