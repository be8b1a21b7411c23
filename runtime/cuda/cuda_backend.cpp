#include "runtime/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "alloy/error.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/ops.h"
#include "kernels/ref/kv_store.h"
#include "runtime/gdn_replay.h"
#include "runtime/graph_passes.h"
#include "runtime/graph_storage.h"

namespace alloy {

using graph::Node;
using graph::Op;
using graph::Rows;

namespace {

void check(cudaError_t e, const std::string& what) {
    if (e != cudaSuccess) throw Error("cuda backend: " + what + ": " + cudaGetErrorString(e));
}

// Memory owned by one object (freed with it): device memory, or page-locked host memory
// (cudaMallocHost), which copies to and from the device run from at the link's speed without
// the driver's staging copy (a pageable 1 MB logits row cost ~0.1 ms a token).
class CudaBuffer {
public:
    enum Kind { kDevice, kPinnedHost };
    CudaBuffer(size_t bytes, const std::string& what, Kind kind = kDevice) : bytes_(bytes), kind_(kind) {
        if (bytes)
            check(kind == kDevice ? cudaMalloc(&p_, bytes) : cudaMallocHost(&p_, bytes),
                  std::string(kind == kDevice ? "cudaMalloc" : "cudaMallocHost") + " of " + std::to_string(bytes) +
                      " bytes for " + what);
    }
    ~CudaBuffer() {
        if (p_) kind_ == kDevice ? cudaFree(p_) : cudaFreeHost(p_);
    }
    CudaBuffer(const CudaBuffer&) = delete;
    CudaBuffer& operator=(const CudaBuffer&) = delete;
    template <class T = void>
    T* get() const { return static_cast<T*>(p_); }
    size_t bytes() const { return bytes_; }

private:
    void* p_ = nullptr;
    size_t bytes_ = 0;
    Kind kind_;
};
using DeviceBuffer = CudaBuffer;

bool env_is(const char* name, const char* value) {
    const char* e = std::getenv(name);
    return e && std::string(e) == value;
}

// The slot state on the device, in ModelState's layout: per GDN layer conv [slots, conv_dim,
// K-1] and recurrent [slots, H_v, d_v, d_k] fp32; per attention layer K and V per slot,
// [n_ctx, n_head_kv * head_dim] of the cache types.
struct CudaState final : DeviceState {
    // Names this state's buffers in the plans' graph keys (an address could be reused).
    const uint64_t serial = next_serial();
    std::vector<std::unique_ptr<DeviceBuffer>> conv, ssm;          // [layer] (null: attention)
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> k, v;  // [layer][slot] (empty: GDN)
    // [layer] (null: GDN): device arrays of the layer's n_slots K and V cache pointers, which
    // the recorded KV store and decode attention index by each token's slot.
    std::vector<std::unique_ptr<DeviceBuffer>> k_tab, v_tab;
    size_t conv_elems = 0, ssm_elems = 0;
    void add_layer(int l, bool recurrent, size_t kv_elems, KvCacheTypes kv_types, int n_slots);
    static uint64_t next_serial() {
        static std::atomic<uint64_t> n{0};
        return ++n;
    }
    // cudaMemset runs on the legacy stream, which a non-blocking stream (the backend's) does not
    // wait for: the zeros are in place before the next step only after the synchronize below.
    // (The workspaces the plans zero use cudaMemsetAsync on their stream: their first kernel
    // raced a plain cudaMemset, a counter left nonzero, and cuda::top_k read unwritten keys.)
    void reset(int slot) override {
        for (size_t l = 0; l < conv.size(); ++l) {
            if (!conv[l]) continue;
            check(cudaMemset(conv[l]->get<float>() + size_t(slot) * conv_elems, 0, conv_elems * sizeof(float)), "reset");
            check(cudaMemset(ssm[l]->get<float>() + size_t(slot) * ssm_elems, 0, ssm_elems * sizeof(float)), "reset");
        }
        check(cudaDeviceSynchronize(), "reset");
    }

    // The slot state cache's copies (runtime/slot_cache.h), device to device on the backend's
    // stream (in order with the steps; never the legacy stream, which does not order it: see
    // CudaBackend::upload), done when they return.
    size_t kv_row_bytes(const DeviceBuffer& cache) const { return cache.bytes() / size_t(n_ctx); }
    void copy(int from, int to, int n_rows) override {
        for (size_t l = 0; l < conv.size(); ++l) {
            for (auto* cache : {&k[l], &v[l]}) {
                if (cache->empty()) continue;
                const DeviceBuffer& src = *(*cache)[size_t(from)];
                check(cudaMemcpyAsync((*cache)[size_t(to)]->get(), src.get(), kv_row_bytes(src) * size_t(n_rows),
                                      cudaMemcpyDeviceToDevice, stream),
                      "copy of slot " + std::to_string(from) + "'s KV rows");
            }
            if (!conv[l]) continue;
            for (auto [buf, elems] : {std::pair{&conv[l], conv_elems}, std::pair{&ssm[l], ssm_elems}}) {
                float* base = (*buf)->get<float>();
                check(cudaMemcpyAsync(base + size_t(to) * elems, base + size_t(from) * elems, elems * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream),
                      "copy of slot " + std::to_string(from) + "'s GDN states");
            }
        }
        check(cudaStreamSynchronize(stream), "copy of slot " + std::to_string(from));
    }

    // A snapshot: every GDN layer's conv then recurrent state of one slot, in one device buffer
    // from a pool (a speculative step takes one per verification: no cudaMalloc per step).
    struct Snapshot final : DeviceSnapshot {
        std::shared_ptr<std::vector<std::unique_ptr<DeviceBuffer>>> pool;  // where the buffer goes back
        std::unique_ptr<DeviceBuffer> buf;
        uint64_t state_serial = 0;
        size_t bytes() const override { return buf->bytes(); }
        ~Snapshot() override { pool->push_back(std::move(buf)); }
    };
    std::shared_ptr<std::vector<std::unique_ptr<DeviceBuffer>>> snap_pool =
        std::make_shared<std::vector<std::unique_ptr<DeviceBuffer>>>();
    size_t snapshot_bytes() const {
        size_t n = 0;
        for (const auto& c : conv) n += c ? (conv_elems + ssm_elems) * sizeof(float) : 0;
        return n;
    }
    // Each GDN layer's pair of copies between the slot's states and the snapshot buffer.
    void gdn_copies(int slot, float* snap, bool to_snap, const char* what) {
        for (size_t l = 0; l < conv.size(); ++l) {
            if (!conv[l]) continue;
            for (auto [buf, elems] : {std::pair{&conv[l], conv_elems}, std::pair{&ssm[l], ssm_elems}}) {
                float* st = (*buf)->get<float>() + size_t(slot) * elems;
                check(cudaMemcpyAsync(to_snap ? snap : st, to_snap ? st : snap, elems * sizeof(float),
                                      cudaMemcpyDeviceToDevice, stream),
                      std::string(what) + " of slot " + std::to_string(slot));
                snap += elems;
            }
        }
        check(cudaStreamSynchronize(stream), std::string(what) + " of slot " + std::to_string(slot));
    }
    std::shared_ptr<const DeviceSnapshot> snapshot(int slot) override {
        auto snap = std::make_shared<Snapshot>();
        snap->pool = snap_pool;
        snap->state_serial = serial;
        if (!snap_pool->empty()) {
            snap->buf = std::move(snap_pool->back());
            snap_pool->pop_back();
        } else {
            snap->buf = std::make_unique<DeviceBuffer>(snapshot_bytes(), "a slot state snapshot");
        }
        gdn_copies(slot, snap->buf->get<float>(), true, "snapshot");
        return snap;
    }
    void restore(int slot, const DeviceSnapshot& s) override {
        const auto* snap = dynamic_cast<const Snapshot*>(&s);
        if (!snap || snap->state_serial != serial)
            throw Error("cuda backend: restore of slot " + std::to_string(slot) + ": the snapshot is of another state");
        gdn_copies(slot, snap->buf->get<float>(), false, "restore");
    }
    int n_ctx = 0;
    cudaStream_t stream = nullptr;  // the backend's
};

CudaState& device_state(const StepContext& c) {
    auto* s = c.state ? dynamic_cast<CudaState*>(c.state->device.get()) : nullptr;
    if (!s) throw Error("cuda backend: the state was not made by the cuda backend (ModelRunner::new_state)");
    return *s;
}

class CudaBackend;

// A plan on the device: its steps launch kernels on the backend's stream; replay stages the
// step's inputs, runs the steps and brings the logits rows back.
class CudaPlan final : public Plan {
public:
    CudaPlan(int bucket, cudaStream_t stream, int64_t n_vocab, int64_t n_logits, Rows logits)
        : Plan(bucket), stream_(stream), n_vocab_(n_vocab), n_logits_(n_logits), logits_rows_(logits),
          io_(size_t(kIoFields) * io_stride(bucket) * sizeof(int32_t), "step inputs"),
          // Rows the step can return: the last token's one, or up to the bucket's.
          logits_(size_t(logits == Rows::Last ? 1 : logits == Rows::None ? 0 : bucket) * size_t(n_logits) * sizeof(float),
                  "logits"),
          host_io_(size_t(kIoFields) * io_stride(bucket) * sizeof(int32_t), "step inputs", CudaBuffer::kPinnedHost) {}
    // Device arrays of the step's inputs, each [bucket + 1] int32, 256-byte aligned (the
    // kernels load offsets and slots as vectors).
    // kTokSlots: each token's slot (the KV store's and decode attention's cache); kNextIds: each
    // token's sequence's next token (its own at a sequence's end): the MTP head's Embed.
    enum IoField { kIds, kPos, kOffsets, kSlots, kOutRows, kTokSlots, kNextIds, kIoFields };
    static size_t io_stride(int bucket) { return (size_t(bucket) + 1 + 63) / 64 * 64; }
    int32_t* io(IoField f) const { return io_.get<int32_t>() + size_t(f) * io_stride(bucket()); }
    float* logits() const { return logits_.get<float>(); }
    std::unique_ptr<DeviceBuffer> scratch, workspace;  // activations; matmul / GDN workspace
    std::unique_ptr<DeviceBuffer> decode_attention_ws;  // cuda::attention_decode's
    std::unique_ptr<DeviceBuffer> packed_inputs;        // the producers' matmul inputs (cuda::MatmulInput)
    ~CudaPlan() override {
        for (auto& [key, execs] : graphs_)
            for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
    }
    // A step whose launches depend on more than the graph key (below): it runs eagerly between
    // the recorded segments (the KV store and attention take each sequence's depth and slot on
    // the host; dumps copy to the host).
    void add_eager(std::string kernel, std::string label, std::function<void(const StepContext&)> run) {
        add(std::move(kernel), std::move(label), std::move(run));
        eager_.resize(steps().size(), kRecorded);
        eager_.back() = kEager;
    }
    static constexpr int kGraphMaxBucket = 16;  // plans recorded as CUDA graphs
    // A verification's GDN replay log (runtime/gdn_replay.h): each GDN op copies its inputs'
    // rows into log_ (recorded with the step) and replay() lists them in the host log, from
    // this table (the closures run only when a graph is recorded).
    static bool logs_gdn(const StepContext& c) { return c.gdn_log && c.gdn_log->valid; }
    std::vector<GdnReplayLog::Layer> gdn_layers;  // one per GDN op, dev_* into log_
    std::unique_ptr<DeviceBuffer> log_;
    // Runs on the host after the step's work is done (a recorded dump's sink).
    void after_step(std::function<void(const StepContext&)> f) { after_step_.push_back(std::move(f)); }
    // Issues work after the step's (its copies back), before the host waits for the step.
    void before_sync(std::function<void(const StepContext&)> f) { before_sync_.push_back(std::move(f)); }
    void add_eager_unless_16bit_kv(std::string kernel, std::string label, std::function<void(const StepContext&)> run) {
        add_eager(std::move(kernel), std::move(label), std::move(run));
        eager_.back() = kEagerUnless16BitKv;
    }

