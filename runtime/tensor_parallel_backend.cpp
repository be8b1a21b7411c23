#include "runtime/tensor_parallel_backend.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "alloy/error.h"
#include "runtime/collective.h"
#include "runtime/gdn_replay.h"
#include "runtime/cpu_backend.h"
#include "runtime/graph_passes.h"
#include "runtime/slot_cache.h"
#ifdef ALLOY_CUDA
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/nccl_collective.h"
#endif

namespace alloy {

namespace {

// One thread a rank: every call into a rank's backend, plans and state runs on its thread.
// A decode step hands work to every rank and waits for all of them, twice a token, so both
// sides spin for a while (kSpin) before they sleep on a condition variable: a sleeping
// thread's wake-up cost ~40 us a token at tg128 on the H200 (35b-a3b 8L, one rank: 1,412-1,456
// against 1,534-1,550 t/s without the ranks), which spinning avoids while steps follow closely.
class RankThreads {
public:
    explicit RankThreads(int n) : ranks_(size_t(n)) {
        for (int r = 0; r < n; ++r) ranks_[size_t(r)].thread = std::thread([this, r] { loop(r); });
    }
    ~RankThreads() {
        {
            std::lock_guard<std::mutex> lk(m_);
            stop_ = true;
            ++gen_;
        }
        wake_.notify_all();
        for (Rank& k : ranks_) k.thread.join();
    }
    int size() const { return int(ranks_.size()); }
    // f(r) on every rank's thread at once; returns when all are done, rethrowing the first
    // rank's error (by rank). Calls come from one thread at a time.
    void all(const std::function<void(int)>& f) {
        for (Rank& k : ranks_) k.error = nullptr;
        job_ = &f;
        pending_.store(size(), std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> lk(m_);
            gen_.fetch_add(1, std::memory_order_release);
        }
        wake_.notify_all();
        if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
            std::unique_lock<std::mutex> lk(m_);
            done_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
        }
        for (Rank& k : ranks_)
            if (k.error) std::rethrow_exception(k.error);
    }
    // f() on rank r's thread alone.
    void one(int r, const std::function<void()>& f) {
        all([&](int k) {
            if (k == r) f();
        });
    }

private:
    struct Rank {
        std::thread thread;
        std::exception_ptr error;
    };
    std::vector<Rank> ranks_;
    std::mutex m_;
    std::condition_variable wake_, done_;
    std::atomic<uint64_t> gen_{0};
    std::atomic<int> pending_{0};
    const std::function<void(int)>* job_ = nullptr;
    bool stop_ = false;

    // Spins up to ~50 us for `ready`; false if it did not come.
    template <class F>
    static bool spin_until(const F& ready) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0;; ++i) {
            if (ready()) return true;
#if defined(__x86_64__)
            __builtin_ia32_pause();
#endif
            if ((i & 63) == 63 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(50)) return false;
        }
    }

    void loop(int r) {
        uint64_t seen = 0;
        for (;;) {
            if (!spin_until([&] { return gen_.load(std::memory_order_acquire) != seen; })) {
                std::unique_lock<std::mutex> lk(m_);
                wake_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
            }
            seen = gen_.load(std::memory_order_acquire);
            {
                std::lock_guard<std::mutex> lk(m_);
                if (stop_) return;
            }
            try {
                (*job_)(r);
            } catch (...) {
                ranks_[size_t(r)].error = std::current_exception();
            }
            if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                std::lock_guard<std::mutex> lk(m_);
                done_.notify_all();
            }
        }
    }
};

