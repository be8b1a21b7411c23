// Speculative decoding on the CUDA backend (issue 21, must-show 1 on the H200): the slot state
// cache's device copies (CudaState: copy, snapshot, restore, device to device) and the engine's
// n-gram speculation on them. With EngineOptions::spec = "ngram" a greedy request's tokens and
// logprobs are bit for bit those of the same CUDA engine without speculation, alone and with 4
// requests in flight, for 1 and 3 drafts a step (the rollback after a rejected draft restores
// the device snapshot and re-runs the kept tokens through the serial path). Skips without a
// CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "kernels/cuda/gdn.h"
#include "runtime/backend.h"
#include "runtime/batch.h"
#include "runtime/gdn_replay.h"
#include "runtime/speculative.h"
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

// Rollback without the re-run on the device (CudaBackend::replay_gdn): a verification step of
// two slots copies every GDN op's inputs into the plan's log (inside its recorded graph);
// rolling back (one slot keeps its sampled token only, the other two tokens) replays the GDN
// ops alone, and the next decode step's logits are the re-run's bit for bit.
TEST_F(SpeculativeCuda, RollbackReplaysTheLoggedGdnOpsAsTheRerunWould) {
    ModelRunner gpu(*model_, make_backend("cuda"));
    const int V = gpu.hparams().n_vocab;
    const std::vector<int32_t> p0 = ids(9, 41), p1 = ids(14, 42);
    ForwardOptions fo, serial;
    serial.gdn_mode = ref::GdnMode::Serial;
    SlotStateCache replayed(gpu, 2, 128), rerun(gpu, 2, 128);
    for (SlotStateCache* c : {&replayed, &rerun}) {
        std::vector<float> row(static_cast<size_t>(V));
        gpu.forward(c->state(), p0.data(), int(p0.size()), fo, row.data(), nullptr, 0);
        gpu.forward(c->state(), p1.data(), int(p1.size()), fo, row.data(), nullptr, 1);
    }
    const std::vector<int32_t> s0 = {5, 6, 7, 8}, s1 = {9, 10, 11};
    GdnReplayLog log;
    std::vector<StateSnapshot> before;
    for (int rep = 0; rep < 2; ++rep)  // the second logged step replays the recorded graph
        for (SlotStateCache* c : {&replayed, &rerun}) {
            if (rep == 1) {
                c->restore(0, before[c == &replayed ? 0 : 2]);
                c->restore(1, before[c == &replayed ? 1 : 3]);
            } else {
                before.push_back(c->snapshot(0));
                before.push_back(c->snapshot(1));
            }
            Batch step;
            step.add(0, s0.data(), int(s0.size()), BatchLogits::All, true);
            step.add(1, s1.data(), int(s1.size()), BatchLogits::All, true);
            ForwardOptions o = serial;
            if (c == &replayed) o.gdn_log = &log;
            std::vector<float> rows(7 * static_cast<size_t>(V));
            gpu.forward(c->state(), step, o, rows.data());
        }
    ASSERT_TRUE(log.valid);
    ASSERT_FALSE(log.layers.empty());
    ASSERT_NE(log.layers[0].dev_qkv, nullptr) << "not the device's log";
    const std::vector<int32_t> k0 = {5}, k1 = {9, 10};
    roll_back(gpu, replayed, {{0, &before[0], k0}, {1, &before[1], k1}}, serial, &log);
    roll_back(gpu, rerun, {{0, &before[2], k0}, {1, &before[3], k1}}, serial, nullptr);
    for (int slot = 0; slot < 2; ++slot) {
        ASSERT_EQ(replayed.n_past(slot), rerun.n_past(slot));
        const int32_t t = 12;
        std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
        gpu.forward(replayed.state(), &t, 1, serial, la.data(), nullptr, slot);
        gpu.forward(rerun.state(), &t, 1, serial, lb.data(), nullptr, slot);
        EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4)) << "slot " << slot;
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
                expect_same(plain[i], got[i]);
                drafted += got[i].n_drafted;
                accepted += got[i].n_accepted;
            }
            EXPECT_GT(accepted, 0) << "no draft was accepted";
            EXPECT_GT(drafted, accepted) << "no draft was rejected (no rollback ran)";
        }
}

// --spec mtp on the device (the MTP head's graphs: Op::Input rows copied in, its own cache in a
// CudaState): plain decode's tokens and logprobs bit for bit, first drafts accepted.
TEST_F(SpeculativeCuda, MtpDraftsOfTheDefaultModelAreExactAndAccepted) { expect_mtp_exact_and_accepted("cuda"); }

// --spec draft on the device: both models' plans and states on the GPU, exact.
TEST_F(SpeculativeCuda, DraftModelDraftsAreExact) { expect_draft_model_exact("cuda"); }

// The MTP head teacher-forced on the device (alloy perplexity --mtp's evaluate_mtp: the trunk,
// then the head on each row's next token, GraphSpec::mtp) against the CPU backend's rows: the
// same greedy token on nearly every row, and logits no further from the CPU's than the trunk's
// own rows are (the default model is Q8_0: both backends quantize activations, in their own
// summation orders).
TEST_F(SpeculativeCuda, MtpHeadOfTheDefaultModelMatchesTheCpu) {
    EngineOptions o;
    o.model_path = default_model_file();
    o.n_ctx = 1024;
    const std::vector<GenerationRequest> reqs = heldout_requests(o.model_path);
    ASSERT_FALSE(reqs.empty());
    const std::vector<int32_t>& ids = reqs[0].prompt;
    std::vector<float> cpu_mtp, cpu_trunk, gpu_mtp, gpu_trunk;
    {
        Engine e(o);
        cpu_mtp = e.evaluate_mtp(ids);
        cpu_trunk = e.evaluate(ids);
    }
    o.backend = "cuda";
    {
        Engine e(o);
        gpu_mtp = e.evaluate_mtp(ids);
        gpu_trunk = e.evaluate(ids);
    }
    ASSERT_EQ(cpu_mtp.size(), gpu_mtp.size());
    ASSERT_EQ(cpu_trunk.size(), gpu_trunk.size());
    const size_t V = cpu_mtp.size() / ids.size();
    auto compare = [&](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
        size_t same = 0;
        double max_diff = 0;
        for (size_t r = 0; r < a.size() / V; ++r) {
            const float* x = a.data() + r * V;
            const float* y = b.data() + r * V;
            same += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
            for (size_t j = 0; j < V; ++j) max_diff = std::max(max_diff, double(std::fabs(x[j] - y[j])));
        }
        std::printf("%s, cuda vs cpu: %zu of %zu rows the same argmax, max |diff| %.3g\n", what, same, a.size() / V, max_diff);
        EXPECT_GE(double(same), 0.98 * double(a.size() / V)) << what;
        return max_diff;
    };
    const double trunk = compare(cpu_trunk, gpu_trunk, "trunk");
    const double head = compare(cpu_mtp, gpu_mtp, "MTP head");
    EXPECT_LT(head, 3 * trunk + 1e-3);
}

}  // namespace
}  // namespace alloy