    void replay(const StepContext& c, Profiler* prof) const override {
        if (c.n > bucket() || c.n_out > bucket()) throw Error("cuda backend: a step larger than its plan's bucket");
        // Inputs: ids, positions of each sequence's
        // tokens, offsets, slots, the logits rows of a batch; one host-to-device copy.
        const size_t w = io_stride(bucket());
        const auto t_start = std::chrono::steady_clock::now();
        int32_t* h = host_io_.get<int32_t>();
        for (int t = 0; t < c.n; ++t) {  // the gather kernel does not check
            if (n_vocab_ > 0 && (c.ids[t] < 0 || c.ids[t] >= n_vocab_))
                throw Error("token id " + std::to_string(c.ids[t]) + " at position " + std::to_string(t) +
                            " is outside the vocabulary [0, " + std::to_string(n_vocab_) + ")");
            h[size_t(kIds) * w + size_t(t)] = c.ids[t];
        }
        for (int s = 0; s < c.n_seqs; ++s) {
            for (int t = c.offsets[s]; t < c.offsets[s + 1]; ++t) {
                h[size_t(kPos) * w + size_t(t)] = c.n_past[s] + t - c.offsets[s];
                h[size_t(kTokSlots) * w + size_t(t)] = c.slots[s];
                h[size_t(kNextIds) * w + size_t(t)] = c.ids[std::min(t + 1, c.offsets[s + 1] - 1)];
            }
            h[size_t(kSlots) * w + size_t(s)] = c.slots[s];
        }
        for (int s = 0; s <= c.n_seqs; ++s) h[size_t(kOffsets) * w + size_t(s)] = c.offsets[s];
        for (int i = 0; i < c.n_out; ++i) h[size_t(kOutRows) * w + size_t(i)] = c.out_rows[i];
        check(cudaMemcpyAsync(io_.get(), h, host_io_.bytes(), cudaMemcpyHostToDevice, stream_), "inputs");
        if (prof) {
            profile(c, *prof);
        } else if (use_graphs()) {
            run_graphs(c);
        } else {
            for (const PlanStep& s : steps()) s.run(c);
        }
        const int64_t rows = logits_rows_ == Rows::All ? c.n : logits_rows_ == Rows::Last ? 1
                             : logits_rows_ == Rows::Listed                               ? c.n_out
                                                                                          : 0;
        // Greedy tokens picked where the logits are: one int32 a row comes back.
        if (rows > 0 && c.argmax) {
            if (!argmax_) {  // cuda::argmax's workspace must start zeroed (each call leaves it so)
                argmax_ = std::make_unique<DeviceBuffer>(argmax_ws_at_ + cuda::argmax_workspace_bytes(bucket()), "argmax");
                check(cudaMemsetAsync(argmax_->get(), 0, argmax_->bytes(), stream_), "argmax workspace");
            }
            int32_t* out = argmax_->get<int32_t>();
            cuda::argmax(logits(), rows, n_logits_, out, argmax_->get<char>() + argmax_ws_at_, stream_);
            // Into page-locked memory: a copy into the caller's pageable array would wait for the
            // GPU right here, and a dump's copy queued after it (--spec mtp's trunk rows) would
            // cost a second round trip (the H200 ran --spec mtp with no drafts 3-6% below plain decode).
            check(cudaMemcpyAsync(argmax_host_.get(), out, size_t(rows) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
                  "argmax");
        }
        // Sampled tokens: the k best (value, id) pairs of each row come back (one copy into
        // page-locked memory, values then ids), and the host's sampler draws from them.
        const bool top = rows > 0 && c.top_k > 0;
        if (top) {
            if (c.top_k > cuda::kTopKMax) throw Error("cuda backend: top-k above " + std::to_string(cuda::kTopKMax));
            const size_t pairs = size_t(bucket()) * cuda::kTopKMax;
            if (!top_) {  // cuda::top_k's counters must start zeroed (each call leaves them so)
                top_ = std::make_unique<DeviceBuffer>(pairs * 8 + cuda::top_k_workspace_bytes(bucket(), n_logits_, cuda::kTopKMax),
                                                      "top-k");
                check(cudaMemsetAsync(top_->get(), 0, top_->bytes(), stream_), "top-k workspace");
                top_host_ = std::make_unique<CudaBuffer>(pairs * 8, "top-k pairs", CudaBuffer::kPinnedHost);
            }
            const size_t n_pairs = size_t(rows) * size_t(c.top_k);
            float* values = top_->get<float>();
            auto* ids = reinterpret_cast<int32_t*>(values + n_pairs);
            cuda::top_k(logits(), rows, n_logits_, c.top_k, values, ids, top_->get<char>() + pairs * 8, stream_);
            check(cudaMemcpyAsync(top_host_->get(), values, n_pairs * 8, cudaMemcpyDeviceToHost, stream_), "top-k");
        }
        // Straight into the caller's array: staging through page-locked memory and a host memcpy
        // measured the same (H200, tg128 588-611 vs 598-604 t/s) for one more copy.
        if (rows > 0 && c.logits)
            check(cudaMemcpyAsync(c.logits, logits(), size_t(rows) * size_t(n_logits_) * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_),
                  "logits");
        for (const auto& f : before_sync_) f(c);
        const auto t_queued = std::chrono::steady_clock::now();
        check(cudaStreamSynchronize(stream_), "step");
        if (rows > 0 && c.argmax) std::memcpy(c.argmax, argmax_host_.get(), size_t(rows) * sizeof(int32_t));
        for (const auto& f : after_step_) f(c);
        if (logs_gdn(c))
            for (const GdnReplayLog::Layer& L : gdn_layers) c.gdn_log->layers.push_back(L);
        if (top) {
            const size_t n_pairs = size_t(rows) * size_t(c.top_k);
            std::memcpy(c.top_values, top_host_->get<float>(), n_pairs * sizeof(float));
            std::memcpy(c.top_ids, top_host_->get<float>() + n_pairs, n_pairs * sizeof(int32_t));
        }
        if (stats_) stats_->add(t_start, t_queued, std::chrono::steady_clock::now());
    }

private:
    cudaStream_t stream_;
    int64_t n_vocab_, n_logits_;  // token ids' range (the embedding's rows, 0: no Embed); a logits row's width
    Rows logits_rows_;
    DeviceBuffer io_, logits_;
    // [bucket] tokens, then (at argmax_ws_at_, 8-byte keys) cuda::argmax's workspace.
    mutable std::unique_ptr<DeviceBuffer> argmax_;
    const size_t argmax_ws_at_ = (size_t(bucket()) * sizeof(int32_t) + 255) / 256 * 256;
    // [bucket, kTopKMax] values, ids, then cuda::top_k's workspace; the pairs' page-locked copy.
    mutable std::unique_ptr<DeviceBuffer> top_;
    mutable std::unique_ptr<CudaBuffer> top_host_;
    CudaBuffer host_io_;  // page-locked
    CudaBuffer argmax_host_{size_t(bucket()) * sizeof(int32_t), "greedy tokens", CudaBuffer::kPinnedHost};
    std::vector<std::function<void(const StepContext&)>> after_step_, before_sync_;
    // [steps] how a step runs under CUDA graphs: kRecorded, kEager (add_eager), kEagerUnless16BitKv
    // (recorded when the state's K and V caches are both f16 / bf16: decode attention).
    enum StepKind : char { kRecorded, kEager, kEagerUnless16BitKv };
    std::vector<char> eager_;
    bool eager(size_t i, const StepContext& c) const {
        if (i >= eager_.size() || eager_[i] == kRecorded) return false;
        if (eager_[i] == kEager) return true;
        auto b16 = [](GgmlType t) { return t == GgmlType::F16 || t == GgmlType::BF16; };
        return !(b16(c.state->kv_types.k) && b16(c.state->kv_types.v));
    }
    // ALLOY_CUDA_STATS=1: where a replay's wall time goes (host work and launches; waiting for
    // the GPU and the logits copy), printed when the plan is dropped.
    struct Stats {
        int bucket;
        int64_t n = 0;
        double queue_us = 0, wait_us = 0;
        void add(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b,
                 std::chrono::steady_clock::time_point c) {
            auto us = [](auto x, auto y) { return std::chrono::duration<double, std::micro>(y - x).count(); };
            ++n, queue_us += us(a, b), wait_us += us(b, c);
        }
        ~Stats() {
            if (n)
                std::fprintf(stderr, "cuda plan of bucket %d: %lld replays, mean us: host + launches %.1f, waiting for the GPU (and the logits copy) %.1f\n",
                             bucket, (long long)n, queue_us / double(n), wait_us / double(n));
        }
    };
    mutable std::unique_ptr<Stats> stats_ = env_is("ALLOY_CUDA_STATS", "1") ? std::make_unique<Stats>(Stats{bucket()}) : nullptr;
    // CUDA Graphs (decode and verification plans: launch-bound, ~500 launches a token): each run
    // of non-eager steps is recorded once per key and replayed as one graph launch. The key
    // holds everything those steps' launches take from the host: the state (its buffers), the
    // token count, the logits rows, and each sequence's token range and GDN kernel.
    mutable std::map<std::vector<int64_t>, std::vector<cudaGraphExec_t>> graphs_;
    mutable bool graphs_failed_ = false;

    // Each step launched on its own (no graphs), between two CUDA events: the profile's times
    // are the GPU's, a step's from its first launch starting to its last one ending (gaps
    // where the host falls behind show between steps, not in them).
    void profile(const StepContext& c, Profiler& prof) const {
        const std::vector<PlanStep>& st = steps();
        std::vector<cudaEvent_t> ev(2 * st.size() + 1, nullptr);
        struct Events {
            std::vector<cudaEvent_t>& ev;
            ~Events() {
                for (cudaEvent_t e : ev)
                    if (e) cudaEventDestroy(e);
            }
        } own{ev};
        for (cudaEvent_t& e : ev) check(cudaEventCreate(&e), "profile event");
        check(cudaStreamSynchronize(stream_), "profile");
        const auto origin = std::chrono::steady_clock::now();
        check(cudaEventRecord(ev[0], stream_), "profile event");
        for (size_t i = 0; i < st.size(); ++i) {
            check(cudaEventRecord(ev[2 * i + 1], stream_), st[i].label);
            st[i].run(c);
            check(cudaEventRecord(ev[2 * i + 2], stream_), st[i].label);
        }
        check(cudaStreamSynchronize(stream_), "profile");
        auto at = [&](size_t k) {
            float ms = 0;
            check(cudaEventElapsedTime(&ms, ev[0], ev[k]), "profile event");
            return origin + std::chrono::nanoseconds(int64_t(double(ms) * 1e6));
        };
        for (size_t i = 0; i < st.size(); ++i) prof.record(st[i], at(2 * i + 1), at(2 * i + 2));
    }

    // Read at every replay, so a test can compare both ways in one process.
    bool use_graphs() const { return !env_is("ALLOY_CUDA_GRAPHS", "0") && !graphs_failed_ && bucket() <= kGraphMaxBucket; }
    static constexpr size_t kMaxGraphKeys = 64;

    std::vector<int64_t> graph_key(const StepContext& c) const {
        std::vector<int64_t> k = {int64_t(device_state(c).serial), c.n, c.n_out, c.n_seqs};
        for (int s = 0; s <= c.n_seqs; ++s) k.push_back(c.offsets[s]);
        for (int s = 0; s < c.n_seqs; ++s) k.push_back(c.serial ? c.serial[s] : 0);
        k.push_back(logs_gdn(c));  // a verification's graph also copies the GDN inputs out
        return k;
    }

    void run_graphs(const StepContext& c) const {
        const std::vector<PlanStep>& st = steps();
        const std::vector<int64_t> key = graph_key(c);
        auto it = graphs_.find(key);
        bool record = it == graphs_.end();
        if (record) {
            if (graphs_.size() >= kMaxGraphKeys) {  // bounded: states come and go
                for (auto& [k, execs] : graphs_)
                    for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
                graphs_.clear();
            }
            it = graphs_.emplace(key, std::vector<cudaGraphExec_t>{}).first;
        }
        size_t seg = 0;
        bool eager = false;  // a recording failed: the rest of this replay runs launch by launch
        for (size_t i = 0; i < st.size();) {
            if (eager || this->eager(i, c)) {
                st[i++].run(c);
                continue;
            }
            size_t j = i;
            while (j < st.size() && !this->eager(j, c)) ++j;
            if (record) {
                cudaGraphExec_t e = capture(st, i, j, c);
                if (!e) {  // nothing of steps i..j ran yet: run them (and all later ones) directly
                    graphs_.erase(it);
                    record = false;
                    eager = true;
                    continue;
                }
                it->second.push_back(e);
            }
            check(cudaGraphLaunch(it->second.at(seg), stream_), "graph launch");
            ++seg;
            i = j;
        }
    }

    // Records steps [i, j) of a replay into a graph; nullptr (and graphs off for this plan from
    // then on) when that fails, e.g. a step that synchronizes: a slower plan, not a wrong one.
    cudaGraphExec_t capture(const std::vector<PlanStep>& st, size_t i, size_t j, const StepContext& c) const {
        std::string why;
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
            why = "begin capture";
        } else {
            try {
                for (size_t k = i; k < j; ++k) st[k].run(c);
            } catch (const std::exception& e) {
                why = e.what();
            }
            const cudaError_t e = cudaStreamEndCapture(stream_, &g);
            if (why.empty() && e != cudaSuccess) why = cudaGetErrorString(e);
            if (why.empty() && g) {
                const cudaError_t e2 = cudaGraphInstantiate(&exec, g, 0);
                if (e2 != cudaSuccess) why = cudaGetErrorString(e2), exec = nullptr;
            }
            if (g) cudaGraphDestroy(g);
        }
        if (!why.empty() || !exec) {
            cudaGetLastError();  // clear a non-sticky capture error
            graphs_failed_ = true;
            std::fprintf(stderr, "cuda backend: recording steps %zu..%zu (from %s) as a CUDA graph failed (%s); "
                                 "this plan launches its kernels one by one\n",
                         i, j, st[i].label.c_str(), why.empty() ? "no graph" : why.c_str());
            return nullptr;
        }
        return exec;
    }
};

class CudaBackend final : public Backend {
public:
    // On device `device` (made current for the calling thread, which must be the one that
    // uses the backend); `collective`: a tensor-parallel rank's (its graphs' AllReduce ops).
    explicit CudaBackend(int device = -1, std::shared_ptr<Collective> collective = nullptr)
        : collective_(std::move(collective)) {
        if (!cuda::device_available()) throw Error("cuda backend: no CUDA device is available");
        if (device >= 0) {
            int n = 0;
            check(cudaGetDeviceCount(&n), "device count");
            if (device >= n)
                throw Error("cuda backend: device " + std::to_string(device) + " asked for; this machine has " +
                            std::to_string(n));
            check(cudaSetDevice(device), "set device " + std::to_string(device));
        }
        check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    }
    ~CudaBackend() override {
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
    }
    std::string name() const override { return "cuda"; }
    float* host_output(size_t n_floats) override {
        if (!host_output_ || host_output_->bytes() < n_floats * sizeof(float))
            host_output_ = std::make_unique<CudaBuffer>(n_floats * sizeof(float), "the logits rows on the host",
                                                        CudaBuffer::kPinnedHost);
        return host_output_->get<float>();
    }
    // kernels/cuda has the residual add fused with the next norm, and matmuls on one input as
    // one launch at decode (matmul_multi); SwiGLU runs as its own op.
    void optimize(graph::Graph& g) const override {
        graph::fuse_add_norm(g);
        graph::group_matmuls(g);
    }
    std::unique_ptr<Plan> compile(const graph::Graph& g, int bucket, const CompileOptions& opt) override;
    ModelState new_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) override;
    void add_mtp_cache(ModelState& s, const Qwen35HParams& hp) override;
    // The logged GDN ops again on the kept rows, from the plan's device copies (cuda::gdn_fused, serial).
    bool replay_gdn(ModelState& st, const GdnReplayLog& log, int seq, int kept) override;
    ModelState new_mtp_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) override;
    void drop_scratch() override {}
    bool greedy_on_device() const override { return true; }
    // ALLOY_CUDA_TOP_K=0: none (the runner then picks the pairs from the logits rows; A/B).
    int max_top_k_on_device() const override {
        static const bool off = [] {
            const char* e = std::getenv("ALLOY_CUDA_TOP_K");
            return e && e[0] == '0';
        }();
        return off ? 0 : cuda::kTopKMax;
    }

private:
    std::shared_ptr<Collective> collective_;
    cudaStream_t stream_ = nullptr;
    std::pair<ModelState, std::shared_ptr<CudaState>> empty_state(const Qwen35HParams& hp, int n_ctx,
                                                                  KvCacheTypes kv_types, int n_slots);
    // Uploaded weights by host address: each matrix and small fp32 array once.
    std::unordered_map<const void*, std::unique_ptr<DeviceBuffer>> uploads_;
    // Attention's split-K workspace, zeroed when (re)allocated (its counters stay zeroed).
    std::unique_ptr<DeviceBuffer> attn_ws_;
    std::unique_ptr<CudaBuffer> host_output_;  // host_output's page-locked rows
    std::unique_ptr<DeviceBuffer> replay_ws_;  // replay_gdn's offsets and slot, z, y, workspace