// What the backend, its plans and its states share.
struct Ranks {
    RankThreads threads;
    std::vector<std::shared_ptr<Collective>> collectives;
    std::vector<std::unique_ptr<Qwen35Model>> shards;
    std::vector<std::unique_ptr<Backend>> backends;
    // Each rank's GDN replay log of a verification (its own heads' rows), by the caller's log:
    // the step's header as the caller's was when the ranks logged, then one log a rank.
    struct RankLogs {
        GdnReplayLog header;
        std::vector<GdnReplayLog> ranks;
    };
    std::mutex logs_m;
    std::map<const GdnReplayLog*, RankLogs> logs;
    explicit Ranks(int n) : threads(n) {}
    ~Ranks() {
        threads.all([&](int r) {  // freed on their devices' threads (none yet if the constructor threw)
            if (size_t(r) < backends.size()) backends[size_t(r)].reset();
        });
    }
    int size() const { return threads.size(); }
};

struct TpSnapshot final : DeviceSnapshot {
    std::vector<StateSnapshot> ranks;
    size_t bytes() const override {
        size_t b = 0;
        for (const StateSnapshot& s : ranks) b += s.bytes() + (s.device ? s.device->bytes() : 0);
        return b;
    }
};

// Each rank's part of the state (its heads' GDN states and KV rows), in its backend's memory.
struct TpState final : DeviceState {
    std::shared_ptr<Ranks> ranks;
    std::vector<ModelState> parts;
    explicit TpState(std::shared_ptr<Ranks> r) : ranks(std::move(r)), parts(size_t(ranks->size())) {}
    ~TpState() override {
        ranks->threads.all([&](int r) { parts[size_t(r)] = ModelState{}; });
    }
    void reset(int slot) override {
        ranks->threads.all([&](int r) { parts[size_t(r)].reset(slot); });
    }
    void copy(int from, int to, int n_rows) override {
        ranks->threads.all([&](int r) {
            parts[size_t(r)].n_past[size_t(from)] = n_rows;
            copy_slot(parts[size_t(r)], from, to);
        });
    }
    std::shared_ptr<const DeviceSnapshot> snapshot(int slot) override {
        auto s = std::make_shared<TpSnapshot>();
        s->ranks.resize(parts.size());
        ranks->threads.all([&](int r) { s->ranks[size_t(r)] = snapshot_slot(parts[size_t(r)], slot); });
        return s;
    }
    void restore(int slot, const DeviceSnapshot& snap) override {
        const auto* s = dynamic_cast<const TpSnapshot*>(&snap);
        if (!s || s->ranks.size() != parts.size())
            throw Error("tensor parallel: restore of slot " + std::to_string(slot) + ": the snapshot is not of this state");
        ranks->threads.all([&](int r) { restore_slot(parts[size_t(r)], slot, s->ranks[size_t(r)]); });
    }
};

TpState& tp_state(const ModelState& s) {
    auto* t = dynamic_cast<TpState*>(s.device.get());
    if (!t) throw Error("tensor parallel: the state was not made by the tensor-parallel backend");
    return *t;
}

class TpPlan final : public Plan {
public:
    TpPlan(int bucket, std::shared_ptr<Ranks> ranks) : Plan(bucket), ranks_(std::move(ranks)), plans_(size_t(ranks_->size())) {}
    ~TpPlan() override {
        ranks_->threads.all([&](int r) { plans_[size_t(r)].reset(); });
    }
    std::vector<std::unique_ptr<Plan>>& plans() { return plans_; }

