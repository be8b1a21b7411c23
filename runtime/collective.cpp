#include "runtime/collective.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "alloy/error.h"

namespace alloy {

namespace {

// What the ranks of one host group share. A round of all_reduce_sum: each rank posts its
// pointer; the last to arrive sums the posted arrays in rank order into `sum` and opens the
// round; each rank copies `sum` back when it next holds the turn. The next round's sum is
// written only once every rank has posted again, so after every rank has copied this one.
struct HostGroup {
    explicit HostGroup(int n) : ptrs(size_t(n), nullptr) {}
    std::mutex turn;  // held by the rank whose kernels run (Collective::begin_step)
    std::mutex m;
    std::condition_variable cv;
    std::vector<float*> ptrs;
    size_t n_floats = 0;
    int arrived = 0;
    uint64_t round = 0;
    std::vector<float> sum;
};

class HostCollective final : public Collective {
public:
    HostCollective(std::shared_ptr<HostGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return int(g_->ptrs.size()); }
    void begin_step() override { g_->turn.lock(); }
    void end_step() override { g_->turn.unlock(); }

    void all_reduce_sum(float* data, size_t n, void*) override {
        HostGroup& g = *g_;
        g.turn.unlock();  // the other ranks run up to this point meanwhile
        {
            std::unique_lock<std::mutex> lk(g.m);
            if (g.arrived == 0) g.n_floats = n;
            if (g.n_floats != n) {
                const std::string what = "host collective: rank " + std::to_string(rank_) + " sums " + std::to_string(n) +
                                         " floats where another rank sums " + std::to_string(g.n_floats);
                lk.unlock();
                g.turn.lock();  // the caller's end_step releases it
                throw Error(what);
            }
            g.ptrs[size_t(rank_)] = data;
            const uint64_t my_round = g.round;
            if (++g.arrived == size()) {
                g.sum.assign(g.ptrs[0], g.ptrs[0] + n);
                for (size_t r = 1; r < g.ptrs.size(); ++r)
                    for (size_t i = 0; i < n; ++i) g.sum[i] += g.ptrs[r][i];
                g.arrived = 0;
                ++g.round;
                g.cv.notify_all();
            } else {
                g.cv.wait(lk, [&] { return g.round != my_round; });
            }
            std::memcpy(data, g.sum.data(), n * sizeof(float));
        }
        g.turn.lock();
    }

private:
    std::shared_ptr<HostGroup> g_;
    int rank_;
};

}  // namespace

std::vector<std::shared_ptr<Collective>> make_host_collectives(int n) {
    if (n < 1) throw Error("host collective: needs at least one rank, got " + std::to_string(n));
    auto g = std::make_shared<HostGroup>(n);
    std::vector<std::shared_ptr<Collective>> out;
    for (int r = 0; r < n; ++r) out.push_back(std::make_shared<HostCollective>(g, r));
    return out;
}

}  // namespace alloy
