// The engine of include/alloy/engine.h: a scheduler thread that owns the model and its slot
// state cache and runs continuous batching.
//
// One step: requests waiting in the queue take free slots (FIFO); then the step is either one
// token of every decoding request (serial GDN) in one batch, or the next prompt piece of the
// oldest prefilling request on its own (min(batch_size, rest) tokens from its start, the pieces
// it would run alone); the two kinds alternate while both wait, so a long prompt delays the
// others' next token by one piece at most.
// Why prompts do not share steps with decodes (the forward could: Batch allows mixed steps):
// batch invariance. A prompt piece alone runs exactly the single-sequence plan; a decode step
// of up to 16 sequences takes the matmuls' GEMV (cpu/matmul_kernels.h kGemvMaxTokens), whose
// bits per row do not depend on the other rows; the GDN op, attention and the norms are per
// sequence or row. So with up to 16 requests at once a request's tokens are those it would get
// alone. Mixed steps would put decode rows through the GEMM (another summation order: with
// int8-rounded activations ~1e-2 on a logit) and prune no last layer for the prompt.
// Speculative decoding (EngineOptions::spec): a greedy request's decode row becomes its token
// plus up to spec_k drafts (runtime/speculative.h: verification through the serial kernel, the
// same acceptance rule and rollback as verify_greedy), and drafts are given out only while the
// step stays within 16 tokens, so the GEMV guarantee above still covers every row. Several
// tokens of one request can then be accepted in a step: they are taken one at a time through
// the same checks as decoded ones (end of generation, stop strings, max_tokens), and a request
// that finishes inside an accepted run has its slot rolled back to exactly the tokens it
// emitted but the last (the state plain decode leaves) before its end-of-generation checkpoint.
#include "alloy/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <limits>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "alloy/error.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/json_constraint.h"
#include "runtime/model_runner.h"
#include "runtime/loaded_model.h"
#include "runtime/sampler.h"
#include "runtime/engine_options.h"
#include "runtime/prefix_cache.h"
#include "runtime/slot_cache.h"
#include "runtime/gdn_replay.h"
#include "runtime/draft_model_drafter.h"
#include "runtime/mtp_drafter.h"
#include "runtime/spec_policy.h"
#include "runtime/speculative.h"
#include "runtime/stop_filter.h"

namespace alloy {

namespace {

using clock = std::chrono::steady_clock;
double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A request from submit() to on_done.
struct Sequence {
    uint64_t id = 0;
    GenerationRequest req;
    GenerationCallbacks cb;
    int slot = -1;
    size_t fed = 0;           // prompt tokens already run
    int32_t next = -1;        // the sampled token the next step feeds (decoding)
    bool decoding = false;
    bool cancelled = false;
    std::optional<Sampler> sampler;
    std::optional<StreamDecoder> dec;
    std::optional<StopFilter> filter;
    std::optional<JsonPrefix> json;  // request.format JsonObject: the text so far, as a JSON prefix
    bool json_on = false;            // the constraint applies (after format_after, when set)
    // Speculative decoding: the drafter's context (the prompt, then every token taken), this
    // step's fed tokens (next, then its drafts), the slot before a verification step and how
    // many tokens the request had taken when the step began.
    std::vector<int32_t> history;
    std::vector<int32_t> step_ids;
    // --spec mtp: the model's MTP head drafting for this request (its own cache), fed after each
    // step with the trunk's rows of the positions the request keeps; step_pos0: the position of
    // this step's first token.
    std::optional<MtpDrafter> mtp;
    std::optional<DraftModelDrafter> draft;  // --spec draft: on the request's slot of the draft model
    std::optional<NgramIndex> ngram;         // --spec ngram: prompt lookup over `history`
    int step_pos0 = 0;
    std::optional<StateSnapshot> before;
    size_t ids_before = 0;
    // Adaptive drafting (speculation must not cost more than it saves): the engine's SpecPolicy
    // caps the drafts of every step from measured step times and acceptance (0: plain decode);
    // under that cap a request's drafts follow its last verification's accepted run (+1), and a
    // verification that kept nothing makes it decode plainly for spec_backoff steps, doubling (up
    // to 32) while drafts keep failing. Output is unaffected: whether a step drafts changes no
    // token or bit.
    int spec_k_now = 0, spec_skip = 0, spec_backoff = 1;
    GenerationResult r;
    clock::time_point submitted, started, prompt_done;
};

}  // namespace

struct Engine::Impl {
    EngineOptions opt;
    LoadedModel lm;
    ForwardOptions fo;
    std::optional<SlotStateCache> slots;
    std::optional<PrefixCache> prefix;  // when cache_ram_mib > 0 on a host state
    std::optional<NgramDrafter> drafter;  // when spec is "ngram"
    bool mtp_spec = false;                // when spec is "mtp"
    std::unique_ptr<ModelRunner> mtp_runner;  // then: the MTP heads' plans (the trunk's backend), shared by the requests' drafters
    std::vector<float> step_rows;         // --spec mtp: the step's trunk rows [T, D], batch order
    bool step_dumped = false;             // whether this step dumps them
    std::optional<SpecPolicy> policy;     // when spec is on: the drafts a step may carry
    std::optional<LoadedModel> draft_lm;  // when spec is "draft": the draft model
    std::optional<SlotStateCache> draft_slots;  // and its states, a slot per engine slot

    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<std::unique_ptr<Sequence>> queue;   // guarded by mu
    std::unordered_set<uint64_t> cancels;          // guarded by mu
    std::deque<std::function<void()>> jobs;        // guarded by mu: evaluate() calls, run between steps
    bool stopping = false;                         // guarded by mu
    uint64_t next_id = 1;                          // guarded by mu
    EngineStats st;                                // guarded by mu
    EngineSlots view;                              // guarded by mu: published by the scheduler (publish_slots)
    std::vector<std::unique_ptr<Sequence>> active;  // scheduler thread only
    std::vector<int> free_slots;                    // scheduler thread only
    bool last_step_decoded = false;                 // scheduler thread only
    std::vector<float> logits;                      // scheduler thread only: the step's rows, kept (grows only)
    std::vector<int32_t> greedy;                    // scheduler thread only: the step's greedy tokens
    GdnReplayLog step_log;                          // scheduler thread only: a verification step's GDN inputs
    std::vector<float> top_values;                  // scheduler thread only: the step's top-k pairs
    std::vector<int32_t> top_ids;
    // Constrained output: the vocabulary's token trie and mask cache, built by the first request
    // that asks (~0.1 s for 150k tokens), and the masked row handed to the sampler.
    std::optional<JsonTokenMask> json_mask;         // scheduler thread only
    std::vector<float> masked;                      // scheduler thread only
    std::thread thread;

