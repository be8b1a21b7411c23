// Speculative decoding on the CUDA backend (issue 21, must-show 1 on the H200): the slot state
// cache's device copies (CudaState: copy, snapshot, restore, device to device) and the engine's
// n-gram speculation on them. With EngineOptions::spec = "ngram" a greedy request's tokens and
// logprobs are bit for bit those of the same CUDA engine without speculation, alone and with 4
// requests in flight, for 1 and 3 drafts a step (the rollback after a rejected draft restores
// the device snapshot and re-runs the kept tokens through the serial path). Skips without a
// CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "kernels/cuda/gdn.h"
#include "runtime/backend.h"
#include "runtime/batch.h"
#include "runtime/slot_cache.h"
#include "tests/runtime/engine_fixture.h"

namespace alloy {
namespace {

class SpeculativeCuda : public test::EngineTest {
protected:
    void SetUp() override {
        if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    }
    static EngineOptions cuda_options(int n_parallel, int k) {
        EngineOptions o = options(n_parallel);
        o.backend = "cuda";
        if (k > 0) {
            o.spec = "ngram";
            o.spec_k = k;
        }
        return o;
    }
};

// One slot's logits rows for `ids` fed one token a step (decode), as the engine's steps.
std::vector<float> decode_rows(const ModelRunner& m, ModelState& st, int slot, const std::vector<int32_t>& ids) {
    const size_t V = size_t(m.hparams().n_vocab);
    std::vector<float> out(ids.size() * V);
    ForwardOptions fo;
    fo.gdn_mode = ref::GdnMode::Serial;
    for (size_t t = 0; t < ids.size(); ++t) {
        Batch b;
        b.add(slot, &ids[t], 1, BatchLogits::Last, /*serial=*/true);
        m.forward(st, b, fo, out.data() + t * V);
    }
    return out;
}

// Device snapshot -> 12 more tokens -> restore -> the same 12 tokens again: the same logits bit
// for bit; a copy of slot 0 into slot 1 continues as slot 0 does; restoring a snapshot of
// another state is refused by name.
TEST_F(SpeculativeCuda, DeviceSnapshotRestoreAndCopyAreExact) {
    ModelRunner gpu(*model_, make_backend("cuda"));
    SlotStateCache cache(gpu, 2, 256);
    ASSERT_TRUE(cache.state().device);
    const std::vector<int32_t> prompt = ids(40, 5), more = ids(12, 6);
    ForwardOptions fo;
    std::vector<float> last(size_t(model_->hparams().n_vocab));
    gpu.forward(cache.state(), prompt.data(), int(prompt.size()), fo, last.data());
    const StateSnapshot at40 = cache.snapshot(0);
    ASSERT_TRUE(at40.device);
    EXPECT_EQ(at40.n_past, 40);
    const std::vector<float> first = decode_rows(gpu, cache.state(), 0, more);
    EXPECT_EQ(cache.n_past(0), 52);
    cache.restore(0, at40);
    EXPECT_EQ(cache.n_past(0), 40);
    const std::vector<float> again = decode_rows(gpu, cache.state(), 0, more);
    EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)));

    cache.truncate(0, 40, at40);
    cache.copy(0, 1);
    EXPECT_EQ(cache.n_past(1), 40);
    const std::vector<float> forked = decode_rows(gpu, cache.state(), 1, more);
    EXPECT_EQ(0, std::memcmp(first.data(), forked.data(), first.size() * sizeof(float)));

    SlotStateCache other(gpu, 1, 256);
    const StateSnapshot foreign = other.snapshot(0);
    try {
        cache.restore(0, foreign);
        FAIL() << "restored another state's snapshot";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("another state"), std::string::npos) << e.what();
    }
}

TEST_F(SpeculativeCuda, GreedyOutputIsPlainDecodeBitForBit) {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 20; ++i) {
        const int n = 5 + (i * 37) % 96;
        GenerationRequest r = greedy(i % 2 == 0 ? repetitive(n, 2 + i % 7, 700 + uint32_t(i)) : ids(n, 800 + uint32_t(i)),
                                     20 + i % 5);
        if (i % 2 == 0) r.logprobs = kMaxTopLogprobs;
        reqs.push_back(r);
    }
    std::vector<GenerationResult> plain;
    {
        Engine e(cuda_options(1, 0));
        plain = run_all(e, reqs);
    }
    for (int k : {1, 3})
        for (int n_parallel : {1, 4}) {
            SCOPED_TRACE("K " + std::to_string(k) + ", " + std::to_string(n_parallel) + " in flight");
            Engine e(cuda_options(n_parallel, k));
            const auto got = run_all(e, reqs);
            int drafted = 0, accepted = 0;
            for (size_t i = 0; i < reqs.size(); ++i) {
                SCOPED_TRACE("prompt " + std::to_string(i));
                ASSERT_EQ(got[i].finish_reason, plain[i].finish_reason) << got[i].error;
                ASSERT_EQ(got[i].ids, plain[i].ids);
                ASSERT_EQ(got[i].logprobs.size(), plain[i].logprobs.size());
                for (size_t t = 0; t < plain[i].logprobs.size(); ++t) {
                    const TokenLogprob &a = plain[i].logprobs[t], &b = got[i].logprobs[t];
                    ASSERT_EQ(b.id, a.id) << "token " << t;
                    ASSERT_EQ(0, std::memcmp(&b.logprob, &a.logprob, sizeof(float))) << "token " << t;
                    ASSERT_EQ(b.top.size(), a.top.size());
                    for (size_t j = 0; j < a.top.size(); ++j) {
                        ASSERT_EQ(b.top[j].first, a.top[j].first) << "token " << t << " alternative " << j;
                        ASSERT_EQ(0, std::memcmp(&b.top[j].second, &a.top[j].second, sizeof(float)));
                    }
                }
                drafted += got[i].n_drafted;
                accepted += got[i].n_accepted;
            }
            EXPECT_GT(accepted, 0) << "no draft was accepted";
            EXPECT_GT(drafted, accepted) << "no draft was rejected (no rollback ran)";
        }
}

}  // namespace
}  // namespace alloy
