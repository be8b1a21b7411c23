// The engine tests' fixture (test_engine.cpp, test_speculative_engine.cpp): a synthetic tiny
// model (Q8_0, the Qwen3 tokenizer) written once per suite, its forward on the CPU backend for
// reference loops, and the requests the tests build.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "alloy/quantize.h"
#include "format/gguf.h"
#include "model/qwen35.h"
#include "model/synth.h"
#include "runtime/model_runner.h"

namespace alloy::test {

namespace fs = std::filesystem;

class EngineTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("alloy_engine_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        SynthOptions so;
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir_ / "tiny.gguf").string();
        synth_qwen35(so);
        path_ = so.out_path;
        model_ = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(path_)));
        runner_ = std::make_unique<ModelRunner>(*model_);
    }
    static void TearDownTestSuite() {
        runner_.reset();
        model_.reset();
        fs::remove_all(dir_);
    }
    static EngineOptions options(int n_parallel) {
        EngineOptions o;
        o.model_path = path_;
        o.n_parallel = n_parallel;
        o.n_ctx = 256;
        return o;
    }
    static std::vector<int32_t> ids(int n, uint32_t seed) {
        std::mt19937 rng(seed);
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (auto& id : v) id = int32_t(rng() % 5000);
        return v;
    }
    // Greedy ids by a plain loop over the model (no end-of-generation stop: ignore_eos).
    static std::vector<int32_t> plain_loop(const std::vector<int32_t>& prompt, int n) {
        const int V = model_->hparams().n_vocab;
        ModelState st = runner_->new_state(256);
        std::vector<float> logits(static_cast<size_t>(V));
        ForwardOptions fo, step;
        step.gdn_mode = ref::GdnMode::Serial;
        runner_->forward(st, prompt.data(), int(prompt.size()), fo, logits.data());
        std::vector<int32_t> out;
        for (int i = 0; i < n; ++i) {
            out.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
            if (i + 1 < n) runner_->forward(st, &out.back(), 1, step, logits.data());
        }
        return out;
    }
    // A pattern of `period` random ids repeated up to n tokens: prompt lookup finds its
    // continuation, and a random-weight model tends to fall into loops that it then drafts.
    static std::vector<int32_t> repetitive(int n, int period, uint32_t seed) {
        const std::vector<int32_t> unit = ids(period, seed);
        std::vector<int32_t> v;
        while (int(v.size()) < n) v.push_back(unit[v.size() % unit.size()]);
        return v;
    }
    // Every request of `reqs` submitted at once (more than the engine's slots queue), results
    // in submission order.
    static std::vector<GenerationResult> run_all(Engine& e, const std::vector<GenerationRequest>& reqs) {
        std::vector<std::promise<GenerationResult>> done(reqs.size());
        std::vector<std::future<GenerationResult>> got;
        for (size_t i = 0; i < reqs.size(); ++i) {
            got.push_back(done[i].get_future());
            GenerationCallbacks cb;
            cb.on_done = [&done, i](const GenerationResult& r) { done[i].set_value(r); };
            e.submit(reqs[i], std::move(cb));
        }
        std::vector<GenerationResult> out;
        for (auto& f : got) out.push_back(f.get());
        return out;
    }
    static GenerationRequest greedy(std::vector<int32_t> prompt, int n) {
        GenerationRequest r;
        r.prompt = std::move(prompt);
        r.max_tokens = n;
        r.sampling.temperature = 0;
        r.ignore_eos = true;
        r.text = false;
        return r;
    }
    // Same ids, and every logprob (value, alternatives and their values) bit for bit.
    static void expect_same(const GenerationResult& want, const GenerationResult& got) {
        ASSERT_EQ(got.finish_reason, want.finish_reason) << got.error;
        ASSERT_EQ(got.ids, want.ids);
        EXPECT_EQ(got.text, want.text);
        ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
        for (size_t t = 0; t < want.logprobs.size(); ++t) {
            const TokenLogprob &a = want.logprobs[t], &b = got.logprobs[t];
            ASSERT_EQ(b.id, a.id) << "token " << t;
            ASSERT_EQ(0, std::memcmp(&b.logprob, &a.logprob, sizeof(float))) << "token " << t;
            ASSERT_EQ(b.top.size(), a.top.size()) << "token " << t;
            for (size_t j = 0; j < a.top.size(); ++j) {
                ASSERT_EQ(b.top[j].first, a.top[j].first) << "token " << t << " alternative " << j;
                ASSERT_EQ(0, std::memcmp(&b.top[j].second, &a.top[j].second, sizeof(float)))
                    << "token " << t << " alternative " << j;
            }
        }
    }
    // The trained default model, unpacked by the build beside the alloy binary.
    static std::string default_model_file() {
        const std::string m = (fs::path(ALLOY_BINARY).parent_path() / "share" / "alloy" / "alloy-default-kjv.gguf").string();
        if (!fs::exists(m)) ADD_FAILURE() << m << ": not unpacked by the build";
        return m;
    }
    // Six greedy requests of 24 tokens on pieces of the default model's held-out text (the
    // first in two prompt pieces at a batch size of 256; logprobs on every other one).
    static std::vector<GenerationRequest> heldout_requests(const std::string& model) {
        EngineOptions o;
        o.model_path = model;
        o.n_ctx = 1024;
        Engine e(o);
        std::ifstream in(std::string(ALLOY_SOURCE_DIR) + "/testdata/default-model/heldout.txt");
        const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        const std::vector<int32_t> all = e.tokenize(text, false);
        EXPECT_GT(all.size(), 2000u);
        std::vector<GenerationRequest> reqs;
        for (size_t i = 0; i < 6 && all.size() > 2000; ++i) {
            const size_t n = i == 0 ? 300 : 20 + 23 * i;
            GenerationRequest r = greedy(std::vector<int32_t>(all.begin() + long(300 * i), all.begin() + long(300 * i + n)), 24);
            if (i % 2 == 0) r.logprobs = kMaxTopLogprobs;
            reqs.push_back(r);
        }
        return reqs;
    }
    // The default model's six held-out greedy requests (3 in flight) through an engine on
    // n_ranks ranks of `backend` (runtime/tensor_parallel_backend.h) give the tokens of the same
    // engine on one rank, and their logprobs within 1e-3 (fp32 reordering). The model as F32 first:
    // with its Q8_0 matmuls the reordered block sums move int8 activation roundings (~1e-2 in
    // logprobs), which flips its near ties (one of these requests has two tokens 0.012 apart).
    static void expect_tensor_parallel_greedy(const std::string& backend, int n_ranks) {
        const fs::path dir = fs::temp_directory_path() / ("alloy_tp_engine_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        QuantizeRequest q;
        q.input = default_model_file();
        q.output = (dir / "default_f32.gguf").string();
        q.type = "F32";
        q.allow_requantize = true;
        quantize_model(q);
        const std::string model = q.output;
        const std::vector<GenerationRequest> reqs = heldout_requests(model);
        auto results = [&](int ranks) {
            EngineOptions o;
            o.model_path = model;
            o.backend = backend;
            o.n_parallel = 3;
            o.n_ctx = 1024;
            o.tensor_parallel = ranks;
            Engine e(o);
            return run_all(e, reqs);
        };
        const auto one = results(1), many = results(n_ranks);
        fs::remove_all(dir);
        ASSERT_EQ(one.size(), many.size());
        for (size_t i = 0; i < one.size(); ++i) {
            EXPECT_EQ(one[i].ids, many[i].ids) << "request " << i;
            for (size_t t = 0; t < one[i].logprobs.size() && t < many[i].logprobs.size(); ++t)
                EXPECT_NEAR(one[i].logprobs[t].logprob, many[i].logprobs[t].logprob, 1e-3) << "request " << i << " token " << t;
        }
    }
    // --spec mtp on the default model (its MTP head) through an engine on `backend`: for K 1 and 3,
    // 1 and 3 requests in flight, every greedy token and logprob bit for bit the same engine's
    // without speculation, and the head's first drafts accepted more than 30% of the time.
    static void expect_mtp_exact_and_accepted(const std::string& backend) {
        const std::string model = default_model_file();
        auto opts = [&](const std::string& spec, int n_parallel, int k) {
            EngineOptions o;
            o.model_path = model;
            o.backend = backend;
            o.n_ctx = 1024;
            o.batch_size = 256;
            o.n_parallel = n_parallel;
            o.spec = spec;
            o.spec_k = k;
            return o;
        };
        const std::vector<GenerationRequest> reqs = heldout_requests(model);
        std::vector<GenerationResult> plain;
        {
            Engine e(opts("off", 1, 1));
            plain = run_all(e, reqs);
        }
        for (int k : {1, 3})
            for (int n_parallel : {1, 4}) {
                SCOPED_TRACE(backend + ": K " + std::to_string(k) + ", " + std::to_string(n_parallel) + " in flight");
                Engine e(opts("mtp", n_parallel, k));
                const auto got = run_all(e, reqs);
                int first_drafted = 0, first_accepted = 0;
                for (size_t i = 0; i < reqs.size(); ++i) {
                    SCOPED_TRACE("prompt " + std::to_string(i));
                    expect_same(plain[i], got[i]);
                    if (!got[i].drafted_at.empty())
                        first_drafted += got[i].drafted_at[0], first_accepted += got[i].accepted_at[0];
                }
                ASSERT_GT(first_drafted, 0);
                const double rate = double(first_accepted) / first_drafted;
                std::printf("%s --spec mtp, K %d, %d in flight: first draft accepted %d of %d (%.3f)\n", backend.c_str(), k,
                            n_parallel, first_accepted, first_drafted, rate);
                EXPECT_GT(rate, 0.3);
            }
    }
    // 20 prompts of 5..100 tokens: the even ones repetitive, the odd ones random.
    static std::vector<std::vector<int32_t>> prompts() {
        std::vector<std::vector<int32_t>> p;
        for (int i = 0; i < 20; ++i) {
            const int n = 5 + (i * 37) % 96;
            p.push_back(i % 2 == 0 ? repetitive(n, 2 + i % 7, 700 + uint32_t(i)) : ids(n, 800 + uint32_t(i)));
        }
        return p;
    }
    // --spec draft (runtime/draft_model_drafter.h) through an engine on `backend`: the target as
    // its own draft model (drafts almost always agree: the draft's prompt runs as one call, the
    // target's decode one token a step, so a near tie can still go the other way) and a random
    // model of the same vocabulary (drafts mostly rejected: rollbacks of both models' states every
    // step): 20 prompts, K 1 and 3, 1 and 4 requests in flight, every token and logprob bit for
    // bit plain decode's; a draft model of another vocabulary is refused by name.
    static void expect_draft_model_exact(const std::string& backend) {
        SynthOptions so;
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir_ / "tiny_other.gguf").string();
        so.seed = 7;
        synth_qwen35(so);
        const auto ps = prompts();
        std::vector<GenerationRequest> reqs;
        for (size_t i = 0; i < ps.size(); ++i) {
            GenerationRequest r = greedy(ps[i], 20 + int(i % 5));
            if (i % 2 == 0) r.logprobs = kMaxTopLogprobs;
            reqs.push_back(r);
        }
        std::vector<GenerationResult> plain;
        {
            EngineOptions o = options(1);
            o.backend = backend;
            Engine e(o);
            plain = run_all(e, reqs);
        }
        for (const std::string& draft : {path_, so.out_path})
            for (int k : {1, 3})
                for (int n_parallel : {1, 4}) {
                    const bool self = draft == path_;
                    SCOPED_TRACE(std::string(self ? "itself" : "another model") + " as the draft, K " + std::to_string(k) + ", " +
                                 std::to_string(n_parallel) + " in flight");
                    EngineOptions o = options(n_parallel);
            o.backend = backend;
                    o.spec = "draft";
                    o.spec_k = k;
                    o.draft_model = draft;
                    Engine e(o);
                    const auto got = run_all(e, reqs);
                    int drafted = 0, accepted = 0;
                    for (size_t i = 0; i < reqs.size(); ++i) {
                        SCOPED_TRACE("prompt " + std::to_string(i));
                        expect_same(plain[i], got[i]);
                        drafted += got[i].n_drafted;
                        accepted += got[i].n_accepted;
                    }
                    std::printf("draft model (%s), K %d, %d in flight: %d of %d drafts accepted\n", self ? "itself" : "another", k,
                                n_parallel, accepted, drafted);
                    ASSERT_GE(drafted, 16);  // the policy's warm-up verifies at least that many
                    if (self) EXPECT_GE(accepted, drafted * 9 / 10);
                    else EXPECT_LT(accepted, drafted / 2);
                }
        // A draft model of another vocabulary is refused by name.
        EngineOptions o = options(1);
        o.backend = backend;
        o.spec = "draft";
        o.draft_model = default_model_file();
        try {
            Engine e(o);
            FAIL() << "a draft model of another vocabulary was accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
        }
        o.draft_model.clear();
        EXPECT_THROW(Engine{o}, Error);  // spec draft without a draft model
    }
    static inline fs::path dir_;
    static inline std::string path_;
    static inline std::unique_ptr<Qwen35Model> model_;
    static inline std::unique_ptr<ModelRunner> runner_;  // model_'s forward on the CPU backend
};

}  // namespace alloy::test
