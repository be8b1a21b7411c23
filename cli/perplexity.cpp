// alloy perplexity: llama-perplexity's method. The text is cut into consecutive chunks of
// the context size; each chunk runs from an empty state and only its second half is scored
// (every token there has at least n_ctx/2 tokens of context). Output format as llama-perplexity.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/common.h"

namespace alloy::cli {

void add_perplexity_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("perplexity", "perplexity of a text file (llama-perplexity's method)");
    static ModelOptions eo;
    static std::string file;
    static int max_chunks = -1;
    eo.ctx = 512;
    eo.add_to(cmd, true);
    cmd->add_option("-f,--file", file, "text file")->required();
    cmd->add_option("--chunks", max_chunks, "stop after this many chunks (-1 = all)");
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
        int64_t count = 0;
        for (int c = 0; c < n_chunk; ++c) {
            const int32_t* chunk = tokens.data() + size_t(c) * size_t(n_ctx);
            const std::vector<float> logits = engine.evaluate(std::vector<int32_t>(chunk, chunk + n_ctx));
            for (int i = first; i < n_ctx - 1; ++i) {
                const float* row = logits.data() + size_t(i) * size_t(V);
                const double logp = double(row[chunk[i + 1]]) - log_sum_exp(row, V);
                nll += -logp;
                nll2 += logp * logp;
                ++count;
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
    });
}

}  // namespace alloy::cli