    void emit(Sequence& s, const std::string& text, bool& hit) {
        s.r.text += text;
        if (!text.empty() && s.cb.on_text && !s.cb.on_text(text)) hit = true;
    }

    void finish(Sequence& s, std::string reason) {
        if (s.dec && reason != "error" && reason != "cancelled") {
            bool hit = false;
            std::string tail = s.filter->push(s.dec->flush(), hit);
            if (!hit) tail += s.filter->flush();
            else reason = "stop";
            bool ignored = false;
            emit(s, tail, ignored);
        }
        const auto now = clock::now();
        s.r.finish_reason = std::move(reason);
        if (s.started != clock::time_point{}) {
            const auto pd = s.prompt_done == clock::time_point{} ? now : s.prompt_done;
            s.r.prompt_seconds = seconds(s.started, pd);
            s.r.generate_seconds = seconds(pd, now);
        }
        {
            std::lock_guard<std::mutex> lock(mu);
            ++st.finished;
            st.prompt_seconds += s.r.prompt_seconds;
            st.generate_seconds += s.r.generate_seconds;
        }
        // The state at the end of a generation: prompt + every fed token (the last sampled one
        // never ran), so the next turn of a chat resumes after the answer.
        if (prefix && s.slot >= 0 && (s.r.finish_reason == "stop" || s.r.finish_reason == "length") &&
            s.fed == s.req.prompt.size()) {
            settle(s);
            checkpoint(s);
        }
        s.before.reset();
        if (s.cb.on_done) s.cb.on_done(s.r);
        if (s.slot >= 0) free_slots.push_back(s.slot);
        s.slot = -1;
    }

    // A request that finished inside a verification's accepted run: its slot holds drafts past
    // the tokens it emitted. Back to before the step, then the step's tokens it emitted but the
    // last, so the slot is the prompt and every emitted token but the last, as after decode.
    void settle(Sequence& s) {
        if (!s.before) return;
        const size_t kept = s.r.ids.size() - s.ids_before;
        if (kept < s.step_ids.size())
            roll_back(*lm.runner, *slots, {{s.slot, &*s.before, std::vector<int32_t>(s.step_ids.begin(), s.step_ids.begin() + long(kept))}},
                      fo, &step_log);  // the log checks that it holds this slot's step
        s.before.reset();
    }

    // Whether a request's decode steps carry drafts: unconstrained (a JSON constraint masks rows
    // the acceptance rules do not see). Greedy requests keep drafts by accept_greedy (plain
    // decode's tokens bit for bit); sampled ones by accept_sampled (plain sampling's
    // distribution, not its token stream for a given seed).
    bool speculates(const Sequence& s) const { return (drafter || s.mtp || s.draft) && !s.json; }
    bool keeps_history() const { return drafter || draft_slots; }
    // ALLOY_SPEC_POLICY=0: every step carries up to spec_k drafts (the raw cost of a K; A/B).
    static bool fixed_spec_k() {
        static const bool fixed = [] {
            const char* e = std::getenv("ALLOY_SPEC_POLICY");
            return e && e[0] == '0';
        }();
        return fixed;
    }

    // --spec mtp: the rows [first, first + next.size()) of the step's trunk rows, at positions
    // pos0.., each followed by next[i], into the request's MTP head. A failure turns its drafting
    // off (the tokens never depend on drafts).
    void mtp_observe(Sequence& s, size_t first, int pos0, const std::vector<int32_t>& next) {
        const size_t D = size_t(lm.model->hparams().n_embd);
        if (!s.mtp || next.empty() || !step_dumped) return;  // a step the policy kept plain: no rows
        if ((first + next.size()) * D > step_rows.size()) {
            s.mtp.reset();
            return;
        }
        try {
            s.mtp->observe(pos0, step_rows.data() + first * D, next.data(), int(next.size()));
        } catch (const std::exception&) {
            s.mtp.reset();
        }
    }

    // The sampled token of a step: stream it, then decide whether the request goes on.
    // Returns false when it finished. Same order of checks as a single run always had.
    bool take_token(Sequence& s, int32_t token) {
        s.r.ids.push_back(token);
        if (keeps_history()) s.history.push_back(token);
        if (s.cb.on_token) s.cb.on_token(token);
        if (!s.req.ignore_eos && lm.tokenizer && lm.tokenizer->is_end_of_generation(token)) {
            finish(s, "stop");
            return false;
        }
        bool hit = false;
        if (s.dec) emit(s, s.filter->push(s.dec->push(token), hit), hit);
        if (hit) {
            s.dec.reset();  // the rest is dropped
            finish(s, "stop");
            return false;
        }
        if (s.json && !s.json_on) {
            s.json_on = token == s.req.format_after;  // the answer's JSON starts with the next token
        } else if (s.json) {
            if (!s.json->push(json_mask->token(token))) throw Error("a token outside the JSON constraint was sampled");
            if (s.json->complete()) {  // the object closed: nothing may follow it
                finish(s, "stop");
                return false;
            }
        }
        if (int(s.r.ids.size()) >= s.req.max_tokens) {
            finish(s, "length");
            return false;
        }
        s.next = token;
        s.decoding = true;
        return true;
    }