    // split: a block-quantized matrix (w), rearranged on the device after the copy (cuda::split_blocks).
    // The copies run on the backend's stream, in order with the split and the steps: a plain
    // cudaMemcpy from pageable memory may return before its DMA lands (CUDA's API sync notes),
    // and the legacy stream it runs on does not order the non-blocking stream_, so the split
    // kernel read a part-copied matrix: weights that differed run to run (0.8B Q8_0: the FFN
    // gate/up rows of random layers, found by dumps of two processes, 2026-12-04).
    const void* upload(const void* host, size_t bytes, const std::string& what, const WeightView* split = nullptr) {
        auto it = uploads_.find(host);
        if (it == uploads_.end()) {
            auto buf = std::make_unique<DeviceBuffer>(bytes, what);
            if (split) {
                DeviceBuffer staged(bytes, what + " (as stored)");
                check(cudaMemcpyAsync(staged.get(), host, bytes, cudaMemcpyHostToDevice, stream_), "upload of " + what);
                WeightView g = *split;
                g.data = static_cast<const uint8_t*>(staged.get());
                cuda::split_blocks(g, buf->get(), stream_);
                check(cudaStreamSynchronize(stream_), "split of " + what);
            } else {
                check(cudaMemcpyAsync(buf->get(), host, bytes, cudaMemcpyHostToDevice, stream_), "upload of " + what);
                check(cudaStreamSynchronize(stream_), "upload of " + what);
            }
            it = uploads_.emplace(host, std::move(buf)).first;
        }
        return it->second->get();
    }
    // Block-quantized matrices live split on the device (WeightLayout::Split): every use of one
    // (the GEMVs, the prefill panels, the embedding gather of a tied table) reads that layout.
    WeightView device_weight(const WeightView& w, const std::string& what) {
        WeightView d = w;
        const bool split = cuda::split_blocks_supported(w.type);
        d.data = static_cast<const uint8_t*>(upload(w.data, size_t(w.n_out) * w.row_bytes, what, split ? &w : nullptr));
        if (split) d.layout = WeightLayout::Split;
        return d;
    }
    // A MoE layer's matrices on the device (a fused gate_up tensor uploads once: by host address).
    ref::MoeWeights device_moe(const ref::MoeWeights& w, const std::string& what) {
        ref::MoeWeights d = w;
        d.router = device_weight(w.router, what + " router");
        d.gate.all = device_weight(w.gate.all, what + " expert gate");
        d.up.all = device_weight(w.up.all, what + " expert up");
        d.down.all = device_weight(w.down.all, what + " expert down");
        if (w.has_shared()) {
            d.shexp_gate = device_weight(w.shexp_gate, what + " shared expert gate");
            d.shexp_up = device_weight(w.shexp_up, what + " shared expert up");
            d.shexp_down = device_weight(w.shexp_down, what + " shared expert down");
            d.shexp_router = device_weight(w.shexp_router, what + " shared expert router");
        }
        return d;
    }
    const float* device_floats(const float* host, int64_t n, const std::string& what) {
        return host ? static_cast<const float*>(upload(host, size_t(n) * sizeof(float), what)) : nullptr;
    }
    void* attention_workspace(size_t bytes) {
        if (!attn_ws_ || attn_ws_->bytes() < bytes) {
            check(cudaStreamSynchronize(stream_), "attention workspace");  // the old one may be in use
            attn_ws_.reset();
            attn_ws_ = std::make_unique<DeviceBuffer>(std::max<size_t>(bytes, 1 << 20), "the attention workspace");
            check(cudaMemsetAsync(attn_ws_->get(), 0, attn_ws_->bytes(), stream_), "attention workspace");
        }
        return attn_ws_->get();
    }
};

