// A recorded plan: the list of kernel launches of one forward pass for a fixed token bucket,
// with every intermediate buffer allocated once when the plan is built. Replaying it runs the
// steps in order with the real token count as an argument, so kernels only touch the tokens
// actually filled (the sequence axis shrinks; nothing is recomputed for the padding).
//
// Each step carries the kernel's name (the same name as in kernels/ref, kernels/cpu) and a
// label (layer and role), so `alloy profile` can time every launch and group them by kernel.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace alloy {
struct GdnReplayLog;  // runtime/gdn_replay.h

struct ModelState;

// Receives a dumped tensor after the node that wrote it: its name, the position of its first row
// (in the sequence for a one-sequence step, else the step's row index), rows [n_rows, cols]
// (alloy logits --dump).
using TensorSink = std::function<void(const std::string& name, int64_t first_token, const float* rows, int64_t n_rows,
                                      int64_t cols)>;

// What changes between replays of the same plan: the tokens of one or more sequences.
struct StepContext {
    ModelState* state = nullptr;
    const int32_t* ids = nullptr;  // [n] token ids
    int n = 0;            // real tokens in this call (<= the plan's bucket)
    int n_seqs = 1;
    const int32_t* offsets = nullptr;  // [n_seqs + 1] each sequence's first token, then n
    const int32_t* slots = nullptr;    // [n_seqs] state slot of each sequence
    const int32_t* n_past = nullptr;   // [n_seqs] tokens each sequence's slot held before the call
    const uint8_t* serial = nullptr;   // [n_seqs] 1: the GDN layers take the serial kernel
    const int32_t* out_rows = nullptr; // [n_out] rows whose logits a rows plan returns, ascending
    int n_out = 0;
    float* logits = nullptr;  // [rows, n_vocab] the returned rows; nullptr: not wanted (argmax is)
    // [rows] each returned row's greedy token (sampler.h greedy_token), set only for a backend
    // whose plans pick it where the logits are (Backend::greedy_on_device); else nullptr.
    int32_t* argmax = nullptr;
    // [rows, top_k] each returned row's top_k most likely (value, id) pairs in ref::top_k's
    // order, set only for a backend whose plans pick them where the logits are
    // (Backend::max_top_k_on_device() >= top_k); else top_k is 0.
    int top_k = 0;
    float* top_values = nullptr;
    int32_t* top_ids = nullptr;
    const TensorSink* dump = nullptr;  // where the plan's dumped tensors go (nullptr: nowhere)
    // Where a backend that can replay its GDN ops (Backend::replay_gdn) logs their inputs for a
    // speculative rollback (runtime/gdn_replay.h); nullptr: not wanted.
    GdnReplayLog* gdn_log = nullptr;
    const float* hidden = nullptr;  // [n, cols] the rows of an Op::Input (the MTP head alone)
};

struct PlanStep {
    std::string kernel;   // e.g. "matmul_q8_0", "gdn_chunked", "attention_prefill"
    std::string label;    // e.g. "blk.3.attn_q"
    std::function<void(const StepContext&)> run;
};

// Per-kernel timing of replays, and an optional Chrome trace of every step.
class Profiler {
public:
    struct Row {
        std::string kernel;
        int64_t calls = 0;
        double total_ms = 0;
    };
    void record(const PlanStep& step, std::chrono::steady_clock::time_point t0,
                std::chrono::steady_clock::time_point t1);
    std::vector<Row> rows() const;  // sorted by total time, descending
    double total_ms() const;
    void clear();
    // Chrome trace format ("traceEvents", complete events); pid = phase, tid = 1.
    void set_phase(int pid, std::string name);
    std::string chrome_trace_json() const;

private:
    std::map<std::string, Row> rows_;
    struct Event { std::string name, label; int pid; double ts_us, dur_us; };
    std::vector<Event> events_;
    std::vector<std::pair<int, std::string>> phases_;
    int pid_ = 1;
    std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();
};

// Scratch shared by the plans of one model. Only one plan runs at a time and no plan keeps
// data in its buffers between replays, so the k-th buffer of every plan can be the same
// memory: a model that holds plans for several buckets and logits modes (a long prompt uses
// two: its inner pieces and its last one) pays for one set of buffers, not one per plan.
// A slot grows when a later plan asks for more; plans built earlier keep their smaller
// block alive (shared ownership), so nothing they point to is ever freed under them.
// Blocks are left uninitialised, so pages a bucket never touches stay unbacked.
class PlanArena {
public:
    float* slot(size_t k, size_t n, std::vector<std::shared_ptr<float[]>>& keep);
    // Tests: fill every scratch block allocated from now on with NaN, so that a kernel that
    // reads rows past the tokens of its call (instead of masking them) poisons the result.
    static void set_poison(bool on);

private:
    std::vector<std::shared_ptr<float[]>> blocks_;
    std::vector<size_t> sizes_;
};

// The CPU backend's plans are this class as it is; a device backend's plan derives from it and
// replays its own way (launches on a stream), keeping the steps for their names.
class Plan {
public:
    explicit Plan(int bucket, std::shared_ptr<PlanArena> arena = nullptr) : bucket_(bucket), arena_(std::move(arena)) {}
    virtual ~Plan() = default;
    int bucket() const { return bucket_; }
    void add(std::string kernel, std::string label, std::function<void(const StepContext&)> run) {
        steps_.push_back({std::move(kernel), std::move(label), std::move(run)});
    }
    // Scratch: a float buffer of n elements (uninitialised) that lives as long as the plan;
    // from the shared arena when the plan has one.
    float* buffer(size_t n);
    virtual void replay(const StepContext& ctx, Profiler* prof = nullptr) const;
    const std::vector<PlanStep>& steps() const { return steps_; }

private:
    int bucket_;
    std::vector<PlanStep> steps_;
    std::shared_ptr<PlanArena> arena_;
    std::vector<std::shared_ptr<float[]>> buffers_;
};

}  // namespace alloy