    void admit_and_cancel() {
        std::vector<std::unique_ptr<Sequence>> dropped;  // finished outside the lock (on_done may submit)
        std::unique_lock<std::mutex> lock(mu);
        for (auto it = queue.begin(); it != queue.end();) {
            if (cancels.erase((*it)->id)) {
                dropped.push_back(std::move(*it));
                it = queue.erase(it);
            } else {
                ++it;
            }
        }
        for (auto& s : active)
            if (cancels.erase(s->id)) s->cancelled = true;
        cancels.clear();  // ids that matched nothing (finished, unknown)
        while (!queue.empty() && !free_slots.empty()) {
            std::unique_ptr<Sequence> s = std::move(queue.front());
            queue.pop_front();
            s->slot = free_slots.back();
            free_slots.pop_back();
            active.push_back(std::move(s));
        }
        st.active = int(active.size());
        st.queued = int(queue.size());
        lock.unlock();
        for (auto& s : dropped) finish(*s, "cancelled");
    }

    // The slots as the scheduler holds them now, copied for Engine::slots(): the Sequences are
    // this thread's alone (no lock around a step), so readers get this copy, made between steps.
    void publish_slots() {
        std::vector<SlotInfo> v(size_t(opt.n_parallel));
        for (size_t i = 0; i < v.size(); ++i) v[i].id = int(i);
        for (const auto& s : active) {
            if (s->slot < 0) continue;
            SlotInfo& o = v[size_t(s->slot)];
            o.state = s->decoding ? "decoding" : "prefilling";
            o.request = s->id;
            // Admitted but not started: the slot still holds its last request's tokens until start() resets it.
            o.n_past = s->started == clock::time_point{} ? 0 : slots->n_past(s->slot);
            o.n_prompt = int(s->req.prompt.size());
            o.n_prompt_done = int(s->fed);
            o.n_cached = s->r.n_cached;
            o.n_generated = int(s->r.ids.size());
        }
        std::lock_guard<std::mutex> lock(mu);
        view.slots = std::move(v);
        view.queued = int(queue.size());
    }

    // The slot's state as a checkpoint of its tokens (the prompt, then the generated ids fed).
    void checkpoint(const Sequence& s) {
        const int n = slots->n_past(s.slot);
        std::vector<int32_t> tokens(s.req.prompt.begin(), s.req.prompt.begin() + std::min<long>(n, long(s.req.prompt.size())));
        for (size_t i = 0; tokens.size() < size_t(n) && i < s.r.ids.size(); ++i) tokens.push_back(s.r.ids[i]);
        if (tokens.size() != size_t(n) || n == 0 || prefix->contains(tokens.data(), tokens.size())) return;
        prefix->insert(take_checkpoint(*slots, s.slot, tokens.data()));
        std::lock_guard<std::mutex> lock(mu);
        st.cache_checkpoints = int(prefix->size());
        st.cache_bytes = prefix->bytes();
    }

    void start(Sequence& s) {
        slots->reset(s.slot);
        if (prefix)
            if (const Checkpoint* c = prefix->find(s.req.prompt)) {
                resume_from(*slots, s.slot, *c);
                s.fed = c->tokens.size();
                s.r.n_cached = int(s.fed);
                std::lock_guard<std::mutex> lock(mu);
                ++st.cache_hits;
                st.cached_tokens += s.fed;
            }
        s.started = clock::now();
        s.r.queue_seconds = seconds(s.submitted, s.started);
        s.sampler.emplace(SamplerParams{s.req.sampling.temperature, s.req.sampling.top_k, s.req.sampling.top_p,
                                        s.req.sampling.min_p, s.req.sampling.seed});
        if (s.req.text) s.dec.emplace(*lm.tokenizer);
        s.filter.emplace(s.req.stop);
        if (keeps_history()) s.history = s.req.prompt;
        if (mtp_spec) s.mtp.emplace(*mtp_runner, opt.n_ctx);
        if (drafter) s.ngram.emplace(*drafter);
        if (draft_slots) s.draft.emplace(*draft_lm->runner, *draft_slots, s.slot, fo);
        if (s.req.format == GenerationRequest::Format::JsonObject) {
            if (!json_mask) json_mask.emplace(*lm.tokenizer, lm.model->hparams().n_vocab);
            s.json.emplace(/*object_only=*/true);
            s.json_on = s.req.format_after < 0;
        }
    }

    // The logits row with every token the JSON constraint refuses at -inf, or nullptr when it
    // allows none. A token is allowed when its bytes keep the text a JSON prefix and the
    // shortest completion after it fits in the tokens left after it (one byte per token: the
    // vocabulary has every byte), so max_tokens never cuts an object open.
    const float* constrain(const Sequence& s, const float* row, size_t V) {
        const std::vector<uint16_t>& after = json_mask->after(*s.json);
        const long left = long(s.req.max_tokens) - long(s.r.ids.size()) - 1;
        masked.resize(V);
        constexpr float kOff = -std::numeric_limits<float>::infinity();
        bool any = false;
        for (size_t i = 0; i < V; ++i) {
            const bool ok = after[i] != JsonTokenMask::kRefused && long(after[i]) <= left;
            masked[i] = ok ? row[i] : kOff;
            any |= ok;
        }
        if (!any)  // max_tokens is below the shortest object: at least a valid prefix
            for (size_t i = 0; i < V; ++i)
                if (after[i] != JsonTokenMask::kRefused) masked[i] = row[i], any = true;
        return any ? masked.data() : nullptr;
    }

    // Requests that finish() released (slot -1) leave the active list.
    void drop_finished() {
        active.erase(std::remove_if(active.begin(), active.end(), [](const auto& s) { return s->slot < 0; }), active.end());
    }