// Layer l's device state: a GDN layer's conv and recurrent states of every slot, or an
// attention layer's K and V per slot and the device tables of their pointers.
void CudaState::add_layer(int l, bool recurrent, size_t kv_elems, KvCacheTypes kv_types, int n_slots) {
    const size_t L = std::max(conv.size(), size_t(l) + 1);
    conv.resize(L), ssm.resize(L), k.resize(L), v.resize(L), k_tab.resize(L), v_tab.resize(L);
    const std::string who = "layer " + std::to_string(l) + "'s state";
    if (recurrent) {
        conv[size_t(l)] = std::make_unique<DeviceBuffer>(conv_elems * size_t(n_slots) * sizeof(float), who);
        ssm[size_t(l)] = std::make_unique<DeviceBuffer>(ssm_elems * size_t(n_slots) * sizeof(float), who);
        return;
    }
    std::vector<void*> kp, vp;
    for (int slot = 0; slot < n_slots; ++slot) {
        k[size_t(l)].push_back(std::make_unique<DeviceBuffer>(kv_elems * ref::kv_elem_bytes(kv_types.k), who));
        v[size_t(l)].push_back(std::make_unique<DeviceBuffer>(kv_elems * ref::kv_elem_bytes(kv_types.v), who));
        kp.push_back(k[size_t(l)].back()->get());
        vp.push_back(v[size_t(l)].back()->get());
    }
    for (auto [tab, ptrs] : {std::pair{&k_tab, &kp}, std::pair{&v_tab, &vp}}) {
        (*tab)[size_t(l)] = std::make_unique<DeviceBuffer>(ptrs->size() * sizeof(void*), who);
        check(cudaMemcpy((*tab)[size_t(l)]->get(), ptrs->data(), ptrs->size() * sizeof(void*), cudaMemcpyHostToDevice),
              "cache pointers of " + who);
    }
}

// A device state with no layer allocated yet (model_state_shape's host part).
std::pair<ModelState, std::shared_ptr<CudaState>> CudaBackend::empty_state(const Qwen35HParams& hp, int n_ctx,
                                                                           KvCacheTypes kv_types, int n_slots) {
    ModelState s = model_state_shape(hp, n_ctx, kv_types, n_slots);
    auto d = std::make_shared<CudaState>();
    d->conv_elems = s.conv_elems;
    d->ssm_elems = s.ssm_elems;
    d->n_ctx = n_ctx;
    d->stream = stream_;
    s.device = d;
    return {std::move(s), d};
}

