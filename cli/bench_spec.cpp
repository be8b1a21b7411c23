#include "cli/bench_spec.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "cli/bench_stats.h"
#include "cli/common.h"

namespace alloy::cli {

namespace {

std::string read_prompt(const std::string& path) {
    if (path.empty()) throw Error("--spec needs --spec-prompt FILE: drafts from prompt lookup need real text, not random ids");
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("--spec-prompt: cannot read '" + path + "'");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (text.empty()) throw Error("--spec-prompt: '" + path + "' is empty");
    return text;
}

struct Row {
    std::string mode;
    int k = 0, n = 0;
    double cold_ts = 0;
    std::vector<double> ts;          // warm repetitions
    GenerationResult last;           // the last repetition (acceptance counts are the same in every one)
    bool identical = true;           // every repetition's ids equal plain decode's
};

}  // namespace

void run_spec_bench(const SpecBenchArgs& a) {
    for (const std::string& m : a.modes)  // run|serve's rule, which names --spec / --spec-k
        for (int k : a.ks) {
            if (m == "off") throw Error("--spec: 'off' is the baseline every bench --spec row is compared with; name a drafter (ngram)");
            SpecOptions{m, k, m == "draft" ? a.draft_model : ""}.validate();
        }
    const std::string text = read_prompt(a.prompt_file);
    int max_n = 1;
    for (int n : a.gens) max_n = std::max(max_n, n);

    // The configurations: plain decode first (the reference), then every (drafter, K).
    std::vector<std::pair<std::string, int>> configs = {{"off", 1}};
    for (const std::string& m : a.modes)
        for (int k : a.ks) configs.push_back({m, k});
    std::vector<int32_t> prompt;
    std::vector<std::vector<int32_t>> plain_ids(a.gens.size());
    std::vector<Row> rows;
    for (const auto& [mode, k] : configs) {
        EngineOptions o;
        o.model_path = a.model_path;
        o.backend = a.backend;
        o.threads = a.threads;
        o.n_parallel = 1;
        o.n_ctx = 1 << 15;  // KV pages are backed as they are written
        o.spec = mode;
        o.spec_k = k;
        if (mode == "draft") o.draft_model = a.draft_model;
        Engine engine(o);
        if (prompt.empty()) {
            prompt = engine.tokenize(text, /*parse_special=*/false);
            if (int(prompt.size()) + max_n + 8 > o.n_ctx)
                throw Error("--spec-prompt: '" + a.prompt_file + "' is " + std::to_string(prompt.size()) + " tokens; with -n " +
                            std::to_string(max_n) + " that passes the context of " + std::to_string(o.n_ctx));
        }
        for (size_t gi = 0; gi < a.gens.size(); ++gi) {
            Row row{mode, mode == "off" ? 0 : k, a.gens[gi]};
            for (int rep = 0; rep < a.reps; ++rep) {
                GenerationRequest req;
                req.prompt = prompt;
                req.max_tokens = row.n;
                req.sampling.temperature = 0;
                req.ignore_eos = true;
                req.text = false;
                GenerationResult r = engine.generate(std::move(req));
                if (!r.error.empty()) throw Error("bench --spec: the request failed: " + r.error);
                const double ts = r.ids.size() > 1 ? double(r.ids.size() - 1) / r.generate_seconds : 0.0;
                if (rep == 0) row.cold_ts = ts;
                else row.ts.push_back(ts);
                if (mode == "off" && rep == 0) plain_ids[gi] = r.ids;
                row.identical = row.identical && r.ids == plain_ids[gi];
                row.last = std::move(r);
            }
            rows.push_back(std::move(row));
        }
    }

    std::printf("prompt: %s, %zu tokens; greedy, end-of-generation ignored; %d repetitions (the first cold)\n\n",
                a.prompt_file.c_str(), prompt.size(), a.reps);
    std::printf("| spec | K | test | t/s | cold t/s | vs off | drafts accepted | by position | tokens / step | tokens = off |\n");
    std::printf("| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |\n");
    bool all_identical = true;
    for (const Row& r : rows) {
        double off = 0;
        for (const Row& o : rows)
            if (o.mode == "off" && o.n == r.n) off = median(o.ts);
        std::string by_pos;
        for (size_t i = 0; i < r.last.drafted_at.size(); ++i) {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%s%.0f%%", i ? " / " : "",
                          r.last.drafted_at[i] ? 100.0 * r.last.accepted_at[i] / r.last.drafted_at[i] : 0.0);
            by_pos += buf;
        }
        const GenerationResult& g = r.last;
        std::printf("| %s | %d | tg%d | %.1f +- %.1f | %.1f | %.2fx | %d of %d (%.1f%%) | %s | %.2f | %s |\n", r.mode.c_str(), r.k,
                    r.n, median(r.ts), stddev(r.ts), r.cold_ts, off > 0 ? median(r.ts) / off : 0.0, g.n_accepted, g.n_drafted,
                    g.n_drafted ? 100.0 * g.n_accepted / g.n_drafted : 0.0, by_pos.empty() ? "-" : by_pos.c_str(),
                    g.n_decode_steps ? double(g.ids.size() - 1) / g.n_decode_steps : 0.0, r.identical ? "yes" : "NO");
        all_identical = all_identical && r.identical;
    }
    if (!all_identical) throw Error("bench --spec: speculative output differed from plain decode (a bug: it must be exact)");
}

}  // namespace alloy::cli