    void step() {
        // Requests that leave before running: cancelled, or nothing to generate.
        for (auto& s : active) {
            if (s->started == clock::time_point{} && !s->cancelled) start(*s);
            if (s->cancelled) finish(*s, "cancelled");
            else if (s->req.max_tokens == 0) finish(*s, "length");
        }
        drop_finished();
        if (active.empty()) return;

        // Which step: every decoding request (one token each), or the next prompt piece of the
        // oldest prefilling request on its own; the two alternate while both wait.
        Batch batch;
        // A decode step of speculating requests: its time (drafting, forward, rollback) and the
        // most drafts a request carried go to the policy.
        const auto step_start = clock::now();
        int spec_step_k = 0;
        bool spec_step = false;
        std::vector<Sequence*> order;       // batch sequence i -> its request
        std::vector<int> piece;             // prompt tokens of batch sequence i (0: decode)
        Sequence* prefill = nullptr;
        bool any_decoding = false;
        for (auto& s : active) {
            if (s->decoding) any_decoding = true;
            else if (!prefill) prefill = s.get();
        }
        const bool any_prompt = prefill && (!any_decoding || last_step_decoded);
        if (any_prompt) {
            Sequence& s = *prefill;
            // Pieces end at multiples of batch_size and of checkpoint_every from the prompt's start
            // (so a prompt resumed from a checkpoint runs the pieces it would have run whole).
            const size_t every = size_t(std::max(1, opt.checkpoint_every));
            size_t next_cut = std::min(s.fed / size_t(fo.max_batch) * size_t(fo.max_batch) + size_t(fo.max_batch),
                                       s.fed / every * every + every);
            for (int c : s.req.checkpoint_at)  // and at the request's own points (message ends)
                if (size_t(c) > s.fed) {
                    next_cut = std::min(next_cut, size_t(c));
                    break;
                }
            const int n = int(std::min(next_cut, s.req.prompt.size()) - s.fed);
            const bool last = s.fed + size_t(n) == s.req.prompt.size();
            batch.add(s.slot, s.req.prompt.data() + s.fed, n, last ? BatchLogits::Last : BatchLogits::None,
                      fo.gdn_mode == ref::GdnMode::Serial);
            order.push_back(&s);
            piece.push_back(n);
        } else {
            // Drafts only while the step holds at most kGemvMaxTokens tokens (every row's bits
            // its own: see the top of this file), and never past the request's max_tokens.
            int budget = cpu::mm::kGemvMaxTokens;
            for (auto& s : active) budget -= s->decoding ? 1 : 0;
            const bool any_spec = std::any_of(active.begin(), active.end(), [&](const auto& s) { return s->decoding && speculates(*s); });
            const int cap = !any_spec ? 0 : fixed_spec_k() ? opt.spec_k : policy->choose();
            const bool measure = any_spec && !fixed_spec_k() && policy->exploring();  // the policy's k, unhindered
            spec_step = any_spec;
            for (auto& s : active)
                if (s->decoding) {
                    s->step_ids.assign(1, s->next);
                    s->step_pos0 = slots->n_past(s->slot);
                    if (speculates(*s) && s->spec_skip > 0 && !measure) {
                        --s->spec_skip;
                    } else if (speculates(*s)) {
                        if (s->spec_k_now == 0) s->spec_k_now = opt.spec_k;
                        const int k = std::min({measure ? cap : s->spec_k_now, cap, s->req.max_tokens - int(s->r.ids.size()) - 1, budget});
                        if (k > 0)
                            for (int32_t d : s->mtp     ? s->mtp->draft(k)
                                             : s->draft ? s->draft->draft(s->history, k)
                                                        : s->ngram->draft(s->history, k))
                                s->step_ids.push_back(d);
                    }
                    const bool verify = s->step_ids.size() > 1;
                    spec_step_k = std::max(spec_step_k, int(s->step_ids.size()) - 1);
                    if (verify) {
                        budget -= int(s->step_ids.size()) - 1;
                        s->before = slots->snapshot(s->slot);
                        s->ids_before = s->r.ids.size();
                    }
                    batch.add(s->slot, s->step_ids.data(), int(s->step_ids.size()),
                              verify ? BatchLogits::All : BatchLogits::Last, /*serial=*/true);
                    order.push_back(s.get());
                    piece.push_back(0);
                }
        }
        last_step_decoded = !any_prompt;
        ForwardOptions run = fo;
        if (!any_prompt) run.gdn_mode = ref::GdnMode::Serial;  // a decode-only step: its plans and labels
        // A step with verifications logs its GDN ops' inputs, so that rolling a slot back runs
        // those ops again instead of the model (runtime/gdn_replay.h); the log is this step's.
        const bool verifies = std::any_of(batch.seqs.begin(), batch.seqs.end(), [](const BatchSeq& q) { return q.logits == BatchLogits::All; });
        step_log.clear();
        // --spec mtp: the rows of the trunk's last layer the step computes anyway, in batch order:
        // every row of a decode or verification step, the last of a prompt's last piece, none of
        // an inner piece. (Computing the others would change the prompt's last row's bits: the
        // 16-bit GEMMs of many rows do not round as the one-row GEMV does.)
        step_rows.clear();
        // Only while drafts may come within the rows the head keeps waiting (MtpDrafter::kMaxPending):
        // while the policy holds plain decode a step costs what plain decode's does (the dump
        // took ~1-3% of a small model's step on the H200), and the head still gets the rows it
        // would have kept before its next draft.
        const bool mtp_rows = std::any_of(order.begin(), order.end(), [](const Sequence* s) { return bool(s->mtp); }) &&
                              (fixed_spec_k() || policy->may_draft_within(MtpDrafter::kMaxPending));
        step_dumped = mtp_rows;
        if (mtp_rows) {
            const std::string name = "blk." + std::to_string(lm.model->hparams().n_layer - 1) + ".h";
            run.dump = {name};
            run.dump_sink = [this](const std::string&, int64_t, const float* rows, int64_t n, int64_t cols) {
                step_rows.insert(step_rows.end(), rows, rows + n * cols);
            };
        }
        if (verifies) run.gdn_log = &step_log;
        const size_t V = size_t(lm.model->hparams().n_vocab);
        // Kept between steps: 32 decoding requests need 19 MB of rows, not worth allocating and
        // zeroing every token.
        // Every row greedy, unconstrained and without logprobs: only the tokens are needed (a
        // GPU picks them on the device and copies 4 bytes a row instead of the logits). Else,
        // every row sampled with top-k on (unconstrained, without logprobs) and a backend that
        // picks the k best pairs where the logits are: only those come back, and each sampler
        // draws from its row's (the same draw: Sampler::sample_top).
        bool tokens_only = true, top_only = true;
        TopKRows top;
        for (size_t i = 0; i < order.size(); ++i)
            if (piece[i] == 0 || order[i]->fed + size_t(piece[i]) == order[i]->req.prompt.size()) {
                const Sequence& s = *order[i];
                const bool plain = !s.json_on && s.req.logprobs < 0;
                const int k = s.sampler->candidates_needed(int(V));
                tokens_only = tokens_only && plain && s.sampler->greedy();
                // A sampled verification's rule reads whole rows (Sampler::distribution).
                const bool sampled_verify = piece[i] == 0 && batch.seqs[i].logits == BatchLogits::All && !s.sampler->greedy();
                top_only = top_only && plain && !s.sampler->greedy() && k < int(V) && !sampled_verify;
                top.k = std::max(top.k, k);
            }
        top_only = top_only && !tokens_only && top.k >= 1 && top.k <= lm.runner->max_top_k_on_device();
        float* rows_out = nullptr;  // [batch.logit_rows(), V]: the backend's host_output, or `logits`
        if (tokens_only) {
            greedy.resize(size_t(batch.logit_rows()));
        } else if (top_only) {
            top_values.resize(size_t(batch.logit_rows()) * size_t(top.k));
            top_ids.resize(top_values.size());
            top.values = top_values.data();
            top.ids = top_ids.data();
        } else if (!(rows_out = lm.runner->host_output(size_t(batch.logit_rows()) * V))) {
            if (logits.size() < size_t(batch.logit_rows()) * V) logits.resize(size_t(batch.logit_rows()) * V);
            rows_out = logits.data();
        }
        try {
            lm.runner->forward(slots->state(), batch, run, rows_out, nullptr, tokens_only ? greedy.data() : nullptr,
                               top_only ? &top : nullptr);
        } catch (const std::exception& e) {
            // Nothing a request can send reaches here (submit checks ids and sizes); fail the
            // step's requests rather than the engine.
            for (Sequence* s : order) {
                s->r.error = e.what();
                finish(*s, "error");
            }
            drop_finished();
            return;
        }
        std::vector<size_t> seq_first(order.size(), 0);  // batch sequence i's first row of the step
        for (size_t i = 1; i < order.size(); ++i) seq_first[i] = seq_first[i - 1] + size_t(batch.seqs[i - 1].n_tokens);
        size_t row = 0;
        uint64_t sampled = 0, drafted = 0, accepted = 0;
        std::vector<Rollback> rollbacks;  // verifications that kept fewer tokens than they fed
        for (size_t i = 0; i < order.size(); ++i) {
            Sequence& s = *order[i];
            if (batch.seqs[i].logits == BatchLogits::All) {  // a verification: next, then its drafts
                const size_t n = s.step_ids.size();
                // The emitted tokens: the kept drafts, then the token after them (g[a]).
                const std::vector<int32_t> drafts(s.step_ids.begin() + 1, s.step_ids.end());
                std::vector<int32_t> g(n);
                int a = 0;
                if (s.sampler->greedy()) {  // each row's greedy token
                    for (size_t t = 0; t < n; ++t)
                        g[t] = tokens_only ? greedy[row + t] : greedy_token(rows_out + (row + t) * V, int(V));
                    a = accept_greedy(g.data(), drafts);
                } else {
                    const SampledAccept sa = accept_sampled(*s.sampler, rows_out + row * V, int(V), drafts);
                    a = sa.accepted;
                    for (int t = 0; t < a; ++t) g[size_t(t)] = drafts[size_t(t)];
                    g[size_t(a)] = sa.next;
                }
                s.r.n_drafted += int(n) - 1;
                s.r.n_accepted += a;
                policy->record_verification(int(n) - 1, a);
                ++s.r.n_decode_steps;
                s.spec_k_now = std::min(opt.spec_k, a + 1);
                if (a == 0) {
                    s.spec_skip = s.spec_backoff;
                    s.spec_backoff = std::min(2 * s.spec_backoff, 32);
                } else {
                    s.spec_backoff = 1;
                }
                if (s.r.drafted_at.size() < n - 1) s.r.drafted_at.resize(n - 1), s.r.accepted_at.resize(n - 1);
                for (size_t t = 0; t + 1 < n; ++t) {
                    ++s.r.drafted_at[t];
                    s.r.accepted_at[t] += int(t) < a;
                }
                drafted += n - 1;
                accepted += uint64_t(a);
                try {
                    for (int t = 0; t <= a; ++t) {  // one at a time: a stop or max_tokens ends the run
                        if (s.req.logprobs >= 0) {
                            s.r.logprobs.push_back(token_logprob(rows_out + (row + size_t(t)) * V, int(V), g[size_t(t)], s.req.logprobs));
                            if (s.cb.on_logprob) s.cb.on_logprob(s.r.logprobs.back());
                        }
                        ++sampled;
                        if (!take_token(s, g[size_t(t)])) break;
                    }
                } catch (const std::exception& e) {  // a callback threw: that request fails, not the engine
                    s.dec.reset();
                    s.r.error = std::string("a callback of the request threw: ") + e.what();
                    if (s.slot >= 0) finish(s, "error");
                }
                row += n;
                mtp_observe(s, seq_first[i], s.step_pos0, std::vector<int32_t>(g.begin(), g.begin() + a + 1));
                if (s.slot >= 0 && size_t(a) + 1 < n)
                    rollbacks.push_back({s.slot, &*s.before, std::vector<int32_t>(s.step_ids.begin(), s.step_ids.begin() + 1 + a)});
                continue;
            }
            if (piece[i] > 0) {
                s.fed += size_t(piece[i]);
                // Checkpoints inside a long prompt and at its end (before its first token).
                if (prefix && (s.fed == s.req.prompt.size() || s.fed % size_t(std::max(1, opt.checkpoint_every)) == 0 ||
                               std::binary_search(s.req.checkpoint_at.begin(), s.req.checkpoint_at.end(), int(s.fed))))
                    checkpoint(s);
                if (s.fed < s.req.prompt.size()) continue;  // no logits yet
                s.prompt_done = clock::now();
            } else {
                ++s.r.n_decode_steps;
            }
            int32_t token = 0;
            if (tokens_only) {
                token = greedy[row];
            } else if (top_only) {
                token = s.sampler->sample_top(top_values.data() + row * size_t(top.k), top_ids.data() + row * size_t(top.k), top.k);
            } else {
                const float* row_logits = rows_out + row * V;
                const float* pick = s.json_on ? constrain(s, row_logits, V) : row_logits;
                if (!pick) {
                    ++row;
                    s.r.error = "the JSON constraint allows no token of the vocabulary";
                    finish(s, "error");
                    continue;
                }
                token = s.sampler->sample(pick, int(V));
            }
            if (s.req.logprobs >= 0) {
                const float* row_logits = rows_out + row * V;
                s.r.logprobs.push_back(token_logprob(row_logits, int(V), token, s.req.logprobs));
                if (s.cb.on_logprob) s.cb.on_logprob(s.r.logprobs.back());
            }
            ++row;
            ++sampled;
            try {
                take_token(s, token);
                if (s.mtp && s.slot >= 0)  // the step's row (a prompt's: its last alone), followed by the token just taken
                    mtp_observe(s, piece[i] > 0 ? 0 : seq_first[i], piece[i] > 0 ? int(s.fed) - 1 : s.step_pos0, {token});
            } catch (const std::exception& e) {  // a callback threw: that request fails, not the engine
                s.dec.reset();
                s.r.error = std::string("a callback of the request threw: ") + e.what();
                if (s.slot >= 0) finish(s, "error");
            }
        }
        try {
            if (!rollbacks.empty()) roll_back(*lm.runner, *slots, rollbacks, fo, &step_log);
        } catch (const std::exception& e) {  // as the forward's: fail those requests, not the engine
            for (Sequence* s : order)
                if (s->slot >= 0 && std::any_of(rollbacks.begin(), rollbacks.end(), [&](const Rollback& r) { return r.slot == s->slot; })) {
                    s->r.error = e.what();
                    finish(*s, "error");
                }
        }
        for (Sequence* s : order) s->before.reset();
        if (spec_step) policy->record_step(spec_step_k, std::chrono::duration<double>(clock::now() - step_start).count());
        drop_finished();
        std::lock_guard<std::mutex> lock(mu);
        ++st.steps;
        st.max_batch_sequences = std::max(st.max_batch_sequences, int(batch.seqs.size()));
        for (size_t i = 0; i < order.size(); ++i)
            if (piece[i] > 0) st.prompt_tokens += uint64_t(piece[i]);
        st.generated_tokens += sampled;  // every sampled token: a prompt's first one too
        st.drafted_tokens += drafted;
        st.accepted_tokens += accepted;
        st.active = int(active.size());
    }

