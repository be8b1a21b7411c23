// Token sampling as llama.cpp users know it: greedy at temperature 0, else
// top-k -> top-p -> min-p -> temperature -> seeded draw.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "alloy/engine.h"

namespace alloy {

struct SamplerParams {
    float temp = 0.8f;   // 0 = greedy
    int top_k = 40;      // 0 = off
    float top_p = 0.95f; // 1 = off
    float min_p = 0.05f; // 0 = off
    uint64_t seed = 0;
};

// The greedy token of logits [n_vocab]: the largest logit, the lowest id on ties, a NaN above
// +inf (the rule of cuda::argmax, so a greedy token is the same whether the device or the
// host picks it).
int32_t greedy_token(const float* logits, int n_vocab);

// Whether p samples greedily (temperature 0): its token is greedy_token's.
inline bool is_greedy(const SamplerParams& p) { return p.temp == 0; }

class Sampler {
public:
    explicit Sampler(const SamplerParams& p);
    int32_t sample(const float* logits, int n_vocab);  // ties break to the lowest id
    bool greedy() const { return is_greedy(p_); }
    // How many of a row's most likely tokens sample_top needs: top_k's, or the whole vocabulary
    // when top-k is off (top-p then reaches over every token).
    int candidates_needed(int n_vocab) const { return p_.top_k > 0 && p_.top_k < n_vocab ? p_.top_k : n_vocab; }
    // The same draw as sample(logits) from the row's first n >= candidates_needed pairs in
    // ref::top_k's order (values, ids [n]; a GPU sends only those), for a non-greedy sampler.
    int32_t sample_top(const float* values, const int32_t* ids, int n);
    // The distribution sample() draws from for logits [n_vocab]: the kept candidates' ids and
    // their probabilities (summing to 1); greedy: the greedy token with probability 1.
    void distribution(const float* logits, int n_vocab, std::vector<int32_t>& ids, std::vector<double>& probs);
    // Draws from the sampler's generator, for the speculative acceptance rule
    // (runtime/speculative.h accept_sampled): uniform in [0, 1), and an index by weights.
    double uniform();
    size_t draw(const std::vector<double>& weights);

private:
    // The kept candidates of values / ids [n_given] (ref::top_k's order) and their weights w_.
    size_t keep_candidates(const float* values, int n_given);
    SamplerParams p_;
    std::mt19937_64 rng_;
    std::vector<float> values_;
    std::vector<int32_t> ids_;
    std::vector<uint64_t> keys_;  // ref::top_k's scratch
    std::vector<double> prob_, w_;
};

// The log-probability of `id` under logits [n_vocab] (log-softmax in double) and the `top` most
// likely ids (largest logit first, the lower id on ties).
TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t id, int top);

}  // namespace alloy
