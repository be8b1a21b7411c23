// The engine tests' fixture (test_engine.cpp, test_speculative_engine.cpp): a synthetic tiny
// model (Q8_0, the Qwen3 tokenizer) written once per suite, its forward on the CPU backend for
// reference loops, and the requests the tests build.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alloy/engine.h"
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
    static inline fs::path dir_;
    static inline std::string path_;
    static inline std::unique_ptr<Qwen35Model> model_;
    static inline std::unique_ptr<ModelRunner> runner_;  // model_'s forward on the CPU backend
};

}  // namespace alloy::test