    void replay(const StepContext& c, Profiler* prof) const override {
        TpState& ts = tp_state(*c.state);
        // A verification: each rank logs its GDN ops' rows into a log of its own (replay_gdn).
        std::vector<GdnReplayLog>* rank_logs = nullptr;
        if (c.gdn_log && c.gdn_log->valid) {
            std::lock_guard<std::mutex> lk(ranks_->logs_m);
            if (ranks_->logs.size() >= 8 && !ranks_->logs.count(c.gdn_log)) ranks_->logs.clear();  // bounded: callers' logs come and go
            Ranks::RankLogs& rl = ranks_->logs[c.gdn_log];
            rl.header = *c.gdn_log;
            rl.ranks.assign(size_t(ranks_->size()), rl.header);
            rank_logs = &rl.ranks;
        }
        ranks_->threads.all([&](int r) {
            StepContext rc = c;
            ModelState& part = ts.parts[size_t(r)];
            part.n_past = c.state->n_past;
            rc.state = &part;
            rc.gdn_log = rank_logs ? &(*rank_logs)[size_t(r)] : nullptr;
            if (r != 0) {  // rank 0 returns the rows; the others stop after the last all-reduce
                rc.logits = nullptr;
                rc.argmax = nullptr;
                rc.top_k = 0;
                rc.top_values = nullptr;
                rc.top_ids = nullptr;
                rc.dump = nullptr;
            }
            Collective& coll = *ranks_->collectives[size_t(r)];
            coll.begin_step();
            try {
                plans_[size_t(r)]->replay(rc, r == 0 ? prof : nullptr);
            } catch (...) {
                coll.end_step();
                throw;
            }
            coll.end_step();
        });
    }

private:
    std::shared_ptr<Ranks> ranks_;
    std::vector<std::unique_ptr<Plan>> plans_;
};

class TensorParallelBackend final : public Backend {
public:
    TensorParallelBackend(const Qwen35Model& model, const std::string& child, int n, bool experts_by_id)
        : ranks_(std::make_shared<Ranks>(n)) {
        if (n < 1) throw Error("tensor parallel: needs at least one rank, got " + std::to_string(n));
        for (int r = 0; r < n; ++r) ranks_->shards.push_back(model.shard(r, n, experts_by_id));
        if (child == "cpu") {
            ranks_->collectives = make_host_collectives(n);
        } else if (child == "cuda" || child == "cuda-staged") {
#ifdef ALLOY_CUDA
            ranks_->collectives = child == "cuda" ? make_nccl_collectives(n) : make_host_staged_collectives(n);
#else
            throw Error("tensor parallel over '" + child + "': this build has no CUDA backend");
#endif
        } else {
            throw Error("tensor parallel: unknown backend '" + child + "' for the ranks (cpu, cuda, cuda-staged)");
        }
        ranks_->backends.resize(size_t(n));
        ranks_->threads.all([&](int r) {
            std::shared_ptr<Collective> coll = ranks_->collectives[size_t(r)];
#ifdef ALLOY_CUDA
            if (child == "cuda" || child == "cuda-staged") {  // staged: every rank on GPU 0
                ranks_->backends[size_t(r)] = make_cuda_backend(child == "cuda" ? r : 0, coll);
                return;
            }
#endif
            ranks_->backends[size_t(r)] = std::make_unique<CpuBackend>(coll);
        });
        name_ = child + " x" + std::to_string(n) + (experts_by_id ? " (tensor + expert parallel)" : " (tensor parallel)");
    }

    std::string name() const override { return name_; }
    void optimize(graph::Graph&) const override {}  // each rank rewrites its own graph (compile)

    std::unique_ptr<Plan> compile(const graph::Graph& g, int bucket, const CompileOptions& opt) override {
        auto plan = std::make_unique<TpPlan>(bucket, ranks_);
        ranks_->threads.all([&](int r) {
            graph::Graph rg = ranks_->shards[size_t(r)]->build_graph(g.spec);
            graph::prune_rows(rg);
            if (r != 0) {  // rank 0 returns the rows: the others stop after the last all-reduce
                for (graph::Tensor& t : rg.tensors) t.logits = false;
                graph::drop_unread(rg);
            }
            Backend& b = *ranks_->backends[size_t(r)];
            b.optimize(rg);
            plan->plans()[size_t(r)] = b.compile(rg, bucket, r == 0 ? opt : CompileOptions{});
        });
        return plan;
    }

