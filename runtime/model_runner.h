// Runs a model's forward pass on a backend: builds the model's graph for a step kind (logits
// mode, GDN mode), prunes its rows, lets the backend rewrite and compile it per token bucket,
// caches the plans, and replays them with each step's tokens, slots and positions.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "model/qwen35.h"
#include "runtime/backend.h"
#include "runtime/batch.h"
#include "runtime/model_state.h"
#include "runtime/plan.h"

namespace alloy {

// Where a step's top-k pairs go: values, ids [rows, k] in ref::top_k's order.
struct TopKRows {
    int k = 0;
    float* values = nullptr;
    int32_t* ids = nullptr;
};

class ModelRunner {
public:
    // backend: nullptr = the CPU backend. The model must outlive the runner.
    explicit ModelRunner(const Qwen35Model& model, std::unique_ptr<Backend> backend = nullptr);
    ModelRunner(const Qwen35Model& model, std::shared_ptr<Backend> backend);

    const Qwen35Model& model() const { return model_; }
    const Qwen35HParams& hparams() const { return model_.hparams(); }
    // Fresh states of n_slots sequences of up to n_ctx tokens each, in the backend's memory;
    // throws for n_ctx <= 0, n_slots <= 0 or a cache type other than F32/F16/BF16.
    ModelState new_state(int n_ctx, KvCacheTypes kv_types = {}, int n_slots = 1) const;
    // The MTP block's KV cache (layer n_layer) added to a state of this runner's backend, for the
    // graphs of GraphSpec::mtp; throws for a model without the block.
    void add_mtp_cache(ModelState& state) const;
    // A state of the MTP block's cache alone, in the backend's memory (the trunk's layers
    // empty), for ForwardOptions::mtp_hidden: a drafter keeps it beside the trunk's state.
    ModelState new_mtp_state(int n_ctx, KvCacheTypes kv_types = {}, int n_slots = 1) const;
    // A runner on the same model and backend with a plan cache of its own: a drafter's plans
    // then never push the trunk's out, while weights (uploaded once on a GPU), the stream and
    // the scratch arena stay shared (one plan runs at a time).
    std::unique_ptr<ModelRunner> with_own_plans() const;
    // Runs n tokens of one sequence (slot) at positions n_past[slot].. and advances it, by
    // replaying the recorded plan of the bucket n falls in (built on first use).
    // logits: [n, n_vocab] if opts.all_logits else [n_vocab] (the last token's).
    // prof: if given, every kernel launch is timed into it.
    void forward(ModelState& state, const int32_t* ids, int n, const ForwardOptions& opts, float* logits,
                 Profiler* prof = nullptr, int slot = 0) const;
    // One step over a batch of sequences (distinct slots): the matmuls see every token of the
    // batch as one [T, D] input, the GDN op its sequences ragged on their slots, attention each
    // sequence against its own cache. logits: [batch.logit_rows(), n_vocab]. opts.all_logits is
    // ignored (each sequence says what it returns). A batch of one sequence runs exactly as
    // the call above (pieces of opts.max_batch); a batch of several runs as one piece (the
    // caller bounds its size). Throws naming the sequence for a bad slot, an empty sequence or
    // one that would overflow its slot's context.
    // argmax: if given, [batch.logit_rows()] each returned row's greedy token (greedy_token);
    // logits may then be nullptr: a backend that picks it on the device (greedy_on_device)
    // never copies the rows back, and the others use a buffer of the runner's.
    // top: if given (top->k >= 1), each returned row's top->k most likely pairs (ref::top_k),
    // the same way: a backend with max_top_k_on_device() >= k copies back only those.
    void forward(ModelState& state, const Batch& batch, const ForwardOptions& opts, float* logits,
                 Profiler* prof = nullptr, int32_t* argmax = nullptr, const TopKRows* top = nullptr) const;
    // Where the caller best puts the logits rows it asks for (Backend::host_output), or nullptr
    // where any memory does.
    float* host_output(size_t n_floats) const { return backend_->host_output(n_floats); }
    // The largest top-k the backend picks where the logits are (Backend::max_top_k_on_device).
    int max_top_k_on_device() const { return backend_->max_top_k_on_device(); }
    // The bucket a call of n tokens runs in: 1 for decode; kSmallStepBucket for a serial step of
    // 2..16 tokens (a batch's decode, a verification: a GPU records plans of up to 16 tokens as
    // CUDA graphs); else n rounded up to the GDN chunk.
    static constexpr int kSmallStepBucket = 16;
    static int bucket_for(int n, const ForwardOptions& opts);
    // The graph a step of this kind runs, after prune_rows and the backend's rewrites.
    graph::Graph step_graph(const graph::GraphSpec& spec) const;
    // Frees every recorded plan and its scratch (the next call of each bucket records anew).
    void drop_plans() const;
    // Backend::replay_gdn: the logged step's GDN ops again on the first `kept` tokens of its
    // sequence `seq`; false where the backend cannot.
    bool replay_gdn(ModelState& st, const GdnReplayLog& log, int seq, int kept) const {
        return backend_->replay_gdn(st, log, seq, kept);
    }

private:
    const Qwen35Model& model_;
    std::shared_ptr<Backend> backend_;  // shared with the runners of with_own_plans()
    // Plans by (bucket, logits rows, gdn mode, chunk, MTP head, dumped names); built lazily, reused.
    mutable std::map<std::tuple<int, int, int, int, int, std::string>, std::unique_ptr<Plan>> plans_;
    mutable std::vector<float> host_logits_;  // argmax / top-k without logits on a host backend
    mutable std::vector<uint64_t> host_top_keys_;  // ref::top_k's scratch there (kept: 2 MB a row)
    void run_plan(StepContext& ctx, int bucket, const ForwardOptions& opts, graph::Rows logits, Profiler* prof) const;
};

}  // namespace alloy