    void loop() {
        for (;;) {
            {
                std::unique_lock<std::mutex> lock(mu);
                cv.wait(lock, [&] {
                    return stopping || !queue.empty() || !active.empty() || !cancels.empty() || !jobs.empty();
                });
                if (stopping) {
                    for (auto& s : queue) cancels.insert(s->id);
                    for (auto& s : active) cancels.insert(s->id);
                }
            }
            for (;;) {  // evaluate() jobs: the model is this thread's between steps
                std::function<void()> job;
                {
                    std::lock_guard<std::mutex> lock(mu);
                    if (jobs.empty()) break;
                    job = std::move(jobs.front());
                    jobs.pop_front();
                }
                job();
            }
            admit_and_cancel();
            publish_slots();  // the admitted requests show before their (maybe long) first step
            step();
            publish_slots();
            std::lock_guard<std::mutex> lock(mu);
            if (stopping && queue.empty() && active.empty() && jobs.empty()) return;
        }
    }
};

Engine::Engine(const EngineOptions& options) : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.opt = options;
    EngineOptions& o = m.opt;
    if (o.n_parallel < 1 || o.n_parallel > 256)
        throw Error("engine: n_parallel must be in [1, 256], got " + std::to_string(o.n_parallel));
    if (o.n_ctx < 2) throw Error("engine: n_ctx must be at least 2, got " + std::to_string(o.n_ctx));
    if (o.spec == "ngram") m.drafter.emplace();
    else if (o.spec == "mtp") m.mtp_spec = true;
    else if (o.spec != "off" && o.spec != "draft")
        throw Error("engine: spec must be 'off', 'ngram', 'mtp' or 'draft', got '" + o.spec + "'");
    if ((o.spec == "draft") != !o.draft_model.empty())
        throw Error(o.spec == "draft" ? "engine: spec 'draft' needs a draft model (--draft-model FILE)"
                                      : "engine: a draft model (--draft-model) is used with spec 'draft' only, not '" + o.spec + "'");
    if (o.spec_k < 1 || o.spec_k > kMaxVerifyTokens - 1)
        throw Error("engine: spec_k must be in [1, " + std::to_string(kMaxVerifyTokens - 1) + "] (drafts per step), got " +
                    std::to_string(o.spec_k));
    if (o.spec != "off") m.policy.emplace(o.spec_k);
    m.fo = forward_options(o);
    const KvCacheTypes kv = kv_cache_types(o);
    if (o.model_path.empty()) o.model_path = default_model_path();
    m.lm = load_model(o.model_path, tensor_placement(o), o.backend, o.tensor_parallel, o.expert_parallel);
    if (m.mtp_spec && !m.lm.model->mtp())
        throw Error("engine: spec 'mtp' needs a model with an MTP block (nextn_predict_layers > 0); " + o.model_path +
                    " has none (use 'ngram')");
    if (m.mtp_spec) m.mtp_runner = m.lm.runner->with_own_plans();
    m.slots.emplace(*m.lm.runner, o.n_parallel, o.n_ctx, kv);
    if (!o.draft_model.empty()) {
        m.draft_lm = load_model(o.draft_model, tensor_placement(o), o.backend);
        const int V = m.lm.model->hparams().n_vocab, Vd = m.draft_lm->model->hparams().n_vocab;
        if (V != Vd)  // the request's tokens feed the draft model, its drafts the target
            throw Error("engine: the draft model " + o.draft_model + " has a vocabulary of " + std::to_string(Vd) +
                        " tokens, the model " + o.model_path + " one of " + std::to_string(V) + " (they must be the same)");
        m.draft_slots.emplace(*m.draft_lm->runner, o.n_parallel, o.n_ctx, kv);
    }
    if (o.cache_ram_mib < 0) throw Error("engine: cache_ram_mib must be >= 0, got " + std::to_string(o.cache_ram_mib));
    if (o.checkpoint_every < 1)
        throw Error("engine: checkpoint_every must be >= 1, got " + std::to_string(o.checkpoint_every));
    // Checkpoints copy host state; a device backend's state has no such copies yet.
    if (o.cache_ram_mib > 0 && !m.slots->state().device) m.prefix.emplace(size_t(o.cache_ram_mib) << 20);
    for (int s = o.n_parallel - 1; s >= 0; --s) m.free_slots.push_back(s);  // slot 0 first
    m.view.slots.resize(size_t(o.n_parallel));
    for (int s = 0; s < o.n_parallel; ++s) m.view.slots[size_t(s)].id = s;
    m.thread = std::thread([&m] { m.loop(); });
}

