#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace alloy::cpu {
namespace {

thread_local bool t_in_region = false;
// Marks this thread as running items for its lifetime (nested parallel_for runs inline).
struct InRegion {
    InRegion() { t_in_region = true; }
    ~InRegion() { t_in_region = false; }
    InRegion(const InRegion&) = delete;
    InRegion& operator=(const InRegion&) = delete;
};

class Pool {
public:
    explicit Pool(int n) { start(n); }
    ~Pool() { stop(); }

    int size() const { return n_; }

    void resize(int n) {
        if (n == n_) return;
        stop();
        start(n);
    }

    void run(int64_t n, const std::function<void(int64_t, int)>& fn, bool fixed) {
        std::lock_guard<std::mutex> lock(run_mu_);  // one region at a time
        fn_ = &fn;
        n_items_ = n;
        fixed_ = fixed;
        next_.store(0, std::memory_order_relaxed);
        pending_.store(n_ - 1, std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();
        work(0);
        // Wait for the workers to finish their share: spin (regions are short), but yield the
        // core once it takes long, so a worker that was descheduled (a busy machine) can run.
        for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
            if (spin < 4000) _mm_pause();
            else std::this_thread::yield();
        }
        fn_ = nullptr;
    }

private:
    void work(int thread) {
        const auto& fn = *fn_;
        const InRegion mark;
        if (fixed_) {
            for (int64_t i = n_items_ * thread / n_, e = n_items_ * (thread + 1) / n_; i < e; ++i) fn(i, thread);
            return;
        }
        for (;;) {
            const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
            if (i >= n_items_) break;
            fn(i, thread);
        }
    }

    // `seen` is the generation at creation: a worker that starts late must still take part in
    // a region announced before it first ran.
    void worker(int thread, uint64_t seen) {
        for (;;) {
            // Spin a little for the next region, then sleep until it comes.
            uint64_t g = seen;
            for (int spin = 0; spin < 20000 && (g = generation_.load(std::memory_order_acquire)) == seen; ++spin) {
                _mm_pause();
                if ((spin & 1023) == 1023) std::this_thread::yield();  // let a busy machine's other work in
            }
            while (g == seen) {
                generation_.wait(seen, std::memory_order_acquire);
                g = generation_.load(std::memory_order_acquire);
            }
            seen = g;
            if (quit_.load(std::memory_order_acquire)) return;
            work(thread);
            pending_.fetch_sub(1, std::memory_order_acq_rel);
        }
    }

    void start(int n) {
        n_ = n < 1 ? 1 : n;
        quit_.store(false);
        const uint64_t g = generation_.load(std::memory_order_acquire);
        for (int t = 1; t < n_; ++t) threads_.emplace_back([this, t, g] { worker(t, g); });
    }

    void stop() {
        quit_.store(true, std::memory_order_release);
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();
        for (auto& t : threads_) t.join();
        threads_.clear();
    }

    int n_ = 1;
    std::vector<std::thread> threads_;
    std::mutex run_mu_;
    const std::function<void(int64_t, int)>* fn_ = nullptr;
    int64_t n_items_ = 0;
    bool fixed_ = false;
    alignas(64) std::atomic<int64_t> next_{0};
    alignas(64) std::atomic<int> pending_{0};
    alignas(64) std::atomic<uint64_t> generation_{0};
    std::atomic<bool> quit_{false};
};

int default_threads() {
    if (const char* s = std::getenv("ALLOY_THREADS")) {
        const int n = std::atoi(s);
        if (n > 0) return n;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw ? int(hw) : 1;
}

Pool& pool() {
    static Pool p(default_threads());
    return p;
}

}  // namespace

bool in_parallel_region() { return t_in_region; }
int n_threads() { return pool().size(); }
void set_n_threads(int n) { pool().resize(n); }
void parallel_for_impl(int64_t n, const std::function<void(int64_t, int)>& fn, bool fixed) { pool().run(n, fn, fixed); }

double region_overhead_us(int64_t regions) {
    std::atomic<int64_t> sink{0};
    const int64_t items = n_threads();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < regions; ++r) parallel_for(items, [&](int64_t i, int) { sink.fetch_add(i, std::memory_order_relaxed); });
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return regions > 0 ? us / double(regions) : 0.0;
}

}  // namespace alloy::cpu
