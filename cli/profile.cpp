// alloy profile: per-kernel time table of one prefill of -p tokens and of -n decode steps after
// it (kernel, calls, total ms, share, mean), the kernel sum against the wall clock, and an
// optional Chrome trace (--trace out.json, open in chrome://tracing or Perfetto).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "alloy/error.h"
#include "cli/common.h"
#include "runtime/engine_options.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/loaded_model.h"

namespace alloy::cli {
namespace {

void print_table(const char* title, const Profiler& prof, double wall_ms) {
    std::printf("\n%s\n", title);
    std::printf("| kernel | calls | total ms | share | mean ms |\n| --- | ---: | ---: | ---: | ---: |\n");
    const double sum = prof.total_ms();
    for (const auto& r : prof.rows())
        std::printf("| %s | %lld | %.3f | %.1f%% | %.4f |\n", r.kernel.c_str(), (long long)r.calls, r.total_ms,
                    100.0 * r.total_ms / sum, r.total_ms / double(r.calls));
    std::printf("kernel sum %.3f ms, wall %.3f ms (kernels account for %.1f%% of the wall clock)\n", sum, wall_ms,
                100.0 * sum / wall_ms);
}

}  // namespace

void add_profile_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("profile", "per-kernel time table of a prefill and a decode step");
    static ModelOptions eo;
    static int n_prompt = 512, depth = 0, n_gen = 1;
    static std::string trace;
    eo.add_to(cmd, false);
    cmd->add_option("-p,--n-prompt", n_prompt, "prefill tokens")->capture_default_str();
    cmd->add_option("-n,--n-gen", n_gen, "decode steps profiled after the prefill (tg128: -n 128)")
        ->capture_default_str();
    cmd->add_option("-d,--n-depth", depth, "context before the profiled prefill")->capture_default_str();
    cmd->add_option("--trace", trace, "write a Chrome trace JSON of every kernel launch");
    cmd->callback([] {
        const EngineOptions e = eo.engine_options(1);  // validated, flags named
        ForwardOptions fo = forward_options(e);
        if (n_prompt < 1) throw Error("-p must be >= 1");
        if (n_gen < 1) throw Error("-n must be >= 1");
        LoadedModel lm = load_model(e.model_path, tensor_placement(e), e.backend, e.tensor_parallel, e.expert_parallel);
        const ModelRunner& m = *lm.runner;
        const int V = m.hparams().n_vocab;
        ModelState st = m.new_state(depth + n_prompt + n_gen + 1, kv_cache_types(e));
        std::vector<float> logits(static_cast<size_t>(V));
        std::mt19937 rng(7);
        std::vector<int32_t> ids(size_t(depth + n_prompt + n_gen));
        for (auto& id : ids) id = int32_t(rng() % uint32_t(V));
        ForwardOptions step = fo;
        step.gdn_mode = ref::GdnMode::Serial;

        // Warm-up: build the plans and fault in the weights, so the table shows steady state.
        if (depth) m.forward(st, ids.data(), depth, fo, logits.data());
        m.forward(st, ids.data() + depth, n_prompt, fo, logits.data());
        m.forward(st, &ids[size_t(depth + n_prompt)], 1, step, logits.data());

        using clock = std::chrono::steady_clock;
        Profiler prefill, decode;
        st.reset();
        if (depth) m.forward(st, ids.data(), depth, fo, logits.data());
        prefill.set_phase(1, "prefill " + std::to_string(n_prompt));
        auto t0 = clock::now();
        m.forward(st, ids.data() + depth, n_prompt, fo, logits.data(), &prefill);
        const double pp_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
        decode.set_phase(2, n_gen == 1 ? "decode step" : "decode " + std::to_string(n_gen) + " steps");
        t0 = clock::now();
        for (int i = 0; i < n_gen; ++i)
            m.forward(st, &ids[size_t(depth + n_prompt + i)], 1, step, logits.data(), &decode);
        const double tg_ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();

        std::printf("model %s, %d threads, gdn %s (chunk %d), depth %d, KV cache %s/%s\n", eo.model_path().c_str(),
                    cpu::n_threads(), eo.gdn.c_str(), eo.chunk, depth, eo.cache_type_k.c_str(), eo.cache_type_v.c_str());
        const std::string t1 = "prefill of " + std::to_string(n_prompt) + " tokens (bucket " +
                               std::to_string(ModelRunner::bucket_for(std::min(n_prompt, fo.max_batch), fo)) + "): " +
                               std::to_string(1000.0 * n_prompt / pp_ms) + " tok/s";
        print_table(t1.c_str(), prefill, pp_ms);
        const std::string t2 = (n_gen == 1 ? std::string("decode step") : std::to_string(n_gen) + " decode steps") +
                               " from position " + std::to_string(depth + n_prompt) + ": " +
                               std::to_string(1000.0 * n_gen / tg_ms) + " tok/s";
        print_table(t2.c_str(), decode, tg_ms);
        if (!trace.empty()) {
            std::ofstream out(trace);
            if (!out) throw Error(trace + ": cannot open for writing");
            // One trace with both phases: merge by writing the prefill events then the decode ones.
            std::string a = prefill.chrome_trace_json(), b = decode.chrome_trace_json();
            const auto a_end = a.rfind("\n]}");
            const auto b_start = b.find('[') + 1;
            out << a.substr(0, a_end) << ",\n" << b.substr(b_start + 1);
            std::fprintf(stderr, "wrote %s\n", trace.c_str());
        }
    });
}

}  // namespace alloy::cli