Engine::~Engine() {
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->stopping = true;
    }
    impl_->cv.notify_all();
    impl_->thread.join();
}

uint64_t Engine::submit(GenerationRequest request, GenerationCallbacks callbacks) {
    Impl& m = *impl_;
    const int V = m.lm.model->hparams().n_vocab, n_ctx = m.opt.n_ctx;
    if (request.prompt.empty()) throw Error("request: the prompt is empty");
    for (size_t i = 0; i < request.checkpoint_at.size(); ++i) {
        const int c = request.checkpoint_at[i];
        if (c <= 0 || size_t(c) >= request.prompt.size() || (i > 0 && c <= request.checkpoint_at[i - 1]))
            throw Error("request: checkpoint_at[" + std::to_string(i) + "] = " + std::to_string(c) +
                        " must be ascending, in (0, " + std::to_string(request.prompt.size()) + ")");
    }
    for (size_t i = 0; i < request.prompt.size(); ++i)
        if (request.prompt[i] < 0 || request.prompt[i] >= V)
            throw Error("request: prompt token " + std::to_string(i) + " is id " + std::to_string(request.prompt[i]) +
                        ", outside the vocabulary [0, " + std::to_string(V) + ")");
    const int64_t n = int64_t(request.prompt.size());
    if (n >= n_ctx)
        throw Error("request: the prompt is " + std::to_string(n) + " tokens, the context holds " + std::to_string(n_ctx));
    if (request.max_tokens < 0) request.max_tokens = int(n_ctx - n);
    if (n + request.max_tokens > n_ctx)
        throw Error("request: prompt (" + std::to_string(n) + " tokens) + " + std::to_string(request.max_tokens) +
                    " tokens to generate exceeds the context size of " + std::to_string(n_ctx));
    if (request.logprobs < -1 || request.logprobs > kMaxTopLogprobs)
        throw Error("request: logprobs = " + std::to_string(request.logprobs) + " must be -1 (none) or 0.." +
                    std::to_string(kMaxTopLogprobs) + " alternatives");
    if (request.text) m.lm.require_tokenizer();
    if (request.format != GenerationRequest::Format::Text) {
        if (!request.text) throw Error("request: an output format needs text (the tokenizer's bytes of each token)");
        if (request.format_after < -1 || request.format_after >= V)
            throw Error("request: format_after = " + std::to_string(request.format_after) + " is outside the vocabulary [0, " +
                        std::to_string(V) + ")");
    }
    auto s = std::make_unique<Sequence>();
    s->req = std::move(request);
    s->cb = std::move(callbacks);
    s->r.n_prompt = int(n);
    s->submitted = clock::now();
    uint64_t id;
    {
        std::lock_guard<std::mutex> lock(m.mu);
        if (m.stopping) throw Error("engine: shutting down");
        id = s->id = m.next_id++;
        m.queue.push_back(std::move(s));
        m.st.queued = int(m.queue.size());
    }
    m.cv.notify_all();
    return id;
}