ModelState CudaBackend::new_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) {
    auto [s, d] = empty_state(hp, n_ctx, kv_types, n_slots);
    const size_t kv = size_t(n_ctx) * size_t(hp.n_head_kv) * size_t(hp.head_dim);
    for (int l = 0; l < hp.n_layer; ++l) d->add_layer(l, hp.is_recurrent(l), kv, kv_types, n_slots);
    for (int slot = 0; slot < n_slots; ++slot) d->reset(slot);
    return std::move(s);
}

// The MTP block is an attention layer at index n_layer (spec/MODEL.md section 8): its K and V
// per slot on the device; the host shape grows to n_layer + 1 layers (ModelRunner checks it).
void CudaBackend::add_mtp_cache(ModelState& s, const Qwen35HParams& hp) {
    if (hp.n_layer_mtp <= 0) throw Error("the model has no MTP block (nextn_predict_layers is 0)");
    auto* d = dynamic_cast<CudaState*>(s.device.get());
    if (!d) throw Error("cuda backend: add_mtp_cache: the state was not made by the cuda backend");
    const size_t L = size_t(hp.n_layer) + 1;
    if (s.k_cache.size() >= L) return;  // added already
    const size_t kv = size_t(s.n_ctx) * size_t(hp.n_head_kv) * size_t(hp.head_dim);
    d->add_layer(hp.n_layer, false, kv, s.kv_types, s.n_slots);
    s.k_cache.resize(L), s.v_cache.resize(L), s.conv_state.resize(L), s.ssm_state.resize(L);
}

ModelState CudaBackend::new_mtp_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) {
    auto [s, d] = empty_state(hp, n_ctx, kv_types, n_slots);
    add_mtp_cache(s, hp);
    return std::move(s);
}

