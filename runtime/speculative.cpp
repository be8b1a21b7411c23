#include "runtime/speculative.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "alloy/error.h"
#include "runtime/batch.h"
#include "runtime/sampler.h"

namespace alloy {

std::vector<int32_t> NgramDrafter::draft(const std::vector<int32_t>& h, int k) const {
    const int len = int(h.size());
    for (int n = std::min(n_max, len - 1); n >= std::max(1, n_min); --n) {
        // The latest earlier end e (e < len - 1) with h[e - n + 1 .. e] == the last n tokens.
        for (int e = len - 2; e >= n - 1; --e) {
            if (!std::equal(h.end() - n, h.end(), h.begin() + (e - n + 1))) continue;
            const int take = std::min(k, len - 1 - e);
            return std::vector<int32_t>(h.begin() + e + 1, h.begin() + e + 1 + take);
        }
    }
    return {};
}

NgramIndex::NgramIndex(NgramDrafter rule) : rule_(rule) {
    if (rule_.n_max > NgramDrafter::kMaxN || rule_.n_min < 1 || rule_.n_min > rule_.n_max)
        throw Error("prompt lookup: n-gram lengths must satisfy 1 <= n_min <= n_max <= " + std::to_string(NgramDrafter::kMaxN) +
                    ", got " + std::to_string(rule_.n_min) + ".." + std::to_string(rule_.n_max));
}

size_t NgramIndex::KeyHash::operator()(const Key& k) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int32_t t : k.t) h = (h ^ uint32_t(t)) * 0x100000001b3ull, h ^= h >> 29;
    return size_t(h);
}

NgramIndex::Key NgramIndex::key(const int32_t* last, int n) {
    Key k;
    k.t.fill(-1);
    std::copy(last, last + n, k.t.begin());
    return k;
}

std::vector<int32_t> NgramIndex::draft(const std::vector<int32_t>& h, int k) {
    const size_t len = h.size();
    if (len < indexed_ + 1 && indexed_ > 0) {  // the history shrank: start over
        for (auto& m : by_n_) m.clear();
        indexed_ = 0;
    }
    // Earlier ends are e <= len - 2 (NgramDrafter::draft's scan range); the latest one wins.
    for (; indexed_ + 1 < len; ++indexed_) {
        const int e = int(indexed_);
        for (int n = rule_.n_min; n <= rule_.n_max && n <= e + 1; ++n) by_n_[size_t(n)][key(h.data() + e - n + 1, n)] = e;
    }
    const int L = int(len);
    for (int n = std::min(rule_.n_max, L - 1); n >= rule_.n_min; --n) {
        const auto& m = by_n_[size_t(n)];
        const auto it = m.find(key(h.data() + L - n, n));
        if (it == m.end()) continue;
        const int e = it->second, take = std::min(k, L - 1 - e);
        return std::vector<int32_t>(h.begin() + e + 1, h.begin() + e + 1 + take);
    }
    return {};
}

int accept_greedy(const int32_t* greedy, const std::vector<int32_t>& drafts) {
    int a = 0;
    while (a < int(drafts.size()) && drafts[size_t(a)] == greedy[a]) ++a;
    return a;
}

SampledAccept accept_sampled(Sampler& sampler, const float* rows, int n_vocab, const std::vector<int32_t>& drafts) {
    std::vector<int32_t> ids;
    std::vector<double> probs;
    SampledAccept r;
    for (; r.accepted <= int(drafts.size()); ++r.accepted) {
        sampler.distribution(rows + size_t(r.accepted) * size_t(n_vocab), n_vocab, ids, probs);
        if (r.accepted == int(drafts.size())) {  // every draft kept: the token after them
            r.next = ids[sampler.draw(probs)];
            return r;
        }
        const int32_t d = drafts[size_t(r.accepted)];
        const auto at = std::find(ids.begin(), ids.end(), d);
        const double pd = at == ids.end() ? 0.0 : probs[size_t(at - ids.begin())];
        if (pd >= 1.0 || (pd > 0.0 && sampler.uniform() < pd)) continue;  // kept
        // Rejected: the residual max(p - q, 0) with q the point mass at d is p without d.
        if (at != ids.end()) probs[size_t(at - ids.begin())] = 0.0;
        r.next = ids[sampler.draw(probs)];
        return r;
    }
    return r;  // not reached
}

void roll_back(const ModelRunner& m, SlotStateCache& cache, const std::vector<Rollback>& slots,
               const ForwardOptions& opts, const GdnReplayLog* log) {
    static const bool replay = [] {
        const char* e = std::getenv("ALLOY_SPEC_REPLAY");
        return !e || std::string(e) != "0";
    }();
    Batch again;
    for (const Rollback& r : slots) {
        cache.restore(r.slot, *r.before);
        if (r.kept.empty()) continue;
        const int seq = replay && log ? log->usable(r.slot, r.before->n_past, r.kept) : -1;
        if (seq >= 0 && m.replay_gdn(cache.state(), *log, seq, int(r.kept.size()))) {
            cache.state().n_past[size_t(r.slot)] = r.before->n_past + int(r.kept.size());
            continue;
        }
        again.add(r.slot, r.kept.data(), int(r.kept.size()), BatchLogits::None, /*serial=*/true);
    }
    if (again.seqs.empty()) return;
    ForwardOptions fo = opts;
    fo.gdn_mode = ref::GdnMode::Serial;
    fo.gdn_log = nullptr;
    m.forward(cache.state(), again, fo, nullptr);
}

VerifyResult verify_greedy(const ModelRunner& m, SlotStateCache& cache, int slot, int32_t next,
                           const std::vector<int32_t>& drafts, const ForwardOptions& opts) {
    if (int(drafts.size()) >= kMaxVerifyTokens)
        throw Error("verify_greedy: " + std::to_string(drafts.size()) + " drafts; at most " +
                    std::to_string(kMaxVerifyTokens - 1) + " keep a verification bit-identical to decode");
    const size_t V = size_t(m.hparams().n_vocab);
    const StateSnapshot before = cache.snapshot(slot);
    std::vector<int32_t> ids = {next};
    ids.insert(ids.end(), drafts.begin(), drafts.end());
    ForwardOptions fo = opts;
    fo.gdn_mode = ref::GdnMode::Serial;
    GdnReplayLog log;
    fo.gdn_log = &log;
    Batch step;
    step.add(slot, ids.data(), int(ids.size()), BatchLogits::All, /*serial=*/true);
    std::vector<float> rows(ids.size() * V);
    m.forward(cache.state(), step, fo, rows.data());
    std::vector<int32_t> greedy(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) greedy[i] = greedy_token(rows.data() + i * V, int(V));
    VerifyResult r;
    r.accepted = accept_greedy(greedy.data(), drafts);
    r.tokens.assign(greedy.begin(), greedy.begin() + 1 + r.accepted);
    r.logits.assign(rows.begin(), rows.begin() + long(r.tokens.size() * V));
    if (r.accepted < int(drafts.size()))  // back to before the step; the kept tokens again
        roll_back(m, cache, {{slot, &before, std::vector<int32_t>(ids.begin(), ids.begin() + 1 + r.accepted)}}, opts, &log);
    return r;
}

}  // namespace alloy