void Engine::cancel(uint64_t id) {
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->cancels.insert(id);
    }
    impl_->cv.notify_all();
}

GenerationResult Engine::generate(GenerationRequest request, std::function<bool(const std::string&)> on_text,
                                  std::function<void(int32_t)> on_token) {
    std::promise<GenerationResult> done;
    std::future<GenerationResult> result = done.get_future();
    GenerationCallbacks cb;
    cb.on_text = std::move(on_text);
    cb.on_token = std::move(on_token);
    cb.on_done = [&done](const GenerationResult& r) { done.set_value(r); };
    submit(std::move(request), std::move(cb));
    GenerationResult r = result.get();
    if (r.finish_reason == "error") throw Error("engine: " + r.error);
    return r;
}

namespace {
// evaluate()'s and evaluate_mtp()'s checks of the ids: each in the vocabulary, all in the context.
void check_eval_ids(const std::vector<int32_t>& ids, int V, int n_ctx, const char* what) {
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= V)
            throw Error(std::string(what) + ": token " + std::to_string(i) + " is id " + std::to_string(ids[i]) +
                        ", outside the vocabulary [0, " + std::to_string(V) + ")");
    if (int64_t(ids.size()) > n_ctx)
        throw Error(std::string(what) + ": " + std::to_string(ids.size()) + " tokens exceed the context size of " +
                    std::to_string(n_ctx) + " (raise --ctx)");
}
}  // namespace

