// alloy bench: llama-bench's conventions. Tests ppN (prefill N tokens), tgN (N decode steps),
// @dD (after D tokens of context). Each test runs -r repetitions on a fresh sequence; the first
// repetition is cold (plan building, page faults) and is reported apart, the median and
// stddev come from the rest; every sample is kept. `-o json` uses llama-bench's field names.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "alloy/error.h"
#include "cli/bench_spec.h"
#include "cli/bench_stats.h"
#include "cli/common.h"
#include "runtime/engine_options.h"
#include "kernels/cpu/read_bandwidth.h"
#include "kernels/cpu/thread_pool.h"
#include "runtime/loaded_model.h"
#include "runtime/model_info.h"
#include "runtime/sampler.h"

#include "alloy_build_commit.h"  // generated at build time: ALLOY_GIT_COMMIT

namespace alloy::cli {
namespace {

std::vector<std::string> parse_cache_types(const std::string& s, const char* flag) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        check_cache_type(item, flag);  // throws naming the flag and the value
        out.push_back(item);
    }
    if (out.empty()) check_cache_type(s, flag);
    return out;
}

struct Test {
    std::string gdn, type_k, type_v;
    int threads = 0, n_prompt = 0, n_gen = 0, n_depth = 0;
    std::vector<double> samples_ns;  // all repetitions, the cold one first
    std::vector<int> run_order;      // per repetition: its position among all repetitions of the run
    double probe_gbs = 0;            // decode tests: read bandwidth, median of probes between repetitions
    std::string name() const {
        std::string n = n_prompt ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen);
        return n_depth ? n + " @ d" + std::to_string(n_depth) : n;
    }
    int tokens() const { return n_prompt ? n_prompt : n_gen; }
    std::vector<double> warm_ts() const {
        std::vector<double> v;
        for (size_t i = 1; i < samples_ns.size(); ++i) v.push_back(1e9 * tokens() / samples_ns[i]);
        return v;
    }
};

}  // namespace

