#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "alloy/error.h"
#include "kernels/ref/top_k.h"

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
    const int n = candidates_needed(n_vocab);
    values_.resize(size_t(n));
    ids_.resize(size_t(n));
    ref::top_k(logits, 1, n_vocab, n, values_.data(), ids_.data(), &keys_);
    return sample_top(values_.data(), ids_.data(), n);
}

int32_t Sampler::sample_top(const float* values, const int32_t* ids, int n_given) {
    if (is_greedy(p_)) return ids[0];
    keep_candidates(values, n_given);
    std::discrete_distribution<size_t> dist(w_.begin(), w_.end());
    return ids[dist(rng_)];
}

void Sampler::distribution(const float* logits, int n_vocab, std::vector<int32_t>& ids, std::vector<double>& probs) {
    if (is_greedy(p_)) {
        ids.assign(1, greedy_token(logits, n_vocab));
        probs.assign(1, 1.0);
        return;
    }
    const int n = candidates_needed(n_vocab);
    values_.resize(size_t(n));
    ids_.resize(size_t(n));
    ref::top_k(logits, 1, n_vocab, n, values_.data(), ids_.data(), &keys_);
    const size_t keep = keep_candidates(values_.data(), n);
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += w_[i];
    ids.assign(ids_.begin(), ids_.begin() + long(keep));
    probs.resize(keep);
    for (size_t i = 0; i < keep; ++i) probs[i] = w_[i] / sum;
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

size_t Sampler::draw(const std::vector<double>& weights) {
    std::discrete_distribution<size_t> dist(weights.begin(), weights.end());
    return dist(rng_);
}

size_t Sampler::keep_candidates(const float* values, int n_given) {
    const size_t n = size_t(p_.top_k > 0 ? std::min(p_.top_k, n_given) : n_given);
    // Softmax at temperature 1 for the top-p / min-p cuts (as llama.cpp's chain does).
    prob_.resize(n);
    const double mx = values[0];
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += (prob_[i] = std::exp(double(values[i]) - mx));
    size_t keep = n;
    if (p_.top_p < 1) {
        double cum = 0;
        for (size_t i = 0; i < n; ++i) {
            cum += prob_[i] / sum;
            if (cum >= p_.top_p) { keep = i + 1; break; }
        }
    }
    if (p_.min_p > 0) {
        size_t m = 1;
        while (m < keep && prob_[m] >= p_.min_p * prob_[0]) ++m;
        keep = m;
    }
    w_.resize(keep);
    for (size_t i = 0; i < keep; ++i) w_[i] = std::exp((double(values[i]) - mx) / p_.temp);
    return keep;
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
