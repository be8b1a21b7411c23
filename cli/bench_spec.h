// alloy bench --spec: speculative decoding's speed and acceptance on a text prompt (issue 21).
#pragma once
#include <string>
#include <vector>

namespace alloy::cli {

struct SpecBenchArgs {
    std::string model_path, backend = "cpu", prompt_file;
    std::string draft_model;          // --draft-model: the drafter "draft"'s
    int threads = 0, reps = 3;
    std::vector<int> gens;            // -n: generated tokens per request
    std::vector<std::string> modes;   // --spec: drafters (ngram, mtp, draft)
    std::vector<int> ks;              // --spec-k: drafts per step
};

// For each generation size, the same greedy request (the prompt file's tokens, then n tokens,
// end-of-generation ignored) runs -r times through an engine without drafts and one per
// (drafter, K); the first repetition is cold and reported apart. Prints a markdown table:
// decode t/s (median of the warm repetitions, +- stddev), the ratio to plain decode, drafts
// accepted overall and per draft position, tokens per decode step, and whether every run's
// tokens equal plain decode's (speculation is exact: anything else is a bug, and the command
// then exits non-zero). Throws naming the flag or file that is wrong.
void run_spec_bench(const SpecBenchArgs& a);

}  // namespace alloy::cli