void add_bench_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("bench", "benchmark prefill and decode (llama-bench conventions)");
    static std::string model, prompts = "512", gens = "128", depths = "0", threads_list, gdn_list = "chunked",
                              output = "md", ctk_list = "f16", ctv_list = "f16";
    static int reps = 5, chunk = 64, sample_top_k = -1;
    static bool interleave = false, use_mmap = false, greedy_tokens = false;
    static std::string backend = "cpu", probe_kind = "weights";
    static int batch_size = 512, tp = 1, ep = 0;
    cmd->add_option("-m,--model", model, "GGUF model file or a name in $ALLOY_MODELS (default: the embedded tiny model)");
    cmd->add_option("-p,--n-prompt", prompts, "prompt sizes, comma separated (0 = none)")->capture_default_str();
    cmd->add_option("-n,--n-gen", gens, "generation sizes, comma separated (0 = none)")->capture_default_str();
    cmd->add_option("-d,--n-depth", depths, "context depths, comma separated")->capture_default_str();
    cmd->add_option("-r,--repetitions", reps, "repetitions per test (the first is cold)")->capture_default_str();
    cmd->add_option("-t,--threads", threads_list, "thread counts, comma separated (default: all cores)");
    cmd->add_option("--gdn", gdn_list, "GDN prefill kernels to compare: chunked,serial")->capture_default_str();
    cmd->add_option("--chunk", chunk, "GDN chunk size")->capture_default_str();
    cmd->add_option("--cache-type-k", ctk_list, "-ctk: KV cache types for K, comma separated: f32,f16,bf16")
        ->capture_default_str();
    cmd->add_option("--cache-type-v", ctv_list, "-ctv: KV cache types for V, comma separated: f32,f16,bf16")
        ->capture_default_str();
    cmd->add_option("-o,--output", output, "md | json | csv")->capture_default_str();
    cmd->add_option("--backend", backend, "where the model runs: cpu | cuda")->capture_default_str();
    cmd->add_option("--tp", tp, "tensor parallel: the model split over this many GPUs (--backend cuda) or CPU ranks")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    cmd->add_option("--ep", ep, "expert parallel: as --tp N with a MoE model's experts placed whole, E/N a rank")
        ->check(CLI::Range(1, 64));
    cmd->add_option("-b,--batch-size", batch_size,
                    "most prompt tokens per step (llama-bench -b; a multiple of --chunk; default 512, 4096 with "
                    "--backend cuda, where a 512-token step leaves the GPU half idle)")
        ->check(CLI::Range(1, 1 << 20));
    cmd->add_flag("--mmap", use_mmap, "use the file mapping for the weights (llama-bench -mmp 1) instead of reading "
                                      "them into memory");
    cmd->add_flag("--greedy-tokens", greedy_tokens,
                  "generation steps return each token's greedy id, picked where the logits are (on the GPU: a "
                  "4-byte copy), as `alloy run --temp 0` decodes; by default they return the logits row, as "
                  "llama-bench's do");
    cmd->add_option("--sample-top-k", sample_top_k,
                    "generation steps sample each token as `alloy run --temp 0.8 --top-k K` does (top-p 0.95, "
                    "min-p 0.05): on the GPU only each row's K best pairs come back (K <= 64); K = 0: top-k off, "
                    "the whole row comes back and is sorted on the host")
        ->check(CLI::Range(0, 1 << 20));
    cmd->add_option("--probe", probe_kind,
                    "decode's read-bandwidth probe (the floor it is stated against): weights = the model's weights, the "
                    "bytes a step streams (up to 2 GiB); largest = the largest tensor alone (before 2026-12-05)")
        ->check(CLI::IsMember({"weights", "largest"}))
        ->capture_default_str();
    cmd->add_flag("--interleave", interleave,
                  "run repetition r of every test before repetition r+1 (A/B comparisons on a drifting host)");
    static std::string spec_modes, spec_ks = "1,2,3", spec_prompt, draft_model;
    cmd->add_option("--spec", spec_modes,
                    "benchmark speculative decoding instead of pp/tg: drafters, comma separated (ngram, mtp, draft), on the text of "
                    "--spec-prompt, against plain greedy decode (-n sizes, -r, -t apply)");
    cmd->add_option("--spec-k", spec_ks, "with --spec: drafts per step, comma separated (1..3)")->capture_default_str();
    cmd->add_option("--spec-prompt", spec_prompt, "with --spec: a text file, the prompt (its tokens are the drafter's context)");
    cmd->add_option("--draft-model", draft_model, "with --spec draft: the draft model's GGUF file");
    cmd->callback([cmd] {
        if (cmd->count("-b") == 0 && backend == "cuda") batch_size = 4096;
        if (reps < 2) throw Error("-r must be at least 2 (the first repetition is cold and reported apart)");
        if (ep > 0 && tp > 1 && tp != ep)
            throw Error("--ep " + std::to_string(ep) + " and --tp " + std::to_string(tp) +
                        ": the experts are placed over the same ranks as the heads; give one of them");
        if (!spec_modes.empty()) {
            if (output != "md") throw Error("--spec prints markdown only (-o md)");
            SpecBenchArgs sa;
            sa.model_path = model.empty() ? default_model_path() : resolve_model(model);
            sa.backend = backend;
            sa.prompt_file = spec_prompt;
            sa.draft_model = draft_model.empty() ? draft_model : resolve_model(draft_model);
            sa.threads = threads_list.empty() ? 0 : parse_int_list(threads_list, "-t", 1).front();
            sa.reps = reps;
            sa.gens = parse_int_list(gens, "-n", 1);
            sa.ks = parse_int_list(spec_ks, "--spec-k", 1);
            std::stringstream ss(spec_modes);
            for (std::string m; std::getline(ss, m, ',');) sa.modes.push_back(m);
            run_spec_bench(sa);
            return;
        }
        if (output != "md" && output != "json" && output != "csv") throw Error("-o must be md, json or csv");
        const auto pp = parse_int_list(prompts, "-p", 0), tg = parse_int_list(gens, "-n", 0),
                   dd = parse_int_list(depths, "-d", 0);
        const auto ctks = parse_cache_types(ctk_list, kCacheTypeKFlag),
                   ctvs = parse_cache_types(ctv_list, kCacheTypeVFlag);
        const auto th = threads_list.empty() ? std::vector<int>{cpu::n_threads()} : parse_int_list(threads_list, "-t", 1);
        std::vector<std::string> gdns;
        {
            std::stringstream ss(gdn_list);
            std::string g;
            while (std::getline(ss, g, ',')) {
                if (g != "serial" && g != "chunked") throw Error("--gdn: '" + g + "' is not serial or chunked");
                gdns.push_back(g);
            }
        }
        const std::string path = model.empty() ? default_model_path() : resolve_model(model);
        LoadedModel lm = load_model(path, use_mmap ? gguf::TensorData::Mapped : gguf::TensorData::Resident, backend,
                                    ep > 0 ? ep : tp, ep > 0);
        const ModelRunner& m = *lm.runner;
        const ModelInfo info = model_info(m.model());
        const int V = m.hparams().n_vocab;
        int max_ctx = 1;
        for (int d : dd) for (int p : pp) for (int n : tg) max_ctx = std::max(max_ctx, d + std::max(p, n) + 1);
        // One sequence per cache-type pair, reused by every test of that pair (its pages stay warm).
        std::map<std::pair<std::string, std::string>, ModelState> states;
        // The last token's logits row, where the engine puts it (page-locked on a GPU).
        std::vector<float> logits_vec;
        float* logits = m.host_output(size_t(V));
        if (!logits) logits = (logits_vec.resize(size_t(V)), logits_vec.data());
        // --sample-top-k: a seeded sampler (its draws are not checked; they cost what a user's do).
        std::optional<Sampler> sampler;
        if (sample_top_k >= 0) sampler.emplace(SamplerParams{0.8f, sample_top_k, 0.95f, 0.05f, 1234});
        std::vector<float> top_values;
        std::vector<int32_t> top_ids;
        std::mt19937 rng(1234);
        auto random_ids = [&](int n) {
            std::vector<int32_t> ids(static_cast<size_t>(n));
            for (auto& id : ids) id = int32_t(rng() % uint32_t(V));
            return ids;
        };

        std::vector<Test> tests;
        for (const std::string& ck : ctks)
            for (const std::string& cv : ctvs)
                for (const std::string& g : gdns)
                    for (int t : th)
                        for (int d : dd) {
                            for (int p : pp) if (p > 0) tests.push_back({g, ck, cv, t, p, 0, d, {}, {}});
                            for (int n : tg) if (n > 0) tests.push_back({g, ck, cv, t, 0, n, d, {}, {}});
                        }
        // Decode is bandwidth-bound and this host's bandwidth drifts between runs, so each decode
        // test probes the read bandwidth before each warm repetition and after the last: the
        // test's effective GB/s is then stated against the median of those probes. The probe
        // reads the model's weights (the bytes a decode step streams, already resident, up to
        // 2 GiB: past any cache), so that it sees the step's own cache behaviour. It read the
        // largest tensor alone until 2026-12-05: on a host reporting 480 MiB of L3 (the Xeon VM
        // in bench/RESULTS.md) the 0.8B's 208 MB LM head re-read from cache measured 10-25%
        // above what streaming all 534 MB of the file ever gets. `--probe largest` keeps the old
        // probe for comparisons with earlier rows.
        // A model that fits in the caches would measure the caches: small models get no probe.
        constexpr size_t kMinProbeBytes = size_t(128) << 20, kMaxProbeBytes = size_t(2) << 30;
        std::vector<cpu::ByteSpan> probe_spans;
        {
            std::vector<cpu::ByteSpan> all;
            const gguf::TensorInfo* largest = nullptr;
            for (const auto& ti : lm.file->tensors()) {
                if (ti.nbytes) all.push_back({ti.data, ti.nbytes});
                if (!largest || ti.nbytes > largest->nbytes) largest = &ti;
            }
            if (probe_kind == "largest" && largest) all = {{largest->data, largest->nbytes}};
            // In address order, each run of adjacent tensors one span.
            std::sort(all.begin(), all.end(), [](const cpu::ByteSpan& a, const cpu::ByteSpan& b) {
                return std::less<const void*>()(a.data, b.data);
            });
            size_t total = 0;
            for (const cpu::ByteSpan& sp : all) {
                if (total >= kMaxProbeBytes) break;
                const size_t n = std::min(sp.bytes, kMaxProbeBytes - total);
                const char* end = probe_spans.empty() ? nullptr
                                                      : static_cast<const char*>(probe_spans.back().data) + probe_spans.back().bytes;
                if (end == static_cast<const char*>(sp.data)) probe_spans.back().bytes += n;
                else probe_spans.push_back({sp.data, n});
                total += n;
            }
            if (total < kMinProbeBytes) probe_spans.clear();
        }
        if (backend != "cpu") probe_spans.clear();  // the weights are in device memory: the host's bandwidth is not the floor
        using clock = std::chrono::steady_clock;
        // One repetition of test t; probes[i] collects test i's bandwidth probes.
        std::vector<std::vector<double>> probes(tests.size());  // decode tests: one per warm repetition
        int n_run = 0;
        auto run_rep = [&](size_t ti, int r) {
            Test& t = tests[ti];
            t.run_order.push_back(n_run++);
            cpu::set_n_threads(t.threads);
            auto probe = [&] {
                if (t.n_gen && !probe_spans.empty()) probes[ti].push_back(cpu::measure_read_bandwidth(probe_spans, 3).gb_per_s);
            };
            ForwardOptions fo;
            fo.gdn_mode = t.gdn == "serial" ? ref::GdnMode::Serial : ref::GdnMode::Chunked;
            fo.gdn_chunk = chunk;
            fo.max_batch = std::max(chunk, batch_size / chunk * chunk);
            ForwardOptions step = fo;
            step.gdn_mode = ref::GdnMode::Serial;
            auto it = states.find({t.type_k, t.type_v});
            if (it == states.end())
                it = states.emplace(std::pair{t.type_k, t.type_v},
                                    m.new_state(max_ctx, {kv_cache_type(t.type_k, kCacheTypeKFlag),
                                                          kv_cache_type(t.type_v, kCacheTypeVFlag)}))
                         .first;
            ModelState& st = it->second;
            st.reset();
            if (t.n_depth) {
                const auto ctx = random_ids(t.n_depth);
                m.forward(st, ctx.data(), t.n_depth, fo, logits);
            }
            const auto ids = random_ids(t.tokens());
            if (r > 0) probe();  // the cold repetition is not compared with the floor
            const auto t0 = clock::now();
            if (t.n_prompt) {
                m.forward(st, ids.data(), t.n_prompt, fo, logits);
            } else {
                for (int i = 0; i < t.n_gen; ++i) {
                    if (greedy_tokens) {
                        Batch b;
                        b.add(0, &ids[size_t(i)], 1, BatchLogits::Last, /*serial=*/true);
                        int32_t token = 0;
                        m.forward(st, b, step, nullptr, nullptr, &token);
                    } else if (sampler) {
                        Batch b;
                        b.add(0, &ids[size_t(i)], 1, BatchLogits::Last, /*serial=*/true);
                        const int k = sampler->candidates_needed(int(V));
                        if (k < int(V)) {  // the runner picks the pairs from `logits` if the backend does not
                            top_values.resize(size_t(k));
                            top_ids.resize(size_t(k));
                            const TopKRows top{k, top_values.data(), top_ids.data()};
                            m.forward(st, b, step, k > m.max_top_k_on_device() ? logits : nullptr, nullptr, nullptr, &top);
                            sampler->sample_top(top_values.data(), top_ids.data(), k);
                        } else {
                            m.forward(st, b, step, logits);
                            sampler->sample(logits, int(V));
                        }
                    } else {
                        m.forward(st, &ids[size_t(i)], 1, step, logits);
                    }
                }
            }
            t.samples_ns.push_back(std::chrono::duration<double, std::nano>(clock::now() - t0).count());
            if (r == reps - 1) {
                probe();  // and one after the last repetition
                if (!probes[ti].empty()) t.probe_gbs = median(probes[ti]);
                if (output == "md") std::fprintf(stderr, "  done %s (%s, %d threads)\n", t.name().c_str(), t.gdn.c_str(), t.threads);
            }
        };
        // As llama-bench, every repetition of a test before the next test; --interleave runs
        // repetition r of every test before repetition r + 1 of any, so that arms compared with
        // each other (--gdn chunked,serial) see the same drift of this shared host.
        if (interleave) {
            for (int r = 0; r < reps; ++r)
                for (size_t ti = 0; ti < tests.size(); ++ti) run_rep(ti, r);
        } else {
            for (size_t ti = 0; ti < tests.size(); ++ti)
                for (int r = 0; r < reps; ++r) run_rep(ti, r);
        }
        const uint64_t rss = peak_rss_bytes();

        // Per-op synchronization cost of the thread pool (a decode step runs ~300 parallel
        // regions), next to an empty OpenMP parallel region, per thread count used.
        struct SyncCost {
            double pool_us = 0, omp_us = 0;
        };
        std::map<int, SyncCost> sync;
        for (int t : th) {
            cpu::set_n_threads(t);
            SyncCost& c = sync[t];
            c.pool_us = cpu::region_overhead_us(20000);
            std::atomic<int64_t> sink{0};
            const auto o0 = std::chrono::steady_clock::now();
            for (int r = 0; r < 20000; ++r) {
#pragma omp parallel num_threads(t)
                sink.fetch_add(1, std::memory_order_relaxed);
            }
            c.omp_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - o0).count() / 20000;
        }

        // Bytes a decode step of test t streams on average: weights (LM head included), GDN
        // state read and write, and the KV cache at the mean depth of the test.
        auto decode_bytes = [&](const Test& t) {
            const Qwen35HParams& hp = m.hparams();
            int n_attn = 0;
            for (int l = 0; l < hp.n_layer; ++l) n_attn += !hp.is_recurrent(l);
            const double elem = (t.type_k == "f16" ? 2.0 : 4.0) + (t.type_v == "f16" ? 2.0 : 4.0);
            return double(info.decode_bytes) + elem * hp.n_head_kv * hp.head_dim * (t.n_depth + t.n_gen / 2.0) * n_attn;
        };
        // Achieved rates: prefill in GFLOP/s of the matmuls, decode in GB/s against the
        // bandwidth probed just before the test.
        auto utilization = [&](const Test& t, double ts) {
            char buf[64];
            if (t.n_prompt) {
                std::snprintf(buf, sizeof buf, "%.0f GFLOP/s", info.matmul_flops_per_token * ts / 1e9);
            } else {
                const double gbs = decode_bytes(t) * ts / 1e9;
                if (t.probe_gbs > 0)
                    std::snprintf(buf, sizeof buf, "%.1f GB/s = %.0f%% of %.1f probed", gbs, 100 * gbs / t.probe_gbs,
                                  t.probe_gbs);
                else
                    std::snprintf(buf, sizeof buf, "%.1f GB/s", gbs);
            }
            return std::string(buf);
        };

        if (output == "md") {
            // As llama-bench: the type_k / type_v columns only when a test leaves the f16 default.
            bool show_types = false;
            for (const Test& t : tests) show_types = show_types || t.type_k != "f16" || t.type_v != "f16";
            std::printf("| model | size | params | threads | gdn |%s test | t/s (median ± sd) | cold t/s | rate |\n",
                        show_types ? " type_k | type_v |" : "");
            std::printf("| --- | ---: | ---: | ---: | --- |%s ---: | ---: | ---: | ---: |\n", show_types ? " --- | --- |" : "");
            for (const Test& t : tests) {
                const auto ts = t.warm_ts();
                const double md = median(ts);
                const std::string types = show_types ? " " + t.type_k + " | " + t.type_v + " |" : "";
                std::printf("| %s | %.2f GiB | %.2f B | %d | %s |%s %s | %.2f ± %.2f | %.2f | %s |\n",
                            info.description.c_str(), double(info.file_bytes) / (1 << 30), double(info.n_params) / 1e9,
                            t.threads, t.gdn.c_str(), types.c_str(), t.name().c_str(), md, stddev(ts),
                            1e9 * t.tokens() / t.samples_ns[0], utilization(t, md).c_str());
            }
            std::printf("\nbuild %s, cpu %s, peak RSS %.2f GiB, %d repetitions (first reported as cold)\n",
                        ALLOY_GIT_COMMIT, cpu_name().c_str(), double(rss) / (1 << 30), reps);
            if (greedy_tokens) std::printf("generation steps returned greedy tokens, not logits (--greedy-tokens)\n");
            if (sampler)
                std::printf("generation steps sampled with top-k %d (--sample-top-k): %s\n", sample_top_k,
                            sample_top_k > 0 && sample_top_k <= m.max_top_k_on_device() ? "the k best pairs came back"
                                                                                          : "the logits row came back");
            for (const auto& [t, c] : sync)
                std::printf("thread pool, %d threads: %.2f us per parallel region (an empty OpenMP region: %.2f us)\n",
                            t, c.pool_us, c.omp_us);
            return;
        }
        nlohmann::json all = nlohmann::json::array();
        char now[32];
        const std::time_t tt = std::time(nullptr);
        std::strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&tt));
        for (const Test& t : tests) {
            const auto ts = t.warm_ts();
            std::vector<double> ns(t.samples_ns.begin() + 1, t.samples_ns.end());
            nlohmann::json j;
            j["build_commit"] = ALLOY_GIT_COMMIT;
            j["build_number"] = 0;
            j["cpu_info"] = cpu_name();
            j["gpu_info"] = "";
            j["backends"] = "CPU";
            j["model_filename"] = path;
            j["model_type"] = info.description;
            j["model_size"] = info.file_bytes;
            j["model_n_params"] = info.n_params;
            j["n_batch"] = ModelRunner::bucket_for(std::clamp(t.n_prompt, 1, std::max(chunk, batch_size / chunk * chunk)), {});
            j["n_ubatch"] = j["n_batch"];
            j["n_threads"] = t.threads;
            j["type_k"] = t.type_k;
            j["type_v"] = t.type_v;
            j["n_gpu_layers"] = 0;
            j["use_mmap"] = use_mmap;
            j["backend"] = backend;
            j["tensor_parallel"] = ep > 0 ? ep : tp;
            j["expert_parallel"] = ep > 0;
            j["n_prompt"] = t.n_prompt;
            j["n_gen"] = t.n_gen;
            j["n_depth"] = t.n_depth;
            j["test_time"] = now;
            j["avg_ns"] = uint64_t(mean(ns));
            j["stddev_ns"] = uint64_t(stddev(ns));
            j["avg_ts"] = mean(ts);
            j["stddev_ts"] = stddev(ts);
            j["samples_ns"] = ns;
            j["samples_ts"] = ts;
            // Where each warm sample (as samples_ns) and the cold one ran among all repetitions.
            j["run_order"] = std::vector<int>(t.run_order.begin() + 1, t.run_order.end());
            j["cold_run_order"] = t.run_order[0];
            // Alloy's additions: the median, the cold first repetition, the GDN arm, memory.
            j["median_ts"] = median(ts);
            j["cold_ns"] = t.samples_ns[0];
            j["cold_ts"] = 1e9 * t.tokens() / t.samples_ns[0];
            j["gdn"] = t.gdn;
            j["peak_rss_bytes"] = rss;
            j["pool_region_us"] = sync[t.threads].pool_us;
            j["omp_region_us"] = sync[t.threads].omp_us;
            if (t.n_gen) {
                if (t.probe_gbs > 0) j["read_bw_probe_gbs"] = t.probe_gbs;
                j["decode_bytes_per_token"] = decode_bytes(t);
            }
            all.push_back(j);
        }
        if (output == "json") {
            std::printf("%s\n", all.dump(2).c_str());
            return;
        }
        const char* cols[] = {"build_commit", "model_type", "model_size", "model_n_params", "n_threads", "gdn", "type_k", "type_v",
                              "n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts", "median_ts", "cold_ts",
                              "peak_rss_bytes"};
        for (size_t c = 0; c < std::size(cols); ++c) std::printf("%s%s", c ? "," : "", cols[c]);
        std::printf("\n");
        for (const auto& j : all) {
            for (size_t c = 0; c < std::size(cols); ++c) {
                const auto& v = j[cols[c]];
                std::printf("%s%s", c ? "," : "", v.is_string() ? ("\"" + v.get<std::string>() + "\"").c_str() : v.dump().c_str());
            }
            std::printf("\n");
        }
    });
}

}  // namespace alloy::cli