    ModelState new_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) override {
        return ranks_state(hp, n_ctx, kv_types, n_slots, &Backend::new_state);
    }
    void add_mtp_cache(ModelState& s, const Qwen35HParams& hp) override {
        TpState& t = tp_state(s);
        ranks_->threads.all([&](int r) { ranks_->backends[size_t(r)]->add_mtp_cache(t.parts[size_t(r)], shard_hp(r)); });
        grow_to_mtp(s, hp);
    }
    ModelState new_mtp_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) override {
        ModelState s = ranks_state(hp, n_ctx, kv_types, n_slots, &Backend::new_mtp_state);
        grow_to_mtp(s, hp);
        return s;
    }
    void drop_scratch() override {
        ranks_->threads.all([&](int r) { ranks_->backends[size_t(r)]->drop_scratch(); });
    }
    // Each rank replays its own log of the step (TpPlan::replay), when the caller's log is
    // still the one the ranks logged (same step header); else false and the caller re-runs.
    bool replay_gdn(ModelState& st, const GdnReplayLog& log, int seq, int kept) override {
        std::vector<GdnReplayLog>* rank_logs = nullptr;
        {
            std::lock_guard<std::mutex> lk(ranks_->logs_m);
            auto it = ranks_->logs.find(&log);
            if (it == ranks_->logs.end()) return false;
            const GdnReplayLog& h = it->second.header;
            if (!log.valid || h.ids != log.ids || h.offsets != log.offsets || h.slots != log.slots || h.n_past != log.n_past)
                return false;
            rank_logs = &it->second.ranks;
        }
        TpState& t = tp_state(st);
        std::vector<char> done(size_t(ranks_->size()), 0);
        ranks_->threads.all([&](int r) {
            ModelState& part = t.parts[size_t(r)];
            done[size_t(r)] = ranks_->backends[size_t(r)]->replay_gdn(part, (*rank_logs)[size_t(r)], seq, kept);
        });
        for (char d : done)
            if (!d) throw Error("tensor parallel: replay_gdn: a rank could not replay its log (the ranks' states now differ)");
        return true;
    }
    bool greedy_on_device() const override { return ranks_->backends[0]->greedy_on_device(); }
    int max_top_k_on_device() const override { return ranks_->backends[0]->max_top_k_on_device(); }
    float* host_output(size_t n_floats) override {
        float* p = nullptr;
        ranks_->threads.one(0, [&] { p = ranks_->backends[0]->host_output(n_floats); });
        return p;
    }

private:
    std::shared_ptr<Ranks> ranks_;
    std::string name_;
    const Qwen35HParams& shard_hp(int r) const { return ranks_->shards[size_t(r)]->hparams(); }
    // The whole model's shape of a state, each rank's part made by its backend's `make`.
    using MakeState = ModelState (Backend::*)(const Qwen35HParams&, int, KvCacheTypes, int);
    ModelState ranks_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots, MakeState make) {
        ModelState s = model_state_shape(hp, n_ctx, kv_types, n_slots);
        auto t = std::make_shared<TpState>(ranks_);
        ranks_->threads.all([&](int r) {
            t->parts[size_t(r)] = (ranks_->backends[size_t(r)].get()->*make)(shard_hp(r), n_ctx, kv_types, n_slots);
        });
        s.device = t;
        return s;
    }
    // The whole model's shape of a state with the MTP layer (ModelRunner checks it).
    static void grow_to_mtp(ModelState& s, const Qwen35HParams& hp) {
        const size_t L = size_t(hp.n_layer) + 1;
        if (s.k_cache.size() >= L) return;
        s.k_cache.resize(L), s.v_cache.resize(L), s.conv_state.resize(L), s.ssm_state.resize(L);
    }
};

}  // namespace

std::unique_ptr<Backend> make_tensor_parallel_backend(const Qwen35Model& model, const std::string& child, int n_ranks,
                                                      bool experts_by_id) {
    return std::make_unique<TensorParallelBackend>(model, child, n_ranks, experts_by_id);
}

}  // namespace alloy
