#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "alloy/error.h"

namespace alloy {

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {
    if (!(p.temp >= 0)) throw Error("--temp must be >= 0");
    if (p.top_k < 0) throw Error("--top-k must be >= 0");
    if (!(p.top_p > 0 && p.top_p <= 1)) throw Error("--top-p must be in (0, 1]");
    if (!(p.min_p >= 0 && p.min_p < 1)) throw Error("--min-p must be in [0, 1)");
}

int32_t greedy_token(const float* logits, int n_vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (std::isnan(logits[best])) break;  // nothing ranks above the first NaN
        if (std::isnan(logits[i]) || logits[i] > logits[best]) best = i;
    }
    return best;
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
    if (is_greedy(p_)) return greedy_token(logits, n_vocab);
    cand_.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) cand_[size_t(i)] = {logits[i], i};
    auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
    size_t n = cand_.size();
    if (p_.top_k > 0 && size_t(p_.top_k) < n) {
        std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
        n = size_t(p_.top_k);
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    // Softmax at temperature 1 for the top-p / min-p cuts (as llama.cpp's chain does).
    std::vector<double> prob(n);
    const double mx = cand_[0].first;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += (prob[i] = std::exp(double(cand_[i].first) - mx));
    size_t keep = n;
    if (p_.top_p < 1) {
        double cum = 0;
        for (size_t i = 0; i < n; ++i) {
            cum += prob[i] / sum;
            if (cum >= p_.top_p) { keep = i + 1; break; }
        }
    }
    if (p_.min_p > 0) {
        size_t m = 1;
        while (m < keep && prob[m] >= p_.min_p * prob[0]) ++m;
        keep = m;
    }
    std::vector<double> w(keep);
    for (size_t i = 0; i < keep; ++i) w[i] = std::exp((double(cand_[i].first) - mx) / p_.temp);
    std::discrete_distribution<size_t> dist(w.begin(), w.end());
    return cand_[dist(rng_)].second;
}

double log_sum_exp(const float* x, int n) {
    float mx = x[0];
    for (int i = 1; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
    return double(mx) + std::log(sum);
}

TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t id, int top) {
    if (n_vocab <= 0 || id < 0 || id >= n_vocab) throw Error("token_logprob: id " + std::to_string(id) + " outside the vocabulary");
    top = std::clamp(top, 0, std::min(n_vocab, kMaxTopLogprobs));
    const double lse = log_sum_exp(logits, n_vocab);
    TokenLogprob t;
    t.id = id;
    t.logprob = float(double(logits[id]) - lse);
    if (top > 0) {
        std::vector<int32_t> idx(static_cast<size_t>(n_vocab), 0);
        for (int i = 0; i < n_vocab; ++i) idx[size_t(i)] = i;
        auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
        std::partial_sort(idx.begin(), idx.begin() + top, idx.end(), more_likely);
        for (int k = 0; k < top; ++k) t.top.emplace_back(idx[size_t(k)], float(double(logits[idx[size_t(k)]]) - lse));
    }
    return t;
}

}  // namespace alloy
