// alloy perplexity: llama-perplexity's method. The text is cut into consecutive chunks of
// the context size; each chunk runs from an empty state and only its second half is scored
// (every token there has at least n_ctx/2 tokens of context). Output format as llama-perplexity.
// --mtp adds the MTP head's teacher-forced figures on the same scored positions, as
// scripts/train_tiny_default.py measures them: its top-1 agreement with the main head's greedy
// next-next token, its top-1 accuracy on that token, and the main head's top-1 accuracy.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/common.h"

namespace alloy::cli {

namespace {
// The first id of the largest logit (torch's argmax and the samplers' greedy token agree on ties).
int greedy_id(const float* row, int V) {
    int best = 0;
    for (int v = 1; v < V; ++v)
        if (row[v] > row[best]) best = v;
    return best;
}
}  // namespace

void add_perplexity_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("perplexity", "perplexity of a text file (llama-perplexity's method)");
    static ModelOptions eo;
    static std::string file;
    static int max_chunks = -1;
    static bool mtp = false;
    eo.ctx = 512;
    eo.add_to(cmd, true);
    cmd->add_option("-f,--file", file, "text file")->required();
    cmd->add_option("--chunks", max_chunks, "stop after this many chunks (-1 = all)");
    cmd->add_flag("--mtp", mtp, "also the MTP head's top-1 agreement and accuracy (teacher-forced)");
    cmd->callback([] {
        std::ifstream in(file, std::ios::binary);
        if (!in) throw Error(file + ": cannot open");
        std::stringstream ss;
        ss << in.rdbuf();
        const int n_ctx = eo.ctx;
        if (n_ctx < 4) throw Error("-c must be at least 4 for perplexity");
        Engine engine(eo.engine_options(1));
        const std::vector<int32_t> tokens = engine.tokenize(ss.str(), false);
        if (int64_t(tokens.size()) < 2 * int64_t(n_ctx))
            throw Error(file + ": " + std::to_string(tokens.size()) + " tokens; need at least " +
                        std::to_string(2 * n_ctx) + " (2 * context) to compute perplexity");
        int n_chunk = int(tokens.size() / size_t(n_ctx));
        if (max_chunks > 0 && max_chunks < n_chunk) n_chunk = max_chunks;
        std::fprintf(stderr, "perplexity: calculating perplexity over %d chunks, n_ctx=%d\n", n_chunk, n_ctx);

        const int V = engine.n_vocab();
        const int first = n_ctx / 2;
        double nll = 0, nll2 = 0;
        int64_t count = 0, m_count = 0, agree = 0, mtp_hit = 0, main_hit = 0;
        for (int c = 0; c < n_chunk; ++c) {
            const int32_t* chunk = tokens.data() + size_t(c) * size_t(n_ctx);
            const std::vector<float> logits = engine.evaluate(std::vector<int32_t>(chunk, chunk + n_ctx));
            for (int i = first; i < n_ctx - 1; ++i) {
                const float* row = logits.data() + size_t(i) * size_t(V);
                const double logp = double(row[chunk[i + 1]]) - log_sum_exp(row, V);
                nll += -logp;
                nll2 += logp * logp;
                ++count;
                main_hit += greedy_id(row, V) == chunk[i + 1];
            }
            if (mtp) {  // row i of the MTP head predicts token i + 2 (scripts/train_tiny_default.py's positions)
                const std::vector<float> ml = engine.evaluate_mtp(std::vector<int32_t>(chunk, chunk + n_ctx));
                for (int i = first; i < n_ctx - 2; ++i) {
                    const int top = greedy_id(ml.data() + size_t(i) * size_t(V), V);
                    agree += top == greedy_id(logits.data() + size_t(i + 1) * size_t(V), V);
                    mtp_hit += top == chunk[i + 2];
                    ++m_count;
                }
            }
            std::printf("[%d]%.4lf,", c + 1, std::exp(nll / double(count)));
            std::fflush(stdout);
        }
        std::printf("\n");
        const double mean = nll / double(count);
        const double ppl = std::exp(mean);
        double var = nll2 / double(count) - mean * mean;
        if (var > 0 && count > 1) {
            const double err = std::sqrt(var / double(count - 1));
            std::printf("Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, err * ppl);
        } else {
            std::printf("Final estimate: PPL = %.4lf\n", ppl);
        }
        if (mtp)
            std::printf("MTP head over %lld positions: top-1 agreement with the main head's next-next token %.4f, "
                        "top-1 accuracy %.4f; main head top-1 accuracy %.4f\n",
                        (long long)m_count, double(agree) / double(m_count), double(mtp_hit) / double(m_count),
                        double(main_hit) / double(count));
    });
}

}  // namespace alloy::cli