std::unique_ptr<Plan> CudaBackend::compile(const graph::Graph& g, int bucket, const CompileOptions& opt) {
    graph::check(g);
    int64_t n_vocab = 0, n_logits = 0;
    for (const graph::Tensor& t : g.tensors)
        if (t.logits) n_logits = t.cols;
    for (const Node& n : g.nodes)
        if (n.op == Op::Embed) n_vocab = n.weights[0]->n_out;
    auto plan = std::make_unique<CudaPlan>(bucket, stream_, n_vocab, n_logits, g.spec.logits);
    const GraphLayout layout = plan_storage(g, bucket);
    plan->scratch = std::make_unique<DeviceBuffer>(size_t(std::max<int64_t>(layout.total, 1)) * sizeof(float), "activations");
    float* scratch = plan->scratch->get<float>();
    std::vector<TensorRef> refs(g.tensors.size());
    for (size_t t = 0; t < g.tensors.size(); ++t) {
        const graph::Tensor& x = g.tensors[t];
        // The logits tensor: the plan's device logits array (compact), copied back after the step.
        refs[t] = {x.logits ? plan->logits() : layout.offset[t] >= 0 ? scratch + layout.offset[t] : nullptr, x.cols,
                   x.rows == Rows::Listed || x.logits, false};
    }
    auto in = [&](const Node& n, size_t i) { return refs[size_t(n.in[i])]; };
    auto out = [&](const Node& n, size_t i) { return refs[size_t(n.out[i])]; };
    const int32_t* d_ids = plan->io(CudaPlan::kIds);
    const int32_t* d_pos = plan->io(CudaPlan::kPos);
    const int32_t* d_offsets = plan->io(CudaPlan::kOffsets);
    const int32_t* d_slots = plan->io(CudaPlan::kSlots);
    const int32_t* d_out_rows = plan->io(CudaPlan::kOutRows);
    const int32_t* d_tok_slots = plan->io(CudaPlan::kTokSlots);
    cudaStream_t st = stream_;

    // One workspace for the matmuls and the GDN op (one node runs at a time), sized for the
    // plan's largest call.
    size_t ws_bytes = 0;
    for (const Node& n : g.nodes) {
        if (n.op == Op::Matmul || n.op == Op::MatmulMulti)
            for (const WeightView* w : n.weights) {
                if (w->type != GgmlType::F32 && w->type != GgmlType::BF16 && !cuda::split_blocks_supported(w->type))
                    throw Error("cuda backend: weight of '" + n.label + "' is " + type_traits(w->type).name +
                                "; this backend runs F32, BF16, " + cuda::kSplitBlockTypes + " weights");
                ws_bytes = std::max(ws_bytes, cuda::matmul_workspace_bytes(*w, bucket));
            }
        if (n.op == Op::GdnFused)
            for (ref::GdnMode m : {ref::GdnMode::Serial, ref::GdnMode::Chunked}) {
                ref::GdnParams p = n.gdn;
                p.mode = m;
                ws_bytes = std::max(ws_bytes, cuda::gdn_fused_workspace_bytes(p, bucket, bucket));
            }
        if (n.op == Op::MoeFfn) {
            // cuda::moe_ffn's expert GEMVs take F32, BF16 and the split block types: say so now, not mid-step.
            for (const ref::ExpertMatrix* m : {&n.moe->gate, &n.moe->up, &n.moe->down}) {
                const GgmlType t = m->all.type;
                if (t != GgmlType::F32 && t != GgmlType::BF16 && !cuda::split_blocks_supported(t))
                    throw Error("cuda backend: the experts of '" + n.label + "' are " + type_traits(t).name +
                                "; this backend runs F32, BF16 and " + cuda::kSplitBlockTypes +
                                " experts (requantize with `alloy quantize ... Q8_0`, or run it with --backend cpu)");
            }
            ws_bytes = std::max(ws_bytes, cuda::moe_ffn_workspace_bytes(*n.moe, bucket));  // shapes and types only
        }
        if (n.op == Op::MatmulSwiglu)
            throw Error("cuda backend: '" + n.label + "': fused op the cuda backend does not run");
    }
    plan->workspace = std::make_unique<DeviceBuffer>(std::max<size_t>(ws_bytes, 256), "the workspace");
    void* ws = plan->workspace->get();

    // Matmul inputs written by their producers (norms, SwiGLU, the attention gate; the GDN op's
    // y in bf16 only) in the form the matmul reads (cuda::MatmulInput; rows compact, as the node's):
    //  - block-quantized weights (Q8_0, the K-quants), steps of <= kQ8GemvMaxT rows (decode is
    //    launch-bound): x quantized, so the GEMV skips its quantize launch (same bytes).
    //    ALLOY_CUDA_FUSE_Q8=0 turns it off.
    //  - BF16 / block-quantized weights, longer steps (prefill): x in bf16, so the GEMM skips its to_bf16
    //    launch and fp32 read (same bytes); where every reader is such a matmul the producer
    //    writes the bf16 copy alone. ALLOY_CUDA_FUSE_BF16=0 turns it off. These copies live from
    //    their producer to their last reader, so they share a few buffers (greedy by interval).
    // Both read at compile, for A/B.
    std::vector<cuda::MatmulInput> packed_of(g.tensors.size());
    std::vector<Rows> packed_rows(g.tensors.size());  // its producer's rows (a reader over others ignores it)
    {
        const std::vector<std::vector<int>> readers = g.readers();
        const bool fuse_q8 = !env_is("ALLOY_CUDA_FUSE_Q8", "0"), fuse_bf16 = !env_is("ALLOY_CUDA_FUSE_BF16", "0");
        struct Want {
            size_t t, offset;
            int64_t rows;
        };
        std::vector<Want> want_q8;
        struct WantBf16 {
            size_t t;
            int first, last;  // producer's and last reader's node index
            size_t bytes;
            int buf = -1;
        };
        std::vector<WantBf16> want_bf16;
        size_t q8_bytes = 0;
        for (size_t ni = 0; ni < g.nodes.size(); ++ni) {
            const Node& n = g.nodes[ni];
            int t = -1;
            if (n.op == Op::AddRmsNorm) t = n.out[1];
            if (n.op == Op::RmsNorm || n.op == Op::Swiglu || n.op == Op::SigmoidGateMul || n.op == Op::GdnFused) t = n.out[0];
            if (t < 0 || g.tensors[size_t(t)].cols % 32 || g.tensors[size_t(t)].logits) continue;
            // Quantized: beside the fp32 output, for any Q8_0 matmul reader over the same rows.
            // bf16: instead of it, only when every reader is a BF16 / Q8_0 matmul over them.
            bool any_q8 = false, all_bf16_input = !readers[size_t(t)].empty();
            int last = int(ni);
            for (int ri : readers[size_t(t)]) {
                const Node& m = g.nodes[size_t(ri)];
                const bool mm = (m.op == Op::Matmul || m.op == Op::MatmulMulti) && m.in[0] == t && m.rows == n.rows;
                auto all_of_types = [&](auto ok) { return std::all_of(m.weights.begin(), m.weights.end(), [&](const WeightView* w) { return ok(w->type); }); };
                // (the block types' GEMVs all take x quantized as Q8_0's does, their GEMMs x in bf16)
                any_q8 = any_q8 || (mm && all_of_types([](GgmlType ty) { return cuda::split_blocks_supported(ty); }));
                all_bf16_input = all_bf16_input && mm && all_of_types([](GgmlType ty) {
                                     return cuda::split_blocks_supported(ty) || ty == GgmlType::BF16;
                                 });
                last = std::max(last, ri);
            }
            const int64_t max_rows = n.rows == Rows::Last ? 1 : bucket;
            if (n.op == Op::GdnFused) any_q8 = false;  // it writes the bf16 form only
            if (any_q8 && fuse_q8) {
                const int64_t rows = std::min<int64_t>(max_rows, cuda::kQ8GemvMaxT);
                want_q8.push_back({size_t(t), q8_bytes, rows});
                q8_bytes += (cuda::q8_input_bytes(rows, g.tensors[size_t(t)].cols) + 255) / 256 * 256;
            }
            const bool dumped = graph::name_matches(opt.dump, g.tensors[size_t(t)].name);
            if (all_bf16_input && fuse_bf16 && max_rows > cuda::kQ8GemvMaxT && !dumped)
                want_bf16.push_back({size_t(t), int(ni), last, (size_t(max_rows * g.tensors[size_t(t)].cols) * 2 + 255) / 256 * 256});
            if ((any_q8 && fuse_q8) || (all_bf16_input && fuse_bf16)) packed_rows[size_t(t)] = n.rows;
        }
        // bf16 copies: each to the first buffer free before its producer runs (intervals in node order).
        std::vector<int> buf_last;
        std::vector<size_t> buf_bytes;
        for (WantBf16& w : want_bf16) {
            for (size_t i = 0; i < buf_last.size() && w.buf < 0; ++i)
                if (buf_last[i] < w.first) w.buf = int(i);
            if (w.buf < 0) {
                w.buf = int(buf_last.size());
                buf_last.push_back(0);
                buf_bytes.push_back(0);
            }
            buf_last[size_t(w.buf)] = w.last;
            buf_bytes[size_t(w.buf)] = std::max(buf_bytes[size_t(w.buf)], w.bytes);
        }
        std::vector<size_t> buf_offset(buf_bytes.size());
        size_t bytes = q8_bytes;
        for (size_t i = 0; i < buf_bytes.size(); ++i) buf_offset[i] = bytes, bytes += buf_bytes[i];
        if (bytes) {
            plan->packed_inputs = std::make_unique<DeviceBuffer>(bytes, "the producers' matmul inputs");
            char* base = plan->packed_inputs->get<char>();
            for (const Want& w : want_q8) {
                char* p = base + w.offset;
                packed_of[w.t].q = reinterpret_cast<int8_t*>(p);
                packed_of[w.t].d = reinterpret_cast<float*>(p + cuda::q8_input_scales_offset(w.rows, g.tensors[w.t].cols));
            }
            for (const WantBf16& w : want_bf16) {
                packed_of[w.t].b = reinterpret_cast<uint16_t*>(base + buf_offset[size_t(w.buf)]);
                // every reader is a matmul that takes b; the GDN op writes its fp32 y regardless
                packed_of[w.t].b_only = g.nodes[size_t(w.first)].op != Op::GdnFused;
            }
        }
    }
    // The MatmulInput a node over rows r writes or reads this step: the quantized form at
    // <= kQ8GemvMaxT rows, the bf16 one above.
    auto packed_out = [&](const Node& n, size_t i) { return packed_of[size_t(n.out[i])]; };
    auto packed_in = [&](const Node& n) {
        return packed_rows[size_t(n.in[0])] == n.rows ? packed_of[size_t(n.in[0])] : cuda::MatmulInput{};
    };
    auto packed_at = [](const cuda::MatmulInput& p, Rows r, const StepContext& c) {
        cuda::MatmulInput out;
        if (n_rows(r, c) <= cuda::kQ8GemvMaxT) {
            out.q = p.q, out.d = p.d;
        } else {
            out.b = p.b, out.b_only = p.b_only;
        }
        return out;
    };

    size_t gdn_log_floats = 0;
    for (const Node& n : g.nodes) {
        const Rows r = n.rows;
        switch (n.op) {
            case Op::Input: {  // the MTP head's given rows (StepContext::hidden, host memory): eager
                const TensorRef o = out(n, 0);
                plan->add_eager("input", n.label, [=](const StepContext& c) {
                    if (!c.hidden) throw Error("forward: the MTP head alone needs its hidden rows (ForwardOptions::mtp_hidden)");
                    check(cudaMemcpyAsync(o.base, c.hidden, size_t(c.n) * size_t(o.cols) * sizeof(float),
                                          cudaMemcpyHostToDevice, st),
                          "'" + n.label + "' rows");
                });
                break;
            }
            case Op::Embed: {
                const WeightView tab = device_weight(*n.weights[0], "token_embd");
                const TensorRef o = out(n, 0);
                const int32_t* ids = n.next_token ? plan->io(CudaPlan::kNextIds) : d_ids;
                plan->add("get_rows", n.label, [=](const StepContext& c) { cuda::get_rows(tab, ids, o.base, c.n, st); });
                break;
            }
            case Op::RmsNorm: {
                const TensorRef a = in(n, 0), o = out(n, 0);
                const float* w = device_floats(n.norm, a.cols, n.label);
                const float eps = n.eps;
                const cuda::MatmulInput q8 = packed_out(n, 0);
                if (r == Rows::Listed) {  // gather the batch's logits rows, then normalize them in place
                    WeightView rows_of_a{GgmlType::F32, a.cols, bucket, reinterpret_cast<const uint8_t*>(a.base),
                                         size_t(a.cols) * sizeof(float)};
                    plan->add("rms_norm", n.label, [=](const StepContext& c) {
                        cuda::get_rows(rows_of_a, d_out_rows, o.base, c.n_out, st);
                        cuda::rms_norm(o.base, w, o.base, c.n_out, a.cols, eps, st, packed_at(q8, r, c));
                    });
                } else {
                    plan->add("rms_norm", n.label, [=](const StepContext& c) {
                        cuda::rms_norm(a.at(c, r), w, o.at(c, r), n_rows(r, c), a.cols, eps, st, packed_at(q8, r, c));
                    });
                }
                break;
            }
            case Op::Add: {
                const TensorRef a = in(n, 0), b = in(n, 1);
                plan->add("add", n.label, [=](const StepContext& c) { cuda::add(a.at(c, r), b.at(c, r), n_rows(r, c) * a.cols, st); });
                break;
            }
            case Op::AddRmsNorm: {
                const TensorRef a = in(n, 0), b = in(n, 1), o = out(n, 1);
                const float* w = device_floats(n.norm, a.cols, n.label);
                const float eps = n.eps;
                const cuda::MatmulInput q8 = packed_out(n, 1);
                plan->add("add_rms_norm", n.label, [=](const StepContext& c) {
                    cuda::add_rms_norm(a.at(c, r), b.at(c, r), w, o.at(c, r), n_rows(r, c), a.cols, eps, st, packed_at(q8, r, c));
                });
                break;
            }
            case Op::Matmul: {
                const WeightView w = device_weight(*n.weights[0], n.label);
                const TensorRef x = in(n, 0), y = out(n, 0);
                const cuda::MatmulInput xq = packed_in(n);
                plan->add(std::string("matmul_") + type_traits(w.type).name, n.label, [=](const StepContext& c) {
                    const cuda::MatmulInput q = packed_at(xq, r, c);
                    cuda::matmul(w, x.at(c, r), y.at(c, r), n_rows(r, c), ws, st, &q);
                });
                break;
            }
            case Op::MatmulMulti: {
                // The parts' device views and their pointers made once (the step runs per token).
                struct Parts {
                    std::vector<WeightView> w;
                    std::vector<const WeightView*> wp;
                    std::vector<TensorRef> y;
                };
                auto parts = std::make_shared<Parts>();
                for (const WeightView* w : n.weights) parts->w.push_back(device_weight(*w, n.label));
                for (const WeightView& w : parts->w) parts->wp.push_back(&w);
                for (size_t i = 0; i < n.out.size(); ++i) parts->y.push_back(out(n, i));
                constexpr size_t kMaxParts = 8;
                if (parts->y.size() > kMaxParts || parts->y.size() != parts->w.size())
                    throw Error("cuda backend: '" + n.label + "': " + std::to_string(parts->w.size()) + " weights for " +
                                std::to_string(parts->y.size()) + " outputs (at most " + std::to_string(kMaxParts) + ")");
                const TensorRef x = in(n, 0);
                const cuda::MatmulInput xq = packed_in(n);
                plan->add(std::string("matmul_") + type_traits(parts->w[0].type).name, n.label, [=](const StepContext& c) {
                    float* y[kMaxParts];
                    for (size_t i = 0; i < parts->y.size(); ++i) y[i] = parts->y[i].at(c, r);
                    const cuda::MatmulInput q = packed_at(xq, r, c);
                    cuda::matmul_multi(parts->wp.data(), y, int(parts->wp.size()), x.at(c, r), n_rows(r, c), ws, st, &q);
                });
                break;
            }
            case Op::Swiglu: {
                const TensorRef a = in(n, 0), b = in(n, 1), o = out(n, 0);
                const cuda::MatmulInput q8 = packed_out(n, 0);
                plan->add("swiglu", n.label, [=](const StepContext& c) {
                    cuda::swiglu(a.at(c, r), b.at(c, r), o.at(c, r), n_rows(r, c) * o.cols, st, packed_at(q8, r, c));
                });
                break;
            }
            case Op::RmsNormRope: {
                const TensorRef x = in(n, 0), o = out(n, 0);
                const float* w = device_floats(n.norm, n.head_dim, n.label);
                const Node nd = n;
                plan->add("rms_norm_rope", n.label, [=](const StepContext& c) {
                    cuda::rms_norm_rope(x.at(c, r), nd.head_stride, w, o.at(c, r), d_pos + first_row(r, c), n_rows(r, c), nd.heads,
                                        nd.head_dim, nd.n_rot, nd.rope_base, nd.eps, st);
                });
                break;
            }
            case Op::KvStore: {
                const TensorRef k = in(n, 0), v = in(n, 1);
                const int l = n.layer;
                // Row t -> row pos[t] of its slot's caches, both read on the device: recordable.
                plan->add("kv_store", n.label, [=](const StepContext& c) {
                    CudaState& d = device_state(c);
                    const KvCacheTypes& t = c.state->kv_types;
                    cuda::kv_store_rows(k.base, c.n, k.cols, d.k_tab[size_t(l)]->get<void*>(), d_tok_slots, d_pos, t.k, st);
                    cuda::kv_store_rows(v.base, c.n, v.cols, d.v_tab[size_t(l)]->get<void*>(), d_tok_slots, d_pos, t.v, st);
                });
                break;
            }
            case Op::Attention: {
                const TensorRef q = in(n, 0), o = out(n, 0);
                const int l = n.layer;
                const ref::AttentionShape as = n.attn;
                const bool one_query = bucket == 1 || r == Rows::Last;
                // Decode and verification steps on 16-bit caches (the default f16) take each
                // token's depth and cache on the device (cuda::attention_decode): one launch for
                // every sequence of the step, recorded in the step's graph. Its workspace is the
                // plan's own, sized now: a graph keeps the pointer it was recorded with.
                void* dec_ws = nullptr;
                {
                    ref::AttentionShape s16 = as;
                    s16.type_k = s16.type_v = GgmlType::F16;
                    const int64_t T = r == Rows::Last ? 1 : std::min<int64_t>(bucket, cuda::kAttnDecodeMaxT);
                    if (cuda::attention_decode_supported(s16, T)) {
                        const size_t bytes = cuda::attention_decode_workspace_bytes(s16, T);
                        if (!plan->decode_attention_ws || plan->decode_attention_ws->bytes() < bytes)
                            plan->decode_attention_ws = std::make_unique<DeviceBuffer>(bytes, "the decode attention workspace");
                        dec_ws = plan->decode_attention_ws->get();
                    }
                }
                auto step = [=, this](const StepContext& c) {
                    CudaState& d = device_state(c);
                    ref::AttentionShape s = as;
                    s.type_k = c.state->kv_types.k;
                    s.type_v = c.state->kv_types.v;
                    const int64_t T = r == Rows::Last ? 1 : c.n;
                    if (dec_ws && cuda::attention_decode_supported(s, T)) {
                        const int64_t t0 = first_row(r, c);
                        cuda::attention_decode(s, q.at(c, r), d.k_tab[size_t(l)]->get<const void*>(),
                                               d.v_tab[size_t(l)]->get<const void*>(), d_tok_slots + t0, d_pos + t0,
                                               o.at(c, r), T, dec_ws, st);
                        return;
                    }
                    auto run = [&](int slot, const float* qq, float* oo, int64_t T, int64_t n_past) {
                        void* aws = attention_workspace(cuda::attention_workspace_bytes(s, T, n_past));
                        cuda::attention(s, qq, d.k[size_t(l)][size_t(slot)]->get(), d.v[size_t(l)][size_t(slot)]->get(), oo, T,
                                        n_past, aws, st);
                    };
                    if (r == Rows::Last) {  // the pruned last layer of a one-sequence pass: its last query
                        run(c.slots[0], q.at(c, r), o.at(c, r), 1, c.n_past[0] + first_row(r, c));
                        return;
                    }
                    for (int i = 0; i < c.n_seqs; ++i) {  // each sequence against its own cache
                        const StepSeq e = step_seq(c, i);
                        run(e.slot, q.base + e.first * q.cols, o.base + e.first * q.cols, e.n, e.n_past);
                    }
                };
                const char* kernel = one_query ? "attention_decode" : "attention_prefill";
                if (dec_ws) plan->add_eager_unless_16bit_kv(kernel, n.label, step);
                else plan->add_eager(kernel, n.label, step);
                break;
            }
            case Op::SigmoidGateMul: {
                const TensorRef x = in(n, 0), gate = in(n, 1);
                const int heads = n.heads, hd = n.head_dim;
                const int64_t stride = n.head_stride, off = n.in_offset;
                const cuda::MatmulInput q8 = packed_out(n, 0);
                plan->add("sigmoid_gate_mul", n.label, [=](const StepContext& c) {
                    cuda::sigmoid_gate_mul(x.at(c, r), gate.at(c, r) + off, n_rows(r, c) * heads, hd, stride, st, packed_at(q8, r, c));
                });
                break;
            }
            case Op::GdnFused: {
                const float *qkv = in(n, 0).base, *z = in(n, 1).base, *b = in(n, 2).base, *a = in(n, 3).base;
                float* y = out(n, 0).base;
                const int l = n.layer;
                const ref::GdnParams gp = n.gdn;
                const ref::GdnShape& sh = gp.shape;
                const int64_t conv_dim = 2 * int64_t(sh.H_k) * sh.d_k + int64_t(sh.H_v) * sh.d_v;
                // This op's part of the replay log: [bucket, conv_dim], [bucket, H_v] twice
                // (small plans only: verifications run in bucket 16).
                const size_t log_at = gdn_log_floats;
                if (bucket <= CudaPlan::kGraphMaxBucket) gdn_log_floats += size_t(bucket) * size_t(conv_dim + 2 * sh.H_v);
                const ref::GdnWeights gw{device_floats(n.gdn_w.conv1d, conv_dim * gp.conv_kernel, n.label + " conv1d"),
                                         device_floats(n.gdn_w.ssm_a, sh.H_v, n.label + " ssm_a"),
                                         device_floats(n.gdn_w.dt_bias, sh.H_v, n.label + " ssm_dt"),
                                         device_floats(n.gdn_w.norm, sh.d_v, n.label + " ssm_norm")};
                const char* kernel = gp.mode == ref::GdnMode::Serial ? "gdn_fused_serial" : "gdn_fused_chunked";
                const cuda::MatmulInput packed = packed_out(n, 0);
                if (bucket <= CudaPlan::kGraphMaxBucket) {
                    GdnReplayLog::Layer L;
                    L.layer = l, L.params = gp, L.weights = gw;
                    L.conv_dim = int(conv_dim), L.value_dim = sh.H_v * sh.d_v, L.H_v = sh.H_v;
                    L.dev_qkv = reinterpret_cast<const float*>(log_at);  // offsets until log_ exists (below)
                    plan->gdn_layers.push_back(L);
                }
                CudaPlan* pl = plan.get();
                const size_t n_log = plan->gdn_layers.size();
                // A step runs each layer's GDN op once, on states an earlier step wrote (the host
                // synchronizes between steps; slot copies and the replay log are copies, which
                // serialize the stream): the op may load them before the previous kernel ends
                // (cuda::gdn_fused's state_settled). ALLOY_CUDA_GDN_SETTLED=0: after it (A/B).
                const bool settled = !env_is("ALLOY_CUDA_GDN_SETTLED", "0");
                plan->add(kernel, n.label, [=](const StepContext& c) {
                    if (CudaPlan::logs_gdn(c) && n_log > 0) {  // the inputs' rows, for a rollback's replay
                        const GdnReplayLog::Layer& L = pl->gdn_layers[n_log - 1];
                        const size_t rows = size_t(c.n);
                        check(cudaMemcpyAsync(const_cast<float*>(L.dev_qkv), qkv, rows * size_t(conv_dim) * sizeof(float),
                                              cudaMemcpyDeviceToDevice, st),
                              "GDN replay log");
                        check(cudaMemcpyAsync(const_cast<float*>(L.dev_a), a, rows * size_t(sh.H_v) * sizeof(float),
                                              cudaMemcpyDeviceToDevice, st),
                              "GDN replay log");
                        check(cudaMemcpyAsync(const_cast<float*>(L.dev_b), b, rows * size_t(sh.H_v) * sizeof(float),
                                              cudaMemcpyDeviceToDevice, st),
                              "GDN replay log");
                    }
                    uint16_t* y_bf16 = packed_at(packed, r, c).b;
                    CudaState& d = device_state(c);
                    float* conv = d.conv[size_t(l)]->get<float>();
                    float* ssm = d.ssm[size_t(l)]->get<float>();
                    for_each_gdn_run(c, [&](int s0, int s1, bool serial) {  // on their slots
                        ref::GdnParams run = gp;
                        if (serial) run.mode = ref::GdnMode::Serial;
                        cuda::gdn_fused(run, gw, s1 - s0, d_offsets + s0, c.n, qkv, z, a, b, conv, ssm, y, ws, st,
                                        cuda::GdnFusedPath::Auto, d_slots + s0, y_bf16, settled);
                    });
                });
                break;
            }
            case Op::MoeFfn: {
                auto w = std::make_shared<ref::MoeWeights>(device_moe(*n.moe, n.label));
                cuda::moe_ffn(*w, nullptr, nullptr, 0, nullptr, st);  // a call of no tokens checks the weights now
                const TensorRef x = in(n, 0), y = out(n, 0);
                plan->add("moe_ffn", n.label, [=](const StepContext& c) {
                    cuda::moe_ffn(*w, x.at(c, r), y.at(c, r), n_rows(r, c), ws, st);
                });
                break;
            }
            case Op::AllReduce: {  // NCCL's sum, queued on the stream (recorded into the graphs)
                if (!collective_)
                    throw Error("cuda backend: node '" + n.label + "' sums over tensor-parallel ranks, but this backend has no collective");
                Collective* coll = collective_.get();
                const TensorRef x = in(n, 0);
                plan->add("all_reduce", n.label, [=](const StepContext& c) {
                    coll->all_reduce_sum(x.at(c, r), size_t(n_rows(r, c) * x.cols), st);
                });
                break;
            }
            case Op::MatmulSwiglu:
                break;  // refused above
        }
        for (int t : n.out) {
            const graph::Tensor& x = g.tensors[size_t(t)];
            if (!graph::name_matches(opt.dump, x.name)) continue;
            const TensorRef ref = refs[size_t(t)];
            const std::string name = x.name;
            if (bucket <= CudaPlan::kGraphMaxBucket) {
                // A small step's rows are copied device to device inside the recorded graph (no
                // split of the step's graph, no synchronization of its own: --spec mtp dumps the
                // last layer's rows every decode step), then to page-locked memory with the step's
                // outputs (a device-to-host copy inside the graph held its next kernels up: the
                // H200 ran --spec mtp 3-5% below plain decode with drafting off), and reach the
                // sink after the step.
                auto host = std::make_shared<CudaBuffer>(size_t(bucket) * size_t(ref.cols) * sizeof(float), "dump of " + name,
                                                         CudaBuffer::kPinnedHost);
                auto staged = std::make_shared<DeviceBuffer>(size_t(bucket) * size_t(ref.cols) * sizeof(float), "dump of " + name);
                plan->add("dump", name, [=](const StepContext& c) {
                    check(cudaMemcpyAsync(staged->get(), ref.at(c, r), size_t(n_rows(r, c) * ref.cols) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, st),
                          "dump");
                });
                plan->before_sync([=](const StepContext& c) {
                    if (c.dump)
                        check(cudaMemcpyAsync(host->get(), staged->get(), size_t(n_rows(r, c) * ref.cols) * sizeof(float),
                                              cudaMemcpyDeviceToHost, st),
                              "dump");
                });
                plan->after_step([=](const StepContext& c) {
                    if (c.dump)
                        (*c.dump)(name, first_row(r, c) + (c.n_seqs == 1 ? c.n_past[0] : 0), host->get<float>(), n_rows(r, c),
                                  ref.cols);
                });
                continue;
            }
            plan->add_eager("dump", name, [=](const StepContext& c) {
                if (!c.dump) return;
                std::vector<float> host(size_t(n_rows(r, c) * ref.cols));
                check(cudaMemcpyAsync(host.data(), ref.at(c, r), host.size() * sizeof(float), cudaMemcpyDeviceToHost, st), "dump");
                check(cudaStreamSynchronize(st), "dump");
                (*c.dump)(name, first_row(r, c) + (c.n_seqs == 1 ? c.n_past[0] : 0), host.data(), n_rows(r, c), ref.cols);
            });
        }
    }
    if (gdn_log_floats) {  // the log's rows: offsets into one buffer become pointers
        plan->log_ = std::make_unique<DeviceBuffer>(gdn_log_floats * sizeof(float), "the GDN replay log");
        float* base = plan->log_->get<float>();
        for (GdnReplayLog::Layer& L : plan->gdn_layers) {
            float* q = base + reinterpret_cast<size_t>(L.dev_qkv);
            L.dev_qkv = q;
            L.dev_a = q + size_t(bucket) * size_t(L.conv_dim);
            L.dev_b = L.dev_a + size_t(bucket) * size_t(L.H_v);
        }
    }
    return plan;
}

