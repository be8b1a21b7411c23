// alloy batched-bench: llama.cpp's llama-batched-bench on the batched forward. For every
// (PP, TG, B): B sequences of PP prompt tokens each are prefilled (packed into forward steps of
// at most --batch-size tokens, as llama.cpp's n_ubatch), then TG decode steps run all B sequences
// as one step of B tokens. Columns as llama-batched-bench prints them:
//   N_KV = B * (PP + TG); T_PP, S_PP = B * PP / T_PP; T_TG, S_TG = B * TG / T_TG; T, S = N_KV / T.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "alloy/error.h"
#include "cli/common.h"
#include "runtime/engine_options.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/loaded_model.h"

namespace alloy::cli {

void add_batched_bench_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("batched-bench", "llama-batched-bench: prefill and decode of B sequences at once");
    static ModelOptions eo;
    static std::string npp = "128,256,512", ntg = "128,256", npl = "1,2,4,8,16,32";
    static bool json_lines = false, profile = false;
    eo.add_to(cmd, false);
    cmd->add_option("--npp", npp, "-npp: prompt tokens per sequence (list)")->capture_default_str();
    cmd->add_option("--ntg", ntg, "-ntg: generated tokens per sequence (list)")->capture_default_str();
    cmd->add_option("--npl", npl, "-npl: sequences in parallel (list)")->capture_default_str();
    cmd->add_flag("--profile", profile, "after each row, the decode steps' time per kernel (per step)");
    cmd->add_flag("--output-format-jsonl", json_lines, "also print one JSON line per row (as llama-batched-bench -ojsonl)");
    cmd->callback([] {
        const EngineOptions e = eo.engine_options(1);  // validated, flags named
        const ForwardOptions fo = forward_options(e);
        const auto pps = parse_int_list(npp, "-npp", 1), tgs = parse_int_list(ntg, "-ntg", 0),
                   pls = parse_int_list(npl, "-npl", 1);
        LoadedModel lm = load_model(e.model_path, tensor_placement(e), e.backend, e.tensor_parallel, e.expert_parallel);
        const ModelRunner& m = *lm.runner;
        const int V = m.hparams().n_vocab;
        int max_pl = 0, max_ctx = 0;
        for (int pl : pls) max_pl = std::max(max_pl, pl);
        for (int pp : pps)
            for (int tg : tgs) max_ctx = std::max(max_ctx, pp + tg);
        ModelState st = m.new_state(max_ctx, kv_cache_types(e), max_pl);
        std::mt19937 rng(1);
        std::vector<int32_t> prompt;
        std::vector<float> logits;
        ForwardOptions dec = fo;
        dec.gdn_mode = ref::GdnMode::Serial;
        using clock = std::chrono::steady_clock;
        auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };

        // Prefill of `pl` sequences of `pp` tokens, packed into steps of at most fo.max_batch
        // tokens; a sequence longer than that is a step of its own (run in pieces).
        auto prefill = [&](int pl, int pp) {
            for (int s = 0; s < pl;) {
                Batch b;
                int tokens = 0;
                do {
                    prompt.resize(size_t(pp));
                    for (auto& id : prompt) id = int32_t(rng() % uint32_t(V));
                    b.add(s, prompt.data(), pp, BatchLogits::Last, false);
                    tokens += pp;
                    ++s;
                } while (s < pl && tokens + pp <= fo.max_batch);
                logits.resize(size_t(b.logit_rows()) * size_t(V));
                m.forward(st, b, fo, logits.data());
            }
        };
        Profiler prof;
        auto decode = [&](int pl, int tg) {
            Batch b;
            for (int s = 0; s < pl; ++s) b.seqs.push_back({s, 1, BatchLogits::Last, true});
            b.ids.assign(size_t(pl), 0);
            logits.resize(size_t(pl) * size_t(V));
            for (int i = 0; i < tg; ++i) {
                for (auto& id : b.ids) id = int32_t(rng() % uint32_t(V));
                m.forward(st, b, dec, logits.data(), profile ? &prof : nullptr);
            }
        };
        // Warm-up (plans of the first buckets, pages of the weights), not measured.
        st.reset();
        prefill(std::min(2, max_pl), std::min(16, max_ctx));
        decode(std::min(2, max_pl), 2);

        std::printf("\nmain: n_kv_max = %d, n_batch = %d, n_ubatch = %d, is_pp_shared = 0, n_threads = %d, model = %s\n\n",
                    max_ctx * max_pl, fo.max_batch, fo.max_batch, cpu::n_threads(), eo.model_path().c_str());
        std::printf("|%6s | %6s | %4s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |\n", "PP", "TG", "B", "N_KV", "T_PP s",
                    "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s");
        std::printf("|%6s-|-%6s-|-%4s-|-%6s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|\n", "------", "------", "----", "------",
                    "--------", "--------", "--------", "--------", "--------", "--------");
        std::fflush(stdout);
        for (int pp : pps)
            for (int tg : tgs)
                for (int pl : pls) {
                    st.reset();
                    const auto t0 = clock::now();
                    prefill(pl, pp);
                    const auto t1 = clock::now();
                    prof.clear();
                    decode(pl, tg);
                    const auto t2 = clock::now();
                    const double t_pp = seconds(t0, t1), t_tg = seconds(t1, t2), t = seconds(t0, t2);
                    const long n_kv = long(pl) * (pp + tg);
                    const double s_pp = pl * double(pp) / t_pp, s_tg = tg ? pl * double(tg) / t_tg : 0.0;
                    std::printf("|%6d | %6d | %4d | %6ld | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n", pp, tg, pl,
                                n_kv, t_pp, s_pp, t_tg, s_tg, t, double(n_kv) / t);
                    if (json_lines)
                        std::printf("{\"n_kv_max\": %d, \"n_batch\": %d, \"n_ubatch\": %d, \"is_pp_shared\": 0, "
                                    "\"n_threads\": %d, \"pp\": %d, \"tg\": %d, \"pl\": %d, \"n_kv\": %ld, \"t_pp\": %f, "
                                    "\"speed_pp\": %f, \"t_tg\": %f, \"speed_tg\": %f, \"t\": %f, \"speed\": %f}\n",
                                    max_ctx * max_pl, fo.max_batch, fo.max_batch, cpu::n_threads(), pp, tg, pl, n_kv,
                                    t_pp, s_pp, t_tg, s_tg, t, double(n_kv) / t);
                    if (profile && tg > 0) {
                        std::printf("|   decode steps of %d sequences, per step:", pl);
                        for (const auto& r : prof.rows())
                            std::printf(" %s %.2f ms,", r.kernel.c_str(), r.total_ms / tg);
                        std::printf("\n");
                    }
                    std::fflush(stdout);
                }
    });
}

}  // namespace alloy::cli
