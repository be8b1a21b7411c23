// alloy run: generate text from a prompt, streaming it to stdout; tokens/s on stderr.
#include <cstdio>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/common.h"

namespace alloy::cli {

void add_run_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("run", "generate text (default model: a tiny synthetic one)");
    static ModelOptions eo;
    static SpecOptions spec;
    static std::string prompt, ids_text;
    static int n_predict = 64;
    static SamplingOptions sp;
    static bool print_ids = false, chat = false, no_think = false, ignore_eos = false;
    eo.add_to(cmd, false);
    spec.add_to(cmd);
    cmd->add_option("-p,--prompt", prompt, "prompt text");
    cmd->add_option("--ids", ids_text, "prompt as token ids instead of text");
    cmd->add_option("-n,--n-predict", n_predict, "tokens to generate")->capture_default_str();
    cmd->add_option("--temp", sp.temperature, "temperature (0 = greedy)")->capture_default_str();
    cmd->add_option("--top-k", sp.top_k, "top-k (0 = off)")->capture_default_str();
    cmd->add_option("--top-p", sp.top_p, "top-p (1 = off)")->capture_default_str();
    cmd->add_option("--min-p", sp.min_p, "min-p (0 = off)")->capture_default_str();
    cmd->add_option("--seed", sp.seed, "sampling seed")->capture_default_str();
    cmd->add_flag("--print-ids", print_ids, "print generated token ids instead of text");
    cmd->add_flag("--chat", chat, "wrap the prompt in the chat template (user turn)");
    cmd->add_flag("--no-think", no_think, "with --chat: thinking off");
    cmd->add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-generation tokens");
    cmd->callback([] {
        if (n_predict < 0) throw Error("-n must be >= 0");
        if (prompt.empty() == ids_text.empty()) throw Error("give exactly one of -p/--prompt and --ids");
        spec.validate();  // before the model loads
        EngineOptions options = eo.engine_options(1);
        spec.apply(options);
        Engine engine(options);
        GenerationRequest req;
        if (!ids_text.empty()) {
            req.prompt = parse_ids(ids_text);
        } else {
            const std::string text = chat ? engine.chat_prompt({{"user", prompt, "", {}}}, true, !no_think) : prompt;
            req.prompt = engine.tokenize(text, /*parse_special=*/chat);
        }
        req.max_tokens = n_predict;
        req.sampling = sp;
        req.ignore_eos = ignore_eos;
        req.text = !print_ids;
        int shown = 0;
        const size_t n_prompt = req.prompt.size();
        const GenerationResult r = engine.generate(
            std::move(req),
            [&](const std::string& text) {
                if (!print_ids) std::fputs(text.c_str(), stdout), std::fflush(stdout);
                return true;
            },
            [&](int32_t id) {
                if (print_ids) std::printf(shown++ ? " %d" : "%d", id), std::fflush(stdout);
            });
        std::printf("\n");
        const int generated = int(r.ids.size());
        std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tok/s); generated: %d tokens in %.3f s (%.1f tok/s)",
                     n_prompt, r.prompt_seconds, double(n_prompt) / r.prompt_seconds, generated, r.generate_seconds,
                     generated > 1 ? double(generated - 1) / r.generate_seconds : 0.0);
        if (spec.mode != "off")
            std::fprintf(stderr, "; spec %s: %d of %d drafts accepted (%.1f%%)", spec.mode.c_str(), r.n_accepted,
                         r.n_drafted, r.n_drafted ? 100.0 * r.n_accepted / r.n_drafted : 0.0);
        std::fprintf(stderr, "\n");
    });
}

}  // namespace alloy::cli