bool CudaBackend::replay_gdn(ModelState& st, const GdnReplayLog& log, int seq, int kept) {
    if (!log.valid || seq < 0 || size_t(seq) + 1 >= log.offsets.size() || kept < 0 ||
        kept > log.offsets[size_t(seq) + 1] - log.offsets[size_t(seq)])
        throw Error("cuda backend: replay_gdn: sequence " + std::to_string(seq) + " / " + std::to_string(kept) +
                    " tokens not in the log's step");
    if (log.layers.empty() || !log.layers[0].dev_qkv) return false;  // not this backend's log
    if (kept == 0) return true;
    auto* dp = dynamic_cast<CudaState*>(st.device.get());
    if (!dp) throw Error("cuda backend: replay_gdn: the state was not made by the cuda backend");
    CudaState& d = *dp;
    // The kept rows [row0, row0 + kept) of the logged step, on the slot, one serial call per layer
    // (the serial kernels give a token the same bits whatever the call's split: decode's).
    const int32_t row0 = log.offsets[size_t(seq)];
    const int32_t host[4] = {row0, row0 + kept, log.slots[size_t(seq)], 0};
    size_t zy = 0, ws = 0;
    for (const GdnReplayLog::Layer& L : log.layers) {
        ref::GdnParams p = L.params;
        p.mode = ref::GdnMode::Serial;
        zy = std::max(zy, size_t(row0 + kept) * size_t(L.value_dim));
        ws = std::max(ws, cuda::gdn_fused_workspace_bytes(p, 1, row0 + kept));
    }
    const size_t need = 256 + 2 * ((zy * sizeof(float) + 255) / 256 * 256) + ws;
    if (!replay_ws_ || replay_ws_->bytes() < need) {
        check(cudaStreamSynchronize(stream_), "GDN replay workspace");
        replay_ws_ = std::make_unique<DeviceBuffer>(need, "the GDN replay workspace");
        check(cudaMemsetAsync(replay_ws_->get(), 0, need, stream_), "GDN replay workspace");  // z: zeros (the states do not read it)
    }
    char* base = replay_ws_->get<char>();
    auto* ints = reinterpret_cast<int32_t*>(base);
    float* z = reinterpret_cast<float*>(base + 256);
    float* y = z + (zy * sizeof(float) + 255) / 256 * 256 / sizeof(float);
    void* work = reinterpret_cast<char*>(y) + (zy * sizeof(float) + 255) / 256 * 256;
    check(cudaMemcpyAsync(ints, host, sizeof(host), cudaMemcpyHostToDevice, stream_), "GDN replay");
    for (const GdnReplayLog::Layer& L : log.layers) {
        ref::GdnParams p = L.params;
        p.mode = ref::GdnMode::Serial;
        cuda::gdn_fused(p, L.weights, 1, ints, row0 + kept, L.dev_qkv, z, L.dev_a, L.dev_b, d.conv[size_t(L.layer)]->get<float>(),
                        d.ssm[size_t(L.layer)]->get<float>(), y, work, stream_, cuda::GdnFusedPath::Auto, ints + 2, nullptr);
    }
    check(cudaStreamSynchronize(stream_), "GDN replay");
    return true;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

std::unique_ptr<Backend> make_cuda_backend(int device, std::shared_ptr<Collective> collective) {
    return std::make_unique<CudaBackend>(device, std::move(collective));
}

}  // namespace alloy
