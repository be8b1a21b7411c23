// What runs a model's graph: the CPU now (runtime/cpu_backend.h), CUDA next. The model builds a
// backend-neutral graph per step kind (model/graph.h); the runner (runtime/model_runner.h)
// asks the backend to rewrite it (its fusions), to compile it for a token bucket into a plan
// (closures over preallocated buffers on the CPU; a captured CUDA graph on the GPU), and
// replays that plan with each step's tokens. Weights: a backend reads them where the model
// bound them (host memory) and uploads what it needs on first compile, keyed by the
// WeightView; state: it allocates the slot state memory its plans read and write.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/graph.h"
#include "runtime/model_state.h"
#include "runtime/plan.h"

namespace alloy {

struct CompileOptions {
    // Tensors whose rows each replay hands to StepContext::dump after the node that writes them
    // (alloy logits --dump NAME): names, or prefixes ending in '*'.
    std::vector<std::string> dump;
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    // The rewrites this backend's kernels want (runtime/graph_passes.h), after prune_rows.
    virtual void optimize(graph::Graph& g) const = 0;
    // A plan for steps of up to `bucket` tokens of `g` (already optimized). Scratch buffers
    // come from the backend and may be shared by its plans: only one plan runs at a time.
    virtual std::unique_ptr<Plan> compile(const graph::Graph& g, int bucket, const CompileOptions& opt) = 0;
    // The state of n_slots sequences of up to n_ctx tokens each, in this backend's memory.
    virtual ModelState new_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) = 0;
    // The MTP block's KV cache (layer n_layer, spec/MODEL.md section 8) added to a state of this
    // backend, and a state of that cache alone (the host versions: runtime/model_state.h).
    virtual void add_mtp_cache(ModelState& s, const Qwen35HParams& hp) { alloy::add_mtp_cache(s, hp); }
    virtual ModelState new_mtp_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) {
        return alloy::new_mtp_state(hp, n_ctx, kv_types, n_slots);
    }
    // Frees the scratch the plans compiled so far share (call after dropping them).
    virtual void drop_scratch() = 0;
    // Whether its plans compute StepContext::argmax themselves (a GPU: then a greedy token costs
    // one 4-byte copy instead of its logits row); else the runner picks it from the logits.
    virtual bool greedy_on_device() const { return false; }
    // The largest StepContext::top_k its plans compute themselves (a GPU: a sampled token then
    // costs a copy of k pairs instead of its logits row); 0: none (the runner picks them).
    virtual int max_top_k_on_device() const { return 0; }
    // Host memory for a step's logits rows [n_floats] that this backend's copies reach fastest
    // (page-locked for a GPU: its copy then runs at the link's speed, while a pageable 1 MB row
    // costs ~0.1 ms a token in the driver's staging copy), or nullptr where any memory does.
    // Valid until the next call that asks for more, or the backend's end.
    virtual float* host_output(size_t n_floats) { (void)n_floats; return nullptr; }
    // Speculative rollback without a re-run: the plans log their GDN ops' inputs where
    // StepContext::gdn_log asks, and this runs every logged GDN op again on the first `kept`
    // tokens of the step's sequence `seq` (serial kernel) on its slot's states in `st` (restored
    // to before the step by the caller). False where the backend cannot (nothing changed:
    // the caller re-runs the tokens).
    virtual bool replay_gdn(ModelState& st, const GdnReplayLog& log, int seq, int kept) {
        (void)st, (void)log, (void)seq, (void)kept;
        return false;
    }
};

// The backend a name selects: "cpu", or "cuda" in a build with nvcc (runtime/cuda/); throws
// naming the name otherwise, or when no CUDA device is usable.
std::unique_ptr<Backend> make_backend(const std::string& name);

}  // namespace alloy
