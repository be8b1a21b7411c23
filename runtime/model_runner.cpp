#include "runtime/model_runner.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "alloy/error.h"
#include "runtime/gdn_replay.h"
#include "runtime/cpu_backend.h"
#include "runtime/graph_passes.h"
#include "kernels/ref/top_k.h"
#include "runtime/sampler.h"

namespace alloy {

ModelRunner::ModelRunner(const Qwen35Model& model, std::unique_ptr<Backend> backend)
    : model_(model), backend_(backend ? std::move(backend) : std::make_unique<CpuBackend>()) {}

ModelRunner::ModelRunner(const Qwen35Model& model, std::shared_ptr<Backend> backend)
    : model_(model), backend_(std::move(backend)) {
    if (!backend_) throw Error("ModelRunner: no backend");
}

ModelState ModelRunner::new_state(int n_ctx, KvCacheTypes kv_types, int n_slots) const {
    return backend_->new_state(hparams(), n_ctx, kv_types, n_slots);
}

void ModelRunner::add_mtp_cache(ModelState& state) const { backend_->add_mtp_cache(state, hparams()); }

ModelState ModelRunner::new_mtp_state(int n_ctx, KvCacheTypes kv_types, int n_slots) const {
    return backend_->new_mtp_state(hparams(), n_ctx, kv_types, n_slots);
}

std::unique_ptr<ModelRunner> ModelRunner::with_own_plans() const {
    return std::make_unique<ModelRunner>(model_, backend_);
}

int ModelRunner::bucket_for(int n, const ForwardOptions& opts) {
    if (n == 1) return 1;  // decode has its own plan
    // ALLOY_SMALL_STEP_BUCKET=0: those steps round up to the chunk as prompts do (A/B).
    static const bool small = [] {
        const char* e = std::getenv("ALLOY_SMALL_STEP_BUCKET");
        return !(e && e[0] == '0');
    }();
    if (small && n <= kSmallStepBucket && opts.gdn_mode == ref::GdnMode::Serial) return kSmallStepBucket;
    const int c = std::max(1, opts.gdn_chunk);
    return (n + c - 1) / c * c;
}

graph::Graph ModelRunner::step_graph(const graph::GraphSpec& spec) const {
    graph::Graph g = model_.build_graph(spec);
    graph::prune_rows(g);
    backend_->optimize(g);
    return g;
}

void ModelRunner::drop_plans() const {
    plans_.clear();
    backend_->drop_scratch();
}

void ModelRunner::forward(ModelState& st, const int32_t* ids, int n, const ForwardOptions& opts, float* logits,
                          Profiler* prof, int slot) const {
    if (n <= 0) throw Error("forward: no tokens to process");
    Batch b;
    b.add(slot, ids, n, opts.all_logits ? BatchLogits::All : BatchLogits::Last, opts.gdn_mode == ref::GdnMode::Serial);
    forward(st, b, opts, logits, prof);
}

void ModelRunner::forward(ModelState& st, const Batch& batch, const ForwardOptions& opts, float* logits,
                          Profiler* prof, int32_t* argmax, const TopKRows* top) const {
    const size_t V = size_t(hparams().n_vocab);
    if (top && top->k <= 0) top = nullptr;
    if (top && (top->k > int(V) || !top->values || !top->ids))
        throw Error("forward: top-k of " + std::to_string(top->k) + " from a vocabulary of " + std::to_string(V));
    const bool host_argmax = argmax && !backend_->greedy_on_device();
    const bool host_top = top && top->k > backend_->max_top_k_on_device();
    if (host_argmax || host_top) {  // pick them here, from logits rows
        const size_t rows = size_t(batch.logit_rows());
        if (!logits) {
            host_logits_.resize(rows * V);
            logits = host_logits_.data();
        }
        forward(st, batch, opts, logits, prof, host_argmax ? nullptr : argmax, host_top ? nullptr : top);
        if (host_argmax)
            for (size_t r = 0; r < rows; ++r) argmax[r] = greedy_token(logits + r * V, int(V));
        if (host_top) ref::top_k(logits, int64_t(rows), int64_t(V), top->k, top->values, top->ids, &host_top_keys_);
        return;
    }
    const int n_seqs = int(batch.seqs.size());
    if (n_seqs == 0) throw Error("forward: the batch has no sequences");
    if ((opts.mtp || opts.mtp_hidden) && st.k_cache.size() <= size_t(hparams().n_layer))
        throw Error("forward: the MTP head needs the state's MTP cache (add_mtp_cache, new_mtp_state)");
    int64_t total = 0;
    std::vector<uint8_t> used(size_t(st.n_slots), 0);
    for (int i = 0; i < n_seqs; ++i) {
        const BatchSeq& q = batch.seqs[size_t(i)];
        const std::string who = "forward: batch sequence " + std::to_string(i) + " (slot " + std::to_string(q.slot) + ")";
        if (q.slot < 0 || q.slot >= st.n_slots)
            throw Error(who + ": slot out of range (0.." + std::to_string(st.n_slots - 1) + ")");
        if (used[size_t(q.slot)]++) throw Error(who + ": the slot appears twice in one batch");
        if (q.n_tokens <= 0) throw Error(who + ": no tokens to process");
        if (int64_t(st.n_past[size_t(q.slot)]) + q.n_tokens > st.n_ctx)
            throw Error(who + ": sequence of " + std::to_string(int64_t(st.n_past[size_t(q.slot)]) + q.n_tokens) +
                        " tokens exceeds the context size of " + std::to_string(st.n_ctx) + " (raise --ctx)");
        total += q.n_tokens;
    }
    if (total != int64_t(batch.ids.size()))
        throw Error("forward: the batch has " + std::to_string(batch.ids.size()) + " token ids but its sequences count " +
                    std::to_string(total));
    StepContext ctx;
    ctx.state = &st;
    if (!opts.dump.empty()) ctx.dump = &opts.dump_sink;
    // A verification's GDN replay log (runtime/gdn_replay.h): the step as it runs, filled by
    // the backend's GDN ops; a step of several pieces is not one the log can replay.
    GdnReplayLog* log = opts.gdn_log;
    if (log) {
        log->clear();
        log->ids = batch.ids;
        log->offsets.assign(1, 0);
        for (const BatchSeq& q : batch.seqs) {
            log->slots.push_back(q.slot);
            log->n_past.push_back(st.n_past[size_t(q.slot)]);
            log->offsets.push_back(log->offsets.back() + q.n_tokens);
        }
        log->valid = std::all_of(batch.seqs.begin(), batch.seqs.end(), [](const BatchSeq& q) { return q.serial != 0; });
        ctx.gdn_log = log;
    }
    if (n_seqs == 1) {
        // One sequence: consecutive pieces of at most max_batch tokens (the states carry over).
        const BatchSeq& q = batch.seqs[0];
        const int c = std::max(1, opts.gdn_chunk);
        const int piece = std::max(c, opts.max_batch / c * c);
        const int32_t slot = q.slot;
        const uint8_t serial = q.serial;
        if (log && q.n_tokens > piece) log->valid = false;
        if ((opts.mtp || opts.mtp_hidden) && q.n_tokens > piece)  // a piece's last row would pair with its own token
            throw Error("forward: the MTP head takes one piece of at most " + std::to_string(piece) + " tokens, got " +
                        std::to_string(q.n_tokens));
        for (int done = 0; done < q.n_tokens;) {
            const int len = std::min(piece, q.n_tokens - done);
            const bool last = done + len == q.n_tokens;
            const graph::Rows rows = q.logits == BatchLogits::All                ? graph::Rows::All
                                     : q.logits == BatchLogits::Last && last ? graph::Rows::Last
                                                                             : graph::Rows::None;
            const int32_t offsets[2] = {0, len}, n_past = st.n_past[size_t(slot)];
            ctx.ids = batch.ids.data() + done;
            ctx.n = len;
            ctx.hidden = opts.mtp_hidden ? opts.mtp_hidden + size_t(done) * size_t(hparams().n_embd) : nullptr;
            ctx.n_seqs = 1;
            ctx.offsets = offsets;
            ctx.slots = &slot;
            ctx.n_past = &n_past;
            ctx.serial = &serial;
            ctx.logits = !logits ? nullptr : q.logits == BatchLogits::All ? logits + size_t(done) * V : logits;
            ctx.argmax = !argmax ? nullptr : q.logits == BatchLogits::All ? argmax + done : argmax;
            const size_t top_at = q.logits == BatchLogits::All ? size_t(done) * size_t(top ? top->k : 0) : 0;
            ctx.top_k = top ? top->k : 0;
            ctx.top_values = top ? top->values + top_at : nullptr;
            ctx.top_ids = top ? top->ids + top_at : nullptr;
            run_plan(ctx, bucket_for(len, opts), opts, rows, prof);
            st.n_past[size_t(slot)] += len;
            done += len;
        }
        return;
    }
    // Several sequences: one step over all their tokens.
    const size_t ns = size_t(n_seqs);
    std::vector<int32_t> offsets(ns + 1, 0), slots(ns, 0), n_past(ns, 0), out_rows;
    std::vector<uint8_t> serial(ns, 0);
    for (int i = 0; i < n_seqs; ++i) {
        const BatchSeq& q = batch.seqs[size_t(i)];
        offsets[size_t(i) + 1] = offsets[size_t(i)] + q.n_tokens;
        slots[size_t(i)] = q.slot;
        n_past[size_t(i)] = st.n_past[size_t(q.slot)];
        serial[size_t(i)] = q.serial;
        if (q.logits == BatchLogits::Last) out_rows.push_back(offsets[size_t(i) + 1] - 1);
        if (q.logits == BatchLogits::All)
            for (int t = offsets[size_t(i)]; t < offsets[size_t(i) + 1]; ++t) out_rows.push_back(t);
    }
    ctx.ids = batch.ids.data();
    ctx.n = int(total);
    ctx.hidden = opts.mtp_hidden;
    ctx.n_seqs = n_seqs;
    ctx.offsets = offsets.data();
    ctx.slots = slots.data();
    ctx.n_past = n_past.data();
    ctx.serial = serial.data();
    ctx.out_rows = out_rows.data();
    ctx.n_out = int(out_rows.size());
    ctx.logits = logits;
    ctx.argmax = argmax;
    ctx.top_k = top ? top->k : 0;
    ctx.top_values = top ? top->values : nullptr;
    ctx.top_ids = top ? top->ids : nullptr;
    run_plan(ctx, bucket_for(int(total), opts), opts, out_rows.empty() ? graph::Rows::None : graph::Rows::Listed, prof);
    for (const BatchSeq& q : batch.seqs) st.n_past[size_t(q.slot)] += q.n_tokens;
}

void ModelRunner::run_plan(StepContext& ctx, int bucket, const ForwardOptions& opts, graph::Rows logits,
                           Profiler* prof) const {
    std::string dumped;
    for (const std::string& d : opts.dump) dumped += d + "\n";
    for (const std::string& k : opts.keep_rows) dumped += "keep " + k + "\n";
    const int mtp = opts.mtp_hidden ? 2 : opts.mtp ? 1 : 0;
    auto key = std::make_tuple(bucket, int(logits), int(opts.gdn_mode), opts.gdn_chunk, mtp, dumped);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
        if (plans_.size() >= 6) plans_.clear();  // bound the memory held by old buckets
        graph::GraphSpec spec{logits, opts.gdn_mode, opts.gdn_chunk};
        spec.mtp = mtp == 1;
        spec.mtp_alone = mtp == 2;
        spec.keep_rows = opts.keep_rows;
        graph::Graph g = step_graph(spec);
        it = plans_.emplace(key, backend_->compile(g, bucket, CompileOptions{opts.dump})).first;
    }
    it->second->replay(ctx, prof);
}

}  // namespace alloy
