// Shared by the tensor-parallel tests on CPU ranks (tests/runtime/test_tensor_parallel.cpp) and
// on GPUs (tests/cuda/test_tensor_parallel_cuda.cpp): synthetic models, prompts, and a run of
// a prompt's logits followed by greedy decode steps.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/qwen35.h"
#include "model/synth.h"
#include "runtime/gdn_replay.h"
#include "runtime/model_runner.h"
#include "runtime/slot_cache.h"

namespace alloy::test {

namespace fs = std::filesystem;

// A synthetic model of `preset` (model/synth.h), written once per process (GGUF layout: not
// repacked, so it can be sharded).
inline const Qwen35Model& model(const std::string& preset, GgmlType dtype) {
    static std::map<std::pair<std::string, int>, std::unique_ptr<Qwen35Model>> models;
    auto& m = models[{preset, int(dtype)}];
    if (!m) {
        const fs::path dir = fs::temp_directory_path() / ("alloy_tp_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        SynthOptions so;
        so.preset = preset;
        so.dtype = dtype;
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir / (preset + ".gguf")).string();
        synth_qwen35(so);
        m = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(so.out_path)));
        fs::remove_all(dir);
    }
    return *m;
}

inline std::vector<int32_t> ids(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& id : v) id = int32_t(rng() % 5000);
    return v;
}

// A prompt's logits at every position (chunked prefill in pieces of 64), then n_gen greedy
// decode steps: their tokens and logits. force: feed these tokens instead of the greedy ones
// (teacher forcing: two runs then compare their logits on the same inputs; a random-weight
// model's best two logits are often within the runs' reordering difference, so its greedy
// tokens are compared on the trained default model instead: tensor_parallel_engine tests).
struct Greedy {
    std::vector<float> prompt_logits, decode_logits;
    std::vector<int32_t> tokens;
};

inline Greedy run(const ModelRunner& r, const std::vector<int32_t>& prompt, int n_gen,
                  const std::vector<int32_t>* force = nullptr) {
    const size_t V = size_t(r.hparams().n_vocab);
    ModelState st = r.new_state(256);
    ForwardOptions fo;
    fo.all_logits = true;
    fo.max_batch = 64;
    Greedy out;
    out.prompt_logits.resize(prompt.size() * V);
    r.forward(st, prompt.data(), int(prompt.size()), fo, out.prompt_logits.data());
    ForwardOptions dec;
    dec.gdn_mode = ref::GdnMode::Serial;
    std::vector<float> row(out.prompt_logits.end() - std::ptrdiff_t(V), out.prompt_logits.end());
    for (int i = 0; i < n_gen; ++i) {
        const int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        out.tokens.push_back(best);
        int32_t next = force ? (*force)[size_t(i)] : best;
        r.forward(st, &next, 1, dec, row.data());
        out.decode_logits.insert(out.decode_logits.end(), row.begin(), row.end());
    }
    return out;
}

// Speculative verification on a runner's ranks: 4 tokens in one serial step give the logits
// of 4 decode steps bit for bit (the exactness runtime/speculative relies on), after a
// snapshot restore; a slot copied before the steps verifies to the same bits.
inline void expect_verification_reproduces_decode(const ModelRunner& r) {
    const size_t V = size_t(r.hparams().n_vocab);
    SlotStateCache cache(r, 2, 128);
    ForwardOptions serial;
    serial.gdn_mode = ref::GdnMode::Serial;
    const auto prompt = ids(23, 9), draft = ids(4, 10);
    std::vector<float> last(V);
    r.forward(cache.state(), prompt.data(), int(prompt.size()), serial, last.data(), nullptr, 0);
    const StateSnapshot at_prompt = cache.snapshot(0);
    cache.copy(0, 1);
    std::vector<float> steps;
    for (int32_t t : draft) {
        r.forward(cache.state(), &t, 1, serial, last.data(), nullptr, 0);
        steps.insert(steps.end(), last.begin(), last.end());
    }
    cache.restore(0, at_prompt);
    ForwardOptions verify = serial;
    verify.all_logits = true;
    std::vector<float> all(draft.size() * V), copied(draft.size() * V);
    r.forward(cache.state(), draft.data(), int(draft.size()), verify, all.data(), nullptr, 0);
    r.forward(cache.state(), draft.data(), int(draft.size()), verify, copied.data(), nullptr, 1);
    EXPECT_EQ(steps, all);
    EXPECT_EQ(all, copied);
}

// A rollback by replay (Backend::replay_gdn on a verification's log) leaves the states of
// re-running the kept tokens, bit for bit: 2 of 4 verified tokens kept, then one more step.
inline void expect_rollback_replay_equals_rerun(const ModelRunner& r) {
    const size_t V = size_t(r.hparams().n_vocab);
    SlotStateCache cache(r, 1, 128);
    ForwardOptions serial;
    serial.gdn_mode = ref::GdnMode::Serial;
    const auto prompt = ids(19, 11), step = ids(4, 12), next = ids(1, 13);
    std::vector<float> a(V), b(V), all(step.size() * V);
    r.forward(cache.state(), prompt.data(), int(prompt.size()), serial, a.data(), nullptr, 0);
    const StateSnapshot before = cache.snapshot(0);
    GdnReplayLog log;
    ForwardOptions verify = serial;
    verify.all_logits = true;
    verify.gdn_log = &log;
    r.forward(cache.state(), step.data(), int(step.size()), verify, all.data(), nullptr, 0);
    cache.restore(0, before);
    ASSERT_TRUE(r.replay_gdn(cache.state(), log, 0, 2));
    cache.state().n_past[0] = before.n_past + 2;
    r.forward(cache.state(), next.data(), 1, serial, a.data(), nullptr, 0);
    cache.restore(0, before);
    r.forward(cache.state(), step.data(), 2, serial, b.data(), nullptr, 0);
    r.forward(cache.state(), next.data(), 1, serial, b.data(), nullptr, 0);
    EXPECT_EQ(a, b);
}

}  // namespace alloy::test
