// Exact speculative decoding, the pieces under the engine (issue 21): a prompt-lookup drafter
// and greedy verification with rollback. A verification feeds the sampled token and its drafts
// as one serial step and keeps the logits of every row; on the CPU every kernel of that step
// gives each row the bits of a decode step (Q8_0 / F32 matmuls for any token count, BF16 and
// K-quants up to 16, attention up to kMaxVerifyTokens queries, the serial GDN kernel for any
// split), so the accepted tokens and their logits are plain greedy decode's, bit for bit.
#pragma once
#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "runtime/gdn_replay.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "runtime/slot_cache.h"

namespace alloy {

// Tokens a verification step may hold (the sampled one and its drafts): attention's decode
// kernel, whose rows do not depend on the step's width, takes up to 4 queries.
constexpr int kMaxVerifyTokens = 4;

// Prompt lookup: the k tokens that followed the latest earlier occurrence of the history's last
// n tokens, for n from n_max down to n_min (the first n that matches); fewer where the history
// ends, none without a match.
struct NgramDrafter {
    static constexpr int kMaxN = 4;  // longest n-gram NgramIndex keys
    int n_min = 1, n_max = 3;
    std::vector<int32_t> draft(const std::vector<int32_t>& history, int k) const;
};

// NgramDrafter's answers in O(n_max) a call instead of a scan of the whole history: the latest
// end of every n-gram (n in n_min..n_max) kept in a hash map, extended as the history grows.
// The scan cost ~15-50 us at 4k-16k tokens of context, which a GPU decode step of a small model
// (~250 us) could not hide. Per sequence; the history may only grow between calls (the engine
// appends the tokens a request takes); a shorter one starts the index over.
class NgramIndex {
public:
    explicit NgramIndex(NgramDrafter rule = {});
    std::vector<int32_t> draft(const std::vector<int32_t>& history, int k);

private:
    struct Key {
        std::array<int32_t, NgramDrafter::kMaxN> t{};
        bool operator==(const Key& o) const { return t == o.t; }
    };
    struct KeyHash {
        size_t operator()(const Key& k) const;
    };
    static Key key(const int32_t* last, int n);
    NgramDrafter rule_;
    size_t indexed_ = 0;  // ends e < indexed_ are in by_n_
    std::array<std::unordered_map<Key, int, KeyHash>, NgramDrafter::kMaxN + 1> by_n_;  // [n] n-gram -> its latest end
};

struct VerifyResult {
    int accepted = 0;             // drafts kept
    std::vector<int32_t> tokens;  // [accepted + 1]: the kept drafts, then the greedy token after them
    std::vector<float> logits;    // [accepted + 1, n_vocab]: the row each of `tokens` was picked from
};

// The greedy acceptance rule: how many of `drafts` a verification keeps, given the greedy token
// of each of its rows (greedy[i] follows the step's token i: the sampled one, then the drafts).
// A draft is kept while it equals the greedy token of the row before it, so every kept draft
// is the token plain greedy decode would have picked there.
int accept_greedy(const int32_t* greedy, const std::vector<int32_t>& drafts);

// The speculative sampling rule for a drafter whose drafts are fixed tokens (prompt lookup:
// its draft distribution is a point mass), which keeps the sampler's output distribution
// exactly: draft i (drafts[i], scored by row i, the row before it) is kept with probability
// p_i(drafts[i]), p_i = the sampler's distribution of row i (Sampler::distribution); at the first
// rejection the token is drawn from p_i without drafts[i] (renormalized); when every draft is
// kept, the token after them is drawn from p_k. rows: [drafts.size() + 1, n_vocab]. For a greedy
// sampler this is accept_greedy. A fixed seed does not give plain decode's token stream: the
// rule consumes the generator differently (one uniform draw per draft).
struct SampledAccept {
    int accepted = 0;  // drafts kept
    int32_t next = 0;  // the token after them
};
SampledAccept accept_sampled(Sampler& sampler, const float* rows, int n_vocab, const std::vector<int32_t>& drafts);

// A slot to put back after a verification whose step fed more tokens than are kept.
struct Rollback {
    int slot = 0;
    const StateSnapshot* before = nullptr;  // the slot just before the verification step
    std::vector<int32_t> kept;              // the step's first tokens to keep (may be empty)
};

// Restores each slot to its snapshot, then brings it to its kept tokens: where `log` holds the
// verification step that fed them (runtime/gdn_replay.h) and the backend replays GDN ops, by
// running the GDN ops alone again on the logged rows (the KV rows are the verification's); else
// by running the kept tokens again, all such slots in one serial step without logits. The
// serial kernel's bits do not depend on how a slot's tokens are split, so either way each slot
// ends exactly as plain decode steps of its kept tokens would leave it. ALLOY_SPEC_REPLAY=0
// (read once) always re-runs, for A/B.
void roll_back(const ModelRunner& m, SlotStateCache& cache, const std::vector<Rollback>& slots,
               const ForwardOptions& opts, const GdnReplayLog* log = nullptr);

// Feeds `next` (sampled, not yet in the slot) and `drafts` (at most kMaxVerifyTokens - 1) at
// the slot's position in one serial step, keeps drafts by accept_greedy, and leaves the slot as
// 1 + accepted plain decode steps from `next` would (roll_back after a rejection). The engine's
// scheduler runs the same pieces for many slots in one step (runtime/engine.cpp).
VerifyResult verify_greedy(const ModelRunner& m, SlotStateCache& cache, int slot, int32_t next,
                           const std::vector<int32_t>& drafts, const ForwardOptions& opts);

}  // namespace alloy