// Runs `body` on the scheduler's thread between steps (the model is that thread's) and waits;
// body's exception is rethrown here.
void Engine::run_between_steps(const std::function<void()>& body) {
    Impl& m = *impl_;
    std::promise<void> done;
    auto job = [&] {
        try {
            body();
            done.set_value();
        } catch (...) {
            done.set_exception(std::current_exception());
        }
    };
    {
        std::lock_guard<std::mutex> lock(m.mu);
        if (m.stopping) throw Error("engine: shutting down");
        m.jobs.push_back(job);
    }
    m.cv.notify_all();
    done.get_future().get();
}

std::vector<float> Engine::evaluate(const std::vector<int32_t>& ids, int tokens_per_step) {
    std::vector<TensorDump> none;
    return evaluate(ids, tokens_per_step, {}, none);
}

std::string Engine::describe_forward() const {
    const ForwardOptions& fo = impl_->fo;
    return impl_->lm.runner->step_graph({graph::Rows::All, fo.gdn_mode, fo.gdn_chunk}).describe();
}

std::vector<float> Engine::evaluate(const std::vector<int32_t>& ids, int tokens_per_step, const std::vector<std::string>& dump,
                                    std::vector<TensorDump>& dumped) {
    Impl& m = *impl_;
    dumped.clear();
    std::map<std::string, size_t> index;  // name -> its entry in dumped
    const ModelRunner& model = *m.lm.runner;
    const int V = model.hparams().n_vocab;
    if (ids.empty()) throw Error("evaluate: no token ids given");
    check_eval_ids(ids, V, m.opt.n_ctx, "evaluate");
    std::vector<float> logits(ids.size() * size_t(V));
    run_between_steps([&] {
        ModelState st = model.new_state(m.opt.n_ctx, m.slots->state().kv_types);
        ForwardOptions fo = m.fo;
        fo.dump = dump;
        fo.dump_sink = [&](const std::string& name, int64_t pos, const float* rows, int64_t n_rows, int64_t cols) {
            auto [it, fresh] = index.emplace(name, dumped.size());
            if (fresh) dumped.push_back({name, cols, {}, {}});
            TensorDump& d = dumped[it->second];
            for (int64_t r = 0; r < n_rows; ++r) d.positions.push_back(pos + r);
            d.data.insert(d.data.end(), rows, rows + n_rows * cols);
        };
        if (tokens_per_step > 0) {
            fo.gdn_mode = ref::GdnMode::Serial;  // decode is the serial kernel by construction
            fo.all_logits = tokens_per_step > 1;
            for (size_t t = 0; t < ids.size(); t += size_t(tokens_per_step)) {
                const int n = int(std::min(ids.size() - t, size_t(tokens_per_step)));
                model.forward(st, &ids[t], n, fo, logits.data() + t * size_t(V));
            }
        } else {
            fo.all_logits = true;
            model.forward(st, ids.data(), int(ids.size()), fo, logits.data());
        }
    });
    for (const std::string& d : dump) {
        bool hit = false;
        for (const TensorDump& t : dumped) hit = hit || graph::name_matches({d}, t.name);
        if (!hit)
            throw Error("dump: the forward has no tensor named '" + d + "' (alloy logits --dump list prints them)");
    }
    return logits;
}

std::vector<float> Engine::evaluate_mtp(const std::vector<int32_t>& ids) {
    Impl& m = *impl_;
    const ModelRunner& model = *m.lm.runner;
    const int V = model.hparams().n_vocab;
    if (ids.size() < 2) throw Error("evaluate_mtp: the MTP head needs at least 2 token ids");
    check_eval_ids(ids, V, m.opt.n_ctx, "evaluate_mtp");
    std::vector<float> logits(ids.size() * size_t(V));
    run_between_steps([&] {
        ModelState st = model.new_state(m.opt.n_ctx, m.slots->state().kv_types);
        model.add_mtp_cache(st);
        ForwardOptions fo = m.fo;
        fo.mtp = true;
        fo.all_logits = true;
        const int c = std::max(1, fo.gdn_chunk);
        fo.max_batch = std::max(fo.max_batch, (int(ids.size()) + c - 1) / c * c);  // one piece
        model.forward(st, ids.data(), int(ids.size()), fo, logits.data());
    });
    return logits;
}

bool Engine::has_tokenizer() const { return impl_->lm.tokenizer.has_value(); }

std::vector<int32_t> Engine::tokenize(const std::string& text, bool parse_special) const {
    return impl_->lm.require_tokenizer().encode(text, parse_special);
}

std::string Engine::token_bytes(int32_t id) const { return impl_->lm.require_tokenizer().token_bytes(id); }

std::string Engine::chat_prompt(const std::vector<ChatTurn>& turns, bool add_generation_prompt,
                                bool enable_thinking, const std::vector<std::string>& tools) const {
    std::vector<ChatMessage> msgs;
    msgs.reserve(turns.size());
    for (const ChatTurn& t : turns) {
        ChatMessage m{t.role, t.content, t.reasoning_content, {}};
        for (const ChatToolCall& c : t.tool_calls) m.tool_calls.push_back({c.name, c.arguments});
        msgs.push_back(std::move(m));
    }
    return apply_chat_template(msgs, add_generation_prompt, enable_thinking, tools);
}

const EngineOptions& Engine::options() const { return impl_->opt; }

int Engine::n_vocab() const { return impl_->lm.model->hparams().n_vocab; }

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return impl_->st;
}

EngineSlots Engine::slots() const {
    std::lock_guard<std::mutex> lock(impl_->mu);
    EngineSlots v = impl_->view;
    v.queued = int(impl_->queue.size());  // submit() queues between the scheduler's publications
    return v;
}

}  // namespace alloy
