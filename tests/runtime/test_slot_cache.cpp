// The slot state cache's operations (runtime/slot_cache.h) on a synthetic tiny model (three GDN
// layers and one attention layer): what the prefix cache and speculative rollback rely on.
// Every comparison is of bits: the same calls on the same state must give the same floats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/gguf.h"
#include "model/qwen35.h"
#include "model/synth.h"
#include "runtime/slot_cache.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;

class SlotCache : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const fs::path dir = fs::temp_directory_path() / ("alloy_slots_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        SynthOptions so;
        so.dtype = GgmlType::Q8_0;
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir / "tiny.gguf").string();
        synth_qwen35(so);
        model_ = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(so.out_path)));
        runner_ = std::make_unique<ModelRunner>(*model_);
        fs::remove_all(dir);
    }
    static void TearDownTestSuite() {
        runner_.reset();
        model_.reset();
    }

    static std::vector<int32_t> ids(int n, uint32_t seed) {
        std::mt19937 rng(seed);
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (auto& id : v) id = int32_t(rng() % 5000);
        return v;
    }
    // Feeds ids to the state: one prefill call if `prefill`, else one decode step per token;
    // returns the logits of every call, concatenated.
    static std::vector<float> feed(SlotStateCache& cache, int slot, const std::vector<int32_t>& v, bool prefill) {
        ModelState& s = cache.state();
        const size_t V = size_t(model_->hparams().n_vocab);
        ForwardOptions fo;
        std::vector<float> out;
        if (prefill) {
            out.resize(V);
            runner_->forward(s, v.data(), int(v.size()), fo, out.data(), nullptr, slot);
            return out;
        }
        out.resize(V * v.size());
        for (size_t t = 0; t < v.size(); ++t) runner_->forward(s, &v[t], 1, fo, out.data() + t * V, nullptr, slot);
        return out;
    }
    static std::unique_ptr<Qwen35Model> model_;
    static std::unique_ptr<ModelRunner> runner_;  // model_'s forward on the CPU backend
};
std::unique_ptr<Qwen35Model> SlotCache::model_;
std::unique_ptr<ModelRunner> SlotCache::runner_;

TEST_F(SlotCache, SnapshotRunRestoreRunGivesTheSameBits) {
    SlotStateCache cache(*runner_, 1, 256);
    feed(cache, 0, ids(20, 1), true);
    const StateSnapshot snap = cache.snapshot(0);
    EXPECT_EQ(snap.n_past, 20);
    EXPECT_GT(snap.bytes(), 0u);
    const std::vector<int32_t> next = ids(100, 2);
    const std::vector<float> first = feed(cache, 0, next, false);
    EXPECT_EQ(cache.n_past(0), 120);
    cache.restore(0, snap);
    EXPECT_EQ(cache.n_past(0), 20);
    EXPECT_EQ(feed(cache, 0, next, false), first);
}

TEST_F(SlotCache, CopiedSlotsContinueIdentically) {
    SlotStateCache cache(*runner_, 3, 256);
    feed(cache, 0, ids(37, 3), true);
    feed(cache, 0, ids(5, 4), false);
    feed(cache, 2, ids(50, 9), true);  // a longer, different history the copy must replace
    cache.copy(0, 2);
    EXPECT_EQ(cache.n_past(2), 42);
    const std::vector<int32_t> more = ids(30, 5);
    const std::vector<float> a = feed(cache, 0, more, false);
    EXPECT_EQ(feed(cache, 2, more, false), a);
    // And as a prefill piece.
    const std::vector<int32_t> piece = ids(24, 6);
    EXPECT_EQ(feed(cache, 2, piece, true), feed(cache, 0, piece, true));
}

TEST_F(SlotCache, TruncateThenRefeedEqualsNeverHavingGoneFurther) {
    SlotStateCache cache(*runner_, 2, 256);
    const std::vector<int32_t> prompt = ids(10, 7), went_on = ids(15, 8), instead = ids(12, 9);
    feed(cache, 0, prompt, true);
    const StateSnapshot at10 = cache.snapshot(0);
    feed(cache, 0, went_on, false);
    cache.truncate(0, 10, at10);
    const std::vector<float> got = feed(cache, 0, instead, false);
    feed(cache, 1, prompt, true);
    EXPECT_EQ(got, feed(cache, 1, instead, false));
}

TEST_F(SlotCache, BadOperationsNameWhatIsWrong) {
    SlotStateCache cache(*runner_, 2, 64);
    feed(cache, 0, ids(8, 10), true);
    const StateSnapshot at8 = cache.snapshot(0);
    auto expect_error = [](auto&& f, const std::vector<std::string>& parts) {
        try {
            f();
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
        }
    };
    expect_error([&] { cache.n_past(2); }, {"slot 2", "0..1"});
    expect_error([&] { cache.truncate(0, 5, at8); }, {"5", "8"});
    expect_error([&] { cache.truncate(0, 9, at8); }, {"9", "holds 8"});
    expect_error([&] { SlotStateCache(*runner_, 0, 64); }, {"at least one slot"});
    StateSnapshot wrong = at8;
    wrong.ssm_state.pop_back();
    expect_error([&] { cache.restore(1, wrong); }, {"another model"});
}

}  // namespace
}  // namespace alloy
