// alloy run: generate text from a prompt, streaming it to stdout; tokens/s on stderr.
#include <chrono>
#include <cstdio>

#include "alloy/error.h"
#include "cli/common.h"
#include "runtime/loaded_model.h"
#include "runtime/sampler.h"

namespace alloy::cli {

void add_run_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("run", "generate text (default model: a tiny synthetic one)");
    static EngineOptions eo;
    static std::string prompt, ids_text;
    static int n_predict = 64;
    static SamplerParams sp;
    static bool print_ids = false, chat = false, no_think = false, ignore_eos = false;
    eo.add_to(cmd, false);
    cmd->add_option("-p,--prompt", prompt, "prompt text");
    cmd->add_option("--ids", ids_text, "prompt as token ids instead of text");
    cmd->add_option("-n,--n-predict", n_predict, "tokens to generate")->capture_default_str();
    cmd->add_option("--temp", sp.temp, "temperature (0 = greedy)")->capture_default_str();
    cmd->add_option("--top-k", sp.top_k, "top-k (0 = off)")->capture_default_str();
    cmd->add_option("--top-p", sp.top_p, "top-p (1 = off)")->capture_default_str();
    cmd->add_option("--min-p", sp.min_p, "min-p (0 = off)")->capture_default_str();
    cmd->add_option("--seed", sp.seed, "sampling seed")->capture_default_str();
    cmd->add_flag("--print-ids", print_ids, "print generated token ids instead of text");
    cmd->add_flag("--chat", chat, "wrap the prompt in the chat template (user turn)");
    cmd->add_flag("--no-think", no_think, "with --chat: thinking off");
    cmd->add_flag("--ignore-eos", ignore_eos, "keep generating past end-of-generation tokens");
    cmd->callback([] {
        const ForwardOptions fo = eo.forward_options();
        if (n_predict < 0) throw Error("-n must be >= 0");
        if (prompt.empty() == ids_text.empty()) throw Error("give exactly one of -p/--prompt and --ids");
        Sampler sampler(sp);
        LoadedModel lm = load_model(eo.model_path(), eo.tensor_data());
        std::vector<int32_t> ids;
        if (!ids_text.empty()) {
            ids = parse_ids(ids_text);
        } else {
            const Tokenizer& tok = lm.require_tokenizer();
            const std::string text = chat ? apply_chat_template({{"user", prompt, ""}}, true, !no_think) : prompt;
            ids = tok.encode(text, /*parse_special=*/chat);
        }
        if (ids.empty()) throw Error("the prompt is empty after tokenization");
        if (int64_t(ids.size()) + n_predict > eo.ctx)
            throw Error("prompt (" + std::to_string(ids.size()) + " tokens) + -n " + std::to_string(n_predict) +
                        " exceeds the context size of " + std::to_string(eo.ctx) + " (raise --ctx)");
        const Qwen35Model& model = *lm.model;
        const int V = model.hparams().n_vocab;
        SequenceState st = model.new_state(eo.ctx, eo.kv_types());
        std::vector<float> logits(static_cast<size_t>(V));

        using clock = std::chrono::steady_clock;
        const auto t0 = clock::now();
        model.forward(st, ids.data(), int(ids.size()), fo, logits.data());
        const auto t1 = clock::now();
        std::optional<StreamDecoder> dec;
        if (!print_ids) dec.emplace(lm.require_tokenizer());
        ForwardOptions step = fo;
        step.gdn_mode = ref::GdnMode::Serial;  // decode runs the serial kernel
        int generated = 0;
        for (int i = 0; i < n_predict; ++i) {
            const int32_t next = sampler.sample(logits.data(), V);
            ++generated;
            if (print_ids) std::printf(i ? " %d" : "%d", next);
            else std::fputs(dec->push(next).c_str(), stdout);
            std::fflush(stdout);
            if (!ignore_eos && lm.tokenizer && lm.tokenizer->is_end_of_generation(next)) break;
            if (i + 1 < n_predict) model.forward(st, &next, 1, step, logits.data());
        }
        if (dec) std::fputs(dec->flush().c_str(), stdout);
        std::printf("\n");
        const auto t2 = clock::now();
        const double pp_s = std::chrono::duration<double>(t1 - t0).count();
        const double tg_s = std::chrono::duration<double>(t2 - t1).count();
        std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tok/s); generated: %d tokens in %.3f s (%.1f tok/s)\n",
                     ids.size(), pp_s, double(ids.size()) / pp_s, generated, tg_s,
                     generated > 1 ? double(generated - 1) / tg_s : 0.0);
    });
}

}  // namespace alloy::cli
